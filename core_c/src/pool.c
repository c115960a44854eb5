/* pool.c — see pool.h.
 *
 * A job is published as one atomic word: generation (32 bits) | chunks (16) |
 * next unclaimed chunk (16). Every thread, the caller included, claims chunks
 * by compare-and-swap until none is left; the last one to finish a chunk
 * completes the job. A thread out of work waits for the next job by spinning
 * (with the CPU's pause instruction) for a bounded, adaptive time and then
 * sleeping on a condition variable; the caller waits at the end of a job the
 * same way. The adaptation, all per pool:
 *
 *  - the spin budget grows (x2, up to SPIN_MAX_NS) when a thread that spun
 *    out and slept was woken soon after (spinning a little longer would have
 *    paid off) and shrinks (/2, down to SPIN_MIN_NS) after repeated idle
 *    periods far longer than the budget (spinning was wasted);
 *  - spinning stops altogether for a back-off period when the machine looks
 *    oversubscribed: a spinning thread saw a gap of more than PREEMPT_NS
 *    between two reads of the clock (it was descheduled), or the caller
 *    waited at the end of a job longer than PREEMPT_NS and a quarter of the
 *    job (the other thread was not running), or the caller ran every
 *    chunk of a job longer than ABSENT_NS while no worker was asleep (the
 *    spinning workers were not running), or a worker or the caller got
 *    less than CPU_SHARE_MIN of the wall time over a few milliseconds awake
 *    (its thread CPU clock against the wall clock; for the caller, over
 *    jobs less than CALLER_IDLE_NS apart). A lone signal is only noted (a
 *    virtual machine's host deschedules a vCPU now and then on a quiet
 *    machine); a second within STRIKE_NS backs off. The period doubles while the
 *    signals keep coming (BACKOFF_MIN_NS .. BACKOFF_MAX_NS): a back-off less
 *    than RECOVERED_NS after the last period ended; one after the pool spun
 *    clean for longer than that is a new episode and starts again at
 *    BACKOFF_MIN_NS. (An expert-cache reader waking now and then for a miss
 *    on an otherwise quiet machine takes a core for a few hundred
 *    microseconds, twice a read: measured, the old rule -- double unless 4
 *    periods passed since the last began -- kept the pool asleep for most of
 *    a decode at 50 % of the MoE bench's model, a period grown to 1 s in the
 *    prompt kept alive by a miss every few seconds.) The process's own
 *    watched work (fe_pool_watch: the expert readers) is not another
 *    program: a descheduled or absent thread while it runs or just after is
 *    not counted, the CPU-share test credits a thread with its CPU time,
 *    and the caller's waits for a read (fe_pool_caller_slept) are sleep,
 *    not awake time (counted, they backed the pool off in 2 of 5 rounds at
 *    50 % of that model, those rounds 0.80-0.85x the others, and for most
 *    of a tight-budget decode: docs/bench-log/2026-12-07.md, session 22).
 *    While a period lasts
 *    the pool behaves like a plain sleeping pool, and afterwards it probes
 *    by spinning again. A spinning thread on a busy machine takes the core
 *    the working thread needs; a sleeping one is woken with priority.
 */
#define _POSIX_C_SOURCE 200809L
#include "pool.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>

#define CHUNKS_PER_THREAD 8
#define MAX_CHUNKS 0x7fff
#define SPIN_MIN_NS 20000LL
#define SPIN_START_NS 100000LL
#define SPIN_MAX_NS 1000000LL
#define PREEMPT_NS 200000LL
#define BACKOFF_MIN_NS 20000000LL
#define BACKOFF_MAX_NS 1000000000LL
#define LONG_GAPS_TO_SHRINK 4
#define CPU_WINDOW_NS 4000000LL
#define ABSENT_NS 50000LL
#define CALLER_IDLE_NS 2000000LL
#define CPU_SHARE_MIN 0.75
#define STRIKE_NS 10000000LL
#define RECOVERED_NS 40000000LL

