/* Unit tests for cache_policy.c and cachesim.c. Exit status 0 when all
 * pass; the last line printed is "N passed, N failed". */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../src/cache_policy.h"
#include "ferry_cachesim.h"

static int check_failures; /* failed CHECKs in the running test */

#define CHECK(cond)                                                          \
    do {                                                                     \
        if (!(cond)) {                                                       \
            check_failures++;                                                \
            printf("  %s:%d: CHECK(%s) failed\n", __FILE__, __LINE__, #cond); \
        }                                                                    \
    } while (0)

/* Deterministic xorshift generator for random traces. */
static uint32_t rng_next(uint32_t *state)
{
    uint32_t x = *state;
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    return *state = x;
}

/* Fills trace[n_tokens][n_layers][top_k] with distinct ids per set, skewed
 * toward low ids so that reuse happens. */
static void random_trace(int32_t *trace, int n_tokens, int n_layers, int top_k,
                         int n_experts, uint32_t seed)
{
    uint32_t state = seed ? seed : 1;
    for (int v = 0; v < n_tokens * n_layers; v++) {
        int32_t *set = trace + v * top_k;
        for (int i = 0; i < top_k;) {
            uint32_t r = rng_next(&state) % (uint32_t)n_experts;
            int32_t id = (int32_t)(r * (rng_next(&state) % (uint32_t)n_experts) / (uint32_t)n_experts);
            bool dup = false;
            for (int j = 0; j < i; j++) dup |= set[j] == id;
            if (!dup) set[i++] = id;
        }
    }
}

/* One visit through the protocol; checks pinning on every eviction. */
static void visit(fe_cache_policy *p, int layer, const int32_t *set, int n)
{
    CHECK(fe_cache_policy_begin_layer(p, layer, set, n) == FERRY_CACHE_OK);
    for (int i = 0; i < n; i++) {
        if (fe_cache_policy_lookup(p, layer, set[i]) >= 0) continue;
        int ev_layer, ev_expert;
        int slot = fe_cache_policy_choose_victim(p, &ev_layer, &ev_expert);
        CHECK(slot >= 0);
        if (slot < 0) return;
        for (int j = 0; j < n; j++) CHECK(!(ev_layer == layer && ev_expert == set[j]));
        CHECK(fe_cache_policy_insert(p, layer, set[i], slot) == FERRY_CACHE_OK);
    }
    for (int i = 0; i < n; i++) CHECK(fe_cache_policy_lookup(p, layer, set[i]) >= 0);
    CHECK(fe_cache_policy_end_layer(p) == FERRY_CACHE_OK);
}

static void test_create_rejects_bad_arguments(void)
{
    int err = 0;
    CHECK(fe_cache_policy_create(0, 4, 8, FERRY_CACHE_POLICY_LRU, &err) == NULL);
    CHECK(err == FERRY_CACHE_EINVAL);
    CHECK(fe_cache_policy_create(4, 0, 8, FERRY_CACHE_POLICY_LRU, &err) == NULL);
    CHECK(fe_cache_policy_create(4, 4, 0, FERRY_CACHE_POLICY_LRU, NULL) == NULL);
    CHECK(fe_cache_policy_create(4, 4, 8, -1, &err) == NULL);
    CHECK(fe_cache_policy_create(4, 4, 8, FE_CACHE_POLICY_OPT + 1, &err) == NULL);
    CHECK(fe_cache_policy_create(4, 1 << 16, 1 << 16, FERRY_CACHE_POLICY_LRU, &err) == NULL);
    fe_cache_policy_destroy(NULL);
}

static void test_protocol_order_is_enforced(void)
{
    fe_cache_policy *p = fe_cache_policy_create(2, 2, 4, FERRY_CACHE_POLICY_LRU, NULL);
    CHECK(p != NULL);
    if (!p) return;
    int32_t set[2] = {1, 2};
    CHECK(fe_cache_policy_lookup(p, 0, 1) == -1);
    CHECK(fe_cache_policy_lookup(p, 9, 1) == -1);
    CHECK(fe_cache_policy_choose_victim(p, NULL, NULL) == FERRY_CACHE_ESTATE);
    CHECK(fe_cache_policy_end_layer(p) == FERRY_CACHE_ESTATE);
    CHECK(fe_cache_policy_insert(p, 0, 1, 0) == FERRY_CACHE_ESTATE);
    CHECK(fe_cache_policy_begin_layer(p, 0, set, 2) == FERRY_CACHE_OK);
    CHECK(fe_cache_policy_begin_layer(p, 0, set, 2) == FERRY_CACHE_ESTATE);
    CHECK(fe_cache_policy_insert(p, 0, 3, 0) == FERRY_CACHE_EINVAL);  /* not in set */
    CHECK(fe_cache_policy_insert(p, 1, 1, 0) == FERRY_CACHE_EINVAL);  /* other layer */
    CHECK(fe_cache_policy_insert(p, 0, 1, 5) == FERRY_CACHE_EINVAL);  /* bad slot */
    CHECK(fe_cache_policy_set_next_use(p, 0, 1, 3) == FERRY_CACHE_EINVAL); /* not OPT */
    int slot = fe_cache_policy_choose_victim(p, NULL, NULL);
    CHECK(slot >= 0);
    CHECK(fe_cache_policy_choose_victim(p, NULL, NULL) == slot); /* idempotent */
    CHECK(fe_cache_policy_insert(p, 0, 1, slot) == FERRY_CACHE_OK);
    CHECK(fe_cache_policy_insert(p, 0, 1, slot) == FERRY_CACHE_ESTATE); /* resident */
    CHECK(fe_cache_policy_insert(p, 0, 2, slot) == FERRY_CACHE_ESTATE); /* slot used */
    int other = fe_cache_policy_choose_victim(p, NULL, NULL);
    CHECK(other >= 0 && other != slot);
    CHECK(fe_cache_policy_insert(p, 0, 2, other) == FERRY_CACHE_OK);
    CHECK(fe_cache_policy_choose_victim(p, NULL, NULL) == FERRY_CACHE_ESTATE); /* all pinned */
    CHECK(fe_cache_policy_end_layer(p) == FERRY_CACHE_OK);
    fe_cache_policy_destroy(p);
}

static void test_begin_layer_validates_without_side_effects(void)
{
    fe_cache_policy *p = fe_cache_policy_create(3, 2, 4, FERRY_CACHE_POLICY_ECHO, NULL);
    CHECK(p != NULL);
    if (!p) return;
    int32_t dup[2] = {1, 1}, range[2] = {0, 4}, big[4] = {0, 1, 2, 3}, ok[2] = {0, 1};
    CHECK(fe_cache_policy_begin_layer(p, 0, dup, 2) == FERRY_CACHE_EINVAL);
    CHECK(fe_cache_policy_begin_layer(p, 0, range, 2) == FERRY_CACHE_EINVAL);
    CHECK(fe_cache_policy_begin_layer(p, 0, big, 4) == FERRY_CACHE_EINVAL); /* > n_slots */
    CHECK(fe_cache_policy_begin_layer(p, 2, ok, 2) == FERRY_CACHE_EINVAL);
    CHECK(fe_cache_policy_begin_layer(p, 0, NULL, 2) == FERRY_CACHE_EINVAL);
    CHECK(fe_cache_policy_begin_layer(p, 0, ok, 0) == FERRY_CACHE_EINVAL);
    fe_cache_counters c;
    fe_cache_policy_counters(p, &c);
    CHECK(c.hits == 0 && c.misses == 0 && c.evictions == 0);
    uint32_t counts[8] = {0};
    CHECK(fe_cache_policy_load_counts(p, counts, 8) == FERRY_CACHE_OK); /* not started */
    visit(p, 0, ok, 2);
    fe_cache_policy_destroy(p);
}

/* LRU on one layer, two slots, one expert per visit: 0 1 0 2 1 0. */
static void test_lru_sequence(void)
{
    fe_cache_policy *p = fe_cache_policy_create(2, 1, 4, FERRY_CACHE_POLICY_LRU, NULL);
    CHECK(p != NULL);
    if (!p) return;
    const int32_t seq[6] = {0, 1, 0, 2, 1, 0};
    const int evicted[6] = {-1, -1, -1, 1, 0, 2};
    for (int i = 0; i < 6; i++) {
        CHECK(fe_cache_policy_begin_layer(p, 0, &seq[i], 1) == FERRY_CACHE_OK);
        int ev = -1;
        if (fe_cache_policy_lookup(p, 0, seq[i]) < 0) {
            int slot = fe_cache_policy_choose_victim(p, NULL, &ev);
            CHECK(fe_cache_policy_insert(p, 0, seq[i], slot) == FERRY_CACHE_OK);
        }
        CHECK(ev == evicted[i]);
        CHECK(fe_cache_policy_end_layer(p) == FERRY_CACHE_OK);
    }
    fe_cache_counters c;
    fe_cache_policy_counters(p, &c);
    CHECK(c.hits == 1 && c.misses == 5 && c.evictions == 3);
    fe_cache_policy_destroy(p);
}

/* Every policy keeps the open set pinned and its counters consistent. */
static void test_every_policy_pins_and_counts(void)
{
    enum { T = 40, L = 3, K = 3, E = 7 };
    static int32_t trace[T * L * K];
    random_trace(trace, T, L, K, E, 7);
    for (int kind = 0; kind <= FE_CACHE_POLICY_OPT; kind++) {
        for (int slots = K; slots <= 12; slots += 3) {
            fe_cache_policy *p = fe_cache_policy_create(slots, L, E, kind, NULL);
            CHECK(p != NULL);
            if (!p) continue;
            for (int v = 0; v < T * L; v++) visit(p, v % L, trace + v * K, K);
            fe_cache_counters c;
            fe_cache_policy_counters(p, &c);
            int resident = 0;
            for (int key = 0; key < L * E; key++)
                resident += fe_cache_policy_lookup(p, key / E, key % E) >= 0;
            CHECK(c.hits + c.misses == (uint64_t)(T * L * K));
            CHECK(c.misses - c.evictions == (uint64_t)resident);
            CHECK(resident <= slots);
            fe_cache_policy_destroy(p);
        }
    }
}

static void test_counts_round_trip_and_steer_lfu(void)
{
    uint32_t prior[4] = {0, 0, 0, 100}, saved[4], wrong[3] = {0};
    fe_cache_policy *p = fe_cache_policy_create(2, 1, 4, FERRY_CACHE_POLICY_LFU, NULL);
    CHECK(p != NULL);
    if (!p) return;
    CHECK(fe_cache_policy_load_counts(p, wrong, 3) == FERRY_CACHE_EINVAL);
    CHECK(fe_cache_policy_load_counts(p, prior, 4) == FERRY_CACHE_OK);
    const int32_t seq[5] = {3, 0, 1, 2, 3};
    for (int i = 0; i < 5; i++) visit(p, 0, &seq[i], 1);
    fe_cache_counters c;
    fe_cache_policy_counters(p, &c);
    CHECK(c.hits == 1); /* the hot expert 3 survived 0, 1, 2 */
    CHECK(fe_cache_policy_load_counts(p, prior, 4) == FERRY_CACHE_ESTATE);
    CHECK(fe_cache_policy_save_counts(p, saved, 4) == FERRY_CACHE_OK);
    CHECK(saved[0] == 1 && saved[1] == 1 && saved[2] == 1 && saved[3] == 102);
    CHECK(fe_cache_policy_save_counts(p, saved, 5) == FERRY_CACHE_EINVAL);
    fe_cache_policy_destroy(p);
}

/* OPT, two slots, one layer: 0 1 2 0 1 keeps 0 at the third request. */
static void test_opt_follows_next_use(void)
{
    int32_t trace[5] = {0, 1, 2, 0, 1};
    ferry_cachesim_result r;
    CHECK(ferry_cache_simulate_opt(trace, 5, 1, 1, 3, 2, &r, NULL, 0) == FERRY_CACHE_OK);
    CHECK(r.hits == 1 && r.misses == 4 && r.evictions == 2 && r.requests == 5);
    CHECK(ferry_cache_simulate(trace, 5, 1, 1, 3, 2, FERRY_CACHE_POLICY_LRU, NULL, &r, NULL, 0) ==
          FERRY_CACHE_OK);
    CHECK(r.hits == 0);
}

static void test_opt_bounds_online_policies(void)
{
    enum { T = 60, L = 4, K = 4, E = 16 };
    static int32_t trace[T * L * K];
    for (uint32_t seed = 1; seed <= 3; seed++) {
        random_trace(trace, T, L, K, E, seed * 977u);
        for (int slots = K; slots <= 40; slots += 9) {
            ferry_cachesim_result opt, r;
            CHECK(ferry_cache_simulate_opt(trace, T, L, K, E, slots, &opt, NULL, 0) == 0);
            for (int kind = 0; kind < FERRY_CACHE_POLICY_COUNT; kind++) {
                CHECK(ferry_cache_simulate(trace, T, L, K, E, slots, kind, NULL, &r, NULL, 0) == 0);
                CHECK(r.hits <= opt.hits);
                CHECK(r.hit_rate >= 0.0 && r.hit_rate <= 1.0);
            }
        }
    }
}

static bool fails_with(int status, const char *err, const char *needle)
{
    return status == FERRY_CACHE_EINVAL && strstr(err, needle) != NULL;
}

static void test_simulate_rejects_bad_arguments(void)
{
    int32_t trace[8] = {0, 1, 2, 3, 1, 2, 3, 0};
    ferry_cachesim_result r;
    char err[128];
    CHECK(fails_with(ferry_cache_simulate(trace, 2, 2, 2, 4, 1, 0, NULL, &r, err, sizeof err),
                     err, "n_slots (1) must be >= top_k (2)"));
    CHECK(fails_with(ferry_cache_simulate(trace, 2, 2, 2, 3, 4, 0, NULL, &r, err, sizeof err),
                     err, "token 0 layer 1: expert id 3 out of range [0, 3)"));
    trace[5] = 1;
    CHECK(fails_with(ferry_cache_simulate_opt(trace, 2, 2, 2, 4, 4, &r, err, sizeof err),
                     err, "token 1 layer 0: expert id 1 requested twice"));
    trace[5] = 2;
    CHECK(fails_with(ferry_cache_simulate(trace, 2, 2, 2, 4, 4, 99, NULL, &r, err, sizeof err),
                     err, "unknown policy 99"));
    CHECK(fails_with(ferry_cache_simulate(trace, 0, 2, 2, 4, 4, 0, NULL, &r, err, sizeof err),
                     err, "must be >= 1"));
    CHECK(fails_with(ferry_cache_simulate(trace, 2, 2, 5, 4, 8, 0, NULL, &r, err, sizeof err),
                     err, "experts_per_layer (4) must be >= top_k (5)"));
    CHECK(fails_with(ferry_cache_simulate(NULL, 2, 2, 2, 4, 4, 0, NULL, &r, err, sizeof err),
                     err, "must not be NULL"));
    CHECK(ferry_cache_simulate(trace, 2, 2, 2, 4, 4, 99, NULL, &r, err, 4) == FERRY_CACHE_EINVAL);
    CHECK(strcmp(err, "unk") == 0); /* truncated, still terminated */
    CHECK(ferry_cache_simulate(trace, 2, 2, 2, 4, 4, 0, NULL, &r, NULL, 0) == FERRY_CACHE_OK);
}

/* ferry_cache_simulate is the documented protocol, nothing more. */
static void test_simulate_matches_manual_replay(void)
{
    enum { T = 30, L = 5, K = 3, E = 12, SLOTS = 11 };
    static int32_t trace[T * L * K];
    random_trace(trace, T, L, K, E, 4242);
    uint32_t prior[L * E];
    for (int i = 0; i < L * E; i++) prior[i] = (uint32_t)(i % 5);
    ferry_cachesim_result r;
    CHECK(ferry_cache_simulate(trace, T, L, K, E, SLOTS, FERRY_CACHE_POLICY_ENGINE, prior, &r,
                               NULL, 0) == 0);
    fe_cache_policy *p = fe_cache_policy_create(SLOTS, L, E, FERRY_CACHE_POLICY_ENGINE, NULL);
    CHECK(p != NULL);
    if (!p) return;
    CHECK(fe_cache_policy_load_counts(p, prior, L * E) == FERRY_CACHE_OK);
    for (int v = 0; v < T * L; v++) visit(p, v % L, trace + v * K, K);
    fe_cache_counters c;
    fe_cache_policy_counters(p, &c);
    CHECK(c.hits == r.hits && c.misses == r.misses && c.evictions == r.evictions);
    fe_cache_policy_destroy(p);
}

/* A cache that holds every key misses each key exactly once. */
static void test_large_cache_only_cold_misses(void)
{
    enum { T = 20, L = 3, K = 2, E = 5 };
    static int32_t trace[T * L * K];
    random_trace(trace, T, L, K, E, 99);
    for (int kind = 0; kind < FERRY_CACHE_POLICY_COUNT; kind++) {
        ferry_cachesim_result r, opt;
        CHECK(ferry_cache_simulate(trace, T, L, K, E, L * E, kind, NULL, &r, NULL, 0) == 0);
        CHECK(ferry_cache_simulate_opt(trace, T, L, K, E, L * E, &opt, NULL, 0) == 0);
        CHECK(r.evictions == 0 && r.misses == opt.misses);
    }
}

typedef struct test_case {
    const char *name;  /* printed on failure */
    void (*run)(void); /* the test */
} test_case;

/* TRANSIT's successor counts are 16-bit: a layer visited far more often than
 * that halves its rows instead of wrapping, and keeps working. */
static void test_transit_counts_saturate(void)
{
    fe_cache_policy *p = fe_cache_policy_create(4, 2, 70, FERRY_CACHE_POLICY_TRANSIT, NULL);
    CHECK(p != NULL);
    if (!p) return;
    int32_t a[2] = {0, 69}, b[2] = {1, 69}, c[1] = {65};
    for (int v = 0; v < 70000; v++) {
        visit(p, 0, a, 2);
        visit(p, 1, v % 3 ? b : c, v % 3 ? 2 : 1);
    }
    fe_cache_counters k;
    fe_cache_policy_counters(p, &k);
    CHECK(k.hits + k.misses == 70000u * 4u - 70000u / 3u - 1u);
    CHECK(k.hits > k.misses);
    fe_cache_policy_destroy(p);
}

/* A session that loads what an earlier one saved resumes with the same
 * learned state: saving right after loading gives the same bytes, and
 * ferry_cache_simulate_learned is exactly that manual two-session replay.
 * Every kind; the first session's cache is larger than the second's. */
static void test_state_round_trip_and_resume(void)
{
    enum { T = 40, LEARN = 25, L = 4, K = 3, E = 10, SLOTS = 9 };
    static int32_t trace[T * L * K];
    random_trace(trace, T, L, K, E, 777);
    for (int kind = 0; kind < FERRY_CACHE_POLICY_COUNT; kind++) {
        fe_cache_policy *a = fe_cache_policy_create(SLOTS + 3, L, E, kind, NULL);
        fe_cache_policy *b = fe_cache_policy_create(SLOTS, L, E, kind, NULL);
        CHECK(a && b);
        if (!a || !b) {
            fe_cache_policy_destroy(a);
            fe_cache_policy_destroy(b);
            return;
        }
        for (int v = 0; v < LEARN * L; v++) visit(a, v % L, trace + v * K, K);
        size_t n = (size_t)fe_cache_policy_state_bytes(a);
        CHECK(n == fe_cache_policy_state_bytes(b));
        unsigned char *saved = malloc(n), *again = malloc(n);
        CHECK(saved && again);
        if (saved && again) {
            CHECK(fe_cache_policy_save_state(a, saved, n) == FERRY_CACHE_OK);
            CHECK(fe_cache_policy_load_state(b, saved, n) == FERRY_CACHE_OK);
            CHECK(fe_cache_policy_save_state(b, again, n) == FERRY_CACHE_OK);
            CHECK(memcmp(saved, again, n) == 0);
            for (int v = LEARN * L; v < T * L; v++) visit(b, v % L, trace + v * K, K);
            fe_cache_counters c;
            fe_cache_policy_counters(b, &c);
            CHECK(c.hits + c.misses == (uint64_t)(T - LEARN) * L * K);
            /* What is learned does not depend on the cache size: the
             * simulator's first session has SLOTS slots, a had SLOTS + 3. */
            ferry_cachesim_result r;
            CHECK(ferry_cache_simulate_learned(trace, T, L, K, E, SLOTS, kind, LEARN, &r,
                                               NULL, 0) == 0);
            CHECK(c.hits == r.hits && c.misses == r.misses && c.evictions == r.evictions);
        }
        free(saved);
        free(again);
        fe_cache_policy_destroy(a);
        fe_cache_policy_destroy(b);
    }
}

/* A blob of another size, kind or shape, a bad header or impossible counts
 * is refused and changes nothing; loading after the first visit is refused. */
static void test_state_rejects_bad_blobs(void)
{
    enum { L = 2, E = 6, SLOTS = 5 };
    int kind = FERRY_CACHE_POLICY_TRANSIT;
    fe_cache_policy *a = fe_cache_policy_create(SLOTS, L, E, kind, NULL);
    fe_cache_policy *b = fe_cache_policy_create(SLOTS, L, E, kind, NULL);
    fe_cache_policy *other = fe_cache_policy_create(SLOTS, L, E, FERRY_CACHE_POLICY_ECHO, NULL);
    fe_cache_policy *wide = fe_cache_policy_create(SLOTS, L, E + 1, kind, NULL);
    CHECK(a && b && other && wide);
    size_t n = a ? (size_t)fe_cache_policy_state_bytes(a) : 0;
    unsigned char *blob = malloc(n + 1), *fresh = malloc(n), *after = malloc(n);
    CHECK(blob && fresh && after);
    if (a && b && other && wide && blob && fresh && after) {
        const int32_t s0[2] = {0, 1}, s1[2] = {2, 3}, s2[2] = {1, 4};
        for (int t = 0; t < 6; t++) {
            visit(a, 0, t % 2 ? s0 : s2, 2);
            visit(a, 1, s1, 2);
        }
        CHECK(fe_cache_policy_save_state(a, blob, n - 1) == FERRY_CACHE_EINVAL);
        CHECK(fe_cache_policy_save_state(a, blob, n) == FERRY_CACHE_OK);
        CHECK(fe_cache_policy_save_state(b, fresh, n) == FERRY_CACHE_OK);
        CHECK(fe_cache_policy_load_state(b, NULL, n) == FERRY_CACHE_EINVAL);
        CHECK(fe_cache_policy_load_state(b, blob, n - 1) == FERRY_CACHE_EINVAL);
        CHECK(fe_cache_policy_load_state(b, blob, n + 1) == FERRY_CACHE_EINVAL);
        CHECK(fe_cache_policy_state_bytes(other) != n ||
              fe_cache_policy_load_state(other, blob, n) == FERRY_CACHE_EINVAL);
        CHECK(fe_cache_policy_load_state(wide, blob, n) == FERRY_CACHE_EINVAL);
        blob[0] ^= 1; /* magic */
        CHECK(fe_cache_policy_load_state(b, blob, n) == FERRY_CACHE_EINVAL);
        blob[0] ^= 1;
        unsigned char saved_byte = blob[n - 1]; /* last from_visits entry: 0 */
        unsigned char *uses_end = blob + 24 + (size_t)L * E * sizeof(uint32_t);
        uint64_t seen0;
        memcpy(&seen0, uses_end, sizeof seen0);
        uint64_t big = seen0 + 1; /* used[0] > seen[0] */
        unsigned char *used0 = uses_end + 8 * 8 * 3 * sizeof(uint64_t);
        uint64_t used_saved;
        memcpy(&used_saved, used0, sizeof used_saved);
        memcpy(used0, &big, sizeof big);
        CHECK(fe_cache_policy_load_state(b, blob, n) == FERRY_CACHE_EINVAL);
        memcpy(used0, &used_saved, sizeof used_saved);
        /* a successor count above its row's visits */
        unsigned char *succ = used0 + 8 * 8 * 3 * sizeof(uint64_t);
        uint16_t huge = 60000;
        uint16_t succ_saved;
        memcpy(&succ_saved, succ, sizeof succ_saved);
        memcpy(succ, &huge, sizeof huge);
        CHECK(fe_cache_policy_load_state(b, blob, n) == FERRY_CACHE_EINVAL);
        memcpy(succ, &succ_saved, sizeof succ_saved);
        CHECK(blob[n - 1] == saved_byte);
        CHECK(fe_cache_policy_save_state(b, after, n) == FERRY_CACHE_OK);
        CHECK(memcmp(fresh, after, n) == 0); /* every refusal left b as it was */
        CHECK(fe_cache_policy_load_state(b, blob, n) == FERRY_CACHE_OK);
        CHECK(fe_cache_policy_load_state(a, blob, n) == FERRY_CACHE_ESTATE); /* a has run */
        ferry_cachesim_result r;
        int32_t trace[3 * L * 2] = {0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3};
        CHECK(ferry_cache_simulate_learned(trace, 3, L, 2, E, SLOTS, kind, 0, &r, NULL, 0) ==
              FERRY_CACHE_EINVAL);
        CHECK(ferry_cache_simulate_learned(trace, 3, L, 2, E, SLOTS, kind, 3, &r, NULL, 0) ==
              FERRY_CACHE_EINVAL);
        CHECK(ferry_cache_simulate_learned(trace, 3, L, 2, E, SLOTS, kind, 2, &r, NULL, 0) == 0);
        CHECK(r.requests == L * 2 && r.hits == 0); /* new session: empty cache */
    }
    free(blob);
    free(fresh);
    free(after);
    fe_cache_policy_destroy(a);
    fe_cache_policy_destroy(b);
    fe_cache_policy_destroy(other);
    fe_cache_policy_destroy(wide);
}

int main(void)
{
    const test_case tests[] = {
        {"create_rejects_bad_arguments", test_create_rejects_bad_arguments},
        {"protocol_order_is_enforced", test_protocol_order_is_enforced},
        {"begin_layer_validates_without_side_effects",
         test_begin_layer_validates_without_side_effects},
        {"lru_sequence", test_lru_sequence},
        {"every_policy_pins_and_counts", test_every_policy_pins_and_counts},
        {"counts_round_trip_and_steer_lfu", test_counts_round_trip_and_steer_lfu},
        {"opt_follows_next_use", test_opt_follows_next_use},
        {"opt_bounds_online_policies", test_opt_bounds_online_policies},
        {"simulate_rejects_bad_arguments", test_simulate_rejects_bad_arguments},
        {"simulate_matches_manual_replay", test_simulate_matches_manual_replay},
        {"large_cache_only_cold_misses", test_large_cache_only_cold_misses},
        {"transit_counts_saturate", test_transit_counts_saturate},
        {"state_round_trip_and_resume", test_state_round_trip_and_resume},
        {"state_rejects_bad_blobs", test_state_rejects_bad_blobs},
    };
    int passed = 0, failed = 0;
    for (size_t i = 0; i < sizeof tests / sizeof tests[0]; i++) {
        check_failures = 0;
        tests[i].run();
        if (check_failures) {
            printf("FAIL %s\n", tests[i].name);
            failed++;
        } else {
            passed++;
        }
    }
    printf("%d passed, %d failed\n", passed, failed);
    return failed != 0;
}
