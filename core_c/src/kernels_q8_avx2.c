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

#include "kernels_avx2_util.h"
#include <string.h>

#define INL static inline __attribute__((always_inline, target("avx2,fma,f16c")))
#define TGT __attribute__((target("avx2,fma,f16c")))
#define TILE 4 /* tokens sharing a decoded weight block (FE_Q8_DRIVER) */

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

/* Blocks alternate between two accumulator sets per token (even blocks: A,
 * odd: B), which halves the chain of dependent adds; the result adds the
 * two lane by lane first (kernels_q8.h). */
INL float done2(__m256 a, __m256 b) { return hsum8(_mm256_add_ps(a, b)); }

/* Q8_0 and Q4_0: signed weights, no minimum. Block b into acc. */
INL void signed_block(const uint8_t *row, int cols, const uint8_t *xq, size_t st, int b, const int nt,
                      const int four, __m256 *acc) {
    const uint8_t *p = row + (four ? 18 : 34) * (size_t)b;
    const float dw = f16_1(p);
    __m256i w = four ? _mm256_sub_epi8(nibbles(p + 2), _mm256_set1_epi8(8)) : ld(p + 2);
    __m256i aw = _mm256_sign_epi8(w, w);
    for (int t = 0; t < nt; t++) {
        __m256i x = ld(QX(t) + 32 * (size_t)b);
        __m256i pr = _mm256_madd_epi16(_mm256_maddubs_epi16(aw, _mm256_sign_epi8(x, w)), _mm256_set1_epi16(1));
        acc[t] = fold(acc[t], dw * DX(t)[b], pr);
    }
}

INL void signed_tile(const uint8_t *row, int cols, const uint8_t *xq, size_t st, float *y, size_t ys,
                     const int nt, const int four) {
    const int nb = cols / 32;
    __m256 A[TILE], B[TILE];
    for (int t = 0; t < nt; t++) A[t] = B[t] = _mm256_setzero_ps();
    int b = 0;
    for (; b + 2 <= nb; b += 2) {
        signed_block(row, cols, xq, st, b, nt, four, A);
        signed_block(row, cols, xq, st, b + 1, nt, four, B);
    }
    if (b < nb) signed_block(row, cols, xq, st, b, nt, four, A);
    for (int t = 0; t < nt; t++) y[(size_t)t * ys] = done2(A[t], B[t]);
}

INL void q8_0_tile(const uint8_t *row, int cols, const uint8_t *xq, size_t st, float *y, size_t ys, const int nt) {
    signed_tile(row, cols, xq, st, y, ys, nt, 0);
}
INL void q4_0_tile(const uint8_t *row, int cols, const uint8_t *xq, size_t st, float *y, size_t ys, const int nt) {
    signed_tile(row, cols, xq, st, y, ys, nt, 1);
}

/* Q4_1: unsigned nibbles; the minimum's sums m (one float per token and set). */
INL void q4_1_block(const uint8_t *row, int cols, const uint8_t *xq, size_t st, int b, const int nt, __m256 *acc,
                    float *m) {
    const int nb = cols / 32;
    const uint8_t *p = row + 20 * (size_t)b;
    const float dw = f16_1(p), mw = f16_1(p + 2);
    __m256i w = nibbles(p + 4);
    for (int t = 0; t < nt; t++) {
        __m256i pr = _mm256_madd_epi16(_mm256_maddubs_epi16(w, ld(QX(t) + 32 * (size_t)b)), _mm256_set1_epi16(1));
        acc[t] = fold(acc[t], dw * DX(t)[b], pr);
        m[t] = _mm_cvtss_f32(_mm_fmadd_ss(_mm_set_ss(mw), _mm_set_ss(SX(t)[b]), _mm_set_ss(m[t])));
    }
}

INL void q4_1_tile(const uint8_t *row, int cols, const uint8_t *xq, size_t st, float *y, size_t ys, const int nt) {
    const int nb = cols / 32;
    __m256 A[TILE], B[TILE];
    float mA[TILE], mB[TILE];
    for (int t = 0; t < nt; t++) A[t] = B[t] = _mm256_setzero_ps(), mA[t] = mB[t] = 0.0f;
    int b = 0;
    for (; b + 2 <= nb; b += 2) {
        q4_1_block(row, cols, xq, st, b, nt, A, mA);
        q4_1_block(row, cols, xq, st, b + 1, nt, B, mB);
    }
    if (b < nb) q4_1_block(row, cols, xq, st, b, nt, A, mA);
    for (int t = 0; t < nt; t++) y[(size_t)t * ys] = done2(A[t], B[t]) + (mA[t] + mB[t]);
}

/* Q4_K, and Q5_K (five = 1: the fifth bit of value 32k + l is bit k of qh[l]):
 * sub-block k of super-block sb into acc. */
INL void k45_block(const uint8_t *p, const int *sc, int cols, const uint8_t *xq, size_t st, int sb, int k, float d,
                   const int nt, const int five, __m256 *acc) {
    const __m256i m15 = _mm256_set1_epi8(15);
    __m256i qq = ld(p + (five ? 48 : 16) + 32 * (k >> 1));
    __m256i w = _mm256_and_si256((k & 1) ? _mm256_srli_epi16(qq, 4) : qq, m15);
    if (five)
        w = _mm256_or_si256(w, _mm256_slli_epi16(_mm256_and_si256(_mm256_srl_epi16(ld(p + 16), _mm_cvtsi32_si128(k)),
                                                                  _mm256_set1_epi8(1)), 4));
    const __m256i scv = _mm256_set1_epi16((short)sc[k]);
    const int b = 8 * sb + k;
    for (int t = 0; t < nt; t++) {
        __m256i pr = _mm256_madd_epi16(_mm256_maddubs_epi16(w, ld(QX(t) + 32 * (size_t)b)), scv);
        acc[t] = fold(acc[t], d * DX(t)[b], pr);
    }
}

