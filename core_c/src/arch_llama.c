/* arch_llama.c — the "llama" family (Llama, Mistral, Qwen2/3, Qwen3-MoE,
 * Mixtral, OLMoE): RMSNorm, RoPE, grouped-query attention with a KV cache,
 * SwiGLU feed-forward or a softmax-routed mixture of experts whose weights
 * come from the expert banks through experts.h. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "experts.h"
#include "formats.h"
#include "kernels.h"
#include "model.h"
#include "moe.h"

/* The resident tensors of one transformer block. Vectors are f32. */
typedef struct fe_layer {
    const float *attn_norm;         /* [dim] */
    fe_mat wq, wk, wv, wo;          /* projections */
    const float *bq, *bk, *bv, *bo; /* biases or NULL */
    const float *q_norm, *k_norm;   /* [head_dim] or [heads*head_dim], or NULL */
    const float *ffn_norm;          /* [dim] */
    fe_mat w_gate, w_up, w_down;    /* dense feed-forward (dense layers) */
    fe_mat router;                  /* [n_experts, dim] (MoE layers) */
} fe_layer;

/* Everything bind() resolves: the engine's arch_data. */
typedef struct llama_model {
    fe_layer *layers;               /* n_layers */
    fe_mat tok_embd;                /* [vocab, dim] */
    fe_mat output;                  /* [vocab, dim] (may alias tok_embd) */
    const float *output_norm;       /* [dim] */
} llama_model;

#define MODEL(e) ((llama_model *)(e)->arch_data)

/* ---------------------------------------------------------------- binding */

static ferry_status bind_layer(ferry_engine *e, int l, ferry_error *err) {
    const fe_hparams *hp = &e->c.hp;
    fe_layer *L = &MODEL(e)->layers[l];
    int qd = hp->n_heads * hp->head_dim, kvd = hp->n_kv_heads * hp->head_dim, d = hp->dim;
    char n[FE_MAX_NAME];
    ferry_status s;
#define NAME(suffix) (snprintf(n, sizeof n, "blk.%d.%s", l, suffix), n)
    if ((s = fe_bind_vec(&e->c, NAME("attn_norm"), d, 0, &L->attn_norm, err))) return s;
    if ((s = fe_bind_mat(&e->c, NAME("attn_q"), qd, d, &L->wq, err))) return s;
    if ((s = fe_bind_mat(&e->c, NAME("attn_k"), kvd, d, &L->wk, err))) return s;
    if ((s = fe_bind_mat(&e->c, NAME("attn_v"), kvd, d, &L->wv, err))) return s;
    if ((s = fe_bind_mat(&e->c, NAME("attn_output"), d, qd, &L->wo, err))) return s;
    if ((s = fe_bind_vec(&e->c, NAME("attn_q_bias"), qd, !hp->qkv_bias, &L->bq, err))) return s;
    if ((s = fe_bind_vec(&e->c, NAME("attn_k_bias"), kvd, !hp->qkv_bias, &L->bk, err))) return s;
    if ((s = fe_bind_vec(&e->c, NAME("attn_v_bias"), kvd, !hp->qkv_bias, &L->bv, err))) return s;
    if ((s = fe_bind_vec(&e->c, NAME("attn_output_bias"), d, !hp->o_bias, &L->bo, err))) return s;
    if (hp->qk_norm) {
        int qn = hp->qk_norm == 1 ? hp->head_dim : qd, kn = hp->qk_norm == 1 ? hp->head_dim : kvd;
        if ((s = fe_bind_vec(&e->c, NAME("attn_q_norm"), qn, 0, &L->q_norm, err))) return s;
        if ((s = fe_bind_vec(&e->c, NAME("attn_k_norm"), kn, 0, &L->k_norm, err))) return s;
    }
    if ((s = fe_bind_vec(&e->c, NAME("ffn_norm"), d, 0, &L->ffn_norm, err))) return s;
    if (hp->layer_is_moe[l]) {
        if ((s = fe_bind_mat(&e->c, NAME("ffn_gate_inp"), hp->n_experts, d, &L->router, err))) return s;
    } else {
        if ((s = fe_bind_mat(&e->c, NAME("ffn_gate"), hp->ffn_dim, d, &L->w_gate, err))) return s;
        if ((s = fe_bind_mat(&e->c, NAME("ffn_up"), hp->ffn_dim, d, &L->w_up, err))) return s;
        if ((s = fe_bind_mat(&e->c, NAME("ffn_down"), d, hp->ffn_dim, &L->w_down, err))) return s;
    }
#undef NAME
    return FERRY_OK;
}

