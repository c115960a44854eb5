/* kernels.h — matrix-row kernels: y[t] = W[row] . x[t] for a few tokens.
 *
 * One table of row-dot kernels per implementation (scalar reference, AVX2 +
 * FMA + F16C on x86-64, NEON on aarch64), indexed by fe_format. Every kernel
 * computes each token's result with the same sequence of operations whatever
 * the number of tokens n, so a batch is bit-identical to n single calls.
 * SIMD kernels fuse dequantization into the dot product and sum in a
 * different order from the scalar reference; they agree with it within a few
 * float32 rounding errors of the dot product (core_c/tests/test_kernels.c). */
#ifndef FERRY_KERNELS_H
#define FERRY_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "formats.h"

/* For t < n: y[t * y_stride] = dot(row of `cols` stored values, x + t * x_stride).
 * scratch holds at least `cols` floats (used by the scalar reference). */
typedef void (*fe_rowdot_fn)(const uint8_t *row, int cols, const float *x, size_t x_stride, int n, float *y,
                             size_t y_stride, float *scratch);

enum { FE_KERNELS_SCALAR = 0, FE_KERNELS_AVX2 = 1, FE_KERNELS_NEON = 2, FE_KERNELS_N = 3 };

/* Attention's vector steps, bit-identical to the scalar ones in every set:
 * dot = fe_dot_f32 (8 lanes of multiply-then-add, the same tail and the same
 * final pairwise sum); axpy: y[i] += w * x[i] (a multiply, then an add). */
typedef float (*fe_dot_fn)(const float *a, const float *b, int n);
typedef void (*fe_axpy_fn)(float *y, float w, const float *x, int n);
/* Attention over many cached rows at once, bit-identical to the loops of
 * dot and axpy they replace (several rows' independent chains interleaved
 * instead of one row's latency-bound chain; a weighted sum kept in registers
 * instead of loaded and stored per row):
 * dots: out[i] = dot(q, k + i * ks, n) * scale for i < nk;
 * wsum: out[c] = 0, then out[c] += p[i] * v[i * vs + c] for i = 0 .. np-1 in order. */
typedef void (*fe_dots_fn)(const float *q, const float *k, size_t ks, int nk, int n, float scale, float *out);
typedef void (*fe_wsum_fn)(float *out, const float *p, const float *v, size_t vs, int np, int n);
/* In-place softmax of x[0..n) (attention's scores). The scalar one is
 * fe_softmax (ops.c: expf, a sequential double sum); the SIMD ones evaluate
 * exp by one polynomial (within ~2 float32 ulps of expf; an argument below
 * -87.3, i.e. e^-87.3 ~ 1e-38 of the largest term, counts as e^-87.3
 * instead of less) and sum in double in lanes: each value within 1e-6 of
 * the scalar one relative (core_c/tests/test_kernels.c). */
typedef void (*fe_softmax_fn)(float *x, int n);

/* Rows r < nrows (at row0 + r * row_bytes, nrows <= FE_ROWS_PER_CALL) of a
 * matrix times n > 1 tokens: y[t * y_stride + r] = the row kernel's result,
 * the same bits. scratch holds nrows * FE_ROWS_WS(cols) floats (the rows
 * widened). */
typedef void (*fe_rowsdot_fn)(const uint8_t *row0, size_t row_bytes, int nrows, int cols, const float *x,
                              size_t x_stride, int n, float *y, size_t y_stride, float *scratch);
#define FE_ROWS_PER_CALL 12

typedef struct fe_kernels {
    const char *name;                    /* "scalar", "avx2", "neon" */
    fe_rowdot_fn rowdot[FE_N_FORMATS];   /* NULL entries fall back to the scalar one */
    fe_dot_fn dot;                       /* never NULL */
    fe_axpy_fn axpy;                     /* never NULL */
    fe_dots_fn dots;                     /* never NULL */
    fe_wsum_fn wsum;                     /* never NULL */
    fe_softmax_fn softmax;               /* never NULL */
    /* Optional, for batches: several rows widened and multiplied together,
     * sharing each x load among them (NULL: the row kernel, row by row). */
    fe_rowsdot_fn rowsdot[FE_N_FORMATS];
} fe_kernels;

