/* kernels_q8_iq4xs.c — the iq4_xs 8-bit-activation row kernels (formats.h,
 * kernels_q8.h) for AVX2, AVX-512 VNNI and NEON, bit-identical to
 * kernels_q8.c's scalar reference (decode_block: D_b = the sub-block's float
 * scale d * (ls - 32), S = 1). The table lookup of kernels_iq4xs.h gives a
 * 32-value block's int8 weights, and the integer dot with a token's
 * FE_Q8_KIND_32 activations gives lane l = sum of the products of values
 * 4l..4l+3 (|lane| <= 4 * 127 * 127, exact in float), then
 * acc[b % 2][l] = fma(D_b * d_b, (float)p[l], acc): the reference's
 * operations (kernels_q8.h, "32-value formats"). AVX2: maddubs on |w| and x
 * signed by w (a pair sum at most 2 * 127 * 127 = 32258: no int16
 * saturation), then madd with ones; AVX-512 VNNI: vpdpbusd on the same
 * operands; NEON: SDOT (or widening multiplies and pairwise adds). Tokens run
 * in tiles of up to 4 sharing each decoded block (FE_Q8_DRIVER); a token's
 * arithmetic never depends on its tile. fe_iq4xs_q8_kernel says which set
 * this CPU runs. Nothing here keeps state. */
#include "kernels.h"
#include "kernels_q8.h"

#include <string.h>

#define XQ(t) ((const int8_t *)(xq + (size_t)(t) * st))
#define DX(t) ((const float *)(xq + (size_t)(t) * st + (size_t)cols))

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>

#include "kernels_avx2_util.h"
#include "kernels_iq4xs.h"

#define TGT2 __attribute__((target("avx2,fma,f16c")))
#define INL2 static inline __attribute__((always_inline, target("avx2,fma,f16c")))
#define ISAV "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c"
#define TGTV __attribute__((target(ISAV)))
#define INLV static inline __attribute__((always_inline, target(ISAV)))

/* ---------------------------------------------------------- q8, AVX2 */

INL2 __m256 fold2(__m256 acc, float a, __m256i p) {
    return _mm256_fmadd_ps(_mm256_set1_ps(a), _mm256_cvtepi32_ps(p), acc);
}

/* The lanes' 4-product integer sums of |w| (unsigned) and x signed by w: AVX2's maddubs then madd
 * with ones, or AVX-512 VNNI's vpdpbusd: the same integers. */
#define PRODUCT_AVX2(aw, xs) _mm256_madd_epi16(_mm256_maddubs_epi16(aw, xs), _mm256_set1_epi16(1))
#define PRODUCT_VNNI(aw, xs) _mm256_dpbusd_epi32(_mm256_setzero_si256(), aw, xs)

/* A set's block and tile over PRODUCT, and its driver rowdot_q8x86_iq4xs_<name>:
 * q8_block_<name> puts block b (32 values: sub-block b % 8 of super-block p, whose d is
 * given) into acc[t]; even blocks go to A, odd ones to B (kernels_q8.h). */
