/* quant2.c — the q2_vq quantizer (formats.h, docs/QUANTIZATION.md "Two-bit
 * experts"): ferry_q2_quantize_f32 of ferry_kernels.h.
 *
 * Per 8 values: the signs (when an odd number are negative, the value whose
 * sign costs least, h_i x_i^2 smallest, gives its sign up: the format stores
 * even parity) and the magnitudes a_i. The codeword c minimising the
 * weighted error sum h_i (a_i - s c_i)^2 at a scale s is the one minimising
 * s N_c - 2 D_c (D_c = sum h_i a_i c_i, N_c = sum h_i c_i^2).
 *
 * Shortlist (the speed): the search for each 8-vector runs over Q2_LIST
 * codewords, not all 512. At a reference scale (Q2_REF times the sub-block's
 * max(a) / max(codebook)) the best of Q2_SEEDS seed codewords (picked by
 * farthest-point sampling of the codebook) is found, then the best of its
 * Q2_LIST nearest codewords; that codeword's Q2_LIST nearest codewords are
 * the vector's shortlist. The neighbour lists are made once per call from
 * the frozen codebook (distance, then index: deterministic). Every scale
 * below is searched on the shortlist only (D_c and N_c made once).
 *
 * Per sub-block of 16 values a scale s is searched: for Q2_TRIALS trial
 * scales s = max(a) / max(codebook) * f, f = 0.5, 0.6, .., 1.2, each
 * 8-vector takes its best shortlisted codeword, then the least-squares scale
 * of those codewords; the trial with the least error wins. The block's
 * exponent code e is the smallest whose scale reaches the largest sub-block
 * scale, each sub-block's 4-bit code j the nearest on the log grid or up to
 * Q2_STEPS steps either side, whichever gives the least error with its
 * codewords picked again at the stored scale. h = 1, or the caller's
 * per-column importance.
 *
 * Speed: the block search (quant2_search.h) is compiled once per instruction
 * set (portable; AVX2 and AVX-512 on x86-64, picked at run time; NEON on
 * aarch64) with that set's products and scans inlined; a block's 32
 * shortlists are made pass by pass (all seeds, then all neighbour steps), so
 * the vectors' independent scans overlap. Every set does the same float
 * operations in the same order as the portable one and a scan's result is
 * defined (the first least value), so every path writes the same bytes
 * (core_c/tests/test_kernels.c, natively and under qemu-aarch64), and
 * blocks are independent, so any split of the rows between threads writes
 * the same bytes too. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../include/ferry_kernels.h"
#include "formats.h"
#include "kernels.h"

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define Q2_X86 1
#elif defined(__aarch64__) && defined(__ARM_NEON)
#include <arm_neon.h>
#define Q2_NEON 1
#endif

/* The search's sizes (docs/QUANTIZATION.md "Quantizer": the trade
 * between them measured); lists are multiples of 16 (the AVX-512 lanes). */
#ifndef Q2_LIST
#define Q2_LIST 64
#endif
#ifndef Q2_SEEDS
#define Q2_SEEDS 64
#endif
#ifndef Q2_TRIALS
#define Q2_TRIALS 8
#endif
#ifndef Q2_STEPS
#define Q2_STEPS 2
#endif
#ifndef Q2_F0
#define Q2_F0 0.5f
#endif
#ifndef Q2_FSTEP
#define Q2_FSTEP 0.1f
#endif
#if Q2_LIST % 16 || Q2_SEEDS % 16 || Q2_LIST > FE_Q2_CODES || Q2_SEEDS > FE_Q2_CODES
#error "q2 lists: multiples of 16, at most the codebook"
#endif
#define Q2_REF 0.9f

