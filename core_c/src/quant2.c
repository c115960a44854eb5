/* quant2.c — the q2_vq quantizer (formats.h, docs/QUANTIZATION.md "Two-bit
 * experts"): ferry_q2_quantize_f32 of ferry_kernels.h.
 *
 * Per 8 values: the signs (when an odd number are negative, the value whose
 * sign costs least, h_i x_i^2 smallest, gives its sign up: the format stores
 * even parity) and the magnitudes a_i. Per sub-block of 16 values a scale s
 * is searched: for 8 trial scales s = max(a) / max(codebook) * f, f = 0.5,
 * 0.6, .., 1.2, each 8-vector takes the codeword c minimising the weighted
 * error sum h_i (a_i - s c_i)^2 (= s N_c - 2 D_c up to terms that do not
 * depend on c, with D_c = sum h_i a_i c_i and N_c = sum h_i c_i^2), then the
 * least-squares scale of those codewords; the trial with the least error
 * wins. The block's exponent code e is the smallest whose scale reaches the
 * largest sub-block scale, each sub-block's 4-bit code j the nearest on the
 * log grid, or one step either side, whichever gives the least error with
 * its codewords picked again at the stored scale. h = 1, or the caller's
 * per-column importance. The codeword products and scans have an AVX2 form
 * (x86-64, picked at run time) and a NEON form (aarch64) doing the same
 * float operations in the same order, so every path writes the same bytes
 * (core_c/tests/test_kernels.c, natively and under qemu-aarch64). */
#include <math.h>
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

typedef struct {
    float ct[8][FE_Q2_CODES];  /* the codebook transposed: ct[i][c] = value i of codeword c */
    float ct2[8][FE_Q2_CODES]; /* its squares */
    float norm[FE_Q2_CODES];   /* N_c with h = 1 (the same sums q2_products makes) */
    float cmax;                /* the largest codebook value */
    int simd;                  /* the AVX2 or NEON scans (the same results: same operations, same order) */
} q2_tables;

/* D_c (and N_c when h is given, else the tables' norms) of one 8-vector
 * (ha = h * a) for every codeword: sums over i in order, no fused multiply-adds. */
static void q2_products_c(const q2_tables *T, const float ha[8], const float *h, float *D, float *N) {
    for (int c = 0; c < FE_Q2_CODES; c++) D[c] = 0.0f;
    for (int i = 0; i < 8; i++)
        for (int c = 0; c < FE_Q2_CODES; c++) D[c] += ha[i] * T->ct[i][c];
    if (!h) {
        memcpy(N, T->norm, sizeof T->norm);
        return;
    }
    for (int c = 0; c < FE_Q2_CODES; c++) N[c] = 0.0f;
    for (int i = 0; i < 8; i++)
        for (int c = 0; c < FE_Q2_CODES; c++) N[c] += h[i] * T->ct2[i][c];
}

/* The codeword minimising s N_c - 2 D_c (s > 0); ties to the lower index. */
static int q2_nearest_c(const float *D, const float *N, float s) {
    int bi = 0;
    float be = s * N[0] - 2.0f * D[0];
    for (int c = 1; c < FE_Q2_CODES; c++) {
        const float e = s * N[c] - 2.0f * D[c];
        if (e < be) be = e, bi = c;
    }
    return bi;
}

#ifdef Q2_X86
#define Q2_AVX2 __attribute__((target("avx2")))
Q2_AVX2 static void q2_products_avx2(const q2_tables *T, const float ha[8], const float *h, float *D, float *N) {
    for (int c = 0; c < FE_Q2_CODES; c += 8) {
        __m256 d = _mm256_setzero_ps();
        for (int i = 0; i < 8; i++) d = _mm256_add_ps(d, _mm256_mul_ps(_mm256_set1_ps(ha[i]), _mm256_loadu_ps(T->ct[i] + c)));
        _mm256_storeu_ps(D + c, d);
        if (h) {
            __m256 n = _mm256_setzero_ps();
            for (int i = 0; i < 8; i++) n = _mm256_add_ps(n, _mm256_mul_ps(_mm256_set1_ps(h[i]), _mm256_loadu_ps(T->ct2[i] + c)));
            _mm256_storeu_ps(N + c, n);
        }
    }
    if (!h) memcpy(N, T->norm, sizeof T->norm);
}

