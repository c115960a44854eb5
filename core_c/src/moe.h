/* moe.h — the one mixture-of-experts layer loop every architecture uses.
 *
 * An architecture supplies where its router weights are and its expert
 * feed-forward; this module does the rest, the same way for every family:
 *
 *   routing     softmax top-k (Llama family: Mixtral, Qwen-MoE, OLMoE) or
 *               DeepSeek-V3 routing (sigmoid + correction bias, group-limited
 *               top-k, weights from the unbiased scores, renormalised, times a
 *               scale: DeepSeek-V3/K2, Kimi-Linear, K3), with the session's
 *               opt-in modes (experts per token, cache-aware margin);
 *   the visit   the distinct experts the chunk chose, those in RAM first, one
 *               begin/next/end visit of the expert cache (experts.h) so misses
 *               are read in parallel behind the compute, each distinct expert
 *               read once per chunk; each expert's rows gathered from a
 *               per-expert list (no scan over all experts);
 *   lookahead   for a single-token step, the next MoE layer's router (the
 *               architecture's real one, with the same routing rule) run on
 *               the current residual, its choices prefetched;
 *   the sum     in rank order per token, so a token's result does not depend
 *               on its chunk or the order records landed.
 *
 * Placement (cache, overlap, lookahead) changes speed, never output. */
#ifndef FERRY_MOE_H
#define FERRY_MOE_H

#include "common.h"
#include "container.h"
#include "ops.h"

struct ferry_session;

/* How a model routes. */
enum { FE_ROUTE_SOFTMAX = 0, FE_ROUTE_SIGMOID_GROUPED = 1 };

typedef struct fe_moe_arch {
    void *ctx;           /* the architecture's state for this pass */
    int kind;            /* FE_ROUTE_* */
    int ed;              /* width of an expert's input and output (dim, or the latent width) */
    fe_ops ops;          /* how the router's matrix product runs */
    /* The architecture's per-layer structs, and where in one of them the
     * router matrix [E][dim] (an fe_mat), the FFN norm [dim] and the router's
     * correction bias [E] (SIGMOID_GROUPED) are (const float * fields). */
    const void *layers;
    size_t layer_size, router_at, norm_at, bias_at;
    /* One expert's feed-forward on m rows of in [m][ed] into out [m][ed]. */
    void (*expert)(void *ctx, int layer, const uint8_t *record, const float *in, int m, float *out);
    /* Optional (NULL: `expert` one at a time): for a single token, the
     * feed-forward of n <= FE_MOE_BATCH experts on the same input in [ed],
     * expert i's from record[i] into out[i] [ed], each exactly as `expert`
     * computes it with m = 1, in a few parallel jobs instead of a few per
     * expert. Used when every record of the visit is in RAM (decode in RAM). */
    void (*experts1)(void *ctx, int layer, const uint8_t *const *record, int n, const float *in, float *const *out);
} fe_moe_arch;

/* Most experts one experts1 call takes (two matrices each in one product job). */
#define FE_MOE_BATCH (FE_MATMUL_MULTI_MAX / 2)

/* The loop's scratch, carved by the architecture among its own buffers. */
typedef struct fe_moe_bufs {
    float *logits;      /* [C][E] router logits, then scores */
    float *choice;      /* [E] one token's selection keys */
    float *group;       /* [E] group scores (at most E groups) */
    uint8_t *mark;      /* [E] taken / kept marks, always left zero */
    int *count;         /* [E] rows per expert, always left zero */
    int *ids;           /* [E] the distinct experts of the chunk */
    int *first;         /* [C*K+1] each distinct expert's first row in rows */
    int *rows;          /* [C*K] (token * K + rank), grouped by expert */
    int *sel;           /* [C][K] chosen experts */
    float *sel_w;       /* [C][K] their weights */
    float *slots;       /* [C][K][ed] each choice's expert output */
    float *ex_in;       /* [C][ed] rows routed to one expert */
    float *ex_out;      /* [C][ed] its output */
    float *look_in;     /* [dim] lookahead router input */
    int *look_ids;      /* [K] its predicted experts */
    float *look_w;      /* [K] their weights (unused) */
    uint8_t *in_ram;    /* [E] cache-aware routing: the layer's experts in RAM */
} fe_moe_bufs;

/* What an architecture's experts1 does for gated experts: the gate and up
 * projections of n <= FE_MOE_BATCH experts of bank bk (records rec[i]) on
 * one token's input `in`, all in one product job, into h1 and h2 (expert i
 * at i * f, f its hidden width); then act(act_ctx, h1, h2, n * f) leaves
 * the down projections' input in h1; then the n downs into out[i] in one
 * job. Each product as the expert's own m = 1 feed-forward computes it
 * (the same kernels, the same quantized input). */
void fe_moe_gated1(const fe_ops *ops, const fe_bank *bk, const uint8_t *const *rec, int n, const float *in,
                   float *h1, float *h2, void (*act)(void *act_ctx, float *h1, const float *h2, size_t len),
                   void *act_ctx, float *const *out);

/* Bytes of the scratch for chunks of `chunk` tokens of a model whose experts
 * are ed wide (carve with base NULL measures). */
uint64_t fe_moe_carve(const fe_hparams *hp, int chunk, int ed, uint8_t *base, fe_moe_bufs *b);

/* One MoE layer for the n rows of the chunk:
 *   xb   [n][dim] the router input,
 *   z    [n][ed]  the experts' input,
 *   x    [n][dim] the residual stream now (the lookahead's input, read only),
 *   acc  [n][ed]  receives sum over choices of weight * expert output, added
 *                 in rank order to what it holds.
 * A profiling session's expert_seconds and its parts (the experts'
 * feed-forward, read waits, the dispatch's own work) are counted here. */
ferry_status fe_moe_layer(struct ferry_session *s, const fe_moe_arch *a, const fe_moe_bufs *b, int layer, int n,
                          const float *xb, const float *z, const float *x, float *acc, ferry_error *err);

/* The routing rule of one token, exposed for tests and for the lookahead:
 * logits [E] (overwritten with the scores) -> ids/w [k_used] where k_used is
 * the session's experts per token. in_ram (may be NULL) says which experts
 * the cache holds, for cache-aware routing with margin > 0. Returns k_used. */
typedef struct fe_route_params {
    int kind, n_experts, top_k, k_used;
    int n_group, topk_group;   /* SIGMOID_GROUPED */
    int norm;                  /* renormalise the chosen weights */
    float norm_eps;            /* added to their sum before dividing */
    float scale;               /* routed scaling factor */
    float margin;              /* cache-aware margin, 0 = exact */
    const float *bias;         /* [E] correction bias or NULL */
} fe_route_params;

int fe_moe_route(const fe_route_params *p, float *logits, float *choice, float *group, uint8_t *mark,
                 const uint8_t *in_ram, int *ids, float *w, int *swapped);

#endif
