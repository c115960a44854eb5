/* cachesim_policies.c: the cache policies only the simulator replays
 * (ferry_cachesim.h, docs/CACHE_POLICY.md): the classic online ones (LRU,
 * LFU, LFU_LRU, LFU_AGING, LRU2, GDSF on a heap of priorities; 2Q and ARC
 * on lists; LAYER_LRU, one list per layer) and Belady's offline optimum
 * (FE_CACHE_POLICY_OPT), measured against the engine's policy. The object,
 * the visit protocol and the engine's policy are in cache_policy.c, which
 * calls the fe_sim_policy_* hooks (cache_policy_impl.h) for these kinds.
 *
 * Every structure is indexed by key = layer * n_experts + expert. While a
 * visit is open its keys are out of the eviction structure (removed from
 * the heap or unlinked from the lists) and come back at end_layer with
 * their updated state.
 */
#include "cache_policy_impl.h"

#include <stdlib.h>
#include <string.h>

enum {
    AGING_TOKENS = 16,  /* LFU_AGING halves its counts every 16 tokens */
    ARC_T1 = 0, ARC_T2, ARC_B1, ARC_B2, ARC_LISTS,    /* ARC's four lists */
    TWOQ_IN = 0, TWOQ_OUT, TWOQ_MAIN, TWOQ_LISTS,     /* 2Q's three lists */
    DEST_STAY = -1      /* 2Q: a hit in the FIFO keeps its place */
};

typedef enum family {
    FAMILY_HEAP,  /* LRU, LFU*, LRU2, GDSF, OPT: a priority per key */
    FAMILY_ARC,   /* ARC lists */
    FAMILY_TWOQ,  /* 2Q lists */
    FAMILY_LAYER  /* one LRU list per layer */
} family;

/* One heap entry: ordered by (a, b), smallest first. */
typedef struct heap_node {
    uint64_t a;  /* primary priority */
    uint64_t b;  /* tie-break */
    int32_t key; /* the key this entry stands for */
} heap_node;

/* Binary min-heap of resident, unpinned keys. */
typedef struct key_heap {
    heap_node *node; /* node[0] is the minimum; capacity n_slots */
    int32_t *pos;    /* per key: index in node[], NONE when absent */
    int size;        /* entries in node[] */
} key_heap;

/* Intrusive doubly linked lists over keys; a key is in at most one. */
typedef struct key_lists {
    int32_t *prev;  /* per key: neighbour toward the head (MRU), NONE at end */
    int32_t *next;  /* per key: neighbour toward the tail (LRU), NONE at end */
    int32_t *owner; /* per key: list holding it, NONE for none */
    int32_t *head;  /* per list: most recent key, NONE if empty */
    int32_t *tail;  /* per list: least recent key, NONE if empty */
    int32_t *size;  /* per list: number of keys */
} key_lists;

struct fe_sim_policy {
    family fam;                /* how the kind keeps its eviction order */
    key_heap heap;             /* FAMILY_HEAP order */
    key_lists lists;           /* ARC, 2Q, LAYER lists */
    int8_t *cur_dest;          /* ARC, 2Q: list each cur_set key joins at end */
    int arc_target;            /* ARC: adaptive target size of T1 */
    uint64_t *prev_step;       /* LRU2: per key, visit of the request before
                                  the last, 0 none */
    uint32_t *aged;            /* LFU_AGING: per key, periodically halved count */
    uint64_t clock;            /* GDSF: priority of the latest victim */
    uint64_t *next_use;        /* OPT: per key, next visit requesting it */
};

static family family_of(int kind)
{
    switch (kind) {
    case FERRY_CACHE_POLICY_ARC: return FAMILY_ARC;
    case FERRY_CACHE_POLICY_TWOQ: return FAMILY_TWOQ;
    case FERRY_CACHE_POLICY_LAYER_LRU: return FAMILY_LAYER;
    default: return FAMILY_HEAP;
    }
}

/* ---- key heap --------------------------------------------------------- */

static bool node_less(const heap_node *x, const heap_node *y)
{
    return x->a < y->a || (x->a == y->a && x->b < y->b);
}

