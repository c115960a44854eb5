/* arch_kimi.c — the "kimi" family: DeepSeek-V3 / Kimi-K2, Kimi-Linear and
 * Kimi K3 (docs/KIMI.md). One forward pass with per-model switches:
 *
 *   attention  MLA (multi-head latent attention) in the absorbed form, the
 *              cache holding only the normed latent c and the shared key
 *              slice k_r per token; RoPE (+YaRN) or NoPE; optional q low
 *              rank and sigmoid output gate. Or KDA (Kimi Delta Attention):
 *              short causal convolutions, a per-channel-decayed delta rule
 *              on a [key, value] f32 state per head, gated output norm.
 *   FFN        dense MLP, or DeepSeek routing (sigmoid + correction bias,
 *              group-limited top-k, renormalised unbiased weights times a
 *              scale) over streamed experts, optionally on a latent width
 *              (down-projection, norm, up-projection), plus shared experts.
 *              Activation SiLU or SiTU.
 *   residual   plain, or Attention Residuals (block sums mixed per layer).
 *
 * Expert records come only through experts.h. All caches and recurrent
 * state live in the session's state buffer, sized by kimi_sizes. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "experts.h"
#include "formats.h"
#include "kernels.h"
#include "kimi_manifest.h"
#include "model.h"
#include "moe.h"

typedef struct kimi_layer {
    const float *attn_norm, *ffn_norm;          /* [dim] */
    /* MLA */
    fe_mat q, q_a, q_b, kv_a, kv_b, o, g;       /* g: output gate (optional) */
    const float *q_a_norm, *kv_a_norm;          /* [q_lora], [kv_lora] */
    /* KDA */
    fe_mat kq, kk, kv, f_a, f_b, b, g_full, g_a, g_b, ko;
    const float *conv[3];                       /* [HD][kernel] f32 each */
    const float *dt_bias, *a_log, *o_norm;      /* [HD], [a_log_len], [head_dim] */
    /* Attention Residuals: score weights = norm (.) proj */
    const float *res_attn_norm, *res_attn_proj, *res_mlp_norm, *res_mlp_proj;
    /* feed-forward */
    fe_mat w_gate, w_up, w_down;                /* dense */
    fe_mat router;                              /* [E, dim] */
    const float *router_bias;                   /* [E] */
    fe_mat sh_gate, sh_up, sh_down;             /* shared experts (fused) */
    fe_mat lat_down, lat_up;                    /* [latent, dim], [dim, latent] */
    const float *lat_norm;                      /* [latent] */
    int cache_index;                            /* index among MLA / among KDA layers */
} kimi_layer;

typedef struct kimi_model {
    kimi_layer *layers;
    fe_mat tok_embd, output;
    const float *output_norm;
    const float *res_out_norm, *res_out_proj;   /* AttnRes output aggregation */
} kimi_model;

#define MODEL(e) ((kimi_model *)(e)->arch_data)
#define KH(hp) ((const fe_kimi_hparams *)(hp)->kimi)

/* ------------------------------------------------------------- dimensions */

typedef struct kdims {
    int dim, ed, H, qk, nope, rope, vd, kvl, qlr, kvw; /* MLA: kvw = kvl + rope */
    int KH_, hd, HD, K;                               /* KDA */
    int ffn, eff, shf, E, topk, NB;
} kdims;

static kdims dims_of(const fe_hparams *hp) {
    const fe_kimi_hparams *k = KH(hp);
    kdims d;
    memset(&d, 0, sizeof d);
    d.dim = hp->dim;
    d.ed = hp->expert_dim ? hp->expert_dim : hp->dim;
    if (k->n_mla) {
        d.H = k->mla_heads;
        d.nope = k->qk_nope_dim;
        d.rope = k->qk_rope_dim;
        d.qk = d.nope + d.rope;
        d.vd = k->v_dim;
        d.kvl = k->kv_lora_rank;
        d.qlr = k->q_lora_rank;
        d.kvw = d.kvl + d.rope;
    }
    if (k->n_kda) {
        d.KH_ = k->kda_heads;
        d.hd = k->kda_head_dim;
        d.HD = d.KH_ * d.hd;
        d.K = k->conv_kernel;
    }
    d.ffn = hp->ffn_dim;
    d.eff = hp->expert_ffn_dim;
    d.shf = k->shared_ffn_dim;
    d.E = hp->n_experts;
    d.topk = hp->top_k;
    d.NB = k->n_res_blocks;
    return d;
}

static int imax(int a, int b) { return a > b ? a : b; }

static int max_cols(const kdims *d) {
    int m = d->dim;
    m = imax(m, d->qlr);
    m = imax(m, d->kvl);
    m = imax(m, d->H * d->vd);
    m = imax(m, d->HD);
    m = imax(m, d->hd);
    m = imax(m, d->ffn);
    m = imax(m, d->eff);
    m = imax(m, d->shf);
    m = imax(m, d->ed);
    return m;
}

/* ---------------------------------------------------------------- binding */

static ferry_status bind_f32_mat(const fe_container *c, const char *name, int rows, int cols, const float **out,
                                 ferry_error *err) {
    fe_mat m;
    ferry_status s = fe_bind_mat(c, name, rows, cols, &m, err);
    if (s) return s;
    if (m.fmt != FE_F32) return fe_fail(err, FERRY_E_FORMAT, "manifest.json: tensor %s should be f32", name);
    *out = (const float *)m.data;
    return FERRY_OK;
}

