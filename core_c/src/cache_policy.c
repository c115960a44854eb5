/* cache_policy.c: expert-cache replacement policies (see cache_policy.h).
 *
 * Every structure is indexed by key = layer * n_experts + expert. Pinning
 * works the same way for every policy: while a visit is open its keys are
 * out of the eviction structure (removed from the heap, unlinked from the
 * lists, or skipped by the scan) and come back at end_layer with their
 * updated state. docs/CACHE_POLICY.md has the measurements behind each
 * constant below.
 */
#include "cache_policy.h"

#include <limits.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

enum {
    NONE = -1,
    AGING_TOKENS = 16,  /* LFU_AGING halves its counts every 16 tokens */
    ECHO_WINDOW = 128,  /* tokens of routing history ECHO matches against */
    GAP_BUCKETS = 8,    /* visits since last request: 1,2,3,4+,8+,16+,64+,never */
    SHARE_BUCKETS = 8,  /* request share vs uniform: <1/8 .. >=8, doubling;
                           TRANSIT: successor estimate, 8 buckets instead */
    VOTE_BUCKETS = 3,   /* echo vote: no match, match says no, match says yes */
    TABLE_CELLS = GAP_BUCKETS * SHARE_BUCKETS * VOTE_BUCKETS,
    ARC_T1 = 0, ARC_T2, ARC_B1, ARC_B2, ARC_LISTS,    /* ARC's four lists */
    TWOQ_IN = 0, TWOQ_OUT, TWOQ_MAIN, TWOQ_LISTS,     /* 2Q's three lists */
    DEST_STAY = -1      /* 2Q: a hit in the FIFO keeps its place */
};

static const double ECHO_DECAY = 0.5; /* weight of older layers in a match */
/* TRANSIT: lower edges of successor-estimate buckets 1..7 (bucket 0 below
 * 0.02, and also when the layer has no visit yet). Chosen once, a priori. */
static const double TRANSIT_EDGES[SHARE_BUCKETS - 1] = {0.02, 0.05, 0.1, 0.15, 0.2, 0.3, 0.45};