struct fe_pool {
    int n_threads;              /* workers + the caller */
    pthread_t *workers;         /* n_threads - 1 threads */
    pthread_mutex_t mu;         /* for sleeping only */
    pthread_cond_t wake;        /* a new job or shutdown (workers asleep) */
    pthread_cond_t done;        /* the job's last chunk finished (caller asleep) */
    /* The current job: written by the caller before `state` publishes it,
     * read by a thread only after it claimed one of its chunks. */
    fe_pool_fn fn;
    void *ctx;
    int n;
    _Atomic uint64_t state;     /* generation | static | chunks | next chunk */
    _Atomic uint32_t *seen;     /* [n_threads]: the last static job each worker ran */
    _Atomic int finished;       /* chunks of the current job finished */
    _Atomic int sleepers;       /* workers asleep (or about to be) on `wake` */
    _Atomic int caller_asleep;  /* the caller is asleep (or about to be) on `done` */
    _Atomic int shutdown;
    /* adaptation */
    _Atomic int64_t spin_ns;    /* the spin budget */
    _Atomic int64_t off_until;  /* no spinning before this time (ns) */
    _Atomic int64_t backoff_ns; /* the current back-off period */
    _Atomic int64_t last_strike;/* when a sign of oversubscription was last seen */
    _Atomic int long_gaps;      /* idle periods far longer than the budget, in a row */
    _Atomic uint64_t backoffs, spins_won, spins_lost;
    fe_pool_profile prof;       /* profile counters (all NULL: not profiling) */
    uint64_t backoffs_seen;     /* `backoffs` when the caller last looked */
    /* the caller's CPU share over a window of back-to-back jobs (caller only) */
    int64_t cw_wall, cw_cpu, cw_slept, c_last_end, cw_own;
    _Atomic(const fe_own_work *) own; /* this process's own work beside the threads (pool.h), or NULL */
};

typedef struct { fe_pool *pool; int tid; } worker_arg;

static uint32_t st_chunks(uint64_t s) { return (uint32_t)(s >> 16) & 0x7fffu; }
static int st_static(uint64_t s) { return (int)(s >> 31) & 1; }
#define STATIC_BIT (1ull << 31)
static uint32_t st_next(uint64_t s) { return (uint32_t)s & 0xffffu; }

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("isb" ::: "memory");
#endif
}

static void slice(int n, int parts, int i, int *start, int *end) {
    *start = (int)((long long)n * i / parts);
    *end = (int)((long long)n * (i + 1) / parts);
}

static int has_work(fe_pool *p, int tid) {
    uint64_t s = atomic_load_explicit(&p->state, memory_order_acquire);
    if (st_static(s)) return (uint32_t)(s >> 32) != atomic_load_explicit(&p->seen[tid], memory_order_relaxed);
    return st_next(s) < st_chunks(s);
}

static int job_done(fe_pool *p, int chunks) {
    return atomic_load_explicit(&p->finished, memory_order_acquire) >= chunks;
}

static int spinning_allowed(fe_pool *p, int64_t now) {
    return now >= atomic_load_explicit(&p->off_until, memory_order_relaxed);
}

/* The own work's CPU time so far (0 without any watched). */
static int64_t own_cpu(fe_pool *p) {
    const fe_own_work *w = atomic_load_explicit(&p->own, memory_order_relaxed);
    return w ? (int64_t)atomic_load_explicit(&((fe_own_work *)w)->cpu_ns, memory_order_relaxed) : 0;
}

/* The back-off rule (pool.h). */
int64_t fe_pool_next_backoff(int64_t last_ns, int64_t now, int64_t ended) {
    if (now - ended > RECOVERED_NS) return BACKOFF_MIN_NS;
    return 2 * last_ns > BACKOFF_MAX_NS ? BACKOFF_MAX_NS : 2 * last_ns;
}

