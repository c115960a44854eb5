/* vision.c — see ferry_vision.h. Kimi K3's vision tower, as the release's
 * modeling code computes it (docs/KIMI.md, "Images"):
 *
 *   x = patches W_patch^T + bilinear(pos table, gh x gw)
 *   L blocks: x += wo(attn(rope2d(wqkv(rms(x))))); x += fc1(gelu_tanh(fc0(rms(x))))
 *   x = rms(x); merge each merge_h x merge_w group (row-major) into one row;
 *   out = rms(proj2(gelu_erf(proj0(merged)))) with the projector's epsilon.
 *
 * Matrix products go through the engine's kernels (fe_matmul: f32, f16 or
 * bf16 weights, exact f32 products); attention, RoPE, norms and activations
 * are scalar here. Non-causal attention over the whole image, one image per
 * call. */
#define _POSIX_C_SOURCE 200809L
#include "../include/ferry_vision.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "container.h"
#include "formats.h"
#include "kernels.h"
#include "model.h"
#include "ops.h"
#include "pool.h"

#define VIS_MAX_SIDE 512        /* patches per side (the release's patch_limit_on_one_side) */
#define VIS_MAX_PATCHES 65536   /* patches per image (the release's in_patch_limit) */
#define VIS_ROW_BLOCK 64        /* rows per matrix-product call (keeps x in cache) */

typedef struct vis_block {
    const float *norm0, *norm1;
    fe_mat qkv, o, fc0, fc1;
} vis_block;

struct ferry_vision {
    fe_container c;
    ferry_vision_config cfg;
    fe_pool *pool;
    const fe_kernels *kernels;
    float *rows;            /* matmul row buffers, [threads][rows_stride] */
    int rows_stride;
    fe_mat patch;           /* [hidden, 3 p p] */
    float *pos;             /* the position table in f32, [pos_h * pos_w][hidden] */
    vis_block *blocks;
    const float *final_norm;
    fe_mat proj0, proj2;    /* [4h, 4h], [text, 4h] */
    const float *post_norm;
};

static int is_vision_tensor(const char *name) { return !strncmp(name, "v.", 2) || !strncmp(name, "mm.", 3); }

static ferry_status check_config(const ferry_vision_config *g, ferry_error *err) {
    const int lim = 1 << 16;
    if (g->patch_size < 1 || g->patch_size > 64 || g->hidden < 1 || g->hidden > lim || g->qkv_hidden < 1 ||
        g->qkv_hidden > lim || g->heads < 1 || g->heads > 256 || g->layers < 0 || g->layers > 256 ||
        g->intermediate < 1 || g->intermediate > 4 * lim || g->pos_h < 1 || g->pos_h > 1024 || g->pos_w < 1 ||
        g->pos_w > 1024 || g->merge_h < 1 || g->merge_h > 8 || g->merge_w < 1 || g->merge_w > 8 ||
        g->text_hidden < 1 || g->text_hidden > lim || !(g->norm_eps >= 0.0f) || !(g->projector_eps >= 0.0f))
        return fe_fail(err, FERRY_E_FORMAT, "manifest.json: the vision section has a value out of range");
    if (g->qkv_hidden % g->heads || (g->qkv_hidden / g->heads) % 4)
        return fe_fail(err, FERRY_E_FORMAT,
                       "manifest.json: vision qkv_hidden %d is not heads %d times a multiple of 4", g->qkv_hidden,
                       g->heads);
    return FERRY_OK;
}

