/* model.c — tensor binding and the forward pass of the "llama" family
 * (Llama, Qwen2, Qwen3-MoE, Mixtral, OLMoE): RMSNorm, RoPE, grouped-query
 * attention with a KV cache, SwiGLU feed-forward or a softmax-routed mixture
 * of experts whose weights are read from the expert banks. */
#define _POSIX_C_SOURCE 200809L
#include "model.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "formats.h"

/* ---------------------------------------------------------------- binding */

static ferry_status find_mat(ferry_engine *e, const char *name, int rows, int cols, fe_mat *m,
                             ferry_error *err) {
    const fe_tensor *t = fe_container_find(&e->c, name);
    if (!t) return fe_fail(err, FERRY_E_FORMAT, "manifest.json: tensor %s is missing", name);
    if (t->n_dims != 2 || t->shape[0] != (uint64_t)rows || t->shape[1] != (uint64_t)cols)
        return fe_fail(err, FERRY_E_FORMAT, "manifest.json: tensor %s should be [%d, %d]", name, rows, cols);
    m->data = t->data;
    m->fmt = t->fmt;
    m->rows = rows;
    m->cols = cols;
    m->row_bytes = fe_row_bytes(t->fmt, (uint64_t)cols);
    return FERRY_OK;
}

static ferry_status find_vec(ferry_engine *e, const char *name, int n, int optional, const float **v,
                             ferry_error *err) {
    const fe_tensor *t = fe_container_find(&e->c, name);
    *v = NULL;
    if (!t) return optional ? FERRY_OK : fe_fail(err, FERRY_E_FORMAT, "manifest.json: tensor %s is missing", name);
    if (t->n_dims != 1 || t->shape[0] != (uint64_t)n || t->fmt != FE_F32)
        return fe_fail(err, FERRY_E_FORMAT, "manifest.json: tensor %s should be f32 [%d]", name, n);
    *v = (const float *)t->data;
    return FERRY_OK;
}

static ferry_status bind_layer(ferry_engine *e, int l, ferry_error *err) {
    const fe_hparams *hp = &e->c.hp;
    fe_layer *L = &e->layers[l];
    int qd = hp->n_heads * hp->head_dim, kvd = hp->n_kv_heads * hp->head_dim, d = hp->dim;
    char n[FE_MAX_NAME];
    ferry_status s;
#define NAME(suffix) (snprintf(n, sizeof n, "blk.%d.%s", l, suffix), n)
    if ((s = find_vec(e, NAME("attn_norm"), d, 0, &L->attn_norm, err))) return s;
    if ((s = find_mat(e, NAME("attn_q"), qd, d, &L->wq, err))) return s;
    if ((s = find_mat(e, NAME("attn_k"), kvd, d, &L->wk, err))) return s;
    if ((s = find_mat(e, NAME("attn_v"), kvd, d, &L->wv, err))) return s;
    if ((s = find_mat(e, NAME("attn_output"), d, qd, &L->wo, err))) return s;
    if ((s = find_vec(e, NAME("attn_q_bias"), qd, !hp->qkv_bias, &L->bq, err))) return s;
    if ((s = find_vec(e, NAME("attn_k_bias"), kvd, !hp->qkv_bias, &L->bk, err))) return s;
    if ((s = find_vec(e, NAME("attn_v_bias"), kvd, !hp->qkv_bias, &L->bv, err))) return s;
    if ((s = find_vec(e, NAME("attn_output_bias"), d, !hp->o_bias, &L->bo, err))) return s;
    if (hp->qk_norm) {
        int qn = hp->qk_norm == 1 ? hp->head_dim : qd, kn = hp->qk_norm == 1 ? hp->head_dim : kvd;
        if ((s = find_vec(e, NAME("attn_q_norm"), qn, 0, &L->q_norm, err))) return s;
        if ((s = find_vec(e, NAME("attn_k_norm"), kn, 0, &L->k_norm, err))) return s;
    }
    if ((s = find_vec(e, NAME("ffn_norm"), d, 0, &L->ffn_norm, err))) return s;
    if (hp->layer_is_moe[l]) {
        if ((s = find_mat(e, NAME("ffn_gate_inp"), hp->n_experts, d, &L->router, err))) return s;
    } else {
        if ((s = find_mat(e, NAME("ffn_gate"), hp->ffn_dim, d, &L->w_gate, err))) return s;
        if ((s = find_mat(e, NAME("ffn_up"), hp->ffn_dim, d, &L->w_up, err))) return s;
        if ((s = find_mat(e, NAME("ffn_down"), d, hp->ffn_dim, &L->w_down, err))) return s;
    }
#undef NAME
    return FERRY_OK;
}

