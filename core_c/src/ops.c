/* ops.c — see ops.h. */
#include "ops.h"

#include <math.h>
#include <stddef.h>

#include "common.h"
#include "formats.h"
#include "kernels.h"
#include "kernels_q8.h"

_Static_assert(FE_ROWS_PER_CALL <= FE_ROWS_ROOM && FE_ROWS_PAD <= FE_ROWS_ROOM_PAD,
               "fe_rows_stride (ops.h) makes room for the rows of a rowsdot call");

fe_mat fe_mat_view(const uint8_t *data, int fmt, int rows, int cols) {
    fe_mat m = {data, fmt, rows, cols, fe_row_bytes(fmt, (uint64_t)cols)};
    return m;
}

typedef struct {
    const fe_ops *ops;  /* pool and row buffers */
    int count;          /* matrices */
    const fe_mat *w[FE_MATMUL_MULTI_MAX];
    float *y[FE_MATMUL_MULTI_MAX]; /* [n][w[i]->rows] each */
    fe_rowdot_fn dot[FE_MATMUL_MULTI_MAX]; /* the row kernel of each w's format (kernels.h) */
    fe_rowsdot_fn rows[FE_MATMUL_MULTI_MAX]; /* or its kernel of several rows at once, for a batch */
    fe_q8dot_fn q8dot[FE_MATMUL_MULTI_MAX]; /* or its 8-bit-activation kernel (kernels_q8.h), used instead */
    fe_q8dot2_fn q8dot2[FE_MATMUL_MULTI_MAX]; /* and its multi-row kernel (NULL: rows one at a time) */
    fe_q8dot4_fn q8dot4[FE_MATMUL_MULTI_MAX]; /* and its four-row kernel of 1-3 tokens (NULL: none) */
    const uint8_t *xq[FE_MATMUL_MULTI_MAX]; /* x quantized for each q8 kernel (once per layout) */
    int first[FE_MATMUL_MULTI_MAX + 1];    /* item index of each matrix's row 0 */
    const float *x[FE_MATMUL_MULTI_MAX]; /* each matrix's input [n][cols] (one x for all in fe_matmul_multi) */
    int n;              /* tokens */
} matmul_job;

/* How far the weight prefetch runs ahead of the kernels, and the batches it
 * runs for: decode and small batches read each weight byte once or a few
 * times and wait for memory; larger batches are compute-bound (the rows sit
 * in L1/L2 for many tokens) and the prefetch only competes for L1 there.
 * Two distances: FE_PREFETCH_BYTES into L1 (every line, in order), and a
 * window FE_PREFETCH_L2_BYTES further ahead into L2 only, so that more of a
 * thread's reads are in flight than its L1 misses alone allow (decode of the
 * MoE file 7-10 % less CPU a token than L1 alone, on the Xeon VM).
 * Measured: docs/bench-log/2026-12-05.md, "Weight prefetch", and
 * docs/bench-log/2026-12-06.md, "Session 19 h1". */
#ifndef FE_PREFETCH_BYTES
#define FE_PREFETCH_BYTES 2048
#endif
#ifndef FE_PREFETCH_L2_BYTES
#define FE_PREFETCH_L2_BYTES 16384
#endif
#ifndef FE_PREFETCH_MAX_TOKENS
#define FE_PREFETCH_MAX_TOKENS 4
#endif
/* Weight bytes x tokens under which a matrix product runs on the caller
 * alone while the pool is backed off (fe_pool_backed_off): below it the
 * other thread's share costs less than waking it. */
#ifndef FE_INLINE_BYTES
#define FE_INLINE_BYTES (256.0 * 1024)
#endif

/* Before the kernel reads `len` bytes at `row`: ask for the bytes up to
 * FE_PREFETCH_BYTES past them (not past `end`) that *pf has not asked for
 * yet, a cache line at a time, into L1; and, when l2 (the end of the
 * thread's rows; NULL: none), for the same `len` bytes FE_PREFETCH_L2_BYTES
 * further on (not past l2) into L2. Consecutive calls cover consecutive
 * windows. Speed only: a prefetch changes no result. */
