/* container.c — open and validate a Ferry container (see container.h). */
#define _POSIX_C_SOURCE 200809L
#define _XOPEN_SOURCE 700  /* realpath */
#include "container.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "formats.h"
#include "pool.h"
#include "json.h"
#include "kimi_manifest.h"

#define MAX_MANIFEST_BYTES (64u << 20)
#define MAX_TENSORS 200000

static const char BANK_MAGIC[8] = {'F', 'E', 'R', 'R', 'Y', 'B', 'N', 'K'};
static const char RECORD_MAGIC[4] = {'F', 'X', 'P', 'R'};
static const char *PART_NAMES[3] = {"gate", "up", "down"};

static uint32_t rd32(const uint8_t *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}
static uint64_t rd64(const uint8_t *p) { return (uint64_t)rd32(p) | ((uint64_t)rd32(p + 4) << 32); }
static uint16_t rd16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }

/* ---- manifest field readers: each names what is wrong ---- */

typedef struct {
    const fe_json *doc;   /* the manifest */
    ferry_error *err;     /* where failures go */
} reader;

static ferry_status bad(reader *r, const char *where, const char *key, const char *what) {
    return fe_fail(r->err, FERRY_E_FORMAT, "manifest.json: %s%s%s %s", where, *where ? "." : "", key,
                   what);
}

static ferry_status get_u64(reader *r, const fe_json_node *obj, const char *where, const char *key,
                            uint64_t lo, uint64_t hi, uint64_t *out) {
    const fe_json_node *n = fe_json_get(r->doc, obj, key);
    if (!n) return bad(r, where, key, "is missing");
    if (n->type != FE_JSON_NUMBER || !n->is_integer || n->num < (double)lo || n->num > (double)hi) {
        char msg[128];
        snprintf(msg, sizeof msg, "must be an integer from %llu to %llu", (unsigned long long)lo,
                 (unsigned long long)hi);
        return bad(r, where, key, msg);
    }
    *out = (uint64_t)n->num;
    return FERRY_OK;
}

static ferry_status get_int(reader *r, const fe_json_node *obj, const char *where, const char *key,
                            int lo, int hi, int *out) {
    uint64_t v;
    ferry_status s = get_u64(r, obj, where, key, (uint64_t)lo, (uint64_t)hi, &v);
    if (s == FERRY_OK) *out = (int)v;
    return s;
}

static ferry_status get_float(reader *r, const fe_json_node *obj, const char *where, const char *key,
                              double lo, double hi, float *out) {
    const fe_json_node *n = fe_json_get(r->doc, obj, key);
    if (!n) return bad(r, where, key, "is missing");
    if (n->type != FE_JSON_NUMBER || !(n->num > lo) || !(n->num <= hi))
        return bad(r, where, key, "is not a number in range");
    *out = (float)n->num;
    return FERRY_OK;
}

static ferry_status get_bool(reader *r, const fe_json_node *obj, const char *where, const char *key,
                             int *out) {
    const fe_json_node *n = fe_json_get(r->doc, obj, key);
    if (!n) return bad(r, where, key, "is missing");
    if (n->type != FE_JSON_TRUE && n->type != FE_JSON_FALSE) return bad(r, where, key, "must be true or false");
    *out = n->type == FE_JSON_TRUE;
    return FERRY_OK;
}

static ferry_status get_str(reader *r, const fe_json_node *obj, const char *where, const char *key,
                            char *out, size_t cap) {
    const fe_json_node *n = fe_json_get(r->doc, obj, key);
    if (!n) return bad(r, where, key, "is missing");
    if (n->type != FE_JSON_STRING) return bad(r, where, key, "must be a string");
    if (strlen(n->str) >= cap) return bad(r, where, key, "is too long");
    strcpy(out, n->str);
    return FERRY_OK;
}

static ferry_status get_format(reader *r, const fe_json_node *obj, const char *where, int *out) {
    char name[16];
    ferry_status s = get_str(r, obj, where, "dtype", name, sizeof name);
    if (s) return s;
    *out = fe_format_from_name(name);
    if (*out < 0) return bad(r, where, "dtype", "names an unknown format");
    return FERRY_OK;
}

/* A file name inside the container: relative, no "..", plain characters. */
static int safe_relative_name(const char *s) {
    if (!*s || *s == '/') return 0;
    for (const char *p = s; *p; p++) {
        char c = *p;
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
              c == '-' || c == '.' || c == '/'))
            return 0;
    }
    return strstr(s, "..") == NULL;
}

/* ---- the container's own files ---- */

