/* cache_policy_impl.h: the layout of an fe_cache_policy, shared by the two
 * files that implement it (internal; callers use cache_policy.h).
 *
 * cache_policy.c holds the object, the visit protocol and the score
 * policies (REUSE, ECHO and TRANSIT, the engine's: one learned model, the
 * first two its ablations). Every other kind, the classic policies and
 * Belady's OPT that only the simulator replays (ferry_cachesim.h), lives in
 * cachesim_policies.c behind the fe_sim_policy_* hooks below, with its state
 * in an fe_sim_policy of its own.
 */
#ifndef FERRY_CACHE_POLICY_IMPL_H
#define FERRY_CACHE_POLICY_IMPL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "cache_policy.h"

enum { NONE = -1 };

typedef struct reuse_model reuse_model;   /* the score policies' state (cache_policy.c) */
typedef struct fe_sim_policy fe_sim_policy; /* the other kinds' state (cachesim_policies.c) */

struct fe_cache_policy {
    int kind;                  /* FERRY_CACHE_POLICY_* or FE_CACHE_POLICY_OPT */
    int n_slots;               /* records the caller's pool holds */
    int n_layers;              /* MoE layers */
    int n_experts;             /* experts per layer */
    int32_t n_keys;            /* n_layers * n_experts */
    int32_t *slot_key;         /* per slot: key it holds, NONE if empty */
    int32_t *key_slot;         /* per key: slot holding it, NONE if absent */
    int32_t *free_slots;       /* the empty slots, in any order */
    int32_t *free_pos;         /* per slot: index in free_slots, NONE if used */
    int n_free;                /* entries of free_slots in use */
    int32_t *layer_resident;   /* per layer: resident keys */
    uint32_t *uses;            /* per key: requests, loaded counts included */
    uint64_t *set_step;        /* per key: visit of its last request, 0 none */
    uint64_t step;             /* visits opened so far (the open one's number) */
    bool open;                 /* a visit is between begin and end_layer */
    int cur_layer;             /* layer of the open or last visit */
    int cur_n;                 /* keys in cur_set */
    int32_t *cur_set;          /* keys of the open visit; capacity n_slots */
    int32_t *scratch;          /* n_slots keys for duplicate checks */
    fe_cache_counters counters; /* hits, misses, evictions */
    reuse_model *reuse;        /* REUSE, ECHO, TRANSIT; NULL otherwise */
    fe_sim_policy *sim;        /* every other kind; NULL for the score ones */
};

/* The score policies (REUSE, ECHO, TRANSIT): the ones cache_policy.c runs
 * itself. */
static inline bool fe_policy_is_score(int kind)
{
    return kind == FERRY_CACHE_POLICY_REUSE || kind == FERRY_CACHE_POLICY_ECHO ||
           kind == FERRY_CACHE_POLICY_TRANSIT;
}

static inline bool fe_policy_pinned(const fe_cache_policy *p, int32_t key)
{
    return p->open && p->set_step[key] == p->step;
}

static inline int fe_policy_layer_of(const fe_cache_policy *p, int32_t key)
{
    return key / p->n_experts;
}

/* What a constructor has allocated so far: whether every allocation
 * succeeded, and the bytes asked for (checked against fe_cache_policy_bytes). */
typedef struct fe_alloc_acc {
    bool ok;
    uint64_t bytes;
} fe_alloc_acc;

/* Bytes fe_alloc_array asks for: count (at least 1) elements of size bytes. */
static inline uint64_t fe_array_bytes(size_t count, size_t size)
{
    return (uint64_t)(count ? count : 1) * (uint64_t)size;
}

static inline void *fe_alloc_array(size_t count, size_t size, fe_alloc_acc *acc)
{
    void *mem = calloc(count ? count : 1, size);
    if (!mem) acc->ok = false;
    acc->bytes += fe_array_bytes(count, size);
    return mem;
}

static inline void fe_fill_none(int32_t *a, size_t n)
{
    for (size_t i = 0; i < n; i++) a[i] = NONE;
}

/* Size of one element of array member m of struct type t. */
#define FE_ELEM(t, m) sizeof(((t *)0)->m[0])

/* ---- the simulator's kinds (cachesim_policies.c) ------------------------
 * Called by cache_policy.c for a kind that is not a score policy, at the
 * matching step of the protocol (cache_policy.h). */

/* Bytes fe_sim_policy_create allocates for this kind and shape. */
uint64_t fe_sim_policy_bytes(int kind, size_t slots, size_t layers, size_t experts);
/* Allocates p->sim for p->kind (p's common arrays exist); false on failure
 * (p->sim is then freed by fe_sim_policy_destroy with p). */
bool fe_sim_policy_create(fe_cache_policy *p, fe_alloc_acc *acc);
/* NULL is allowed. */
void fe_sim_policy_destroy(fe_sim_policy *s);
/* begin_layer, before the set's requests are counted (set_step still holds
 * each key's previous request): takes the set out of the eviction order. */
void fe_sim_policy_begin(fe_cache_policy *p);
/* end_layer: puts the set's resident keys back into the eviction order. */
void fe_sim_policy_end(fe_cache_policy *p);
/* The key to evict (resident, unpinned), NONE when there is none. */
int32_t fe_sim_policy_victim(fe_cache_policy *p);
/* p->uses was replaced (load_counts, load_state). */
void fe_sim_policy_counts_loaded(fe_cache_policy *p);
/* FE_CACHE_POLICY_OPT: the next visit requesting key. */
void fe_sim_policy_set_next_use(fe_cache_policy *p, int32_t key, uint64_t next_use);

#endif
