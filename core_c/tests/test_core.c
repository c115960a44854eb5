/* test_core.c — the C core's own tests, run under AddressSanitizer and
 * UndefinedBehaviorSanitizer by tests/engine/test_c_core.py.
 *
 *   test_core GOOD_CONTAINER [BAD_CONTAINER...]
 *
 * Unit checks of the JSON parser, CRC-32, number formats, the thread pool and
 * the MoE routing rules (exact, fewer experts per token, cache-aware),
 * then a full open/eval/verify of the good container, then every bad
 * container must be refused with a code and a message. Prints
 * "N passed, N failed" last and exits nonzero on any failure. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <time.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../include/ferry.h"
#include "../src/common.h"
#include "../src/formats.h"
#include "../src/io.h"
#include "../src/json.h"
#include "../src/moe.h"
#include "../src/ops.h"
#include "../src/pool.h"

static int passed, failed;

#define CHECK(cond)                                                                 \
    do {                                                                            \
        if (cond) passed++;                                                         \
        else { failed++; fprintf(stderr, "FAIL %s:%d: %s\n", __FILE__, __LINE__, #cond); } \
    } while (0)

static void test_crc32(void) {
    CHECK(fe_crc32(0, "123456789", 9) == 0xCBF43926u);
    CHECK(fe_crc32(fe_crc32(0, "1234", 4), "56789", 5) == 0xCBF43926u);
    CHECK(fe_crc32(0, "", 0) == 0);
}

static int parses(const char *s) {
    char msg[128];
    fe_json *d = fe_json_parse(s, strlen(s), msg, sizeof msg);
    fe_json_free(d);
    return d != NULL;
}

/* fe_alloc_huge: zero, on a 2 MiB boundary, every byte writable (ASan sees
 * the mmap'd span's trimmed ends as unmapped, not as an overrun here), freed. */
static void test_alloc_huge(void) {
    const size_t sizes[] = {1, 4096, FE_HUGE_PAGE - 1, FE_HUGE_PAGE, 3 * FE_HUGE_PAGE + 12345};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        uint8_t *p = fe_alloc_huge(sizes[i]);
        CHECK(p != NULL && (uintptr_t)p % FE_HUGE_PAGE == 0);
        if (!p) continue;
        int zero = 1;
        for (size_t j = 0; j < sizes[i]; j += 997) zero &= p[j] == 0;
        CHECK(zero && p[sizes[i] - 1] == 0);
        memset(p, 0x5a, sizes[i]);
        CHECK(p[0] == 0x5a && p[sizes[i] - 1] == 0x5a);
        fe_free_lazy(p, sizes[i]);
    }
}

static void test_json(void) {
    char msg[128];
    const char *doc = "{\"a\": [1, 2.5, -3e2, true, false, null], \"s\": \"x\\u00e9\\ud83d\\ude00\\n\", \"o\": {}}";
    fe_json *d = fe_json_parse(doc, strlen(doc), msg, sizeof msg);
    CHECK(d != NULL);
    if (d) {
        const fe_json_node *root = fe_json_root(d);
        const fe_json_node *a = fe_json_get(d, root, "a");
        CHECK(a && a->type == FE_JSON_ARRAY && a->count == 6);
        CHECK(fe_json_child(d, a, 0)->is_integer && fe_json_child(d, a, 0)->num == 1);
        CHECK(!fe_json_child(d, a, 1)->is_integer && fe_json_child(d, a, 2)->num == -300);
        CHECK(fe_json_child(d, a, 6) == NULL);
        const fe_json_node *s = fe_json_get(d, root, "s");
        CHECK(s && strcmp(s->str, "x\xc3\xa9\xf0\x9f\x98\x80\n") == 0);
        CHECK(fe_json_get(d, root, "missing") == NULL);
        fe_json_free(d);
    }
    const char *bad[] = {"", "{", "[1,]", "{\"a\" 1}", "\"\\ud800\"", "\"\\u0000\"", "01", "1.", "-",
                         "tru", "[1] 2", "{\"a\":1,}", "\"\x01\"", "1e999", "\"abc"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) CHECK(!parses(bad[i]));
    char deep[300];
    memset(deep, '[', sizeof deep - 1);
    deep[sizeof deep - 1] = '\0';
    CHECK(!parses(deep)); /* nesting beyond the bound is refused, not a stack overflow */
    /* Many small values make the node array grow several times. */
    size_t n = 200000;
    char *big = malloc(n * 2 + 3);
    big[0] = '[';
    for (size_t i = 0; i < n; i++) { big[1 + 2 * i] = '0'; big[2 + 2 * i] = ','; }
    big[2 * n] = ']';
    big[2 * n + 1] = '\0';
    CHECK(parses(big));
    free(big);
}