ferry_status fe_container_open_file(const char *dir, const char *rel, uint64_t *size, int *fd_out, ferry_error *err) {
    *fd_out = -1;
    char path[FE_MAX_PATH + 64];
    if (snprintf(path, sizeof path, "%s/%s", dir, rel) >= (int)sizeof path)
        return fe_fail(err, FERRY_E_ARG, "container path is too long");
    char *root = realpath(dir, NULL), *real = realpath(path, NULL);
    ferry_status s = FERRY_OK;
    size_t n = root ? strlen(root) : 0;
    if (!root)
        s = fe_fail(err, FERRY_E_IO, "cannot open the model folder: %s", strerror(errno));
    else if (!real)
        s = fe_fail(err, FERRY_E_IO, "cannot open %s: %s", rel, strerror(errno));
    else if (strncmp(real, root, n) != 0 || (real[n] != '/' && !(n == 1 && root[0] == '/')))
        s = fe_fail(err, FERRY_E_FORMAT, "%s is a link to a file outside the model folder", rel);
    int fd = -1;
    struct stat st;
    if (!s) {
        /* the resolved name, not following a link swapped in since, and never waiting on a FIFO */
        fd = open(real, O_RDONLY | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC);
        if (fd < 0)
            s = fe_fail(err, FERRY_E_IO, "cannot open %s: %s", rel, strerror(errno));
        else if (fstat(fd, &st) != 0)
            s = fe_fail(err, FERRY_E_IO, "cannot stat %s: %s", rel, strerror(errno));
        else if (!S_ISREG(st.st_mode))
            s = fe_fail(err, FERRY_E_FORMAT, "%s is not a regular file (%s)", rel,
                        S_ISFIFO(st.st_mode) ? "a FIFO" : S_ISDIR(st.st_mode) ? "a folder"
                        : S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode) ? "a device" : "a special file");
        else if (fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK) != 0)
            s = fe_fail(err, FERRY_E_IO, "cannot open %s: %s", rel, strerror(errno));
    }
    free(root);
    free(real);
    if (s) {
        if (fd >= 0) close(fd);
        return s;
    }
    if (size) *size = (uint64_t)st.st_size;
    *fd_out = fd;
    return FERRY_OK;
}

/* ---- model hyperparameters ---- */

static ferry_status read_hparams(reader *r, const fe_json_node *m, fe_hparams *hp) {
    const char *w = "model";
    ferry_status s;
    if (!m || m->type != FE_JSON_OBJECT) return bad(r, "", "model", "is missing or not an object");
    if ((s = get_str(r, m, w, "arch", hp->arch, sizeof hp->arch))) return s;
    int kimi = strcmp(hp->arch, "kimi") == 0;
    if (strcmp(hp->arch, "llama") != 0 && !kimi)
        return fe_fail(r->err, FERRY_E_UNSUPPORTED,
                       "manifest.json: model.arch \"%s\" is not an architecture this core runs", hp->arch);
    if ((s = get_int(r, m, w, "n_layers", 1, 1024, &hp->n_layers))) return s;
    if ((s = get_int(r, m, w, "dim", 1, 65536, &hp->dim))) return s;
    if ((s = get_int(r, m, w, "n_heads", 1, 1024, &hp->n_heads))) return s;
    if ((s = get_int(r, m, w, "n_kv_heads", 1, 1024, &hp->n_kv_heads))) return s;
    if ((s = get_int(r, m, w, "head_dim", 2, 1024, &hp->head_dim))) return s;
    if ((s = get_int(r, m, w, "ffn_dim", 0, 1 << 20, &hp->ffn_dim))) return s;
    if ((s = get_int(r, m, w, "vocab", 1, 1 << 22, &hp->vocab))) return s;
    if ((s = get_int(r, m, w, "max_ctx", 1, 1 << 22, &hp->max_ctx))) return s;
    if ((s = get_float(r, m, w, "norm_eps", 0.0, 1.0, &hp->norm_eps))) return s;
    if ((s = get_float(r, m, w, "rope_theta", 0.0, 1e12, &hp->rope_theta))) return s;
    if ((s = get_int(r, m, w, "rope_dim", 0, 1024, &hp->rope_dim))) return s;
    if ((s = get_bool(r, m, w, "qkv_bias", &hp->qkv_bias))) return s;
    if ((s = get_bool(r, m, w, "o_bias", &hp->o_bias))) return s;
    if ((s = get_bool(r, m, w, "tied_embeddings", &hp->tied_embeddings))) return s;
    char pairing[16], qk[16];
    if ((s = get_str(r, m, w, "rope_pairing", pairing, sizeof pairing))) return s;
    if (strcmp(pairing, "interleaved") == 0) hp->rope_interleaved = 1;
    else if (strcmp(pairing, "half") == 0) hp->rope_interleaved = 0;
    else return bad(r, w, "rope_pairing", "must be \"interleaved\" or \"half\"");
    if ((s = get_str(r, m, w, "qk_norm", qk, sizeof qk))) return s;
    if (strcmp(qk, "none") == 0) hp->qk_norm = 0;
    else if (strcmp(qk, "head") == 0) hp->qk_norm = 1;
    else if (strcmp(qk, "full") == 0) hp->qk_norm = 2;
    else return bad(r, w, "qk_norm", "must be \"none\", \"head\" or \"full\"");
    if (hp->n_heads % hp->n_kv_heads) return bad(r, w, "n_kv_heads", "must divide n_heads");
    if (hp->rope_dim % 2 || hp->rope_dim > hp->head_dim)
        return bad(r, w, "rope_dim", "must be even and at most head_dim");

    const fe_json_node *moe = fe_json_get(r->doc, m, "moe");
    if (moe && moe->type != FE_JSON_NULL) {
        const char *mw = "model.moe";
        if (moe->type != FE_JSON_OBJECT) return bad(r, w, "moe", "must be an object or null");
        if ((s = get_int(r, moe, mw, "n_experts", 1, 65536, &hp->n_experts))) return s;
        if ((s = get_int(r, moe, mw, "top_k", 1, 256, &hp->top_k))) return s;
        if ((s = get_int(r, moe, mw, "expert_ffn_dim", 1, 1 << 20, &hp->expert_ffn_dim))) return s;
        if ((s = get_bool(r, moe, mw, "norm_topk_prob", &hp->norm_topk_prob))) return s;
        char scoring[16];
        if ((s = get_str(r, moe, mw, "scoring", scoring, sizeof scoring))) return s;
        if (strcmp(scoring, "softmax") != 0 && !(kimi && strcmp(scoring, "sigmoid") == 0))
            return fe_fail(r->err, FERRY_E_UNSUPPORTED, "manifest.json: model.moe.scoring \"%s\" is not supported",
                           scoring);
        if (hp->top_k > hp->n_experts) return bad(r, mw, "top_k", "exceeds n_experts");
    }

    hp->layer_is_moe = calloc((size_t)hp->n_layers, 1);
    if (!hp->layer_is_moe) return fe_fail(r->err, FERRY_E_NOMEM, "out of memory");
    const fe_json_node *kinds = fe_json_get(r->doc, m, "layer_ffn");
    if (!kinds || kinds->type != FE_JSON_ARRAY || kinds->count != hp->n_layers)
        return bad(r, w, "layer_ffn", "must be an array with one entry per layer");
    for (int i = 0; i < hp->n_layers; i++) {
        const fe_json_node *k = fe_json_child(r->doc, kinds, i);
        if (k->type == FE_JSON_STRING && strcmp(k->str, "moe") == 0 && hp->n_experts > 0) hp->layer_is_moe[i] = 1;
        else if (k->type == FE_JSON_STRING && strcmp(k->str, "dense") == 0 && hp->ffn_dim > 0) hp->layer_is_moe[i] = 0;
        else return bad(r, w, "layer_ffn", "entries must be \"dense\" (needs ffn_dim) or \"moe\" (needs moe)");
    }
    if (kimi) return fe_kimi_parse(r->doc, m, hp, r->err);
    return FERRY_OK;
}

