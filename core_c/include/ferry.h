/*
 * ferry.h — the whole public boundary of Ferry's inference core.
 *
 * Two handles:
 *   ferry_engine   a loaded container: manifest, resident trunk weights, open
 *                  expert banks. Read-only after open; shared by sessions.
 *   ferry_session  one mutable timeline of tokens on an engine: attention
 *                  caches, position, scratch, statistics.
 *
 * Rules that hold for every function:
 *   - Nothing here prints, exits or aborts. Every fallible call returns a
 *     ferry_status and, when it is not FERRY_OK and `err` is non-NULL, fills
 *     the caller-owned ferry_error with the same code and a message meant for
 *     a person.
 *   - There is no global state: two engines never share anything.
 *   - Ownership: objects returned through `**out` belong to the caller and
 *     are released with the matching _close/_free. Pointers passed in are
 *     borrowed for the duration of the call only, unless stated otherwise.
 *   - An engine may serve several sessions, but one session must be used by
 *     one thread at a time. ferry_session_request_cancel is the exception: any
 *     thread may call it at any time.
 */
#ifndef FERRY_H
#define FERRY_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Result codes. */
typedef enum ferry_status {
    FERRY_OK = 0,
    FERRY_E_ARG = 1,          /* a bad argument from the caller */
    FERRY_E_IO = 2,           /* a read or open failed (the OS said no) */
    FERRY_E_FORMAT = 3,       /* a container file is malformed or damaged */
    FERRY_E_VERSION = 4,      /* a container of a version this core cannot read */
    FERRY_E_NOMEM = 5,        /* an allocation failed */
    FERRY_E_BUDGET = 6,       /* the RAM budget is below what is needed */
    FERRY_E_CANCELLED = 7,    /* ferry_session_request_cancel stopped the call */
    FERRY_E_CONTEXT = 8,      /* the tokens do not fit the session's context */
    FERRY_E_CHECKSUM = 9,     /* a CRC32 did not match (see ferry_verify) */
    FERRY_E_UNSUPPORTED = 10  /* valid input this core does not implement */
} ferry_status;

/* A caller-owned error report. */
typedef struct ferry_error {
    int code;            /* a ferry_status; FERRY_OK when nothing failed */
    char message[512];   /* NUL-terminated, human-readable */
} ferry_error;

/* The container format version this core reads. */
#define FERRY_FORMAT_VERSION 1

/* Switches of ferry_open_options.flags, for measurement and tests: each
 * mechanism changes speed, never output. */
#define FERRY_NO_DIRECT_IO 1  /* read expert records through the page cache */
#define FERRY_NO_OVERLAP 2    /* read misses one at a time, not while computing */
#define FERRY_NO_LOOKAHEAD 4  /* do not prefetch the next layer's predicted experts */
#define FERRY_NO_CACHE 8      /* forget every expert after its layer: read each use */
#define FERRY_NO_TRUNK_CHECK 16 /* skip the trunk's CRC32 check on open (to measure its cost only) */
#define FERRY_NO_LOOKAHEAD_GATE 32 /* read every lookahead prediction, however often they miss (to measure the gate) */
/* By default a token embedding table the output head does not share stays on
 * disk: each token's row is read from trunk.bin (docs/ARCHITECTURE.md, "Memory"). */
#define FERRY_NO_EMBEDDING_READS 64 /* keep the token embedding table in RAM */
#define FERRY_NO_FILL 128 /* do not read every expert into a cache that holds them all at open (read on first use) */

/* The expert readers' largest queue depth when n_readers is 0 (the depth in
 * use is measured at run time between 1 and n_readers: io.h; the disk probe,
 * app/memory/disk_probe.py, reads with the same number of threads). 8: an
 * Apple SSD needs a deep queue (8 threads of direct reads gave the public
 * streaming engine its 12.78 GiB/s on an M5 Pro), and on the 2-core test
 * machine 8 decoded no slower than 4 (docs/bench-log/2026-12-06.md, session 17). */
#define FERRY_DEFAULT_READERS 8

