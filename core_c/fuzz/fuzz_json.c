/* fuzz_json.c — libFuzzer target: the strict JSON parser (src/json.c) that
 * reads every manifest.json.
 *
 * Each input is parsed as a whole document. A refused document must come with
 * a message; an accepted one is walked completely through the public
 * accessors, checking the invariants json.h promises (children counts, keys on
 * object members only, NUL-terminated strings no longer than the input,
 * finite numbers). Any violation aborts, which libFuzzer reports as a crash. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../src/json.h"

#define REQUIRE(c)                                                              \
    do {                                                                        \
        if (!(c)) {                                                             \
            fprintf(stderr, "fuzz_json: invariant failed: %s (line %d)\n", #c, __LINE__); \
            abort();                                                            \
        }                                                                       \
    } while (0)

static size_t walk(const fe_json *d, const fe_json_node *n, size_t input_len, int depth) {
    REQUIRE(depth <= 65);
    size_t seen = 1;
    switch (n->type) {
    case FE_JSON_NUMBER: REQUIRE(isfinite(n->num)); break;
    case FE_JSON_STRING: REQUIRE(n->str && strlen(n->str) <= input_len); break;
    case FE_JSON_ARRAY:
    case FE_JSON_OBJECT: {
        int count = 0;
        for (const fe_json_node *c = fe_json_child(d, n, 0); c; c = fe_json_next(d, c)) {
            REQUIRE(count < n->count);
            REQUIRE(fe_json_child(d, n, count) == c);
            if (n->type == FE_JSON_OBJECT) {
                REQUIRE(c->key != NULL && strlen(c->key) <= input_len);
                /* The first member of that name is found by fe_json_get. */
                const fe_json_node *g = fe_json_get(d, n, c->key);
                REQUIRE(g != NULL && strcmp(g->key, c->key) == 0);
            } else {
                REQUIRE(c->key == NULL);
            }
            seen += walk(d, c, input_len, depth + 1);
            count++;
        }
        REQUIRE(count == n->count);
        REQUIRE(fe_json_child(d, n, count) == NULL && fe_json_child(d, n, -1) == NULL);
        break;
    }
    default: REQUIRE(n->type >= FE_JSON_NULL && n->type <= FE_JSON_TRUE); break;
    }
    if (n->type != FE_JSON_OBJECT) REQUIRE(fe_json_get(d, n, "x") == NULL);
    return seen;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char msg[256];
    msg[0] = '\0';
    fe_json *doc = fe_json_parse((const char *)data, size, msg, sizeof msg);
    if (!doc) {
        REQUIRE(msg[0] != '\0');
        return 0;
    }
    const fe_json_node *root = fe_json_root(doc);
    REQUIRE(root != NULL && root->key == NULL && root->next == -1);
    size_t n = walk(doc, root, size, 0);
    REQUIRE(n <= size + 1);
    fe_json_free(doc);
    /* A tiny output buffer must be safe too. */
    char small[4];
    fe_json *again = fe_json_parse((const char *)data, size, small, sizeof small);
    REQUIRE(again != NULL);
    fe_json_free(again);
    return 0;
}
