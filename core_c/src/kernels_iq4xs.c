/* kernels_iq4xs.c — the iq4_xs exact row kernels (formats.h; f32
 * activations) for AVX2 + FMA, AVX-512 (F, BW, VL) and NEON; the 8-bit
 * activation ones are kernels_q8_iq4xs.c's. The reference is kernels.c's
 * (fe_dequant_row, then fe_dot_f32). A sub-block's 16 index bytes give its 32
 * indices (low nibbles values 0-15, high ones 16-31); one table lookup
 * (pshufb / tbl, kernels_iq4xs.h) of the 16 int8 levels turns them into the
 * levels, widened to floats and multiplied by the sub-block's scale: every
 * weight is the reference's float exactly (formats.h), only the order of the
 * sums differs (kernels.h's rule). Tokens run in pairs (FE_ROWDOT_PAIRS); a
 * token's operations never depend on the others in the call, so a batch is
 * bit-identical to single tokens. The x86 sets use per-function target
 * attributes (the extension loads on any x86-64); fe_iq4xs_kernel says which
 * this CPU runs. Nothing here keeps state. */
#include "kernels.h"

#include <string.h>


#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>

#include "kernels_avx2_util.h"
#include "kernels_iq4xs.h"

#define TGT2 __attribute__((target("avx2,fma,f16c")))
#define INL2 static inline __attribute__((always_inline, target("avx2,fma,f16c")))
#define ISA5 "avx512f,avx512bw,avx512vl,avx2,fma,f16c"
#define TGT5 __attribute__((target(ISA5)))
#define INL5 static inline __attribute__((always_inline, target(ISA5)))

/* ------------------------------------------------------- exact, AVX2 */

/* 8 weights: the int8 levels at byte 8i of `l` (i = 0..3) times s. */
INL2 __m256 w8(__m256i l, int i, __m256 s) {
    const __m128i h = i < 2 ? _mm256_castsi256_si128(l) : _mm256_extracti128_si256(l, 1);
    const __m128i b = (i & 1) ? _mm_srli_si128(h, 8) : h;
    return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b)), s);
}

/* Per token four accumulators; values 8i..8i+7 of a sub-block go to accumulator i. */
INL2 void iq4xs_avx2_pair(const uint8_t *row, int cols, const float *xa, const float *xb, float *ya, float *yb,
                          const int two) {
    __m256 a[4], b[4];
    for (int i = 0; i < 4; i++) a[i] = b[i] = _mm256_setzero_ps();
    for (int blk = 0; blk < cols / FE_IQ4_BLOCK; blk++) {
        const uint8_t *p = row + (size_t)FE_IQ4_BYTES * (size_t)blk;
        const float d = f16_1(p); /* fe_iq4xs_scale's d, by F16C */
        for (int ib = 0; ib < 8; ib++) {
            const __m256 s = _mm256_set1_ps(d * (float)(fe_iq4xs_code(p, ib) - 32));
            const __m256i l = fe_iq4xs_levels(p + 8 + 16 * ib);
            const float *x0 = xa + FE_IQ4_BLOCK * blk + 32 * ib, *x1 = xb + FE_IQ4_BLOCK * blk + 32 * ib;
            for (int i = 0; i < 4; i++) {
                const __m256 w = w8(l, i, s);
                a[i] = _mm256_fmadd_ps(w, _mm256_loadu_ps(x0 + 8 * i), a[i]);
                if (two) b[i] = _mm256_fmadd_ps(w, _mm256_loadu_ps(x1 + 8 * i), b[i]);
            }
        }
    }
    *ya = hsum8(_mm256_add_ps(_mm256_add_ps(a[0], a[1]), _mm256_add_ps(a[2], a[3])));
    if (two) *yb = hsum8(_mm256_add_ps(_mm256_add_ps(b[0], b[1]), _mm256_add_ps(b[2], b[3])));
}
FE_ROWDOT_PAIRS(x86, TGT2, iq4xs_avx2)

/* ---------------------------------------------------- exact, AVX-512 */