static void llama_unbind(ferry_engine *e) {
    llama_model *m = MODEL(e);
    if (m) free(m->layers);
    free(m);
    e->arch_data = NULL;
}

static ferry_status llama_bind(ferry_engine *e, ferry_error *err) {
    const fe_hparams *hp = &e->c.hp;
    llama_model *m = calloc(1, sizeof *m);
    if (m) m->layers = calloc((size_t)hp->n_layers, sizeof *m->layers);
    e->arch_data = m;
    if (!m || !m->layers) return fe_fail(err, FERRY_E_NOMEM, "out of memory");
    ferry_status s;
    if ((s = fe_bind_mat(&e->c, "token_embd", hp->vocab, hp->dim, &m->tok_embd, err))) return s;
    if ((s = fe_bind_vec(&e->c, "output_norm", hp->dim, 0, &m->output_norm, err))) return s;
    if (hp->tied_embeddings) m->output = m->tok_embd;
    else if ((s = fe_bind_mat(&e->c, "output", hp->vocab, hp->dim, &m->output, err))) return s;
    for (int l = 0; l < hp->n_layers; l++)
        if ((s = bind_layer(e, l, err))) return s;
    return FERRY_OK;
}

/* ------------------------------------------------------------ scratch plan */

/* The per-chunk activations, in the order they are carved from scratch. */
typedef struct chunk_bufs {
    float *x;        /* [C][dim] residual stream */
    float *xb;       /* [C][dim] normed input of a sub-block */
    float *q;        /* [C][q_dim] */
    float *k, *v;    /* [C][kv_dim] */
    float *att;      /* [C][q_dim] attention output before o_proj */
    float *h1, *h2;  /* [C][max ffn] feed-forward hidden */
    float *y;        /* [C][dim] sub-block output */
    fe_moe_bufs moe; /* the MoE loop's scratch (moe.h) */
    float *rows;     /* [threads][max cols] dequantized weight rows */
    float *scores;   /* [threads][ATT_TOKENS x group][n_ctx rounded up to FE_KT] attention scores (an item's rows) */
    float *qrows;    /* [threads][ATT_TOKENS x group][head_dim] an item's queries side by side */
} chunk_bufs;

static int max_cols(const fe_hparams *hp) {
    int m = hp->dim;
    if (hp->n_heads * hp->head_dim > m) m = hp->n_heads * hp->head_dim;
    if (hp->ffn_dim > m) m = hp->ffn_dim;
    if (hp->expert_ffn_dim > m) m = hp->expert_ffn_dim;
    return m;
}

/* Prompt tokens whose attention one work item computes together (below). */
#define ATT_TOKENS 4