static ferry_status bind(ferry_vision *v, ferry_error *err) {
    const ferry_vision_config *g = &v->cfg;
    const fe_container *c = &v->c;
    const int D = g->hidden, Q = g->qkv_hidden, I = g->intermediate, M = D * g->merge_h * g->merge_w;
    const int P = 3 * g->patch_size * g->patch_size;
    char name[FE_MAX_NAME];
    ferry_status s;
    fe_mat pos;
    if ((s = fe_bind_mat(c, "v.patch_embd", D, P, &v->patch, err)) ||
        (s = fe_bind_mat(c, "v.pos_embd", g->pos_h * g->pos_w, D, &pos, err)) ||
        (s = fe_bind_vec(c, "v.final_norm", D, 0, &v->final_norm, err)) ||
        (s = fe_bind_mat(c, "mm.proj0", M, M, &v->proj0, err)) ||
        (s = fe_bind_mat(c, "mm.proj2", g->text_hidden, M, &v->proj2, err)) ||
        (s = fe_bind_vec(c, "mm.post_norm", g->text_hidden, 0, &v->post_norm, err)))
        return s;
    v->pos = fe_alloc((size_t)g->pos_h * g->pos_w * D * sizeof(float));
    v->blocks = calloc((size_t)(g->layers ? g->layers : 1), sizeof *v->blocks);
    if (!v->pos || !v->blocks) return fe_fail(err, FERRY_E_NOMEM, "out of memory for the vision tower");
    for (int r = 0; r < g->pos_h * g->pos_w; r++)
        fe_dequant_row(pos.fmt, pos.data + (uint64_t)r * pos.row_bytes, v->pos + (size_t)r * D, D);
    for (int l = 0; l < g->layers; l++) {
        vis_block *b = &v->blocks[l];
#define NM(suffix) (snprintf(name, sizeof name, "v.blk.%d." suffix, l), name)
        if ((s = fe_bind_vec(c, NM("norm0"), D, 0, &b->norm0, err)) ||
            (s = fe_bind_vec(c, NM("norm1"), D, 0, &b->norm1, err)) ||
            (s = fe_bind_mat(c, NM("qkv"), 3 * Q, D, &b->qkv, err)) ||
            (s = fe_bind_mat(c, NM("o"), D, Q, &b->o, err)) ||
            (s = fe_bind_mat(c, NM("fc0"), I, D, &b->fc0, err)) ||
            (s = fe_bind_mat(c, NM("fc1"), D, I, &b->fc1, err)))
            return s;
#undef NM
    }
    const fe_mat *all[] = {&v->patch, &v->proj0, &v->proj2};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        if (!fe_kernel_for(v->kernels, all[i]->fmt))
            return fe_fail(err, FERRY_E_UNSUPPORTED, "the vision tower's %s format has no kernel",
                           fe_format_get(all[i]->fmt)->name);
    for (int l = 0; l < g->layers; l++) {
        const fe_mat *m[] = {&v->blocks[l].qkv, &v->blocks[l].o, &v->blocks[l].fc0, &v->blocks[l].fc1};
        for (int i = 0; i < 4; i++)
            if (!fe_kernel_for(v->kernels, m[i]->fmt))
                return fe_fail(err, FERRY_E_UNSUPPORTED, "the vision tower's %s format has no kernel",
                               fe_format_get(m[i]->fmt)->name);
    }
    return FERRY_OK;
}

ferry_status ferry_vision_open(const char *path, const ferry_vision_config *config, int n_threads,
                               ferry_vision **out, ferry_error *err) {
    if (err) { err->code = FERRY_OK; err->message[0] = '\0'; }
    if (!path || !config || !out) return fe_fail(err, FERRY_E_ARG, "ferry_vision_open: bad arguments");
    *out = NULL;
    ferry_status s = check_config(config, err);
    if (s) return s;
    ferry_vision *v = calloc(1, sizeof *v);
    if (!v) return fe_fail(err, FERRY_E_NOMEM, "out of memory");
    v->cfg = *config;
    if ((s = fe_container_open(&v->c, path, err))) {
        free(v);
        return s;
    }
    /* Only the tower's tensors (and the trunk's small vectors) come into RAM. */
    for (int i = 0; i < v->c.n_tensors; i++)
        if (!is_vision_tensor(v->c.tensors[i].name) && v->c.tensors[i].n_dims == 2) v->c.tensors[i].on_demand = 1;
    if (!fe_container_find(&v->c, "v.patch_embd")) {
        s = fe_fail(err, FERRY_E_UNSUPPORTED, "this model has no vision tower (convert it again from a release "
                                              "that has one)");
        goto fail;
    }
    if ((s = fe_container_load_trunk(&v->c, 0, err))) goto fail;
    v->kernels = fe_kernels_get(fe_kernels_best());
    int threads = n_threads > 0 ? n_threads : 1;
    v->pool = fe_pool_new(threads);
    const ferry_vision_config *g = &v->cfg;
    int widest = 3 * g->patch_size * g->patch_size;
    int cand[] = {g->hidden, g->qkv_hidden, g->intermediate, g->hidden * g->merge_h * g->merge_w};
    for (int i = 0; i < 4; i++) widest = cand[i] > widest ? cand[i] : widest;
    v->rows_stride = fe_rows_stride(widest);
    v->rows = v->pool ? fe_alloc((size_t)fe_pool_threads(v->pool) * v->rows_stride * sizeof(float)) : NULL;
    if (!v->pool || !v->rows) {
        s = fe_fail(err, FERRY_E_NOMEM, "out of memory for the vision tower's threads");
        goto fail;
    }
    if ((s = bind(v, err))) goto fail;
    *out = v;
    return FERRY_OK;
fail:
    ferry_vision_close(v);
    return s;
}