/* Options for ferry_engine_open. Initialise with ferry_open_options_init. */
typedef struct ferry_open_options {
    uint64_t ram_budget;  /* bytes the core may allocate in all; 0 = unlimited */
    int n_threads;        /* compute threads; 0 = one per online CPU (max 64) */
    int verify_reads;     /* nonzero: check each expert record's CRC32 when its read
                           * completes; a mismatch fails that eval with
                           * FERRY_E_CHECKSUM naming the layer, expert and file
                           * (the session stays usable). The trunk's CRC32s are
                           * always checked on open. */
    int n_ctx;            /* context the budget must leave room for; 0 = min(4096, max_ctx) */
    int cache_slots;      /* expert records to cache; 0 = as many as the budget allows */
    int n_readers;        /* reader threads; 0 = FERRY_DEFAULT_READERS */
    int flags;            /* FERRY_NO_* switches */
    const uint32_t *usage_counts; /* hot list from ferry_engine_usage of an earlier run, or NULL */
    size_t n_usage_counts;        /* its length: n_layers * n_experts */
    /* The matrix-product kernels this engine uses: NULL or "auto" = the best
     * this CPU supports, or "scalar" (the reference), "avx2" (x86-64 with
     * AVX2, FMA and F16C), "neon" (aarch64). A set this build or CPU cannot
     * run is refused with FERRY_E_UNSUPPORTED, an unknown name with
     * FERRY_E_ARG. The core reads no environment variable for this. */
    const char *kernels;
    /* The expert-cache policy's learned state from ferry_engine_policy_state
     * of an earlier run of this model (a superset of usage_counts, which it
     * replaces where both are given), or NULL. One that does not fit this
     * model or is damaged fails the open with FERRY_E_ARG. */
    const void *policy_state;
    size_t n_policy_state; /* its length in bytes */
    /* How matrix products treat their input vectors. NULL, "" or "auto"
     * (the default): each token's input is quantized to 8 bits per block of
     * 32 values (per 256 for K-quant weights; a float scale per block) once
     * per product, and q8_0, q4_0, q4_1, q4_k, q5_k, q6_k, q3_nl and iq4_xs weights are
     * multiplied with integer dot products (other formats stay exact), when
     * the kernel set has those products and the model has such weights;
     * otherwise the exact path. On models with KDA layers (Kimi-Linear,
     * K3) "auto" takes them on the classes of products measured safe only
     * and runs the others exact (arch_kimi.c, KIMI_LINEAR_AUTO_Q8 /
     * K3_AUTO_Q8). "exact" (alias "f32"): the stored weights
     * times the exact f32 activations. "q8": as auto, but a kernel set
     * without integer products is refused (FERRY_E_UNSUPPORTED). Outputs of
     * the 8-bit mode differ slightly from exact (docs/QUANTIZATION.md); every
     * kernel set gives bit-identical results in each mode. Unknown names:
     * FERRY_E_ARG. ferry_model_info.activations says which path runs. */
    const char *activations;
    /* Tokens of a prompt one forward pass evaluates together; 0 = the core's
     * choice: 128 for a model with mixture-of-experts layers (each distinct
     * expert a chunk routes to is read once and multiplied with all of its
     * tokens together: fewer rereads when the cache is small), 32 otherwise; at most 512 (larger values are
     * clamped). Outputs do not depend on it; a larger chunk takes more
     * session scratch (ferry_memory_plan.scratch_bytes).
     * ferry_model_info.prompt_chunk says what is in force. */
    int prompt_chunk;
} ferry_open_options;

/* What a loaded model is. Filled by ferry_engine_info. */
typedef struct ferry_model_info {
    char arch[32];            /* the family the core runs, e.g. "llama" */
    int n_layers;             /* transformer blocks */
    int dim;                  /* residual width */
    int n_heads;              /* query heads */
    int n_kv_heads;           /* key/value heads (GQA) */
    int head_dim;             /* width of one head */
    int vocab;                /* rows of the output projection */
    int max_ctx;              /* longest context the model was trained for */
    int n_moe_layers;         /* layers whose feed-forward is a mixture of experts */
    int n_experts;            /* experts per MoE layer (0 if none) */
    int top_k;                /* experts chosen per token (0 if none) */
    uint64_t trunk_bytes;     /* resident weights held in RAM */
    uint64_t expert_bytes;    /* bytes of one expert record on disk (0 if none) */
    int n_threads;            /* compute threads actually in use */
    int direct_io;            /* expert reads bypass the page cache */
    char io_note[160];        /* why direct I/O is off, when it is */
    int cache_slots;          /* expert records the cache holds */
    uint64_t ram_budget;      /* the budget in force (0 = unlimited) */
    char kernels[16];         /* the kernel set in use: "scalar", "avx2" or "neon"; in the q8 mode its integer products' ("avx512vnni" on an AVX-512 VNNI CPU) */
    char activations[8];      /* the path that runs: "f32" (exact) or "q8" (8-bit activations; ferry_open_options.activations) */
    int prompt_chunk;         /* tokens a prompt's forward pass evaluates together (ferry_open_options.prompt_chunk) */
} ferry_model_info;

/* Counters of one session. Times are wall-clock seconds. */
typedef struct ferry_stats {
    uint64_t prompt_tokens;   /* tokens evaluated in batches of more than one */
    uint64_t decode_tokens;   /* tokens evaluated one at a time */
    double prompt_seconds;    /* time spent on prompt_tokens */
    double decode_seconds;    /* time spent on decode_tokens */
    uint64_t expert_reads;    /* expert records read from disk (unused lookahead reads included) */
    uint64_t bytes_read;      /* bytes of those reads */
    double read_seconds;      /* time spent inside those reads */
    double compute_seconds;   /* time in eval not spent reading */
    uint64_t hits;            /* expert uses served from RAM */
    uint64_t misses;          /* expert uses that needed a read */
    uint64_t decode_hits;     /* hits during single-token steps */
    uint64_t decode_misses;   /* misses during single-token steps */
    uint64_t prefetch_issued; /* records the lookahead started reading */
    uint64_t prefetch_used;   /* of those, records the next layer did use */
    uint64_t prefetch_wasted; /* of those, records it did not */
    uint64_t lookahead_predicted; /* experts the lookahead router predicted */
    uint64_t lookahead_correct;   /* of those, experts the real router chose */
    double stall_seconds;     /* time compute waited for reads */
    uint64_t routed_choices;  /* expert choices the routers made (tokens x experts per token x MoE layers) */
    uint64_t routed_swaps;    /* of those, choices cache-aware routing moved to an expert in RAM */
    uint64_t prefetch_gated;  /* lookahead predictions not in RAM that were not read: their layer and
                                 rank's recent precision was too low (ferry_engine_lookahead_gate) */
    uint64_t lookahead_skipped; /* decode steps x layers whose lookahead did not run: idle there (it had
                                   nothing to read lately: predictions in RAM or gated), between probes */
} ferry_stats;

/* Where an evaluation's time went, per stage (opt-in per session with
 * ferry_session_set_profiling; off by default, when the core reads no clock
 * beyond ferry_stats'). One part for single-token steps, one for prompt
 * chunks. Times are wall-clock seconds on the calling thread; matrix
 * products and attention include the calling thread's wait for the other
 * compute threads at the end of each parallel job, which pool_wait_seconds
 * also counts on its own. */
#define FERRY_PROFILE_FORMATS 16
typedef struct ferry_profile_part {
    uint64_t evals;               /* forward passes (chunks of at most ferry_model_info.prompt_chunk tokens) */
    uint64_t tokens;              /* tokens they evaluated */
    double total_seconds;         /* wall time of those passes */
    double matmul_seconds[16]; /* = FERRY_PROFILE_FORMATS: matrix products by weight format (ferry_format_code) */
    uint64_t matmul_calls[16];
    uint64_t matmul_bytes[16]; /* weight bytes those products read */
    double attention_seconds;     /* biases, q/k norms, RoPE, KV-cache writes, scores, softmax, weighted sums */
    double norm_seconds;          /* RMSNorms of the residual stream */
    double elementwise_seconds;   /* embedding rows, activations (SiLU x up), residual adds */
    double expert_seconds;        /* routed experts of the MoE layers (every architecture): the router's
                                     products, the three parts below, nothing else (shared experts and
                                     K3's latent projections are in matmul_seconds only) */
    double pool_wait_seconds;     /* the caller waiting for the other threads at the end of parallel jobs */
    uint64_t pool_jobs;           /* parallel jobs dispatched to the thread pool */
    /* expert_seconds less the router's products (this layer's and the lookahead's), in three parts: */
    double expert_ffn_seconds;    /* the experts' feed-forward (also in matmul_seconds, elementwise_seconds) */
    double expert_wait_seconds;   /* waiting for expert reads (ferry_stats.stall_seconds of these passes) */
    double dispatch_seconds;      /* the rest, the expert dispatch's own work: routing (not the router's
                                     product), collecting the distinct experts, the cache visit, the
                                     lookahead's routing and read requests, moving rows, the weighted sum */
    uint64_t moe_layers;          /* MoE layer passes (one per MoE layer per forward pass) */
    uint64_t pool_spin_jobs;      /* of those, jobs run while idle threads spin before sleeping (a quiet
                                     machine); the others ran with spinning backed off (oversubscribed) */
    uint64_t pool_backoffs;       /* times the pool saw an oversubscribed machine and backed off */
} ferry_profile_part;

typedef struct ferry_profile {
    ferry_profile_part decode;    /* single-token steps */
    ferry_profile_part prompt;    /* chunks of more than one token */
} ferry_profile;

/* RAM a session needs at a context length, and what it is made of. */
typedef struct ferry_memory_plan {
    uint64_t trunk_bytes;     /* resident weights */
    uint64_t state_bytes;     /* attention caches at the context asked for */
    uint64_t scratch_bytes;   /* activations and buffers for one prompt chunk */
    uint64_t expert_bytes;    /* the expert cache and prefetch buffers in force */
    uint64_t policy_bytes;    /* the cache policy's own state for those slots (ferry_cache_policy_bytes) */
    uint64_t total_bytes;     /* the sum of the five above */
    uint64_t floor_bytes;     /* the least budget that runs: trunk, state, scratch, minimum cache
                                 and the policy state for it */
    uint64_t record_bytes;    /* one expert record */
    uint64_t token_set_bytes; /* one token's expert working set: records of top_k x MoE layers */
    uint64_t policy_floor_bytes; /* of floor_bytes, the policy state for the minimum cache */
    uint64_t q8_bytes;        /* the scratch 8-bit activations add to a session (part of scratch_bytes
                                 when the engine uses them; ferry_container_plan counts it out; 0 for a
                                 model without weights they apply to) */
    uint64_t n_ctx;           /* the context planned for: the one asked for, or the model's trained
                                 length when that was 0 or longer */
} ferry_memory_plan;

typedef struct ferry_engine ferry_engine;
typedef struct ferry_session ferry_session;

/* Called by an evaluation after each stage of the forward pass with the
 * residual stream of the tokens in the current chunk. stage 0 is the token
 * embedding, stage i (1..n_layers) the output of block i-1, stage n_layers+1
 * the final-normed hidden state. `hidden` holds n_tokens rows of `dim` floats
 * for positions pos..pos+n_tokens-1, valid only during the call. */
typedef void (*ferry_stage_fn)(void *user, int stage, int pos, int n_tokens,
                               int dim, const float *hidden);

/* Called by ferry_verify after each checked item: done and total count
 * items (trunk tensors plus expert records). Return nonzero to stop. */
typedef int (*ferry_progress_fn)(void *user, uint64_t done, uint64_t total);

void ferry_open_options_init(ferry_open_options *opts);

/* Open the container directory `path`. On success *out owns the engine. */
ferry_status ferry_engine_open(const char *path, const ferry_open_options *opts,
                               ferry_engine **out, ferry_error *err);
void ferry_engine_close(ferry_engine *engine);
void ferry_engine_info(const ferry_engine *engine, ferry_model_info *info);

/* Memory a session of n_ctx tokens needs on this engine. */
void ferry_engine_plan(const ferry_engine *engine, int n_ctx, ferry_memory_plan *plan);

/* The same plan read from a container's manifest alone, without loading
 * anything (for `ferry plan` and budget choices before opening). expert_bytes
 * is then what caching every expert would take. */
ferry_status ferry_container_plan(const char *path, int n_ctx, int n_threads, ferry_memory_plan *plan,
                                  ferry_error *err);

/* The expert usage counts so far (loaded hot list plus this run), for the
 * caller to save and pass back as ferry_open_options.usage_counts next time.
 * n must be n_layers * n_experts. */
ferry_status ferry_engine_usage(const ferry_engine *engine, uint32_t *counts, size_t n, ferry_error *err);

/* The expert-cache policy's learned state so far (usage counts, learned
 * reuse table, successor counts), for the caller to save and pass back as
 * ferry_open_options.policy_state next time: a session then starts from
 * what this one learned. *size gets the bytes it takes; with buf NULL
 * nothing else happens, else n must be *size. */
/* The lookahead gate: for each layer and rank of the lookahead's prediction,
 * the running share of its predictions not in RAM that the real router then
 * chose; a prediction is read only while this is at least 0.5 (it starts
 * at 0.4: closed until right twice running). n must be n_layers * top_k; precision is filled
 * layer by layer. Shared by the engine's sessions (like the cache). */
ferry_status ferry_engine_lookahead_gate(const ferry_engine *engine, float *precision, size_t n, ferry_error *err);
ferry_status ferry_engine_policy_state(const ferry_engine *engine, void *buf, size_t n, size_t *size,
                                       ferry_error *err);

/* Check the CRC32 of every trunk tensor and expert record of the container at
 * `path`. Returns FERRY_E_CHECKSUM naming the first bad item, or another
 * error for a container that cannot be read at all. `progress` may be NULL. */
ferry_status ferry_verify(const char *path, ferry_progress_fn progress, void *user,
                          ferry_error *err);

/* A new, empty timeline of at most n_ctx tokens (0 = the model's max_ctx).
 * Fails with FERRY_E_BUDGET when it would exceed the engine's RAM budget. */
ferry_status ferry_session_new(ferry_engine *engine, int n_ctx, ferry_session **out,
                               ferry_error *err);
void ferry_session_free(ferry_session *session);

/* Forget every token: position back to 0. Statistics are kept. */
void ferry_session_reset(ferry_session *session);
/* Keep only the first n_keep tokens (0 <= n_keep <= position). */
ferry_status ferry_session_truncate(ferry_session *session, int n_keep, ferry_error *err);
int ferry_session_position(const ferry_session *session);
int ferry_session_context(const ferry_session *session);

/* Evaluate n tokens at the current position and advance it by n.
 * logits: NULL, or room for `vocab` floats (the last token's logits) when
 * all_logits is 0, or n*vocab floats (every token's) when it is nonzero.
 * On any error (including cancellation) the position is unchanged and the
 * session stays usable. */
ferry_status ferry_session_eval(ferry_session *session, const int32_t *tokens, int n,
                                float *logits, int all_logits, ferry_error *err);

/* ferry_session_eval, with some positions' inputs given as vectors: where
 * use[i] is nonzero, row i of embd ([n][dim] floats, the model's residual
 * width) is the input of token i instead of its embedding row (an image's
 * positions: the vision tower's output). tokens[i] must still be a valid id. */
ferry_status ferry_session_eval_embd(ferry_session *session, const int32_t *tokens, const float *embd,
                                     const uint8_t *use, int n, float *logits, int all_logits, ferry_error *err);

/* Ask a running (or the next) ferry_session_eval to stop between layers.
 * Safe from any thread. The request is consumed by the eval it stops. */
void ferry_session_request_cancel(ferry_session *session);
void ferry_session_clear_cancel(ferry_session *session);

/* Session state, to save and restore a timeline (e.g. a processed document
 * prefix): ferry_session_state_size gives the bytes ferry_session_export
 * writes for the tokens now held; ferry_session_import restores them into a
 * session of the same engine (any context that holds them). The blob starts
 * with the container's fingerprint, so a blob from another model or a damaged
 * one is refused (FERRY_E_FORMAT) and the session is left as it was. The
 * caller stores the token ids beside it and encrypts it if it wants. */
uint64_t ferry_session_state_size(const ferry_session *session);
ferry_status ferry_session_export(const ferry_session *session, void *buf, uint64_t size, ferry_error *err);
ferry_status ferry_session_import(ferry_session *session, const void *buf, uint64_t size, ferry_error *err);

/* Observe the residual stream (for tests and tools); fn NULL turns it off. */
void ferry_session_set_stage_callback(ferry_session *session, ferry_stage_fn fn, void *user);

void ferry_session_stats(const ferry_session *session, ferry_stats *stats);

/* Routing modes that trade exactness for fewer expert reads; opt-in, off by
 * default, for this session's later evaluations:
 *   experts_per_token  route each token to its top N experts instead of the
 *                      model's top_k (1..top_k; 0 = top_k, exact). The N
 *                      weights are renormalised as the model renormalises its
 *                      k (models that do not renormalise: scaled to the weight
 *                      the k would carry).
 *   cache_aware_margin among experts whose router score is within this
 *                      margin of the last chosen one, prefer one already in
 *                      RAM (0 = exact). Softmax routers: a margin in
 *                      log-probability (logit) units; sigmoid routers
 *                      (DeepSeek-V3, Kimi): in sigmoid score units.
 * Both at 0 give output bit-identical to exact routing (and are accepted by
 * every model, dense ones too). FERRY_E_ARG for a value out of range, or a
 * mode asked of a model without experts. */
ferry_status ferry_session_set_routing(ferry_session *session, int experts_per_token, float cache_aware_margin,
                                       ferry_error *err);
/* Turn the per-stage profile on (nonzero) or off; either way its counters
 * restart from zero. Profiling changes timing only, never results. */
void ferry_session_set_profiling(ferry_session *session, int on);
/* The profile since profiling was last turned on (zeros when it is off). */
void ferry_session_profile(const ferry_session *session, ferry_profile *profile);

/* A short name for a status code, e.g. "FERRY_E_FORMAT". Never NULL. */
const char *ferry_status_name(int code);

#ifdef __cplusplus
}
#endif
#endif /* FERRY_H */
