/* kernels_q8.h — the opt-in 8-bit-activation matrix products
 * (ferry_open_options.activations = "q8"; off by default).
 *
 * Each token's input vector is quantized once per product, per block of 32
 * values: d = max|x| / 127, q = round-to-nearest-even(x / d) in -127..127,
 * and s = d * sum(q) (for the formats with a per-block minimum). The row
 * kernels then take integer dot products of the stored weight integers with
 * q and scale them in float. This changes results slightly (the activation's
 * rounding error, ~0.2-0.4 % of each block's largest value), so it is a mode
 * the user asks for, never the default.
 *
 * The float arithmetic is defined once, by the scalar reference, and every
 * SIMD set repeats it operation for operation, so the sets are bit-identical
 * (core_c/tests/test_kernels_q8.c). Per token and 32-value block b of a row:
 *   p[l] = S(l) * sum_{i=4l}^{4l+3} qw[i] * qx[i]     l = 0..7, exact int32;
 *          S(l) the weight's integer scale of values 16*(l/4)..+15
 *          (1 for the 32-blocks, a 6-bit scale for Q4_K/Q5_K, an int8 one
 *          per 16 values for Q6_K)
 *   acc[b % 2][l] = fma(D_b * d_b, (float)p[l], acc[b % 2][l])   (one rounding: fmaf / FMA;
 *                   two sets, even and odd blocks, halve the chain of dependent adds)
 *   Q4_K/Q5_K: mn[b % 8] = fma(M_b, s_b, mn[b % 8])              (M = dmin * m_j)
 *   Q4_1:      m1[b % 2] = fma(M_b, s_b, m1[b % 2])              (M = m)
 * with D_b the weight block's float scale. The result is
 *   h(acc[0] + acc[1], lane by lane) [+ (m1[0] + m1[1]) for Q4_1, - h(mn) for Q4_K/Q5_K],
 *   h(v) = ((v0 + v4) + (v2 + v6)) + ((v1 + v5) + (v3 + v7)).
 * Every integer above is below 2^24, so each conversion to float is exact.
 * A token's arithmetic never depends on the others in the call, so a batch is
 * bit-identical to single tokens. */
#ifndef FERRY_KERNELS_Q8_H
#define FERRY_KERNELS_Q8_H

#include <stddef.h>
#include <stdint.h>

#include "formats.h"

#define FE_Q8_BLOCK 32

/* One token's quantized activations of `cols` values (a multiple of 32):
 * int8 q[cols], then float d[cols/32], then float s[cols/32]. */
size_t fe_q8_stride(int cols);
/* Quantize n tokens x[t * x_stride .. + cols) into out + t * fe_q8_stride(cols).
 * One portable implementation serves every kernel set. */
void fe_q8_quantize(const float *x, size_t x_stride, int cols, int n, uint8_t *out);

/* For t < n: y[t * ys] = the q8 dot of a stored weight row with token t's
 * quantized activations at xq + t * fe_q8_stride(cols). */
typedef void (*fe_q8dot_fn)(const uint8_t *row, int cols, const uint8_t *xq, int n, float *y, size_t ys);

typedef struct fe_q8_kernels {
    const char *name;                   /* "scalar", "avx2", "neon" */
    fe_q8dot_fn rowdot[FE_N_FORMATS];   /* NULL: no integer kernel (f32, f16, bf16, q3_nl use the exact path) */
} fe_q8_kernels;

/* The q8 set of a kernel implementation (FE_KERNELS_*), or NULL when it is
 * not built in or this CPU cannot run it. */
const fe_q8_kernels *fe_q8_kernels_get(int impl);
const fe_q8_kernels *fe_q8_kernels_avx2(void);  /* kernels_q8_avx2.c (NULL elsewhere) */
const fe_q8_kernels *fe_q8_kernels_neon(void);  /* kernels_q8_neon.c (NULL elsewhere) */

/* A session's q8 state, carried to fe_matmul by fe_ops.q8 (NULL: exact f32 path). */
typedef struct fe_q8_ctx {
    const fe_q8_kernels *k; /* the engine's set */
    uint8_t *buf;           /* quantized activations of one product */
    size_t bytes;           /* its size */
} fe_q8_ctx;

/* The q8 kernel for a matrix of format fmt and `cols` columns over n tokens
 * with this context, or NULL when the product must take the exact path (no
 * context, no integer kernel for the format, or too little buffer). */
fe_q8dot_fn fe_q8_kernel_for(const fe_q8_ctx *q, int fmt, int cols, int n);

/* The row kernel rowdot_<prefix>_<fmt> of a SIMD set over the including
 * file's <fmt>_tile(row, cols, xq, stride, y, ys, nt): tiles of 4 tokens,
 * then the rest as one tile (nt a constant in every call). `attr` is the
 * functions' attribute (a target, or nothing). */
#define FE_Q8_DRIVER(prefix, attr, fmt)                                                                     \
    attr static void rowdot_##prefix##_##fmt(const uint8_t *row, int cols, const uint8_t *xq, int n, float *y, \
                                             size_t ys) {                                                   \
        const size_t st = fe_q8_stride(cols);                                                               \
        int t = 0;                                                                                          \
        for (; t + 4 <= n; t += 4) fmt##_tile(row, cols, xq + (size_t)t * st, st, y + (size_t)t * ys, ys, 4); \
        switch (n - t) {                                                                                    \
        case 1: fmt##_tile(row, cols, xq + (size_t)t * st, st, y + (size_t)t * ys, ys, 1); break;           \
        case 2: fmt##_tile(row, cols, xq + (size_t)t * st, st, y + (size_t)t * ys, ys, 2); break;           \
        case 3: fmt##_tile(row, cols, xq + (size_t)t * st, st, y + (size_t)t * ys, ys, 3); break;           \
        default: break;                                                                                     \
        }                                                                                                   \
    }

/* A whole SIMD set: the drivers of the six formats and its table `name`. */
#define FE_Q8_SET(name, prefix, attr)                                                                       \
    FE_Q8_DRIVER(prefix, attr, q8_0)                                                                        \
    FE_Q8_DRIVER(prefix, attr, q4_0)                                                                        \
    FE_Q8_DRIVER(prefix, attr, q4_1)                                                                        \
    FE_Q8_DRIVER(prefix, attr, q4_k)                                                                        \
    FE_Q8_DRIVER(prefix, attr, q5_k)                                                                        \
    FE_Q8_DRIVER(prefix, attr, q6_k)                                                                        \
    static const fe_q8_kernels name = {                                                                     \
        #prefix,                                                                                            \
        {[FE_Q8_0] = rowdot_##prefix##_q8_0, [FE_Q4_0] = rowdot_##prefix##_q4_0,                            \
         [FE_Q4_1] = rowdot_##prefix##_q4_1, [FE_Q4_K] = rowdot_##prefix##_q4_k,                            \
         [FE_Q5_K] = rowdot_##prefix##_q5_k, [FE_Q6_K] = rowdot_##prefix##_q6_k},                           \
    };

/* Shared by the SIMD sets: 8 lanes summed in the order h() above. */
static inline float fe_q8_hsum8(const float v[8]) {
    return ((v[0] + v[4]) + (v[2] + v[6])) + ((v[1] + v[5]) + (v[3] + v[7]));
}

#endif