/* Lay out (or just measure, when base is NULL) the chunk buffers. */
static uint64_t carve(const fe_hparams *hp, int chunk, int n_ctx, int n_threads, uint8_t *base, chunk_bufs *b) {
    uint64_t off = 0;
    const uint64_t C = (uint64_t)chunk, dim = (uint64_t)hp->dim;
    const uint64_t qd = (uint64_t)hp->n_heads * hp->head_dim, kvd = (uint64_t)hp->n_kv_heads * hp->head_dim;
    uint64_t ffn = (uint64_t)(hp->ffn_dim > hp->expert_ffn_dim ? hp->ffn_dim : hp->expert_ffn_dim);
    uint64_t E = (uint64_t)hp->n_experts;
#define TAKE(field, type, count)                                                                      \
    do {                                                                                              \
        if (base) b->field = (type *)(base + off);                                                   \
        off += FE_ALIGN_UP((uint64_t)(count) * sizeof(type), 64);                                     \
    } while (0)
    TAKE(x, float, C * dim);
    TAKE(xb, float, C * dim);
    TAKE(q, float, C * qd);
    TAKE(k, float, C * kvd);
    TAKE(v, float, C * kvd);
    TAKE(att, float, C * qd);
    TAKE(h1, float, C * ffn);
    TAKE(h2, float, C * ffn);
    TAKE(y, float, C * dim);
    if (E) {
        uint64_t m = fe_moe_carve(hp, chunk, hp->dim, NULL, NULL);
        if (base) fe_moe_carve(hp, chunk, hp->dim, base + off, &b->moe);
        off += FE_ALIGN_UP(m, 64);
    }
    TAKE(rows, float, (uint64_t)n_threads * (uint64_t)fe_rows_stride(max_cols(hp)));
    TAKE(scores, float,
         (uint64_t)n_threads * (uint64_t)(ATT_TOKENS * (hp->n_heads / hp->n_kv_heads)) * (uint64_t)FE_KT_PAD(n_ctx));
    TAKE(qrows, float, (uint64_t)n_threads * (uint64_t)(ATT_TOKENS * (hp->n_heads / hp->n_kv_heads)) * (uint64_t)hp->head_dim);
#undef TAKE
    return off;
}

/* Floats in each of the K and V caches (positions rounded up to whole K tiles). */
static uint64_t kv_floats(const fe_hparams *hp, int n_ctx) {
    return (uint64_t)hp->n_layers * (uint64_t)FE_KT_PAD(n_ctx) * (uint64_t)hp->n_kv_heads * (uint64_t)hp->head_dim;
}

static void llama_sizes(const ferry_engine *e, int n_ctx, int n_threads, fe_session_sizes *out) {
    const fe_hparams *hp = &e->c.hp;
    out->state = 2 * FE_ALIGN_UP(kv_floats(hp, n_ctx) * sizeof(float), 64);
    out->scratch = carve(hp, e->chunk, n_ctx, n_threads, NULL, NULL);
}

/* The caches are laid out by [layer][kv head] first, so what attention reads
 * for one head is contiguous (which the hardware prefetcher and the TLB
 * follow far better than rows a whole position's heads apart). Within a
 * head, V is [position][head_dim] and K is in tiles of FE_KT positions,
 * column by column (kernels.h: fe_kt_index), n_ctx rounded up to whole
 * tiles. The saved-state blob keeps its own order ([layer][position][heads],
 * below). */
static float *k_cache(const ferry_session *s) { return (float *)s->state; }
static float *v_cache(const ferry_session *s) {
    return (float *)(s->state + FE_ALIGN_UP(kv_floats(&s->e->c.hp, s->n_ctx) * sizeof(float), 64));
}
/* Head `h` of layer `l` in a cache: FE_KT_PAD(n_ctx) x head_dim floats. */
static float *kv_head(float *cache, const ferry_session *s, int l, int h) {
    const fe_hparams *hp = &s->e->c.hp;
    return cache + ((size_t)l * (size_t)hp->n_kv_heads + (size_t)h) * (size_t)FE_KT_PAD(s->n_ctx) * (size_t)hp->head_dim;
}
/* Row `pos` of head `h` of layer `l` in the V cache. */
static float *v_row(const ferry_session *s, int l, int h, int pos) {
    return kv_head(v_cache(s), s, l, h) + (size_t)pos * (size_t)s->e->c.hp.head_dim;
}
/* Position `pos` of head `h` of layer `l` into the K cache's tiles (to_k)
 * or out of them: head_dim floats at `row` (any alignment). */
