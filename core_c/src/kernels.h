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
/* Llama-family attention, the same bits in every set (the scalar functions
 * fe_att_* below are the definition; core_c/tests/test_kernels.c):
 * - The K cache of one head is kept in tiles of FE_KT positions, each tile
 *   column by column: value c of position i is at
 *   kt[((i / FE_KT) * hd + c) * FE_KT + i % FE_KT] (fe_kt_index). A vector
 *   then holds one column of several positions, so scores need no
 *   horizontal sums and one K load serves every query of the call.
 * - att_scores, for r < nq, i < nk: out[r * os + i] = s * scale, where s
 *   starts at 0 and s = fma(q[r * hd + c], k_i[c], s) for c = 0 .. hd-1 in
 *   order. It may also write out[r * os + i] for nk <= i < nk rounded up to
 *   FE_KT (unspecified values) and reads kt's whole tiles.
 * - att_wsum, for r < nq, c < hd: out[r * hd + c] = a, where a starts at 0
 *   and a = fma(p[r * ps + i], v[i * vs + c], a) for i = 0 .. np-1 in order.
 * - att_softmax: fe_att_softmax's steps (below), vectorised.
 * nq is any count: the heads of one token that share a KV head, or (a
 * prompt's scores) those of a block of tokens side by side. The kernels
 * take FE_ATT_Q queries a pass over K or V (more in the AVX2 set's zmm
 * scores: kernels_avx2.c). */
#define FE_KT 16
#define FE_ATT_Q 4
#define FE_KT_PAD(n) (((n) + FE_KT - 1) / FE_KT * FE_KT)
static inline size_t fe_kt_index(int i, int c, int hd) {
    return ((size_t)(i / FE_KT) * (size_t)hd + (size_t)c) * FE_KT + (size_t)(i % FE_KT);
}
typedef void (*fe_att_scores_fn)(const float *q, int nq, const float *kt, int hd, int nk, float scale, float *out,
                                 size_t os);
typedef void (*fe_att_wsum_fn)(float *out, int nq, const float *p, size_t ps, const float *v, size_t vs, int np,
                               int hd);
/* In-place softmax of x[0..n): the shared definition of fe_att_softmax. */
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
    fe_att_scores_fn att_scores;         /* never NULL */
    fe_att_wsum_fn att_wsum;             /* never NULL */
    fe_softmax_fn att_softmax;           /* never NULL */
    /* Optional, for batches: several rows widened and multiplied together,
     * sharing each x load among them (NULL: the row kernel, row by row). */
    fe_rowsdot_fn rowsdot[FE_N_FORMATS];
} fe_kernels;

/* The scalar axpy and attention kernels (kernels.c), the references of the SIMD ones. */
void fe_axpy_f32(float *y, float w, const float *x, int n);
void fe_att_scores_f32(const float *q, int nq, const float *kt, int hd, int nk, float scale, float *out, size_t os);
void fe_att_wsum_f32(float *out, int nq, const float *p, size_t ps, const float *v, size_t vs, int np, int hd);
/* Attention's softmax, for n >= 1: m = the largest x; e_i = fe_exp_neg(x_i -
 * m), or 0 where x_i - m < FE_ATT_CUT (terms below e^-64 ~ 1.6e-28 of the
 * largest, which would only add denormal weights: slow on x86 and no
 * change to a float sum); sixteen float sums s_l += e_i for l = i mod 16,
 * in order of i; their total ((a_0 + a_2) + (a_1 + a_3)) with a_l = (s_l +
 * s_l+8) + (s_l+4 + s_l+12); x_i = e_i * (1 / total). */
void fe_att_softmax(float *x, int n);
#define FE_ATT_CUT (-64.0f)
/* e^x for x <= 0 by one polynomial, within ~2 float32 ulps of expf (an
 * argument below -87.3, i.e. e^-87.3 ~ 1e-38 of the largest term, counts as
 * -87.3): x = n ln2 + r, |r| <= ln2 / 2 (ln2 in two parts), e^r by the
 * classic degree-6 single-precision minimax polynomial (fused
 * multiply-adds), times 2^n built in the exponent bits. */