struct ferry_q2_quantizer {
    float seed_t[8][Q2_SEEDS];            /* the seeds' values transposed: seed_t[i][m] = value i of seed m */
    float seed_n[Q2_SEEDS];               /* their N_c with h = 1 */
    short seed_id[Q2_SEEDS];              /* their codeword indices */
    float nb_t[FE_Q2_CODES][8][Q2_LIST];  /* codeword c's neighbours' values transposed */
    float nb_n[FE_Q2_CODES][Q2_LIST];     /* their N with h = 1 */
    short nb_id[FE_Q2_CODES][Q2_LIST];    /* their indices, nearest first (c itself) */
    float cmax;                           /* the largest codebook value */
};
typedef struct ferry_q2_quantizer q2_lists;

/* The search's primitives, one set per instruction set (portable, AVX2,
 * AVX-512, NEON), inlined into that set's copy of the block search
 * (quant2_search.h, included once per set below):
 *
 * q2_prod_*: D = sum_i ha_i t_ic (sums over i in order, no fused
 * multiply-adds), D2 = 2 D (exact) and N = sum_i h_i t_ic^2 of one 8-vector
 * (ha = h * a) for the `count` codewords of a transposed list t (row stride
 * `stride`); returns N, or the list's norms n0 when h is NULL (h = 1).
 *
 * q2_argmin_*: the first position minimising s N_c - D2_c (= s N_c - 2 D_c:
 * the doubling is exact). The SIMD forms take the least value, then the
 * first position holding it; the portable form scans in order. Every form
 * computes each value the same way, so they agree wherever no value is
 * infinite or NaN, which q2_safe below guarantees (blocks it refuses take
 * the portable search on every path). */
#define Q2_INLINE static inline __attribute__((always_inline))

Q2_INLINE const float *q2_prod_c(const float *t, int stride, int count, const float *n0, const float ha[8],
                                 const float *h, float *D, float *D2, float *N) {
    for (int c = 0; c < count; c++) D[c] = 0.0f;
    for (int i = 0; i < 8; i++)
        for (int c = 0; c < count; c++) D[c] += ha[i] * t[i * stride + c];
    for (int c = 0; c < count; c++) D2[c] = 2.0f * D[c];
    if (!h) return n0;
    for (int c = 0; c < count; c++) N[c] = 0.0f;
    for (int i = 0; i < 8; i++)
        for (int c = 0; c < count; c++) N[c] += h[i] * (t[i * stride + c] * t[i * stride + c]);
    return N;
}

/* q2_signs_*: a block's magnitudes aa = |x|, importances hh (1 without
 * h), products ha = h |x|, and per 8 values the sign bits with even parity
 * (when an odd number are negative, the value with the least h x^2, the
 * first of equals, gives its sign up). */
Q2_INLINE void q2_signs_c(const float *x, const float *h, float *aa, float *hh, float *ha, int *sgn) {
    for (int k = 0; k < 32; k++) {
        int bits = 0, cheapest = 0;
        float cost = INFINITY;
        for (int i = 0; i < 8; i++) {
            const float v = x[8 * k + i], w = h ? h[8 * k + i] : 1.0f;
            aa[8 * k + i] = fabsf(v), hh[8 * k + i] = w, ha[8 * k + i] = w * fabsf(v);
            if (v < 0.0f) bits |= 1 << i;
            if (w * v * v < cost) cost = w * v * v, cheapest = i;
        }
        if (__builtin_popcount((unsigned)bits) & 1) bits ^= 1 << cheapest;
        sgn[k] = bits;
    }
}

Q2_INLINE int q2_argmin_c(const float *D2, const float *N, int count, float s) {
    int bi = 0;
    float be = s * N[0] - D2[0];
    for (int c = 1; c < count; c++) {
        const float e = s * N[c] - D2[c];
        if (e < be) be = e, bi = c;
    }
    return bi;
}