static void k_pos(const ferry_session *s, int l, int h, int pos, void *row, int to_k) {
    const int hd = s->e->c.hp.head_dim;
    float *kt = kv_head(k_cache(s), s, l, h);
    uint8_t *r = row;
    for (int c = 0; c < hd; c++) {
        if (to_k) memcpy(&kt[fe_kt_index(pos, c, hd)], r + (size_t)c * sizeof(float), sizeof(float));
        else memcpy(r + (size_t)c * sizeof(float), &kt[fe_kt_index(pos, c, hd)], sizeof(float));
    }
}

/* ------------------------------------------------------------- primitives */

/* The rotation of position pos: cs[i] = cos, cs[half + i] = sin of the
 * angle of frequency i (computed once per token for every head). */
static void rope_table(float *cs, int pos, const fe_hparams *hp) {
    int half = hp->rope_dim / 2;
    for (int i = 0; i < half; i++) {
        float inv_freq = 1.0f / powf(hp->rope_theta, (float)(2 * i) / (float)hp->rope_dim);
        float angle = (float)pos * inv_freq;
        cs[i] = cosf(angle);
        cs[half + i] = sinf(angle);
    }
}

/* Rotate one head's leading rope_dim values by a rope_table. */
static void rope(float *v, const float *cs, const fe_hparams *hp) {
    int half = hp->rope_dim / 2;
    for (int i = 0; i < half; i++) {
        float c = cs[i], s = cs[half + i];
        int a = hp->rope_interleaved ? 2 * i : i, b = hp->rope_interleaved ? 2 * i + 1 : i + half;
        float x0 = v[a], x1 = v[b];
        v[a] = x0 * c - x1 * s;
        v[b] = x0 * s + x1 * c;
    }
}

static fe_ops ops_of(ferry_session *s, const chunk_bufs *b) {
    fe_ops ops = {s->pool, b->rows, fe_rows_stride(max_cols(&s->e->c.hp)), s->e->kernels, s->prof_cur, fe_session_q8(s)};
    return ops;
}

static void matmul(ferry_session *s, const chunk_bufs *b, const fe_mat *w, const float *x, int n, float *y) {
    fe_ops ops = ops_of(s, b);
    fe_matmul(&ops, w, x, n, y);
}

/* Profile helpers: the clock only when the session profiles (ferry.h). */
static double prof_t0(const ferry_session *s) { return s->prof_cur ? fe_now() : 0.0; }
#define PROF_ADD(s, field, t0)                                                                        \
    do {                                                                                              \
        if ((s)->prof_cur) (s)->prof_cur->field += fe_now() - (t0);                                   \
    } while (0)

/* ------------------------------------------------------------- attention */

typedef struct {
    ferry_session *s;
    const chunk_bufs *b;
    int layer, n;       /* layer and tokens in the chunk */
    int first;          /* the first token whose attention output is needed */
    int tb, hb;         /* tokens and query heads per item */
    int hblocks;        /* items per KV head and token block: group / hb */
} attn_job;

/* Causal softmax attention over the cache. One item is a block of up to tb
 * tokens and hb query heads that share one KV head (grouped-query
 * attention): the block's tb x hb queries go through att_scores in one call,
 * side by side, so one load of a K tile serves all of them (a token's scores
 * past its own position, up to the block's last token's, are computed and
 * not read: those K rows are this chunk's, already stored), then each token's
 * softmax and weighted sum over its own positions; the item's K and V (at
 * most n_ctx x hd floats each) stay in L2 while its tokens go over them.
 * Every (token, head) row is still computed exactly as alone (kernels.h:
 * each score, weight and output is its own chain in a fixed order), so the
 * split changes the memory traffic, never a bit. */