float fe_exp_neg(float x);
/* In-place softmax over n values: expf, a sequential double sum. The MoE
 * router and Kimi's attention use it. */
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
                                     att_scores_##prefix, att_wsum_##prefix, att_softmax_##prefix, rows}
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
 * (measured: docs/bench-log/2026-12-05.md, "Exact prompts: twelve rows per x block").
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

/* q2_vq's SIMD row kernels (kernels_q2vq.c), kept outside the per-format
 * tables: fe_kernel_for gives a set's q2_vq kernel through fe_simd_variant
 * (below). fe_q2vq_kernel(variant) is NULL when it is not built in or this
 * CPU lacks it (FE_SIMD_SCALAR: always NULL, the reference is kernels.c's). */
fe_rowdot_fn fe_q2vq_kernel(int variant);
/* The q2_vq quantizer (quant2.c) with a chosen implementation: FE_KERNELS_AVX2 or FE_KERNELS_NEON (when
 * built in and this CPU has it; -1 otherwise) or FE_KERNELS_SCALAR, the portable path; all write the same bytes. */
int fe_q2_quantize_impl(int impl, const float *src, int rows, int cols, const float *importance, void *dst);
/* ... or with chosen scans: 0 portable, 1 AVX2 (x86-64) / NEON (aarch64), 2 AVX-512 (-1 when this CPU
 * lacks them); every choice writes the same bytes (core_c/tests/test_kernels.c). */
int fe_q2_quantize_scans(int scans, const float *src, int rows, int cols, const float *importance, void *dst);

/* The row-kernel variants of the formats kept outside the tables (q2_vq,
 * iq4_xs): fe_simd_variant(impl) is the one an
 * exact set runs (the AVX2 set AVX-512 on CPUs with AVX-512 F, BW and VL:
 * fe_cpu_has_avx512, with the OS saving their state). */
enum { FE_SIMD_SCALAR = 0, FE_SIMD_AVX2 = 1, FE_SIMD_NEON = 2, FE_SIMD_AVX512 = 3, FE_SIMD_VARIANTS = 4 };
int fe_simd_variant(int impl);
/* iq4_xs's SIMD row kernels (kernels_iq4xs.c), outside the tables like
 * q2_vq's: fe_iq4xs_kernel(variant) is the exact one (NULL when not built in
 * or this CPU lacks it: then kernels.c's scalar reference), and
 * fe_iq4xs_q8_kernel(impl) the 8-bit-activation one of a q8 set
 * (FE_KERNELS_AVX2, FE_KERNELS_NEON or FE_Q8_AVX512VNNI; NULL otherwise: then
 * kernels_q8.c's scalar reference). */
fe_rowdot_fn fe_iq4xs_kernel(int variant);

/* Tables built in by kernels_avx2.c / kernels_neon.c (NULL elsewhere). The
 * AVX2 set's attention runs in zmm registers on CPUs with AVX-512 (the same
 * bits); fe_kernels_avx2_ymm_table is the set with its AVX2 attention
 * kernels whatever the CPU (for the tests). */
const fe_kernels *fe_kernels_avx2_table(void);
const fe_kernels *fe_kernels_avx2_ymm_table(void);
const fe_kernels *fe_kernels_neon_table(void);
int fe_cpu_has_avx2(void);
/* AVX-512 F, BW and VL with their register state saved by the OS (and AVX2). */
int fe_cpu_has_avx512(void);
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

/* The attention drivers of a SIMD set whose vectors hold W floats and that
 * runs up to ACC accumulator chains side by side: att_scores_<prefix> and
 * att_wsum_<prefix> (kernels.h's contract) over the including file's
 * scores_tiles_<prefix>(q, hd, tile, scale, out, os, NQ, NT) (NQ queries x
 * NT tiles) and wsum_cols_<prefix>(out, p, ps, v, vs, np, hd, c0, NQ, CB)
 * (NQ queries x CB vectors of columns from c0). Queries go FE_ATT_Q at a
 * time; with fewer, more tiles or columns per pass keep the chains many. */