/* The scalar axpy, dots and wsum (kernels.c), the references of the SIMD ones. */
void fe_axpy_f32(float *y, float w, const float *x, int n);
void fe_dots_f32(const float *q, const float *k, size_t ks, int nk, int n, float scale, float *out);
void fe_wsum_f32(float *out, const float *p, const float *v, size_t vs, int np, int n);
/* In-place softmax over n values: expf, a sequential double sum. The MoE
 * router and Kimi's attention use it; Llama attention uses the set's own. */
void fe_softmax(float *x, int n);

/* An implementation, or NULL when it is not built in or this CPU lacks it. */
const fe_kernels *fe_kernels_get(int impl);
/* The best implementation this CPU supports (a pure function of the build
 * and cpuid; nothing is cached). Engines choose their set at open and keep
 * it (ferry_open_options.kernels); there is no process-wide choice. */
int fe_kernels_best(void);
/* The implementation named "scalar", "avx2" or "neon", or -1. */
int fe_kernels_by_name(const char *name);
/* The row kernel of `fmt` in implementation `k`, falling back to scalar. */
fe_rowdot_fn fe_kernel_for(const fe_kernels *k, int fmt);

/* `static const fe_kernels table` named "prefix", of the row kernels
 * rowdot_<prefix>_<format> that the including file defines. */
/* {[FE_F32] = <kind>_<prefix>_f32, ...}: a table's per-format entries. */
#define FE_PER_FORMAT(kind, prefix)                                                                        \
    {[FE_F32] = kind##_##prefix##_f32, [FE_F16] = kind##_##prefix##_f16,                                   \
     [FE_BF16] = kind##_##prefix##_bf16, [FE_Q8_0] = kind##_##prefix##_q8_0,                               \
     [FE_Q4_0] = kind##_##prefix##_q4_0, [FE_Q4_1] = kind##_##prefix##_q4_1,                               \
     [FE_Q4_K] = kind##_##prefix##_q4_k, [FE_Q6_K] = kind##_##prefix##_q6_k,                               \
     [FE_Q3_NL] = kind##_##prefix##_q3_nl, [FE_Q5_K] = kind##_##prefix##_q5_k}
#define FE_KERNEL_TABLE_WITH(table, prefix, rows)                                                          \
    static const fe_kernels table = {#prefix, FE_PER_FORMAT(rowdot, prefix), dot_##prefix, axpy_##prefix,  \
                                     dots_##prefix, wsum_##prefix, softmax_##prefix, rows}
/* `static const fe_kernels table` named "prefix", of the row kernels
 * rowdot_<prefix>_<format> that the including file defines (no rowsdot). */
#define FE_KERNEL_TABLE(table, prefix) FE_KERNEL_TABLE_WITH(table, prefix, {0})

/* The batch drivers of a SIMD set, rowdot_<prefix>_<fmt> (fe_rowdot_fn).
 * Each format's <fmt>_pair(row, cols, xa, xb, ya, yb, mode) of the including
 * file decodes the row 32 values at a time and either fuses them into the dot
 * of one token (mode FE_ONE) or of two (FE_TWO), or stores them as floats at
 * xa (FE_STORE: the row widened to f32, `cols` values; only formats whose
 * blocks are multiples of 32 values).
 * - FE_ROWDOT_PAIRS: tokens two at a time, fused, and the odd last one alone:
 *   best where decoding is cheap (plain floats, Q8_0, Q4_0, Q4_1, Q3_NL).
 * - FE_ROWDOT_TILED: one token (decode) fused; a batch widens the row once
 *   into `scratch` and runs the file's <prefix>_tiles(w, cols, x, xs, n, y, ys),
 *   a register-blocked loop over tiles of tokens: best where decoding costs
 *   more than the dot (the K-quants; cols a multiple of 32).
 * Either way every token gets exactly the operations of the one-token fused
 * kernel (the same products in the same accumulators in the same order), so
 * a token's result is the same bits whatever n is. `attr` is the functions'
 * attribute (a target, or nothing). */
enum { FE_ONE = 0, FE_TWO = 1, FE_STORE = 2 };
#define FE_ROWDOT_PAIRS(prefix, attr, fmt)                                                                 \
    attr static void rowdot_##prefix##_##fmt(const uint8_t *row, int cols, const float *x, size_t xs, int n, \
                                             float *y, size_t ys, float *scratch) {                        \
        (void)scratch;                                                                                     \
        int t = 0;                                                                                         \
        for (; t + 2 <= n; t += 2)                                                                         \
            fmt##_pair(row, cols, x + (size_t)t * xs, x + (size_t)(t + 1) * xs, y + (size_t)t * ys,        \
                       y + (size_t)(t + 1) * ys, FE_TWO);                                                  \
        if (t < n)                                                                                         \
            fmt##_pair(row, cols, x + (size_t)t * xs, x + (size_t)t * xs, y + (size_t)t * ys,              \
                       y + (size_t)t * ys, FE_ONE);                                                        \
    }
