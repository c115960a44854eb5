/* kernels_avx2_util.h — the small AVX2 helpers both AVX2 kernel files use
 * (kernels_avx2.c, kernels_q8_avx2.c): one horizontal sum in one fixed
 * order (and its four-zmm form), one f16 value, and a q3_nl block's index bits. x86-64 only;
 * include after <immintrin.h>. */
#ifndef FERRY_KERNELS_AVX2_UTIL_H
#define FERRY_KERNELS_AVX2_UTIL_H

#include <stdint.h>
#include <string.h>

/* ((v0+v4)+(v2+v6)) + ((v1+v5)+(v3+v7)) */
static inline __attribute__((always_inline, target("avx2,fma,f16c"))) float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static inline __attribute__((always_inline, target("avx2,fma,f16c"))) float f16_1(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

/* Four 16-lane accumulators to one sum: (a0+a1)+(a2+a3), its two 256-bit
 * halves added, then hsum8 (the AVX-512 row kernels of q2_vq and iq4_xs). */
static inline __attribute__((always_inline, target("avx512f,avx512bw,avx512vl,avx2,fma,f16c"))) float
fe_hsum_zmm4(const __m512 *a) {
    const __m512 s = _mm512_add_ps(_mm512_add_ps(a[0], a[1]), _mm512_add_ps(a[2], a[3]));
    return hsum8(_mm256_add_ps(_mm512_castps512_ps256(s), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(s), 1))));
}

/* q3_nl (formats.h): bits `bit` .. bit + width - 1 (width <= 32) of each
 * lane's 96-bit index number (words w0, w1, w2 of the block's three rows) at
 * the bottom of the lane, garbage above; `bit` and `width` constants. */
static inline __attribute__((always_inline, target("avx2,fma,f16c"))) __m256i fe_q3_bits(__m256i w0, __m256i w1,
                                                                                        __m256i w2, const int bit,
                                                                                        const int width) {
    if (bit + width <= 32) return _mm256_srli_epi32(w0, bit);
    if (bit < 32) return _mm256_or_si256(_mm256_srli_epi32(w0, bit), _mm256_slli_epi32(w1, 32 - bit));
    if (bit + width <= 64) return _mm256_srli_epi32(w1, bit - 32);
    if (bit < 64) return _mm256_or_si256(_mm256_srli_epi32(w1, bit - 32), _mm256_slli_epi32(w2, 64 - bit));
    return _mm256_srli_epi32(w2, bit - 64);
}

#endif