#ifdef Q2_X86
#define Q2_AVX2_INL Q2_INLINE __attribute__((target("avx2")))
Q2_AVX2_INL const float *q2_prod_avx2(const float *t, int stride, int count, const float *n0, const float ha[8],
                                      const float *h, float *D, float *D2, float *N) {
    for (int c = 0; c < count; c += 8) {
        __m256 d = _mm256_setzero_ps();
        for (int i = 0; i < 8; i++)
            d = _mm256_add_ps(d, _mm256_mul_ps(_mm256_set1_ps(ha[i]), _mm256_loadu_ps(t + i * stride + c)));
        _mm256_storeu_ps(D + c, d);
        _mm256_storeu_ps(D2 + c, _mm256_mul_ps(_mm256_set1_ps(2.0f), d));
        if (h) {
            __m256 n = _mm256_setzero_ps();
            for (int i = 0; i < 8; i++) {
                const __m256 v = _mm256_loadu_ps(t + i * stride + c);
                n = _mm256_add_ps(n, _mm256_mul_ps(_mm256_set1_ps(h[i]), _mm256_mul_ps(v, v)));
            }
            _mm256_storeu_ps(N + c, n);
        }
    }
    return h ? N : n0;
}

/* The least value over all lanes, then a 64-bit mask of the positions
 * holding it per group of 64 (count is a multiple of 16). */
Q2_AVX2_INL int q2_argmin_avx2(const float *D2, const float *N, int count, float s) {
    const __m256 sv = _mm256_set1_ps(s);
#define Q2_E8(c) _mm256_sub_ps(_mm256_mul_ps(sv, _mm256_loadu_ps(N + (c))), _mm256_loadu_ps(D2 + (c)))
    __m256 m = Q2_E8(0);
    for (int c = 8; c < count; c += 8) m = _mm256_min_ps(m, Q2_E8(c));
    m = _mm256_min_ps(m, _mm256_permute2f128_ps(m, m, 1));
    m = _mm256_min_ps(m, _mm256_shuffle_ps(m, m, _MM_SHUFFLE(1, 0, 3, 2)));
    m = _mm256_min_ps(m, _mm256_shuffle_ps(m, m, _MM_SHUFFLE(2, 3, 0, 1)));
    for (int g = 0; g < count; g += 64) {
        uint64_t mask = 0;
        for (int c = g; c < g + 64 && c < count; c += 8)
            mask |= (uint64_t)(unsigned)_mm256_movemask_ps(_mm256_cmp_ps(Q2_E8(c), m, _CMP_EQ_OQ)) << (c - g);
        if (mask) return g + __builtin_ctzll(mask);
    }
#undef Q2_E8
    return 0;
}

#define Q2_AVX512_INL Q2_INLINE __attribute__((target("avx512f,avx512bw")))
Q2_AVX512_INL const float *q2_prod_avx512(const float *t, int stride, int count, const float *n0, const float ha[8],
                                          const float *h, float *D, float *D2, float *N) {
    for (int c = 0; c < count; c += 16) {
        __m512 d = _mm512_setzero_ps();
        for (int i = 0; i < 8; i++)
            d = _mm512_add_ps(d, _mm512_mul_ps(_mm512_set1_ps(ha[i]), _mm512_loadu_ps(t + i * stride + c)));
        _mm512_storeu_ps(D + c, d);
        _mm512_storeu_ps(D2 + c, _mm512_mul_ps(_mm512_set1_ps(2.0f), d));
        if (h) {
            __m512 n = _mm512_setzero_ps();
            for (int i = 0; i < 8; i++) {
                const __m512 v = _mm512_loadu_ps(t + i * stride + c);
                n = _mm512_add_ps(n, _mm512_mul_ps(_mm512_set1_ps(h[i]), _mm512_mul_ps(v, v)));
            }
            _mm512_storeu_ps(N + c, n);
        }
    }
    return h ? N : n0;
}

/* Two 8-vectors per register: the least h x^2 of each half left in its
 * lanes by in-register swaps, then its first position from a compare mask
 * (q2_safe blocks only: every cost is finite). */