#define FE_ROWDOT_TILED(prefix, attr, fmt)                                                                 \
    attr static void rowdot_##prefix##_##fmt(const uint8_t *row, int cols, const float *x, size_t xs, int n, \
                                             float *y, size_t ys, float *scratch) {                        \
        if (n == 1) {                                                                                      \
            fmt##_pair(row, cols, x, x, y, y, FE_ONE);                                                     \
        } else if (n > 1) {                                                                                \
            fmt##_pair(row, cols, scratch, scratch, NULL, NULL, FE_STORE);                                 \
            prefix##_tiles(scratch, cols, x, xs, n, y, ys);                                                \
        }                                                                                                  \
    }

/* The drivers of a SIMD set: one per format over the file's <fmt>_pair
 * functions and its <prefix>_tiles. */
#define FE_SIMD_DRIVERS(prefix, attr)                                                                      \
    FE_ROWDOT_PAIRS(prefix, attr, f32)                                                                     \
    FE_ROWDOT_PAIRS(prefix, attr, f16)                                                                     \
    FE_ROWDOT_PAIRS(prefix, attr, bf16)                                                                    \
    FE_ROWDOT_PAIRS(prefix, attr, q8_0)                                                                    \
    FE_ROWDOT_PAIRS(prefix, attr, q4_0)                                                                    \
    FE_ROWDOT_PAIRS(prefix, attr, q4_1)                                                                    \
    FE_ROWDOT_TILED(prefix, attr, q4_k)                                                                    \
    FE_ROWDOT_TILED(prefix, attr, q5_k)                                                                    \
    FE_ROWDOT_TILED(prefix, attr, q6_k)                                                                    \
    FE_ROWDOT_PAIRS(prefix, attr, q3_nl)

/* A whole SIMD set: its drivers and its table. */
#define FE_SIMD_KERNELS(table, prefix, attr)                                                               \
    FE_SIMD_DRIVERS(prefix, attr)                                                                          \
    FE_KERNEL_TABLE(table, prefix)

/* rowsdot_<prefix>_<fmt> (fe_rowsdot_fn): the rows widened by <fmt>_pair
 * (FE_STORE: the very values the fused kernels multiply), then the file's
 * <prefix>_rows_tiles(w, nrows, cols, x, xs, n, y, ys); columns not a
 * multiple of 32 go row by row through the row kernel. */