static void test_formats(void) {
    CHECK(fe_f16_to_f32(0x3C00) == 1.0f);
    CHECK(fe_f16_to_f32(0xC000) == -2.0f);
    CHECK(fe_f16_to_f32(0x0001) == ldexpf(1.0f, -24)); /* smallest subnormal */
    CHECK(isinf(fe_f16_to_f32(0x7C00)));
    CHECK(fe_bf16_to_f32(0x3F80) == 1.0f);
    CHECK(fe_row_bytes(FE_Q4_1, 64) == 40 && fe_row_bytes(FE_Q4_1, 33) == 0 && fe_row_bytes(FE_Q6_K, 512) == 420);
    CHECK(fe_format_from_name("q8_0") == FE_Q8_0 && fe_format_from_name("q9") == -1);
    /* A Q8_0 block with d = 0.5 and q = -16..15. */
    unsigned char blk[34] = {0x00, 0x38};
    for (int i = 0; i < 32; i++) blk[2 + i] = (unsigned char)(signed char)(i - 16);
    float out[32];
    fe_dequant_row(FE_Q8_0, blk, out, 32);
    int ok = 1;
    for (int i = 0; i < 32; i++) ok &= out[i] == 0.5f * (float)(i - 16);
    CHECK(ok);
    float a[13], b[13];
    for (int i = 0; i < 13; i++) { a[i] = (float)i; b[i] = 1.0f; }
    CHECK(fe_dot_f32(a, b, 13) == 78.0f);
}

typedef struct { long long sums[8]; } pool_ctx;

static void add_range(void *p, int start, int end, int tid) {
    pool_ctx *c = p;
    for (int i = start; i < end; i++) c->sums[tid] += i;
}

static void mark_items(void *p, int start, int end, int tid) {
    unsigned char *hits = p;
    (void)tid;
    for (int i = start; i < end; i++) hits[i]++;
}

/* A matrix product gives the same bits whether the pool's threads share it
 * (spinning) or the caller runs it alone (a small product while the pool is
 * backed off, ops.c's FE_INLINE_BYTES): placement never changes output. */