static void heap_set(key_heap *h, int i, heap_node n)
{
    h->node[i] = n;
    h->pos[n.key] = i;
}

static void heap_sift_up(key_heap *h, int i)
{
    heap_node n = h->node[i];
    while (i > 0) {
        int parent = (i - 1) / 2;
        if (!node_less(&n, &h->node[parent])) break;
        heap_set(h, i, h->node[parent]);
        i = parent;
    }
    heap_set(h, i, n);
}

static void heap_sift_down(key_heap *h, int i)
{
    heap_node n = h->node[i];
    for (;;) {
        int child = 2 * i + 1;
        if (child >= h->size) break;
        if (child + 1 < h->size && node_less(&h->node[child + 1], &h->node[child]))
            child++;
        if (!node_less(&h->node[child], &n)) break;
        heap_set(h, i, h->node[child]);
        i = child;
    }
    heap_set(h, i, n);
}

static void heap_push(key_heap *h, heap_node n)
{
    heap_set(h, h->size++, n);
    heap_sift_up(h, h->size - 1);
}

static void heap_remove(key_heap *h, int32_t key)
{
    int i = h->pos[key];
    if (i == NONE) return;
    h->pos[key] = NONE;
    if (--h->size == i) return;
    heap_set(h, i, h->node[h->size]);
    if (i > 0 && node_less(&h->node[i], &h->node[(i - 1) / 2])) heap_sift_up(h, i);
    else heap_sift_down(h, i);
}

static void heap_rebuild(key_heap *h)
{
    for (int i = h->size / 2 - 1; i >= 0; i--) heap_sift_down(h, i);
}

/* The priority a key re-enters the heap with; the minimum is evicted. */
static heap_node heap_entry(const fe_cache_policy *p, int32_t key)
{
    heap_node n = {0, (uint64_t)key, key};
    switch (p->kind) {
    case FERRY_CACHE_POLICY_LRU:
        n.a = p->set_step[key];
        break;
    case FERRY_CACHE_POLICY_LFU:
        n.a = p->uses[key];
        break;
    case FERRY_CACHE_POLICY_LFU_LRU:
        n.a = p->uses[key];
        n.b = p->set_step[key];
        break;
    case FERRY_CACHE_POLICY_LFU_AGING:
        n.a = p->sim->aged[key];
        n.b = p->set_step[key];
        break;
    case FERRY_CACHE_POLICY_LRU2:
        n.a = p->sim->prev_step[key];
        n.b = p->set_step[key];
        break;
    case FERRY_CACHE_POLICY_GDSF:
        n.a = p->sim->clock + p->uses[key];
        n.b = p->set_step[key];
        break;
    default: /* OPT: farthest next use first */
        n.a = UINT64_MAX - p->sim->next_use[key];
        break;
    }
    return n;
}

/* ---- key lists -------------------------------------------------------- */

static void list_unlink(key_lists *l, int32_t key)
{
    int list = l->owner[key];
    if (list == NONE) return;
    int32_t prev = l->prev[key], next = l->next[key];
    if (prev == NONE) l->head[list] = next; else l->next[prev] = next;
    if (next == NONE) l->tail[list] = prev; else l->prev[next] = prev;
    l->owner[key] = NONE;
    l->size[list]--;
}

static void list_push_head(key_lists *l, int list, int32_t key)
{
    int32_t old = l->head[list];
    l->prev[key] = NONE;
    l->next[key] = old;
    if (old == NONE) l->tail[list] = key; else l->prev[old] = key;
    l->head[list] = key;
    l->owner[key] = list;
    l->size[list]++;
}

/* The least recent key of the list that is not pinned, NONE if none. */
static int32_t list_last_unpinned(const fe_cache_policy *p, int list)
{
    int32_t key = p->sim->lists.tail[list];
    while (key != NONE && fe_policy_pinned(p, key)) key = p->sim->lists.prev[key];
    return key;
}

/* ---- per-family pinning, eviction and re-entry ------------------------ */

static void lfu_age(fe_cache_policy *p)
{
    for (int32_t key = 0; key < p->n_keys; key++) p->sim->aged[key] /= 2;
    for (int i = 0; i < p->sim->heap.size; i++) p->sim->heap.node[i].a /= 2;
    heap_rebuild(&p->sim->heap);
}

