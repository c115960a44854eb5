/* cache_policy.c: the expert cache's replacement policy (see cache_policy.h):
 * the object, the visit protocol, and the score policies: TRANSIT, the
 * engine's (FERRY_CACHE_POLICY_ENGINE), and REUSE and ECHO, the same learned
 * model with a feature each left out. The kinds only the simulator replays
 * (the classic policies and OPT) are in cachesim_policies.c, called through
 * the fe_sim_policy_* hooks of cache_policy_impl.h.
 *
 * Every structure is indexed by key = layer * n_experts + expert. While a
 * visit is open its keys are pinned: the score scan skips them.
 * docs/CACHE_POLICY.md has the measurements behind each constant below.
 */
#include "cache_policy_impl.h"

#include <limits.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

enum {
    ECHO_WINDOW = 128,  /* tokens of routing history ECHO matches against */
    GAP_BUCKETS = 8,    /* visits since last request: 1,2,3,4+,8+,16+,64+,never */
    SHARE_BUCKETS = 8,  /* request share vs uniform: <1/8 .. >=8, doubling;
                           TRANSIT: successor estimate, 8 buckets instead */
    VOTE_BUCKETS = 3,   /* echo vote: no match, match says no, match says yes */
    TABLE_CELLS = GAP_BUCKETS * SHARE_BUCKETS * VOTE_BUCKETS
};

static const double ECHO_DECAY = 0.5; /* weight of older layers in a match */
/* TRANSIT: lower edges of successor-estimate buckets 1..7 (bucket 0 below
 * 0.02, and also when the layer has no visit yet). Chosen once, a priori. */
static const double TRANSIT_EDGES[SHARE_BUCKETS - 1] = {0.02, 0.05, 0.1, 0.15, 0.2, 0.3, 0.45};

/* State of the score policies: a table, learned online, of how often a
 * key with given features is requested at its layer's next visit. */
struct reuse_model {
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
};

/* ---- small helpers ---------------------------------------------------- */

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

/* ---- the reuse model (REUSE, ECHO, TRANSIT) --------------------------- */

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
    uint32_t gap = m->visits[fe_policy_layer_of(p, key)] + 1 - last;
    if (gap <= 3) return (int)gap - 1;
    if (gap < 8) return 3;
    if (gap < 16) return 4;
    return gap < 64 ? 5 : 6;
}