static void test_matmul_inline(void) {
    enum { ROWS = 96, COLS = 256, N = 3 };
    const uint64_t rb = fe_row_bytes(FE_Q4_0, COLS);
    uint8_t *w = malloc(ROWS * rb);
    float x[N * COLS], y_pool[N * ROWS], y_inline[N * ROWS];
    unsigned seed = 7;
    for (uint64_t i = 0; i < ROWS * rb; i++) w[i] = (uint8_t)((seed = seed * 1103515245u + 12345u) >> 16);
    for (int r = 0; r < ROWS; r++)
        for (uint64_t b = 0; b < rb; b += 18) { w[r * rb + b] = 0x00; w[r * rb + b + 1] = 0x2c; } /* scale 1/16 (f16) */
    for (int i = 0; i < N * COLS; i++) x[i] = (float)((int)((seed = seed * 1103515245u + 12345u) >> 16) % 2001 - 1000) / 997.0f;
    fe_pool *p = fe_pool_new(2);
    const int stride = fe_rows_stride(COLS);
    float *rows = calloc((size_t)2 * (size_t)stride, sizeof(float));
    CHECK(w && p && rows);
    fe_ops ops = {p, rows, stride, fe_kernels_get(fe_kernels_best()), NULL, NULL};
    const fe_mat m = fe_mat_view(w, FE_Q4_0, ROWS, COLS);
    for (int n = 1; n <= N; n++) {
        memset(y_pool, 0, sizeof y_pool);
        memset(y_inline, 0xff, sizeof y_inline);
        fe_pool_hold_off(p, 0);   /* spinning on: the threads share the rows */
        fe_matmul(&ops, &m, x, n, y_pool);
        fe_pool_hold_off(p, 1000000000LL);
        CHECK(fe_pool_backed_off(p));
        fe_matmul(&ops, &m, x, n, y_inline);
        CHECK(memcmp(y_pool, y_inline, (size_t)n * ROWS * sizeof(float)) == 0);
    }
    fe_pool_free(p);
    free(rows);
    free(w);
}

static void test_pool(void) {
    fe_pool *pool = fe_pool_new(4);
    CHECK(pool && fe_pool_threads(pool) == 4);
    for (int round = 0; round < 50; round++) {
        pool_ctx c = {{0}};
        fe_pool_run(pool, add_range, &c, 1000 + round);
        long long total = 0;
        for (int t = 0; t < 8; t++) total += c.sums[t];
        long long n = 1000 + round;
        CHECK(total == n * (n - 1) / 2);
    }
    /* Jobs far apart (workers asleep between them), jobs back to back (workers
     * spinning), and the profile counters. */
    double wait = 0.0;
    uint64_t jobs = 0;
    uint64_t spin_jobs = 0, backoffs = 0;
    fe_pool_profile prof = {&wait, &jobs, &spin_jobs, &backoffs};
    fe_pool_set_profile(pool, &prof);
    for (int round = 0; round < 200; round++) {
        if (round % 20 == 0) {
            struct timespec nap = {0, 2000000}; /* 2 ms: longer than the pool's spin */
            nanosleep(&nap, NULL);
        }
        pool_ctx c = {{0}};
        long long n = 3 + round % 7;
        fe_pool_run(pool, add_range, &c, (int)n);
        long long total = 0;
        for (int t = 0; t < 8; t++) total += c.sums[t];
        CHECK(total == n * (n - 1) / 2);
    }
    CHECK(jobs == 200 && wait >= 0.0);
    CHECK(spin_jobs <= jobs);
    /* The back-off rule: doubled while a busy machine keeps signalling (during
     * a period, or right after it), 20 ms again once the pool spun clean for
     * more than 40 ms after a period ended, however long that period was: an
     * expert reader's rare wake-up on a quiet machine must not keep the pool
     * asleep for a second (pool.c). */
    const int64_t MS = 1000000;
    CHECK(fe_pool_next_backoff(20 * MS, 1000 * MS, 0) == 20 * MS);            /* the first */
    CHECK(fe_pool_next_backoff(20 * MS, 1000 * MS, 1010 * MS) == 40 * MS);    /* during a period */
    CHECK(fe_pool_next_backoff(40 * MS, 1000 * MS, 990 * MS) == 80 * MS);     /* right after one */
    CHECK(fe_pool_next_backoff(800 * MS, 1000 * MS, 990 * MS) == 1000 * MS);  /* at most 1 s */
    CHECK(fe_pool_next_backoff(1000 * MS, 5000 * MS, 3000 * MS) == 20 * MS);  /* long after a 1 s period */
    CHECK(fe_pool_next_backoff(1000 * MS, 3100 * MS, 3000 * MS) == 20 * MS);  /* 100 ms after it */
    fe_pool_set_profile(pool, NULL);
    fe_pool_free(pool);
    /* Every item of a job is computed exactly once, whatever the split
     * among threads (chunks are claimed dynamically). */
    {
        static unsigned char hits[70000];
        fe_pool *p3 = fe_pool_new(3);
        for (int round = 0; round < 300; round++) {
            int n = round < 200 ? 2 + round : 70000 - round;
            memset(hits, 0, sizeof hits);
            fe_pool_run(p3, mark_items, hits, n);
            int ok = 1;
            for (int i = 0; i < n; i++) ok &= hits[i] == 1;
            CHECK(ok);
        }
        fe_pool_stats st;
        fe_pool_get_stats(p3, &st);
        CHECK(st.spin_ns >= 0);
        fe_pool_free(p3);
    }
    /* A pool whose threads went to sleep still shuts down. */
    pool = fe_pool_new(3);
    struct timespec nap = {0, 2000000};
    nanosleep(&nap, NULL);
    fe_pool_free(pool);
}