static ferry_status bind_layer(ferry_engine *e, int l, int cache_index, ferry_error *err) {
    const fe_hparams *hp = &e->c.hp;
    const fe_kimi_hparams *k = KH(hp);
    kimi_layer *L = &MODEL(e)->layers[l];
    kdims d = dims_of(hp);
    char n[FE_MAX_NAME];
    ferry_status s;
    L->cache_index = cache_index;
#define NAME(suffix) (snprintf(n, sizeof n, "blk.%d.%s", l, suffix), n)
#define MAT(suffix, nr, nc, dst) if ((s = fe_bind_mat(&e->c, NAME(suffix), (nr), (nc), (dst), err))) return s
#define VEC(suffix, len, dst) if ((s = fe_bind_vec(&e->c, NAME(suffix), (len), 0, (dst), err))) return s
    VEC("attn_norm", d.dim, &L->attn_norm);
    VEC("ffn_norm", d.dim, &L->ffn_norm);
    if (!k->layer_kda[l]) {
        if (d.qlr) {
            MAT("attn_q_a", d.qlr, d.dim, &L->q_a);
            VEC("attn_q_a_norm", d.qlr, &L->q_a_norm);
            MAT("attn_q_b", d.H * d.qk, d.qlr, &L->q_b);
        } else {
            MAT("attn_q", d.H * d.qk, d.dim, &L->q);
        }
        MAT("attn_kv_a_mqa", d.kvw, d.dim, &L->kv_a);
        VEC("attn_kv_a_norm", d.kvl, &L->kv_a_norm);
        MAT("attn_kv_b", d.H * (d.nope + d.vd), d.kvl, &L->kv_b);
        MAT("attn_output", d.dim, d.H * d.vd, &L->o);
        if (k->mla_out_gate) MAT("attn_gate", d.H * d.vd, d.dim, &L->g);
    } else {
        MAT("kda_q", d.HD, d.dim, &L->kq);
        MAT("kda_k", d.HD, d.dim, &L->kk);
        MAT("kda_v", d.HD, d.dim, &L->kv);
        static const char *convs[3] = {"kda_q_conv", "kda_k_conv", "kda_v_conv"};
        for (int i = 0; i < 3; i++)
            if ((s = bind_f32_mat(&e->c, NAME(convs[i]), d.HD, d.K, &L->conv[i], err))) return s;
        MAT("kda_f_a", d.hd, d.dim, &L->f_a);
        MAT("kda_f_b", d.HD, d.hd, &L->f_b);
        VEC("kda_dt_bias", d.HD, &L->dt_bias);
        VEC("kda_a_log", k->a_log_len, &L->a_log);
        MAT("kda_beta", d.KH_, d.dim, &L->b);
        if (k->kda_full_gate) {
            MAT("kda_g", d.HD, d.dim, &L->g_full);
        } else {
            MAT("kda_g_a", d.hd, d.dim, &L->g_a);
            MAT("kda_g_b", d.HD, d.hd, &L->g_b);
        }
        VEC("kda_o_norm", d.hd, &L->o_norm);
        MAT("kda_output", d.dim, d.HD, &L->ko);
    }
    if (k->attn_res_block) {
        VEC("attnres_attn_norm", d.dim, &L->res_attn_norm);
        VEC("attnres_attn_proj", d.dim, &L->res_attn_proj);
        VEC("attnres_mlp_norm", d.dim, &L->res_mlp_norm);
        VEC("attnres_mlp_proj", d.dim, &L->res_mlp_proj);
    }
    if (hp->layer_is_moe[l]) {
        MAT("ffn_router", d.E, d.dim, &L->router);
        VEC("ffn_router_bias", d.E, &L->router_bias);
        if (d.shf) {
            MAT("ffn_gate_shexp", d.shf, d.dim, &L->sh_gate);
            MAT("ffn_up_shexp", d.shf, d.dim, &L->sh_up);
            MAT("ffn_down_shexp", d.dim, d.shf, &L->sh_down);
        }
        if (k->latent_dim) {
            MAT("ffn_latent_down", d.ed, d.dim, &L->lat_down);
            MAT("ffn_latent_up", d.dim, d.ed, &L->lat_up);
            VEC("ffn_latent_norm", d.ed, &L->lat_norm);
        }
    } else {
        MAT("ffn_gate", d.ffn, d.dim, &L->w_gate);
        MAT("ffn_up", d.ffn, d.dim, &L->w_up);
        MAT("ffn_down", d.dim, d.ffn, &L->w_down);
    }
#undef MAT
#undef VEC
#undef NAME
    return FERRY_OK;
}

static void kimi_unbind(ferry_engine *e) {
    kimi_model *m = MODEL(e);
    if (m) free(m->layers);
    free(m);
    e->arch_data = NULL;
}

static ferry_status kimi_bind(ferry_engine *e, ferry_error *err) {
    const fe_hparams *hp = &e->c.hp;
    if (!hp->kimi) return fe_fail(err, FERRY_E_FORMAT, "manifest.json: model.kimi is missing");
    const fe_kimi_hparams *k = KH(hp);
    kimi_model *m = calloc(1, sizeof *m);
    if (m) m->layers = calloc((size_t)hp->n_layers, sizeof *m->layers);
    e->arch_data = m;
    if (!m || !m->layers) return fe_fail(err, FERRY_E_NOMEM, "out of memory");
    ferry_status s;
    if ((s = fe_bind_mat(&e->c, "token_embd", hp->vocab, hp->dim, &m->tok_embd, err))) return s;
    if ((s = fe_bind_vec(&e->c, "output_norm", hp->dim, 0, &m->output_norm, err))) return s;
    if (hp->tied_embeddings) m->output = m->tok_embd;
    else if ((s = fe_bind_mat(&e->c, "output", hp->vocab, hp->dim, &m->output, err))) return s;
    if (k->attn_res_block) {
        char nm[FE_MAX_NAME];
        snprintf(nm, sizeof nm, "blk.%d.attnres_out_norm", hp->n_layers - 1);
        if ((s = fe_bind_vec(&e->c, nm, hp->dim, 0, &m->res_out_norm, err))) return s;
        snprintf(nm, sizeof nm, "blk.%d.attnres_out_proj", hp->n_layers - 1);
        if ((s = fe_bind_vec(&e->c, nm, hp->dim, 0, &m->res_out_proj, err))) return s;
    }
    int n_mla = 0, n_kda = 0;
    for (int l = 0; l < hp->n_layers; l++) {
        int idx = k->layer_kda[l] ? n_kda++ : n_mla++;
        if ((s = bind_layer(e, l, idx, err))) return s;
    }
    return FERRY_OK;
}

/* ------------------------------------------------------------ scratch plan */

