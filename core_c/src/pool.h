/* pool.h — a fixed set of compute threads that split a range of work. */
#ifndef FERRY_POOL_H
#define FERRY_POOL_H

#include <stdint.h>

/* Work over items [start, end) on thread `tid` (0 = the caller). */
typedef void (*fe_pool_fn)(void *ctx, int start, int end, int tid);

typedef struct fe_pool fe_pool;

/* A pool of n_threads (the caller counts as one). NULL on failure. */
fe_pool *fe_pool_new(int n_threads);
void fe_pool_free(fe_pool *pool);
int fe_pool_threads(const fe_pool *pool);

/* Run fn over [0, n) split into one contiguous slice per thread, in parallel,
 * and return when all slices are done. Which thread computes which item
 * depends only on n and the thread count, so results are reproducible. */
void fe_pool_run(fe_pool *pool, fe_pool_fn fn, void *ctx, int n);

/* Profile counters the pool adds to (either may be NULL: not counted): the
 * caller's seconds waiting for the other threads at the end of each job, and
 * the number of jobs handed to the threads. */
void fe_pool_set_profile(fe_pool *pool, double *wait_seconds, uint64_t *jobs);

#endif
