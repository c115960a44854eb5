/* kernels_iq4xs.c — the iq4_xs row kernels (formats.h): exact (f32
 * activations) for AVX2 + FMA, AVX-512 (F, BW, VL) and NEON, and 8-bit
 * activation ones for AVX2, AVX-512 VNNI and NEON. The references are
 * kernels.c's (fe_dequant_row, then fe_dot_f32) and kernels_q8.c's
 * (decode_block: D_b = the sub-block's float scale d * (ls - 32), S = 1).
 *
 * Exact kernels: a sub-block's 16 index bytes give its 32 indices (low
 * nibbles values 0-15, high ones 16-31); one table lookup (pshufb / tbl) of
 * the 16 int8 levels turns them into the levels, widened to floats and
 * multiplied by the sub-block's scale: every weight is the reference's float
 * exactly (formats.h), only the order of the sums differs (kernels.h's rule).
 *
 * q8 kernels: the same lookup gives the int8 weights of a 32-value block,
 * and the integer dot with a token's FE_Q8_KIND_32 activations gives lane
 * l = sum of the products of values 4l..4l+3 (|lane| <= 4 * 127 * 127, exact
 * in float), then acc[b % 2][l] = fma(D_b * d_b, (float)p[l], acc): the
 * reference's operations (kernels_q8.h, "32-value formats"), so every set is
 * bit-identical to the scalar one. AVX2: maddubs on |w| and x signed by w
 * (a pair sum at most 2 * 127 * 127 = 32258: no int16 saturation), then madd
 * with ones; AVX-512 VNNI: vpdpbusd on the same operands; NEON: SDOT (or
 * widening multiplies and pairwise adds). Tokens run in tiles of up to 4
 * sharing each decoded block (FE_Q8_DRIVER).
 *
 * A token's operations never depend on the others in the call, so a batch
 * is bit-identical to single tokens. The x86 sets use per-function target
 * attributes (the extension loads on any x86-64); fe_iq4xs_kernel and
 * fe_iq4xs_q8_kernel say which ones this CPU runs. Nothing here keeps state. */
#include "kernels.h"
#include "kernels_q8.h"

#include <string.h>

#define XQ(t) ((const int8_t *)(xq + (size_t)(t) * st))
#define DX(t) ((const float *)(xq + (size_t)(t) * st + (size_t)cols))

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>

#include "kernels_avx2_util.h"

#define TGT2 __attribute__((target("avx2,fma,f16c")))
#define INL2 static inline __attribute__((always_inline, target("avx2,fma,f16c")))
#define ISA5 "avx512f,avx512bw,avx512vl,avx2,fma,f16c"
#define TGT5 __attribute__((target(ISA5)))
#define INL5 static inline __attribute__((always_inline, target(ISA5)))
#define ISAV "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c"
#define TGTV __attribute__((target(ISAV)))
#define INLV static inline __attribute__((always_inline, target(ISAV)))

/* The 32 levels of sub-block ib's indices q (16 bytes) as int8: values 0-15
 * in the low 128 bits, 16-31 in the high. */
INL2 __m256i levels32(const uint8_t *q) {
    const __m128i t = _mm_loadu_si128((const __m128i *)fe_iq4_values), m = _mm_set1_epi8(15);
    const __m128i v = _mm_loadu_si128((const __m128i *)q);
    const __m128i lo = _mm_shuffle_epi8(t, _mm_and_si128(v, m));
    const __m128i hi = _mm_shuffle_epi8(t, _mm_and_si128(_mm_srli_epi16(v, 4), m));
    return _mm256_set_m128i(hi, lo);
}

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
        for (int ib = 0; ib < 8; ib++) {
            const __m256 s = _mm256_set1_ps(fe_iq4xs_scale(p, ib));
            const __m256i l = levels32(p + 8 + 16 * ib);
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
        for (int ib = 0; ib < 8; ib++) {
            const __m512 s = _mm512_set1_ps(fe_iq4xs_scale(p, ib));
            const __m256i l = levels32(p + 8 + 16 * ib);
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
    const __m512 sa = _mm512_add_ps(_mm512_add_ps(a[0], a[1]), _mm512_add_ps(a[2], a[3]));
    *ya = hsum8(_mm256_add_ps(_mm512_castps512_ps256(sa), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(sa), 1))));
    if (two) {
        const __m512 sb = _mm512_add_ps(_mm512_add_ps(b[0], b[1]), _mm512_add_ps(b[2], b[3]));
        *yb = hsum8(_mm256_add_ps(_mm512_castps512_ps256(sb),
                                  _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(sb), 1))));
    }
}
FE_ROWDOT_PAIRS(x86, TGT5, iq4xs_avx512)