ferry_status fe_engine_bind(ferry_engine *e, ferry_error *err) {
    const fe_hparams *hp = &e->c.hp;
    ferry_status s;
    if ((s = find_mat(e, "token_embd", hp->vocab, hp->dim, &e->tok_embd, err))) return s;
    if ((s = find_vec(e, "output_norm", hp->dim, 0, &e->output_norm, err))) return s;
    if (hp->tied_embeddings) e->output = e->tok_embd;
    else if ((s = find_mat(e, "output", hp->vocab, hp->dim, &e->output, err))) return s;
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
    float *router;   /* [C][n_experts] router probabilities */
    int *sel;        /* [C][top_k] chosen experts */
    float *sel_w;    /* [C][top_k] their weights */
    float *slots;    /* [C][top_k][dim] each chosen expert's output */
    float *ex_in;    /* [C][dim] rows routed to one expert */
    int *ex_tok;     /* [C] which token each row is, and */
    int *ex_rank;    /* [C] at which rank it chose the expert */
    float *rows;     /* [threads][max cols] dequantized weight rows */
    float *scores;   /* [threads][n_ctx] attention scores */
} chunk_bufs;

static int max_cols(const fe_hparams *hp) {
    int m = hp->dim;
    if (hp->n_heads * hp->head_dim > m) m = hp->n_heads * hp->head_dim;
    if (hp->ffn_dim > m) m = hp->ffn_dim;
    if (hp->expert_ffn_dim > m) m = hp->expert_ffn_dim;
    return m;
}

/* Lay out (or just measure, when base is NULL) the chunk buffers. */
static uint64_t carve(const fe_hparams *hp, int n_ctx, int n_threads, uint8_t *base, chunk_bufs *b) {
    uint64_t off = 0;
    const uint64_t C = FE_CHUNK, dim = (uint64_t)hp->dim;
    const uint64_t qd = (uint64_t)hp->n_heads * hp->head_dim, kvd = (uint64_t)hp->n_kv_heads * hp->head_dim;
    uint64_t ffn = (uint64_t)(hp->ffn_dim > hp->expert_ffn_dim ? hp->ffn_dim : hp->expert_ffn_dim);
    uint64_t E = (uint64_t)hp->n_experts, K = (uint64_t)hp->top_k;
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
    TAKE(router, float, C * E);
    TAKE(sel, int, C * K);
    TAKE(sel_w, float, C * K);
    TAKE(slots, float, C * K * dim);
    TAKE(ex_in, float, C * dim);
    TAKE(ex_tok, int, C);
    TAKE(ex_rank, int, C);
    TAKE(rows, float, (uint64_t)n_threads * (uint64_t)max_cols(hp));
    TAKE(scores, float, (uint64_t)n_threads * (uint64_t)n_ctx);
#undef TAKE
    return off;
}

void fe_session_sizes_compute(const fe_container *c, int n_ctx, int n_threads, fe_session_sizes *s) {
    const fe_hparams *hp = &c->hp;
    s->kv = (uint64_t)hp->n_layers * (uint64_t)n_ctx * (uint64_t)hp->n_kv_heads * (uint64_t)hp->head_dim;
    s->scratch = carve(hp, n_ctx, n_threads, NULL, NULL);
    s->expert = 0;
    for (int l = 0; l < hp->n_layers; l++)
        if (c->banks[l].record_size > s->expert) s->expert = c->banks[l].record_size;
}

/* ------------------------------------------------------------- primitives */

static void rmsnorm(float *out, const float *x, const float *w, int n, float eps) {
    double ss = 0.0;
    for (int i = 0; i < n; i++) ss += (double)x[i] * x[i];
    float scale = (float)(1.0 / sqrt(ss / n + eps));
    for (int i = 0; i < n; i++) out[i] = w[i] * (x[i] * scale);
}

static float silu(float x) { return x / (1.0f + expf(-x)); }

static void softmax(float *x, int n) {
    float m = x[0];
    for (int i = 1; i < n; i++) m = x[i] > m ? x[i] : m;
    double sum = 0.0;
    for (int i = 0; i < n; i++) { x[i] = expf(x[i] - m); sum += x[i]; }
    float inv = (float)(1.0 / sum);
    for (int i = 0; i < n; i++) x[i] *= inv;
}