static inline void prefetch_past(const uint8_t **pf, const uint8_t *row, uint64_t len, const uint8_t *end,
                                 const uint8_t *l2) {
    const uint8_t *upto = (uint64_t)(end - row) > len + FE_PREFETCH_BYTES ? row + len + FE_PREFETCH_BYTES : end;
    for (; *pf < upto; *pf += 64) __builtin_prefetch(*pf, 0, 3);
    if (!l2 || (uint64_t)(l2 - row) <= FE_PREFETCH_L2_BYTES) return;
    const uint8_t *a = (const uint8_t *)((uintptr_t)(row + FE_PREFETCH_L2_BYTES) & ~(uintptr_t)63);
    const uint8_t *b = (uint64_t)(l2 - row) > len + FE_PREFETCH_L2_BYTES ? row + len + FE_PREFETCH_L2_BYTES : l2;
    for (; a < b; a += 64) __builtin_prefetch(a, 0, 1);
}

/* Items [start, end) (rows of the matrices laid end to end) for every token:
 * one kernel call per weight row, so each output is computed by the same
 * code whatever n is and however the rows are split among threads. */
static void matmul_rows(void *p, int start, int end, int tid) {
    matmul_job *j = p;
    float *buf = j->ops->rows + (size_t)tid * (size_t)j->ops->rows_stride;
    for (int i = 0; i < j->count; i++) {
        int lo = start > j->first[i] ? start : j->first[i];
        int hi = end < j->first[i + 1] ? end : j->first[i + 1];
        if (lo >= hi) continue;
        const fe_mat *w = j->w[i];
        const int r0 = lo - j->first[i], r1 = hi - j->first[i];
        /* this thread's rows are contiguous: stream them ahead of the kernel
         * (pf at the end: nothing to prefetch) */
        const uint8_t *end_bytes = w->data + (uint64_t)r1 * w->row_bytes;
        const uint8_t *pf = j->n > FE_PREFETCH_MAX_TOKENS ? end_bytes
            : (const uint8_t *)((uintptr_t)(w->data + (uint64_t)r0 * w->row_bytes) & ~(uintptr_t)63);
        const uint8_t *l2 = j->n > FE_PREFETCH_MAX_TOKENS ? NULL : end_bytes;
        if (j->q8dot[i]) { /* rows in fours (1-3 tokens), or 4 or 2 at a time, where the set has such kernels
                            * (the same bits) */
            /* a four-row kernel that prefetches its rows itself, spread through its loads (kernels_q8.h) */
            const int own_pf = j->q8dot4[i] && (j->ops->q8->k->rowdot4_prefetch >> w->fmt & 1u);
            for (int r = r0; r < r1;) {
                const int nr = fe_q8_rows_next(j->q8dot4[i] != NULL, j->q8dot2[i] != NULL, r1 - r);
                const uint8_t *row = w->data + (uint64_t)r * w->row_bytes;
                const int four = nr == 4 && j->q8dot4[i] != NULL;
                if (four && own_pf) /* past these rows: a later call of another kernel prefetches from there */
                    pf = pf > row + 4 * w->row_bytes ? pf : row + 4 * w->row_bytes;
                else
                    prefetch_past(&pf, row, (uint64_t)nr * w->row_bytes, end_bytes, l2);
                if (four)
                    j->q8dot4[i](row, w->row_bytes, w->cols, j->xq[i], j->n, j->y[i] + r, (size_t)w->rows,
                                 own_pf ? l2 : NULL);
                else if (nr > 1)
                    j->q8dot2[i](row, w->row_bytes, nr, w->cols, j->xq[i], j->n, j->y[i] + r, (size_t)w->rows);
                else
                    j->q8dot[i](row, w->cols, j->xq[i], j->n, j->y[i] + r, (size_t)w->rows);
                r += nr;
            }
            continue;
        }
        if (j->rows[i]) { /* the same bits as row by row (kernels.h), each x load shared by a few rows */
            for (int r = r0; r < r1; r += FE_ROWS_PER_CALL) {
                const int nr = r1 - r < FE_ROWS_PER_CALL ? r1 - r : FE_ROWS_PER_CALL;
                const uint8_t *row = w->data + (uint64_t)r * w->row_bytes;
                prefetch_past(&pf, row, nr * w->row_bytes, end_bytes, l2);
                j->rows[i](row, w->row_bytes, nr, w->cols, j->x[i], (size_t)w->cols, j->n, j->y[i] + r,
                           (size_t)w->rows, buf);
            }
            continue;
        }
        for (int r = r0; r < r1; r++) {
            const uint8_t *row = w->data + (uint64_t)r * w->row_bytes;
            prefetch_past(&pf, row, w->row_bytes, end_bytes, l2);
            j->dot[i](row, w->cols, j->x[i], (size_t)w->cols, j->n, j->y[i] + r, (size_t)w->rows, buf);
        }
    }
}