static void stage_count(void *user, int stage, int pos, int n, int dim, const float *h) {
    (void)pos;
    (void)n;
    (void)dim;
    (void)h;
    int *seen = user;
    if (stage >= 0 && stage < 64) seen[stage]++;
}

static void test_good_container(const char *path) {
    ferry_open_options opts;
    ferry_open_options_init(&opts);
    opts.n_threads = 2;
    opts.verify_reads = 1;
    opts.prompt_chunk = 32; /* (a model with experts would take 128 a chunk) */
    ferry_engine *e = NULL;
    ferry_error err;
    CHECK(ferry_engine_open(path, &opts, &e, &err) == FERRY_OK);
    if (!e) { fprintf(stderr, "open failed: %s\n", err.message); return; }
    ferry_model_info info;
    ferry_engine_info(e, &info);
    CHECK(info.prompt_chunk == 32);
    ferry_session *s = NULL;
    CHECK(ferry_session_new(e, 48, &s, &err) == FERRY_OK);
    int32_t toks[40];
    for (int i = 0; i < 40; i++) toks[i] = (int32_t)(3 + (i * 7) % (info.vocab - 3));
    float *logits = malloc(sizeof(float) * (size_t)info.vocab * 40);
    int seen[64] = {0};
    ferry_session_set_stage_callback(s, stage_count, seen);
    CHECK(ferry_session_eval(s, toks, 40, logits, 1, &err) == FERRY_OK);
    CHECK(seen[0] == 2 && seen[info.n_layers + 1] == 2); /* two chunks: 32 + 8 */
    CHECK(ferry_session_position(s) == 40);
    CHECK(ferry_session_eval(s, toks, 9, logits, 0, &err) == FERRY_E_CONTEXT);
    CHECK(ferry_session_position(s) == 40);
    CHECK(ferry_session_truncate(s, 41, &err) == FERRY_E_ARG);
    CHECK(ferry_session_truncate(s, 10, &err) == FERRY_OK);
    ferry_session_request_cancel(s);
    CHECK(ferry_session_eval(s, toks, 1, logits, 0, &err) == FERRY_E_CANCELLED);
    CHECK(ferry_session_eval(s, toks, 1, logits, 0, &err) == FERRY_OK);
    int32_t bad_tok = info.vocab;
    CHECK(ferry_session_eval(s, &bad_tok, 1, logits, 0, &err) == FERRY_E_ARG);
    ferry_stats st;
    ferry_session_stats(s, &st);
    CHECK(st.prompt_tokens == 40 && st.decode_tokens == 1);
    CHECK(info.n_moe_layers == 0 || st.expert_reads > 0);
    free(logits);
    ferry_session_free(s);
    ferry_engine_close(e);
    CHECK(ferry_verify(path, NULL, NULL, &err) == FERRY_OK);
    /* A budget below the floor. */
    opts.ram_budget = 4096;
    CHECK(ferry_engine_open(path, &opts, &e, &err) == FERRY_E_BUDGET && strstr(err.message, "budget"));
}

