/* cache_policy.h: which expert record to evict, and the usage counts that
 * make the next session start warm.
 *
 * The policy maps keys (layer, expert) to slots, indices 0 .. n_slots-1 into
 * the caller's pool of equally sized record buffers. It never touches the
 * buffers; the caller reads records into the slots it is told to fill.
 *
 * Protocol, once per layer visit (layers visited cyclically in index order
 * for the best hit rate; any order stays correct):
 *
 *     fe_cache_policy_begin_layer(p, layer, experts, n);  // records n requests
 *     for each expert e of the set:
 *         slot = fe_cache_policy_lookup(p, layer, e);
 *         if (slot < 0) {
 *             slot = fe_cache_policy_choose_victim(p, NULL, NULL);
 *             ... read the record of (layer, e) into slot ...
 *             fe_cache_policy_insert(p, layer, e, slot);
 *         }
 *     fe_cache_policy_end_layer(p);
 *
 * Between begin_layer and end_layer the set's keys are pinned: no call
 * evicts them. A request is a hit when its key is resident at begin_layer.
 * All functions returning int return FERRY_CACHE_OK (or a slot, where said)
 * or a negative FERRY_CACHE_E* code; a failed call changes nothing.
 * An object is used by one thread at a time.
 */
#ifndef FERRY_CACHE_POLICY_H
#define FERRY_CACHE_POLICY_H

#include <stddef.h>
#include <stdint.h>

#include "ferry_cachesim.h"

/* Offline-only kind beside the public FERRY_CACHE_POLICY_* values: Belady's
 * optimum, fed each request's next use by fe_cache_policy_set_next_use. */
enum { FE_CACHE_POLICY_OPT = FERRY_CACHE_POLICY_COUNT };

typedef struct fe_cache_policy fe_cache_policy;

/* Totals since creation. */
typedef struct fe_cache_counters {
    uint64_t hits;      /* requested keys resident at begin_layer */
    uint64_t misses;    /* requested keys not resident at begin_layer */
    uint64_t evictions; /* keys removed by choose_victim */
} fe_cache_counters;

/* Creates an empty cache policy. kind is a FERRY_CACHE_POLICY_* value or
 * FE_CACHE_POLICY_OPT. Returns NULL and sets *err (if err is not NULL) to
 * FERRY_CACHE_EINVAL or FERRY_CACHE_ENOMEM on failure. The caller owns the
 * object and frees it with fe_cache_policy_destroy. */
fe_cache_policy *fe_cache_policy_create(int n_slots, int n_layers,
                                        int n_experts, int kind, int *err);

/* Bytes fe_cache_policy_create allocates for these arguments: the object
 * and every array it keeps, whatever the kind (the constructor checks its
 * own allocations against this, so the RAM budget cannot drift from them).
 * 0 for arguments create refuses. */
uint64_t fe_cache_policy_bytes(int kind, int n_slots, int n_layers, int n_experts);

/* Frees the object; NULL is allowed. */
void fe_cache_policy_destroy(fe_cache_policy *p);

/* Replaces the usage counts with a hot list saved by an earlier run:
 * n == n_layers * n_experts counts indexed layer * n_experts + expert. Only
 * before the first begin_layer (else FERRY_CACHE_ESTATE). The array stays
 * the caller's; it is copied. */
int fe_cache_policy_load_counts(fe_cache_policy *p, const uint32_t *counts,
                                size_t n);

/* Writes the usage counts (loaded plus recorded, saturating) into the
 * caller's array of n == n_layers * n_experts entries, for the caller to
 * persist beside the model. */
int fe_cache_policy_save_counts(const fe_cache_policy *p, uint32_t *counts,
                                size_t n);

/* The learned state, for a later session to start from where this one
 * stopped (a superset of the hot list): the usage counts, and for the
 * score policies (REUSE, ECHO, TRANSIT) the learned reuse table, and for
 * TRANSIT the successor counts. Not the cache's contents, recency or the
 * echo history: a new session starts with an empty cache and no tokens.
 * The blob starts with a header naming the kind and shape; it is plain
 * native-endian data for the caller to persist beside the model.
 * fe_cache_policy_state_bytes: its size for this object. */