Q2_AVX512_INL void q2_signs_avx512(const float *x, const float *h, float *aa, float *hh, float *ha, int *sgn) {
    for (int k = 0; k < 32; k += 2) {
        const __m512 v = _mm512_loadu_ps(x + 8 * k), w = h ? _mm512_loadu_ps(h + 8 * k) : _mm512_set1_ps(1.0f);
        const __m512 a = _mm512_abs_ps(v), cost = _mm512_mul_ps(_mm512_mul_ps(w, v), v);
        _mm512_storeu_ps(aa + 8 * k, a), _mm512_storeu_ps(hh + 8 * k, w), _mm512_storeu_ps(ha + 8 * k, _mm512_mul_ps(w, a));
        __m512 m = _mm512_min_ps(cost, _mm512_shuffle_f32x4(cost, cost, _MM_SHUFFLE(2, 3, 0, 1)));
        m = _mm512_min_ps(m, _mm512_permute_ps(m, _MM_SHUFFLE(1, 0, 3, 2)));
        m = _mm512_min_ps(m, _mm512_permute_ps(m, _MM_SHUFFLE(2, 3, 0, 1)));
        const unsigned neg = _mm512_cmp_ps_mask(v, _mm512_setzero_ps(), _CMP_LT_OQ);
        const unsigned eq = _mm512_cmp_ps_mask(cost, m, _CMP_EQ_OQ);
        for (int q = 0; q < 2; q++) {
            int bits = (int)(neg >> (8 * q)) & 0xFF;
            const unsigned e = (eq >> (8 * q)) & 0xFFu;
            if (__builtin_popcount((unsigned)bits) & 1) bits ^= 1 << (e ? __builtin_ctz(e) : 0);
            sgn[k + q] = bits;
        }
    }
}

Q2_AVX512_INL int q2_argmin_avx512(const float *D2, const float *N, int count, float s) {
    const __m512 sv = _mm512_set1_ps(s);
#define Q2_E16(c) _mm512_sub_ps(_mm512_mul_ps(sv, _mm512_loadu_ps(N + (c))), _mm512_loadu_ps(D2 + (c)))
    if (count == 64) { /* the lists' size: the least value left in every lane, four masks unpacked into one */
        const __m512 e0 = Q2_E16(0), e1 = Q2_E16(16), e2 = Q2_E16(32), e3 = Q2_E16(48);
        __m512 m = _mm512_min_ps(_mm512_min_ps(e0, e1), _mm512_min_ps(e2, e3));
        m = _mm512_min_ps(m, _mm512_shuffle_f32x4(m, m, _MM_SHUFFLE(1, 0, 3, 2)));
        m = _mm512_min_ps(m, _mm512_shuffle_f32x4(m, m, _MM_SHUFFLE(2, 3, 0, 1)));
        m = _mm512_min_ps(m, _mm512_permute_ps(m, _MM_SHUFFLE(1, 0, 3, 2)));
        m = _mm512_min_ps(m, _mm512_permute_ps(m, _MM_SHUFFLE(2, 3, 0, 1)));
        const __mmask32 lo = _mm512_kunpackw(_mm512_cmp_ps_mask(e1, m, _CMP_EQ_OQ), _mm512_cmp_ps_mask(e0, m, _CMP_EQ_OQ));
        const __mmask32 hi = _mm512_kunpackw(_mm512_cmp_ps_mask(e3, m, _CMP_EQ_OQ), _mm512_cmp_ps_mask(e2, m, _CMP_EQ_OQ));
        const uint64_t mask = (uint64_t)_mm512_kunpackd(hi, lo);
        return mask ? __builtin_ctzll(mask) : 0;
    }
    __m512 m = Q2_E16(0);
    for (int c = 16; c < count; c += 16) m = _mm512_min_ps(m, Q2_E16(c));
    m = _mm512_set1_ps(_mm512_reduce_min_ps(m));
    for (int g = 0; g < count; g += 64) {
        uint64_t mask = 0;
        for (int c = g; c < g + 64 && c < count; c += 16)
            mask |= (uint64_t)_mm512_cmp_ps_mask(Q2_E16(c), m, _CMP_EQ_OQ) << (c - g);
        if (mask) return g + __builtin_ctzll(mask);
    }
#undef Q2_E16
    return 0;
}
#endif