static void attn_items(void *p, int start, int end, int tid) {
    attn_job *j = p;
    ferry_session *s = j->s;
    const fe_hparams *hp = &s->e->c.hp;
    const int hd = hp->head_dim, qd = hp->n_heads * hd;
    const int group = hp->n_heads / hp->n_kv_heads, hb = j->hb;
    const size_t os = (size_t)FE_KT_PAD(s->n_ctx), rows = (size_t)ATT_TOKENS * (size_t)group;
    const float scale = 1.0f / sqrtf((float)hd);
    const fe_kernels *K = s->e->kernels; /* the same bits in every set (kernels.h) */
    float *scores = j->b->scores + (size_t)tid * rows * os;
    float *qg = j->b->qrows + (size_t)tid * rows * (size_t)hd;
    for (int it = start; it < end; it++) {
        /* items in order of token block fastest: a thread's run of items
         * reads one head's K and V */
        const int tblocks = (j->n - j->first + j->tb - 1) / j->tb, t0 = j->first + it % tblocks * j->tb;
        const int hblk = it / tblocks % j->hblocks, kvh = it / tblocks / j->hblocks;
        const int t1 = t0 + j->tb < j->n ? t0 + j->tb : j->n; /* tokens [t0, t1) */
        const int h0 = kvh * group + hblk * hb;                 /* heads [h0, h0 + hb) */
        const float *kt = kv_head(k_cache(s), s, j->layer, kvh), *vc = kv_head(v_cache(s), s, j->layer, kvh);
        for (int t = t0; t < t1; t++) /* the block's queries, token by token, heads side by side */
            memcpy(qg + (size_t)(t - t0) * (size_t)hb * (size_t)hd, j->b->q + (size_t)t * (size_t)qd + (size_t)h0 * (size_t)hd,
                   sizeof(float) * (size_t)hb * (size_t)hd);
        K->att_scores(qg, (t1 - t0) * hb, kt, hd, s->pos + t1, scale, scores, os);
        for (int t = t0; t < t1; t++) {
            const int seen = s->pos + t + 1; /* token t sees positions 0 .. pos + t */
            float *row = scores + (size_t)(t - t0) * (size_t)hb * os;
            for (int x = 0; x < hb; x++) K->att_softmax(row + (size_t)x * os, seen);
            K->att_wsum(j->b->att + (size_t)t * (size_t)qd + (size_t)h0 * (size_t)hd, hb, row, os, vc, (size_t)hd, seen, hd);
        }
    }
}

/* Attention of layer l for a chunk of n tokens: every token's K and V go
 * into the caches, but the output (and the residual stream) is computed for
 * tokens [first, n) only: those before are not read again (the last layer
 * of a chunk whose logits are not asked for, see llama_forward). */
