/* test_pool.c — the thread pool alone, built with ThreadSanitizer by
 * tests/engine/test_pool.py: every item of every job computed exactly once,
 * with jobs back to back (threads spinning), jobs after naps (threads
 * asleep), and busy threads beside the pool (the back-off to sleeping), also
 * while the process's own watched work runs. */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "../src/pool.h"

static void mark(void *p, int start, int end, int tid) {
    (void)tid;
    unsigned char *hits = p;
    for (int i = start; i < end; i++) hits[i]++;
}

static atomic_int stop_busy;

static void *busy(void *unused) {
    (void)unused;
    volatile unsigned long x = 0;
    while (!atomic_load(&stop_busy)) x++;
    return NULL;
}

static int rounds(fe_pool *p, int count) {
    static unsigned char hits[5000];
    for (int r = 0; r < count; r++) {
        int n = 2 + (r * 37) % 4000;
        memset(hits, 0, sizeof hits);
        if (r % 100 == 0) {
            struct timespec nap = {0, 3000000};
            nanosleep(&nap, NULL);
        }
        fe_pool_run(p, mark, hits, n);
        for (int i = 0; i < n; i++)
            if (hits[i] != 1) {
                printf("FAIL: round %d item %d computed %d times\n", r, i, hits[i]);
                return 1;
            }
    }
    return 0;
}

int main(void) {
    fe_pool *p = fe_pool_new(3);
    if (!p) { printf("FAIL: no pool\n"); return 1; }
    int bad = rounds(p, 1500);
    /* oversubscribed: four busy threads beside the pool's three, started and
     * stopped several times, so that jobs switch between the spinning pool's
     * claimed chunks and the backed-off pool's static slices */
    for (int phase = 0; phase < 4 && !bad; phase++) {
        pthread_t t[4];
        atomic_store(&stop_busy, 0);
        for (int i = 0; i < 4; i++) pthread_create(&t[i], NULL, busy, NULL);
        bad |= rounds(p, 400);
        atomic_store(&stop_busy, 1);
        for (int i = 0; i < 4; i++) pthread_join(t[i], NULL);
        bad |= rounds(p, 300);
    }
    /* the process's own work (the expert readers) running: a lost core is
     * not counted then, but a thread short of CPU over a window still is, so
     * beside busy threads a watched pool backs off all the same */
    fe_own_work own;
    atomic_init(&own.busy, 0);
    atomic_init(&own.last_ns, 0);
    atomic_init(&own.cpu_ns, 0);
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    const long long now = (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
    if (fe_pool_own_work_explains(NULL, now) || fe_pool_own_work_explains(&own, now)) {
        printf("FAIL: no own work explains a lost core\n");
        bad = 1;
    }
    const long long own0 = fe_own_work_begin(&own);
    if (!fe_pool_own_work_explains(&own, now)) {
        printf("FAIL: own work running does not explain a lost core\n");
        bad = 1;
    }
    fe_pool *q = fe_pool_new(3); /* a fresh pool, spinning (p may still be backed off) */
    if (!q) { printf("FAIL: no pool\n"); return 1; }
    fe_pool_watch(q, &own);
    fe_pool_stats before, after;
    fe_pool_get_stats(q, &before);
    if (!bad) {
        pthread_t t[4];
        atomic_store(&stop_busy, 0);
        for (int i = 0; i < 4; i++) pthread_create(&t[i], NULL, busy, NULL);
        /* until it backs off (a CPU-share window is a few ms awake), for at most 10 s */
        for (int r = 0; r < 200 && !bad; r++) {
            bad |= rounds(q, 100);
            fe_pool_get_stats(q, &after);
            if (after.backoffs != before.backoffs) break;
        }
        atomic_store(&stop_busy, 1);
        for (int i = 0; i < 4; i++) pthread_join(t[i], NULL);
    }
    fe_pool_get_stats(q, &after);
    fe_pool_free(q);
    if (!bad && after.backoffs == before.backoffs) {
        printf("FAIL: a watched pool beside busy threads never backed off\n");
        bad = 1;
    }
    fe_own_work_end(&own, own0);
    clock_gettime(CLOCK_MONOTONIC, &ts);
    const long long end = (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
    if (!fe_pool_own_work_explains(&own, end) || fe_pool_own_work_explains(&own, end + 2 * FE_POOL_OWN_GRACE_NS)) {
        printf("FAIL: own work's grace after its end\n");
        bad = 1;
    }
    bad |= rounds(p, 300);
    fe_pool_stats st;
    fe_pool_get_stats(p, &st);
    printf("spin_ns %lld backoffs %llu won %llu lost %llu\n", (long long)st.spin_ns,
           (unsigned long long)st.backoffs, (unsigned long long)st.spins_won, (unsigned long long)st.spins_lost);
    fe_pool_free(p);
    if (!bad) printf("ok\n");
    return bad;
}
