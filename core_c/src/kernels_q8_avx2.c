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

/* The K-quants (kernels_q8.h): per super-block, integer lanes P (and the
 * minimums' or offset's lanes) summed over its 8 sub-blocks, then one or two
 * float multiply-adds per token. */
#define BS(t) ((const int16_t *)(DX(t) + nsb))

/* P[t] += the lanes of sub-blocks k and k + 1 (weights w0, w1 and their
 * int16 scales s0, s1) with every token of the tile. */
INL void k_pair(__m256i w0, __m256i w1, __m256i s0, __m256i s1, const uint8_t *xq, size_t st, size_t off,
                const int nt, __m256i *P) {
    for (int t = 0; t < nt; t++) {
        const uint8_t *x = QX(t) + off;
        __m256i a = _mm256_madd_epi16(_mm256_maddubs_epi16(w0, ld(x)), s0);
        __m256i b = _mm256_madd_epi16(_mm256_maddubs_epi16(w1, ld(x + 32)), s1);
        P[t] = _mm256_add_epi32(P[t], _mm256_add_epi32(a, b));
    }
}

/* Q4_K, and Q5_K (five = 1: the fifth bit of value 32k + l is bit k of qh[l]). */
INL void k45_tile(const uint8_t *row, int cols, const uint8_t *xq, size_t st, float *y, size_t ys, const int nt,
                  const int five) {
    const int nsb = cols / 256;
    const __m256i m15 = _mm256_set1_epi8(15);
    __m256 acc[TILE];
    for (int t = 0; t < nt; t++) acc[t] = _mm256_setzero_ps();
    for (int sb = 0; sb < nsb; sb++) {
        const uint8_t *p = row + (five ? 176 : 144) * (size_t)sb;
        const float d = f16_1(p), dmin = f16_1(p + 2);
        uint8_t sm[16];
        fe_q8_k4_scales(p + 4, sm);
        const __m128i smv = _mm_loadu_si128((const __m128i *)sm);
        const __m256i scv = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(smv)); /* sc 0-7 as int16, twice */
        /* m_k twice, as int16: madd with the 16 bsums gives m_k * (bs[2k] + bs[2k+1]) in lane k */
        const __m256i md = _mm256_cvtepu8_epi16(_mm_unpackhi_epi8(smv, smv));
        __m256i P[TILE];
        for (int t = 0; t < nt; t++) P[t] = _mm256_setzero_si256();
        const __m256i hb = five ? ld(p + 16) : _mm256_setzero_si256();
        for (int k = 0; k < 8; k += 2) {
            __m256i qq = ld(p + (five ? 48 : 16) + 16 * k);
            __m256i w0 = _mm256_and_si256(qq, m15), w1 = _mm256_and_si256(_mm256_srli_epi16(qq, 4), m15);
            if (five) {
                const __m256i b0 = _mm256_set1_epi8((char)(1 << k)), b1 = _mm256_set1_epi8((char)(2 << k));
                const __m256i sixteen = _mm256_set1_epi8(16);
                w0 = _mm256_or_si256(w0, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(hb, b0), b0), sixteen));
                w1 = _mm256_or_si256(w1, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(hb, b1), b1), sixteen));
            }
            /* scale k in every int16 lane: bytes 2k, 2k+1 of scv */
            const __m256i s0 = _mm256_shuffle_epi8(scv, _mm256_set1_epi16((short)(0x0100 + 0x0202 * k)));
            const __m256i s1 = _mm256_shuffle_epi8(scv, _mm256_set1_epi16((short)(0x0100 + 0x0202 * (k + 1))));
            k_pair(w0, w1, s0, s1, xq, st, 256 * (size_t)sb + 32 * (size_t)k, nt, P);
        }
        for (int t = 0; t < nt; t++) {
            const float dx = DX(t)[sb];
            __m256i M = _mm256_madd_epi16(md, ld(BS(t) + 16 * (size_t)sb));
            acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(d * dx), _mm256_cvtepi32_ps(P[t]), acc[t]);
            acc[t] = _mm256_fnmadd_ps(_mm256_set1_ps(dmin * dx), _mm256_cvtepi32_ps(M), acc[t]);
        }
    }
    for (int t = 0; t < nt; t++) y[(size_t)t * ys] = hsum8(acc[t]);
}

INL void q4_k_tile(const uint8_t *row, int cols, const uint8_t *xq, size_t st, float *y, size_t ys, const int nt) {
    k45_tile(row, cols, xq, st, y, ys, nt, 0);
}
INL void q5_k_tile(const uint8_t *row, int cols, const uint8_t *xq, size_t st, float *y, size_t ys, const int nt) {
    k45_tile(row, cols, xq, st, y, ys, nt, 1);
}