/* The machine looks oversubscribed: stop spinning for a while. A lone
 * signal is only noted: a virtual machine's vCPU is descheduled by its host
 * now and then on an otherwise quiet machine, and each back-off costs the
 * sleeping pool's wake-ups for BACKOFF_MIN_NS or more; a second signal
 * within STRIKE_NS (on a busy machine they come every few jobs) backs off. */
static void oversubscribed(fe_pool *p, int64_t now, int excusable) {
    if (excusable && fe_pool_own_work_explains(atomic_load_explicit(&p->own, memory_order_relaxed), now)) return;
    int64_t prev = atomic_exchange_explicit(&p->last_strike, now, memory_order_relaxed);
    if (now - prev > STRIKE_NS) return;
    int64_t b = fe_pool_next_backoff(atomic_load_explicit(&p->backoff_ns, memory_order_relaxed), now,
                                     atomic_load_explicit(&p->off_until, memory_order_relaxed));
    atomic_store_explicit(&p->backoff_ns, b, memory_order_relaxed);
    atomic_store_explicit(&p->off_until, now + b, memory_order_relaxed);
    atomic_fetch_add_explicit(&p->backoffs, 1, memory_order_relaxed);
}

/* Spin until ready(p, arg) or the budget runs out; 1 if ready. A gap in the
 * clock longer than PREEMPT_NS means this thread was descheduled. */
static int spin_until(fe_pool *p, int (*ready)(fe_pool *, int), int arg, int64_t t0, int64_t budget) {
    int64_t last = t0;
    for (;;) {
        int r = 0;
        for (int i = 0; i < 16 && !(r = ready(p, arg)); i++) cpu_relax();
        int64_t t = now_ns();
        if (t - last > PREEMPT_NS) { /* also when the wait ended meanwhile */
            oversubscribed(p, t, 1);
            return r || ready(p, arg);
        }
        if (r) return 1;
        last = t;
        if (t - t0 > budget) return ready(p, arg);
    }
}

static int worker_ready(fe_pool *p, int tid) {
    return has_work(p, tid) || atomic_load_explicit(&p->shutdown, memory_order_relaxed);
}

static void finish_chunk(fe_pool *p, int chunks, int tid) {
    if (atomic_fetch_add(&p->finished, 1) + 1 == chunks && tid != 0 && atomic_load(&p->caller_asleep)) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_signal(&p->done);
        pthread_mutex_unlock(&p->mu);
    }
}

/* Claim and run chunks of the current job until none is left; returns how
 * many this thread ran. */
static int help(fe_pool *p, int tid) {
    int ran = 0;
    uint64_t s = atomic_load_explicit(&p->state, memory_order_acquire);
    for (;;) {
        /* (checked on every reload: a failed claim may return a newer job,
         * and a static job's word must never be claimed from) */
        if (st_static(s)) { /* one slice per thread, as numbered (a busy machine) */
            uint32_t gen = (uint32_t)(s >> 32);
            if (gen == atomic_load_explicit(&p->seen[tid], memory_order_relaxed)) return ran;
            atomic_store_explicit(&p->seen[tid], gen, memory_order_relaxed);
            int start, end;
            slice(p->n, (int)st_chunks(s), tid, &start, &end);
            if (start < end) p->fn(p->ctx, start, end, tid);
            finish_chunk(p, (int)st_chunks(s), tid);
            return ran + 1;
        }
        if (st_next(s) >= st_chunks(s)) return ran;
        if (!atomic_compare_exchange_weak_explicit(&p->state, &s, s + 1, memory_order_acq_rel,
                                                   memory_order_acquire))
            continue;
        int chunks = (int)st_chunks(s), start, end;
        slice(p->n, chunks, (int)st_next(s), &start, &end);
        if (start < end) p->fn(p->ctx, start, end, tid);
        ran++;
        finish_chunk(p, chunks, tid);
        s = atomic_load_explicit(&p->state, memory_order_acquire);
    }
}

/* After an idle period that spun out and slept: would a longer spin have
 * paid off, or was spinning wasted? */