#ifdef Q2_NEON
Q2_INLINE const float *q2_prod_neon(const float *t, int stride, int count, const float *n0, const float ha[8],
                                    const float *h, float *D, float *D2, float *N) {
    for (int c = 0; c < count; c += 4) {
        float32x4_t d = vdupq_n_f32(0.0f);
        for (int i = 0; i < 8; i++) d = vaddq_f32(d, vmulq_f32(vdupq_n_f32(ha[i]), vld1q_f32(t + i * stride + c)));
        vst1q_f32(D + c, d);
        vst1q_f32(D2 + c, vmulq_f32(vdupq_n_f32(2.0f), d));
        if (h) {
            float32x4_t n = vdupq_n_f32(0.0f);
            for (int i = 0; i < 8; i++) {
                const float32x4_t v = vld1q_f32(t + i * stride + c);
                n = vaddq_f32(n, vmulq_f32(vdupq_n_f32(h[i]), vmulq_f32(v, v)));
            }
            vst1q_f32(N + c, n);
        }
    }
    return h ? N : n0;
}

/* The least value (vminvq), then the least position holding it. */
Q2_INLINE int q2_argmin_neon(const float *D2, const float *N, int count, float s) {
    const float32x4_t sv = vdupq_n_f32(s);
#define Q2_E4(c) vsubq_f32(vmulq_f32(sv, vld1q_f32(N + (c))), vld1q_f32(D2 + (c)))
    float32x4_t m = Q2_E4(0);
    for (int c = 4; c < count; c += 4) m = vminq_f32(m, Q2_E4(c));
    const float32x4_t mv = vdupq_n_f32(vminvq_f32(m));
    static const uint32_t first[4] = {0, 1, 2, 3};
    const uint32x4_t none = vdupq_n_u32((uint32_t)count), four = vdupq_n_u32(4);
    uint32x4_t idx = vld1q_u32(first), best = none;
    for (int c = 0; c < count; c += 4, idx = vaddq_u32(idx, four))
        best = vminq_u32(best, vbslq_u32(vceqq_f32(Q2_E4(c), mv), idx, none));
#undef Q2_E4
    const uint32_t p = vminvq_u32(best);
    return p < (uint32_t)count ? (int)p : 0;
}

#endif

/* Whether no value of a block's search can overflow (|x| and h below 2^40:
 * then every product, sum and scale is far inside float's range), so the
 * SIMD searches give the portable one's result. */
static int q2_safe(const float *x, const float *h) {
    const float lim = 1099511627776.0f; /* 2^40 */
    int ok = 1;
    for (int i = 0; i < FE_Q2_BLOCK; i++) ok &= fabsf(x[i]) < lim && (!h || h[i] < lim);
    return ok;
}

/* The work space of one q2_quantize call: per 8-vector of a block, its
 * shortlist's D, 2D and N. */
typedef struct {
    float D[32][Q2_LIST], D2[32][Q2_LIST], N[32][Q2_LIST];
} q2_work;

#define q2_signs_avx2 q2_signs_c /* the portable form */
#define q2_signs_neon q2_signs_c
#define Q2_ISA c
#define Q2_TARGET
#include "quant2_search.h"
#ifdef Q2_X86
#define Q2_ISA avx2
#define Q2_TARGET __attribute__((target("avx2")))
#include "quant2_search.h"
#define Q2_ISA avx512
#define Q2_TARGET __attribute__((target("avx512f,avx512bw")))
#include "quant2_search.h"
#elif defined(Q2_NEON)
#define Q2_ISA neon
#define Q2_TARGET
#include "quant2_search.h"
#endif

/* One block with the search `simd` picks (q2_scans); blocks q2_safe refuses
 * take the portable one. */
static void q2_block(const q2_lists *L, int simd, const float *x, const float *h, q2_work *W, uint8_t *out) {
#ifdef Q2_X86
    if (simd && q2_safe(x, h)) {
        if (simd == 2) q2_block_avx512(L, x, h, W, out);
        else q2_block_avx2(L, x, h, W, out);
        return;
    }
#elif defined(Q2_NEON)
    if (simd && q2_safe(x, h)) {
        q2_block_neon(L, x, h, W, out);
        return;
    }
#endif
    (void)simd;
    q2_block_c(L, x, h, W, out);
}