static void arc_adapt(fe_cache_policy *p, int ghost_list)
{
    const int32_t *size = p->sim->lists.size;
    int other = ghost_list == ARC_B1 ? ARC_B2 : ARC_B1;
    int delta = size[ghost_list] >= size[other] ? 1 : size[other] / size[ghost_list];
    if (ghost_list == ARC_B1)
        p->sim->arc_target = p->sim->arc_target + delta < p->n_slots ? p->sim->arc_target + delta : p->n_slots;
    else
        p->sim->arc_target = p->sim->arc_target > delta ? p->sim->arc_target - delta : 0;
}

/* ARC and 2Q: take the set's keys out of the lists, noting where each
 * goes at end_layer. */
static void lists_begin(fe_cache_policy *p)
{
    key_lists *l = &p->sim->lists;
    for (int i = 0; i < p->cur_n; i++) {
        int32_t key = p->cur_set[i];
        int owner = l->owner[key];
        if (p->sim->fam == FAMILY_ARC) {
            if (owner == ARC_B1 || owner == ARC_B2) arc_adapt(p, owner);
            p->sim->cur_dest[i] = (int8_t)(owner == NONE ? ARC_T1 : ARC_T2);
        } else if (owner == TWOQ_IN) {
            p->sim->cur_dest[i] = DEST_STAY;
            continue;
        } else {
            p->sim->cur_dest[i] = (int8_t)(owner == NONE ? TWOQ_IN : TWOQ_MAIN);
        }
        list_unlink(l, key);
    }
}

void fe_sim_policy_begin(fe_cache_policy *p)
{
    switch (p->sim->fam) {
    case FAMILY_HEAP:
        if (p->kind == FERRY_CACHE_POLICY_LFU_AGING &&
            p->step % ((uint64_t)AGING_TOKENS * (uint64_t)p->n_layers) == 0)
            lfu_age(p);
        for (int i = 0; i < p->cur_n; i++) heap_remove(&p->sim->heap, p->cur_set[i]);
        if (p->sim->next_use)
            for (int i = 0; i < p->cur_n; i++) p->sim->next_use[p->cur_set[i]] = UINT64_MAX;
        break;
    case FAMILY_ARC:
    case FAMILY_TWOQ:
        lists_begin(p);
        break;
    case FAMILY_LAYER:
        for (int i = 0; i < p->cur_n; i++) list_unlink(&p->sim->lists, p->cur_set[i]);
        break;
    }
    /* LRU2's and LFU_AGING's share of counting the requests (set_step still
     * holds each key's previous request). */
    for (int i = 0; i < p->cur_n; i++) {
        int32_t key = p->cur_set[i];
        if (p->sim->prev_step) p->sim->prev_step[key] = p->set_step[key];
        if (p->sim->aged && p->sim->aged[key] < UINT32_MAX) p->sim->aged[key]++;
    }
}

static void ghost_trim(key_lists *l, int list, int32_t limit)
{
    while (l->size[list] > limit) list_unlink(l, l->tail[list]);
}

/* Puts the set's resident keys back into the eviction order. */
void fe_sim_policy_end(fe_cache_policy *p)
{
    key_lists *l = &p->sim->lists;
    for (int i = 0; i < p->cur_n; i++) {
        int32_t key = p->cur_set[i];
        if (p->key_slot[key] == NONE) continue;
        switch (p->sim->fam) {
        case FAMILY_HEAP: heap_push(&p->sim->heap, heap_entry(p, key)); break;
        case FAMILY_LAYER: list_push_head(l, p->cur_layer, key); break;
        case FAMILY_ARC:
        case FAMILY_TWOQ:
            if (p->sim->cur_dest[i] != DEST_STAY) list_push_head(l, p->sim->cur_dest[i], key);
            break;
        }
    }
    if (p->sim->fam == FAMILY_ARC) {
        const int32_t *s = l->size;
        ghost_trim(l, ARC_B1, p->n_slots - s[ARC_T1]);
        ghost_trim(l, ARC_B2, 2 * p->n_slots - s[ARC_T1] - s[ARC_T2] - s[ARC_B1]);
    }
}

