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
 * per-column importance. The products and scans have an AVX2 form (x86-64,
 * picked at run time) and a NEON form (aarch64) doing the same float
 * operations in the same order as the portable ones, so every path writes
 * the same bytes (core_c/tests/test_kernels.c, natively and under
 * qemu-aarch64), and blocks are independent, so any split of the rows
 * between threads writes the same bytes too. */
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

typedef struct {
    const q2_lists *L;
    int simd; /* 1: the AVX2 or NEON scans, 2: AVX-512 (the same results: same operations, same order) */
} q2_tables;

/* D (and N when h is given, else the list's norms n0) of one 8-vector
 * (ha = h * a) for the `count` codewords of a transposed list t (row stride
 * `stride`): sums over i in order, no fused multiply-adds. */
static void q2_products_c(const float *t, int stride, int count, const float *n0, const float ha[8], const float *h,
                          float *D, float *N) {
    for (int c = 0; c < count; c++) D[c] = 0.0f;
    for (int i = 0; i < 8; i++)
        for (int c = 0; c < count; c++) D[c] += ha[i] * t[i * stride + c];
    if (!h) {
        memcpy(N, n0, sizeof(float) * (size_t)count);
        return;
    }
    for (int c = 0; c < count; c++) N[c] = 0.0f;
    for (int i = 0; i < 8; i++)
        for (int c = 0; c < count; c++) N[c] += h[i] * (t[i * stride + c] * t[i * stride + c]);
}

/* The position minimising s N_c - 2 D_c (s >= 0); ties to the lower position. */
static int q2_nearest_c(const float *D, const float *N, int count, float s) {
    int bi = 0;
    float be = s * N[0] - 2.0f * D[0];
    for (int c = 1; c < count; c++) {
        const float e = s * N[c] - 2.0f * D[c];
        if (e < be) be = e, bi = c;
    }
    return bi;
}

#ifdef Q2_X86
#define Q2_AVX2 __attribute__((target("avx2")))
Q2_AVX2 static void q2_products_avx2(const float *t, int stride, int count, const float *n0, const float ha[8],
                                     const float *h, float *D, float *N) {
    for (int c = 0; c < count; c += 8) {
        __m256 d = _mm256_setzero_ps();
        for (int i = 0; i < 8; i++)
            d = _mm256_add_ps(d, _mm256_mul_ps(_mm256_set1_ps(ha[i]), _mm256_loadu_ps(t + i * stride + c)));
        _mm256_storeu_ps(D + c, d);
        if (h) {
            __m256 n = _mm256_setzero_ps();
            for (int i = 0; i < 8; i++) {
                const __m256 v = _mm256_loadu_ps(t + i * stride + c);
                n = _mm256_add_ps(n, _mm256_mul_ps(_mm256_set1_ps(h[i]), _mm256_mul_ps(v, v)));
            }
            _mm256_storeu_ps(N + c, n);
        }
    }
    if (!h) memcpy(N, n0, sizeof(float) * (size_t)count);
}

/* Lane l keeps the first minimum of the positions c = l mod 8; the lanes'
 * minima then give the overall first minimum (ties to the lower position). */
Q2_AVX2 static int q2_nearest_avx2(const float *D, const float *N, int count, float s) {
    const __m256 sv = _mm256_set1_ps(s), two = _mm256_set1_ps(2.0f), eight = _mm256_set1_ps(8.0f);
    __m256 best = _mm256_sub_ps(_mm256_mul_ps(sv, _mm256_loadu_ps(N)), _mm256_mul_ps(two, _mm256_loadu_ps(D)));
    __m256 idx = _mm256_setr_ps(0, 1, 2, 3, 4, 5, 6, 7), bidx = idx;
    for (int c = 8; c < count; c += 8) {
        idx = _mm256_add_ps(idx, eight);
        const __m256 e = _mm256_sub_ps(_mm256_mul_ps(sv, _mm256_loadu_ps(N + c)), _mm256_mul_ps(two, _mm256_loadu_ps(D + c)));
        const __m256 lt = _mm256_cmp_ps(e, best, _CMP_LT_OQ);
        best = _mm256_blendv_ps(best, e, lt);
        bidx = _mm256_blendv_ps(bidx, idx, lt);
    }
    /* the least value, then the least position among the lanes holding it */
    __m256 m = _mm256_min_ps(best, _mm256_permute2f128_ps(best, best, 1));
    m = _mm256_min_ps(m, _mm256_shuffle_ps(m, m, _MM_SHUFFLE(1, 0, 3, 2)));
    m = _mm256_min_ps(m, _mm256_shuffle_ps(m, m, _MM_SHUFFLE(2, 3, 0, 1)));
    __m256 p = _mm256_blendv_ps(_mm256_set1_ps((float)count), bidx, _mm256_cmp_ps(best, m, _CMP_EQ_OQ));
    p = _mm256_min_ps(p, _mm256_permute2f128_ps(p, p, 1));
    p = _mm256_min_ps(p, _mm256_shuffle_ps(p, p, _MM_SHUFFLE(1, 0, 3, 2)));
    p = _mm256_min_ps(p, _mm256_shuffle_ps(p, p, _MM_SHUFFLE(2, 3, 0, 1)));
    return (int)_mm_cvtss_f32(_mm256_castps256_ps128(p));
}

