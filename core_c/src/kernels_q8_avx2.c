/* kernels_q8_avx2.c — the 8-bit-activation row kernels for x86-64 AVX2
 * (per-function target attributes, selected only when the CPU has AVX2, FMA
 * and F16C: kernels.c's fe_cpu_has_avx2).
 *
 * A 32-value block's weight integers sit in one 256-bit register; the dot
 * with a token's int8 activations is _mm256_maddubs_epi16 (unsigned x signed
 * byte pairs; signed weights go through the usual sign trick) and then
 * _mm256_madd_epi16 with the integer scale (1 for 32-blocks), which leaves
 * lane l = S * sum of values 4l..4l+3: exactly the reference's p[l]. The
 * float steps are the reference's (kernels_q8.h), lane for lane, with the
 * same fused multiply-adds. Tokens run in tiles of up to 4 that share each
 * decoded weight block; a token's arithmetic does not depend on its tile. */
#include "kernels.h"
#include "kernels_q8.h"

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#include <string.h>

#define INL static inline __attribute__((always_inline, target("avx2,fma,f16c")))
#define TGT __attribute__((target("avx2,fma,f16c")))
#define TILE 4 /* tokens sharing a decoded weight block (FE_Q8_DRIVER) */

INL float hsum(__m256 v) { /* ((v0+v4)+(v2+v6)) + ((v1+v5)+(v3+v7)) */
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

INL float f16(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

INL __m256i ld(const void *p) { return _mm256_loadu_si256((const __m256i *)p); }

/* fma(a, (float)p, acc), lane by lane. */
INL __m256 fold(__m256 acc, float a, __m256i p) { return _mm256_fmadd_ps(_mm256_set1_ps(a), _mm256_cvtepi32_ps(p), acc); }

/* The 32 nibbles of 16 bytes as bytes: low nibbles (values 0-15), then high ones (16-31). */
INL __m256i nibbles(const uint8_t *q) {
    __m128i v = _mm_loadu_si128((const __m128i *)q);
    return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(v, 4), v), _mm256_set1_epi8(15));
}

/* Token t's parts of the quantized activations. */
#define QX(t) ((const uint8_t *)(xq + (size_t)(t) * st))
#define DX(t) ((const float *)(xq + (size_t)(t) * st + (size_t)cols))
#define SX(t) (DX(t) + nb)

/* Q8_0 and Q4_0: signed weights, no minimum. */
INL void signed_tile(const uint8_t *row, int cols, const uint8_t *xq, size_t st, float *y, size_t ys,
                     const int nt, const int four) {
    const int nb = cols / 32;
    const __m256i ones = _mm256_set1_epi16(1), eight = _mm256_set1_epi8(8);
    __m256 acc[TILE];
    for (int t = 0; t < nt; t++) acc[t] = _mm256_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const uint8_t *p = row + (four ? 18 : 34) * (size_t)b;
        const float dw = f16(p);
        __m256i w = four ? _mm256_sub_epi8(nibbles(p + 2), eight) : ld(p + 2);
        __m256i aw = _mm256_sign_epi8(w, w);
        for (int t = 0; t < nt; t++) {
            __m256i x = ld(QX(t) + 32 * (size_t)b);
            __m256i pr = _mm256_madd_epi16(_mm256_maddubs_epi16(aw, _mm256_sign_epi8(x, w)), ones);
            acc[t] = fold(acc[t], dw * DX(t)[b], pr);
        }
    }
    for (int t = 0; t < nt; t++) y[(size_t)t * ys] = hsum(acc[t]);
}

INL void q8_0_tile(const uint8_t *row, int cols, const uint8_t *xq, size_t st, float *y, size_t ys, const int nt) {
    signed_tile(row, cols, xq, st, y, ys, nt, 0);
}
INL void q4_0_tile(const uint8_t *row, int cols, const uint8_t *xq, size_t st, float *y, size_t ys, const int nt) {
    signed_tile(row, cols, xq, st, y, ys, nt, 1);
}

INL void q4_1_tile(const uint8_t *row, int cols, const uint8_t *xq, size_t st, float *y, size_t ys, const int nt) {
    const int nb = cols / 32;
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 acc[TILE], mn[TILE];
    for (int t = 0; t < nt; t++) acc[t] = mn[t] = _mm256_setzero_ps();
    for (int g = 0; g < nb; g += 8) {
        const int m = nb - g < 8 ? nb - g : 8;
        float M8[8] = {0};
        for (int k = 0; k < m; k++) {
            const int b = g + k;
            const uint8_t *p = row + 20 * (size_t)b;
            const float dw = f16(p);
            M8[k] = f16(p + 2);
            __m256i w = nibbles(p + 4);
            for (int t = 0; t < nt; t++) {
                __m256i pr = _mm256_madd_epi16(_mm256_maddubs_epi16(w, ld(QX(t) + 32 * (size_t)b)), ones);
                acc[t] = fold(acc[t], dw * DX(t)[b], pr);
            }
        }
        __m256 Mv = _mm256_loadu_ps(M8);
        for (int t = 0; t < nt; t++) {
            __m256 s = _mm256_setzero_ps();
            if (m == 8) {
                s = _mm256_loadu_ps(SX(t) + g);
            } else { /* the last, partial group: zeros beyond the row */
                float s8[8] = {0};
                for (int k = 0; k < m; k++) s8[k] = SX(t)[g + k];
                s = _mm256_loadu_ps(s8);
            }
            mn[t] = _mm256_fmadd_ps(Mv, s, mn[t]);
        }
    }
    for (int t = 0; t < nt; t++) y[(size_t)t * ys] = hsum(acc[t]) + hsum(mn[t]);
}