/* ---- tensors ---- */

static ferry_status read_shape(reader *r, const fe_json_node *t, const char *where, int *n_dims,
                               uint64_t *shape) {
    const fe_json_node *sh = fe_json_get(r->doc, t, "shape");
    if (!sh || sh->type != FE_JSON_ARRAY || sh->count < 1 || sh->count > 2)
        return bad(r, where, "shape", "must be a list of 1 or 2 dimensions");
    *n_dims = sh->count;
    for (int d = 0; d < sh->count; d++) {
        const fe_json_node *v = fe_json_child(r->doc, sh, d);
        if (v->type != FE_JSON_NUMBER || !v->is_integer || v->num < 1 || v->num > (double)(1u << 24))
            return bad(r, where, "shape", "has a dimension that is not an integer from 1 to 16777216");
        shape[d] = (uint64_t)v->num;
    }
    return FERRY_OK;
}

/* Stored bytes of a tensor of this format and shape, or 0 if impossible. */
static uint64_t tensor_bytes(int fmt, int n_dims, const uint64_t *shape) {
    uint64_t rows = n_dims == 2 ? shape[0] : 1, cols = n_dims == 2 ? shape[1] : shape[0];
    uint64_t row = fe_row_bytes(fmt, cols), total;
    if (!row || !fe_mul_size(rows, row, &total)) return 0;
    return total;
}

static int by_offset(const void *a, const void *b) {
    const fe_tensor *x = *(const fe_tensor *const *)a, *y = *(const fe_tensor *const *)b;
    return x->offset < y->offset ? -1 : x->offset > y->offset;
}

/* Two tensors sharing bytes of trunk.bin would make one's damage the
 * other's, or let a hostile manifest alias weights: refused. */
static ferry_status check_no_overlap(reader *r, const fe_container *c) {
    if (c->n_tensors < 2) return FERRY_OK;
    const fe_tensor **order = malloc((size_t)c->n_tensors * sizeof *order);
    if (!order) return fe_fail(r->err, FERRY_E_NOMEM, "out of memory");
    for (int i = 0; i < c->n_tensors; i++) order[i] = &c->tensors[i];
    qsort(order, (size_t)c->n_tensors, sizeof *order, by_offset);
    ferry_status s = FERRY_OK;
    for (int i = 1; i < c->n_tensors && !s; i++) {
        const fe_tensor *a = order[i - 1], *b = order[i];
        if (b->offset < a->offset + a->nbytes)
            s = fe_fail(r->err, FERRY_E_FORMAT,
                        "manifest.json: tensors %s (bytes %llu..%llu) and %s (bytes %llu..%llu) overlap in trunk.bin",
                        a->name, (unsigned long long)a->offset, (unsigned long long)(a->offset + a->nbytes),
                        b->name, (unsigned long long)b->offset, (unsigned long long)(b->offset + b->nbytes));
    }
    free(order);
    return s;
}