INL void k45_tile(const uint8_t *row, int cols, const uint8_t *xq, size_t st, float *y, size_t ys, const int nt,
                  const int five) {
    const int nb = cols / 32;
    __m256 A[TILE], B[TILE], mn[TILE];
    for (int t = 0; t < nt; t++) A[t] = B[t] = mn[t] = _mm256_setzero_ps();
    for (int sb = 0; sb < nb / 8; sb++) {
        const uint8_t *p = row + (five ? 176 : 144) * (size_t)sb;
        const float d = f16_1(p), dmin = f16_1(p + 2);
        int sc[8], m[8];
        for (int k = 0; k < 8; k++) fe_q4k_scale_min(k, p + 4, &sc[k], &m[k]);
        for (int k = 0; k < 8; k += 2) {
            k45_block(p, sc, cols, xq, st, sb, k, d, nt, five, A);
            k45_block(p, sc, cols, xq, st, sb, k + 1, d, nt, five, B);
        }
        __m256 Mv = _mm256_mul_ps(_mm256_set1_ps(dmin),
                                  _mm256_cvtepi32_ps(_mm256_setr_epi32(m[0], m[1], m[2], m[3], m[4], m[5], m[6], m[7])));
        for (int t = 0; t < nt; t++) mn[t] = _mm256_fmadd_ps(Mv, _mm256_loadu_ps(SX(t) + 8 * sb), mn[t]);
    }
    for (int t = 0; t < nt; t++) y[(size_t)t * ys] = done2(A[t], B[t]) - hsum8(mn[t]);
}

INL void q4_k_tile(const uint8_t *row, int cols, const uint8_t *xq, size_t st, float *y, size_t ys, const int nt) {
    k45_tile(row, cols, xq, st, y, ys, nt, 0);
}
INL void q5_k_tile(const uint8_t *row, int cols, const uint8_t *xq, size_t st, float *y, size_t ys, const int nt) {
    k45_tile(row, cols, xq, st, y, ys, nt, 1);
}

/* Q6_K: value = d * sc[16-group] * (q - 32), q 6 bits; the dot is
 * maddubs(q, x) - maddubs(32, x), then madd with the two 16-value scales.
 * Run r (0..3) of half `half` of super-block sb into acc. */
INL void q6_block(const uint8_t *p, int cols, const uint8_t *xq, size_t st, int sb, int half, int r, float d,
                  const int nt, __m256 *acc) {
    const __m256i lq = ld(p + 64 * half + 32 * (r & 1)), hv = ld(p + 128 + 32 * half);
    const int8_t *sc = (const int8_t *)(p + 192 + 8 * half);
    __m256i lo = _mm256_and_si256((r >> 1) ? _mm256_srli_epi16(lq, 4) : lq, _mm256_set1_epi8(15));
    __m256i hb = _mm256_and_si256(_mm256_srl_epi16(hv, _mm_cvtsi32_si128(2 * r)), _mm256_set1_epi8(3));
    __m256i w = _mm256_or_si256(lo, _mm256_slli_epi16(hb, 4));
    const __m256i scv = _mm256_set_m128i(_mm_set1_epi16(sc[2 * r + 1]), _mm_set1_epi16(sc[2 * r]));
    const int b = 8 * sb + 4 * half + r;
    for (int t = 0; t < nt; t++) {
        __m256i x = ld(QX(t) + 32 * (size_t)b);
        __m256i s16 = _mm256_sub_epi16(_mm256_maddubs_epi16(w, x), _mm256_maddubs_epi16(_mm256_set1_epi8(32), x));
        acc[t] = fold(acc[t], d * DX(t)[b], _mm256_madd_epi16(s16, scv));
    }
}

INL void q6_k_tile(const uint8_t *row, int cols, const uint8_t *xq, size_t st, float *y, size_t ys, const int nt) {
    const int nb = cols / 32;
    __m256 A[TILE], B[TILE];
    for (int t = 0; t < nt; t++) A[t] = B[t] = _mm256_setzero_ps();
    for (int sb = 0; sb < nb / 8; sb++) {
        const uint8_t *p = row + 210 * (size_t)sb;
        const float d = f16_1(p + 208);
        for (int half = 0; half < 2; half++)
            for (int r = 0; r < 4; r += 2) {
                q6_block(p, cols, xq, st, sb, half, r, d, nt, A);
                q6_block(p, cols, xq, st, sb, half, r + 1, d, nt, B);
            }
    }
    for (int t = 0; t < nt; t++) y[(size_t)t * ys] = done2(A[t], B[t]);
}

FE_Q8_SET(AVX2_Q8, avx2, TGT)

const fe_q8_kernels *fe_q8_kernels_avx2(void) { return &AVX2_Q8; }

#else

const fe_q8_kernels *fe_q8_kernels_avx2(void) { return 0; }

#endif