/* Q6_K: q = 4 low bits | 2 high bits << 4 (0..63), value d * sc[16-group] *
 * (q - 32); the integer lanes take q as it is, the 32 comes off through
 * the bsums. Half h of a super-block: ql[64], qh[32], sub-blocks r = 0..3
 * (ql[0..31] low nibbles, ql[32..63] low, ql[0..31] high, ql[32..63] high;
 * bits 2r, 2r+1 of qh). */
/* From s8 = 8 int16 scales in both 128-bit halves: scale 2r in every int16
 * lane of the low half (values 0-15 of sub-block r), 2r + 1 in the high. */
INL __m256i scale_pair(__m256i s8, const int r) {
    const short lo = (short)(0x0100 + 0x0202 * (2 * r)), hi = (short)(0x0100 + 0x0202 * (2 * r + 1));
    return _mm256_shuffle_epi8(s8, _mm256_setr_epi16(lo, lo, lo, lo, lo, lo, lo, lo, hi, hi, hi, hi, hi, hi, hi, hi));
}

INL void q6_k_tile(const uint8_t *row, int cols, const uint8_t *xq, size_t st, float *y, size_t ys, const int nt) {
    const int nsb = cols / 256;
    const __m256i m15 = _mm256_set1_epi8(15), m48 = _mm256_set1_epi8(48);
    __m256 acc[TILE];
    for (int t = 0; t < nt; t++) acc[t] = _mm256_setzero_ps();
    for (int sb = 0; sb < nsb; sb++) {
        const uint8_t *p = row + 210 * (size_t)sb;
        const int8_t *sc = (const int8_t *)(p + 192);
        const float d = f16_1(p + 208);
        __m256i P[TILE];
        for (int t = 0; t < nt; t++) P[t] = _mm256_setzero_si256();
        for (int h = 0; h < 2; h++) {
            const __m256i l0 = ld(p + 64 * h), l1 = ld(p + 64 * h + 32), qh = ld(p + 128 + 32 * h);
            const size_t off = 256 * (size_t)sb + 128 * (size_t)h;
            const __m256i s8 = _mm256_broadcastsi128_si256(_mm_cvtepi8_epi16(_mm_loadl_epi64((const __m128i *)(sc + 8 * h))));
            __m256i w0 = _mm256_or_si256(_mm256_and_si256(l0, m15), _mm256_and_si256(_mm256_slli_epi16(qh, 4), m48));
            __m256i w1 = _mm256_or_si256(_mm256_and_si256(l1, m15), _mm256_and_si256(_mm256_slli_epi16(qh, 2), m48));
            k_pair(w0, w1, scale_pair(s8, 0), scale_pair(s8, 1), xq, st, off, nt, P);
            __m256i w2 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m15), _mm256_and_si256(qh, m48));
            __m256i w3 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m15),
                                         _mm256_and_si256(_mm256_srli_epi16(qh, 2), m48));
            k_pair(w2, w3, scale_pair(s8, 2), scale_pair(s8, 3), xq, st, off + 64, nt, P);
        }
        /* the offset: 32 * (sc[2l] * bs[2l] + sc[2l+1] * bs[2l+1]) in lane l */
        const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)sc));
        for (int t = 0; t < nt; t++) {
            __m256i O = _mm256_madd_epi16(sc16, ld(BS(t) + 16 * (size_t)sb));
            __m256i Pt = _mm256_sub_epi32(P[t], _mm256_slli_epi32(O, 5));
            acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(d * DX(t)[sb]), _mm256_cvtepi32_ps(Pt), acc[t]);
        }
    }
    for (int t = 0; t < nt; t++) y[(size_t)t * ys] = hsum8(acc[t]);
}

/* The quantizer (kernels_q8.c's quantize_run, lane for lane): max_ps(a, m)
 * is a > m ? a : m, as the reference's comparison (a NaN skipped); the
 * product, the NaN test, rounding to nearest even and the clamp give the
 * reference's integers (a rounded value beyond +-127 clamps the same either
 * way round); the sums are exact. */
INL float qrun(const float *v, int len, int8_t *q, int *sums) {
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    __m256 m = _mm256_setzero_ps();
    for (int i = 0; i < len; i += 8) m = _mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(v + i), absmask), m);
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_movehdup_ps(h));
    const float amax = _mm_cvtss_f32(h);
    const __m256 idv = _mm256_set1_ps(amax > 0.0f ? 127.0f / amax : 0.0f);
    const __m256 lo = _mm256_set1_ps(-127.0f), hi = _mm256_set1_ps(127.0f);
    for (int i = 0; i < len; i += 32) {
        __m256i r[4];
        for (int j = 0; j < 4; j++) {
            __m256 f = _mm256_mul_ps(_mm256_loadu_ps(v + i + 8 * j), idv);
            f = _mm256_and_ps(f, _mm256_cmp_ps(f, f, _CMP_ORD_Q)); /* NaN -> 0 */
            f = _mm256_round_ps(f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
            r[j] = _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(f, lo), hi));
        }
        /* sums of values i..i+15 and i+16..i+31 */
        __m256i hh = _mm256_hadd_epi32(_mm256_add_epi32(r[0], r[1]), _mm256_add_epi32(r[2], r[3]));
        hh = _mm256_hadd_epi32(hh, hh);
        const __m128i s2 = _mm_add_epi32(_mm256_castsi256_si128(hh), _mm256_extracti128_si256(hh, 1));
        sums[i / 16] = _mm_cvtsi128_si32(s2);
        sums[i / 16 + 1] = _mm_extract_epi32(s2, 1);
        /* the packs work per 128-bit half: put the 4-byte groups back in order */
        __m256i p8 = _mm256_packs_epi16(_mm256_packs_epi32(r[0], r[1]), _mm256_packs_epi32(r[2], r[3]));
        p8 = _mm256_permutevar8x32_epi32(p8, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256((__m256i *)(q + i), p8);
    }
    return amax / 127.0f;
}