typedef struct kbufs {
    float *x;        /* [C][dim] the live stream (AttnRes: the current block sum) */
    float *h;        /* [C][dim] a sub-block's input before its norm */
    float *xb;       /* [C][dim] normed input of a sub-block */
    float *y;        /* [C][dim] sub-block output */
    float *blocks;   /* [C][NB][dim] AttnRes block sums */
    float *qa;       /* [C][q_lora] */
    float *q;        /* [C][H*qk] */
    float *kva;      /* [C][kv_lora + rope] */
    float *att;      /* [C][max(H*v, HD)] attention output before o_proj */
    float *gate;     /* [C][max(H*v, HD)] output gate */
    float *kq, *kk, *kv; /* [C][HD] KDA projections before the convolution */
    float *fa, *ga;  /* [C][hd] low-rank halves */
    float *fz;       /* [C][HD] decay pre-activation */
    float *beta;     /* [C][KH] */
    float *h1, *h2;  /* [C][max ffn] */
    float *z;        /* [C][ed] expert input (latent or xb copy) */
    float *u;        /* [C][ed] weighted expert sum */
    fe_moe_bufs moe; /* the MoE loop's scratch (moe.h) */
    float *rows;     /* [threads][max cols] */
    float *scores;   /* [threads][MLA_HEADS][n_ctx] */
    float *tmp;      /* [threads][tmp_stride] per-thread vectors of MLA / KDA items */
} kbufs;

/* MLA query heads whose attention one work item computes together (below). */
#define MLA_HEADS 8

static int tmp_stride(const kdims *d) { return imax(2 * d->kvl * MLA_HEADS, 5 * d->hd) + 16; }

static uint64_t carve(const fe_hparams *hp, int chunk, int n_ctx, int n_threads, uint8_t *base, kbufs *b) {
    kdims d = dims_of(hp);
    uint64_t off = 0, C = (uint64_t)chunk;
    uint64_t attw = (uint64_t)imax(d.H * d.vd, d.HD), ffw = (uint64_t)imax(imax(d.ffn, d.eff), d.shf);
#define TAKE(field, type, count)                                                                      \
    do {                                                                                              \
        if (base) b->field = (type *)(base + off);                                                   \
        off += FE_ALIGN_UP((uint64_t)(count) * sizeof(type), 64);                                     \
    } while (0)
    TAKE(x, float, C * d.dim);
    TAKE(h, float, C * d.dim);
    TAKE(xb, float, C * d.dim);
    TAKE(y, float, C * d.dim);
    TAKE(blocks, float, C * (uint64_t)d.NB * d.dim);
    TAKE(qa, float, C * d.qlr);
    TAKE(q, float, C * d.H * d.qk);
    TAKE(kva, float, C * d.kvw);
    TAKE(att, float, C * attw);
    TAKE(gate, float, C * attw);
    TAKE(kq, float, C * d.HD);
    TAKE(kk, float, C * d.HD);
    TAKE(kv, float, C * d.HD);
    TAKE(fa, float, C * d.hd);
    TAKE(ga, float, C * d.hd);
    TAKE(fz, float, C * d.HD);
    TAKE(beta, float, C * d.KH_);
    TAKE(h1, float, C * ffw);
    TAKE(h2, float, C * ffw);
    TAKE(z, float, C * d.ed);
    TAKE(u, float, C * d.ed);
    if (d.E) {
        uint64_t m = fe_moe_carve(hp, chunk, d.ed, NULL, NULL);
        if (base) fe_moe_carve(hp, chunk, d.ed, base + off, &b->moe);
        off += FE_ALIGN_UP(m, 64);
    }
    TAKE(rows, float, (uint64_t)n_threads * (uint64_t)fe_rows_stride(max_cols(&d)));
    TAKE(scores, float, (uint64_t)n_threads * MLA_HEADS * (uint64_t)n_ctx);
    TAKE(tmp, float, (uint64_t)n_threads * (uint64_t)tmp_stride(&d));
#undef TAKE
    return off;
}

/* ------------------------------------------------------------------ state
 * [64-byte header: tokens the KDA state has absorbed]
 * [MLA layer m: n_ctx x (kv_lora + rope) floats: normed latent c, key slice k_r]
 * [KDA layer j: heads x hd x hd f32 state S[key][value], then 3 x HD x (kernel-1)
 *  conv inputs, oldest first] */

typedef struct kstate_header {
    int64_t kda_pos;   /* tokens absorbed; -1 when lost (an interrupted eval) */
} kstate_header;

static uint64_t mla_layer_floats(const kdims *d, int n_ctx) { return (uint64_t)n_ctx * (uint64_t)d->kvw; }
static uint64_t kda_s_floats(const kdims *d) { return (uint64_t)d->KH_ * d->hd * d->hd; }
static uint64_t kda_conv_floats(const kdims *d) { return 3ull * d->HD * (uint64_t)(d->K - 1); }
static uint64_t kda_layer_bytes(const kdims *d) {
    return FE_ALIGN_UP((kda_s_floats(d) + kda_conv_floats(d)) * sizeof(float), 64);
}

static uint64_t state_bytes(const fe_hparams *hp, int n_ctx) {
    kdims d = dims_of(hp);
    const fe_kimi_hparams *k = KH(hp);
    return 64 + (uint64_t)k->n_mla * FE_ALIGN_UP(mla_layer_floats(&d, n_ctx) * sizeof(float), 64) +
           (uint64_t)k->n_kda * kda_layer_bytes(&d);
}

static float *mla_cache(const ferry_session *s, const kdims *d, int m) {
    return (float *)(s->state + 64 + (uint64_t)m * FE_ALIGN_UP(mla_layer_floats(d, s->n_ctx) * sizeof(float), 64));
}

static float *kda_state(const ferry_session *s, const kdims *d, int j) {
    const fe_kimi_hparams *k = KH(&s->e->c.hp);
    uint64_t at = 64 + (uint64_t)k->n_mla * FE_ALIGN_UP(mla_layer_floats(d, s->n_ctx) * sizeof(float), 64) +
                  (uint64_t)j * kda_layer_bytes(d);
    return (float *)(s->state + at);
}