static ferry_status read_tensors(reader *r, const fe_json_node *list, fe_container *c) {
    if (!list || list->type != FE_JSON_ARRAY) return bad(r, "", "tensors", "is missing or not a list");
    if (list->count > MAX_TENSORS) return bad(r, "", "tensors", "lists too many tensors");
    c->tensors = calloc((size_t)list->count + 1, sizeof *c->tensors);
    if (!c->tensors) return fe_fail(r->err, FERRY_E_NOMEM, "out of memory");
    int i = 0;
    for (const fe_json_node *t = fe_json_child(r->doc, list, 0); t; t = fe_json_next(r->doc, t), i++) {
        fe_tensor *x = &c->tensors[i];
        char where[64], file[FE_MAX_NAME];
        snprintf(where, sizeof where, "tensors[%d]", i);
        ferry_status s;
        if (t->type != FE_JSON_OBJECT) return bad(r, where, "", "is not an object");
        if ((s = get_str(r, t, where, "name", x->name, sizeof x->name))) return s;
        snprintf(where, sizeof where, "tensor %.48s", x->name);
        if ((s = get_str(r, t, where, "file", file, sizeof file))) return s;
        if (strcmp(file, "trunk.bin") != 0) return bad(r, where, "file", "must be \"trunk.bin\"");
        if ((s = get_format(r, t, where, &x->fmt))) return s;
        if ((s = read_shape(r, t, where, &x->n_dims, x->shape))) return s;
        if ((s = get_u64(r, t, where, "offset", 0, UINT64_MAX >> 2, &x->offset))) return s;
        if ((s = get_u64(r, t, where, "nbytes", 1, UINT64_MAX >> 2, &x->nbytes))) return s;
        uint64_t crc;
        if ((s = get_u64(r, t, where, "crc32", 0, 0xFFFFFFFFu, &crc))) return s;
        x->crc32 = (uint32_t)crc;
        if (x->nbytes != tensor_bytes(x->fmt, x->n_dims, x->shape))
            return bad(r, where, "nbytes", "does not match its format and shape");
        if (x->offset % 64) return bad(r, where, "offset", "is not 64-byte aligned");
        if (x->offset > c->trunk_size || x->nbytes > c->trunk_size - x->offset) {
            return fe_fail(r->err, FERRY_E_FORMAT,
                           "manifest.json: tensor %s lies at bytes %llu..%llu but trunk.bin has %llu bytes",
                           x->name, (unsigned long long)x->offset,
                           (unsigned long long)(x->offset + x->nbytes), (unsigned long long)c->trunk_size);
        }
        for (int j = 0; j < i; j++)
            if (strcmp(c->tensors[j].name, x->name) == 0) return bad(r, where, "name", "appears twice");
    }
    c->n_tensors = i;
    return check_no_overlap(r, c);
}

/* ---- expert banks ---- */

static ferry_status read_part(reader *r, const fe_json_node *b, const char *where, int k, fe_expert_part *p) {
    const fe_json_node *n = fe_json_get(r->doc, b, PART_NAMES[k]);
    char w[96];
    snprintf(w, sizeof w, "%s.%s", where, PART_NAMES[k]);
    if (!n || n->type != FE_JSON_OBJECT) return bad(r, where, PART_NAMES[k], "is missing");
    ferry_status s;
    int n_dims;
    uint64_t shape[FE_MAX_DIMS], off, nb;
    if ((s = get_format(r, n, w, &p->fmt))) return s;
    if ((s = read_shape(r, n, w, &n_dims, shape))) return s;
    if (n_dims != 2) return bad(r, w, "shape", "must have 2 dimensions");
    if ((s = get_u64(r, n, w, "offset", FE_RECORD_HEADER_BYTES, 1u << 31, &off))) return s;
    if ((s = get_u64(r, n, w, "nbytes", 1, 1u << 31, &nb))) return s;
    p->rows = shape[0];
    p->cols = shape[1];
    p->offset = (uint32_t)off;
    p->nbytes = (uint32_t)nb;
    if (nb != tensor_bytes(p->fmt, 2, shape)) return bad(r, w, "nbytes", "does not match its format and shape");
    if (off % 64) return bad(r, w, "offset", "is not 64-byte aligned");
    return FERRY_OK;
}