/* Lane l keeps the first minimum of the codewords c = l mod 8; the lanes'
 * minima then give the overall first minimum (ties to the lower index). */
Q2_AVX2 static int q2_nearest_avx2(const float *D, const float *N, float s) {
    const __m256 sv = _mm256_set1_ps(s), two = _mm256_set1_ps(2.0f), eight = _mm256_set1_ps(8.0f);
    __m256 best = _mm256_sub_ps(_mm256_mul_ps(sv, _mm256_loadu_ps(N)), _mm256_mul_ps(two, _mm256_loadu_ps(D)));
    __m256 idx = _mm256_setr_ps(0, 1, 2, 3, 4, 5, 6, 7), bidx = idx;
    for (int c = 8; c < FE_Q2_CODES; c += 8) {
        idx = _mm256_add_ps(idx, eight);
        const __m256 e = _mm256_sub_ps(_mm256_mul_ps(sv, _mm256_loadu_ps(N + c)), _mm256_mul_ps(two, _mm256_loadu_ps(D + c)));
        const __m256 lt = _mm256_cmp_ps(e, best, _CMP_LT_OQ);
        best = _mm256_blendv_ps(best, e, lt);
        bidx = _mm256_blendv_ps(bidx, idx, lt);
    }
    float b[8], bi[8];
    _mm256_storeu_ps(b, best);
    _mm256_storeu_ps(bi, bidx);
    int k = 0;
    for (int l = 1; l < 8; l++)
        if (b[l] < b[k] || (b[l] == b[k] && bi[l] < bi[k])) k = l;
    return (int)bi[k];
}
#endif

#ifdef Q2_NEON
static void q2_products_neon(const q2_tables *T, const float ha[8], const float *h, float *D, float *N) {
    for (int c = 0; c < FE_Q2_CODES; c += 4) {
        float32x4_t d = vdupq_n_f32(0.0f);
        for (int i = 0; i < 8; i++) d = vaddq_f32(d, vmulq_f32(vdupq_n_f32(ha[i]), vld1q_f32(T->ct[i] + c)));
        vst1q_f32(D + c, d);
        if (h) {
            float32x4_t n = vdupq_n_f32(0.0f);
            for (int i = 0; i < 8; i++) n = vaddq_f32(n, vmulq_f32(vdupq_n_f32(h[i]), vld1q_f32(T->ct2[i] + c)));
            vst1q_f32(N + c, n);
        }
    }
    if (!h) memcpy(N, T->norm, sizeof T->norm);
}