/* Run a set-up job on the pool and account its time to the profile. One job
 * may mix formats (e.g. Q4_K beside Q6_K): its time is shared among them by
 * the bytes each read. */
static void run_job(const fe_ops *ops, matmul_job *j, double t0) {
    if (!j->count) return;
    double total = 0.0;
    for (int i = 0; i < j->count; i++) total += (double)j->w[i]->row_bytes * j->w[i]->rows;
    /* A small job while the pool sleeps between jobs: the caller alone, not
     * a worker's wake-up (each row is computed the same on any thread). */
    if (total * j->n < FE_INLINE_BYTES && fe_pool_backed_off(ops->pool))
        matmul_rows(j, 0, j->first[j->count], 0);
    else
        fe_pool_run(ops->pool, matmul_rows, j, j->first[j->count]);
    ferry_profile_part *P = ops->prof;
    if (!P) return;
    double dt = fe_now() - t0;
    for (int i = 0; i < j->count; i++) {
        int f = j->w[i]->fmt;
        if (f < 0 || f >= FERRY_PROFILE_FORMATS) continue;
        double bytes = (double)j->w[i]->row_bytes * j->w[i]->rows;
        P->matmul_seconds[f] += total > 0 ? dt * bytes / total : dt / j->count;
        P->matmul_calls[f]++;
        P->matmul_bytes[f] += (uint64_t)bytes;
    }
}

/* Matrix w with its kernels over n tokens of x into y, as item j->count of
 * the job; 0 when its format has no kernel (it is left out). */
static int add_matrix(const fe_ops *ops, matmul_job *j, const fe_mat *w, const float *x, int n, float *y) {
    fe_rowdot_fn dot = fe_kernel_for(ops->kernels, w->fmt);
    if (!dot) return 0;
    const int c = j->count;
    j->w[c] = w;
    j->y[c] = y;
    j->x[c] = x;
    j->dot[c] = dot;
    j->rows[c] = n > 1 && ops->kernels ? ops->kernels->rowsdot[w->fmt] : NULL;
    j->q8dot[c] = fe_q8_kernel_for(ops->q8, w->fmt, w->cols, n);
    j->q8dot2[c] = j->q8dot[c] ? fe_q8_kernel2_for(ops->q8->k, w->fmt, n) : NULL;
    j->q8dot4[c] = j->q8dot[c] ? fe_q8_kernel4_for(ops->q8->k, w->fmt, n) : NULL;
    j->xq[c] = NULL;
    j->first[c + 1] = j->first[c] + w->rows;
    j->count++;
    return 1;
}