static void test_bad_container(const char *path) {
    ferry_open_options opts;
    ferry_open_options_init(&opts);
    opts.n_threads = 1;
    ferry_engine *e = NULL;
    ferry_error err;
    ferry_status st = ferry_engine_open(path, &opts, &e, &err);
    if (st == FERRY_OK) { /* a harmless mutation: it must then also run */
        ferry_session *s = NULL;
        if (ferry_session_new(e, 8, &s, &err) == FERRY_OK) {
            int32_t t = 3;
            ferry_session_eval(s, &t, 1, NULL, 0, &err);
            ferry_session_free(s);
        }
        ferry_engine_close(e);
        passed++;
        return;
    }
    CHECK(e == NULL && err.code == (int)st && err.message[0] != '\0');
    /* verify reads the same damaged manifest: it too must refuse, not crash. */
    CHECK(ferry_verify(path, NULL, NULL, &err) != FERRY_OK && err.message[0] != '\0');
}


/* Routing of one token, both rules, on random logits: experts per token N
 * gives the exact top-k's first N (renormalised like the model's k); N = k and
 * margin 0 give the exact choice and weights bit for bit; a cache-aware margin
 * only swaps choices within the margin for experts in RAM. */
static void route_once(fe_route_params *p, const float *logits, const uint8_t *ram, int *ids, float *w, int *swapped) {
    enum { E = 64 };
    float l[E], choice[E], group[E];
    uint8_t mark[E] = {0};
    memcpy(l, logits, sizeof l);
    fe_moe_route(p, l, choice, group, mark, ram, ids, w, swapped);
    for (int e = 0; e < E; e++) CHECK(mark[e] == 0);
}

/* The top-k selection (one pass, an ordered list of the best so far) against
 * the rule it must keep: the k highest keys, highest first, equal keys in
 * ascending id, on K3's 896 experts top-16 with many ties; with the sigmoid
 * rule's group limit, the keys of dropped groups (-inf) never chosen. */
static void test_routing_ties(void) {
    enum { E = 896, K = 16 };
    static float logits[E], l[E], choice[E], group[E], bias[E];
    static uint8_t mark[E];
    uint64_t x = 0x9E3779B97F4A7C15ull;
    int total_swaps = 0;
    for (int trial = 0; trial < 60; trial++) {
        int levels = 2 + trial % 9; /* few distinct values: many ties */
        for (int e = 0; e < E; e++) {
            x ^= x << 13; x ^= x >> 7; x ^= x << 17;
            logits[e] = (float)((x >> 11) % (uint64_t)levels) - 1.0f;
            bias[e] = 0.0f;
        }
        int kind = trial % 2;
        fe_route_params p = {.kind = kind, .n_experts = E, .top_k = K, .norm = 1, .scale = 1.0f,
                             .n_group = kind ? 8 : 0, .topk_group = kind ? 3 : 0, .norm_eps = 1e-20f, .bias = bias};
        int ids[K], sw;
        float w[K];
        memcpy(l, logits, sizeof l);
        CHECK(fe_moe_route(&p, l, choice, group, mark, NULL, ids, w, &sw) == K);
        const float *key = kind ? choice : l; /* the keys the rule compared (group-limited for sigmoid) */
        uint8_t taken[E] = {0};
        for (int r = 0; r < K; r++) {
            int best = -1;
            for (int e = 0; e < E; e++)
                if (!taken[e] && key[e] != -INFINITY && (best < 0 || key[e] > key[best])) best = e;
            CHECK(ids[r] == best);
            if (best >= 0) taken[best] = 1;
        }
        /* Cache-aware routing against its rule, applied the slow way: the
         * weakest cold choice within the margin gives way to the best expert
         * in RAM within the margin below the last choice, and so on. */
        static uint8_t ram[E];
        for (int e = 0; e < E; e++) { x ^= x << 13; x ^= x >> 7; x ^= x << 17; ram[e] = (x >> 5) % 4 == 0; }
        p.margin = kind ? 0.3f : 1.5f;
        int got[K];
        memcpy(l, logits, sizeof l);
        fe_moe_route(&p, l, choice, group, mark, ram, got, w, &sw);
        for (int e = 0; e < E; e++) CHECK(mark[e] == 0);
        const float ref = key[ids[K - 1]];
        int want[K], n_sw = 0;
        memcpy(want, ids, sizeof want);
        memset(taken, 0, sizeof taken);
        for (int r = 0; r < K; r++) taken[ids[r]] = 1;
        for (int r = K - 1; r >= 0; r--) {
            float v = key[want[r]];
            int above = kind ? v <= ref + p.margin : v <= ref * expf(p.margin);
            if (ram[want[r]] || !above) continue;
            int best = -1;
            for (int e = 0; e < E; e++) {
                int below = kind ? key[e] >= ref - p.margin : key[e] >= ref * expf(-p.margin);
                if (taken[e] || !ram[e] || key[e] == -INFINITY || !below) continue;
                if (best < 0 || key[e] > key[best]) best = e;
            }
            if (best < 0) break;
            taken[best] = 1;
            want[r] = best;
            n_sw++;
        }
        CHECK(sw == n_sw);
        total_swaps += sw;
        for (int r = 0; r < K; r++) { /* the same set, in rank order */
            int found = 0;
            for (int j = 0; j < K; j++) found |= got[r] == want[j];
            CHECK(found);
            if (r) CHECK(key[got[r]] < key[got[r - 1]] || (key[got[r]] == key[got[r - 1]] && got[r] > got[r - 1]));
        }
        p.margin = 0.0f;
    }
    CHECK(total_swaps > 60); /* the rule was exercised */
}