static void attention(ferry_session *s, const chunk_bufs *b, int l, int n, int first) {
    const fe_hparams *hp = &s->e->c.hp;
    const fe_layer *L = &MODEL(s->e)->layers[l];
    const int hd = hp->head_dim, qd = hp->n_heads * hd, kvd = hp->n_kv_heads * hd, d = hp->dim;
    double t0 = prof_t0(s);
    for (int t = 0; t < n; t++) fe_rmsnorm(b->xb + (size_t)t * d, b->x + (size_t)t * d, L->attn_norm, d, hp->norm_eps);
    PROF_ADD(s, norm_seconds, t0);
    {   /* q, k and v in one parallel job */
        const fe_mat *w[3] = {&L->wq, &L->wk, &L->wv};
        float *y[3] = {b->q, b->k, b->v};
        fe_ops ops = ops_of(s, b);
        fe_matmul_multi(&ops, w, 3, b->xb, n, y);
    }
    t0 = prof_t0(s);
    float *cs = b->rows; /* the caller's row buffer is free between products (rope_dim <= its width) */
    for (int t = 0; t < n; t++) {
        float *q = b->q + (size_t)t * qd, *k = b->k + (size_t)t * kvd, *v = b->v + (size_t)t * kvd;
        if (L->bq)
            for (int i = 0; i < qd; i++) q[i] += L->bq[i];
        if (L->bk)
            for (int i = 0; i < kvd; i++) k[i] += L->bk[i];
        if (L->bv)
            for (int i = 0; i < kvd; i++) v[i] += L->bv[i];
        if (hp->qk_norm == 2) {
            fe_rmsnorm(q, q, L->q_norm, qd, hp->norm_eps);
            fe_rmsnorm(k, k, L->k_norm, kvd, hp->norm_eps);
        }
        rope_table(cs, s->pos + t, hp);
        for (int h = 0; h < hp->n_heads; h++) {
            if (hp->qk_norm == 1) fe_rmsnorm(q + h * hd, q + h * hd, L->q_norm, hd, hp->norm_eps);
            rope(q + h * hd, cs, hp);
        }
        for (int h = 0; h < hp->n_kv_heads; h++) {
            if (hp->qk_norm == 1) fe_rmsnorm(k + h * hd, k + h * hd, L->k_norm, hd, hp->norm_eps);
            rope(k + h * hd, cs, hp);
        }
        for (int h = 0; h < hp->n_kv_heads; h++) {
            k_pos(s, l, h, s->pos + t, k + (size_t)h * hd, 1);
            memcpy(v_row(s, l, h, s->pos + t), v + (size_t)h * hd, (size_t)hd * sizeof *v);
        }
    }
    /* Items: blocks of ATT_TOKENS tokens x the query heads of one KV head;
     * when that leaves too few items to keep every thread busy (decode), one
     * token each, and the KV head's query heads in the fewest equal blocks
     * that make two items a thread (one block when the KV heads alone do):
     * each item reads its KV head's K and V, and a head's rows split among
     * threads were read by each (MoE file decode: attention 1.3-1.7 ms a
     * token against 2.0-2.4 with one head an item; bench log 2026-12-07). */
    const int group = hp->n_heads / hp->n_kv_heads, threads = fe_pool_threads(s->pool), nt = n - first;
    if (nt <= 0) {
        PROF_ADD(s, attention_seconds, t0);
        return;
    }
    attn_job j = {s, b, l, n, first, ATT_TOKENS, group, 1};
    if ((nt + ATT_TOKENS - 1) / ATT_TOKENS * hp->n_kv_heads < 4 * threads) {
        j.tb = 1;
        if (nt * hp->n_kv_heads < 4 * threads) {
            int blocks = 1;
            while (blocks < group && (group % blocks || nt * hp->n_kv_heads * blocks < 2 * threads)) blocks++;
            j.hb = group / blocks, j.hblocks = blocks;
        }
    }
    fe_pool_run(s->pool, attn_items, &j, (nt + j.tb - 1) / j.tb * hp->n_kv_heads * j.hblocks);
    PROF_ADD(s, attention_seconds, t0);
    matmul(s, b, &L->wo, b->att + (size_t)first * qd, nt, b->y + (size_t)first * d);
    t0 = prof_t0(s);
    for (int t = first; t < n; t++)
        for (int i = 0; i < d; i++) b->x[(size_t)t * d + i] += b->y[(size_t)t * d + i] + (L->bo ? L->bo[i] : 0.0f);
    PROF_ADD(s, elementwise_seconds, t0);
}

/* ---------------------------------------------------------- feed-forward */

/* out = down(fe_silu(gate x) * up x) for n rows of x. */
static void swiglu(ferry_session *s, const chunk_bufs *b, const fe_mat *g, const fe_mat *u, const fe_mat *dn,
                   const float *x, int n, float *out) {
    {   /* gate and up in one parallel job */
        const fe_mat *w[2] = {g, u};
        float *y[2] = {b->h1, b->h2};
        fe_ops ops = ops_of(s, b);
        fe_matmul_multi(&ops, w, 2, x, n, y);
    }
    double t0 = prof_t0(s);
    fe_silu_mul(s->pool, b->h1, b->h2, (size_t)n * g->rows);
    PROF_ADD(s, elementwise_seconds, t0);
    matmul(s, b, dn, b->h1, n, out);
}