static void kimi_sizes(const ferry_engine *e, int n_ctx, int n_threads, fe_session_sizes *out) {
    const fe_hparams *hp = &e->c.hp;
    out->state = state_bytes(hp, n_ctx);
    out->scratch = carve(hp, e->chunk, n_ctx, n_threads, NULL, NULL);
}

/* ------------------------------------------------------------- primitives */

/* The classes of products, for which of them take 8-bit activations. */
enum {
    KQ8_KDA_QKV = 1 << 0,   /* KDA's q, k, v projections (the recurrent state's inputs) */
    KQ8_KDA_GATES = 1 << 1, /* KDA's forget gate (f_a, f_b), beta and output gate (g_a, g_b or g) */
    KQ8_KDA_OUT = 1 << 2,   /* KDA's output projection */
    KQ8_MLA = 1 << 3,       /* MLA's q / kv projections, output gate and output */
    KQ8_FFN = 1 << 4,       /* the dense and shared-expert FFNs */
    KQ8_LATENT = 1 << 5,    /* K3's latent down / up projections around the routed experts */
    KQ8_EXPERTS = 1 << 6,   /* the routed experts */
    KQ8_OUTPUT = 1 << 7,    /* the output head (logits) */
    KQ8_ROUTER = 1 << 8,    /* the MoE router (stored as released, bf16/f16/f32: exact in every mode so far) */
    KQ8_ALL = 0x1ff
};

/* The classes that take 8-bit activations under "auto" on a model with KDA
 * layers; the others run exact. Chosen by switching 8-bit activations on one
 * class at a time (the rest exact) on the tiny random Kimi-Linear and K3 and
 * measuring the next-token distribution's distance from exact over the 54
 * prompts of bench/q8_prompts.txt (bench/activations_distance.py
 * --exact-parts only:GROUP): a class takes them where its own distance is at
 * most 5 % of the weight formats' own error (q8_0 trunk + q3_nl experts
 * against f32), so that the classes together stay under a tenth of it, the
 * bar the other families' default meets (docs/QUANTIZATION.md, "8-bit
 * activations on the Kimi path"). Kimi-Linear (weights' own error KL 0.070):
 * MLA 0.0001, the output head 0.00001, KDA's gates 0.0007, the routed experts
 * 0.0027 take them; KDA's q/k/v (0.0059), its output projection (0.0042) and
 * the dense / shared FFNs (0.0076) stay exact. K3 (0.22): MLA 0.002 and the
 * output head 0.00001 take them; KDA (0.021-0.038), the FFNs (0.025), the
 * latent projections (0.020) and the routed experts (0.026) stay exact.
 * "q8" runs every class on the q8 kernels; models without KDA (DeepSeek-V3 /
 * Kimi-K2) run every class 8-bit under "auto" as the other families do. */
#define KIMI_LINEAR_AUTO_Q8 (KQ8_MLA | KQ8_OUTPUT | KQ8_KDA_GATES | KQ8_EXPERTS)
#define K3_AUTO_Q8 (KQ8_MLA | KQ8_OUTPUT)

/* The 8-bit-activation context of a product of class `cls`, or NULL: exact. */
static const fe_q8_ctx *q8_for(const ferry_session *s, unsigned cls) {
    const fe_q8_ctx *q8 = fe_session_q8(s);
    const fe_kimi_hparams *k = KH(&s->e->c.hp);
    if (!q8 || !s->e->q8_auto || k->n_kda == 0) return q8;
    const unsigned classes = k->latent_dim ? K3_AUTO_Q8 : KIMI_LINEAR_AUTO_Q8; /* K3: the latent MoE */
    return (classes & cls) ? q8 : NULL;
}

static fe_ops ops_for(const ferry_session *s, const kbufs *b, unsigned cls) {
    kdims d = dims_of(&s->e->c.hp);
    fe_ops ops = {s->pool, b->rows, fe_rows_stride(max_cols(&d)), s->e->kernels, s->prof_cur, q8_for(s, cls)};
    return ops;
}

static void matmul(ferry_session *s, const kbufs *b, unsigned cls, const fe_mat *w, const float *x, int n, float *y) {
    fe_ops ops = ops_for(s, b, cls);
    fe_matmul(&ops, w, x, n, y);
}

/* The products of `count` matrices of one class over the same x (same cols)
 * as one parallel job, x quantized once (fe_matmul_multi): each output as
 * matmul computes it, one pool dispatch instead of `count`. */
static void matmul_same_x(ferry_session *s, const kbufs *b, unsigned cls, const fe_mat *const *w, int count,
                          const float *x, int n, float *const *y) {
    fe_ops ops = ops_for(s, b, cls);
    fe_matmul_multi(&ops, w, count, x, n, y);
}

/* One row of a matrix as floats: a pointer into it (f32) or into buf. */
static const float *mat_row(const fe_mat *m, int r, float *buf) {
    const uint8_t *row = m->data + (uint64_t)r * m->row_bytes;
    if (m->fmt == FE_F32) return (const float *)row;
    fe_dequant_row(m->fmt, row, buf, m->cols);
    return buf;
}

static void rope_rotate(float *v, int pos, const fe_kimi_hparams *k) {
    int half = k->qk_rope_dim / 2;
    for (int i = 0; i < half; i++) {
        float angle = (float)pos * k->rope_inv_freq[i];
        float c = cosf(angle) * k->rope_attn_factor, sn = sinf(angle) * k->rope_attn_factor;
        int a = k->rope_interleaved ? 2 * i : i, bb = k->rope_interleaved ? 2 * i + 1 : i + half;
        float x0 = v[a], x1 = v[bb];
        v[a] = x0 * c - x1 * sn;
        v[bb] = x1 * c + x0 * sn;
    }
}

static float act_fn(const fe_kimi_hparams *k, float g, float u) {
    if (k->act == FE_KIMI_ACT_SITU) {
        float a = k->situ_beta * tanhf(g / k->situ_beta) * fe_sigmoid(g);
        return a * (k->situ_linear_beta * tanhf(u / k->situ_linear_beta));
    }
    return fe_silu(g) * u;
}

/* h1[i] = act_fn(h1[i], h2[i]) for i < len: SiLU through fe_silu_mul (the
 * same operations, without a call through the PLT per value, and on the
 * pool's threads for a prompt chunk's width). */