static void test_routing(void) {
    enum { E = 64, K = 8 };
    float bias[E];
    uint64_t x = 88172645463325252ull;
    int total_swaps[2] = {0, 0};
    for (int kind = 0; kind < 2; kind++)
        for (int trial = 0; trial < 40; trial++) {
            float logits[E];
            uint8_t ram[E];
            for (int e = 0; e < E; e++) {
                x ^= x << 13; x ^= x >> 7; x ^= x << 17;
                logits[e] = (float)((x >> 11) % 20000) / 5000.0f - 2.0f;
                bias[e] = (float)((x >> 40) % 100) / 1000.0f;
                ram[e] = (x >> 3) % 3 == 0;
            }
            fe_route_params p = {.kind = kind, .n_experts = E, .top_k = K, .norm = 1, .scale = kind ? 2.5f : 1.0f,
                                 .n_group = kind ? 8 : 0, .topk_group = kind ? 4 : 0, .norm_eps = kind ? 1e-20f : 0,
                                 .bias = bias};
            int exact[K], ids[K], sw;
            float we[K], w[K];
            route_once(&p, logits, NULL, exact, we, &sw);
            for (int r = 1; r < K; r++) CHECK(exact[r] != exact[r - 1]);
            p.k_used = K;
            route_once(&p, logits, ram, ids, w, &sw);
            CHECK(memcmp(ids, exact, sizeof ids) == 0 && memcmp(w, we, sizeof w) == 0 && sw == 0);
            for (int n = 1; n < K; n++) { /* fewer experts per token: the exact top n, weights renormalised */
                p.k_used = n;
                route_once(&p, logits, NULL, ids, w, &sw);
                float sum = 0;
                for (int r = 0; r < n; r++) { CHECK(ids[r] == exact[r]); sum += w[r]; }
                CHECK(fabsf(sum - p.scale) < 1e-5f);
            }
            p.norm = 0; /* a model that does not renormalise: the n carry the k's weight */
            p.k_used = 0;
            route_once(&p, logits, NULL, exact, we, &sw);
            float mass = 0;
            for (int r = 0; r < K; r++) mass += we[r];
            p.k_used = 3;
            route_once(&p, logits, NULL, ids, w, &sw);
            CHECK(ids[0] == exact[0] && ids[2] == exact[2] && fabsf(w[0] + w[1] + w[2] - mass) < 1e-5f * mass);
            CHECK(w[0] / w[1] > we[0] / we[1] * 0.9999f && w[0] / w[1] < we[0] / we[1] * 1.0001f);
            p.norm = 1;
            p.k_used = 0;
            route_once(&p, logits, NULL, exact, we, &sw);
            p.margin = kind ? 0.05f : 0.5f;
            route_once(&p, logits, ram, ids, w, &sw);
            /* the scores the rule compares: softmax probabilities, or sigmoid + bias */
            float key[E], mx = -1e30f, z = 0;
            for (int e = 0; e < E; e++) mx = logits[e] > mx ? logits[e] : mx;
            for (int e = 0; e < E; e++) z += expf(logits[e] - mx);
            for (int e = 0; e < E; e++)
                key[e] = kind ? 1.0f / (1.0f + expf(-logits[e])) + bias[e] : expf(logits[e] - mx) / z;
            float ref = key[exact[K - 1]];
            int changed = 0;
            for (int r = 0; r < K; r++) {
                int in_exact = 0;
                for (int j = 0; j < K; j++) in_exact |= ids[r] == exact[j];
                if (!in_exact) { /* a swap: in RAM and within the margin below the last exact choice */
                    changed++;
                    CHECK(ram[ids[r]]);
                    CHECK(kind ? key[ids[r]] >= ref - p.margin - 1e-6f : key[ids[r]] >= ref * expf(-p.margin) * 0.999f);
                }
                if (r) CHECK(key[ids[r]] <= key[ids[r - 1]]); /* still in rank order */
            }
            CHECK(changed == sw);
            total_swaps[kind] += sw;
            for (int j = 0; j < K; j++) { /* an exact choice dropped was cold and within the margin above */
                int kept = 0;
                for (int r = 0; r < K; r++) kept |= ids[r] == exact[j];
                if (!kept) {
                    CHECK(!ram[exact[j]]);
                    CHECK(kind ? key[exact[j]] <= ref + p.margin + 1e-6f : key[exact[j]] <= ref * expf(p.margin) * 1.001f);
                }
            }
        }
    CHECK(total_swaps[0] > 0 && total_swaps[1] > 0); /* the margins above do move some choices */
}

