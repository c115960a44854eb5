/* kernels_avx2_util.h — the small AVX2 helpers both AVX2 kernel files use
 * (kernels_avx2.c, kernels_q8_avx2.c): one horizontal sum in one fixed
 * order, and one f16 value. x86-64 only; include after <immintrin.h>. */
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

#endif