/* AVX-512 (F): the same sums and comparisons in 16 lanes (lists are
 * multiples of 16 when this runs: Q2_LIST and Q2_SEEDS, checked below). */
#define Q2_AVX512 __attribute__((target("avx512f")))
Q2_AVX512 static void q2_products_avx512(const float *t, int stride, int count, const float *n0, const float ha[8],
                                         const float *h, float *D, float *N) {
    for (int c = 0; c < count; c += 16) {
        __m512 d = _mm512_setzero_ps();
        for (int i = 0; i < 8; i++)
            d = _mm512_add_ps(d, _mm512_mul_ps(_mm512_set1_ps(ha[i]), _mm512_loadu_ps(t + i * stride + c)));
        _mm512_storeu_ps(D + c, d);
        if (h) {
            __m512 n = _mm512_setzero_ps();
            for (int i = 0; i < 8; i++) {
                const __m512 v = _mm512_loadu_ps(t + i * stride + c);
                n = _mm512_add_ps(n, _mm512_mul_ps(_mm512_set1_ps(h[i]), _mm512_mul_ps(v, v)));
            }
            _mm512_storeu_ps(N + c, n);
        }
    }
    if (!h) memcpy(N, n0, sizeof(float) * (size_t)count);
}

Q2_AVX512 static int q2_nearest_avx512(const float *D, const float *N, int count, float s) {
    const __m512 sv = _mm512_set1_ps(s), two = _mm512_set1_ps(2.0f), sixteen = _mm512_set1_ps(16.0f);
    __m512 best = _mm512_sub_ps(_mm512_mul_ps(sv, _mm512_loadu_ps(N)), _mm512_mul_ps(two, _mm512_loadu_ps(D)));
    __m512 idx = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15), bidx = idx;
    for (int c = 16; c < count; c += 16) {
        idx = _mm512_add_ps(idx, sixteen);
        const __m512 e = _mm512_sub_ps(_mm512_mul_ps(sv, _mm512_loadu_ps(N + c)), _mm512_mul_ps(two, _mm512_loadu_ps(D + c)));
        const __mmask16 lt = _mm512_cmp_ps_mask(e, best, _CMP_LT_OQ);
        best = _mm512_mask_mov_ps(best, lt, e);
        bidx = _mm512_mask_mov_ps(bidx, lt, idx);
    }
    const float m = _mm512_reduce_min_ps(best);
    const __mmask16 eq = _mm512_cmp_ps_mask(best, _mm512_set1_ps(m), _CMP_EQ_OQ);
    return (int)_mm512_reduce_min_ps(_mm512_mask_mov_ps(_mm512_set1_ps((float)count), eq, bidx));
}
#endif

#ifdef Q2_NEON
static void q2_products_neon(const float *t, int stride, int count, const float *n0, const float ha[8],
                             const float *h, float *D, float *N) {
    for (int c = 0; c < count; c += 4) {
        float32x4_t d = vdupq_n_f32(0.0f);
        for (int i = 0; i < 8; i++) d = vaddq_f32(d, vmulq_f32(vdupq_n_f32(ha[i]), vld1q_f32(t + i * stride + c)));
        vst1q_f32(D + c, d);
        if (h) {
            float32x4_t n = vdupq_n_f32(0.0f);
            for (int i = 0; i < 8; i++) {
                const float32x4_t v = vld1q_f32(t + i * stride + c);
                n = vaddq_f32(n, vmulq_f32(vdupq_n_f32(h[i]), vmulq_f32(v, v)));
            }
            vst1q_f32(N + c, n);
        }
    }
    if (!h) memcpy(N, n0, sizeof(float) * (size_t)count);
}