/* Per token four accumulators: sub-block ib's halves go to 2(ib % 2) and 2(ib % 2) + 1. */
INL5 void iq4xs_avx512_pair(const uint8_t *row, int cols, const float *xa, const float *xb, float *ya, float *yb,
                            const int two) {
    __m512 a[4], b[4];
    for (int i = 0; i < 4; i++) a[i] = b[i] = _mm512_setzero_ps();
    for (int blk = 0; blk < cols / FE_IQ4_BLOCK; blk++) {
        const uint8_t *p = row + (size_t)FE_IQ4_BYTES * (size_t)blk;
        const float d = f16_1(p);
        for (int ib = 0; ib < 8; ib++) {
            const __m512 s = _mm512_set1_ps(d * (float)(fe_iq4xs_code(p, ib) - 32));
            const __m256i l = fe_iq4xs_levels(p + 8 + 16 * ib);
            const __m512 w0 = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_castsi256_si128(l))), s);
            const __m512 w1 = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_extracti128_si256(l, 1))), s);
            const float *x0 = xa + FE_IQ4_BLOCK * blk + 32 * ib, *x1 = xb + FE_IQ4_BLOCK * blk + 32 * ib;
            const int j = 2 * (ib & 1);
            a[j] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(x0), a[j]);
            a[j + 1] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(x0 + 16), a[j + 1]);
            if (two) {
                b[j] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(x1), b[j]);
                b[j + 1] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(x1 + 16), b[j + 1]);
            }
        }
    }
    *ya = fe_hsum_zmm4(a);
    if (two) *yb = fe_hsum_zmm4(b);
}
FE_ROWDOT_PAIRS(x86, TGT5, iq4xs_avx512)

fe_rowdot_fn fe_iq4xs_kernel(int variant) {
    switch (variant) {
    case FE_SIMD_AVX2: return fe_cpu_has_avx2() ? rowdot_x86_iq4xs_avx2 : NULL;
    case FE_SIMD_AVX512: return fe_cpu_has_avx512() ? rowdot_x86_iq4xs_avx512 : NULL;
    default: return NULL;
    }
}

#elif defined(__aarch64__) && defined(__ARM_NEON)
#include <arm_neon.h>

#include "kernels_iq4xs.h"

#define INL static inline __attribute__((always_inline))

/* ------------------------------------------------------- exact, NEON */

INL float32x4_t w4(int16x8_t h, int upper, float32x4_t s) {
    const int32x4_t i = upper ? vmovl_high_s16(h) : vmovl_s16(vget_low_s16(h));
    return vmulq_f32(vcvtq_f32_s32(i), s);
}

/* Per token four accumulators; values 4i..4i+3 of each 16 go to accumulator i. */
INL void iq4xs_neon_pair(const uint8_t *row, int cols, const float *xa, const float *xb, float *ya, float *yb,
                         const int two) {
    float32x4_t a[4], b[4];
    for (int i = 0; i < 4; i++) a[i] = b[i] = vdupq_n_f32(0.0f);
    for (int blk = 0; blk < cols / FE_IQ4_BLOCK; blk++) {
        const uint8_t *p = row + (size_t)FE_IQ4_BYTES * (size_t)blk;
        const float d = fe_f16_to_f32((uint16_t)(p[0] | p[1] << 8));
        for (int ib = 0; ib < 8; ib++) {
            const float32x4_t s = vdupq_n_f32(d * (float)(fe_iq4xs_code(p, ib) - 32));
            int8x16_t l[2];
            fe_iq4xs_levels(p + 8 + 16 * ib, &l[0], &l[1]);
            const float *x0 = xa + FE_IQ4_BLOCK * blk + 32 * ib, *x1 = xb + FE_IQ4_BLOCK * blk + 32 * ib;
            for (int h = 0; h < 2; h++) {
                const int16x8_t e0 = vmovl_s8(vget_low_s8(l[h])), e1 = vmovl_high_s8(l[h]);
                const float32x4_t w[4] = {w4(e0, 0, s), w4(e0, 1, s), w4(e1, 0, s), w4(e1, 1, s)};
                for (int i = 0; i < 4; i++) {
                    a[i] = vfmaq_f32(a[i], w[i], vld1q_f32(x0 + 16 * h + 4 * i));
                    if (two) b[i] = vfmaq_f32(b[i], w[i], vld1q_f32(x1 + 16 * h + 4 * i));
                }
            }
        }
    }
    *ya = vaddvq_f32(vaddq_f32(vaddq_f32(a[0], a[1]), vaddq_f32(a[2], a[3])));
    if (two) *yb = vaddvq_f32(vaddq_f32(vaddq_f32(b[0], b[1]), vaddq_f32(b[2], b[3])));
}
FE_ROWDOT_PAIRS(arm, , iq4xs_neon)

fe_rowdot_fn fe_iq4xs_kernel(int variant) { return variant == FE_SIMD_NEON ? rowdot_arm_iq4xs_neon : NULL; }

#else
fe_rowdot_fn fe_iq4xs_kernel(int variant) {
    (void)variant;
    return NULL;
}
#endif