/* What the MoE loop (moe.c) needs from this family: the softmax router and
 * the SwiGLU expert. */
typedef struct moe_ctx {
    ferry_session *s;
    const chunk_bufs *b;
} moe_ctx;

static void moe_expert(void *p, int l, const uint8_t *rec, const float *in, int m, float *out) {
    moe_ctx *c = p;
    const fe_bank *bk = &c->s->e->c.banks[l];
    fe_mat gm = fe_expert_mat(bk, 0, rec), um = fe_expert_mat(bk, 1, rec), dm = fe_expert_mat(bk, 2, rec);
    swiglu(c->s, c->b, &gm, &um, &dm, in, m, out);
}

/* SwiGLU of n experts' gate and up (fe_moe_gated1's act), timed as swiglu
 * times its own. */
static void silu_mul_act(void *p, float *h1, const float *h2, size_t len) {
    ferry_session *s = p;
    double t0 = prof_t0(s);
    fe_silu_mul(s->pool, h1, h2, len);
    PROF_ADD(s, elementwise_seconds, t0);
}

/* n experts on one token: gate and up of all in one job, their SwiGLU, then
 * the down projections in one job; each product as swiglu computes it with
 * m = 1 (the same kernels, the same quantized input). */
static void moe_experts1(void *p, int l, const uint8_t *const *rec, int n, const float *in, float *const *out) {
    moe_ctx *c = p;
    ferry_session *s = c->s;
    const chunk_bufs *b = c->b;
    fe_ops ops = ops_of(s, b);
    fe_moe_gated1(&ops, &s->e->c.banks[l], rec, n, in, b->h1, b->h2, silu_mul_act, s, out);
}

/* The MoE layer for rows [first, n) of the chunk. */
static ferry_status moe(ferry_session *s, const chunk_bufs *b, int l, int n, int first, ferry_error *err) {
    moe_ctx c = {s, b};
    fe_moe_arch a = {.ctx = &c, .kind = FE_ROUTE_SOFTMAX, .ed = s->e->c.hp.dim,
                     .ops = {s->pool, b->rows, fe_rows_stride(max_cols(&s->e->c.hp)), s->e->kernels, s->prof_cur, fe_session_q8(s)},
                     .layers = MODEL(s->e)->layers, .layer_size = sizeof(fe_layer),
                     .router_at = offsetof(fe_layer, router), .norm_at = offsetof(fe_layer, ffn_norm),
                     .expert = moe_expert, .experts1 = moe_experts1};
    /* the weighted expert outputs are added straight into the residual stream */
    const size_t o = (size_t)first * (size_t)s->e->c.hp.dim;
    return fe_moe_layer(s, &a, &b->moe, l, n - first, b->xb + o, b->xb + o, b->x + o, b->x + o, err);
}

/* The feed-forward block of layer l for rows [first, n) of the chunk. */
static ferry_status ffn(ferry_session *s, const chunk_bufs *b, int l, int n, int first, ferry_error *err) {
    const fe_hparams *hp = &s->e->c.hp;
    const fe_layer *L = &MODEL(s->e)->layers[l];
    const int d = hp->dim;
    if (first >= n) return FERRY_OK;
    double t0 = prof_t0(s);
    for (int t = first; t < n; t++) fe_rmsnorm(b->xb + (size_t)t * d, b->x + (size_t)t * d, L->ffn_norm, d, hp->norm_eps);
    PROF_ADD(s, norm_seconds, t0);
    if (hp->layer_is_moe[l]) return moe(s, b, l, n, first, err); /* profiled in moe.c */
    const size_t o = (size_t)first * (size_t)d;
    swiglu(s, b, &L->w_gate, &L->w_up, &L->w_down, b->xb + o, n - first, b->y + o);
    t0 = prof_t0(s);
    for (size_t i = o; i < (size_t)n * d; i++) b->x[i] += b->y[i];
    PROF_ADD(s, elementwise_seconds, t0);
    return FERRY_OK;
}

