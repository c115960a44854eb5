/* test_pool.c — the thread pool alone, built with ThreadSanitizer by
 * tests/engine/test_pool.py: every item of every job computed exactly once,
 * with jobs back to back (threads spinning), jobs after naps (threads
 * asleep), and busy threads beside the pool (the back-off to sleeping). */
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
    fe_pool_stats st;
    fe_pool_get_stats(p, &st);
    printf("spin_ns %lld backoffs %llu won %llu lost %llu\n", (long long)st.spin_ns,
           (unsigned long long)st.backoffs, (unsigned long long)st.spins_won, (unsigned long long)st.spins_lost);
    fe_pool_free(p);
    if (!bad) printf("ok\n");
    return bad;
}
