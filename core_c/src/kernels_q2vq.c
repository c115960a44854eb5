/* kernels_q2vq.c — the q2_vq row kernels (formats.h): AVX2 + FMA, AVX-512
 * (F, BW, VL) and NEON. The scalar reference is kernels.c's (fe_dequant_row,
 * then fe_dot_f32); these agree with it within kernels.h's rule: every
 * weight is the same float (the codebook value with its sign, times the
 * sub-block scale: one rounding, sign-symmetric), only the order of the sums
 * differs. Decoding 8 weights is one 32-byte load of a codebook row (the 8
 * values are contiguous: no gather, no unpacking), a sign mask from one byte
 * and a multiply.
 *
 * Each set runs tokens in pairs (kernels.h: FE_ROWDOT_PAIRS), and a token's
 * operations never depend on the others in the call, so a batch is
 * bit-identical to single tokens. The x86 sets are compiled with
 * per-function target attributes, so the extension loads on any x86-64;
 * fe_q2vq_kernel reports which this CPU runs. Nothing here keeps state. */
#include "kernels.h"

#include <string.h>

static inline unsigned q2_word(const uint8_t *p, int k) { return (unsigned)p[2 * k] | (unsigned)p[2 * k + 1] << 8; }

#if defined(__x86_64__) || defined(_M_X64)
#include <cpuid.h>
#include <immintrin.h>

#include "kernels_avx2_util.h"

#define TGT2 __attribute__((target("avx2,fma,f16c")))
#define INL2 static inline __attribute__((always_inline, target("avx2,fma,f16c")))
#define ISA5 "avx512f,avx512bw,avx512vl,avx2,fma,f16c"
#define TGT5 __attribute__((target(ISA5)))
#define INL5 static inline __attribute__((always_inline, target(ISA5)))

/* ------------------------------------------------------------- AVX2 */

/* The 8 weights of word k: the codebook row, the sign bits xor-ed in, times s. */
INL2 __m256 avx2_vec8(const uint8_t *p, int k, __m256 s, __m256i bits) {
    const unsigned w = q2_word(p, k);
    const __m256 c = _mm256_loadu_ps(fe_q2_codebook + 8 * (w & 511u));
    __m256i m = _mm256_and_si256(_mm256_set1_epi32(fe_q2_signs(w)), bits);
    m = _mm256_slli_epi32(_mm256_cmpeq_epi32(m, bits), 31);
    return _mm256_mul_ps(_mm256_castsi256_ps(_mm256_xor_si256(_mm256_castps_si256(c), m)), s);
}

/* Per token four accumulators; word k goes to accumulator k % 4. */
INL2 void q2vq_avx2_pair(const uint8_t *row, int cols, const float *xa, const float *xb, float *ya, float *yb,
                         const int two) {
    const __m256i bits = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
    __m256 a[4], b[4];
    for (int i = 0; i < 4; i++) a[i] = b[i] = _mm256_setzero_ps();
    for (int blk = 0; blk < cols / FE_Q2_BLOCK; blk++) {
        const uint8_t *p = row + (size_t)FE_Q2_BYTES * (size_t)blk;
        const float *x0 = xa + FE_Q2_BLOCK * blk, *x1 = xb + FE_Q2_BLOCK * blk;
        for (int g = 0; g < 16; g += 2) {
            const __m256 s0 = _mm256_set1_ps(fe_q2_group_scale(p, g)), s1 = _mm256_set1_ps(fe_q2_group_scale(p, g + 1));
            __m256 w[4] = {avx2_vec8(p, 2 * g, s0, bits), avx2_vec8(p, 2 * g + 1, s0, bits),
                           avx2_vec8(p, 2 * g + 2, s1, bits), avx2_vec8(p, 2 * g + 3, s1, bits)};
            for (int i = 0; i < 4; i++) a[i] = _mm256_fmadd_ps(w[i], _mm256_loadu_ps(x0 + 16 * g + 8 * i), a[i]);
            if (two)
                for (int i = 0; i < 4; i++) b[i] = _mm256_fmadd_ps(w[i], _mm256_loadu_ps(x1 + 16 * g + 8 * i), b[i]);
        }
    }
    *ya = hsum8(_mm256_add_ps(_mm256_add_ps(a[0], a[1]), _mm256_add_ps(a[2], a[3])));
    if (two) *yb = hsum8(_mm256_add_ps(_mm256_add_ps(b[0], b[1]), _mm256_add_ps(b[2], b[3])));
}
FE_ROWDOT_PAIRS(x86, TGT2, q2vq_avx2)

/* ---------------------------------------------------------- AVX-512 */

/* The 16 weights of sub-block g: two codebook rows in one register, the
 * 16 sign bits as a mask that flips the sign bit, times the scale. */
INL5 __m512 avx512_vec16(const uint8_t *p, int g) {
    const unsigned w0 = q2_word(p, 2 * g), w1 = q2_word(p, 2 * g + 1);
    const __m256d lo = _mm256_castps_pd(_mm256_loadu_ps(fe_q2_codebook + 8 * (w0 & 511u)));
    const __m256d hi = _mm256_castps_pd(_mm256_loadu_ps(fe_q2_codebook + 8 * (w1 & 511u)));
    const __m512i c = _mm512_castpd_si512(_mm512_insertf64x4(_mm512_castpd256_pd512(lo), hi, 1));
    const __mmask16 k = (__mmask16)(fe_q2_signs(w0) | fe_q2_signs(w1) << 8);
    const __m512i v = _mm512_mask_xor_epi32(c, k, c, _mm512_set1_epi32((int)0x80000000u));
    return _mm512_mul_ps(_mm512_castsi512_ps(v), _mm512_set1_ps(fe_q2_group_scale(p, g)));
}