/* As the AVX2 scan, in 4 lanes. */
static int q2_nearest_neon(const float *D, const float *N, int count, float s) {
    const float32x4_t sv = vdupq_n_f32(s), two = vdupq_n_f32(2.0f), four = vdupq_n_f32(4.0f);
    static const float first[4] = {0, 1, 2, 3};
    float32x4_t best = vsubq_f32(vmulq_f32(sv, vld1q_f32(N)), vmulq_f32(two, vld1q_f32(D)));
    float32x4_t idx = vld1q_f32(first), bidx = idx;
    for (int c = 4; c < count; c += 4) {
        idx = vaddq_f32(idx, four);
        const float32x4_t e = vsubq_f32(vmulq_f32(sv, vld1q_f32(N + c)), vmulq_f32(two, vld1q_f32(D + c)));
        const uint32x4_t lt = vcltq_f32(e, best);
        best = vbslq_f32(lt, e, best);
        bidx = vbslq_f32(lt, idx, bidx);
    }
    float b[4], bi[4];
    vst1q_f32(b, best);
    vst1q_f32(bi, bidx);
    int k = 0;
    for (int l = 1; l < 4; l++)
        if (b[l] < b[k] || (b[l] == b[k] && bi[l] < bi[k])) k = l;
    return (int)bi[k];
}
#endif

static void q2_products(const q2_tables *T, const float *t, int stride, int count, const float *n0, const float ha[8],
                        const float *h, float *D, float *N) {
#ifdef Q2_X86
    if (T->simd == 2) {
        q2_products_avx512(t, stride, count, n0, ha, h, D, N);
        return;
    }
    if (T->simd) {
        q2_products_avx2(t, stride, count, n0, ha, h, D, N);
        return;
    }
#elif defined(Q2_NEON)
    if (T->simd) {
        q2_products_neon(t, stride, count, n0, ha, h, D, N);
        return;
    }
#endif
    (void)T;
    q2_products_c(t, stride, count, n0, ha, h, D, N);
}

static int q2_nearest(const q2_tables *T, const float *D, const float *N, int count, float s) {
#ifdef Q2_X86
    if (T->simd == 2) return q2_nearest_avx512(D, N, count, s);
    if (T->simd) return q2_nearest_avx2(D, N, count, s);
#elif defined(Q2_NEON)
    if (T->simd) return q2_nearest_neon(D, N, count, s);
#endif
    (void)T;
    return q2_nearest_c(D, N, count, s);
}

/* The shortlist of one 8-vector (ha = h * a, hk = h or NULL) at scale s:
 * its codeword indices (ids) and their D and N. */
static void q2_shortlist(const q2_tables *T, const float ha[8], const float *hk, float s, const short **ids, float *D,
                         float *N) {
    float sd[Q2_SEEDS], sn[Q2_SEEDS];
    q2_products(T, &T->L->seed_t[0][0], Q2_SEEDS, Q2_SEEDS, T->L->seed_n, ha, hk, sd, sn);
    int w = T->L->seed_id[q2_nearest(T, sd, sn, Q2_SEEDS, s)];
    q2_products(T, &T->L->nb_t[w][0][0], Q2_LIST, Q2_LIST, T->L->nb_n[w], ha, hk, D, N);
    const int p = q2_nearest(T, D, N, Q2_LIST, s);
    if (p) { /* position 0 is w itself: its list's D and N are made already */
        w = T->L->nb_id[w][p];
        q2_products(T, &T->L->nb_t[w][0][0], Q2_LIST, Q2_LIST, T->L->nb_n[w], ha, hk, D, N);
    }
    *ids = T->L->nb_id[w];
}

/* One 256-value block x (importance h) to 73 bytes at out; D and N hold
 * 32 * Q2_LIST floats each. */