static ferry_status check_bank_geometry(reader *r, const fe_hparams *hp, fe_bank *b, const char *w) {
    const fe_expert_part *g = &b->part[0], *u = &b->part[1], *d = &b->part[2];
    uint64_t f = (uint64_t)hp->expert_ffn_dim, dim = (uint64_t)(hp->expert_dim ? hp->expert_dim : hp->dim);
    if (g->rows != f || g->cols != dim || u->rows != f || u->cols != dim || d->rows != dim || d->cols != f)
        return bad(r, w, "shape", "of gate/up/down does not match model.dim and model.moe.expert_ffn_dim");
    if (b->n_experts != (uint32_t)hp->n_experts) return bad(r, w, "n_experts", "differs from model.moe.n_experts");
    uint64_t end = FE_RECORD_HEADER_BYTES;
    for (int k = 0; k < 3; k++) {
        if (b->part[k].offset < end) return bad(r, w, PART_NAMES[k], "overlaps what comes before it");
        end = (uint64_t)b->part[k].offset + b->part[k].nbytes;
    }
    if (b->payload_size != end - FE_RECORD_HEADER_BYTES)
        return bad(r, w, "payload_size", "does not end where the down matrix ends");
    if (b->record_size % FE_RECORD_ALIGN || b->record_size < end)
        return bad(r, w, "record_size", "must be a multiple of 4096 that holds the whole record");
    return FERRY_OK;
}

static ferry_status open_bank_file(fe_container *c, fe_bank *b, ferry_error *err) {
    uint64_t size = 0;
    ferry_status s = fe_container_open_file(c->dir, b->rel, &size, &b->fd, err);
    if (s) return s;
    uint64_t want = FE_BANK_HEADER_BYTES + (uint64_t)b->n_experts * b->record_size;
    if (size != want)
        return fe_fail(err, FERRY_E_FORMAT, "expert bank %s has %llu bytes; %u records of %llu bytes need %llu%s",
                       b->rel, (unsigned long long)size, b->n_experts, (unsigned long long)b->record_size,
                       (unsigned long long)want, size < want ? " (it is truncated)" : "");
    uint8_t h[FE_BANK_HEADER_BYTES];
    s = fe_pread_full(b->fd, h, sizeof h, 0, b->rel, err);
    if (s) return s;
    if (memcmp(h, BANK_MAGIC, 8) != 0) return fe_fail(err, FERRY_E_FORMAT, "%s is not a Ferry expert bank", b->rel);
    if (rd32(h + 8) != FERRY_FORMAT_VERSION)
        return fe_fail(err, FERRY_E_VERSION, "%s is expert bank version %u; this Ferry reads version %d", b->rel,
                       rd32(h + 8), FERRY_FORMAT_VERSION);
    if (fe_crc32(0, h, 96) != rd32(h + 96))
        return fe_fail(err, FERRY_E_CHECKSUM, "%s: the bank header's CRC32 does not match", b->rel);
    int same = rd32(h + 12) == (uint32_t)b->layer && rd32(h + 16) == b->n_experts &&
               rd32(h + 20) == FE_RECORD_HEADER_BYTES && rd64(h + 24) == b->record_size &&
               rd64(h + 32) == FE_BANK_HEADER_BYTES && rd32(h + 40) == b->payload_size;
    for (int k = 0; k < 3 && same; k++) {
        const fe_expert_part *p = &b->part[k];
        same = h[44 + k] == (uint8_t)p->fmt && rd32(h + 48 + 4 * k) == p->rows && rd32(h + 60 + 4 * k) == p->cols &&
               rd32(h + 72 + 4 * k) == p->offset && rd32(h + 84 + 4 * k) == p->nbytes;
    }
    if (!same) return fe_fail(err, FERRY_E_FORMAT, "%s: the bank header disagrees with manifest.json", b->rel);
    return FERRY_OK;
}

static ferry_status read_banks(reader *r, const fe_json_node *list, fe_container *c) {
    const fe_hparams *hp = &c->hp;
    c->banks = calloc((size_t)hp->n_layers, sizeof *c->banks);
    if (!c->banks) return fe_fail(r->err, FERRY_E_NOMEM, "out of memory");
    for (int l = 0; l < hp->n_layers; l++) c->banks[l].fd = -1;
    int n_moe = 0;
    for (int l = 0; l < hp->n_layers; l++) n_moe += hp->layer_is_moe[l];
    if (n_moe == 0) return FERRY_OK;
    if (!list || list->type != FE_JSON_ARRAY || list->count != n_moe)
        return bad(r, "", "expert_banks", "must list one bank per MoE layer");
    int i = 0;
    for (const fe_json_node *n = fe_json_child(r->doc, list, 0); n; n = fe_json_next(r->doc, n), i++) {
        char w[64], rel[FE_MAX_NAME];
        snprintf(w, sizeof w, "expert_banks[%d]", i);
        ferry_status s;
        int layer;
        uint64_t rs, ps, ne;
        if (n->type != FE_JSON_OBJECT) return bad(r, w, "", "is not an object");
        if ((s = get_int(r, n, w, "layer", 0, hp->n_layers - 1, &layer))) return s;
        if (!hp->layer_is_moe[layer]) return bad(r, w, "layer", "is not an MoE layer");
        fe_bank *b = &c->banks[layer];
        if (b->n_experts) return bad(r, w, "layer", "has two banks");
        b->layer = layer;
        if ((s = get_str(r, n, w, "file", rel, sizeof rel))) return s;
        if (!safe_relative_name(rel)) return bad(r, w, "file", "is not a plain relative name");
        if ((s = get_u64(r, n, w, "n_experts", 1, 65536, &ne))) return s;
        if ((s = get_u64(r, n, w, "record_size", FE_RECORD_ALIGN, 1ull << 32, &rs))) return s;
        if ((s = get_u64(r, n, w, "payload_size", 1, 1ull << 31, &ps))) return s;
        b->n_experts = (uint32_t)ne;
        b->record_size = rs;
        b->payload_size = (uint32_t)ps;
        for (int k = 0; k < 3; k++)
            if ((s = read_part(r, n, w, k, &b->part[k]))) return s;
        if ((s = check_bank_geometry(r, hp, b, w))) return s;
        strcpy(b->rel, rel);
        if (snprintf(b->path, sizeof b->path, "%s/%s", c->dir, rel) >= (int)sizeof b->path)
            return fe_fail(r->err, FERRY_E_ARG, "container path is too long");
        if ((s = open_bank_file(c, b, r->err))) return s;
    }
    return FERRY_OK;
}