static void act_rows(const ferry_session *s, float *h1, const float *h2, size_t len) {
    const fe_kimi_hparams *k = KH(&s->e->c.hp);
    if (k->act == FE_KIMI_ACT_SILU) {
        fe_silu_mul(s->pool, h1, h2, len);
        return;
    }
    for (size_t i = 0; i < len; i++) h1[i] = act_fn(k, h1[i], h2[i]);
}

/* out = down(act(gate x, up x)) for n rows of x. */
static void mlp(ferry_session *s, const kbufs *b, unsigned cls, const fe_mat *g, const fe_mat *u, const fe_mat *dn,
                const float *x, int n, float *out) {
    const fe_mat *gu[2] = {g, u};
    float *const hh[2] = {b->h1, b->h2};
    matmul_same_x(s, b, cls, gu, 2, x, n, hh);
    act_rows(s, b->h1, b->h2, (size_t)n * g->rows);
    matmul(s, b, cls, dn, b->h1, n, out);
}

/* ------------------------------------------------------ Attention Residuals */

/* out = softmax-weighted sum of entries (blocks..., p), each scored by
 * (v . (norm (.) proj)) / rms(v). out must not alias p or the blocks. */
static void attnres_mix(const float *p, const float *blocks, int nb, const float *norm, const float *proj, int dim,
                        float eps, float *out) {
    float sc[1025];
    for (int e = 0; e <= nb; e++) {
        const float *v = e < nb ? blocks + (size_t)e * dim : p;
        double ss = 0.0, dot = 0.0;
        for (int i = 0; i < dim; i++) {
            ss += (double)v[i] * v[i];
            dot += (double)v[i] * ((double)norm[i] * proj[i]);
        }
        sc[e] = (float)(dot / sqrt(ss / dim + eps));
    }
    fe_softmax(sc, nb + 1);
    for (int i = 0; i < dim; i++) {
        float acc = 0.0f;
        for (int e = 0; e <= nb; e++) acc += sc[e] * (e < nb ? blocks[(size_t)e * dim + i] : p[i]);
        out[i] = acc;
    }
}

/* ------------------------------------------------------------------ MLA */

typedef struct {
    ferry_session *s;
    const kbufs *b;
    const kimi_layer *L;
    const float *cache;
    int n;
    int hb;             /* query heads per item (<= MLA_HEADS) */
} mla_job;

/* One token and a block of hb heads per item, absorbed: q_lat = W_k^T q_nope
 * per head, scores over the cached latents (each latent row read once for
 * the block: every head shares the one latent cache), context in latent
 * space, then W_v. Each head is computed exactly as alone (the same dots,
 * fe_softmax, the context accumulated in position order), so the block size
 * changes the memory traffic, never a bit. */
static void mla_items(void *p, int start, int end, int tid) {
    mla_job *j = p;
    ferry_session *s = j->s;
    const fe_hparams *hp = &s->e->c.hp;
    const fe_kimi_hparams *k = KH(hp);
    kdims d = dims_of(hp);
    const int blocks = (d.H + j->hb - 1) / j->hb;
    float *rowbuf = j->b->rows + (size_t)tid * (size_t)fe_rows_stride(max_cols(&d));
    float *scores = j->b->scores + (size_t)tid * MLA_HEADS * (size_t)s->n_ctx;
    float *tmp = j->b->tmp + (size_t)tid * (size_t)tmp_stride(&d);
    const fe_mat *kvb = &j->L->kv_b;
    const fe_kernels *K = s->e->kernels; /* its dot and axpy: bit-identical to fe_dot_f32 / fe_axpy_f32 */
    for (int it = start; it < end; it++) {
        const int t = it / blocks, h0 = it % blocks * j->hb, upto = s->pos + t;
        const int nh = h0 + j->hb <= d.H ? j->hb : d.H - h0; /* heads [h0, h0 + nh) */
#define QLAT(hh) (tmp + (size_t)(hh) * 2 * d.kvl)
#define CTX(hh) (QLAT(hh) + d.kvl)
#define QH(hh) (j->b->q + (size_t)t * d.H * d.qk + (size_t)(h0 + (hh)) * d.qk)
        for (int hh = 0; hh < nh; hh++) {
            memset(QLAT(hh), 0, (size_t)d.kvl * sizeof(float));
            for (int r = 0; r < d.nope; r++)
                K->axpy(QLAT(hh), QH(hh)[r], mat_row(kvb, (h0 + hh) * (d.nope + d.vd) + r, rowbuf), d.kvl);
        }
        for (int i = 0; i <= upto; i++) {
            const float *ce = j->cache + (size_t)i * d.kvw;
            for (int hh = 0; hh < nh; hh++) {
                float sc = K->dot(QLAT(hh), ce, d.kvl);
                if (d.rope) sc += K->dot(QH(hh) + d.nope, ce + d.kvl, d.rope);
                scores[(size_t)hh * s->n_ctx + i] = sc * k->softmax_scale;
            }
        }
        for (int hh = 0; hh < nh; hh++) {
            fe_softmax(scores + (size_t)hh * s->n_ctx, upto + 1);
            memset(CTX(hh), 0, (size_t)d.kvl * sizeof(float));
        }
        for (int i = 0; i <= upto; i++)
            for (int hh = 0; hh < nh; hh++)
                K->axpy(CTX(hh), scores[(size_t)hh * s->n_ctx + i], j->cache + (size_t)i * d.kvw, d.kvl);
        for (int hh = 0; hh < nh; hh++) {
            float *out = j->b->att + (size_t)t * d.H * d.vd + (size_t)(h0 + hh) * d.vd;
            for (int v = 0; v < d.vd; v++)
                out[v] = K->dot(mat_row(kvb, (h0 + hh) * (d.nope + d.vd) + d.nope + v, rowbuf), CTX(hh), d.kvl);
        }
#undef QLAT
#undef CTX
#undef QH
    }
}