void fe_matmul_multi(const fe_ops *ops, const fe_mat *const *w, int count, const float *x, int n,
                     float *const *y) {
    matmul_job j;
    j.ops = ops;
    j.count = 0;
    j.n = n;
    j.first[0] = 0;
    const uint8_t *xq[FE_Q8_KINDS] = {NULL};
    double t0 = ops->prof ? fe_now() : 0.0; /* a q8 product's time includes quantizing x */
    for (int i = 0; i < count && i < FE_MATMUL_MULTI_MAX; i++) {
        if (!add_matrix(ops, &j, w[i], x, n, y[i])) continue;
        const int c = j.count - 1;
        if (j.q8dot[c]) { /* the matrices share cols: x is quantized once per layout */
            const int kind = fe_q8_layout(ops->q8->k, w[i]->fmt, n);
            if (!xq[kind]) {
                uint8_t *buf = fe_q8_region(ops->q8, kind, w[i]->cols, n);
                ops->q8->k->quantize(kind, x, (size_t)w[i]->cols, w[i]->cols, n, buf);
                xq[kind] = buf;
            }
            j.xq[c] = xq[kind];
        }
    }
    run_job(ops, &j, t0);
}

void fe_matmul_each(const fe_ops *ops, const fe_mat *const *w, int count, const float *x, size_t xs,
                    float *const *y) {
    int alike = count <= FE_MATMUL_MULTI_MAX;
    for (int i = 1; i < count && alike; i++) alike = w[i]->fmt == w[0]->fmt && w[i]->cols == w[0]->cols;
    if (!alike) { /* not a case any caller has: one product at a time, the same outputs */
        for (int i = 0; i < count; i++) fe_matmul(ops, w[i], x + (size_t)i * xs, 1, y[i]);
        return;
    }
    matmul_job j;
    j.ops = ops;
    j.count = 0;
    j.n = 1;
    j.first[0] = 0;
    double t0 = ops->prof ? fe_now() : 0.0;
    for (int i = 0; i < count; i++) add_matrix(ops, &j, w[i], x + (size_t)i * xs, 1, y[i]);
    if (j.count && j.q8dot[0]) { /* the inputs quantized at once: the quantizer treats each token alone, so
                                  * each is what fe_matmul makes of it */
        const int kind = fe_q8_layout(ops->q8->k, w[0]->fmt, 1), cols = w[0]->cols;
        uint8_t *buf = fe_q8_region(ops->q8, kind, cols, j.count);
        ops->q8->k->quantize(kind, x, xs, cols, j.count, buf);
        for (int c = 0; c < j.count; c++) j.xq[c] = buf + (size_t)c * fe_q8_stride_kind(kind, cols);
    }
    run_job(ops, &j, t0);
}

void fe_matmul(const fe_ops *ops, const fe_mat *w, const float *x, int n, float *y) {
    fe_matmul_multi(ops, &w, 1, x, n, &y);
}

void fe_rmsnorm(float *out, const float *x, const float *w, int n, float eps) {
    double ss = 0.0;
    for (int i = 0; i < n; i++) ss += (double)x[i] * x[i];
    float scale = (float)(1.0 / sqrt(ss / n + eps));
    for (int i = 0; i < n; i++) out[i] = w[i] * (x[i] * scale);
}

/* (inlined in the loop below: fe_silu is exported, so a call to it there
 * goes through the PLT for every value; the same operations, the same bits) */
static inline float silu1(float x) { return x / (1.0f + expf(-x)); }
float fe_silu(float x) { return silu1(x); }

/* fe_silu_mul in blocks of SILU_BLOCK values, one per pool item. */
#define SILU_BLOCK 4096
typedef struct {
    float *a;
    const float *b;
    size_t m;
} silu_job;

static void silu_items(void *p, int start, int end, int tid) {
    (void)tid;
    const silu_job *j = p;
    const size_t hi = (size_t)end * SILU_BLOCK < j->m ? (size_t)end * SILU_BLOCK : j->m;
    for (size_t i = (size_t)start * SILU_BLOCK; i < hi; i++) j->a[i] = silu1(j->a[i]) * j->b[i];
}

void fe_silu_mul(fe_pool *pool, float *a, const float *b, size_t m) {
    silu_job j = {a, b, m};
    const int items = (int)((m + SILU_BLOCK - 1) / SILU_BLOCK); /* m <= a prompt chunk x a row count */
    if (items < 4) silu_items(&j, 0, items, 0);                 /* decode: not worth a job */
    else fe_pool_run(pool, silu_items, &j, items);
}

float fe_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }
