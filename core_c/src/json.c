/* json.c — see json.h. Recursive descent with an explicit depth bound. */
#include "json.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FE_JSON_MAX_DEPTH 64
#define FE_JSON_MAX_BYTES (256u << 20)

struct fe_json {
    fe_json_node *nodes;  /* every value of the document, root first */
    int32_t n_nodes;      /* nodes in use */
    int32_t cap_nodes;    /* nodes allocated */
    char *strings;        /* decoded keys and strings, each NUL-terminated */
    size_t strings_used;  /* bytes used in strings */
};

typedef struct {
    const char *p;      /* input */
    size_t len;         /* input length */
    size_t pos;         /* next byte to read */
    fe_json *doc;       /* document being built */
    char *msg;          /* error message destination */
    size_t msg_len;     /* its size */
    int failed;         /* an error has been recorded */
} parser;

static int fail(parser *ps, const char *what) {
    if (!ps->failed) {
        snprintf(ps->msg, ps->msg_len, "%s at byte %zu", what, ps->pos);
        ps->failed = 1;
    }
    return -1;
}

static void skip_ws(parser *ps) {
    while (ps->pos < ps->len) {
        char c = ps->p[ps->pos];
        if (c != ' ' && c != '\t' && c != '\n' && c != '\r') break;
        ps->pos++;
    }
}

static int32_t new_node(parser *ps, fe_json_type type) {
    fe_json *d = ps->doc;
    if (d->n_nodes == d->cap_nodes) {
        /* Every value takes at least one input byte, so len + 1 nodes suffice. */
        size_t limit = ps->len + 1;
        if ((size_t)d->cap_nodes >= limit) return fail(ps, "too many JSON values");
        size_t cap = (size_t)d->cap_nodes * 2;
        if (cap > limit) cap = limit;
        fe_json_node *grown = realloc(d->nodes, cap * sizeof *grown);
        if (!grown) return fail(ps, "out of memory");
        d->nodes = grown;
        d->cap_nodes = (int32_t)cap;
    }
    fe_json_node *n = &d->nodes[d->n_nodes];
    memset(n, 0, sizeof *n);
    n->type = type;
    n->first = -1;
    n->next = -1;
    return d->n_nodes++;
}

static int hex4(parser *ps, unsigned *out) {
    if (ps->len - ps->pos < 4) return fail(ps, "truncated \\u escape");
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        char c = ps->p[ps->pos++];
        v <<= 4;
        if (c >= '0' && c <= '9') v |= (unsigned)(c - '0');
        else if (c >= 'a' && c <= 'f') v |= (unsigned)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F') v |= (unsigned)(c - 'A' + 10);
        else return fail(ps, "bad \\u escape");
    }
    *out = v;
    return 0;
}