void ferry_vision_close(ferry_vision *v) {
    if (!v) return;
    if (v->pool) fe_pool_free(v->pool);
    fe_free(v->rows);
    fe_free(v->pos);
    free(v->blocks);
    fe_container_close(&v->c);
    free(v);
}

void ferry_vision_info(const ferry_vision *v, ferry_vision_config *config) {
    *config = v->cfg;
    uint64_t n = 0;
    for (int i = 0; i < v->c.n_tensors; i++)
        if (is_vision_tensor(v->c.tensors[i].name)) n += v->c.tensors[i].nbytes;
    config->weight_bytes = n + (uint64_t)v->cfg.pos_h * v->cfg.pos_w * v->cfg.hidden * sizeof(float);
}

/* ---- the pieces */

static void matmul_rows(const ferry_vision *v, const fe_mat *w, const float *x, int n, float *y) {
    fe_ops ops = {v->pool, v->rows, v->rows_stride, v->kernels, NULL, NULL};
    for (int r = 0; r < n; r += VIS_ROW_BLOCK) {
        int m = n - r < VIS_ROW_BLOCK ? n - r : VIS_ROW_BLOCK;
        fe_matmul(&ops, w, x + (size_t)r * w->cols, m, y + (size_t)r * w->rows);
    }
}

static void rms_rows(float *out, const float *x, const float *w, int n, int d, float eps) {
    for (int r = 0; r < n; r++) {
        const float *xr = x + (size_t)r * d;
        double ss = 0.0;
        for (int i = 0; i < d; i++) ss += (double)xr[i] * xr[i];
        const double scale = 1.0 / sqrt(ss / d + eps);
        for (int i = 0; i < d; i++) out[(size_t)r * d + i] = (float)(xr[i] * scale * w[i]);
    }
}

static float gelu_tanh(float x) {
    const double u = 0.7978845608028654 * ((double)x + 0.044715 * (double)x * x * x);
    return (float)(0.5 * x * (1.0 + tanh(u)));
}

static float gelu_erf(float x) { return (float)(0.5 * x * (1.0 + erf((double)x * 0.7071067811865476))); }

/* One axis of the bilinear resize: output index i of n from a table of n0,
 * half-pixel centres, no antialiasing, a negative source coordinate clamped
 * to 0; the two source indices and the weight of the second. */
static void bilinear_axis(int i, int n, int n0, int *i0, int *i1, double *w) {
    double src = (i + 0.5) * ((double)n0 / n) - 0.5;
    if (src < 0) src = 0;
    int lo = (int)src;
    if (lo > n0 - 1) lo = n0 - 1;
    *i0 = lo;
    *i1 = lo + 1 < n0 ? lo + 1 : n0 - 1;
    *w = src - lo;
}

/* The position table resized to gh x gw (bilinear_axis on both axes). */
static void positions(const ferry_vision *v, int gh, int gw, float *out) {
    const int D = v->cfg.hidden, H0 = v->cfg.pos_h, W0 = v->cfg.pos_w;
    for (int y = 0; y < gh; y++) {
        int y0, y1;
        double ly;
        bilinear_axis(y, gh, H0, &y0, &y1, &ly);
        for (int x = 0; x < gw; x++) {
            int x0, x1;
            double lx;
            bilinear_axis(x, gw, W0, &x0, &x1, &lx);
            const float *a = v->pos + ((size_t)y0 * W0 + x0) * D, *b = v->pos + ((size_t)y0 * W0 + x1) * D;
            const float *c = v->pos + ((size_t)y1 * W0 + x0) * D, *d = v->pos + ((size_t)y1 * W0 + x1) * D;
            float *o = out + ((size_t)y * gw + x) * D;
            for (int i = 0; i < D; i++) {
                double top = a[i] * (1 - lx) + b[i] * lx, bot = c[i] * (1 - lx) + d[i] * lx;
                o[i] = (float)(top * (1 - ly) + bot * ly);
            }
        }
    }
}

typedef struct attn_job {
    const ferry_vision *v;
    const float *qkv;   /* [N][3Q], q and k rotated */
    const float *kt;    /* K of each head in the kernels' tiles (kernels.h), [H][FE_KT_PAD(N) * hd] */
    float *out;         /* [N][Q] */
    float *scratch;     /* [threads][FE_ATT_Q * (FE_KT_PAD(N) + 2 hd)] */
    int n;              /* patches */
} attn_job;

static size_t attn_scratch(int n, int hd) { return (size_t)FE_ATT_Q * ((size_t)FE_KT_PAD(n) + 2 * (size_t)hd); }