#define FE_ATT_DRIVERS(prefix, attr, W, ACC)                                                               \
    attr static void att_scores_##prefix(const float *q, int nq, const float *kt, int hd, int nk, float scale,   \
                                         float *out, size_t os) {                                        \
        const int tiles = (nk + FE_KT - 1) / FE_KT;                                                        \
        const size_t ts = (size_t)hd * FE_KT;                                                              \
        for (int r0 = 0; r0 < nq; r0 += FE_ATT_Q) {                                                        \
            const int m = nq - r0 < FE_ATT_Q ? nq - r0 : FE_ATT_Q;                                         \
            const float *qr = q + (size_t)r0 * (size_t)hd;                                                 \
            float *o = out + (size_t)r0 * os;                                                              \
            int j = 0;                                                                                     \
            if (m == 4)                                                                                    \
                for (; j < tiles; j++) scores_tiles_##prefix(qr, hd, kt + j * ts, scale, o + (size_t)j * FE_KT, os, 4, 1); \
            else if (m == 3)                                                                               \
                for (; j < tiles; j++) scores_tiles_##prefix(qr, hd, kt + j * ts, scale, o + (size_t)j * FE_KT, os, 3, 1); \
            else if (m == 2) {                                                                             \
                for (; j + 2 <= tiles; j += 2)                                                             \
                    scores_tiles_##prefix(qr, hd, kt + j * ts, scale, o + (size_t)j * FE_KT, os, 2, 2);    \
                for (; j < tiles; j++) scores_tiles_##prefix(qr, hd, kt + j * ts, scale, o + (size_t)j * FE_KT, os, 2, 1); \
            } else {                                                                                       \
                for (; j + 4 <= tiles; j += 4)                                                             \
                    scores_tiles_##prefix(qr, hd, kt + j * ts, scale, o + (size_t)j * FE_KT, os, 1, 4);    \
                for (; j < tiles; j++) scores_tiles_##prefix(qr, hd, kt + j * ts, scale, o + (size_t)j * FE_KT, os, 1, 1); \
            }                                                                                              \
        }                                                                                                  \
    }                                                                                                      \
    static inline __attribute__((always_inline)) attr void wsum_q_##prefix(                                \
        float *out, const float *p, size_t ps, const float *v, size_t vs, int np, int hd, const int NQ) {  \
        const int CB = (ACC) / NQ;                                                                         \
        int c = 0;                                                                                         \
        for (; c + (W) * CB <= hd; c += (W) * CB) wsum_cols_##prefix(out, p, ps, v, vs, np, hd, c, NQ, CB); \
        for (; c + (W) <= hd; c += (W)) wsum_cols_##prefix(out, p, ps, v, vs, np, hd, c, NQ, 1);          \
        for (; c < hd; c++)                                                                                \
            for (int r = 0; r < NQ; r++) {                                                                 \
                float a = 0.0f;                                                                            \
                for (int i = 0; i < np; i++) a = fmaf(p[(size_t)r * ps + (size_t)i], v[(size_t)i * vs + (size_t)c], a); \
                out[(size_t)r * (size_t)hd + (size_t)c] = a;                                               \
            }                                                                                              \
    }                                                                                                      \
    attr static void att_wsum_##prefix(float *out, int nq, const float *p, size_t ps, const float *v, size_t vs, \
                                       int np, int hd) {                                                   \
        for (int r0 = 0; r0 < nq; r0 += FE_ATT_Q) {                                                        \
            const int m = nq - r0 < FE_ATT_Q ? nq - r0 : FE_ATT_Q;                                         \
            float *o = out + (size_t)r0 * (size_t)hd;                                                      \
            const float *pr = p + (size_t)r0 * ps;                                                         \
            if (m == 4) wsum_q_##prefix(o, pr, ps, v, vs, np, hd, 4);                                      \
            else if (m == 3) wsum_q_##prefix(o, pr, ps, v, vs, np, hd, 3);                                 \
            else if (m == 2) wsum_q_##prefix(o, pr, ps, v, vs, np, hd, 2);                                 \
            else wsum_q_##prefix(o, pr, ps, v, vs, np, hd, 1);                                             \
        }                                                                                                  \
    }

#endif