static void put_utf8(char *dst, size_t *used, unsigned cp) {
    if (cp < 0x80) {
        dst[(*used)++] = (char)cp;
    } else if (cp < 0x800) {
        dst[(*used)++] = (char)(0xC0 | (cp >> 6));
        dst[(*used)++] = (char)(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
        dst[(*used)++] = (char)(0xE0 | (cp >> 12));
        dst[(*used)++] = (char)(0x80 | ((cp >> 6) & 0x3F));
        dst[(*used)++] = (char)(0x80 | (cp & 0x3F));
    } else {
        dst[(*used)++] = (char)(0xF0 | (cp >> 18));
        dst[(*used)++] = (char)(0x80 | ((cp >> 12) & 0x3F));
        dst[(*used)++] = (char)(0x80 | ((cp >> 6) & 0x3F));
        dst[(*used)++] = (char)(0x80 | (cp & 0x3F));
    }
}

/* Decode a string starting at the opening quote; returns its text in the
 * document's string buffer (decoded text is never longer than its source). */
static const char *parse_string(parser *ps) {
    fe_json *d = ps->doc;
    ps->pos++; /* opening quote */
    char *out = d->strings + d->strings_used;
    size_t used = 0;
    while (1) {
        if (ps->pos >= ps->len) { fail(ps, "unterminated string"); return NULL; }
        unsigned char c = (unsigned char)ps->p[ps->pos++];
        if (c == '"') break;
        if (c < 0x20) { fail(ps, "control character in string"); return NULL; }
        if (c != '\\') { out[used++] = (char)c; continue; }
        if (ps->pos >= ps->len) { fail(ps, "unterminated escape"); return NULL; }
        char e = ps->p[ps->pos++];
        switch (e) {
        case '"': out[used++] = '"'; break;
        case '\\': out[used++] = '\\'; break;
        case '/': out[used++] = '/'; break;
        case 'b': out[used++] = '\b'; break;
        case 'f': out[used++] = '\f'; break;
        case 'n': out[used++] = '\n'; break;
        case 'r': out[used++] = '\r'; break;
        case 't': out[used++] = '\t'; break;
        case 'u': {
            unsigned cp;
            if (hex4(ps, &cp)) return NULL;
            if (cp >= 0xD800 && cp <= 0xDBFF) {
                unsigned lo;
                if (ps->len - ps->pos < 2 || ps->p[ps->pos] != '\\' || ps->p[ps->pos + 1] != 'u') {
                    fail(ps, "unpaired surrogate");
                    return NULL;
                }
                ps->pos += 2;
                if (hex4(ps, &lo)) return NULL;
                if (lo < 0xDC00 || lo > 0xDFFF) { fail(ps, "unpaired surrogate"); return NULL; }
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
                fail(ps, "unpaired surrogate");
                return NULL;
            }
            if (cp == 0) { fail(ps, "NUL character in string"); return NULL; }
            put_utf8(out, &used, cp);
            break;
        }
        default: fail(ps, "bad escape"); return NULL;
        }
    }
    out[used++] = '\0';
    d->strings_used += used;
    return out;
}

static int parse_number(parser *ps, fe_json_node *n) {
    size_t start = ps->pos;
    int integer = 1;
    if (ps->pos < ps->len && ps->p[ps->pos] == '-') ps->pos++;
    if (ps->pos >= ps->len) return fail(ps, "bad number");
    if (ps->p[ps->pos] == '0') {
        ps->pos++;
    } else if (ps->p[ps->pos] >= '1' && ps->p[ps->pos] <= '9') {
        while (ps->pos < ps->len && ps->p[ps->pos] >= '0' && ps->p[ps->pos] <= '9') ps->pos++;
    } else {
        return fail(ps, "bad number");
    }
    if (ps->pos < ps->len && ps->p[ps->pos] == '.') {
        integer = 0;
        ps->pos++;
        size_t d0 = ps->pos;
        while (ps->pos < ps->len && ps->p[ps->pos] >= '0' && ps->p[ps->pos] <= '9') ps->pos++;
        if (ps->pos == d0) return fail(ps, "bad number");
    }
    if (ps->pos < ps->len && (ps->p[ps->pos] == 'e' || ps->p[ps->pos] == 'E')) {
        integer = 0;
        ps->pos++;
        if (ps->pos < ps->len && (ps->p[ps->pos] == '+' || ps->p[ps->pos] == '-')) ps->pos++;
        size_t d0 = ps->pos;
        while (ps->pos < ps->len && ps->p[ps->pos] >= '0' && ps->p[ps->pos] <= '9') ps->pos++;
        if (ps->pos == d0) return fail(ps, "bad number");
    }
    char buf[64];
    size_t n_chars = ps->pos - start;
    if (n_chars >= sizeof buf) return fail(ps, "number too long");
    memcpy(buf, ps->p + start, n_chars);
    buf[n_chars] = '\0';
    n->num = strtod(buf, NULL);
    if (!isfinite(n->num)) return fail(ps, "number out of range");
    n->is_integer = integer;
    return 0;
}

static int32_t parse_value(parser *ps, int depth);

static int parse_container(parser *ps, int32_t idx, int depth, int is_object) {
    char close = is_object ? '}' : ']';
    ps->pos++; /* opening bracket */
    int32_t last = -1;
    skip_ws(ps);
    if (ps->pos < ps->len && ps->p[ps->pos] == close) { ps->pos++; return 0; }
    while (1) {
        const char *key = NULL;
        skip_ws(ps);
        if (is_object) {
            if (ps->pos >= ps->len || ps->p[ps->pos] != '"') return fail(ps, "expected a member name");
            key = parse_string(ps);
            if (!key) return -1;
            skip_ws(ps);
            if (ps->pos >= ps->len || ps->p[ps->pos] != ':') return fail(ps, "expected ':'");
            ps->pos++;
        }
        int32_t child = parse_value(ps, depth + 1);
        if (child < 0) return -1;
        ps->doc->nodes[child].key = key;
        if (last < 0) ps->doc->nodes[idx].first = child;
        else ps->doc->nodes[last].next = child;
        last = child;
        ps->doc->nodes[idx].count++;
        skip_ws(ps);
        if (ps->pos >= ps->len) return fail(ps, "unterminated container");
        char c = ps->p[ps->pos++];
        if (c == close) return 0;
        if (c != ',') return fail(ps, "expected ',' or a closing bracket");
    }
}

static int literal(parser *ps, const char *word) {
    size_t n = strlen(word);
    if (ps->len - ps->pos < n || memcmp(ps->p + ps->pos, word, n) != 0) return fail(ps, "bad literal");
    ps->pos += n;
    return 0;
}

static int32_t parse_value(parser *ps, int depth) {
    if (depth > FE_JSON_MAX_DEPTH) return fail(ps, "JSON nested too deeply");
    skip_ws(ps);
    if (ps->pos >= ps->len) return fail(ps, "unexpected end of JSON");
    char c = ps->p[ps->pos];
    int32_t idx;
    switch (c) {
    case '{':
    case '[':
        idx = new_node(ps, c == '{' ? FE_JSON_OBJECT : FE_JSON_ARRAY);
        if (idx < 0 || parse_container(ps, idx, depth, c == '{')) return -1;
        return idx;
    case '"': {
        idx = new_node(ps, FE_JSON_STRING);
        if (idx < 0) return -1;
        const char *s = parse_string(ps);
        if (!s) return -1;
        ps->doc->nodes[idx].str = s;
        return idx;
    }
    case 't': idx = new_node(ps, FE_JSON_TRUE); return (idx < 0 || literal(ps, "true")) ? -1 : idx;
    case 'f': idx = new_node(ps, FE_JSON_FALSE); return (idx < 0 || literal(ps, "false")) ? -1 : idx;
    case 'n': idx = new_node(ps, FE_JSON_NULL); return (idx < 0 || literal(ps, "null")) ? -1 : idx;
    default:
        idx = new_node(ps, FE_JSON_NUMBER);
        if (idx < 0 || parse_number(ps, &ps->doc->nodes[idx])) return -1;
        return idx;
    }
}

fe_json *fe_json_parse(const char *text, size_t len, char *msg, size_t msg_len) {
    if (len > FE_JSON_MAX_BYTES) {
        snprintf(msg, msg_len, "JSON document of %zu bytes is larger than the %u-byte limit", len,
                 FE_JSON_MAX_BYTES);
        return NULL;
    }
    fe_json *doc = calloc(1, sizeof *doc);
    if (!doc) { snprintf(msg, msg_len, "out of memory"); return NULL; }
    /* Decoded strings are never longer than their source, so one buffer of
     * the input's size holds them all; nodes grow on demand. */
    doc->cap_nodes = (int32_t)(len + 1 < 256 ? len + 1 : 256);
    doc->nodes = malloc((size_t)doc->cap_nodes * sizeof *doc->nodes);
    doc->strings = malloc(len + 1);
    if (!doc->nodes || !doc->strings) {
        fe_json_free(doc);
        snprintf(msg, msg_len, "out of memory");
        return NULL;
    }
    parser ps = {text, len, 0, doc, msg, msg_len, 0};
    int32_t root = parse_value(&ps, 0);
    if (root == 0) {
        skip_ws(&ps);
        if (ps.pos != len) fail(&ps, "trailing characters after JSON");
    }
    if (root != 0 || ps.failed) {
        if (!ps.failed) fail(&ps, "bad JSON");
        fe_json_free(doc);
        return NULL;
    }
    return doc;
}

void fe_json_free(fe_json *doc) {
    if (!doc) return;
    free(doc->nodes);
    free(doc->strings);
    free(doc);
}

const fe_json_node *fe_json_root(const fe_json *doc) { return &doc->nodes[0]; }

const fe_json_node *fe_json_child(const fe_json *doc, const fe_json_node *n, int i) {
    if (!n || (n->type != FE_JSON_ARRAY && n->type != FE_JSON_OBJECT) || i < 0) return NULL;
    int32_t c = n->first;
    while (c >= 0 && i-- > 0) c = doc->nodes[c].next;
    return c >= 0 ? &doc->nodes[c] : NULL;
}

const fe_json_node *fe_json_get(const fe_json *doc, const fe_json_node *n, const char *key) {
    if (!n || n->type != FE_JSON_OBJECT) return NULL;
    for (int32_t c = n->first; c >= 0; c = doc->nodes[c].next)
        if (strcmp(doc->nodes[c].key, key) == 0) return &doc->nodes[c];
    return NULL;
}

const fe_json_node *fe_json_next(const fe_json *doc, const fe_json_node *n) {
    return (n && n->next >= 0) ? &doc->nodes[n->next] : NULL;
}