/* ------------------------------------------------------------ whole pass */

static ferry_status llama_forward(ferry_session *s, const int32_t *tokens, int n, float *logits, int all_logits,
                              ferry_error *err) {
    ferry_engine *e = s->e;
    const llama_model *m = MODEL(e);
    const fe_hparams *hp = &e->c.hp;
    const int d = hp->dim;
    chunk_bufs b;
    carve(hp, s->e->chunk, s->n_ctx, fe_pool_threads(s->pool), s->scratch, &b);
    double t0 = prof_t0(s);
    ferry_status es = fe_embed(e, &m->tok_embd, tokens, n, b.x, b.xb, err);
    if (es) return es;
    fe_embed_override(s, n, b.x);
    PROF_ADD(s, elementwise_seconds, t0);
    fe_stage(s, 0, n, b.x);
    /* The last layer's output is read only by the logits (and an observer):
     * rows after its K and V are stored are computed for the tokens whose
     * logits are asked for only (the last one, or none in a prompt's earlier
     * chunks), as each row's result is the same whatever rows share the
     * chunk (kernels.h). */
    const int keep = s->stage_fn || (logits && all_logits) ? n : (logits ? 1 : 0);
    for (int l = 0; l < hp->n_layers; l++) {
        if (atomic_exchange(&s->cancel, 0))
            return fe_fail(err, FERRY_E_CANCELLED, "cancelled at layer %d", l);
        const int first = l == hp->n_layers - 1 ? n - keep : 0;
        attention(s, &b, l, n, first);
        ferry_status st = ffn(s, &b, l, n, first, err);
        if (st) return st;
        fe_stage(s, l + 1, n, b.x);
    }
    t0 = prof_t0(s);
    for (int t = n - keep; t < n; t++)
        fe_rmsnorm(b.xb + (size_t)t * d, b.x + (size_t)t * d, m->output_norm, d, hp->norm_eps);
    PROF_ADD(s, norm_seconds, t0);
    fe_stage(s, hp->n_layers + 1, n, b.xb);
    if (logits) {
        if (all_logits) matmul(s, &b, &m->output, b.xb, n, logits);
        else matmul(s, &b, &m->output, b.xb + (size_t)(n - 1) * d, 1, logits);
    }
    return FERRY_OK;
}

/* The blob is K then V, each layer's first `pos` rows in turn, each row all
 * the KV heads of one position (the order the caches had in memory before
 * they went head-major; saved states of either version load in both). */
static uint64_t llama_blob_size(const ferry_session *s, int pos) {
    const fe_hparams *hp = &s->e->c.hp;
    return 2ull * (uint64_t)hp->n_layers * (uint64_t)pos * (uint64_t)hp->n_kv_heads * (uint64_t)hp->head_dim *
           sizeof(float);
}

static void llama_blob_copy(ferry_session *s, int pos, uint8_t *blob, int to_blob) {
    const fe_hparams *hp = &s->e->c.hp;
    const size_t row = (size_t)hp->head_dim * sizeof(float);
    for (int c = 0; c < 2; c++)
        for (int l = 0; l < hp->n_layers; l++)
            for (int p = 0; p < pos; p++)
                for (int h = 0; h < hp->n_kv_heads; h++, blob += row) {
                    if (c == 0) {
                        k_pos(s, l, h, p, blob, !to_blob);
                        continue;
                    }
                    float *at = v_row(s, l, h, p);
                    if (to_blob) memcpy(blob, at, row);
                    else memcpy(at, blob, row);
                }
}

const fe_arch fe_arch_llama = {"llama", llama_bind, llama_unbind, llama_sizes, llama_forward,
                               llama_blob_size, llama_blob_copy};
