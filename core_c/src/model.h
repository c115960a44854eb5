/* model.h — the loaded model (engine), one timeline (session), and the
 * interface every architecture's forward pass implements. */
#ifndef FERRY_MODEL_H
#define FERRY_MODEL_H

#include <pthread.h>
#include <stdatomic.h>

#include "container.h"
#include "experts.h"
#include "kernels_q8.h"
#include "ops.h"
#include "pool.h"

#define FE_CHUNK 32     /* tokens a prompt's forward pass evaluates together: the default */
/* ... in a model with MoE layers: a chunk visits each distinct expert it
 * routes to once and multiplies all of that expert's rows together, so with
 * a cache smaller than a prompt's experts a larger chunk rereads fewer of
 * them (in RAM it measured neutral). docs/bench-log/2026-12-06.md, session
 * 18, h5. */
#define FE_MOE_CHUNK 128
#define FE_MAX_CHUNK 512 /* the largest ferry_open_options.prompt_chunk taken (larger ones are clamped) */

/* What a session of some context length needs, in bytes; computed by the
 * same code that carves the buffers, so the plan is what gets allocated. */
typedef struct fe_session_sizes {
    uint64_t state;     /* attention caches / recurrent state at n_ctx */
    uint64_t scratch;   /* activations and row buffers for one chunk */
} fe_session_sizes;   /* expert records live in the engine's cache, not here */

struct ferry_engine;
struct ferry_session;

/* One architecture family. */
typedef struct fe_arch {
    const char *name;                                    /* manifest model.arch */
    /* Resolve and check every trunk tensor; allocate e->arch_data. */
    ferry_status (*bind)(struct ferry_engine *e, ferry_error *err);
    void (*unbind)(struct ferry_engine *e);              /* free e->arch_data */
    /* Session sizes from the manifest alone (called before bind, without a trunk). */
    void (*sizes)(const struct ferry_engine *e, int n_ctx, int n_threads, fe_session_sizes *out);
    /* Evaluate n <= e->chunk tokens at s->pos (logits as ferry_session_eval). */
    ferry_status (*forward)(struct ferry_session *s, const int32_t *tokens, int n, float *logits,
                            int all_logits, ferry_error *err);
    /* The state of the first `pos` tokens as one contiguous blob (for save and
     * restore): its size, and copying it out of or into a session. NULL
     * means the whole state buffer is the blob (then only a session of the
     * same context can take it). */
    uint64_t (*state_blob_size)(const struct ferry_session *s, int pos);
    void (*state_blob_copy)(struct ferry_session *s, int pos, uint8_t *blob, int to_blob);
} fe_arch;

/* The architecture named by a manifest, or NULL. */
const fe_arch *fe_arch_find(const char *name);

/* The prompt chunk of a model: `asked` (ferry_open_options.prompt_chunk)
 * clamped to 1..FE_MAX_CHUNK, or when 0 FE_MOE_CHUNK for a model with MoE
 * layers and FE_CHUNK otherwise. Outputs do not depend on it. */
int fe_prompt_chunk(const fe_hparams *hp, int asked);

extern const fe_arch fe_arch_llama;  /* arch_llama.c */
extern const fe_arch fe_arch_kimi;   /* arch_kimi.c */

struct ferry_engine {
    fe_container c;               /* the container and its resident trunk */
    const fe_arch *arch;          /* how to run it */
    void *arch_data;              /* the architecture's bound tensors */
    ferry_open_options opts;      /* as opened, threads and context resolved */
    const struct fe_kernels *kernels; /* the matrix-product kernels chosen at open (kernels.h) */
    const fe_q8_kernels *q8;      /* the 8-bit-activation kernels (activations "q8"), or NULL: exact f32 */
    uint64_t q8_bytes;            /* a session's buffer for them: one chunk at the widest matrix input */
    unsigned q8_kinds;            /* its layouts' regions (fe_q8_kinds) */
    int chunk;                    /* tokens a prompt's forward pass evaluates together (fe_prompt_chunk) */
    int q8_auto;                  /* activations "auto": an architecture may keep classes of its products exact
                                     (arch_kimi.c, KIMI_AUTO_Q8) where "q8" runs them all on the q8 kernels */
    fe_ecache *cache;             /* expert records in RAM, or NULL for dense models */
    int cache_slots;              /* its records */
    uint64_t cache_bytes;         /* their RAM */
    uint64_t session_bytes;       /* RAM the budget keeps for sessions (state + scratch) */
    uint64_t sessions_in_use;     /* of that, allocated by open sessions */
    pthread_mutex_t lock;         /* one evaluation at a time uses the cache; guards sessions_in_use */
};

struct ferry_session {
    struct ferry_engine *e;     /* the model (borrowed) */
    int n_ctx;                  /* capacity in tokens */
    int pos;                    /* tokens held */
    uint8_t *state;             /* attention caches / recurrent state, sizes.state bytes */
    uint8_t *scratch;           /* activations, carved up per chunk, sizes.scratch bytes */
    fe_session_sizes sizes;     /* what was allocated */
    int decoding;               /* the running eval is a single-token step */
    fe_pool *pool;              /* compute threads of this session */
    atomic_int cancel;          /* set by ferry_session_request_cancel */
    ferry_stage_fn stage_fn;    /* observer or NULL */
    void *stage_user;           /* its user data */
    int route_k;                /* experts per token; 0 = the model's top_k (ferry_session_set_routing) */
    float route_margin;         /* cache-aware routing margin; 0 = exact routing */
    ferry_stats stats;          /* counters */
    int profiling;              /* ferry_session_set_profiling */
    ferry_profile prof;         /* its counters */
    ferry_profile_part *prof_cur; /* the part the running eval adds to, or NULL */
    fe_q8_ctx q8;               /* the q8 kernels and their buffer (the end of scratch) when the engine uses them */
    const float *embd;          /* during ferry_session_eval_embd: this chunk's input rows [n][dim], or NULL */
    const uint8_t *embd_use;    /* and which of them replace their token's embedding row */
};

/* What fe_ops.q8 of a session's products is: NULL in the exact mode. */
static inline const fe_q8_ctx *fe_session_q8(const struct ferry_session *s) { return s->q8.k ? &s->q8 : NULL; }

/* Largest record of any bank (the expert buffer a session needs). */
uint64_t fe_max_record(const fe_container *c);

/* Report a stage to the session's observer, if any. */
/* The embedding rows of n tokens, dequantized into out[i * dim]: from the
 * resident table, or, when it is on demand (emb->data NULL, the engine's
 * default for an untied table), each row read from trunk.bin into tmp (n *
 * dim floats the caller has free; a stored row never exceeds dim floats).
 * The same bytes either way, so the same values. */
ferry_status fe_embed(const struct ferry_engine *e, const fe_mat *emb, const int32_t *tokens, int n, float *out,
                      float *tmp, ferry_error *err);
void fe_stage(struct ferry_session *s, int stage, int n, const float *hidden);
/* After fe_embed of a chunk of n tokens into x [n][dim]: the rows the caller
 * gave instead (ferry_session_eval_embd) replace their tokens' rows. */
void fe_embed_override(const struct ferry_session *s, int n, float *x);

/* Lookup helpers for bind(): a matrix of the given shape (any format), or a
 * vector that must be f32 (optional ones may be absent: *v = NULL). */
ferry_status fe_bind_mat(const fe_container *c, const char *name, int rows, int cols, fe_mat *m,
                         ferry_error *err);
ferry_status fe_bind_vec(const fe_container *c, const char *name, int n, int optional, const float **v,
                         ferry_error *err);

#endif