static void adapt_after_sleep(fe_pool *p, int64_t budget, int64_t idle) {
    if (idle < 4 * budget) {
        int64_t b = 2 * budget > SPIN_MAX_NS ? SPIN_MAX_NS : 2 * budget;
        atomic_store_explicit(&p->spin_ns, b, memory_order_relaxed);
        atomic_store_explicit(&p->long_gaps, 0, memory_order_relaxed);
    } else if (idle > 16 * budget &&
               atomic_fetch_add_explicit(&p->long_gaps, 1, memory_order_relaxed) + 1 >= LONG_GAPS_TO_SHRINK) {
        int64_t b = budget / 2 < SPIN_MIN_NS ? SPIN_MIN_NS : budget / 2;
        atomic_store_explicit(&p->spin_ns, b, memory_order_relaxed);
        atomic_store_explicit(&p->long_gaps, 0, memory_order_relaxed);
    }
}

static int64_t thread_cpu_ns(void) {
    struct timespec ts;
    if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) != 0) return -1;
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void *worker_main(void *arg_) {
    worker_arg *arg = arg_;
    fe_pool *p = arg->pool;
    int tid = arg->tid;
    free(arg);
    /* A window of this thread's awake time: if it got less than
     * CPU_SHARE_MIN of the wall time while it was awake (working or
     * spinning), other threads took its core: oversubscribed. */
    int64_t w0 = now_ns(), c0 = thread_cpu_ns(), o0 = own_cpu(p);
    for (;;) {
        help(p, tid);
        if (atomic_load(&p->shutdown)) break;
        int64_t t0 = now_ns(), budget = 0;
        if (t0 - w0 > CPU_WINDOW_NS) { /* (the CPU clock is a system call: read only while spinning is on) */
            int64_t c = spinning_allowed(p, t0) ? thread_cpu_ns() : -1, o = own_cpu(p);
            if (c >= 0 && c0 >= 0 && (double)(c - c0 + o - o0) < CPU_SHARE_MIN * (double)(t0 - w0)) oversubscribed(p, t0, 0);
            w0 = t0, c0 = c, o0 = o;
        }
        if (spinning_allowed(p, t0)) {
            budget = atomic_load_explicit(&p->spin_ns, memory_order_relaxed);
            if (spin_until(p, worker_ready, tid, t0, budget)) {
                atomic_fetch_add_explicit(&p->spins_won, 1, memory_order_relaxed);
                atomic_store_explicit(&p->long_gaps, 0, memory_order_relaxed);
                continue;
            }
            atomic_fetch_add_explicit(&p->spins_lost, 1, memory_order_relaxed);
        }
        pthread_mutex_lock(&p->mu);
        atomic_fetch_add(&p->sleepers, 1);
        while (!worker_ready(p, tid)) pthread_cond_wait(&p->wake, &p->mu);
        atomic_fetch_sub(&p->sleepers, 1);
        pthread_mutex_unlock(&p->mu);
        w0 = now_ns(); /* a new awake window */
        c0 = spinning_allowed(p, w0) ? thread_cpu_ns() : -1, o0 = own_cpu(p);
        if (budget > 0) adapt_after_sleep(p, budget, w0 - t0);
    }
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
    atomic_init(&pool->state, 0);
    atomic_init(&pool->finished, 0);
    atomic_init(&pool->sleepers, 0);
    atomic_init(&pool->caller_asleep, 0);
    atomic_init(&pool->shutdown, 0);
    atomic_init(&pool->spin_ns, SPIN_START_NS);
    atomic_init(&pool->off_until, 0);
    atomic_init(&pool->backoff_ns, BACKOFF_MIN_NS);
    atomic_init(&pool->last_strike, INT64_MIN / 2);
    atomic_init(&pool->long_gaps, 0);
    atomic_init(&pool->backoffs, 0);
    atomic_init(&pool->spins_won, 0);
    atomic_init(&pool->spins_lost, 0);
    pool->workers = calloc((size_t)n_threads, sizeof *pool->workers);
    pool->seen = calloc((size_t)n_threads, sizeof *pool->seen);
    if (!pool->workers || !pool->seen) { fe_pool_free(pool); return NULL; }
    for (int t = 0; t < n_threads; t++) atomic_init(&pool->seen[t], 0);
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
    atomic_store(&pool->shutdown, 1);
    pthread_cond_broadcast(&pool->wake);
    pthread_mutex_unlock(&pool->mu);
    for (int t = 0; t < pool->n_threads - 1; t++) pthread_join(pool->workers[t], NULL);
    pthread_mutex_destroy(&pool->mu);
    pthread_cond_destroy(&pool->wake);
    pthread_cond_destroy(&pool->done);
    free(pool->workers);
    free((void *)pool->seen);
    free(pool);
}