static int32_t arc_victim(fe_cache_policy *p)
{
    key_lists *l = &p->sim->lists;
    int t1 = l->size[ARC_T1];
    bool from_t1 = t1 > 0 && (t1 > p->sim->arc_target || l->size[ARC_T2] == 0);
    int32_t key = l->tail[from_t1 ? ARC_T1 : ARC_T2];
    if (key != NONE) {
        list_unlink(l, key);
        list_push_head(l, from_t1 ? ARC_B1 : ARC_B2, key);
    }
    return key;
}

/* The FIFO's oldest while it is over a quarter of the cache (remembered
 * in the ghost list), else the main list's least recent. */
static int32_t twoq_victim(fe_cache_policy *p)
{
    key_lists *l = &p->sim->lists;
    int in_limit = p->n_slots / 4 > 1 ? p->n_slots / 4 : 1;
    int32_t key = l->size[TWOQ_IN] > in_limit ? list_last_unpinned(p, TWOQ_IN) : NONE;
    if (key == NONE) key = l->tail[TWOQ_MAIN];
    if (key == NONE) key = list_last_unpinned(p, TWOQ_IN);
    if (key == NONE) return NONE;
    bool probation = l->owner[key] == TWOQ_IN;
    list_unlink(l, key);
    if (probation) {
        list_push_head(l, TWOQ_OUT, key);
        ghost_trim(l, TWOQ_OUT, p->n_slots / 2 > 1 ? p->n_slots / 2 : 1);
    }
    return key;
}

/* The least recent key of the layer holding the most slots (ties: the
 * layer whose least recent key is older). */
static int32_t layer_victim(fe_cache_policy *p)
{
    key_lists *l = &p->sim->lists;
    int best = NONE;
    for (int layer = 0; layer < p->n_layers; layer++) {
        if (l->tail[layer] == NONE) continue;
        if (best == NONE || p->layer_resident[layer] > p->layer_resident[best] ||
            (p->layer_resident[layer] == p->layer_resident[best] &&
             p->set_step[l->tail[layer]] < p->set_step[l->tail[best]]))
            best = layer;
    }
    if (best == NONE) return NONE;
    int32_t key = l->tail[best];
    list_unlink(l, key);
    return key;
}

int32_t fe_sim_policy_victim(fe_cache_policy *p)
{
    switch (p->sim->fam) {
    case FAMILY_HEAP: {
        if (p->sim->heap.size == 0) return NONE;
        heap_node top = p->sim->heap.node[0];
        heap_remove(&p->sim->heap, top.key);
        if (p->kind == FERRY_CACHE_POLICY_GDSF) p->sim->clock = top.a;
        return top.key;
    }
    case FAMILY_ARC: return arc_victim(p);
    case FAMILY_TWOQ: return twoq_victim(p);
    default: return layer_victim(p);
    }
}

/* ---- memory and creation ----------------------------------------------- */

static uint64_t lists_bytes(size_t keys, size_t n_lists)
{
    return fe_array_bytes(keys, FE_ELEM(key_lists, prev)) + fe_array_bytes(keys, FE_ELEM(key_lists, next)) +
           fe_array_bytes(keys, FE_ELEM(key_lists, owner)) + fe_array_bytes(n_lists, FE_ELEM(key_lists, head)) +
           fe_array_bytes(n_lists, FE_ELEM(key_lists, tail)) + fe_array_bytes(n_lists, FE_ELEM(key_lists, size));
}