static void mla_attention(ferry_session *s, const kbufs *b, int l, int n) {
    const fe_hparams *hp = &s->e->c.hp;
    const fe_kimi_hparams *k = KH(hp);
    const kimi_layer *L = &MODEL(s->e)->layers[l];
    kdims d = dims_of(hp);
    { /* q (or its low-rank half), the kv latent and the output gate all read xb: one job */
        const fe_mat *w[3] = {d.qlr ? &L->q_a : &L->q, &L->kv_a, &L->g};
        float *const y[3] = {d.qlr ? b->qa : b->q, b->kva, b->gate};
        matmul_same_x(s, b, KQ8_MLA, w, k->mla_out_gate ? 3 : 2, b->xb, n, y);
    }
    if (d.qlr) {
        for (int t = 0; t < n; t++)
            fe_rmsnorm(b->qa + (size_t)t * d.qlr, b->qa + (size_t)t * d.qlr, L->q_a_norm, d.qlr, k->latent_eps);
        matmul(s, b, KQ8_MLA, &L->q_b, b->qa, n, b->q);
    }
    float *cache = mla_cache(s, &d, L->cache_index);
    for (int t = 0; t < n; t++) {
        float *kv = b->kva + (size_t)t * d.kvw, *dst = cache + (size_t)(s->pos + t) * d.kvw;
        fe_rmsnorm(dst, kv, L->kv_a_norm, d.kvl, k->latent_eps);
        memcpy(dst + d.kvl, kv + d.kvl, (size_t)d.rope * sizeof(float));
        if (k->mla_rope) {
            rope_rotate(dst + d.kvl, s->pos + t, k);
            for (int h = 0; h < d.H; h++) rope_rotate(b->q + (size_t)t * d.H * d.qk + (size_t)h * d.qk + d.nope, s->pos + t, k);
        }
    }
    /* Blocks of up to MLA_HEADS heads, smaller while that leaves fewer than
     * four items per thread. */
    mla_job j = {s, b, L, cache, n, MLA_HEADS};
    while (j.hb > 1 && n * ((d.H + j.hb - 1) / j.hb) < 4 * fe_pool_threads(s->pool)) j.hb /= 2;
    fe_pool_run(s->pool, mla_items, &j, n * ((d.H + j.hb - 1) / j.hb));
    if (k->mla_out_gate) {
        for (size_t i = 0; i < (size_t)n * d.H * d.vd; i++) b->att[i] *= fe_sigmoid(b->gate[i]);
    }
    matmul(s, b, KQ8_MLA, &L->o, b->att, n, b->y);
}

/* ------------------------------------------------------------------ KDA */

typedef struct {
    ferry_session *s;
    const kbufs *b;
    const kimi_layer *L;
    float *S, *conv;
    int n;
} kda_job;

static float softplus20(float x) { return x > 20.0f ? x : logf(1.0f + expf(x)); }

/* One head per item; its tokens in order (the recurrence is sequential). */
static void kda_heads(void *p, int start, int end, int tid) {
    kda_job *j = p;
    ferry_session *s = j->s;
    const fe_hparams *hp = &s->e->c.hp;
    const fe_kimi_hparams *k = KH(hp);
    const kimi_layer *L = j->L;
    const kbufs *b = j->b;
    kdims d = dims_of(hp);
    const int hd = d.hd, HD = d.HD, K = d.K;
    float *tq = b->tmp + (size_t)tid * (size_t)tmp_stride(&d), *tk = tq + hd, *tv = tk + hd, *tu = tv + hd,
          *to = tu + hd;
    const float *raw[3] = {b->kq, b->kk, b->kv};
    float *outs[3] = {tq, tk, tv};
    const float qscale = 1.0f / sqrtf((float)hd);
    for (int h = start; h < end; h++) {
        float *S = j->S + (size_t)h * hd * hd;
        const float decay_rate = expf(L->a_log[h]);
        for (int t = 0; t < j->n; t++) {
            /* short causal convolutions (kernel K) of q, k, v, then SiLU */
            for (int w = 0; w < 3; w++)
                for (int i = 0; i < hd; i++) {
                    int c = h * hd + i;
                    float *st = j->conv + ((size_t)w * HD + c) * (size_t)(K - 1);
                    const float *wt = L->conv[w] + (size_t)c * K;
                    float x = raw[w][(size_t)t * HD + c], acc = 0.0f;
                    for (int q = 0; q < K - 1; q++) acc += wt[q] * st[q];
                    acc += wt[K - 1] * x;
                    for (int q = 0; q + 1 < K - 1; q++) st[q] = st[q + 1];
                    if (K > 1) st[K - 2] = x;
                    outs[w][i] = fe_silu(acc);
                }
            float sq = 0.0f, sk = 0.0f;
            for (int i = 0; i < hd; i++) { sq += tq[i] * tq[i]; sk += tk[i] * tk[i]; }
            float iq = 1.0f / sqrtf(sq + 1e-6f), ik = 1.0f / sqrtf(sk + 1e-6f);
            for (int i = 0; i < hd; i++) { tq[i] = tq[i] * iq * qscale; tk[i] = tk[i] * ik; }
            float beta = fe_sigmoid(b->beta[(size_t)t * d.KH_ + h]);
            /* S <- diag(alpha) S, and kv_mem = S^T k */
            memset(tu, 0, (size_t)hd * sizeof *tu);
            for (int i = 0; i < hd; i++) {
                int c = h * hd + i;
                float z = b->fz[(size_t)t * HD + c] + L->dt_bias[c], g;
                if (k->kda_decay == FE_KIMI_DECAY_BOUNDED) g = k->gate_lower_bound * fe_sigmoid(decay_rate * z);
                else g = -decay_rate * softplus20(z);
                float alpha = expf(g), ki = tk[i];
                float *row = S + (size_t)i * hd;
                for (int v = 0; v < hd; v++) {
                    row[v] *= alpha;
                    tu[v] += row[v] * ki;
                }
            }
            for (int v = 0; v < hd; v++) tu[v] = (tv[v] - tu[v]) * beta;
            /* S <- S + k u^T, and o = S^T q */
            memset(to, 0, (size_t)hd * sizeof *to);
            for (int i = 0; i < hd; i++) {
                float ki = tk[i], qi = tq[i];
                float *row = S + (size_t)i * hd;
                for (int v = 0; v < hd; v++) {
                    row[v] += ki * tu[v];
                    to[v] += row[v] * qi;
                }
            }
            /* gated per-head RMSNorm */
            double ss = 0.0;
            for (int v = 0; v < hd; v++) ss += (double)to[v] * to[v];
            float sc = (float)(1.0 / sqrt(ss / hd + hp->norm_eps));
            float *out = b->att + (size_t)t * HD + (size_t)h * hd;
            const float *gate = b->gate + (size_t)t * HD + (size_t)h * hd;
            for (int v = 0; v < hd; v++) out[v] = L->o_norm[v] * (to[v] * sc) * fe_sigmoid(gate[v]);
        }
    }
}

