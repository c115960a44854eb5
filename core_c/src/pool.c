/* pool.c — see pool.h. One mutex, two condition variables, a generation count. */
#define _POSIX_C_SOURCE 200809L
#include "pool.h"

#include <pthread.h>
#include <stdlib.h>
#include <time.h>

struct fe_pool {
    int n_threads;          /* workers + the caller */
    pthread_t *workers;     /* n_threads - 1 threads */
    pthread_mutex_t mu;     /* guards everything below */
    pthread_cond_t wake;    /* a new job or shutdown */
    pthread_cond_t done;    /* the last worker finished */
    unsigned generation;    /* bumped for every job */
    int pending;            /* workers still running the current job */
    int shutdown;           /* workers should exit */
    fe_pool_fn fn;          /* the current job */
    void *ctx;
    int n;
    double *wait_seconds;   /* profile: the caller's wait at the end of jobs, or NULL */
    uint64_t *jobs;         /* profile: jobs dispatched, or NULL */
};

typedef struct { fe_pool *pool; int tid; } worker_arg;

static void slice(int n, int parts, int i, int *start, int *end) {
    *start = (int)((long long)n * i / parts);
    *end = (int)((long long)n * (i + 1) / parts);
}

static void *worker_main(void *p) {
    worker_arg *arg = p;
    fe_pool *pool = arg->pool;
    int tid = arg->tid;
    free(arg);
    unsigned seen = 0;
    pthread_mutex_lock(&pool->mu);
    while (1) {
        while (!pool->shutdown && pool->generation == seen) pthread_cond_wait(&pool->wake, &pool->mu);
        if (pool->shutdown) break;
        seen = pool->generation;
        fe_pool_fn fn = pool->fn;
        void *ctx = pool->ctx;
        int start, end;
        slice(pool->n, pool->n_threads, tid, &start, &end);
        pthread_mutex_unlock(&pool->mu);
        if (start < end) fn(ctx, start, end, tid);
        pthread_mutex_lock(&pool->mu);
        if (--pool->pending == 0) pthread_cond_signal(&pool->done);
    }
    pthread_mutex_unlock(&pool->mu);
    return NULL;
}

fe_pool *fe_pool_new(int n_threads) {
    if (n_threads < 1) n_threads = 1;
    fe_pool *pool = calloc(1, sizeof *pool);
    if (!pool) return NULL;
    pool->n_threads = 1;
    pthread_mutex_init(&pool->mu, NULL);
    pthread_cond_init(&pool->wake, NULL);
    pthread_cond_init(&pool->done, NULL);
    pool->workers = calloc((size_t)n_threads, sizeof *pool->workers);
    if (!pool->workers) { fe_pool_free(pool); return NULL; }
    for (int t = 1; t < n_threads; t++) {
        worker_arg *arg = malloc(sizeof *arg);
        if (!arg) break;
        arg->pool = pool;
        arg->tid = t;
        if (pthread_create(&pool->workers[t - 1], NULL, worker_main, arg) != 0) { free(arg); break; }
        pool->n_threads++;
    }
    return pool;
}

void fe_pool_free(fe_pool *pool) {
    if (!pool) return;
    pthread_mutex_lock(&pool->mu);
    pool->shutdown = 1;
    pthread_cond_broadcast(&pool->wake);
    pthread_mutex_unlock(&pool->mu);
    for (int t = 0; t < pool->n_threads - 1; t++) pthread_join(pool->workers[t], NULL);
    pthread_mutex_destroy(&pool->mu);
    pthread_cond_destroy(&pool->wake);
    pthread_cond_destroy(&pool->done);
    free(pool->workers);
    free(pool);
}

int fe_pool_threads(const fe_pool *pool) { return pool->n_threads; }

void fe_pool_set_profile(fe_pool *pool, double *wait_seconds, uint64_t *jobs) {
    pool->wait_seconds = wait_seconds;
    pool->jobs = jobs;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void fe_pool_run(fe_pool *pool, fe_pool_fn fn, void *ctx, int n) {
    if (pool->n_threads == 1 || n < 2) {
        if (n > 0) fn(ctx, 0, n, 0);
        return;
    }
    if (pool->jobs) (*pool->jobs)++;
    pthread_mutex_lock(&pool->mu);
    pool->fn = fn;
    pool->ctx = ctx;
    pool->n = n;
    pool->pending = pool->n_threads - 1;
    pool->generation++;
    pthread_cond_broadcast(&pool->wake);
    pthread_mutex_unlock(&pool->mu);
    int start, end;
    slice(n, pool->n_threads, 0, &start, &end);
    if (start < end) fn(ctx, start, end, 0);
    double t0 = pool->wait_seconds ? now_s() : 0.0;
    pthread_mutex_lock(&pool->mu);
    while (pool->pending > 0) pthread_cond_wait(&pool->done, &pool->mu);
    pthread_mutex_unlock(&pool->mu);
    if (pool->wait_seconds) *pool->wait_seconds += now_s() - t0;
}