int fe_pool_threads(const fe_pool *pool) { return pool->n_threads; }

void fe_pool_set_profile(fe_pool *pool, const fe_pool_profile *prof) {
    fe_pool_profile none = {NULL, NULL, NULL, NULL};
    pool->prof = prof && prof->wait_seconds && prof->jobs && prof->spin_jobs && prof->backoffs ? *prof : none;
    pool->backoffs_seen = atomic_load(&pool->backoffs);
}

int fe_pool_backed_off(const fe_pool *pool) {
    return pool->n_threads > 1 && !spinning_allowed((fe_pool *)pool, now_ns());
}

long long fe_own_work_begin(fe_own_work *w) {
    atomic_fetch_add_explicit(&w->busy, 1, memory_order_relaxed);
    return (long long)thread_cpu_ns();
}

void fe_own_work_end(fe_own_work *w, long long cpu0) {
    const int64_t c = thread_cpu_ns();
    if (c >= 0 && cpu0 >= 0) atomic_fetch_add_explicit(&w->cpu_ns, (long long)(c - cpu0), memory_order_relaxed);
    atomic_store_explicit(&w->last_ns, (long long)now_ns(), memory_order_relaxed);
    atomic_fetch_sub_explicit(&w->busy, 1, memory_order_relaxed);
}

int fe_pool_own_work_explains(const fe_own_work *w, long long now) {
    if (!w) return 0;
    return atomic_load_explicit(&((fe_own_work *)w)->busy, memory_order_relaxed) > 0 ||
           now - atomic_load_explicit(&((fe_own_work *)w)->last_ns, memory_order_relaxed) < FE_POOL_OWN_GRACE_NS;
}

void fe_pool_caller_slept(fe_pool *pool, int64_t ns) { pool->cw_slept += ns > 0 ? ns : 0; }

void fe_pool_watch(fe_pool *pool, const fe_own_work *w) { atomic_store_explicit(&pool->own, w, memory_order_relaxed); }

void fe_pool_hold_off(fe_pool *pool, int64_t ns) {
    atomic_store_explicit(&pool->off_until, now_ns() + ns, memory_order_relaxed);
}

void fe_pool_get_stats(const fe_pool *pool, fe_pool_stats *out) {
    fe_pool *p = (fe_pool *)pool;
    out->spin_ns = spinning_allowed(p, now_ns()) ? atomic_load(&p->spin_ns) : 0;
    out->backoffs = atomic_load(&p->backoffs);
    out->spins_won = atomic_load(&p->spins_won);
    out->spins_lost = atomic_load(&p->spins_lost);
}