/* ---- whole container ---- */

static ferry_status slurp(const char *dir, const char *rel, size_t limit, char **out, size_t *len,
                          ferry_error *err) {
    int fd;
    uint64_t size = 0;
    ferry_status s = fe_container_open_file(dir, rel, &size, &fd, err);
    if (s) return s;
    if (size > limit) {
        close(fd);
        return fe_fail(err, FERRY_E_FORMAT, "%s is larger than %zu bytes", rel, limit);
    }
    char *buf = malloc((size_t)size + 1);
    if (!buf) { close(fd); return fe_fail(err, FERRY_E_NOMEM, "out of memory reading %s", rel); }
    s = fe_pread_full(fd, buf, (size_t)size, 0, rel, err);
    close(fd);
    if (s) { free(buf); return s; }
    *out = buf;
    *len = (size_t)size;
    return FERRY_OK;
}

static ferry_status check_header(reader *r, const fe_json_node *root) {
    char fmt[32];
    ferry_status s;
    if (root->type != FE_JSON_OBJECT) return fe_fail(r->err, FERRY_E_FORMAT, "manifest.json is not a JSON object");
    if ((s = get_str(r, root, "", "format", fmt, sizeof fmt))) return s;
    if (strcmp(fmt, "ferry") != 0)
        return fe_fail(r->err, FERRY_E_FORMAT, "manifest.json: format is \"%s\", not \"ferry\"", fmt);
    const fe_json_node *v = fe_json_get(r->doc, root, "version");
    if (!v || v->type != FE_JSON_NUMBER || !v->is_integer)
        return bad(r, "", "version", "is missing or not an integer");
    if (v->num != FERRY_FORMAT_VERSION)
        return fe_fail(r->err, FERRY_E_VERSION,
                       "this container is format version %.0f; this Ferry reads version %d (convert it again "
                       "with this version of ferry)", v->num, FERRY_FORMAT_VERSION);
    return FERRY_OK;
}

static ferry_status stat_trunk(fe_container *c, ferry_error *err) {
    int fd;
    ferry_status s = fe_container_open_file(c->dir, "trunk.bin", &c->trunk_size, &fd, err);
    if (!s) close(fd);
    return s;
}

ferry_status fe_container_open(fe_container *c, const char *dir, ferry_error *err) {
    memset(c, 0, sizeof *c);
    if (!dir || strlen(dir) >= sizeof c->dir - 128) return fe_fail(err, FERRY_E_ARG, "bad container path");
    strcpy(c->dir, dir);
    char *text = NULL, msg[256];
    size_t len = 0;
    ferry_status s = slurp(dir, "manifest.json", MAX_MANIFEST_BYTES, &text, &len, err);
    if (s) return s;
    c->fingerprint = ((uint64_t)fe_crc32(0, text, len) << 32) | (uint32_t)len;
    fe_json *doc = fe_json_parse(text, len, msg, sizeof msg);
    free(text);
    if (!doc) return fe_fail(err, FERRY_E_FORMAT, "manifest.json is not valid JSON: %s", msg);
    reader r = {doc, err};
    const fe_json_node *root = fe_json_root(doc);
    if (!(s = check_header(&r, root)) && !(s = stat_trunk(c, err)) &&
        !(s = read_hparams(&r, fe_json_get(doc, root, "model"), &c->hp)) &&
        !(s = read_tensors(&r, fe_json_get(doc, root, "tensors"), c)))
        s = read_banks(&r, fe_json_get(doc, root, "expert_banks"), c);
    fe_json_free(doc);
    if (s) fe_container_close(c);
    return s;
}

/* The span of trunk.bin an on-demand tensor leaves out of RAM: its 64-byte
 * aligned inside, [*lo, *hi) (empty when it has none). */
static void on_demand_span(const fe_tensor *t, uint64_t *lo, uint64_t *hi) {
    *lo = (t->offset + 63) / 64 * 64;
    *hi = (t->offset + t->nbytes) / 64 * 64;
    if (*hi < *lo) *hi = *lo;
}