/* ---------------------------------------------------------- q8, AVX2 */

INL2 __m256 fold2(__m256 acc, float a, __m256i p) {
    return _mm256_fmadd_ps(_mm256_set1_ps(a), _mm256_cvtepi32_ps(p), acc);
}

/* Block b (32 values: super-block b / 8, sub-block b % 8) into acc[t]. */
INL2 void q8_block_avx2(const uint8_t *row, int cols, const uint8_t *xq, size_t st, int b, const int nt,
                        __m256 *acc) {
    const uint8_t *p = row + (size_t)FE_IQ4_BYTES * (size_t)(b >> 3);
    const float D = fe_iq4xs_scale(p, b & 7);
    const __m256i w = levels32(p + 8 + 16 * (b & 7)), aw = _mm256_sign_epi8(w, w);
    for (int t = 0; t < nt; t++) {
        const __m256i x = _mm256_loadu_si256((const __m256i *)(XQ(t) + 32 * (size_t)b));
        const __m256i pr = _mm256_madd_epi16(_mm256_maddubs_epi16(aw, _mm256_sign_epi8(x, w)), _mm256_set1_epi16(1));
        acc[t] = fold2(acc[t], D * DX(t)[b], pr);
    }
}

INL2 void iq4xs_avx2_tile(const uint8_t *row, int cols, const uint8_t *xq, size_t st, float *y, size_t ys,
                          const int nt) {
    const int nb = cols / 32;
    __m256 A[4], B[4];
    for (int t = 0; t < nt; t++) A[t] = B[t] = _mm256_setzero_ps();
    for (int b = 0; b < nb; b += 2) { /* nb is a multiple of 8 */
        q8_block_avx2(row, cols, xq, st, b, nt, A);
        q8_block_avx2(row, cols, xq, st, b + 1, nt, B);
    }
    for (int t = 0; t < nt; t++) y[(size_t)t * ys] = hsum8(_mm256_add_ps(A[t], B[t]));
}
FE_Q8_DRIVER(q8x86, TGT2, iq4xs_avx2, fe_q8_stride)

/* --------------------------------------------------- q8, AVX-512 VNNI */

INLV void q8_block_vnni(const uint8_t *row, int cols, const uint8_t *xq, size_t st, int b, const int nt,
                        __m256 *acc) {
    const uint8_t *p = row + (size_t)FE_IQ4_BYTES * (size_t)(b >> 3);
    const float D = fe_iq4xs_scale(p, b & 7);
    const __m256i w = levels32(p + 8 + 16 * (b & 7)), aw = _mm256_sign_epi8(w, w);
    for (int t = 0; t < nt; t++) {
        const __m256i x = _mm256_loadu_si256((const __m256i *)(XQ(t) + 32 * (size_t)b));
        const __m256i pr = _mm256_dpbusd_epi32(_mm256_setzero_si256(), aw, _mm256_sign_epi8(x, w));
        acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(D * DX(t)[b]), _mm256_cvtepi32_ps(pr), acc[t]);
    }
}

INLV void iq4xs_vnni_tile(const uint8_t *row, int cols, const uint8_t *xq, size_t st, float *y, size_t ys,
                          const int nt) {
    const int nb = cols / 32;
    __m256 A[4], B[4];
    for (int t = 0; t < nt; t++) A[t] = B[t] = _mm256_setzero_ps();
    for (int b = 0; b < nb; b += 2) {
        q8_block_vnni(row, cols, xq, st, b, nt, A);
        q8_block_vnni(row, cols, xq, st, b + 1, nt, B);
    }
    for (int t = 0; t < nt; t++) y[(size_t)t * ys] = hsum8(_mm256_add_ps(A[t], B[t]));
}
FE_Q8_DRIVER(q8x86, TGTV, iq4xs_vnni, fe_q8_stride)