#define FE_ROWSDOT(prefix, attr, fmt)                                                                      \
    attr static void rowsdot_##prefix##_##fmt(const uint8_t *row0, size_t rb, int nrows, int cols,         \
                                              const float *x, size_t xs, int n, float *y, size_t ys,       \
                                              float *scratch) {                                            \
        if (cols % 32) {                                                                                   \
            for (int r = 0; r < nrows; r++)                                                                \
                rowdot_##prefix##_##fmt(row0 + r * rb, cols, x, xs, n, y + r, ys, scratch);                \
            return;                                                                                        \
        }                                                                                                  \
        for (int r = 0; r < nrows; r++)                                                                    \
            fmt##_pair(row0 + r * rb, cols, scratch + (size_t)r * FE_ROWS_WS(cols),                        \
                       scratch + (size_t)r * FE_ROWS_WS(cols), NULL, NULL, FE_STORE);                      \
        prefix##_rows_tiles(scratch, nrows, cols, x, xs, n, y, ys);                                       \
    }

/* <prefix>_rows_tiles(w, R, cols, x, xs, n, y, ys): R (<= FE_ROWS_PER_CALL)
 * rows widened at w (row r at w + r * FE_ROWS_WS(cols); cols a multiple of
 * 32) times n tokens, in tiles of 4 tokens over blocks of 512 columns; in a
 * block, groups of up to 3 rows take the tile's x in turn (12 rows and 4
 * tokens of a block stay in L1, so x is read from L2 once per 12 rows), one
 * accumulator chain k at a time, by the including file's
 * rows_chain(w, ws, x, xs, R, T, k, c0, c1, A) (ws: the row stride; A:
 * [r][t][k] of type `vec`, kept between blocks) and rows_sum(a): its four
 * chains' fixed sum. The widened rows are FE_ROWS_PAD floats longer than
 * cols, so that rows 2^k floats wide do not all fall in the same L1 sets
 * (measured: docs/BENCHMARKS.md, "Exact prompts: twelve rows per x block").
 * The order of a (row, token) chain's FMAs never depends on R, T or the
 * groups: the same bits. */
#define FE_ROWS_PAD 16
#define FE_ROWS_WS(cols) ((cols) + FE_ROWS_PAD)
#define FE_ROWS_CB 512
#define FE_ROWS_TILES(prefix, attr, vec, zero)                                                             \
    attr static void prefix##_rows_tiles(const float *w, int R, int cols, const float *x, size_t xs, int n, \
                                         float *y, size_t ys) {                                            \
        const int ws = FE_ROWS_WS(cols);                                                                   \
        for (int t0 = 0; t0 < n; t0 += 4) {                                                                \
            const int T = n - t0 < 4 ? n - t0 : 4;                                                         \
            const float *xt = x + (size_t)t0 * xs;                                                         \
            vec A[FE_ROWS_PER_CALL * 4 * 4];                                                               \
            for (int i = 0; i < R * 4 * 4; i++) A[i] = zero;                                               \
            for (int c0 = 0; c0 < cols; c0 += FE_ROWS_CB) {                                                \
                const int c1 = c0 + FE_ROWS_CB < cols ? c0 + FE_ROWS_CB : cols;                            \
                for (int g = 0; g < R; g += 3) { /* the x block stays in L1 across the groups */           \
                    const int G = R - g < 3 ? R - g : 3;                                                   \
                    const float *wg = w + (size_t)g * (size_t)ws;                                          \
                    vec *Ag = A + g * 4 * 4;                                                               \
                    for (int k = 0; k < 4; k++) /* each shape its own unrolled code */                     \
                        switch (G * 4 + T) {                                                               \
                        case 4 + 1: rows_chain(wg, ws, xt, xs, 1, 1, k, c0, c1, Ag); break;                \
                        case 4 + 2: rows_chain(wg, ws, xt, xs, 1, 2, k, c0, c1, Ag); break;                \
                        case 4 + 3: rows_chain(wg, ws, xt, xs, 1, 3, k, c0, c1, Ag); break;                \
                        case 4 + 4: rows_chain(wg, ws, xt, xs, 1, 4, k, c0, c1, Ag); break;                \
                        case 8 + 1: rows_chain(wg, ws, xt, xs, 2, 1, k, c0, c1, Ag); break;                \
                        case 8 + 2: rows_chain(wg, ws, xt, xs, 2, 2, k, c0, c1, Ag); break;                \
                        case 8 + 3: rows_chain(wg, ws, xt, xs, 2, 3, k, c0, c1, Ag); break;                \
                        case 8 + 4: rows_chain(wg, ws, xt, xs, 2, 4, k, c0, c1, Ag); break;                \
                        case 12 + 1: rows_chain(wg, ws, xt, xs, 3, 1, k, c0, c1, Ag); break;               \
                        case 12 + 2: rows_chain(wg, ws, xt, xs, 3, 2, k, c0, c1, Ag); break;               \
                        case 12 + 3: rows_chain(wg, ws, xt, xs, 3, 3, k, c0, c1, Ag); break;               \
                        default: rows_chain(wg, ws, xt, xs, 3, 4, k, c0, c1, Ag); break;                   \
                        }                                                                                  \
                }                                                                                          \
            }                                                                                              \
            for (int r = 0; r < R; r++)                                                                    \
                for (int t = 0; t < T; t++) y[(size_t)(t0 + t) * ys + r] = rows_sum(A + (r * 4 + t) * 4);  \
        }                                                                                                  \
    }