/* Rotate one head's leading rope_dim values for position pos. */
static void rope(float *v, int pos, const fe_hparams *hp) {
    int half = hp->rope_dim / 2;
    for (int i = 0; i < half; i++) {
        float inv_freq = 1.0f / powf(hp->rope_theta, (float)(2 * i) / (float)hp->rope_dim);
        float angle = (float)pos * inv_freq;
        float c = cosf(angle), s = sinf(angle);
        int a = hp->rope_interleaved ? 2 * i : i, b = hp->rope_interleaved ? 2 * i + 1 : i + half;
        float x0 = v[a], x1 = v[b];
        v[a] = x0 * c - x1 * s;
        v[b] = x0 * s + x1 * c;
    }
}

/* y[t][r] = W[r] · x[t] for t < n, split over rows across the pool. */
typedef struct {
    const fe_mat *w;    /* the matrix */
    const float *x;     /* [n][cols] */
    float *y;           /* [n][rows] */
    int n;              /* tokens */
    float *rows;        /* per-thread row buffers */
    int rows_stride;    /* floats per thread buffer */
} matmul_job;

static void matmul_rows(void *p, int start, int end, int tid) {
    matmul_job *j = p;
    const fe_mat *w = j->w;
    float *buf = j->rows + (size_t)tid * (size_t)j->rows_stride;
    for (int r = start; r < end; r++) {
        const uint8_t *row = w->data + (uint64_t)r * w->row_bytes;
        const float *wr = (const float *)row;
        if (w->fmt != FE_F32) {
            fe_dequant_row(w->fmt, row, buf, w->cols);
            wr = buf;
        }
        for (int t = 0; t < j->n; t++) j->y[(size_t)t * w->rows + r] = fe_dot_f32(wr, j->x + (size_t)t * w->cols, w->cols);
    }
}

static void matmul(ferry_session *s, const chunk_bufs *b, const fe_mat *w, const float *x, int n, float *y) {
    matmul_job j = {w, x, y, n, b->rows, max_cols(&s->e->c.hp)};
    fe_pool_run(s->pool, matmul_rows, &j, w->rows);
}

/* ------------------------------------------------------------- attention */

typedef struct {
    ferry_session *s;
    const chunk_bufs *b;
    int layer, n;       /* layer and tokens in the chunk */
} attn_job;

/* One (token, head) pair per item: causal softmax attention over the cache. */
static void attn_items(void *p, int start, int end, int tid) {
    attn_job *j = p;
    ferry_session *s = j->s;
    const fe_hparams *hp = &s->e->c.hp;
    const int hd = hp->head_dim, kvd = hp->n_kv_heads * hd, qd = hp->n_heads * hd;
    const int group = hp->n_heads / hp->n_kv_heads;
    const float scale = 1.0f / sqrtf((float)hd);
    float *scores = j->b->scores + (size_t)tid * (size_t)s->n_ctx;
    const float *kc = s->k_cache + (size_t)j->layer * s->n_ctx * kvd;
    const float *vc = s->v_cache + (size_t)j->layer * s->n_ctx * kvd;
    for (int it = start; it < end; it++) {
        int t = it / hp->n_heads, h = it % hp->n_heads, kvh = h / group;
        int upto = s->pos + t; /* inclusive */
        const float *q = j->b->q + (size_t)t * qd + (size_t)h * hd;
        for (int i = 0; i <= upto; i++) scores[i] = fe_dot_f32(q, kc + (size_t)i * kvd + (size_t)kvh * hd, hd) * scale;
        softmax(scores, upto + 1);
        float *out = j->b->att + (size_t)t * qd + (size_t)h * hd;
        memset(out, 0, (size_t)hd * sizeof *out);
        for (int i = 0; i <= upto; i++) {
            const float *v = vc + (size_t)i * kvd + (size_t)kvh * hd;
            float w = scores[i];
            for (int d = 0; d < hd; d++) out[d] += w * v[d];
        }
    }
}