static void kda_attention(ferry_session *s, const kbufs *b, int l, int n) {
    const fe_hparams *hp = &s->e->c.hp;
    const fe_kimi_hparams *k = KH(hp);
    const kimi_layer *L = &MODEL(s->e)->layers[l];
    kdims d = dims_of(hp);
    /* the products of xb, one job per class: q, k, v; then the gates' first halves and beta */
    const fe_mat *qkv[3] = {&L->kq, &L->kk, &L->kv};
    float *const qkv_y[3] = {b->kq, b->kk, b->kv};
    matmul_same_x(s, b, KQ8_KDA_QKV, qkv, 3, b->xb, n, qkv_y);
    const fe_mat *gates[3] = {&L->f_a, &L->b, k->kda_full_gate ? &L->g_full : &L->g_a};
    float *const gates_y[3] = {b->fa, b->beta, k->kda_full_gate ? b->gate : b->ga};
    matmul_same_x(s, b, KQ8_KDA_GATES, gates, 3, b->xb, n, gates_y);
    matmul(s, b, KQ8_KDA_GATES, &L->f_b, b->fa, n, b->fz);
    if (!k->kda_full_gate) matmul(s, b, KQ8_KDA_GATES, &L->g_b, b->ga, n, b->gate);
    float *S = kda_state(s, &d, L->cache_index);
    kda_job j = {s, b, L, S, S + kda_s_floats(&d), n};
    fe_pool_run(s->pool, kda_heads, &j, d.KH_);
    matmul(s, b, KQ8_KDA_OUT, &L->ko, b->att, n, b->y);
}

/* ---------------------------------------------------------- feed-forward */

/* What the MoE loop (moe.c) needs from this family: DeepSeek-V3 routing
 * (sigmoid + correction bias, group-limited top-k, renormalised unbiased
 * weights times routed_scale, all in moe.c) on this family's router, and the
 * expert MLP (SiLU or SiTU) on the expert width (the latent width for K3). */
typedef struct moe_ctx {
    ferry_session *s;
    const kbufs *b;
} moe_ctx;

static void moe_expert(void *p, int l, const uint8_t *rec, const float *in, int m, float *out) {
    moe_ctx *c = p;
    const fe_bank *bk = &c->s->e->c.banks[l];
    fe_mat g = fe_expert_mat(bk, 0, rec), u = fe_expert_mat(bk, 1, rec), dn = fe_expert_mat(bk, 2, rec);
    mlp(c->s, c->b, KQ8_EXPERTS, &g, &u, &dn, in, m, out);
}

/* The expert activation of n experts' gate and up (fe_moe_gated1's act). */
static void expert_act(void *p, float *h1, const float *h2, size_t len) { act_rows(p, h1, h2, len); }

/* n experts on one token (decode with every record in RAM): gate and up of
 * all of them in one parallel job, the activation, then the down projections
 * in one job, instead of three jobs per expert; each product as moe_expert
 * computes it with m = 1 (the same kernels, the same quantized input). */
static void moe_experts1(void *p, int l, const uint8_t *const *rec, int n, const float *in, float *const *out) {
    moe_ctx *c = p;
    ferry_session *s = c->s;
    const kbufs *b = c->b;
    kdims d = dims_of(&s->e->c.hp);
    fe_ops ops = {s->pool, b->rows, fe_rows_stride(max_cols(&d)), s->e->kernels, s->prof_cur, q8_for(s, KQ8_EXPERTS)};
    fe_moe_gated1(&ops, &s->e->c.banks[l], rec, n, in, b->h1, b->h2, expert_act, s, out);
}

static ferry_status moe(ferry_session *s, const kbufs *b, int l, int n, ferry_error *err) {
    const fe_hparams *hp = &s->e->c.hp;
    const fe_kimi_hparams *k = KH(hp);
    const kimi_layer *L = &MODEL(s->e)->layers[l];
    kdims d = dims_of(hp);
    const int ed = d.ed;
    /* the latent path: experts run on a down-projection of the normed input */
    if (k->latent_dim) matmul(s, b, KQ8_LATENT, &L->lat_down, b->xb, n, b->z);
    else memcpy(b->z, b->xb, (size_t)n * ed * sizeof(float));
    memset(b->u, 0, (size_t)n * ed * sizeof(float));
    moe_ctx c = {s, b};
    fe_moe_arch a = {.ctx = &c, .kind = FE_ROUTE_SIGMOID_GROUPED, .ed = ed,
                     .ops = {s->pool, b->rows, fe_rows_stride(max_cols(&d)), s->e->kernels, s->prof_cur, q8_for(s, KQ8_ROUTER)},
                     .layers = MODEL(s->e)->layers, .layer_size = sizeof(kimi_layer),
                     .router_at = offsetof(kimi_layer, router), .norm_at = offsetof(kimi_layer, ffn_norm),
                     .bias_at = offsetof(kimi_layer, router_bias), .expert = moe_expert,
                     .experts1 = moe_experts1};
    ferry_status st = fe_moe_layer(s, &a, &b->moe, l, n, b->xb, b->z, b->x, b->u, err);
    if (st) return st;
    if (k->latent_dim) {
        for (int t = 0; t < n; t++) fe_rmsnorm(b->u + (size_t)t * ed, b->u + (size_t)t * ed, L->lat_norm, ed, hp->norm_eps);
        matmul(s, b, KQ8_LATENT, &L->lat_up, b->u, n, b->y);
    } else {
        memcpy(b->y, b->u, (size_t)n * d.dim * sizeof(float));
    }
    if (d.shf) {
        float *sh = b->h; /* free once xb is formed */
        mlp(s, b, KQ8_FFN, &L->sh_gate, &L->sh_up, &L->sh_down, b->xb, n, sh);
        for (size_t i = 0; i < (size_t)n * d.dim; i++) b->y[i] += sh[i];
    }
    return FERRY_OK;
}