/* A SIMD set with multi-row batch kernels for every format. */
#define FE_SIMD_KERNELS_ROWS(table, prefix, attr)                                                          \
    FE_SIMD_DRIVERS(prefix, attr)                                                                          \
    FE_ROWSDOT(prefix, attr, f32)                                                                          \
    FE_ROWSDOT(prefix, attr, f16)                                                                          \
    FE_ROWSDOT(prefix, attr, bf16)                                                                         \
    FE_ROWSDOT(prefix, attr, q8_0)                                                                         \
    FE_ROWSDOT(prefix, attr, q4_0)                                                                         \
    FE_ROWSDOT(prefix, attr, q4_1)                                                                         \
    FE_ROWSDOT(prefix, attr, q4_k)                                                                         \
    FE_ROWSDOT(prefix, attr, q5_k)                                                                         \
    FE_ROWSDOT(prefix, attr, q6_k)                                                                         \
    FE_ROWSDOT(prefix, attr, q3_nl)                                                                        \
    FE_KERNEL_TABLE_WITH(table, prefix, FE_PER_FORMAT(rowsdot, prefix))

/* Tables built in by kernels_avx2.c / kernels_neon.c (NULL elsewhere). */
const fe_kernels *fe_kernels_avx2_table(void);
const fe_kernels *fe_kernels_neon_table(void);
int fe_cpu_has_avx2(void);
/* The q3_nl quantizer (quant3.c) with a chosen implementation: FE_KERNELS_AVX2 (when this CPU has it)
 * or any other value for the portable path; both give identical bytes. kind: FE_Q3_SRC_*; scales only
 * for MXFP4. The public ferry_q3_quantize_* use ferry_kernels_best(); ferry_q3_quantize names one. */
enum { FE_Q3_SRC_F32 = 0, FE_Q3_SRC_BF16 = 1, FE_Q3_SRC_MXFP4 = 2 }; /* = FERRY_Q3_SOURCE_* */
int fe_q3_quantize_impl(int impl, int kind, const void *src, const uint8_t *scales, int rows, int cols,
                        const float *imp, void *dst);
/* 1 when every grid midpoint sits well inside one cell of the AVX2 assignment (quant3.c). */
int fe_q3_cells_ok(void);
/* SIMD memory read loop (kernels_avx2.c; 0 when AVX2 is missing or on other CPUs). */
uint64_t fe_memory_read_simd(const void *p, size_t nbytes, int reps, int streams);

#endif