int fe_container_set_on_demand(fe_container *c, const char *name) {
    for (int i = 0; i < c->n_tensors; i++)
        if (strcmp(c->tensors[i].name, name) == 0 && c->tensors[i].n_dims == 2) {
            c->tensors[i].on_demand = 1;
            return 1;
        }
    return 0;
}

uint64_t fe_container_resident_bytes(const fe_container *c) {
    uint64_t n = c->trunk_size, lo, hi;
    for (int i = 0; i < c->n_tensors; i++)
        if (c->tensors[i].on_demand) {
            on_demand_span(&c->tensors[i], &lo, &hi);
            n -= hi - lo;
        }
    return n;
}

/* Bytes of trunk.bin left out of RAM before file offset `at`. */
static uint64_t skipped_before(const fe_container *c, uint64_t at) {
    uint64_t n = 0, lo, hi;
    for (int i = 0; i < c->n_tensors; i++)
        if (c->tensors[i].on_demand) {
            on_demand_span(&c->tensors[i], &lo, &hi);
            if (hi <= at) n += hi - lo;
        }
    return n;
}

ferry_status fe_container_load_trunk(fe_container *c, int check_threads, ferry_error *err) {
    int fd;
    uint64_t size = 0;
    ferry_status s = fe_container_open_file(c->dir, "trunk.bin", &size, &fd, err);
    if (s) return s;
    if (size != c->trunk_size) {
        close(fd);
        return fe_fail(err, FERRY_E_FORMAT, "trunk.bin changed size while the model was opened");
    }
    uint64_t resident = fe_container_resident_bytes(c);
    c->trunk_alloc = (size_t)(resident ? resident : 1);
    c->trunk = fe_alloc_huge(c->trunk_alloc); /* zero, 2 MiB pages where the OS gives them (common.h) */
    if (!c->trunk) {
        close(fd);
        return fe_fail(err, FERRY_E_NOMEM, "cannot allocate %llu bytes for the trunk", (unsigned long long)resident);
    }
    /* The file minus the on-demand spans, in order: read each gap between them. */
    uint64_t pos = 0, dst = 0;
    int any = 0;
    while (!s) {
        uint64_t next = c->trunk_size, end = c->trunk_size, lo, hi;
        for (int i = 0; i < c->n_tensors; i++)
            if (c->tensors[i].on_demand) {
                on_demand_span(&c->tensors[i], &lo, &hi);
                if (lo >= pos && hi > lo && lo < next) next = lo, end = hi;
            }
        if (next > pos) s = fe_pread_full(fd, c->trunk + dst, next - pos, pos, "trunk.bin", err);
        dst += next - pos;
        if (next == c->trunk_size) break;
        pos = end;
        any = 1;
    }
    if (s || !any) close(fd);
    else c->trunk_fd = fd, c->trunk_fd_open = 1;
    if (s) return s;
    for (int i = 0; i < c->n_tensors; i++) {
        fe_tensor *t = &c->tensors[i];
        t->data = t->on_demand ? NULL : c->trunk + t->offset - skipped_before(c, t->offset);
    }
    return check_threads > 0 ? fe_container_check_trunk(c, check_threads, err) : FERRY_OK;
}

ferry_status fe_container_read_rows(const fe_container *c, const fe_tensor *t, uint64_t row, int n,
                                    uint64_t row_bytes, void *buf, ferry_error *err) {
    if (!c->trunk_fd_open || (row + (uint64_t)n) * row_bytes > t->nbytes)
        return fe_fail(err, FERRY_E_ARG, "rows %llu..%llu of %s are not readable",
                       (unsigned long long)row, (unsigned long long)(row + n), t->name);
    return fe_pread_full(c->trunk_fd, buf, (size_t)(n * row_bytes), t->offset + row * row_bytes, "trunk.bin", err);
}

/* CRC32 of a tensor's stored bytes: in RAM, or read from trunk.bin in 1 MiB
 * pieces when it is on demand (an unreadable piece gives a wrong CRC). */
static uint32_t tensor_crc(const fe_container *c, const fe_tensor *t) {
    if (!t->on_demand) return fe_crc32(0, t->data, t->nbytes);
    enum { PIECE = 1 << 20 };
    uint8_t *buf = malloc(PIECE);
    uint32_t crc = 0;
    ferry_error e;
    if (!buf) return ~t->crc32;
    for (uint64_t at = 0; at < t->nbytes; at += PIECE) {
        size_t n = t->nbytes - at < PIECE ? (size_t)(t->nbytes - at) : PIECE;
        if (fe_pread_full(c->trunk_fd, buf, n, t->offset + at, "trunk.bin", &e)) { crc = ~t->crc32; break; }
        crc = fe_crc32(crc, buf, n);
    }
    free(buf);
    return crc;
}

/* The tensors' CRCs over the pool's threads: each takes the next tensor,
 * biggest first (so the embedding does not come last), and the damaged one
 * with the lowest index is reported, whatever the thread timing. */
typedef struct {
    const fe_container *c;
    const fe_tensor **order;
    atomic_int next;
    atomic_int bad; /* lowest damaged tensor index, or INT_MAX */
} crc_job;

