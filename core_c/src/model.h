/* model.h — the loaded model (engine) and one timeline (session). */
#ifndef FERRY_MODEL_H
#define FERRY_MODEL_H

#include <stdatomic.h>

#include "container.h"
#include "pool.h"

/* A weight matrix [rows, cols] in some stored format. */
typedef struct fe_mat {
    const uint8_t *data;  /* first row */
    int fmt;              /* fe_format */
    int rows, cols;       /* shape */
    uint64_t row_bytes;   /* stored bytes per row */
} fe_mat;

/* The resident tensors of one transformer block. Vectors are f32. */
typedef struct fe_layer {
    const float *attn_norm;       /* [dim] */
    fe_mat wq, wk, wv, wo;        /* projections */
    const float *bq, *bk, *bv, *bo; /* biases or NULL */
    const float *q_norm, *k_norm; /* [head_dim] or [heads*head_dim], or NULL */
    const float *ffn_norm;        /* [dim] */
    fe_mat w_gate, w_up, w_down;  /* dense feed-forward (dense layers) */
    fe_mat router;                /* [n_experts, dim] (MoE layers) */
} fe_layer;

struct ferry_engine {
    fe_container c;               /* the container and its resident trunk */
    fe_layer *layers;             /* n_layers */
    fe_mat tok_embd;              /* [vocab, dim] */
    fe_mat output;                /* [vocab, dim] (may alias tok_embd) */
    const float *output_norm;     /* [dim] */
    ferry_open_options opts;      /* as opened, threads resolved */
};

/* Scratch and state sizes of one session, shared by the planner and the
 * allocator so the plan is exactly what gets allocated. */
typedef struct fe_session_sizes {
    uint64_t kv;        /* floats in each of the K and V caches */
    uint64_t scratch;   /* bytes of activations for one chunk */
    uint64_t expert;    /* bytes of the expert read buffer */
} fe_session_sizes;

#define FE_CHUNK 32     /* tokens evaluated together in a prompt */

void fe_session_sizes_compute(const fe_container *c, int n_ctx, int n_threads, fe_session_sizes *s);

struct ferry_session {
    ferry_engine *e;            /* the model (borrowed) */
    int n_ctx;                  /* capacity in tokens */
    int pos;                    /* tokens held */
    float *k_cache, *v_cache;   /* [n_layers][n_ctx][kv_dim] */
    uint8_t *scratch;           /* activations, carved up per chunk */
    uint8_t *expert_buf;        /* one expert record, 4096-aligned */
    fe_pool *pool;              /* compute threads of this session */
    atomic_int cancel;          /* set by ferry_session_request_cancel */
    ferry_stage_fn stage_fn;    /* observer or NULL */
    void *stage_user;           /* its user data */
    ferry_stats stats;          /* counters */
};

/* Resolve and check every tensor the forward pass uses. */
ferry_status fe_engine_bind(ferry_engine *e, ferry_error *err);

/* Evaluate n tokens (n <= FE_CHUNK) at s->pos; logits as in ferry_session_eval. */
ferry_status fe_forward_chunk(ferry_session *s, const int32_t *tokens, int n, float *logits, int all_logits,
                              ferry_error *err);

#endif