/* As the AVX2 scan, in 4 lanes. */
static int q2_nearest_neon(const float *D, const float *N, float s) {
    const float32x4_t sv = vdupq_n_f32(s), two = vdupq_n_f32(2.0f), four = vdupq_n_f32(4.0f);
    static const float first[4] = {0, 1, 2, 3};
    float32x4_t best = vsubq_f32(vmulq_f32(sv, vld1q_f32(N)), vmulq_f32(two, vld1q_f32(D)));
    float32x4_t idx = vld1q_f32(first), bidx = idx;
    for (int c = 4; c < FE_Q2_CODES; c += 4) {
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

static void q2_products(const q2_tables *T, const float ha[8], const float *h, float *D, float *N) {
#ifdef Q2_X86
    if (T->simd) {
        q2_products_avx2(T, ha, h, D, N);
        return;
    }
#elif defined(Q2_NEON)
    if (T->simd) {
        q2_products_neon(T, ha, h, D, N);
        return;
    }
#endif
    q2_products_c(T, ha, h, D, N);
}

static int q2_nearest(const q2_tables *T, const float *D, const float *N, float s, float *best_d, float *best_n) {
    int bi;
#ifdef Q2_X86
    if (T->simd)
        bi = q2_nearest_avx2(D, N, s);
    else
#elif defined(Q2_NEON)
    if (T->simd)
        bi = q2_nearest_neon(D, N, s);
    else
#endif
        bi = q2_nearest_c(D, N, s);
    (void)T;
    *best_d = D[bi], *best_n = N[bi];
    return bi;
}

/* One 256-value block x (importance h) to 73 bytes at out. */
static void q2_block(const q2_tables *T, const float *x, const float *h, float *D, float *N, uint8_t *out) {
    float ha[256], hh[256], aa[256];
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
    /* D and N of all 32 vectors (D + 512 k) */
    for (int k = 0; k < 32; k++) q2_products(T, ha + 8 * k, h ? hh + 8 * k : NULL, D + FE_Q2_CODES * k, N + FE_Q2_CODES * k);
    float sub[16];
    float smax = 0.0f;
    for (int g = 0; g < 16; g++) {
        float am = 0.0f;
        for (int i = 0; i < 16; i++) am = aa[16 * g + i] > am ? aa[16 * g + i] : am;
        sub[g] = 0.0f;
        if (am == 0.0f) continue;
        float best = INFINITY;
        for (int t = 0; t < 8; t++) {
            const float s = am / T->cmax * (0.5f + 0.1f * (float)t);
            float sd = 0.0f, sn = 0.0f, d, n;
            for (int k = 2 * g; k < 2 * g + 2; k++) {
                q2_nearest(T, D + FE_Q2_CODES * k, N + FE_Q2_CODES * k, s, &d, &n);
                sd += d, sn += n;
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
        for (int j = j0 - 1; j <= j0 + 1; j++) {
            if (j < 0 || j > 15) continue;
            const float s = fe_log_scale(e, j);
            float err = 0.0f, d, n;
            int idx[2];
            for (int q = 0; q < 2; q++) {
                const int k = 2 * g + q;
                idx[q] = q2_nearest(T, D + FE_Q2_CODES * k, N + FE_Q2_CODES * k, s, &d, &n);
                err += s * s * n - 2.0f * s * d;
            }
            if (err < best) best = err, bj = j, bidx[0] = idx[0], bidx[1] = idx[1];
        }
        out[65 + (g >> 1)] |= (uint8_t)(bj << (4 * (g & 1)));
        for (int q = 0; q < 2; q++) {
            const int k = 2 * g + q;
            const unsigned word = (unsigned)bidx[q] | (unsigned)(sgn[k] & 127) << 9;
            out[2 * k] = (uint8_t)word, out[2 * k + 1] = (uint8_t)(word >> 8);
        }
    }
}

int fe_q2_quantize_impl(int impl, const float *src, int rows, int cols, const float *importance, void *dst) {
    if (!src || !dst || rows < 0 || cols <= 0 || cols % FE_Q2_BLOCK) return -1;
    if (impl == FE_KERNELS_AVX2 && !fe_cpu_has_avx2()) return -1;
    if (impl != FE_KERNELS_SCALAR && !fe_kernels_get(impl)) return -1;
    const size_t n = (size_t)rows * (size_t)cols;
    for (size_t i = 0; i < n; i++)
        if (!isfinite(src[i])) return -1;
    if (importance)
        for (int i = 0; i < cols; i++)
            if (!(importance[i] >= 0.0f) || !isfinite(importance[i])) return -1;
    q2_tables *T = malloc(sizeof *T);
    float *D = malloc(sizeof(float) * FE_Q2_CODES * 32 * 2);
    if (!T || !D) {
        free(T), free(D);
        return -1;
    }
    T->cmax = 0.0f;
#ifdef Q2_X86
    T->simd = impl == FE_KERNELS_AVX2;
#elif defined(Q2_NEON)
    T->simd = impl == FE_KERNELS_NEON;
#else
    T->simd = 0;
#endif
    for (int c = 0; c < FE_Q2_CODES; c++)
        for (int i = 0; i < 8; i++) {
            const float v = fe_q2_codebook[8 * c + i];
            T->ct[i][c] = v, T->ct2[i][c] = v * v;
            T->cmax = v > T->cmax ? v : T->cmax;
        }
    for (int c = 0; c < FE_Q2_CODES; c++) {
        T->norm[c] = 0.0f;
        for (int i = 0; i < 8; i++) T->norm[c] += 1.0f * T->ct2[i][c];
    }
    uint8_t *out = dst;
    for (int r = 0; r < rows; r++)
        for (int b = 0; b < cols / FE_Q2_BLOCK; b++, out += FE_Q2_BYTES)
            q2_block(T, src + (size_t)r * (size_t)cols + (size_t)FE_Q2_BLOCK * (size_t)b,
                     importance ? importance + FE_Q2_BLOCK * b : NULL, D, D + FE_Q2_CODES * 32, out);
    free(T), free(D);
    return 0;
}

int ferry_q2_quantize_f32(const float *src, int rows, int cols, const float *importance, void *dst) {
    return fe_q2_quantize_impl(fe_kernels_best(), src, rows, cols, importance, dst);
}