/* K of every head into the attention kernels' tiled layout. */
static void pack_kt(void *p, int start, int end, int tid) {
    (void)tid;
    attn_job *j = p;
    const int Q = j->v->cfg.qkv_hidden, hd = Q / j->v->cfg.heads, N = j->n;
    for (int h = start; h < end; h++) {
        float *kt = (float *)j->kt + (size_t)h * FE_KT_PAD(N) * hd;
        memset(kt, 0, (size_t)FE_KT_PAD(N) * hd * sizeof(float));
        for (int i = 0; i < N; i++)
            for (int c = 0; c < hd; c++) kt[fe_kt_index(i, c, hd)] = j->qkv[(size_t)i * 3 * Q + Q + h * hd + c];
    }
}

/* Items are (head, block of FE_ATT_Q queries): softmax(q k^T / sqrt(hd)) v over
 * every patch, with the engine's attention kernels. */
static void attn_items(void *p, int start, int end, int tid) {
    attn_job *j = p;
    const fe_kernels *K = j->v->kernels;
    const int Q = j->v->cfg.qkv_hidden, H = j->v->cfg.heads, hd = Q / H, N = j->n;
    const int nb = (N + FE_ATT_Q - 1) / FE_ATT_Q, pad = FE_KT_PAD(N);
    const float scale = 1.0f / sqrtf((float)hd);
    float *s = j->scratch + (size_t)tid * attn_scratch(N, hd);
    float *qb = s + (size_t)FE_ATT_Q * pad, *ob = qb + (size_t)FE_ATT_Q * hd;
    for (int it = start; it < end; it++) {
        const int h = it / nb, q0 = (it % nb) * FE_ATT_Q;
        const int nq = N - q0 < FE_ATT_Q ? N - q0 : FE_ATT_Q;
        for (int r = 0; r < nq; r++)
            memcpy(qb + (size_t)r * hd, j->qkv + (size_t)(q0 + r) * 3 * Q + h * hd, (size_t)hd * sizeof(float));
        K->att_scores(qb, nq, j->kt + (size_t)h * pad * hd, hd, N, scale, s, (size_t)pad);
        for (int r = 0; r < nq; r++) K->att_softmax(s + (size_t)r * pad, N);
        K->att_wsum(ob, nq, s, (size_t)pad, j->qkv + 2 * Q + h * hd, (size_t)3 * Q, N, hd);
        for (int r = 0; r < nq; r++)
            memcpy(j->out + (size_t)(q0 + r) * Q + h * hd, ob + (size_t)r * hd, (size_t)hd * sizeof(float));
    }
}

/* 2-D RoPE on q and k: pair j = (2j, 2j + 1) of each head turns by x * f_i
 * when j = 2i and by y * f_i when j = 2i + 1, f_i = 10000^(-4i / hd). */
static void rope2d(const ferry_vision *v, float *qkv, int gh, int gw) {
    const int Q = v->cfg.qkv_hidden, H = v->cfg.heads, hd = Q / H;
    for (int p = 0; p < gh * gw; p++) {
        const int y = p / gw, x = p % gw;
        for (int j = 0; j < hd / 2; j++) {
            const int i = j / 2;
            const double f = pow(10000.0, -(4.0 * i) / hd);
            const double ang = (j % 2 ? y : x) * f;
            const double c = cos(ang), sn = sin(ang);
            for (int part = 0; part < 2; part++)
                for (int h = 0; h < H; h++) {
                    float *e = qkv + (size_t)p * 3 * Q + part * Q + h * hd + 2 * j;
                    const double a = e[0], b = e[1];
                    e[0] = (float)(a * c - b * sn);
                    e[1] = (float)(a * sn + b * c);
                }
        }
    }
}