typedef enum family {
    FAMILY_HEAP,  /* LRU, LFU*, LRU2, GDSF, OPT: a priority per key */
    FAMILY_ARC,   /* ARC lists */
    FAMILY_TWOQ,  /* 2Q lists */
    FAMILY_LAYER, /* one LRU list per layer */
    FAMILY_SCORE  /* REUSE, ECHO: scores recomputed per visit */
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

/* State of the REUSE and ECHO policies: a table, learned online, of how
 * often a key with given features is requested at its layer's next visit. */
typedef struct reuse_model {
    uint32_t *last_visit;     /* per key: its layer's visit number at the last
                                 request, 0 if not requested yet */
    uint32_t *visits;         /* per layer: visits so far */
    uint64_t *layer_uses;     /* per layer: sum of uses[] over its experts */
    uint64_t seen[TABLE_CELLS]; /* per cell: keys observed at a visit */
    uint64_t used[TABLE_CELLS]; /* per cell: of those, keys requested */
    double probability[TABLE_CELLS]; /* per cell: (used + 1) / (seen + 2) */
    int32_t *victims;         /* slots to evict next, lowest score first;
                                 capacity n_slots */
    double *victim_score;     /* score of each victims[] entry */
    int n_victims;            /* entries in victims[] */
    int next_victim;          /* first victims[] entry not evicted yet */
    uint64_t victims_step;    /* visit victims[] was selected for, 0 none */
    int pos_layer;            /* layer of the latest visit, NONE before any */
    /* ECHO only; history is NULL for REUSE. */
    int words;                /* uint64 words per layer bitset */
    uint64_t *history;        /* [ECHO_WINDOW][n_layers][words] ring of the
                                 experts each token requested */
    double *similarity;       /* per ring entry: decayed overlap with the
                                 current token over the layers seen so far */
    int64_t tokens;           /* tokens started; the current is tokens - 1 */
    int64_t match;            /* past token most like the current, NONE */
    /* TRANSIT only; successors is NULL otherwise. */
    uint16_t *successors;     /* [layer][from][to]: visits of the layer that
                                 requested `to` right after a visit that
                                 requested `from` (row halved on saturation) */
    uint16_t *from_visits;    /* [layer][from]: visits of the layer that
                                 followed one requesting `from` */
    uint64_t *last_set;       /* [layer][words]: the layer's latest request set */
    uint8_t *transit_bucket;  /* per key: its successor-estimate bucket */
    double *transit_sum;      /* n_experts scratch sums */
} reuse_model;

struct fe_cache_policy {
    int kind;                  /* FERRY_CACHE_POLICY_* or FE_CACHE_POLICY_OPT */
    family fam;                /* how kind keeps its eviction order */
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
    key_heap heap;             /* FAMILY_HEAP order */
    key_lists lists;           /* ARC, 2Q, LAYER lists */
    int8_t *cur_dest;          /* ARC, 2Q: list each cur_set key joins at end */
    int arc_target;            /* ARC: adaptive target size of T1 */
    uint64_t *prev_step;       /* LRU2: per key, visit of the request before
                                  the last, 0 none */
    uint32_t *aged;            /* LFU_AGING: per key, periodically halved count */
    uint64_t clock;            /* GDSF: priority of the latest victim */
    uint64_t *next_use;        /* OPT: per key, next visit requesting it */
    reuse_model *reuse;        /* REUSE, ECHO */
};

/* ---- small helpers ---------------------------------------------------- */

static family family_of(int kind)
{
    switch (kind) {
    case FERRY_CACHE_POLICY_ARC: return FAMILY_ARC;
    case FERRY_CACHE_POLICY_TWOQ: return FAMILY_TWOQ;
    case FERRY_CACHE_POLICY_LAYER_LRU: return FAMILY_LAYER;
    case FERRY_CACHE_POLICY_REUSE:
    case FERRY_CACHE_POLICY_ECHO: return FAMILY_SCORE;
    case FERRY_CACHE_POLICY_TRANSIT: return FAMILY_SCORE;
    default: return FAMILY_HEAP;
    }
}

static bool is_pinned(const fe_cache_policy *p, int32_t key)
{
    return p->open && p->set_step[key] == p->step;
}

static int layer_of(const fe_cache_policy *p, int32_t key)
{
    return key / p->n_experts;
}

/* What a constructor has allocated so far: whether every allocation
 * succeeded, and the bytes asked for (checked against fe_cache_policy_bytes). */
typedef struct alloc_acc {
    bool ok;
    uint64_t bytes;
} alloc_acc;

/* Bytes alloc_array asks for: count (at least 1) elements of size bytes. */
static uint64_t array_bytes(size_t count, size_t size)
{
    return (uint64_t)(count ? count : 1) * (uint64_t)size;
}

static void *alloc_array(size_t count, size_t size, alloc_acc *acc)
{
    void *mem = calloc(count ? count : 1, size);
    if (!mem) acc->ok = false;
    acc->bytes += array_bytes(count, size);
    return mem;
}

static void fill_none(int32_t *a, size_t n)
{
    for (size_t i = 0; i < n; i++) a[i] = NONE;
}

static int popcount64(uint64_t x)
{
    x = x - ((x >> 1) & 0x5555555555555555u);
    x = (x & 0x3333333333333333u) + ((x >> 2) & 0x3333333333333333u);
    x = (x + (x >> 4)) & 0x0f0f0f0f0f0f0f0fu;
    return (int)((x * 0x0101010101010101u) >> 56);
}

/* Index of the lowest set bit of x (x != 0). */
static int lowest_bit(uint64_t x)
{
    return popcount64((x & (~x + 1u)) - 1u);
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
        n.a = p->aged[key];
        n.b = p->set_step[key];
        break;
    case FERRY_CACHE_POLICY_LRU2:
        n.a = p->prev_step[key];
        n.b = p->set_step[key];
        break;
    case FERRY_CACHE_POLICY_GDSF:
        n.a = p->clock + p->uses[key];
        n.b = p->set_step[key];
        break;
    default: /* OPT: farthest next use first */
        n.a = UINT64_MAX - p->next_use[key];
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
    int32_t key = p->lists.tail[list];
    while (key != NONE && is_pinned(p, key)) key = p->lists.prev[key];
    return key;
}

/* ---- the reuse model (REUSE, ECHO) ------------------------------------ */

static uint64_t *history_row(const fe_cache_policy *p, int64_t token, int layer)
{
    const reuse_model *m = p->reuse;
    size_t entry = (size_t)(token % ECHO_WINDOW);
    return m->history + (entry * (size_t)p->n_layers + (size_t)layer) * (size_t)m->words;
}

static int gap_bucket(const fe_cache_policy *p, int32_t key)
{
    const reuse_model *m = p->reuse;
    uint32_t last = m->last_visit[key];
    if (last == 0) return GAP_BUCKETS - 1;
    uint32_t gap = m->visits[layer_of(p, key)] + 1 - last;
    if (gap <= 3) return (int)gap - 1;
    if (gap < 8) return 3;
    if (gap < 16) return 4;
    return gap < 64 ? 5 : 6;
}

/* Bucket of uses[key] / (layer_uses / n_experts), doubling from 1/8. */
static int share_bucket(const fe_cache_policy *p, int32_t key)
{
    uint64_t total = p->reuse->layer_uses[layer_of(p, key)];
    uint64_t scaled = (uint64_t)p->uses[key] * (uint64_t)p->n_experts * 8u;
    int bucket = 0;
    for (uint64_t t = 1; total && bucket < SHARE_BUCKETS - 1 && scaled >= t * total; t *= 2)
        bucket++;
    return bucket;
}

/* What the best-matching past token says about key: for a layer still
 * ahead in the current token, whether that token requested it; for a layer
 * already passed, whether the token after the match did. */
static int vote_bucket(const fe_cache_policy *p, int32_t key)
{
    const reuse_model *m = p->reuse;
    if (!m->history || m->match == NONE) return 0;
    int layer = layer_of(p, key);
    int64_t source = layer > m->pos_layer ? m->match : m->match + 1;
    int expert = key % p->n_experts;
    const uint64_t *row = history_row(p, source, layer);
    return ((row[expert / 64] >> (expert % 64)) & 1u) ? 2 : 1;
}

/* TRANSIT: for every expert `to` of the layer, the bucket of the estimated
 * chance that the layer's next visit requests it: the mean, over `from` in
 * the layer's latest set, of (successors[from][to] + 0.1) /
 * (from_visits[from] + 1). Counts and set change only when the layer is
 * visited, so the buckets are recomputed then and stay exact. */
static void transit_rebucket(fe_cache_policy *p, int layer)
{
    reuse_model *m = p->reuse;
    size_t e = (size_t)p->n_experts;
    const uint64_t *set = m->last_set + (size_t)layer * (size_t)m->words;
    const uint16_t *from_visits = m->from_visits + (size_t)layer * e;
    double *sum = m->transit_sum;
    for (size_t to = 0; to < e; to++) sum[to] = 0.0;
    int n = 0;
    for (int w = 0; w < m->words; w++)
        for (uint64_t bits = set[w]; bits; bits &= bits - 1) {
            size_t from = (size_t)w * 64 + (size_t)lowest_bit(bits);
            const uint16_t *row = m->successors + ((size_t)layer * e + from) * e;
            double denominator = (double)from_visits[from] + 1.0;
            for (size_t to = 0; to < e; to++) sum[to] += ((double)row[to] + 0.1) / denominator;
            n++;
        }
    uint8_t *bucket = m->transit_bucket + (size_t)layer * e;
    for (size_t to = 0; to < e; to++) {
        double q = n ? sum[to] / n : 0.0;
        uint8_t b = 0;
        while (n && b < SHARE_BUCKETS - 1 && q >= TRANSIT_EDGES[b]) b++;
        bucket[to] = b;
    }
}

/* TRANSIT: counts the open visit as the successor of the layer's previous
 * visit, then makes it the layer's latest set. */
static void transit_record(fe_cache_policy *p, int layer)
{
    reuse_model *m = p->reuse;
    size_t e = (size_t)p->n_experts;
    uint64_t *set = m->last_set + (size_t)layer * (size_t)m->words;
    uint16_t *from_visits = m->from_visits + (size_t)layer * e;
    for (int w = 0; w < m->words; w++)
        for (uint64_t bits = set[w]; bits; bits &= bits - 1) {
            size_t from = (size_t)w * 64 + (size_t)lowest_bit(bits);
            uint16_t *row = m->successors + ((size_t)layer * e + from) * e;
            if (from_visits[from] == UINT16_MAX) {
                from_visits[from] /= 2;
                for (size_t to = 0; to < e; to++) row[to] /= 2;
            }
            from_visits[from]++;
            for (int i = 0; i < p->cur_n; i++) row[p->cur_set[i] % p->n_experts]++;
        }
    memset(set, 0, (size_t)m->words * sizeof *set);
    for (int i = 0; i < p->cur_n; i++) {
        int expert = p->cur_set[i] % p->n_experts;
        set[expert / 64] |= (uint64_t)1 << (expert % 64);
    }
    transit_rebucket(p, layer);
}

static int feature_cell(const fe_cache_policy *p, int32_t key)
{
    int second = p->reuse->successors ? p->reuse->transit_bucket[key] : share_bucket(p, key);
    return (gap_bucket(p, key) * SHARE_BUCKETS + second) * VOTE_BUCKETS + vote_bucket(p, key);
}

/* The table's probabilities from its counts: (used + 1) / (seen + 2). */
static void reuse_calibrate(reuse_model *m)
{
    for (int cell = 0; cell < TABLE_CELLS; cell++)
        m->probability[cell] = ((double)m->used[cell] + 1.0) / ((double)m->seen[cell] + 2.0);
}

/* Teaches the table this visit's outcome for every expert of the layer,
 * with the features the scorer saw just before it. */
static void reuse_learn(fe_cache_policy *p, int layer)
{
    reuse_model *m = p->reuse;
    int32_t first = layer * p->n_experts;
    for (int32_t key = first; key < first + p->n_experts; key++)
        m->seen[feature_cell(p, key)]++;
    for (int i = 0; i < p->cur_n; i++) m->used[feature_cell(p, p->cur_set[i])]++;
    reuse_calibrate(m);
}

static void echo_start_token(fe_cache_policy *p)
{
    reuse_model *m = p->reuse;
    m->tokens++;
    memset(history_row(p, m->tokens - 1, 0), 0,
           (size_t)p->n_layers * (size_t)m->words * sizeof(uint64_t));
    for (int i = 0; i < ECHO_WINDOW; i++) m->similarity[i] = 0.0;
    m->match = NONE;
}

/* Adds the visit to the current token's history and re-ranks past tokens
 * by decayed overlap with it; the best becomes the match. */
static void echo_record(fe_cache_policy *p, int layer)
{
    reuse_model *m = p->reuse;
    int64_t now = m->tokens - 1;
    uint64_t *row = history_row(p, now, layer);
    for (int i = 0; i < p->cur_n; i++) {
        int expert = p->cur_set[i] % p->n_experts;
        row[expert / 64] |= (uint64_t)1 << (expert % 64);
    }
    double best = 0.0;
    m->match = NONE;
    int64_t oldest = now - ECHO_WINDOW + 1 > 0 ? now - ECHO_WINDOW + 1 : 0;
    for (int64_t s = oldest; s < now; s++) {
        const uint64_t *past = history_row(p, s, layer);
        int overlap = 0;
        for (int w = 0; w < m->words; w++) overlap += popcount64(past[w] & row[w]);
        double *sim = &m->similarity[s % ECHO_WINDOW];
        *sim = *sim * ECHO_DECAY + overlap;
        if (*sim > 0.0 && *sim >= best) {
            best = *sim;
            m->match = s;
        }
    }
}

static void reuse_observe(fe_cache_policy *p, int layer)
{
    reuse_model *m = p->reuse;
    reuse_learn(p, layer);
    if (m->successors) transit_record(p, layer);
    if (m->history) {
        if (m->pos_layer == NONE || layer <= m->pos_layer) echo_start_token(p);
        echo_record(p, layer);
    }
    m->pos_layer = layer;
    m->visits[layer]++;
    for (int i = 0; i < p->cur_n; i++) m->last_visit[p->cur_set[i]] = m->visits[layer];
    m->layer_uses[layer] += (uint64_t)p->cur_n;
}

/* Expected requests per slot-visit of keeping the key until its layer's
 * next visit: the learned probability over the visits until then. */
static double reuse_score(const fe_cache_policy *p, int32_t key)
{
    const reuse_model *m = p->reuse;
    int ahead = (layer_of(p, key) - m->pos_layer - 1 + p->n_layers) % p->n_layers + 1;
    return m->probability[feature_cell(p, key)] / ahead;
}

/* Keeps in victims[] the `need` unpinned resident slots of lowest score
 * (ties: lower slot), in eviction order. Scores hold still within a visit,
 * so this matches rescanning for the minimum before every eviction. */
static void reuse_select(fe_cache_policy *p, int need)
{
    reuse_model *m = p->reuse;
    m->n_victims = 0;
    m->next_victim = 0;
    m->victims_step = p->step;
    for (int slot = 0; slot < p->n_slots; slot++) {
        int32_t key = p->slot_key[slot];
        if (key == NONE || is_pinned(p, key)) continue;
        double score = reuse_score(p, key);
        if (m->n_victims == need && !(score < m->victim_score[need - 1])) continue;
        int i = m->n_victims < need ? m->n_victims++ : need - 1;
        for (; i > 0 && score < m->victim_score[i - 1]; i--) {
            m->victims[i] = m->victims[i - 1];
            m->victim_score[i] = m->victim_score[i - 1];
        }
        m->victims[i] = slot;
        m->victim_score[i] = score;
    }
}

/* Selects once per visit, for as many evictions as the set still misses. */
static int32_t reuse_victim(fe_cache_policy *p)
{
    reuse_model *m = p->reuse;
    if (m->victims_step != p->step || m->next_victim == m->n_victims) {
        int need = 1;
        for (int i = 0; i < p->cur_n; i++) need += p->key_slot[p->cur_set[i]] == NONE;
        reuse_select(p, need > 1 ? need - 1 : 1);
    }
    return m->next_victim < m->n_victims ? p->slot_key[m->victims[m->next_victim++]] : NONE;
}

/* ---- per-family pinning, eviction and re-entry ------------------------ */

static void lfu_age(fe_cache_policy *p)
{
    for (int32_t key = 0; key < p->n_keys; key++) p->aged[key] /= 2;
    for (int i = 0; i < p->heap.size; i++) p->heap.node[i].a /= 2;
    heap_rebuild(&p->heap);
}

static void arc_adapt(fe_cache_policy *p, int ghost_list)
{
    const int32_t *size = p->lists.size;
    int other = ghost_list == ARC_B1 ? ARC_B2 : ARC_B1;
    int delta = size[ghost_list] >= size[other] ? 1 : size[other] / size[ghost_list];
    if (ghost_list == ARC_B1)
        p->arc_target = p->arc_target + delta < p->n_slots ? p->arc_target + delta : p->n_slots;
    else
        p->arc_target = p->arc_target > delta ? p->arc_target - delta : 0;
}

/* ARC and 2Q: take the set's keys out of the lists, noting where each
 * goes at end_layer. */
static void lists_begin(fe_cache_policy *p)
{
    key_lists *l = &p->lists;
    for (int i = 0; i < p->cur_n; i++) {
        int32_t key = p->cur_set[i];
        int owner = l->owner[key];
        if (p->fam == FAMILY_ARC) {
            if (owner == ARC_B1 || owner == ARC_B2) arc_adapt(p, owner);
            p->cur_dest[i] = (int8_t)(owner == NONE ? ARC_T1 : ARC_T2);
        } else if (owner == TWOQ_IN) {
            p->cur_dest[i] = DEST_STAY;
            continue;
        } else {
            p->cur_dest[i] = (int8_t)(owner == NONE ? TWOQ_IN : TWOQ_MAIN);
        }
        list_unlink(l, key);
    }
}

static void family_begin(fe_cache_policy *p)
{
    switch (p->fam) {
    case FAMILY_HEAP:
        if (p->kind == FERRY_CACHE_POLICY_LFU_AGING &&
            p->step % ((uint64_t)AGING_TOKENS * (uint64_t)p->n_layers) == 0)
            lfu_age(p);
        for (int i = 0; i < p->cur_n; i++) heap_remove(&p->heap, p->cur_set[i]);
        if (p->next_use)
            for (int i = 0; i < p->cur_n; i++) p->next_use[p->cur_set[i]] = UINT64_MAX;
        break;
    case FAMILY_ARC:
    case FAMILY_TWOQ:
        lists_begin(p);
        break;
    case FAMILY_LAYER:
        for (int i = 0; i < p->cur_n; i++) list_unlink(&p->lists, p->cur_set[i]);
        break;
    case FAMILY_SCORE:
        reuse_observe(p, p->cur_layer);
        break;
    }
}

static void ghost_trim(key_lists *l, int list, int32_t limit)
{
    while (l->size[list] > limit) list_unlink(l, l->tail[list]);
}

/* Puts the set's resident keys back into the eviction order. */
static void family_end(fe_cache_policy *p)
{
    key_lists *l = &p->lists;
    for (int i = 0; i < p->cur_n; i++) {
        int32_t key = p->cur_set[i];
        if (p->key_slot[key] == NONE) continue;
        switch (p->fam) {
        case FAMILY_HEAP: heap_push(&p->heap, heap_entry(p, key)); break;
        case FAMILY_LAYER: list_push_head(l, p->cur_layer, key); break;
        case FAMILY_ARC:
        case FAMILY_TWOQ:
            if (p->cur_dest[i] != DEST_STAY) list_push_head(l, p->cur_dest[i], key);
            break;
        case FAMILY_SCORE: break; /* scores are recomputed each visit */
        }
    }
    if (p->fam == FAMILY_ARC) {
        const int32_t *s = l->size;
        ghost_trim(l, ARC_B1, p->n_slots - s[ARC_T1]);
        ghost_trim(l, ARC_B2, 2 * p->n_slots - s[ARC_T1] - s[ARC_T2] - s[ARC_B1]);
    }
}

static int32_t arc_victim(fe_cache_policy *p)
{
    key_lists *l = &p->lists;
    int t1 = l->size[ARC_T1];
    bool from_t1 = t1 > 0 && (t1 > p->arc_target || l->size[ARC_T2] == 0);
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
    key_lists *l = &p->lists;
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
    key_lists *l = &p->lists;
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

static int32_t family_victim(fe_cache_policy *p)
{
    switch (p->fam) {
    case FAMILY_HEAP: {
        if (p->heap.size == 0) return NONE;
        heap_node top = p->heap.node[0];
        heap_remove(&p->heap, top.key);
        if (p->kind == FERRY_CACHE_POLICY_GDSF) p->clock = top.a;
        return top.key;
    }
    case FAMILY_ARC: return arc_victim(p);
    case FAMILY_TWOQ: return twoq_victim(p);
    case FAMILY_LAYER: return layer_victim(p);
    default: return reuse_victim(p);
    }
}

/* ---- slot bookkeeping ------------------------------------------------- */

static void free_add(fe_cache_policy *p, int slot)
{
    p->free_pos[slot] = p->n_free;
    p->free_slots[p->n_free++] = slot;
}

static void free_take(fe_cache_policy *p, int slot)
{
    int i = p->free_pos[slot];
    int moved = p->free_slots[--p->n_free];
    p->free_slots[i] = moved;
    p->free_pos[moved] = i;
    p->free_pos[slot] = NONE;
}

static void slot_map(fe_cache_policy *p, int32_t key, int slot)
{
    free_take(p, slot);
    p->slot_key[slot] = key;
    p->key_slot[key] = slot;
    p->layer_resident[layer_of(p, key)]++;
}

static void slot_unmap(fe_cache_policy *p, int32_t key)
{
    int slot = p->key_slot[key];
    p->slot_key[slot] = NONE;
    p->key_slot[key] = NONE;
    p->layer_resident[layer_of(p, key)]--;
    free_add(p, slot);
}

/* ---- memory ------------------------------------------------------------ */

/* Size of one element of array member m of struct type t. */
#define ELEM(t, m) sizeof(((t *)0)->m[0])

static uint64_t lists_bytes(size_t keys, size_t n_lists)
{
    return array_bytes(keys, ELEM(key_lists, prev)) + array_bytes(keys, ELEM(key_lists, next)) +
           array_bytes(keys, ELEM(key_lists, owner)) + array_bytes(n_lists, ELEM(key_lists, head)) +
           array_bytes(n_lists, ELEM(key_lists, tail)) + array_bytes(n_lists, ELEM(key_lists, size));
}

static uint64_t reuse_bytes(int kind, size_t slots, size_t layers, size_t experts)
{
    size_t keys = layers * experts, words = (experts + 63) / 64;
    uint64_t n = array_bytes(1, sizeof(reuse_model)) + array_bytes(keys, ELEM(reuse_model, last_visit)) +
                 array_bytes(layers, ELEM(reuse_model, visits)) +
                 array_bytes(layers, ELEM(reuse_model, layer_uses)) +
                 array_bytes(slots, ELEM(reuse_model, victims)) +
                 array_bytes(slots, ELEM(reuse_model, victim_score));
    if (kind == FERRY_CACHE_POLICY_ECHO || kind == FERRY_CACHE_POLICY_TRANSIT)
        n += array_bytes((size_t)ECHO_WINDOW * layers * words, ELEM(reuse_model, history)) +
             array_bytes(ECHO_WINDOW, ELEM(reuse_model, similarity));
    if (kind == FERRY_CACHE_POLICY_TRANSIT)
        n += array_bytes(keys * experts, ELEM(reuse_model, successors)) +
             array_bytes(keys, ELEM(reuse_model, from_visits)) +
             array_bytes(layers * words, ELEM(reuse_model, last_set)) +
             array_bytes(keys, ELEM(reuse_model, transit_bucket)) +
             array_bytes(experts, ELEM(reuse_model, transit_sum));
    return n;
}

uint64_t fe_cache_policy_bytes(int kind, int n_slots, int n_layers, int n_experts)
{
    if (n_slots < 1 || n_layers < 1 || n_experts < 1 || kind < 0 || kind > FE_CACHE_POLICY_OPT ||
        n_layers > INT32_MAX / n_experts)
        return 0;
    size_t slots = (size_t)n_slots, layers = (size_t)n_layers, experts = (size_t)n_experts;
    size_t keys = layers * experts;
    uint64_t n = array_bytes(1, sizeof(fe_cache_policy)) + array_bytes(slots, ELEM(fe_cache_policy, slot_key)) +
                 array_bytes(keys, ELEM(fe_cache_policy, key_slot)) +
                 array_bytes(slots, ELEM(fe_cache_policy, free_slots)) +
                 array_bytes(slots, ELEM(fe_cache_policy, free_pos)) +
                 array_bytes(layers, ELEM(fe_cache_policy, layer_resident)) +
                 array_bytes(keys, ELEM(fe_cache_policy, uses)) +
                 array_bytes(keys, ELEM(fe_cache_policy, set_step)) +
                 array_bytes(slots, ELEM(fe_cache_policy, cur_set)) +
                 array_bytes(slots, ELEM(fe_cache_policy, scratch));
    switch (family_of(kind)) {
    case FAMILY_HEAP:
        n += array_bytes(slots, ELEM(key_heap, node)) + array_bytes(keys, ELEM(key_heap, pos));
        if (kind == FERRY_CACHE_POLICY_LRU2) n += array_bytes(keys, ELEM(fe_cache_policy, prev_step));
        if (kind == FERRY_CACHE_POLICY_LFU_AGING) n += array_bytes(keys, ELEM(fe_cache_policy, aged));
        if (kind == FE_CACHE_POLICY_OPT) n += array_bytes(keys, ELEM(fe_cache_policy, next_use));
        return n;
    case FAMILY_ARC:
    case FAMILY_TWOQ:
        return n + array_bytes(slots, ELEM(fe_cache_policy, cur_dest)) +
               lists_bytes(keys, family_of(kind) == FAMILY_ARC ? ARC_LISTS : TWOQ_LISTS);
    case FAMILY_LAYER:
        return n + lists_bytes(keys, layers);
    default:
        return n + reuse_bytes(kind, slots, layers, experts);
    }
}

/* ---- creation --------------------------------------------------------- */

static bool alloc_lists(key_lists *l, int32_t n_keys, int n_lists, alloc_acc *acc)
{
    l->prev = alloc_array((size_t)n_keys, sizeof *l->prev, acc);
    l->next = alloc_array((size_t)n_keys, sizeof *l->next, acc);
    l->owner = alloc_array((size_t)n_keys, sizeof *l->owner, acc);
    l->head = alloc_array((size_t)n_lists, sizeof *l->head, acc);
    l->tail = alloc_array((size_t)n_lists, sizeof *l->tail, acc);
    l->size = alloc_array((size_t)n_lists, sizeof *l->size, acc);
    if (!acc->ok) return false;
    fill_none(l->owner, (size_t)n_keys);
    fill_none(l->head, (size_t)n_lists);
    fill_none(l->tail, (size_t)n_lists);
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

static void reuse_destroy(reuse_model *m)
{
    if (!m) return;
    free(m->last_visit);
    free(m->visits);
    free(m->layer_uses);
    free(m->victims);
    free(m->victim_score);
    free(m->history);
    free(m->similarity);
    free(m->successors);
    free(m->from_visits);
    free(m->last_set);
    free(m->transit_bucket);
    free(m->transit_sum);
    free(m);
}

static reuse_model *reuse_create(const fe_cache_policy *p, alloc_acc *acc)
{
    reuse_model *m = alloc_array(1, sizeof *m, acc);
    if (!m) return NULL;
    m->last_visit = alloc_array((size_t)p->n_keys, sizeof *m->last_visit, acc);
    m->visits = alloc_array((size_t)p->n_layers, sizeof *m->visits, acc);
    m->layer_uses = alloc_array((size_t)p->n_layers, sizeof *m->layer_uses, acc);
    m->victims = alloc_array((size_t)p->n_slots, sizeof *m->victims, acc);
    m->victim_score = alloc_array((size_t)p->n_slots, sizeof *m->victim_score, acc);
    m->pos_layer = NONE;
    m->match = NONE;
    if (p->kind == FERRY_CACHE_POLICY_ECHO || p->kind == FERRY_CACHE_POLICY_TRANSIT) {
        m->words = (p->n_experts + 63) / 64;
        size_t cells = (size_t)ECHO_WINDOW * (size_t)p->n_layers * (size_t)m->words;
        m->history = alloc_array(cells, sizeof *m->history, acc);
        m->similarity = alloc_array(ECHO_WINDOW, sizeof *m->similarity, acc);
    }
    if (p->kind == FERRY_CACHE_POLICY_TRANSIT) {
        size_t rows = (size_t)p->n_layers * (size_t)p->n_experts;
        m->successors = alloc_array(rows * (size_t)p->n_experts, sizeof *m->successors, acc);
        m->from_visits = alloc_array(rows, sizeof *m->from_visits, acc);
        m->last_set = alloc_array((size_t)p->n_layers * (size_t)m->words, sizeof *m->last_set, acc);
        m->transit_bucket = alloc_array((size_t)p->n_keys, sizeof *m->transit_bucket, acc);
        m->transit_sum = alloc_array((size_t)p->n_experts, sizeof *m->transit_sum, acc);
    }
    if (acc->ok) return m;
    reuse_destroy(m);
    return NULL;
}

/* Allocates what p->kind needs beyond the common arrays. */
static bool alloc_family(fe_cache_policy *p, alloc_acc *acc)
{
    size_t keys = (size_t)p->n_keys;
    switch (p->fam) {
    case FAMILY_HEAP:
        p->heap.node = alloc_array((size_t)p->n_slots, sizeof *p->heap.node, acc);
        p->heap.pos = alloc_array(keys, sizeof *p->heap.pos, acc);
        if (p->heap.pos) fill_none(p->heap.pos, keys);
        if (p->kind == FERRY_CACHE_POLICY_LRU2)
            p->prev_step = alloc_array(keys, sizeof *p->prev_step, acc);
        if (p->kind == FERRY_CACHE_POLICY_LFU_AGING)
            p->aged = alloc_array(keys, sizeof *p->aged, acc);
        if (p->kind == FE_CACHE_POLICY_OPT)
            p->next_use = alloc_array(keys, sizeof *p->next_use, acc);
        return acc->ok;
    case FAMILY_ARC:
    case FAMILY_TWOQ:
        p->cur_dest = alloc_array((size_t)p->n_slots, sizeof *p->cur_dest, acc);
        return acc->ok && alloc_lists(&p->lists, p->n_keys,
                                       p->fam == FAMILY_ARC ? ARC_LISTS : TWOQ_LISTS, acc);
    case FAMILY_LAYER:
        return alloc_lists(&p->lists, p->n_keys, p->n_layers, acc);
    default:
        p->reuse = reuse_create(p, acc);
        return p->reuse != NULL;
    }
}

fe_cache_policy *fe_cache_policy_create(int n_slots, int n_layers, int n_experts,
                                        int kind, int *err)
{
    alloc_acc ok = {true, 0};
    fe_cache_policy *p = NULL;
    int status = FERRY_CACHE_EINVAL;
    if (n_slots < 1 || n_layers < 1 || n_experts < 1 || kind < 0 ||
        kind > FE_CACHE_POLICY_OPT || n_layers > INT32_MAX / n_experts)
        goto fail;
    status = FERRY_CACHE_ENOMEM;
    p = alloc_array(1, sizeof *p, &ok);
    if (!p) goto fail;
    p->kind = kind;
    p->fam = family_of(kind);
    p->n_slots = n_slots;
    p->n_layers = n_layers;
    p->n_experts = n_experts;
    p->n_keys = (int32_t)n_layers * n_experts;
    size_t keys = (size_t)p->n_keys, slots = (size_t)n_slots;
    p->slot_key = alloc_array(slots, sizeof *p->slot_key, &ok);
    p->key_slot = alloc_array(keys, sizeof *p->key_slot, &ok);
    p->free_slots = alloc_array(slots, sizeof *p->free_slots, &ok);
    p->free_pos = alloc_array(slots, sizeof *p->free_pos, &ok);
    p->layer_resident = alloc_array((size_t)n_layers, sizeof *p->layer_resident, &ok);
    p->uses = alloc_array(keys, sizeof *p->uses, &ok);
    p->set_step = alloc_array(keys, sizeof *p->set_step, &ok);
    p->cur_set = alloc_array(slots, sizeof *p->cur_set, &ok);
    p->scratch = alloc_array(slots, sizeof *p->scratch, &ok);
    if (!ok.ok || !alloc_family(p, &ok)) goto fail;
    /* The budget counts fe_cache_policy_bytes: refuse to run on a drift. */
    status = FERRY_CACHE_ESTATE;
    if (ok.bytes != fe_cache_policy_bytes(kind, n_slots, n_layers, n_experts)) goto fail;
    fill_none(p->slot_key, slots);
    fill_none(p->key_slot, keys);
    for (int slot = n_slots - 1; slot >= 0; slot--) free_add(p, slot);
    return p;
fail:
    fe_cache_policy_destroy(p);
    if (err) *err = status;
    return NULL;
}

void fe_cache_policy_destroy(fe_cache_policy *p)
{
    if (!p) return;
    free(p->slot_key);
    free(p->key_slot);
    free(p->free_slots);
    free(p->free_pos);
    free(p->layer_resident);
    free(p->uses);
    free(p->set_step);
    free(p->cur_set);
    free(p->scratch);
    free(p->heap.node);
    free(p->heap.pos);
    free_lists(&p->lists);
    free(p->cur_dest);
    free(p->prev_step);
    free(p->aged);
    free(p->next_use);
    reuse_destroy(p->reuse);
    free(p);
}

/* ---- counts ----------------------------------------------------------- */

/* The score policies' per-layer totals of uses[]. */
static void recount_layer_uses(fe_cache_policy *p)
{
    for (int layer = 0; layer < p->n_layers; layer++) {
        uint64_t sum = 0;
        for (int e = 0; e < p->n_experts; e++) sum += p->uses[layer * p->n_experts + e];
        p->reuse->layer_uses[layer] = sum;
    }
}

int fe_cache_policy_load_counts(fe_cache_policy *p, const uint32_t *counts, size_t n)
{
    if (!counts || n != (size_t)p->n_keys) return FERRY_CACHE_EINVAL;
    if (p->step != 0) return FERRY_CACHE_ESTATE;
    memcpy(p->uses, counts, n * sizeof *counts);
    if (p->aged) memcpy(p->aged, counts, n * sizeof *counts);
    if (p->reuse) recount_layer_uses(p);
    return FERRY_CACHE_OK;
}

int fe_cache_policy_save_counts(const fe_cache_policy *p, uint32_t *counts, size_t n)
{
    if (!counts || n != (size_t)p->n_keys) return FERRY_CACHE_EINVAL;
    memcpy(counts, p->uses, n * sizeof *counts);
    return FERRY_CACHE_OK;
}

/* ---- learned state ---------------------------------------------------- */

/* Header of a saved state; the arrays follow in the order of state_parts. */
typedef struct state_header {
    char magic[8];     /* STATE_MAGIC */
    int32_t kind;      /* FERRY_CACHE_POLICY_* of the saving object */
    int32_t n_layers;  /* its MoE layers */
    int32_t n_experts; /* its experts per layer */
    int32_t reserved;  /* 0 */
} state_header;

static const char STATE_MAGIC[8] = {'F', 'E', 'R', 'R', 'Y', 'C', 'P', '1'};

/* One array of the state: where it lives in the object and its size. */
typedef struct state_part {
    void *data;
    size_t bytes;
} state_part;

enum { STATE_PARTS = 5 };

/* The arrays a kind saves: uses; the reuse table (seen, used); the
 * successor counts (successors, from_visits). Absent parts have 0 bytes. */
static void state_parts(const fe_cache_policy *p, state_part part[STATE_PARTS])
{
    const reuse_model *m = p->reuse;
    size_t keys = (size_t)p->n_keys;
    memset(part, 0, STATE_PARTS * sizeof *part);
    part[0] = (state_part){p->uses, keys * sizeof *p->uses};
    if (!m) return;
    part[1] = (state_part){(void *)m->seen, sizeof m->seen};
    part[2] = (state_part){(void *)m->used, sizeof m->used};
    if (!m->successors) return;
    part[3] = (state_part){m->successors, keys * (size_t)p->n_experts * sizeof *m->successors};
    part[4] = (state_part){m->from_visits, keys * sizeof *m->from_visits};
}

uint64_t fe_cache_policy_state_bytes(const fe_cache_policy *p)
{
    state_part part[STATE_PARTS];
    state_parts(p, part);
    uint64_t n = sizeof(state_header);
    for (int i = 0; i < STATE_PARTS; i++) n += part[i].bytes;
    return n;
}

int fe_cache_policy_save_state(const fe_cache_policy *p, void *buf, size_t n)
{
    if (!buf || n != fe_cache_policy_state_bytes(p)) return FERRY_CACHE_EINVAL;
    if (p->open) return FERRY_CACHE_ESTATE;
    state_header h = {{0}, p->kind, p->n_layers, p->n_experts, 0};
    memcpy(h.magic, STATE_MAGIC, sizeof h.magic);
    unsigned char *out = buf;
    memcpy(out, &h, sizeof h);
    out += sizeof h;
    state_part part[STATE_PARTS];
    state_parts(p, part);
    for (int i = 0; i < STATE_PARTS; i++) {
        if (part[i].bytes) memcpy(out, part[i].data, part[i].bytes);
        out += part[i].bytes;
    }
    return FERRY_CACHE_OK;
}

/* Whether the saved counts could have come from a run: a table cell never
 * used more often than seen; a successor count never above its row's
 * visits. Reads the blob's arrays in place (memcpy: no alignment assumed). */
static bool state_consistent(const fe_cache_policy *p, const unsigned char *in,
                             const state_part part[STATE_PARTS])
{
    const unsigned char *seen = in + part[0].bytes, *used = seen + part[1].bytes;
    for (size_t c = 0; c < part[1].bytes / sizeof(uint64_t); c++) {
        uint64_t s, u;
        memcpy(&s, seen + c * sizeof s, sizeof s);
        memcpy(&u, used + c * sizeof u, sizeof u);
        if (u > s) return false;
    }
    if (!part[3].bytes) return true;
    const unsigned char *succ = used + part[2].bytes, *from = succ + part[3].bytes;
    size_t e = (size_t)p->n_experts;
    for (size_t row = 0; row < (size_t)p->n_keys; row++) {
        uint16_t visits;
        memcpy(&visits, from + row * sizeof visits, sizeof visits);
        for (size_t to = 0; to < e; to++) {
            uint16_t c;
            memcpy(&c, succ + (row * e + to) * sizeof c, sizeof c);
            if (c > visits) return false;
        }
    }
    return true;
}

int fe_cache_policy_load_state(fe_cache_policy *p, const void *buf, size_t n)
{
    if (!buf || n != fe_cache_policy_state_bytes(p)) return FERRY_CACHE_EINVAL;
    if (p->step != 0) return FERRY_CACHE_ESTATE;
    state_header h;
    memcpy(&h, buf, sizeof h);
    if (memcmp(h.magic, STATE_MAGIC, sizeof h.magic) != 0 || h.kind != p->kind ||
        h.n_layers != p->n_layers || h.n_experts != p->n_experts || h.reserved != 0)
        return FERRY_CACHE_EINVAL;
    const unsigned char *in = (const unsigned char *)buf + sizeof h;
    state_part part[STATE_PARTS];
    state_parts(p, part);
    if (!state_consistent(p, in, part)) return FERRY_CACHE_EINVAL;
    for (int i = 0; i < STATE_PARTS; i++) {
        if (part[i].bytes) memcpy(part[i].data, in, part[i].bytes);
        in += part[i].bytes;
    }
    if (p->aged) memcpy(p->aged, p->uses, (size_t)p->n_keys * sizeof *p->aged);
    if (p->reuse) {
        recount_layer_uses(p);
        reuse_calibrate(p->reuse);
    }
    return FERRY_CACHE_OK;
}

/* ---- the visit protocol ----------------------------------------------- */

static int compare_keys(const void *x, const void *y)
{
    int32_t a = *(const int32_t *)x, b = *(const int32_t *)y;
    return (a > b) - (a < b);
}

/* Range and duplicate checks; fills scratch with the sorted keys. */
static int check_set(fe_cache_policy *p, int layer, const int32_t *experts, int n)
{
    if (layer < 0 || layer >= p->n_layers || !experts || n < 1 || n > p->n_slots)
        return FERRY_CACHE_EINVAL;
    for (int i = 0; i < n; i++) {
        if (experts[i] < 0 || experts[i] >= p->n_experts) return FERRY_CACHE_EINVAL;
        p->scratch[i] = layer * p->n_experts + experts[i];
    }
    qsort(p->scratch, (size_t)n, sizeof *p->scratch, compare_keys);
    for (int i = 1; i < n; i++)
        if (p->scratch[i] == p->scratch[i - 1]) return FERRY_CACHE_EINVAL;
    return FERRY_CACHE_OK;
}

static void record_requests(fe_cache_policy *p)
{
    for (int i = 0; i < p->cur_n; i++) {
        int32_t key = p->cur_set[i];
        if (p->key_slot[key] != NONE) p->counters.hits++;
        else p->counters.misses++;
        if (p->prev_step) p->prev_step[key] = p->set_step[key];
        p->set_step[key] = p->step;
        if (p->uses[key] < UINT32_MAX) p->uses[key]++;
        if (p->aged && p->aged[key] < UINT32_MAX) p->aged[key]++;
    }
}

int fe_cache_policy_begin_layer(fe_cache_policy *p, int layer, const int32_t *experts, int n)
{
    if (p->open) return FERRY_CACHE_ESTATE;
    int status = check_set(p, layer, experts, n);
    if (status != FERRY_CACHE_OK) return status;
    p->step++;
    p->open = true;
    p->cur_layer = layer;
    p->cur_n = n;
    for (int i = 0; i < n; i++) p->cur_set[i] = layer * p->n_experts + experts[i];
    family_begin(p);
    record_requests(p);
    return FERRY_CACHE_OK;
}

int fe_cache_policy_lookup(const fe_cache_policy *p, int layer, int expert)
{
    if (layer < 0 || layer >= p->n_layers || expert < 0 || expert >= p->n_experts) return -1;
    return p->key_slot[layer * p->n_experts + expert];
}

int fe_cache_policy_choose_victim(fe_cache_policy *p, int *evicted_layer, int *evicted_expert)
{
    if (evicted_layer) *evicted_layer = -1;
    if (evicted_expert) *evicted_expert = -1;
    if (!p->open) return FERRY_CACHE_ESTATE;
    if (p->n_free > 0) return p->free_slots[p->n_free - 1];
    int32_t key = family_victim(p);
    if (key == NONE) return FERRY_CACHE_ESTATE;
    int slot = p->key_slot[key];
    slot_unmap(p, key);
    p->counters.evictions++;
    if (evicted_layer) *evicted_layer = layer_of(p, key);
    if (evicted_expert) *evicted_expert = key % p->n_experts;
    return slot;
}

/* The key of (layer, expert) if it belongs to the open visit, else NONE. */
static int32_t open_set_key(const fe_cache_policy *p, int layer, int expert)
{
    if (!p->open || layer != p->cur_layer || expert < 0 || expert >= p->n_experts) return NONE;
    int32_t key = layer * p->n_experts + expert;
    return is_pinned(p, key) ? key : NONE;
}

int fe_cache_policy_insert(fe_cache_policy *p, int layer, int expert, int slot)
{
    if (!p->open) return FERRY_CACHE_ESTATE;
    int32_t key = open_set_key(p, layer, expert);
    if (key == NONE || slot < 0 || slot >= p->n_slots) return FERRY_CACHE_EINVAL;
    if (p->key_slot[key] != NONE || p->free_pos[slot] == NONE) return FERRY_CACHE_ESTATE;
    slot_map(p, key, slot);
    return FERRY_CACHE_OK;
}

int fe_cache_policy_prefetch(fe_cache_policy *p, int layer, int expert, int *already)
{
    *already = 0;
    if (!p->open) return FERRY_CACHE_ESTATE;
    if (p->fam != FAMILY_SCORE || p->kind == FE_CACHE_POLICY_OPT) return FERRY_CACHE_EINVAL;
    if (layer < 0 || layer >= p->n_layers || layer == p->cur_layer || expert < 0 || expert >= p->n_experts)
        return FERRY_CACHE_EINVAL;
    int32_t key = layer * p->n_experts + expert;
    if (p->key_slot[key] != NONE) {
        *already = 1;
        return p->key_slot[key];
    }
    int slot;
    if (p->n_free > 0) {
        slot = p->free_slots[p->n_free - 1];
    } else {
        int32_t victim = family_victim(p);
        if (victim == NONE) return FERRY_CACHE_ESTATE;
        slot = p->key_slot[victim];
        slot_unmap(p, victim);
        p->counters.evictions++;
    }
    slot_map(p, key, slot);
    return slot;
}

int fe_cache_policy_set_next_use(fe_cache_policy *p, int layer, int expert, uint64_t next_use)
{
    if (p->kind != FE_CACHE_POLICY_OPT) return FERRY_CACHE_EINVAL;
    if (!p->open) return FERRY_CACHE_ESTATE;
    int32_t key = open_set_key(p, layer, expert);
    if (key == NONE) return FERRY_CACHE_EINVAL;
    p->next_use[key] = next_use;
    return FERRY_CACHE_OK;
}

int fe_cache_policy_end_layer(fe_cache_policy *p)
{
    if (!p->open) return FERRY_CACHE_ESTATE;
    family_end(p);
    p->open = false;
    return FERRY_CACHE_OK;
}

void fe_cache_policy_counters(const fe_cache_policy *p, fe_cache_counters *out)
{
    *out = p->counters;
}
