/* json.h — a small strict JSON parser for untrusted manifests.
 *
 * The whole document becomes an array of nodes owned by one fe_json object.
 * Objects and arrays link their children through `first` and `next`; object
 * members carry their key. Strings are decoded (escapes, \u surrogate pairs)
 * into the document's own buffer, NUL-terminated. Depth, size and node counts
 * are bounded; malformed input is reported with a byte offset. */
#ifndef FERRY_JSON_H
#define FERRY_JSON_H

#include <stddef.h>
#include <stdint.h>

typedef enum { FE_JSON_NULL, FE_JSON_FALSE, FE_JSON_TRUE, FE_JSON_NUMBER,
               FE_JSON_STRING, FE_JSON_ARRAY, FE_JSON_OBJECT } fe_json_type;

typedef struct fe_json_node {
    fe_json_type type;   /* what the value is */
    int32_t first;       /* first child (arrays, objects) or -1 */
    int32_t next;        /* next sibling or -1 */
    int32_t count;       /* number of children (arrays, objects) */
    const char *key;     /* member name when the parent is an object, else NULL */
    const char *str;     /* decoded text of a string, else NULL */
    double num;          /* value of a number */
    int is_integer;      /* the number was written without fraction or exponent */
} fe_json_node;

typedef struct fe_json fe_json;

/* Parse `len` bytes. Returns NULL and writes a message into `msg` on error. */
fe_json *fe_json_parse(const char *text, size_t len, char *msg, size_t msg_len);
void fe_json_free(fe_json *doc);

/* The root node. */
const fe_json_node *fe_json_root(const fe_json *doc);
/* Child by index of an array or object, or NULL. */
const fe_json_node *fe_json_child(const fe_json *doc, const fe_json_node *n, int i);
/* Member of an object by key, or NULL (also NULL when n is not an object). */
const fe_json_node *fe_json_get(const fe_json *doc, const fe_json_node *n, const char *key);
/* The node after n among its siblings, or NULL. */
const fe_json_node *fe_json_next(const fe_json *doc, const fe_json_node *n);

#endif