fe_rowdot_fn fe_iq4xs_kernel(int variant) {
    switch (variant) {
    case FE_SIMD_AVX2: return fe_cpu_has_avx2() ? rowdot_x86_iq4xs_avx2 : NULL;
    case FE_SIMD_AVX512: return fe_cpu_has_avx512() ? rowdot_x86_iq4xs_avx512 : NULL;
    default: return NULL;
    }
}

fe_q8dot_fn fe_iq4xs_q8_kernel(int impl) {
    switch (impl) {
    case FE_KERNELS_AVX2: return fe_cpu_has_avx2() ? rowdot_q8x86_iq4xs_avx2 : NULL;
    case FE_Q8_AVX512VNNI: return fe_cpu_has_avx512vnni() ? rowdot_q8x86_iq4xs_vnni : NULL;
    default: return NULL;
    }
}

#elif defined(__aarch64__) && defined(__ARM_NEON)
#include <arm_neon.h>

#define INL static inline __attribute__((always_inline))

/* The int8 levels of sub-block indices q: values 0-15 (lo) and 16-31 (hi). */
INL void levels32(const uint8_t *q, int8x16_t *lo, int8x16_t *hi) {
    const int8x16_t t = vld1q_s8(fe_iq4_values);
    const uint8x16_t v = vld1q_u8(q);
    *lo = vqtbl1q_s8(t, vandq_u8(v, vdupq_n_u8(15)));
    *hi = vqtbl1q_s8(t, vshrq_n_u8(v, 4));
}

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
        for (int ib = 0; ib < 8; ib++) {
            const float32x4_t s = vdupq_n_f32(fe_iq4xs_scale(p, ib));
            int8x16_t l[2];
            levels32(p + 8 + 16 * ib, &l[0], &l[1]);
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

/* ---------------------------------------------------------- q8, NEON */

INL int32x4_t dot16(int8x16_t a, int8x16_t b) {
#if defined(__ARM_FEATURE_DOTPROD)
    return vdotq_s32(vdupq_n_s32(0), a, b);
#else
    int16x8_t lo = vmull_s8(vget_low_s8(a), vget_low_s8(b)), hi = vmull_high_s8(a, b);
    return vpaddq_s32(vpaddlq_s16(lo), vpaddlq_s16(hi));
#endif
}

typedef struct { float32x4_t lo, hi; } v8;

INL void q8_block_neon(const uint8_t *row, int cols, const uint8_t *xq, size_t st, int b, const int nt, v8 *acc) {
    const uint8_t *p = row + (size_t)FE_IQ4_BYTES * (size_t)(b >> 3);
    const float D = fe_iq4xs_scale(p, b & 7);
    int8x16_t lo, hi;
    levels32(p + 8 + 16 * (b & 7), &lo, &hi);
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
    for (int b = 0; b < nb; b += 2) {
        q8_block_neon(row, cols, xq, st, b, nt, A);
        q8_block_neon(row, cols, xq, st, b + 1, nt, B);
    }
    for (int t = 0; t < nt; t++) { /* ((v0+v4)+(v2+v6)) + ((v1+v5)+(v3+v7)) */
        const float32x4_t s = vaddq_f32(vaddq_f32(A[t].lo, B[t].lo), vaddq_f32(A[t].hi, B[t].hi));
        const float32x2_t h = vadd_f32(vget_low_f32(s), vget_high_f32(s));
        y[(size_t)t * ys] = vget_lane_f32(h, 0) + vget_lane_f32(h, 1);
    }
}
FE_Q8_DRIVER(q8arm, , iq4xs_neon, fe_q8_stride)

fe_rowdot_fn fe_iq4xs_kernel(int variant) { return variant == FE_SIMD_NEON ? rowdot_arm_iq4xs_neon : NULL; }

fe_q8dot_fn fe_iq4xs_q8_kernel(int impl) { return impl == FE_KERNELS_NEON ? rowdot_q8arm_iq4xs_neon : NULL; }

#else
fe_rowdot_fn fe_iq4xs_kernel(int variant) {
    (void)variant;
    return NULL;
}
fe_q8dot_fn fe_iq4xs_q8_kernel(int impl) {
    (void)impl;
    return NULL;
}
#endif