uint64_t fe_sim_policy_bytes(int kind, size_t slots, size_t layers, size_t experts)
{
    size_t keys = layers * experts;
    uint64_t n = fe_array_bytes(1, sizeof(fe_sim_policy));
    switch (family_of(kind)) {
    case FAMILY_HEAP:
        n += fe_array_bytes(slots, FE_ELEM(key_heap, node)) + fe_array_bytes(keys, FE_ELEM(key_heap, pos));
        if (kind == FERRY_CACHE_POLICY_LRU2) n += fe_array_bytes(keys, FE_ELEM(fe_sim_policy, prev_step));
        if (kind == FERRY_CACHE_POLICY_LFU_AGING) n += fe_array_bytes(keys, FE_ELEM(fe_sim_policy, aged));
        if (kind == FE_CACHE_POLICY_OPT) n += fe_array_bytes(keys, FE_ELEM(fe_sim_policy, next_use));
        return n;
    case FAMILY_ARC:
    case FAMILY_TWOQ:
        return n + fe_array_bytes(slots, FE_ELEM(fe_sim_policy, cur_dest)) +
               lists_bytes(keys, family_of(kind) == FAMILY_ARC ? ARC_LISTS : TWOQ_LISTS);
    default:
        return n + lists_bytes(keys, layers);
    }
}

static bool alloc_lists(key_lists *l, int32_t n_keys, int n_lists, fe_alloc_acc *acc)
{
    l->prev = fe_alloc_array((size_t)n_keys, sizeof *l->prev, acc);
    l->next = fe_alloc_array((size_t)n_keys, sizeof *l->next, acc);
    l->owner = fe_alloc_array((size_t)n_keys, sizeof *l->owner, acc);
    l->head = fe_alloc_array((size_t)n_lists, sizeof *l->head, acc);
    l->tail = fe_alloc_array((size_t)n_lists, sizeof *l->tail, acc);
    l->size = fe_alloc_array((size_t)n_lists, sizeof *l->size, acc);
    if (!acc->ok) return false;
    fe_fill_none(l->owner, (size_t)n_keys);
    fe_fill_none(l->head, (size_t)n_lists);
    fe_fill_none(l->tail, (size_t)n_lists);
    return true;
}

static void free_lists(key_lists *l)
{
    free(l->prev);
    free(l->next);
    free(l->owner);
    free(l->head);
    free(l->tail);
    free(l->size);
}

bool fe_sim_policy_create(fe_cache_policy *p, fe_alloc_acc *acc)
{
    fe_sim_policy *s = p->sim = fe_alloc_array(1, sizeof *s, acc);
    if (!s) return false;
    size_t keys = (size_t)p->n_keys;
    s->fam = family_of(p->kind);
    switch (s->fam) {
    case FAMILY_HEAP:
        s->heap.node = fe_alloc_array((size_t)p->n_slots, sizeof *s->heap.node, acc);
        s->heap.pos = fe_alloc_array(keys, sizeof *s->heap.pos, acc);
        if (s->heap.pos) fe_fill_none(s->heap.pos, keys);
        if (p->kind == FERRY_CACHE_POLICY_LRU2)
            s->prev_step = fe_alloc_array(keys, sizeof *s->prev_step, acc);
        if (p->kind == FERRY_CACHE_POLICY_LFU_AGING)
            s->aged = fe_alloc_array(keys, sizeof *s->aged, acc);
        if (p->kind == FE_CACHE_POLICY_OPT)
            s->next_use = fe_alloc_array(keys, sizeof *s->next_use, acc);
        return acc->ok;
    case FAMILY_ARC:
    case FAMILY_TWOQ:
        s->cur_dest = fe_alloc_array((size_t)p->n_slots, sizeof *s->cur_dest, acc);
        return acc->ok && alloc_lists(&s->lists, p->n_keys, s->fam == FAMILY_ARC ? ARC_LISTS : TWOQ_LISTS, acc);
    default:
        return alloc_lists(&s->lists, p->n_keys, p->n_layers, acc);
    }
}

void fe_sim_policy_destroy(fe_sim_policy *s)
{
    if (!s) return;
    free(s->heap.node);
    free(s->heap.pos);
    free_lists(&s->lists);
    free(s->cur_dest);
    free(s->prev_step);
    free(s->aged);
    free(s->next_use);
    free(s);
}

/* ---- counts ------------------------------------------------------------ */

void fe_sim_policy_counts_loaded(fe_cache_policy *p)
{
    if (p->sim->aged) memcpy(p->sim->aged, p->uses, (size_t)p->n_keys * sizeof *p->sim->aged);
}

void fe_sim_policy_set_next_use(fe_cache_policy *p, int32_t key, uint64_t next_use)
{
    p->sim->next_use[key] = next_use;
}