/* ------------------------------------------------------------------ q3_nl */

/* Bits 12c .. 12c + 11 of each lane's 96-bit index number (the indices of
 * its values 32c + 8j + l, j = 0..3) at the bottom of the lane. */
INL __m256i q3_fields12(__m256i w0, __m256i w1, __m256i w2, const int c) { return fe_q3_bits(w0, w1, w2, 12 * c, 12); }

/* The four 3-bit fields at bits 0, 3, 6, 9 of each lane into bytes 0..3 of
 * the lane (low 4 bits; bit 3 is the next field's, so the tables repeat
 * after 8 entries): 16-bit halves from bits 0 and 6, then byte 1 of each
 * half from the half shifted left by 5. */
INL __m256i q3_spread(__m256i t) {
    __m256i v = _mm256_blend_epi16(t, _mm256_slli_epi32(t, 10), 0xAA);
    __m256i u = _mm256_blendv_epi8(v, _mm256_slli_epi16(v, 5), _mm256_set1_epi32((int)0xFF00FF00u));
    return _mm256_and_si256(u, _mm256_set1_epi8(15));
}

/* Per 32-value chunk: the grid levels' magnitudes by vpshufb, their signs put
 * on the token's activations (vpsignb; no level is 0), maddubs + madd: lane l
 * = the reference's P[l] (pairs at most 2 * 123 * 127: no int16 saturation). */
INL void q3_nl_tile(const uint8_t *row, int cols, const uint8_t *xq, size_t st, float *y, size_t ys, const int nt) {
#define G8 -123, -74, -40, -12, 13, 40, 74, 123 /* FE_Q3_Q8_GRID */
    static const int8_t g16[16] = {G8, G8};
#undef G8
    const __m256i tl = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)g16));
    const __m256i ta = _mm256_abs_epi8(tl), ones = _mm256_set1_epi16(1);
    __m256 acc[TILE][2];
    for (int t = 0; t < nt; t++) acc[t][0] = acc[t][1] = _mm256_setzero_ps();
    for (int b = 0; b < cols / FE_Q3_BLOCK; b++) {
        const uint8_t *p = row + FE_Q3_BYTES * (size_t)b;
        const __m256i w0 = ld(p), w1 = ld(p + 32), w2 = ld(p + 64);
        float sg = 0.0f;
#define Q3_CHUNK(c)                                                                                           \
        do {                                                                                                  \
            if (((c) & 1) == 0) sg = fe_q3_q8_scale(p, (c) >> 1);                                             \
            const __m256i idx = q3_spread(q3_fields12(w0, w1, w2, (c)));                                      \
            const __m256i aw = _mm256_shuffle_epi8(ta, idx), sw = _mm256_shuffle_epi8(tl, idx);               \
            for (int t = 0; t < nt; t++) {                                                                    \
                const __m256i x = ld(QX(t) + FE_Q3_BLOCK * (size_t)b + 32 * (c));                             \
                const __m256i pr = _mm256_madd_epi16(_mm256_maddubs_epi16(aw, _mm256_sign_epi8(x, sw)), ones); \
                acc[t][(c) & 1] = fold(acc[t][(c) & 1], sg * DX(t)[8 * b + (c)], pr);                          \
            }                                                                                                 \
        } while (0)
        Q3_CHUNK(0); Q3_CHUNK(1); Q3_CHUNK(2); Q3_CHUNK(3);
        Q3_CHUNK(4); Q3_CHUNK(5); Q3_CHUNK(6); Q3_CHUNK(7);
#undef Q3_CHUNK
    }
    for (int t = 0; t < nt; t++) y[(size_t)t * ys] = done2(acc[t][0], acc[t][1]);
}

FE_Q8_QUANTIZER(quantize_avx2, TGT, qrun)

FE_Q8_SET(AVX2_Q8, avx2, TGT)

const fe_q8_kernels *fe_q8_kernels_avx2(void) { return &AVX2_Q8; }

#else

const fe_q8_kernels *fe_q8_kernels_avx2(void) { return 0; }

#endif