void fe_pool_run(fe_pool *p, fe_pool_fn fn, void *ctx, int n) {
    if (p->n_threads == 1 || n < 2) {
        if (n > 0) fn(ctx, 0, n, 0);
        return;
    }
    /* A quiet machine: chunks claimed by whoever is free (threads spin
     * between jobs). Spinning backed off (a busy machine): one slice per
     * thread, the caller sleeping until the others are done, as a plain
     * sleeping pool; a caller that kept computing the late workers' share
     * would run as a CPU hog and be scheduled behind threads that sleep. */
    const int statik = !spinning_allowed(p, now_ns());
    int chunks = statik ? p->n_threads : p->n_threads * CHUNKS_PER_THREAD;
    if (chunks > n && !statik) chunks = n;
    if (chunks > MAX_CHUNKS) chunks = MAX_CHUNKS;
    p->fn = fn;
    p->ctx = ctx;
    p->n = n;
    atomic_store_explicit(&p->finished, 0, memory_order_relaxed);
    uint64_t gen = ((atomic_load_explicit(&p->state, memory_order_relaxed) >> 32) + 1) & 0xffffffffu;
    if (gen == 0) gen = 1; /* 0 is every worker's `seen` before its first static job */
    atomic_store(&p->state, (gen << 32) | (statik ? STATIC_BIT : 0) | ((uint64_t)chunks << 16)); /* publishes the job */
    if (atomic_load(&p->sleepers) > 0) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_broadcast(&p->wake);
        pthread_mutex_unlock(&p->mu);
    }
    const int64_t t_pub = now_ns();
    if (t_pub - p->c_last_end > CALLER_IDLE_NS) /* idle since the last job: a new window */
        p->cw_wall = t_pub, p->cw_cpu = statik ? -1 : thread_cpu_ns(), p->cw_slept = 0, p->cw_own = own_cpu(p);
    const int spin_job = !statik, all_awake = atomic_load(&p->sleepers) == 0;
    const int mine = help(p, 0);
    const int64_t t_mine = now_ns();
    /* Every chunk of a job long enough for a spinning worker to notice it
     * (it looks every few hundred nanoseconds) was the caller's: the workers
     * that should have been spinning were not running. */
    if (spin_job && all_awake && mine == chunks && t_mine - t_pub > ABSENT_NS) oversubscribed(p, t_mine, 1);
    if (!job_done(p, chunks)) {
        int done = 0;
        if (!statik && spinning_allowed(p, t_mine))
            done = spin_until(p, job_done, chunks, t_mine, atomic_load_explicit(&p->spin_ns, memory_order_relaxed));
        if (!done) {
            int64_t slept0 = now_ns();
            pthread_mutex_lock(&p->mu);
            atomic_store(&p->caller_asleep, 1);
            while (!job_done(p, chunks)) pthread_cond_wait(&p->done, &p->mu);
            atomic_store(&p->caller_asleep, 0);
            pthread_mutex_unlock(&p->mu);
            p->cw_slept += now_ns() - slept0;
        }
    }
    const int64_t t_end = now_ns(), wait = t_end - t_mine;
    /* (only while workers should be awake: a sleeping pool's waits are its wake-ups) */
    if (spin_job && wait > PREEMPT_NS && 4 * wait > t_end - t_pub) oversubscribed(p, t_end, 1);
    p->c_last_end = t_end;
    if (t_end - p->cw_wall > CPU_WINDOW_NS) { /* the caller's own share of the wall time it was awake */
        int64_t c = spinning_allowed(p, t_end) ? thread_cpu_ns() : -1, awake = t_end - p->cw_wall - p->cw_slept;
        const int64_t o = own_cpu(p); /* the own work's CPU time in the window counts as the caller's */
        if (c >= 0 && p->cw_cpu >= 0 && spinning_allowed(p, t_end) &&
            (double)(c - p->cw_cpu + o - p->cw_own) < CPU_SHARE_MIN * (double)awake)
            oversubscribed(p, t_end, 0);
        p->cw_wall = t_end, p->cw_cpu = c, p->cw_slept = 0, p->cw_own = o;
    }
    if (p->prof.jobs) {
        uint64_t b = atomic_load(&p->backoffs);
        *p->prof.wait_seconds += 1e-9 * (double)wait;
        (*p->prof.jobs)++;
        *p->prof.spin_jobs += (uint64_t)spin_job;
        *p->prof.backoffs += b - p->backoffs_seen;
        p->backoffs_seen = b;
    }
}