ferry_status ferry_vision_encode(ferry_vision *v, const float *patches, int gh, int gw, float *out,
                                 ferry_vision_stage_fn stage, void *user, ferry_error *err) {
    if (err) { err->code = FERRY_OK; err->message[0] = '\0'; }
    if (!v || !patches || !out) return fe_fail(err, FERRY_E_ARG, "ferry_vision_encode: bad arguments");
    const ferry_vision_config *g = &v->cfg;
    if (gh < 1 || gw < 1 || gh > VIS_MAX_SIDE || gw > VIS_MAX_SIDE || (int64_t)gh * gw > VIS_MAX_PATCHES ||
        gh % g->merge_h || gw % g->merge_w)
        return fe_fail(err, FERRY_E_ARG,
                       "an image of %d x %d patches cannot be encoded (at most %d per side and %d in all, "
                       "sides multiples of %d x %d)", gh, gw, VIS_MAX_SIDE, VIS_MAX_PATCHES, g->merge_h, g->merge_w);
    const int N = gh * gw, D = g->hidden, Q = g->qkv_hidden, I = g->intermediate;
    const int mh = g->merge_h, mw = g->merge_w, M = D * mh * mw, R = N / (mh * mw);
    const int T = fe_pool_threads(v->pool);
    float *x = fe_alloc((size_t)N * D * sizeof(float)), *h = fe_alloc((size_t)N * D * sizeof(float));
    float *qkv = fe_alloc((size_t)N * 3 * Q * sizeof(float)), *att = fe_alloc((size_t)N * Q * sizeof(float));
    float *mlp = fe_alloc((size_t)N * (I > M ? I : M) * sizeof(float));
    const int hd = Q / g->heads;
    float *scores = fe_alloc((size_t)T * attn_scratch(N, hd) * sizeof(float));
    float *kt = fe_alloc((size_t)g->heads * FE_KT_PAD(N) * hd * sizeof(float));
    ferry_status s = FERRY_OK;
    if (!x || !h || !qkv || !att || !mlp || !scores || !kt) {
        s = fe_fail(err, FERRY_E_NOMEM, "out of memory for an image of %d patches", N);
        goto done;
    }
#define STAGE(k, rows, dim, data)                                                                          \
    if (stage && stage(user, (k), (rows), (dim), (data))) {                                                \
        s = fe_fail(err, FERRY_E_CANCELLED, "the image was cancelled in the vision tower");               \
        goto done;                                                                                         \
    }
    matmul_rows(v, &v->patch, patches, N, x);
    positions(v, gh, gw, h);
    for (size_t i = 0; i < (size_t)N * D; i++) x[i] += h[i];
    STAGE(0, N, D, x);
    for (int l = 0; l < g->layers; l++) {
        const vis_block *b = &v->blocks[l];
        rms_rows(h, x, b->norm0, N, D, g->norm_eps);
        matmul_rows(v, &b->qkv, h, N, qkv);
        rope2d(v, qkv, gh, gw);
        attn_job j = {v, qkv, kt, att, scores, N};
        fe_pool_run(v->pool, pack_kt, &j, g->heads);
        fe_pool_run(v->pool, attn_items, &j, g->heads * ((N + FE_ATT_Q - 1) / FE_ATT_Q));
        matmul_rows(v, &b->o, att, N, h);
        for (size_t i = 0; i < (size_t)N * D; i++) x[i] += h[i];
        rms_rows(h, x, b->norm1, N, D, g->norm_eps);
        matmul_rows(v, &b->fc0, h, N, mlp);
        for (size_t i = 0; i < (size_t)N * I; i++) mlp[i] = gelu_tanh(mlp[i]);
        matmul_rows(v, &b->fc1, mlp, N, h);
        for (size_t i = 0; i < (size_t)N * D; i++) x[i] += h[i];
        STAGE(1 + l, N, D, x);
    }
    rms_rows(x, x, v->final_norm, N, D, g->norm_eps);
    STAGE(g->layers + 1, N, D, x);
    /* Merge: output row (r, c) of the (gh/mh) x (gw/mw) grid is the mh x mw
     * patches below and right of (r mh, c mw), row-major, laid end to end. */
    for (int r = 0; r < gh / mh; r++)
        for (int c = 0; c < gw / mw; c++)
            for (int a = 0; a < mh; a++)
                for (int b = 0; b < mw; b++)
                    memcpy(mlp + ((size_t)(r * (gw / mw) + c) * M) + (size_t)(a * mw + b) * D,
                           x + ((size_t)(r * mh + a) * gw + c * mw + b) * D, (size_t)D * sizeof(float));
    STAGE(g->layers + 2, R, M, mlp);
    float *proj = fe_alloc((size_t)R * (M > g->text_hidden ? M : g->text_hidden) * sizeof(float));
    if (!proj) {
        s = fe_fail(err, FERRY_E_NOMEM, "out of memory for an image of %d patches", N);
        goto done;
    }
    matmul_rows(v, &v->proj0, mlp, R, proj);
    for (size_t i = 0; i < (size_t)R * M; i++) proj[i] = gelu_erf(proj[i]);
    matmul_rows(v, &v->proj2, proj, R, out);
    fe_free(proj);
    rms_rows(out, out, v->post_norm, R, g->text_hidden, g->projector_eps);
    STAGE(g->layers + 3, R, g->text_hidden, out);
#undef STAGE
done:
    fe_free(x);
    fe_free(h);
    fe_free(qkv);
    fe_free(att);
    fe_free(mlp);
    fe_free(scores);
    fe_free(kt);
    return s;
}
