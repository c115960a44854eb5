/* ops.h — numeric building blocks shared by every architecture's forward pass. */
#ifndef FERRY_OPS_H
#define FERRY_OPS_H

#include <stdint.h>

#include "../include/ferry.h"
#include "pool.h"

/* A weight matrix [rows, cols] in some stored format (formats.h). */
typedef struct fe_mat {
    const uint8_t *data;  /* first row */
    int fmt;              /* fe_format */
    int rows, cols;       /* shape */
    uint64_t row_bytes;   /* stored bytes per row */
} fe_mat;

struct fe_kernels;
struct fe_q8_ctx;

/* Floats of row buffer per pool thread for matrices at most `max_cols` wide:
 * room for FE_ROWS_PER_CALL rows widened at once, each FE_ROWS_PAD floats
 * longer than its columns (kernels.h: rowsdot; ops.c checks the two). */
#define FE_ROWS_ROOM 12
#define FE_ROWS_ROOM_PAD 16
static inline int fe_rows_stride(int max_cols) { return FE_ROWS_ROOM * (max_cols + FE_ROWS_ROOM_PAD); }

/* Where and how matrix products run: the session's pool, one row buffer of
 * `rows_stride` floats per pool thread, and the engine's kernel set. */
typedef struct fe_ops {
    fe_pool *pool;        /* compute threads */
    float *rows;          /* [threads][rows_stride] */
    int rows_stride;      /* floats per thread: fe_rows_stride(the widest matrix row) */
    const struct fe_kernels *kernels; /* the engine's row kernels (kernels.h) */
    ferry_profile_part *prof; /* the session's profile part in use, or NULL (not profiling) */
    const struct fe_q8_ctx *q8; /* the 8-bit-activation mode's kernels and buffer (kernels_q8.h), or NULL: exact */
} fe_ops;

/* A matrix view over stored bytes. */
fe_mat fe_mat_view(const uint8_t *data, int fmt, int rows, int cols);

/* y[t][r] = W[r] . x[t] for t < n; x is [n][cols], y is [n][rows]. Each
 * output is computed by one thread the same way whatever n is, so a batch
 * gives bit-identical results to n single products. */
void fe_matmul(const fe_ops *ops, const fe_mat *w, const float *x, int n, float *y);

/* fe_matmul of `count` matrices with the same cols over the same x, as one
 * parallel job over all their rows (one dispatch instead of `count`):
 * y[i] = w[i] x. Each output is computed exactly as fe_matmul computes it. */
#define FE_MATMUL_MULTI_MAX 16
void fe_matmul_multi(const fe_ops *ops, const fe_mat *const *w, int count, const float *x, int n, float *const *y);

/* One token each: y[i] = w[i] (x + i xs) for up to FE_MATMUL_MULTI_MAX
 * matrices (a decode step's experts' down projections, each over its own
 * input), as one parallel job. Each output is computed exactly as
 * fe_matmul(w[i], x + i xs, 1) computes it (matrices of different formats
 * or widths, which no caller has, run one product at a time). */
void fe_matmul_each(const fe_ops *ops, const fe_mat *const *w, int count, const float *x, size_t xs, float *const *y);

/* out = w * x / rms(x) over n values (out may alias x). */
void fe_rmsnorm(float *out, const float *x, const float *w, int n, float eps);
float fe_silu(float x);
/* a[i] = fe_silu(a[i]) * b[i] for i < m, on the pool's threads when m is
 * large (a prompt chunk's feed-forward); the same bits either way. */
void fe_silu_mul(fe_pool *pool, float *a, const float *b, size_t m);
float fe_sigmoid(float x);
/* fe_softmax, the in-place softmax over n values, is in kernels.h (the
 * scalar reference of the kernel sets' softmax). */
#include "kernels.h"

#endif
