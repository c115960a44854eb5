/* ferry_cachesim.h: replay a routing trace through Ferry's expert cache.
 *
 * A routing trace records, for every token and every MoE layer, the top_k
 * expert ids the router picked. The cache holds n_slots expert records in
 * total, across all layers; a key is (layer, expert). For each token the
 * layers are visited in order 0 .. n_layers-1 and each layer's top_k experts
 * are requested as one set: a request is a hit if its expert is resident when
 * the layer starts, otherwise the record is read and inserted, evicting
 * another key if the cache is full. The experts of the layer being computed
 * are pinned: they never evict each other.
 *
 * The trace is a dense int32 array [n_tokens][n_layers][top_k], owned by the
 * caller and only read. Every function here is reentrant: no global state.
 * Errors are negative FERRY_CACHE_E* codes with a message written to err
 * (NUL-terminated, truncated to err_len; err may be NULL when err_len is 0).
 */
#ifndef FERRY_CACHESIM_H
#define FERRY_CACHESIM_H

#include <stddef.h>
#include <stdint.h>

/* Replacement policies. All but the offline OPT are online: they see only
 * requests already made. FERRY_CACHE_POLICY_ENGINE names the one the engine
 * uses (same value as the policy it aliases). */
enum ferry_cache_policy_kind {
    FERRY_CACHE_POLICY_LRU = 0,       /* least recently requested */
    FERRY_CACHE_POLICY_LFU = 1,       /* fewest requests ever, ties by key id */
    FERRY_CACHE_POLICY_LFU_LRU = 2,   /* fewest requests, ties by recency */
    FERRY_CACHE_POLICY_LFU_AGING = 3, /* LFU_LRU with counts halved periodically */
    FERRY_CACHE_POLICY_LRU2 = 4,      /* LRU-K with K = 2 */
    FERRY_CACHE_POLICY_TWOQ = 5,      /* 2Q: FIFO probation, LRU main, ghosts */
    FERRY_CACHE_POLICY_ARC = 6,       /* adaptive replacement cache */
    FERRY_CACHE_POLICY_LAYER_LRU = 7, /* LRU inside the layer holding most slots */
    FERRY_CACHE_POLICY_GDSF = 8,      /* greedy-dual frequency, unit cost/size */
    FERRY_CACHE_POLICY_REUSE = 9,     /* learned reuse probability per slot-step */
    FERRY_CACHE_POLICY_ECHO = 10,     /* REUSE plus routing-history echo votes */
    FERRY_CACHE_POLICY_TRANSIT = 11,  /* ECHO with a learned expert-to-expert
                                         successor estimate for the share */
    FERRY_CACHE_POLICY_COUNT = 12,    /* number of online policies */
    FERRY_CACHE_POLICY_ENGINE = 11    /* the engine's choice: TRANSIT */
};

/* Status codes. */
enum ferry_cache_status {
    FERRY_CACHE_OK = 0,
    FERRY_CACHE_EINVAL = -1, /* an argument or trace entry is invalid */
    FERRY_CACHE_ENOMEM = -2, /* an allocation failed */
    FERRY_CACHE_ESTATE = -3  /* a call came out of order */
};

/* Outcome of one replay. */
typedef struct ferry_cachesim_result {
    uint64_t requests;  /* n_tokens * n_layers * top_k */
    uint64_t hits;      /* requests resident when their layer started */
    uint64_t misses;    /* requests - hits: records read */
    uint64_t evictions; /* resident records dropped to make room */
    double hit_rate;    /* hits / requests */
} ferry_cachesim_result;

/* Replays the trace through an online policy. prior_counts, if not NULL, is
 * the learned hot list: n_layers * experts_per_layer request counts indexed
 * layer * experts_per_layer + expert, from an earlier run. Requires
 * n_tokens >= 1, n_layers >= 1, 1 <= top_k <= experts_per_layer,
 * top_k <= n_slots, every id in [0, experts_per_layer) and no id twice in a
 * set. Returns FERRY_CACHE_OK and fills *out, or a negative code. */
int ferry_cache_simulate(const int32_t *trace, int n_tokens, int n_layers,
                         int top_k, int experts_per_layer, int n_slots,
                         int policy, const uint32_t *prior_counts,
                         ferry_cachesim_result *out, char *err, size_t err_len);

/* A second session that starts from what the first learned: replays tokens
 * 0 .. learn_tokens-1 through the policy, saves its learned state (usage
 * counts, learned reuse table, TRANSIT's successor counts; not the cache's
 * contents), then replays tokens learn_tokens .. n_tokens-1 through a new,
 * empty cache that loaded that state, and reports only that second replay.
 * Same arguments and checks as ferry_cache_simulate, plus
 * 1 <= learn_tokens < n_tokens. */
int ferry_cache_simulate_learned(const int32_t *trace, int n_tokens, int n_layers,
                                 int top_k, int experts_per_layer, int n_slots,
                                 int policy, int learn_tokens,
                                 ferry_cachesim_result *out, char *err, size_t err_len);

/* Replays the same trace under Belady's offline optimum (evict the
 * unpinned resident key whose next request is farthest away), with the same
 * pinning: the upper bound for every policy above. Same arguments and
 * checks as ferry_cache_simulate, without policy and prior. */
int ferry_cache_simulate_opt(const int32_t *trace, int n_tokens, int n_layers,
                             int top_k, int experts_per_layer, int n_slots,
                             ferry_cachesim_result *out, char *err,
                             size_t err_len);

/* RAM the policy's own state takes (its object, key maps, and whatever it
 * learns: TRANSIT's successor table is n_layers * experts_per_layer^2 * 2
 * bytes) for a cache of n_slots records; 0 for arguments it refuses. The
 * engine counts this in its RAM budget (ferry_memory_plan.policy_bytes). */
uint64_t ferry_cache_policy_bytes(int policy, int n_layers, int experts_per_layer, int n_slots);

#endif