/* Per token four accumulators; sub-block g goes to accumulator g % 4. */
INL5 void q2vq_avx512_pair(const uint8_t *row, int cols, const float *xa, const float *xb, float *ya, float *yb,
                           const int two) {
    __m512 a[4], b[4];
    for (int i = 0; i < 4; i++) a[i] = b[i] = _mm512_setzero_ps();
    for (int blk = 0; blk < cols / FE_Q2_BLOCK; blk++) {
        const uint8_t *p = row + (size_t)FE_Q2_BYTES * (size_t)blk;
        const float *x0 = xa + FE_Q2_BLOCK * blk, *x1 = xb + FE_Q2_BLOCK * blk;
        for (int g = 0; g < 16; g += 4) {
            __m512 w[4] = {avx512_vec16(p, g), avx512_vec16(p, g + 1), avx512_vec16(p, g + 2), avx512_vec16(p, g + 3)};
            for (int i = 0; i < 4; i++) a[i] = _mm512_fmadd_ps(w[i], _mm512_loadu_ps(x0 + 16 * (g + i)), a[i]);
            if (two)
                for (int i = 0; i < 4; i++) b[i] = _mm512_fmadd_ps(w[i], _mm512_loadu_ps(x1 + 16 * (g + i)), b[i]);
        }
    }
    *ya = fe_hsum_zmm4(a);
    if (two) *yb = fe_hsum_zmm4(b);
}
FE_ROWDOT_PAIRS(x86, TGT5, q2vq_avx512)

fe_rowdot_fn fe_q2vq_kernel(int variant) {
    switch (variant) {
    case FE_SIMD_AVX2: return fe_cpu_has_avx2() ? rowdot_x86_q2vq_avx2 : NULL;
    case FE_SIMD_AVX512: return fe_cpu_has_avx512() ? rowdot_x86_q2vq_avx512 : NULL;
    default: return NULL;
    }
}

#elif defined(__aarch64__) && defined(__ARM_NEON)
#include <arm_neon.h>

/* ------------------------------------------------------------- NEON */

static inline float32x4_t neon_signed(const float *c, int sg, uint32x4_t bits, float32x4_t s) {
    const uint32x4_t m = vshlq_n_u32(vtstq_u32(vdupq_n_u32((uint32_t)sg), bits), 31);
    return vmulq_f32(vreinterpretq_f32_u32(veorq_u32(vreinterpretq_u32_f32(vld1q_f32(c)), m)), s);
}

/* Per token four accumulators: word k's halves go to accumulators 2(k % 2) and 2(k % 2) + 1. */
static inline void q2vq_neon_pair(const uint8_t *row, int cols, const float *xa, const float *xb, float *ya,
                                  float *yb, const int two) {
    static const uint32_t lo_bits[4] = {1, 2, 4, 8}, hi_bits[4] = {16, 32, 64, 128};
    const uint32x4_t blo = vld1q_u32(lo_bits), bhi = vld1q_u32(hi_bits);
    float32x4_t a[4], b[4];
    for (int i = 0; i < 4; i++) a[i] = b[i] = vdupq_n_f32(0.0f);
    for (int blk = 0; blk < cols / FE_Q2_BLOCK; blk++) {
        const uint8_t *p = row + (size_t)FE_Q2_BYTES * (size_t)blk;
        const float *x0 = xa + FE_Q2_BLOCK * blk, *x1 = xb + FE_Q2_BLOCK * blk;
        for (int k = 0; k < 32; k++) {
            const unsigned wd = q2_word(p, k);
            const int sg = fe_q2_signs(wd);
            const float *c = fe_q2_codebook + 8 * (wd & 511u);
            const float32x4_t s = vdupq_n_f32(fe_q2_group_scale(p, k >> 1));
            const float32x4_t w0 = neon_signed(c, sg, blo, s), w1 = neon_signed(c + 4, sg, bhi, s);
            const int j = 2 * (k & 1);
            a[j] = vfmaq_f32(a[j], w0, vld1q_f32(x0 + 8 * k));
            a[j + 1] = vfmaq_f32(a[j + 1], w1, vld1q_f32(x0 + 8 * k + 4));
            if (two) {
                b[j] = vfmaq_f32(b[j], w0, vld1q_f32(x1 + 8 * k));
                b[j + 1] = vfmaq_f32(b[j + 1], w1, vld1q_f32(x1 + 8 * k + 4));
            }
        }
    }
    *ya = vaddvq_f32(vaddq_f32(vaddq_f32(a[0], a[1]), vaddq_f32(a[2], a[3])));
    if (two) *yb = vaddvq_f32(vaddq_f32(vaddq_f32(b[0], b[1]), vaddq_f32(b[2], b[3])));
}
FE_ROWDOT_PAIRS(arm, , q2vq_neon)

fe_rowdot_fn fe_q2vq_kernel(int variant) { return variant == FE_SIMD_NEON ? rowdot_arm_q2vq_neon : NULL; }

#else
fe_rowdot_fn fe_q2vq_kernel(int variant) {
    (void)variant;
    return NULL;
}
#endif