static void attention(ferry_session *s, const chunk_bufs *b, int l, int n) {
    const fe_hparams *hp = &s->e->c.hp;
    const fe_layer *L = &s->e->layers[l];
    const int hd = hp->head_dim, qd = hp->n_heads * hd, kvd = hp->n_kv_heads * hd, d = hp->dim;
    for (int t = 0; t < n; t++) rmsnorm(b->xb + (size_t)t * d, b->x + (size_t)t * d, L->attn_norm, d, hp->norm_eps);
    matmul(s, b, &L->wq, b->xb, n, b->q);
    matmul(s, b, &L->wk, b->xb, n, b->k);
    matmul(s, b, &L->wv, b->xb, n, b->v);
    for (int t = 0; t < n; t++) {
        float *q = b->q + (size_t)t * qd, *k = b->k + (size_t)t * kvd, *v = b->v + (size_t)t * kvd;
        if (L->bq)
            for (int i = 0; i < qd; i++) q[i] += L->bq[i];
        if (L->bk)
            for (int i = 0; i < kvd; i++) k[i] += L->bk[i];
        if (L->bv)
            for (int i = 0; i < kvd; i++) v[i] += L->bv[i];
        if (hp->qk_norm == 2) {
            rmsnorm(q, q, L->q_norm, qd, hp->norm_eps);
            rmsnorm(k, k, L->k_norm, kvd, hp->norm_eps);
        }
        for (int h = 0; h < hp->n_heads; h++) {
            if (hp->qk_norm == 1) rmsnorm(q + h * hd, q + h * hd, L->q_norm, hd, hp->norm_eps);
            rope(q + h * hd, s->pos + t, hp);
        }
        for (int h = 0; h < hp->n_kv_heads; h++) {
            if (hp->qk_norm == 1) rmsnorm(k + h * hd, k + h * hd, L->k_norm, hd, hp->norm_eps);
            rope(k + h * hd, s->pos + t, hp);
        }
        size_t at = ((size_t)l * s->n_ctx + (size_t)(s->pos + t)) * kvd;
        memcpy(s->k_cache + at, k, (size_t)kvd * sizeof *k);
        memcpy(s->v_cache + at, v, (size_t)kvd * sizeof *v);
    }
    attn_job j = {s, b, l, n};
    fe_pool_run(s->pool, attn_items, &j, n * hp->n_heads);
    matmul(s, b, &L->wo, b->att, n, b->y);
    for (int t = 0; t < n; t++)
        for (int i = 0; i < d; i++) b->x[(size_t)t * d + i] += b->y[(size_t)t * d + i] + (L->bo ? L->bo[i] : 0.0f);
}

/* ---------------------------------------------------------- feed-forward */

/* out = down(silu(gate x) * up x) for n rows of x. */
static void swiglu(ferry_session *s, const chunk_bufs *b, const fe_mat *g, const fe_mat *u, const fe_mat *dn,
                   const float *x, int n, float *out) {
    matmul(s, b, g, x, n, b->h1);
    matmul(s, b, u, x, n, b->h2);
    size_t m = (size_t)n * g->rows;
    for (size_t i = 0; i < m; i++) b->h1[i] = silu(b->h1[i]) * b->h2[i];
    matmul(s, b, dn, b->h1, n, out);
}

/* Top-k of one token's router probabilities, highest first, ties to the lower id. */
static void top_k(const float *p, int n, int k, int *ids, float *w, int renorm) {
    for (int r = 0; r < k; r++) {
        int best = -1;
        for (int e = 0; e < n; e++) {
            int taken = 0;
            for (int q = 0; q < r; q++) taken |= ids[q] == e;
            if (!taken && (best < 0 || p[e] > p[best])) best = e;
        }
        ids[r] = best;
        w[r] = p[best];
    }
    if (renorm) {
        float sum = 0.0f;
        for (int r = 0; r < k; r++) sum += w[r];
        for (int r = 0; r < k; r++) w[r] /= sum;
    }
}

static fe_mat expert_mat(const fe_bank *bk, int part, const uint8_t *rec) {
    const fe_expert_part *p = &bk->part[part];
    fe_mat m = {rec + p->offset, p->fmt, (int)p->rows, (int)p->cols, fe_row_bytes(p->fmt, p->cols)};
    return m;
}

static ferry_status read_expert(ferry_session *s, const fe_bank *bk, int e, ferry_error *err) {
    double t0 = fe_now();
    uint64_t at = FE_BANK_HEADER_BYTES + (uint64_t)e * bk->record_size;
    ferry_status st = fe_pread_full(bk->fd, s->expert_buf, bk->record_size, at, bk->rel, err);
    s->stats.read_seconds += fe_now() - t0;
    if (st) return st;
    s->stats.expert_reads++;
    s->stats.misses++;
    s->stats.bytes_read += bk->record_size;
    return fe_bank_check_record(bk, (uint32_t)e, s->expert_buf, s->e->opts.verify_reads, err);
}