static void q2_block(const q2_tables *T, const float *x, const float *h, float *D, float *N, uint8_t *out) {
    float ha[256], hh[256], aa[256];
    const short *ids[32];
    int sgn[32];
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
    float sub[16];
    float smax = 0.0f;
    for (int g = 0; g < 16; g++) {
        float am = 0.0f;
        for (int i = 0; i < 16; i++) am = aa[16 * g + i] > am ? aa[16 * g + i] : am;
        const float unit = am / T->L->cmax;
        for (int k = 2 * g; k < 2 * g + 2; k++)
            q2_shortlist(T, ha + 8 * k, h ? hh + 8 * k : NULL, unit * Q2_REF, &ids[k], D + Q2_LIST * k, N + Q2_LIST * k);
        sub[g] = 0.0f;
        if (am == 0.0f) continue;
        float best = INFINITY;
        for (int t = 0; t < Q2_TRIALS; t++) {
            const float s = unit * (Q2_F0 + Q2_FSTEP * (float)t);
            float sd = 0.0f, sn = 0.0f;
            for (int k = 2 * g; k < 2 * g + 2; k++) {
                const int c = q2_nearest(T, D + Q2_LIST * k, N + Q2_LIST * k, Q2_LIST, s);
                sd += D[Q2_LIST * k + c], sn += N[Q2_LIST * k + c];
            }
            const float s2 = sn > 0.0f ? sd / sn : s;
            const float err = s2 * s2 * sn - 2.0f * s2 * sd; /* + sum h a^2, the same for every trial */
            if (err < best) best = err, sub[g] = s2;
        }
        smax = sub[g] > smax ? sub[g] : smax;
    }
    memset(out, 0, FE_Q2_BYTES);
    if (!(smax > 0.0f)) return; /* e = 0: the block is zero */
    int e = (int)ceilf(8.0f * log2f(smax)) + 160;
    e = e < 1 ? 1 : e > 255 ? 255 : e;
    while (e > 1 && fe_log_scale(e - 1, 0) >= smax) e--;
    while (e < 255 && fe_log_scale(e, 0) < smax) e++;
    out[64] = (uint8_t)e;
    const float top = fe_log_scale(e, 0);
    for (int g = 0; g < 16; g++) {
        int j0 = sub[g] > 0.0f ? (int)lrintf(8.0f * log2f(top / sub[g])) : 15;
        j0 = j0 < 0 ? 0 : j0 > 15 ? 15 : j0;
        int bj = j0, bidx[2] = {0, 0};
        float best = INFINITY;
        for (int j = j0 - Q2_STEPS; j <= j0 + Q2_STEPS; j++) {
            if (j < 0 || j > 15) continue;
            const float s = fe_log_scale(e, j);
            float err = 0.0f;
            int idx[2];
            for (int q = 0; q < 2; q++) {
                const int k = 2 * g + q;
                idx[q] = q2_nearest(T, D + Q2_LIST * k, N + Q2_LIST * k, Q2_LIST, s);
                err += s * s * N[Q2_LIST * k + idx[q]] - 2.0f * s * D[Q2_LIST * k + idx[q]];
            }
            if (err < best) best = err, bj = j, bidx[0] = idx[0], bidx[1] = idx[1];
        }
        out[65 + (g >> 1)] |= (uint8_t)(bj << (4 * (g & 1)));
        for (int q = 0; q < 2; q++) {
            const int k = 2 * g + q;
            const unsigned word = (unsigned)ids[k][bidx[q]] | (unsigned)(sgn[k] & 127) << 9;
            out[2 * k] = (uint8_t)word, out[2 * k + 1] = (uint8_t)(word >> 8);
        }
    }
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
    return impl != FE_KERNELS_AVX2 ? 0 : fe_q2vq_variant(impl) == FE_Q2VQ_AVX512 ? 2 : 1;
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
    float *D = malloc(sizeof(float) * Q2_LIST * 32 * 2);
    if (!D) return -1;
    const q2_tables T = {L, scans};
    uint8_t *out = dst;
    for (int r = 0; r < rows; r++)
        for (int b = 0; b < cols / FE_Q2_BLOCK; b++, out += FE_Q2_BYTES)
            q2_block(&T, src + (size_t)r * (size_t)cols + (size_t)FE_Q2_BLOCK * (size_t)b,
                     importance ? importance + FE_Q2_BLOCK * b : NULL, D, D + Q2_LIST * 32, out);
    free(D);
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