/* The readers share each job in FE_IO_CHUNK pieces: jobs of several pieces
 * (and a last partial one) come back whole and right, with the CRC the last
 * piece's reader computes; a job cut short by the end of the file says so;
 * a job being read cannot be taken back. */
static void test_io_pieces(void) {
    char path[] = "/tmp/ferry-test-io-XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    if (fd < 0) return;
    const uint64_t size = 2 * FE_IO_CHUNK + 12288, n = 3, total = n * size;
    uint8_t *src = malloc(total);
    CHECK(src != NULL);
    for (uint64_t i = 0; i < total; i++) src[i] = (uint8_t)(i * 2654435761u >> 13);
    CHECK(pwrite(fd, src, total, 0) == (ssize_t)total);
    for (int readers = 1; readers <= 4; readers += 3) {
        fe_io *io = fe_io_new(readers);
        CHECK(io != NULL);
        fe_io_job jobs[4];
        memset(jobs, 0, sizeof jobs);
        uint8_t *bufs[4];
        for (uint64_t j = 0; j < 4; j++) {
            bufs[j] = malloc(size);
            jobs[j].fd = fd;
            jobs[j].buf = bufs[j];
            jobs[j].size = size;
            jobs[j].offset = j == 3 ? 2 * size + 4096 : j * size; /* the last one runs past the end */
            jobs[j].crc_from = 64;
            jobs[j].crc_len = j == 1 ? size - 64 : 0;
            fe_io_submit(io, &jobs[j], j == 2);
        }
        unsigned seen = 0; /* wait_any: returns once a completion follows the snapshot, never misses one */
        for (int landed = 0; landed < 4;) {
            fe_io_wait_any(io, &seen);
            landed = 0;
            for (uint64_t j = 0; j < 4; j++) landed += fe_io_is_done(io, &jobs[j]);
            CHECK(seen >= 1 && (unsigned)landed >= seen && fe_io_completions(io) >= seen);
        }
        for (uint64_t j = 0; j < 4; j++) fe_io_wait(io, &jobs[j]);
        for (uint64_t j = 0; j < 3; j++) {
            CHECK(jobs[j].err_no == 0 && jobs[j].got == size);
            CHECK(memcmp(bufs[j], src + j * size, size) == 0);
            CHECK(jobs[j].claimed == size && jobs[j].inflight == 0 && jobs[j].seconds >= 0.0);
        }
        CHECK(jobs[1].crc == fe_crc32(0, src + size + 64, size - 64));
        CHECK(jobs[3].err_no == -1 && jobs[3].got == size - 4096);
        CHECK(fe_io_cancel(io, &jobs[0]) == 0); /* done: not in the queue */
        fe_io_free(io);
        for (int j = 0; j < 4; j++) free(bufs[j]);
    }
    free(src);
    close(fd);
    unlink(path);
}