uint64_t fe_cache_policy_state_bytes(const fe_cache_policy *p);

/* Writes the state into buf (n == fe_cache_policy_state_bytes(p), else
 * FERRY_CACHE_EINVAL). Allowed at any time outside an open visit. */
int fe_cache_policy_save_state(const fe_cache_policy *p, void *buf, size_t n);

/* Replaces the learned state with one saved by an object of the same kind,
 * n_layers and n_experts (n_slots may differ). Only before the first
 * begin_layer (else FERRY_CACHE_ESTATE). A blob of another size, kind or
 * shape, or whose counts are inconsistent, is FERRY_CACHE_EINVAL and
 * changes nothing. */
int fe_cache_policy_load_state(fe_cache_policy *p, const void *buf, size_t n);

/* Opens a layer visit requesting the n distinct experts in experts[]
 * (1 <= n <= n_slots; the array is copied). Counts each as a hit or a miss
 * and pins the set until end_layer. FERRY_CACHE_ESTATE if a visit is open. */
int fe_cache_policy_begin_layer(fe_cache_policy *p, int layer,
                                const int32_t *experts, int n);

/* Returns the slot holding (layer, expert), or -1 if it is not resident or
 * out of range. No side effect; allowed at any time. */
int fe_cache_policy_lookup(const fe_cache_policy *p, int layer, int expert);

/* Returns an empty slot for a miss of the open visit: a free one if any,
 * else the slot of the evicted key chosen by the policy, whose
 * (layer, expert) goes to *evicted_layer, *evicted_expert (each may be NULL;
 * they get -1 when no key was evicted). Calling it again before insert
 * returns the same slot without evicting more. FERRY_CACHE_ESTATE when no
 * visit is open or every slot holds a pinned key. */
int fe_cache_policy_choose_victim(fe_cache_policy *p, int *evicted_layer,
                                  int *evicted_expert);

/* Records that the caller filled the empty slot with (layer, expert), a
 * non-resident key of the open visit's set; it stays pinned until
 * end_layer. */
int fe_cache_policy_insert(fe_cache_policy *p, int layer, int expert,
                           int slot);

/* Lookahead: makes (layer, expert) resident ahead of its request, during an
 * open visit of another layer (whose set stays pinned). Returns the slot the
 * caller must fill, with *already = 0 (evicting a key chosen by the policy if
 * no slot is free), or the slot already holding the key with *already = 1.
 * No request is counted: when the key's layer is visited, it is a hit. Only
 * the score-based policies (REUSE, ECHO) support it (else FERRY_CACHE_EINVAL),
 * since the others rank keys only when they are requested. */
int fe_cache_policy_prefetch(fe_cache_policy *p, int layer, int expert,
                             int *already);

/* Fill ahead of any request, with no visit open: makes (layer, expert)
 * resident in a free slot and returns it (*already = 1 and its slot if it is
 * resident). Never evicts: FERRY_CACHE_ESTATE when no slot is free or a
 * visit is open. No request is counted. For filling a cache that holds every
 * expert right after it is created (experts.c). */
int fe_cache_policy_preload(fe_cache_policy *p, int layer, int expert,
                            int *already);

/* FE_CACHE_POLICY_OPT only: the visit number (0-based count of
 * begin_layer calls) at which (layer, expert), a key of the open visit,
 * is requested next; UINT64_MAX for never. Unset keys count as never. */
int fe_cache_policy_set_next_use(fe_cache_policy *p, int layer, int expert,
                                 uint64_t next_use);

/* Closes the open visit: unpins the set and updates the policy's state.
 * Keys of the set the caller did not insert stay non-resident. */
int fe_cache_policy_end_layer(fe_cache_policy *p);

/* Copies the counters into *out. */
void fe_cache_policy_counters(const fe_cache_policy *p,
                              fe_cache_counters *out);

#endif