static ferry_status moe(ferry_session *s, const chunk_bufs *b, int l, int n, ferry_error *err) {
    const fe_hparams *hp = &s->e->c.hp;
    const fe_layer *L = &s->e->layers[l];
    const fe_bank *bk = &s->e->c.banks[l];
    const int d = hp->dim, E = hp->n_experts, K = hp->top_k;
    matmul(s, b, &L->router, b->xb, n, b->router);
    for (int t = 0; t < n; t++) {
        softmax(b->router + (size_t)t * E, E);
        top_k(b->router + (size_t)t * E, E, K, b->sel + t * K, b->sel_w + t * K, hp->norm_topk_prob);
    }
    /* Each distinct expert of the chunk is read once and run on all its rows. */
    for (int e = 0; e < E; e++) {
        int m = 0;
        for (int t = 0; t < n; t++)
            for (int r = 0; r < K; r++)
                if (b->sel[t * K + r] == e) {
                    memcpy(b->ex_in + (size_t)m * d, b->xb + (size_t)t * d, (size_t)d * sizeof(float));
                    b->ex_tok[m] = t;
                    b->ex_rank[m] = r;
                    m++;
                }
        if (m == 0) continue;
        ferry_status st = read_expert(s, bk, e, err);
        if (st) return st;
        fe_mat g = expert_mat(bk, 0, s->expert_buf), u = expert_mat(bk, 1, s->expert_buf),
               dn = expert_mat(bk, 2, s->expert_buf);
        swiglu(s, b, &g, &u, &dn, b->ex_in, m, b->y);
        for (int i = 0; i < m; i++)
            memcpy(b->slots + ((size_t)b->ex_tok[i] * K + (size_t)b->ex_rank[i]) * d, b->y + (size_t)i * d,
                   (size_t)d * sizeof(float));
    }
    /* Sum in rank order so a token's result does not depend on its chunk. */
    for (int t = 0; t < n; t++)
        for (int r = 0; r < K; r++) {
            const float *y = b->slots + ((size_t)t * K + r) * d;
            float w = b->sel_w[t * K + r];
            for (int i = 0; i < d; i++) b->x[(size_t)t * d + i] += w * y[i];
        }
    return FERRY_OK;
}

static ferry_status ffn(ferry_session *s, const chunk_bufs *b, int l, int n, ferry_error *err) {
    const fe_hparams *hp = &s->e->c.hp;
    const fe_layer *L = &s->e->layers[l];
    const int d = hp->dim;
    for (int t = 0; t < n; t++) rmsnorm(b->xb + (size_t)t * d, b->x + (size_t)t * d, L->ffn_norm, d, hp->norm_eps);
    if (hp->layer_is_moe[l]) return moe(s, b, l, n, err);
    swiglu(s, b, &L->w_gate, &L->w_up, &L->w_down, b->xb, n, b->y);
    for (size_t i = 0; i < (size_t)n * d; i++) b->x[i] += b->y[i];
    return FERRY_OK;
}

/* ------------------------------------------------------------ whole pass */

static void stage(ferry_session *s, int i, int n, const float *h) {
    if (s->stage_fn) s->stage_fn(s->stage_user, i, s->pos, n, s->e->c.hp.dim, h);
}

ferry_status fe_forward_chunk(ferry_session *s, const int32_t *tokens, int n, float *logits, int all_logits,
                              ferry_error *err) {
    ferry_engine *e = s->e;
    const fe_hparams *hp = &e->c.hp;
    const int d = hp->dim;
    chunk_bufs b;
    carve(hp, s->n_ctx, fe_pool_threads(s->pool), s->scratch, &b);
    for (int t = 0; t < n; t++)
        fe_dequant_row(e->tok_embd.fmt, e->tok_embd.data + (uint64_t)tokens[t] * e->tok_embd.row_bytes,
                       b.x + (size_t)t * d, d);
    stage(s, 0, n, b.x);
    for (int l = 0; l < hp->n_layers; l++) {
        if (atomic_exchange(&s->cancel, 0))
            return fe_fail(err, FERRY_E_CANCELLED, "cancelled at layer %d", l);
        attention(s, &b, l, n);
        ferry_status st = ffn(s, &b, l, n, err);
        if (st) return st;
        stage(s, l + 1, n, b.x);
    }
    for (int t = 0; t < n; t++) rmsnorm(b.xb + (size_t)t * d, b.x + (size_t)t * d, e->output_norm, d, hp->norm_eps);
    stage(s, hp->n_layers + 1, n, b.xb);
    if (logits) {
        if (all_logits) matmul(s, &b, &e->output, b.xb, n, logits);
        else matmul(s, &b, &e->output, b.xb + (size_t)(n - 1) * d, 1, logits);
    }
    return FERRY_OK;
}