/* The codebook's neighbour lists and seeds (the same on every platform:
 * plain float sums in a fixed order, ties to the lower index). */
static void q2_lists_init(q2_lists *T, float *dist) {
    const float *cb = fe_q2_codebook;
    T->cmax = 0.0f;
    for (int c = 0; c < 8 * FE_Q2_CODES; c++) T->cmax = cb[c] > T->cmax ? cb[c] : T->cmax;
    float norm[FE_Q2_CODES];
    for (int c = 0; c < FE_Q2_CODES; c++) {
        norm[c] = 0.0f;
        for (int i = 0; i < 8; i++) norm[c] += 1.0f * (cb[8 * c + i] * cb[8 * c + i]);
    }
    float ct[8][FE_Q2_CODES]; /* the codebook transposed */
    for (int c = 0; c < FE_Q2_CODES; c++)
        for (int i = 0; i < 8; i++) ct[i][c] = cb[8 * c + i];
    for (int a = 0; a < FE_Q2_CODES; a++) {
        float *d = dist + FE_Q2_CODES * a;
        for (int b = 0; b < FE_Q2_CODES; b++) d[b] = 0.0f;
        for (int i = 0; i < 8; i++)
            for (int b = 0; b < FE_Q2_CODES; b++) d[b] += (ct[i][b] - ct[i][a]) * (ct[i][b] - ct[i][a]);
    }
    for (int a = 0; a < FE_Q2_CODES; a++) {
        /* the Q2_LIST nearest by (distance, index): keys distance bits (a
         * non-negative float's bits order as it does) then index, all
         * distinct; a quickselect, then the first Q2_LIST sorted */
        const float *row = dist + FE_Q2_CODES * a;
        uint64_t key[FE_Q2_CODES];
        for (int b = 0; b < FE_Q2_CODES; b++) {
            uint32_t bits;
            memcpy(&bits, &row[b], sizeof bits);
            key[b] = (uint64_t)bits << 32 | (uint64_t)b;
        }
        int lo = 0, hi = FE_Q2_CODES - 1;
        while (lo < hi) { /* Hoare partition around the middle key until the Q2_LIST-th smallest is in place */
            const uint64_t pivot = key[lo + (hi - lo) / 2];
            int i = lo, j = hi;
            while (i <= j) {
                while (key[i] < pivot) i++;
                while (key[j] > pivot) j--;
                if (i <= j) {
                    const uint64_t t = key[i];
                    key[i] = key[j], key[j] = t, i++, j--;
                }
            }
            if (Q2_LIST - 1 <= j) hi = j;
            else if (Q2_LIST - 1 >= i) lo = i;
            else break;
        }
        for (int m = 1; m < Q2_LIST; m++) {
            const uint64_t k = key[m];
            int p = m;
            while (p > 0 && key[p - 1] > k) key[p] = key[p - 1], p--;
            key[p] = k;
        }
        short *id = T->nb_id[a];
        for (int m = 0; m < Q2_LIST; m++) id[m] = (short)(key[m] & 0xFFFFu);
        for (int m = 0; m < Q2_LIST; m++) {
            T->nb_n[a][m] = norm[id[m]];
            for (int i = 0; i < 8; i++) T->nb_t[a][i][m] = cb[8 * id[m] + i];
        }
    }
    /* seeds: farthest-point sampling from codeword 0 (the smallest norm) */
    float far[FE_Q2_CODES];
    for (int b = 0; b < FE_Q2_CODES; b++) far[b] = dist[b];
    T->seed_id[0] = 0;
    for (int m = 1; m < Q2_SEEDS; m++) {
        int f = 0;
        for (int b = 1; b < FE_Q2_CODES; b++)
            if (far[b] > far[f]) f = b;
        T->seed_id[m] = (short)f;
        for (int b = 0; b < FE_Q2_CODES; b++) far[b] = dist[FE_Q2_CODES * f + b] < far[b] ? dist[FE_Q2_CODES * f + b] : far[b];
    }
    for (int m = 0; m < Q2_SEEDS; m++) {
        T->seed_n[m] = norm[T->seed_id[m]];
        for (int i = 0; i < 8; i++) T->seed_t[i][m] = cb[8 * T->seed_id[m] + i];
    }
}

