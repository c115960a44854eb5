/* pool.h — a fixed set of compute threads that split a range of work. */
#ifndef FERRY_POOL_H
#define FERRY_POOL_H

#include <stdatomic.h>
#include <stdint.h>

/* Work over items [start, end) on thread `tid` (0 = the caller). A job's
 * function may be called several times per thread, on disjoint ranges. */
typedef void (*fe_pool_fn)(void *ctx, int start, int end, int tid);

typedef struct fe_pool fe_pool;

/* A pool of n_threads (the caller counts as one). NULL on failure. */
fe_pool *fe_pool_new(int n_threads);
void fe_pool_free(fe_pool *pool);
int fe_pool_threads(const fe_pool *pool);

/* Run fn over [0, n) and return when every item is done. The range is cut
 * into contiguous chunks that depend only on n and the thread count; the
 * caller and the workers claim chunks until none is left, so a thread that
 * is late (asleep, or descheduled by a busy machine) leaves its share to the
 * others. Which thread computes a chunk varies from run to run: fn must
 * compute each item the same way on any thread (tid only picks scratch). */
void fe_pool_run(fe_pool *pool, fe_pool_fn fn, void *ctx, int n);

/* 1 while spinning is backed off (an oversubscribed machine, or a busy
 * reader of the expert cache beside the compute threads): a job handed to
 * the threads now costs a sleeping worker's wake-up, and the caller's own
 * when it waits for the worker, tens of microseconds on a virtual machine;
 * a small job runs faster on the caller alone. */
int fe_pool_backed_off(const fe_pool *pool);
/* Work of this process's own beside the pool's threads (the expert cache's
 * readers: a read's system call and its CRC take a core for a few hundred
 * microseconds on a 2-core machine). While `busy` > 0, or within
 * FE_POOL_OWN_GRACE_NS of `last_ns` (CLOCK_MONOTONIC), a thread that lost
 * its core is not taken for a sign of a busy machine: backing off would not
 * give those threads the core sooner, and costs every later job a wake-up.
 * A thread's CPU share over a window counts the own work's CPU time of that
 * window as its own: short of CPU beyond that, the machine is busy. */
typedef struct fe_own_work {
    _Atomic int busy;          /* pieces of own work running now */
    _Atomic long long last_ns; /* when the last one ended */
    _Atomic long long cpu_ns;  /* the CPU time they took, summed (their threads' clocks) */
} fe_own_work;
#define FE_POOL_OWN_GRACE_NS 1000000LL
/* Around a piece of own work on its thread: begin returns that thread's CPU clock, end takes it back. */
long long fe_own_work_begin(fe_own_work *w);
void fe_own_work_end(fe_own_work *w, long long cpu0);
/* The pool watches w (NULL: nothing) from now on; w outlives the pool. */
void fe_pool_watch(fe_pool *pool, const fe_own_work *w);
/* 1 when own work (w) explains a lost core at `now` (pure; for tests). */
int fe_pool_own_work_explains(const fe_own_work *w, long long now);
/* The caller slept `ns` nanoseconds outside the pool (waiting for a read it
 * needs): not counted as awake in its CPU share. Caller's thread only. */
void fe_pool_caller_slept(fe_pool *pool, int64_t ns);
/* Back off for `ns` nanoseconds from now, as if the machine were busy (tests). */
void fe_pool_hold_off(fe_pool *pool, int64_t ns);

/* Profile counters the pool adds to (NULL: not profiling): the caller's
 * seconds waiting for the other threads at the end of each job, the number
 * of jobs handed to the threads, of those the jobs run with spinning on, and
 * the back-offs seen meanwhile. */
typedef struct fe_pool_profile {
    double *wait_seconds;
    uint64_t *jobs, *spin_jobs, *backoffs;
} fe_pool_profile;
void fe_pool_set_profile(fe_pool *pool, const fe_pool_profile *prof);

/* What the pool's adaptation is doing (tests, benchmarks): the current spin
 * budget in nanoseconds (0 while spinning is backed off) and how many times
 * it detected an oversubscribed machine. */
typedef struct fe_pool_stats {
    int64_t spin_ns;
    uint64_t backoffs;
    uint64_t spins_won;   /* idle waits that ended in a job while spinning */
    uint64_t spins_lost;  /* idle waits that spun out and slept */
} fe_pool_stats;
void fe_pool_get_stats(const fe_pool *pool, fe_pool_stats *out);

/* The back-off rule (tests): the period in nanoseconds a back-off at `now`
 * takes, after a last period of `last_ns` that ended (or ends) at `ended`.
 * Twice the last (up to 1 s) while the signals keep coming, 20 ms for a new
 * episode: one more than 40 ms after the last period ended. */
int64_t fe_pool_next_backoff(int64_t last_ns, int64_t now, int64_t ended);

#endif
