/* kernels_iq4xs.h — what iq4_xs's exact and q8 kernel files share (formats.h's
 * iq4_xs layout): one sub-block's 32 indices turned into their int8 levels by
 * one table lookup. Include after <immintrin.h> (x86-64) or <arm_neon.h>. */
#ifndef FERRY_KERNELS_IQ4XS_H
#define FERRY_KERNELS_IQ4XS_H

#include "formats.h"

#if defined(__x86_64__) || defined(_M_X64)
/* The 32 levels of sub-block ib's indices q (16 bytes) as int8: values 0-15
 * in the low 128 bits, 16-31 in the high. */
static inline __attribute__((always_inline, target("avx2,fma,f16c"))) __m256i fe_iq4xs_levels(const uint8_t *q) {
    const __m128i t = _mm_loadu_si128((const __m128i *)fe_iq4_values), m = _mm_set1_epi8(15);
    const __m128i v = _mm_loadu_si128((const __m128i *)q);
    const __m128i lo = _mm_shuffle_epi8(t, _mm_and_si128(v, m));
    const __m128i hi = _mm_shuffle_epi8(t, _mm_and_si128(_mm_srli_epi16(v, 4), m));
    return _mm256_set_m128i(hi, lo);
}

#elif defined(__aarch64__) && defined(__ARM_NEON)
/* The int8 levels of sub-block indices q: values 0-15 (lo) and 16-31 (hi). */
static inline __attribute__((always_inline)) void fe_iq4xs_levels(const uint8_t *q, int8x16_t *lo, int8x16_t *hi) {
    const int8x16_t t = vld1q_s8(fe_iq4_values);
    const uint8x16_t v = vld1q_u8(q);
    *lo = vqtbl1q_s8(t, vandq_u8(v, vdupq_n_u8(15)));
    *hi = vqtbl1q_s8(t, vshrq_n_u8(v, 4));
}

#endif

#endif