ferry_q2_quantizer *ferry_q2_quantizer_new(void) {
    q2_lists *L = malloc(sizeof *L);
    float *dist = malloc(sizeof(float) * FE_Q2_CODES * FE_Q2_CODES);
    if (L && dist) q2_lists_init(L, dist);
    else free(L), L = NULL;
    free(dist);
    return L;
}

void ferry_q2_quantizer_free(ferry_q2_quantizer *q) { free(q); }

/* The scans an implementation runs: 0 portable, 1 AVX2 (x86-64) or NEON
 * (aarch64), 2 AVX-512; -1 when this CPU cannot run it. */
static int q2_scans(int impl) {
    if (impl == FE_KERNELS_SCALAR) return 0;
    if (impl == FE_KERNELS_AVX2 && !fe_cpu_has_avx2()) return -1;
    if (!fe_kernels_get(impl)) return -1;
#ifdef Q2_X86
    /* AVX2's set runs the AVX-512 scans where the CPU has them (as its q2_vq kernels do) */
    return impl != FE_KERNELS_AVX2 ? 0 : fe_simd_variant(impl) == FE_SIMD_AVX512 ? 2 : 1;
#elif defined(Q2_NEON)
    return impl == FE_KERNELS_NEON;
#else
    return 0;
#endif
}

static int q2_quantize(const q2_lists *L, int scans, const float *src, int rows, int cols, const float *importance,
                       void *dst) {
    if (!L || scans < 0 || !src || !dst || rows < 0 || cols <= 0 || cols % FE_Q2_BLOCK) return -1;
    const size_t n = (size_t)rows * (size_t)cols;
    for (size_t i = 0; i < n; i++)
        if (!isfinite(src[i])) return -1;
    if (importance)
        for (int i = 0; i < cols; i++)
            if (!(importance[i] >= 0.0f) || !isfinite(importance[i])) return -1;
    q2_work *W = malloc(sizeof *W);
    if (!W) return -1;
    uint8_t *out = dst;
    for (int r = 0; r < rows; r++)
        for (int b = 0; b < cols / FE_Q2_BLOCK; b++, out += FE_Q2_BYTES)
            q2_block(L, scans, src + (size_t)r * (size_t)cols + (size_t)FE_Q2_BLOCK * (size_t)b,
                     importance ? importance + FE_Q2_BLOCK * b : NULL, W, out);
    free(W);
    return 0;
}

int fe_q2_quantize_scans(int scans, const float *src, int rows, int cols, const float *importance, void *dst) {
    if (scans < 0 || scans > 2 || (scans > 0 && q2_scans(fe_kernels_best()) < scans)) return -1;
    if (!src || !dst || rows < 0 || cols <= 0 || cols % FE_Q2_BLOCK) return -1; /* before making the tables */
    ferry_q2_quantizer *L = ferry_q2_quantizer_new();
    const int rc = L ? q2_quantize(L, scans, src, rows, cols, importance, dst) : -1;
    ferry_q2_quantizer_free(L);
    return rc;
}

int fe_q2_quantize_impl(int impl, const float *src, int rows, int cols, const float *importance, void *dst) {
    const int scans = q2_scans(impl);
    return scans < 0 ? -1 : fe_q2_quantize_scans(scans, src, rows, cols, importance, dst);
}

int ferry_q2_quantize_f32(const float *src, int rows, int cols, const float *importance, void *dst) {
    return fe_q2_quantize_impl(fe_kernels_best(), src, rows, cols, importance, dst);
}

int ferry_q2_quantize_with(const ferry_q2_quantizer *q, const float *src, int rows, int cols, const float *importance,
                           void *dst) {
    return q2_quantize(q, q2_scans(fe_kernels_best()), src, rows, cols, importance, dst);
}