/* Q4_K, and Q5_K (five = 1: the fifth bit of value 32k + l is bit k of qh[l]). */
INL void k45_tile(const uint8_t *row, int cols, const uint8_t *xq, size_t st, float *y, size_t ys, const int nt,
                  const int five) {
    const int nb = cols / 32;
    const __m256i m15 = _mm256_set1_epi8(15), one = _mm256_set1_epi8(1);
    __m256 acc[TILE], mn[TILE];
    for (int t = 0; t < nt; t++) acc[t] = mn[t] = _mm256_setzero_ps();
    for (int sb = 0; sb < nb / 8; sb++) {
        const uint8_t *p = row + (five ? 176 : 144) * (size_t)sb;
        const float d = f16(p), dmin = f16(p + 2);
        const uint8_t *q = p + (five ? 48 : 16);
        const __m256i hv = five ? ld(p + 16) : _mm256_setzero_si256();
        int sc[8], m[8];
        for (int k = 0; k < 8; k++) fe_q4k_scale_min(k, p + 4, &sc[k], &m[k]);
        for (int k = 0; k < 8; k++) {
            __m256i qq = ld(q + 32 * (k >> 1));
            __m256i w = _mm256_and_si256((k & 1) ? _mm256_srli_epi16(qq, 4) : qq, m15);
            if (five)
                w = _mm256_or_si256(w, _mm256_slli_epi16(_mm256_and_si256(_mm256_srl_epi16(hv, _mm_cvtsi32_si128(k)),
                                                                          one), 4));
            const __m256i scv = _mm256_set1_epi16((short)sc[k]);
            const int b = 8 * sb + k;
            for (int t = 0; t < nt; t++) {
                __m256i pr = _mm256_madd_epi16(_mm256_maddubs_epi16(w, ld(QX(t) + 32 * (size_t)b)), scv);
                acc[t] = fold(acc[t], d * DX(t)[b], pr);
            }
        }
        __m256 Mv = _mm256_mul_ps(_mm256_set1_ps(dmin),
                                  _mm256_cvtepi32_ps(_mm256_setr_epi32(m[0], m[1], m[2], m[3], m[4], m[5], m[6], m[7])));
        for (int t = 0; t < nt; t++) mn[t] = _mm256_fmadd_ps(Mv, _mm256_loadu_ps(SX(t) + 8 * sb), mn[t]);
    }
    for (int t = 0; t < nt; t++) y[(size_t)t * ys] = hsum(acc[t]) - hsum(mn[t]);
}

INL void q4_k_tile(const uint8_t *row, int cols, const uint8_t *xq, size_t st, float *y, size_t ys, const int nt) {
    k45_tile(row, cols, xq, st, y, ys, nt, 0);
}
INL void q5_k_tile(const uint8_t *row, int cols, const uint8_t *xq, size_t st, float *y, size_t ys, const int nt) {
    k45_tile(row, cols, xq, st, y, ys, nt, 1);
}

/* Q6_K: value = d * sc[16-group] * (q - 32), q 6 bits; the dot is
 * maddubs(q, x) - maddubs(32, x), then madd with the two 16-value scales. */
INL void q6_k_tile(const uint8_t *row, int cols, const uint8_t *xq, size_t st, float *y, size_t ys, const int nt) {
    const int nb = cols / 32;
    const __m256i m15 = _mm256_set1_epi8(15), m3 = _mm256_set1_epi8(3), k32 = _mm256_set1_epi8(32);
    __m256 acc[TILE];
    for (int t = 0; t < nt; t++) acc[t] = _mm256_setzero_ps();
    for (int sb = 0; sb < nb / 8; sb++) {
        const uint8_t *p = row + 210 * (size_t)sb;
        const float d = f16(p + 208);
        for (int half = 0; half < 2; half++) {
            const __m256i ql0 = ld(p + 64 * half), ql1 = ld(p + 64 * half + 32), hv = ld(p + 128 + 32 * half);
            const int8_t *sc = (const int8_t *)(p + 192 + 8 * half);
            for (int r = 0; r < 4; r++) {
                __m256i lq = (r & 1) ? ql1 : ql0;
                __m256i lo = _mm256_and_si256((r >> 1) ? _mm256_srli_epi16(lq, 4) : lq, m15);
                __m256i hb = _mm256_and_si256(_mm256_srl_epi16(hv, _mm_cvtsi32_si128(2 * r)), m3);
                __m256i w = _mm256_or_si256(lo, _mm256_slli_epi16(hb, 4));
                const __m256i scv = _mm256_set_m128i(_mm_set1_epi16(sc[2 * r + 1]), _mm_set1_epi16(sc[2 * r]));
                const int b = 8 * sb + 4 * half + r;
                for (int t = 0; t < nt; t++) {
                    __m256i x = ld(QX(t) + 32 * (size_t)b);
                    __m256i s16 = _mm256_sub_epi16(_mm256_maddubs_epi16(w, x), _mm256_maddubs_epi16(k32, x));
                    acc[t] = fold(acc[t], d * DX(t)[b], _mm256_madd_epi16(s16, scv));
                }
            }
        }
    }
    for (int t = 0; t < nt; t++) y[(size_t)t * ys] = hsum(acc[t]);
}

FE_Q8_SET(AVX2_Q8, avx2, TGT)

const fe_q8_kernels *fe_q8_kernels_avx2(void) { return &AVX2_Q8; }

#else

const fe_q8_kernels *fe_q8_kernels_avx2(void) { return 0; }

#endif