/* The queue depth's hill climb (io.h) on model disks, rates with +-20 %
 * noise: one that serves concurrent reads no faster than one at a time ends
 * shallow, one whose rate grows with the depth ends at every reader, one
 * that saturates at 2 ends at 2 (or 1-4: within the margin); it keeps
 * probing but spends most epochs at its choice; one reader stays at 1. */
static void test_io_depth(void) {
    uint32_t rng = 12345;
    for (int disk = 0; disk < 3; disk++) {
        fe_io_depth d;
        fe_io_depth_init(&d, 8);
        CHECK(d.n == 4 && d.level[0] == 1 && d.level[3] == 8 && d.level[d.at] == 8);
        int q = 8, at[9] = {0};
        for (int epoch = 0; epoch < 400; epoch++) {
            rng = rng * 1664525u + 1013904223u;
            const double noise = 0.8 + 0.4 * (double)(rng >> 8) / (double)(1u << 24);
            const double ideal = disk == 0 ? 1.0 : disk == 1 ? (double)q : (q >= 2 ? 2.0 : 1.0);
            q = fe_io_depth_step(&d, 1e9 * ideal * noise);
            CHECK(q == 1 || q == 2 || q == 4 || q == 8);
            if (epoch >= 100) at[q]++;
        }
        if (disk == 0) CHECK(at[1] + at[2] >= 250);
        if (disk == 1) CHECK(at[8] >= 250);
        if (disk == 2) CHECK(at[2] + at[1] + at[4] >= 250 && at[8] < 50);
    }
    fe_io_depth one;
    fe_io_depth_init(&one, 1);
    for (int i = 0; i < 20; i++) CHECK(fe_io_depth_step(&one, 1e9 * (i % 3 + 1)) == 1);
    fe_io_depth six; /* not a power of two: 1, 2, 4, 6 */
    fe_io_depth_init(&six, 6);
    CHECK(six.n == 4 && six.level[3] == 6);
}

int main(int argc, char **argv) {
    test_io_depth();
    test_crc32();
    test_alloc_huge();
    test_json();
    test_formats();
    test_pool();
    test_matmul_inline();
    test_io_pieces();
    test_routing();
    test_routing_ties();
    if (argc > 1) test_good_container(argv[1]);
    for (int i = 2; i < argc; i++) test_bad_container(argv[i]);
    CHECK(strcmp(ferry_status_name(FERRY_E_CHECKSUM), "FERRY_E_CHECKSUM") == 0);
    CHECK(strcmp(ferry_status_name(999), "FERRY_E_UNKNOWN") == 0);
    printf("%d passed, %d failed\n", passed, failed);
    return failed != 0;
}