static ferry_status ffn(ferry_session *s, const kbufs *b, int l, int n, ferry_error *err) {
    const fe_hparams *hp = &s->e->c.hp;
    const kimi_layer *L = &MODEL(s->e)->layers[l];
    if (hp->layer_is_moe[l]) return moe(s, b, l, n, err);
    mlp(s, b, KQ8_FFN, &L->w_gate, &L->w_up, &L->w_down, b->xb, n, b->y);
    return FERRY_OK;
}

/* ------------------------------------------------------------ whole pass */

static ferry_status kimi_forward(ferry_session *s, const int32_t *tokens, int n, float *logits, int all_logits,
                                 ferry_error *err) {
    ferry_engine *e = s->e;
    const kimi_model *m = MODEL(e);
    const fe_hparams *hp = &e->c.hp;
    const fe_kimi_hparams *k = KH(hp);
    kdims dd = dims_of(hp);
    const int d = hp->dim, B = k->attn_res_block;
    kstate_header *hdr = (kstate_header *)s->state;
    if (k->n_kda) {
        if (s->pos == 0) {
            for (int j = 0; j < k->n_kda; j++) memset(kda_state(s, &dd, j), 0, kda_layer_bytes(&dd));
            hdr->kda_pos = 0;
        } else if (hdr->kda_pos != s->pos) {
            return fe_fail(err, FERRY_E_UNSUPPORTED,
                           "the recurrent (KDA) state holds %lld tokens, not the session's %d: a recurrent model "
                           "cannot rewind or resume an interrupted evaluation; reset the session and evaluate "
                           "the tokens again", (long long)hdr->kda_pos, s->pos);
        }
        hdr->kda_pos = -1; /* until this chunk completes */
    }
    if ((uint64_t)B && k->n_res_blocks > 1024)
        return fe_fail(err, FERRY_E_UNSUPPORTED, "too many AttnRes blocks");
    kbufs b;
    carve(hp, s->e->chunk, s->n_ctx, fe_pool_threads(s->pool), s->scratch, &b);
    ferry_status es = fe_embed(e, &m->tok_embd, tokens, n, b.x, b.h, err);
    if (es) {
        if (k->n_kda) hdr->kda_pos = s->pos; /* nothing evaluated: the state is still whole */
        return es;
    }
    fe_embed_override(s, n, b.x);
    fe_stage(s, 0, n, b.x);
    int nb = 0; /* block sums stored so far (AttnRes) */
    const size_t bstride = (size_t)dd.NB * d;
    for (int l = 0; l < hp->n_layers; l++) {
        if (atomic_exchange(&s->cancel, 0))
            return fe_fail(err, FERRY_E_CANCELLED, "cancelled at layer %d", l);
        const kimi_layer *L = &m->layers[l];
        int fresh = B && l % B == 0;
        for (int t = 0; t < n; t++) {
            float *x = b.x + (size_t)t * d, *h = b.h + (size_t)t * d, *bl = b.blocks + (size_t)t * bstride;
            const float *in = x;
            if (B && nb) {
                attnres_mix(x, bl, nb, L->res_attn_norm, L->res_attn_proj, d, hp->norm_eps, h);
                in = h;
            }
            if (fresh) memcpy(bl + (size_t)nb * d, x, (size_t)d * sizeof(float));
            fe_rmsnorm(b.xb + (size_t)t * d, in, L->attn_norm, d, hp->norm_eps);
        }
        if (fresh) nb++;
        if (k->layer_kda[l]) kda_attention(s, &b, l, n);
        else mla_attention(s, &b, l, n);
        for (int t = 0; t < n; t++) {
            float *x = b.x + (size_t)t * d;
            const float *y = b.y + (size_t)t * d;
            if (fresh) memcpy(x, y, (size_t)d * sizeof(float));
            else
                for (int i = 0; i < d; i++) x[i] += y[i];
            const float *in = x;
            if (B) {
                float *h = b.h + (size_t)t * d;
                attnres_mix(x, b.blocks + (size_t)t * bstride, nb, L->res_mlp_norm, L->res_mlp_proj, d, hp->norm_eps, h);
                in = h;
            }
            fe_rmsnorm(b.xb + (size_t)t * d, in, L->ffn_norm, d, hp->norm_eps);
        }
        ferry_status st = ffn(s, &b, l, n, err);
        if (st) return st;
        for (size_t i = 0; i < (size_t)n * d; i++) b.x[i] += b.y[i];
        fe_stage(s, l + 1, n, b.x);
    }
    for (int t = 0; t < n; t++) {
        const float *in = b.x + (size_t)t * d;
        if (B) {
            attnres_mix(in, b.blocks + (size_t)t * bstride, nb, m->res_out_norm, m->res_out_proj, d, hp->norm_eps,
                        b.h + (size_t)t * d);
            in = b.h + (size_t)t * d;
        }
        fe_rmsnorm(b.xb + (size_t)t * d, in, m->output_norm, d, hp->norm_eps);
    }
    fe_stage(s, hp->n_layers + 1, n, b.xb);
    if (logits) {
        if (all_logits) matmul(s, &b, KQ8_OUTPUT, &m->output, b.xb, n, logits);
        else matmul(s, &b, KQ8_OUTPUT, &m->output, b.xb + (size_t)(n - 1) * d, 1, logits);
    }
    if (k->n_kda) hdr->kda_pos = s->pos + n;
    return FERRY_OK;
}

/* No state_blob functions: the whole state buffer is the blob (it holds the
 * KDA position header, so a restored session resumes its recurrence). */
const fe_arch fe_arch_kimi = {.name = "kimi", .bind = kimi_bind, .unbind = kimi_unbind, .sizes = kimi_sizes,
                              .forward = kimi_forward};