static void crc_worker(void *ctx, int start, int end, int tid) {
    (void)start, (void)end, (void)tid;
    crc_job *j = ctx;
    for (int k; (k = atomic_fetch_add(&j->next, 1)) < j->c->n_tensors;) {
        const fe_tensor *t = j->order[k];
        if (tensor_crc(j->c, t) == t->crc32) continue;
        int i = (int)(t - j->c->tensors), cur = atomic_load(&j->bad);
        while (i < cur && !atomic_compare_exchange_weak(&j->bad, &cur, i)) {}
    }
}

static int by_size_desc(const void *a, const void *b) {
    const fe_tensor *x = *(const fe_tensor *const *)a, *y = *(const fe_tensor *const *)b;
    return x->nbytes > y->nbytes ? -1 : x->nbytes < y->nbytes;
}

ferry_status fe_container_check_trunk(const fe_container *c, int n_threads, ferry_error *err) {
    if (c->n_tensors == 0) return FERRY_OK;
    crc_job job = {c, malloc((size_t)c->n_tensors * sizeof *job.order), 0, INT_MAX};
    fe_pool *pool = fe_pool_new(n_threads < 1 ? 1 : n_threads);
    if (!job.order || !pool) {
        free(job.order);
        fe_pool_free(pool);
        return fe_fail(err, FERRY_E_NOMEM, "out of memory");
    }
    for (int i = 0; i < c->n_tensors; i++) job.order[i] = &c->tensors[i];
    qsort(job.order, (size_t)c->n_tensors, sizeof *job.order, by_size_desc);
    fe_pool_run(pool, crc_worker, &job, fe_pool_threads(pool));
    fe_pool_free(pool);
    free(job.order);
    int bad = atomic_load(&job.bad);
    if (bad == INT_MAX) return FERRY_OK;
    const fe_tensor *t = &c->tensors[bad];
    return fe_fail(err, FERRY_E_CHECKSUM,
                   "trunk.bin: tensor %s (bytes %llu..%llu) is damaged: CRC32 %08x, expected %08x; "
                   "the model folder must be copied or converted again",
                   t->name, (unsigned long long)t->offset, (unsigned long long)(t->offset + t->nbytes),
                   tensor_crc(c, t), t->crc32);
}

void fe_container_close(fe_container *c) {
    if (c->banks)
        for (int l = 0; l < c->hp.n_layers; l++)
            if (c->banks[l].fd >= 0) close(c->banks[l].fd);
    free(c->banks);
    free(c->tensors);
    free(c->hp.layer_is_moe);
    fe_kimi_free(c->hp.kimi);
    if (c->trunk) fe_free_lazy(c->trunk, c->trunk_alloc);
    if (c->trunk_fd_open) close(c->trunk_fd);
    memset(c, 0, sizeof *c);
}

const fe_tensor *fe_container_find(const fe_container *c, const char *name) {
    for (int i = 0; i < c->n_tensors; i++)
        if (strcmp(c->tensors[i].name, name) == 0) return &c->tensors[i];
    return NULL;
}

ferry_status fe_bank_check_record(const fe_bank *b, uint32_t expert, const uint8_t *buf, int check_crc,
                                  ferry_error *err) {
    uint64_t at = FE_BANK_HEADER_BYTES + (uint64_t)expert * b->record_size;
    int ok = memcmp(buf, RECORD_MAGIC, 4) == 0 && rd16(buf + 4) == FERRY_FORMAT_VERSION &&
             rd16(buf + 6) == FE_RECORD_HEADER_BYTES && rd32(buf + 8) == (uint32_t)b->layer &&
             rd32(buf + 12) == expert && rd32(buf + 20) == b->part[2].rows &&
             rd32(buf + 24) == b->part[0].rows && rd32(buf + 28) == b->payload_size;
    for (int k = 0; k < 3 && ok; k++)
        ok = buf[16 + k] == (uint8_t)b->part[k].fmt && rd32(buf + 32 + 4 * k) == b->part[k].offset &&
             rd32(buf + 44 + 4 * k) == b->part[k].nbytes;
    if (!ok)
        return fe_fail(err, FERRY_E_FORMAT, "%s: the record of expert %u (byte %llu) has a damaged header", b->rel,
                       expert, (unsigned long long)at);
    return check_crc ? fe_bank_check_crc(b, expert, buf, fe_crc32(0, buf + FE_RECORD_HEADER_BYTES, b->payload_size),
                                         err)
                     : FERRY_OK;
}

ferry_status fe_bank_check_crc(const fe_bank *b, uint32_t expert, const uint8_t *buf, uint32_t got,
                               ferry_error *err) {
    uint32_t want = rd32(buf + 56);
    if (want == got) return FERRY_OK;
    uint64_t at = FE_BANK_HEADER_BYTES + (uint64_t)expert * b->record_size;
    return fe_fail(err, FERRY_E_CHECKSUM,
                   "%s: the record of layer %d expert %u (byte %llu) is damaged: CRC32 %08x, expected %08x",
                   b->rel, b->layer, expert, (unsigned long long)at, got, want);
}