/* Bucket of uses[key] / (layer_uses / n_experts), doubling from 1/8. */
static int share_bucket(const fe_cache_policy *p, int32_t key)
{
    uint64_t total = p->reuse->layer_uses[fe_policy_layer_of(p, key)];
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
    int layer = fe_policy_layer_of(p, key);
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
    int ahead = (fe_policy_layer_of(p, key) - m->pos_layer - 1 + p->n_layers) % p->n_layers + 1;
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
        if (key == NONE || fe_policy_pinned(p, key)) continue;
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

/* ---- per-kind pinning, eviction and re-entry --------------------------- */

static void policy_begin(fe_cache_policy *p)
{
    if (p->reuse) reuse_observe(p, p->cur_layer);
    else fe_sim_policy_begin(p);
}

/* The score policies recompute their scores each visit: nothing to put back. */
static void policy_end(fe_cache_policy *p)
{
    if (p->sim) fe_sim_policy_end(p);
}

static int32_t policy_victim(fe_cache_policy *p)
{
    return p->reuse ? reuse_victim(p) : fe_sim_policy_victim(p);
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
    p->layer_resident[fe_policy_layer_of(p, key)]++;
}

static void slot_unmap(fe_cache_policy *p, int32_t key)
{
    int slot = p->key_slot[key];
    p->slot_key[slot] = NONE;
    p->key_slot[key] = NONE;
    p->layer_resident[fe_policy_layer_of(p, key)]--;
    free_add(p, slot);
}

/* ---- memory ------------------------------------------------------------ */

static uint64_t reuse_bytes(int kind, size_t slots, size_t layers, size_t experts)
{
    size_t keys = layers * experts, words = (experts + 63) / 64;
    uint64_t n = fe_array_bytes(1, sizeof(reuse_model)) + fe_array_bytes(keys, FE_ELEM(reuse_model, last_visit)) +
                 fe_array_bytes(layers, FE_ELEM(reuse_model, visits)) +
                 fe_array_bytes(layers, FE_ELEM(reuse_model, layer_uses)) +
                 fe_array_bytes(slots, FE_ELEM(reuse_model, victims)) +
                 fe_array_bytes(slots, FE_ELEM(reuse_model, victim_score));
    if (kind == FERRY_CACHE_POLICY_ECHO || kind == FERRY_CACHE_POLICY_TRANSIT)
        n += fe_array_bytes((size_t)ECHO_WINDOW * layers * words, FE_ELEM(reuse_model, history)) +
             fe_array_bytes(ECHO_WINDOW, FE_ELEM(reuse_model, similarity));
    if (kind == FERRY_CACHE_POLICY_TRANSIT)
        n += fe_array_bytes(keys * experts, FE_ELEM(reuse_model, successors)) +
             fe_array_bytes(keys, FE_ELEM(reuse_model, from_visits)) +
             fe_array_bytes(layers * words, FE_ELEM(reuse_model, last_set)) +
             fe_array_bytes(keys, FE_ELEM(reuse_model, transit_bucket)) +
             fe_array_bytes(experts, FE_ELEM(reuse_model, transit_sum));
    return n;
}

uint64_t fe_cache_policy_bytes(int kind, int n_slots, int n_layers, int n_experts)
{
    if (n_slots < 1 || n_layers < 1 || n_experts < 1 || kind < 0 || kind > FE_CACHE_POLICY_OPT ||
        n_layers > INT32_MAX / n_experts)
        return 0;
    size_t slots = (size_t)n_slots, layers = (size_t)n_layers, experts = (size_t)n_experts;
    size_t keys = layers * experts;
    uint64_t n = fe_array_bytes(1, sizeof(fe_cache_policy)) + fe_array_bytes(slots, FE_ELEM(fe_cache_policy, slot_key)) +
                 fe_array_bytes(keys, FE_ELEM(fe_cache_policy, key_slot)) +
                 fe_array_bytes(slots, FE_ELEM(fe_cache_policy, free_slots)) +
                 fe_array_bytes(slots, FE_ELEM(fe_cache_policy, free_pos)) +
                 fe_array_bytes(layers, FE_ELEM(fe_cache_policy, layer_resident)) +
                 fe_array_bytes(keys, FE_ELEM(fe_cache_policy, uses)) +
                 fe_array_bytes(keys, FE_ELEM(fe_cache_policy, set_step)) +
                 fe_array_bytes(slots, FE_ELEM(fe_cache_policy, cur_set)) +
                 fe_array_bytes(slots, FE_ELEM(fe_cache_policy, scratch));
    return n + (fe_policy_is_score(kind) ? reuse_bytes(kind, slots, layers, experts)
                                         : fe_sim_policy_bytes(kind, slots, layers, experts));
}

/* ---- creation --------------------------------------------------------- */

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

static reuse_model *reuse_create(const fe_cache_policy *p, fe_alloc_acc *acc)
{
    reuse_model *m = fe_alloc_array(1, sizeof *m, acc);
    if (!m) return NULL;
    m->last_visit = fe_alloc_array((size_t)p->n_keys, sizeof *m->last_visit, acc);
    m->visits = fe_alloc_array((size_t)p->n_layers, sizeof *m->visits, acc);
    m->layer_uses = fe_alloc_array((size_t)p->n_layers, sizeof *m->layer_uses, acc);
    m->victims = fe_alloc_array((size_t)p->n_slots, sizeof *m->victims, acc);
    m->victim_score = fe_alloc_array((size_t)p->n_slots, sizeof *m->victim_score, acc);
    m->pos_layer = NONE;
    m->match = NONE;
    if (p->kind == FERRY_CACHE_POLICY_ECHO || p->kind == FERRY_CACHE_POLICY_TRANSIT) {
        m->words = (p->n_experts + 63) / 64;
        size_t cells = (size_t)ECHO_WINDOW * (size_t)p->n_layers * (size_t)m->words;
        m->history = fe_alloc_array(cells, sizeof *m->history, acc);
        m->similarity = fe_alloc_array(ECHO_WINDOW, sizeof *m->similarity, acc);
    }
    if (p->kind == FERRY_CACHE_POLICY_TRANSIT) {
        size_t rows = (size_t)p->n_layers * (size_t)p->n_experts;
        m->successors = fe_alloc_array(rows * (size_t)p->n_experts, sizeof *m->successors, acc);
        m->from_visits = fe_alloc_array(rows, sizeof *m->from_visits, acc);
        m->last_set = fe_alloc_array((size_t)p->n_layers * (size_t)m->words, sizeof *m->last_set, acc);
        m->transit_bucket = fe_alloc_array((size_t)p->n_keys, sizeof *m->transit_bucket, acc);
        m->transit_sum = fe_alloc_array((size_t)p->n_experts, sizeof *m->transit_sum, acc);
    }
    if (acc->ok) return m;
    reuse_destroy(m);
    return NULL;
}

fe_cache_policy *fe_cache_policy_create(int n_slots, int n_layers, int n_experts,
                                        int kind, int *err)
{
    fe_alloc_acc ok = {true, 0};
    fe_cache_policy *p = NULL;
    int status = FERRY_CACHE_EINVAL;
    if (n_slots < 1 || n_layers < 1 || n_experts < 1 || kind < 0 ||
        kind > FE_CACHE_POLICY_OPT || n_layers > INT32_MAX / n_experts)
        goto fail;
    status = FERRY_CACHE_ENOMEM;
    p = fe_alloc_array(1, sizeof *p, &ok);
    if (!p) goto fail;
    p->kind = kind;
    p->n_slots = n_slots;
    p->n_layers = n_layers;
    p->n_experts = n_experts;
    p->n_keys = (int32_t)n_layers * n_experts;
    size_t keys = (size_t)p->n_keys, slots = (size_t)n_slots;
    p->slot_key = fe_alloc_array(slots, sizeof *p->slot_key, &ok);
    p->key_slot = fe_alloc_array(keys, sizeof *p->key_slot, &ok);
    p->free_slots = fe_alloc_array(slots, sizeof *p->free_slots, &ok);
    p->free_pos = fe_alloc_array(slots, sizeof *p->free_pos, &ok);
    p->layer_resident = fe_alloc_array((size_t)n_layers, sizeof *p->layer_resident, &ok);
    p->uses = fe_alloc_array(keys, sizeof *p->uses, &ok);
    p->set_step = fe_alloc_array(keys, sizeof *p->set_step, &ok);
    p->cur_set = fe_alloc_array(slots, sizeof *p->cur_set, &ok);
    p->scratch = fe_alloc_array(slots, sizeof *p->scratch, &ok);
    if (!ok.ok) goto fail;
    if (fe_policy_is_score(kind) ? !(p->reuse = reuse_create(p, &ok)) : !fe_sim_policy_create(p, &ok)) goto fail;
    /* The budget counts fe_cache_policy_bytes: refuse to run on a drift. */
    status = FERRY_CACHE_ESTATE;
    if (ok.bytes != fe_cache_policy_bytes(kind, n_slots, n_layers, n_experts)) goto fail;
    fe_fill_none(p->slot_key, slots);
    fe_fill_none(p->key_slot, keys);
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
    reuse_destroy(p->reuse);
    fe_sim_policy_destroy(p->sim);
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
    if (p->reuse) recount_layer_uses(p);
    else fe_sim_policy_counts_loaded(p);
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
    if (p->reuse) {
        recount_layer_uses(p);
        reuse_calibrate(p->reuse);
    } else {
        fe_sim_policy_counts_loaded(p);
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
        p->set_step[key] = p->step;
        if (p->uses[key] < UINT32_MAX) p->uses[key]++;
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
    policy_begin(p);
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
    int32_t key = policy_victim(p);
    if (key == NONE) return FERRY_CACHE_ESTATE;
    int slot = p->key_slot[key];
    slot_unmap(p, key);
    p->counters.evictions++;
    if (evicted_layer) *evicted_layer = fe_policy_layer_of(p, key);
    if (evicted_expert) *evicted_expert = key % p->n_experts;
    return slot;
}

/* The key of (layer, expert) if it belongs to the open visit, else NONE. */
static int32_t open_set_key(const fe_cache_policy *p, int layer, int expert)
{
    if (!p->open || layer != p->cur_layer || expert < 0 || expert >= p->n_experts) return NONE;
    int32_t key = layer * p->n_experts + expert;
    return fe_policy_pinned(p, key) ? key : NONE;
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
    if (!p->reuse) return FERRY_CACHE_EINVAL;
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
        int32_t victim = policy_victim(p);
        if (victim == NONE) return FERRY_CACHE_ESTATE;
        slot = p->key_slot[victim];
        slot_unmap(p, victim);
        p->counters.evictions++;
    }
    slot_map(p, key, slot);
    return slot;
}

int fe_cache_policy_preload(fe_cache_policy *p, int layer, int expert, int *already)
{
    *already = 0;
    if (p->open) return FERRY_CACHE_ESTATE;
    if (layer < 0 || layer >= p->n_layers || expert < 0 || expert >= p->n_experts) return FERRY_CACHE_EINVAL;
    int32_t key = layer * p->n_experts + expert;
    if (p->key_slot[key] != NONE) {
        *already = 1;
        return p->key_slot[key];
    }
    if (p->n_free < 1) return FERRY_CACHE_ESTATE;
    int slot = p->free_slots[p->n_free - 1];
    slot_map(p, key, slot);
    return slot;
}

int fe_cache_policy_set_next_use(fe_cache_policy *p, int layer, int expert, uint64_t next_use)
{
    if (p->kind != FE_CACHE_POLICY_OPT) return FERRY_CACHE_EINVAL;
    if (!p->open) return FERRY_CACHE_ESTATE;
    int32_t key = open_set_key(p, layer, expert);
    if (key == NONE) return FERRY_CACHE_EINVAL;
    fe_sim_policy_set_next_use(p, key, next_use);
    return FERRY_CACHE_OK;
}

int fe_cache_policy_end_layer(fe_cache_policy *p)
{
    if (!p->open) return FERRY_CACHE_ESTATE;
    policy_end(p);
    p->open = false;
    return FERRY_CACHE_OK;
}

void fe_cache_policy_counters(const fe_cache_policy *p, fe_cache_counters *out)
{
    *out = p->counters;
}