#define X86_SET(name, INLA, TGTA, PRODUCT)                                                                   \
    INLA void q8_block_##name(const uint8_t *p, float d, int cols, const uint8_t *xq, size_t st, int b,      \
                              const int nt, __m256 *acc) {                                                   \
        const float D = d * (float)(fe_iq4xs_code(p, b & 7) - 32); /* fe_iq4xs_scale */                     \
        const __m256i w = fe_iq4xs_levels(p + 8 + 16 * (b & 7)), aw = _mm256_sign_epi8(w, w);               \
        for (int t = 0; t < nt; t++) {                                                                       \
            const __m256i x = _mm256_loadu_si256((const __m256i *)(XQ(t) + 32 * (size_t)b));                 \
            acc[t] = fold2(acc[t], D * DX(t)[b], PRODUCT(aw, _mm256_sign_epi8(x, w)));                       \
        }                                                                                                    \
    }                                                                                                        \
    INLA void iq4xs_##name##_tile(const uint8_t *row, int cols, const uint8_t *xq, size_t st, float *y,     \
                                  size_t ys, const int nt) {                                                 \
        const int nb = cols / 32;                                                                            \
        __m256 A[4], B[4];                                                                                   \
        for (int t = 0; t < nt; t++) A[t] = B[t] = _mm256_setzero_ps();                                      \
        for (int j = 0; j < nb / 8; j++) { /* super-blocks: nb is a multiple of 8 */                         \
            const uint8_t *p = row + (size_t)FE_IQ4_BYTES * (size_t)j;                                       \
            const float d = f16_1(p);                                                                        \
            for (int b = 8 * j; b < 8 * j + 8; b += 2) {                                                     \
                q8_block_##name(p, d, cols, xq, st, b, nt, A);                                               \
                q8_block_##name(p, d, cols, xq, st, b + 1, nt, B);                                           \
            }                                                                                                \
        }                                                                                                    \
        for (int t = 0; t < nt; t++) y[(size_t)t * ys] = hsum8(_mm256_add_ps(A[t], B[t]));                   \
    }                                                                                                        \
    FE_Q8_DRIVER(q8x86, TGTA, iq4xs_##name, fe_q8_stride)

X86_SET(avx2, INL2, TGT2, PRODUCT_AVX2)
X86_SET(vnni, INLV, TGTV, PRODUCT_VNNI)

fe_q8dot_fn fe_iq4xs_q8_kernel(int impl) {
    switch (impl) {
    case FE_KERNELS_AVX2: return fe_cpu_has_avx2() ? rowdot_q8x86_iq4xs_avx2 : NULL;
    case FE_Q8_AVX512VNNI: return fe_cpu_has_avx512vnni() ? rowdot_q8x86_iq4xs_vnni : NULL;
    default: return NULL;
    }
}

#elif defined(__aarch64__) && defined(__ARM_NEON)
#include <arm_neon.h>

#include "kernels_q8_neon_util.h"

#include "kernels_iq4xs.h"

#define INL static inline __attribute__((always_inline))

/* ---------------------------------------------------------- q8, NEON */


INL void q8_block_neon(const uint8_t *p, float d, int cols, const uint8_t *xq, size_t st, int b, const int nt, v8 *acc) {
    const float D = d * (float)(fe_iq4xs_code(p, b & 7) - 32); /* fe_iq4xs_scale */
    int8x16_t lo, hi;
    fe_iq4xs_levels(p + 8 + 16 * (b & 7), &lo, &hi);
    for (int t = 0; t < nt; t++) {
        const int8_t *x = XQ(t) + 32 * (size_t)b;
        const float32x4_t a = vdupq_n_f32(D * DX(t)[b]);
        acc[t].lo = vfmaq_f32(acc[t].lo, a, vcvtq_f32_s32(dot16(lo, vld1q_s8(x))));
        acc[t].hi = vfmaq_f32(acc[t].hi, a, vcvtq_f32_s32(dot16(hi, vld1q_s8(x + 16))));
    }
}

INL void iq4xs_neon_tile(const uint8_t *row, int cols, const uint8_t *xq, size_t st, float *y, size_t ys,
                         const int nt) {
    const int nb = cols / 32;
    v8 A[4], B[4];
    for (int t = 0; t < nt; t++) A[t].lo = A[t].hi = B[t].lo = B[t].hi = vdupq_n_f32(0.0f);
    for (int j = 0; j < nb / 8; j++) { /* super-blocks: nb is a multiple of 8 */
        const uint8_t *p = row + (size_t)FE_IQ4_BYTES * (size_t)j;
        const float d = fe_f16_to_f32((uint16_t)(p[0] | p[1] << 8));
        for (int b = 8 * j; b < 8 * j + 8; b += 2) {
            q8_block_neon(p, d, cols, xq, st, b, nt, A);
            q8_block_neon(p, d, cols, xq, st, b + 1, nt, B);
        }
    }
    for (int t = 0; t < nt; t++) { /* ((v0+v4)+(v2+v6)) + ((v1+v5)+(v3+v7)) */
        const float32x4_t s = vaddq_f32(vaddq_f32(A[t].lo, B[t].lo), vaddq_f32(A[t].hi, B[t].hi));
        const float32x2_t h = vadd_f32(vget_low_f32(s), vget_high_f32(s));
        y[(size_t)t * ys] = vget_lane_f32(h, 0) + vget_lane_f32(h, 1);
    }
}
FE_Q8_DRIVER(q8arm, , iq4xs_neon, fe_q8_stride)

fe_q8dot_fn fe_iq4xs_q8_kernel(int impl) { return impl == FE_KERNELS_NEON ? rowdot_q8arm_iq4xs_neon : NULL; }

#else
fe_q8dot_fn fe_iq4xs_q8_kernel(int impl) {
    (void)impl;
    return NULL;
}
#endif
