/* quant3.c — the q3_nl quantizer (ferry_kernels.h; format in formats.h).
 *
 * Per group of 64 values the scale is searched over the format's own scale
 * steps (2^(1/8) apart) near absmax / max|grid|: for each candidate the
 * values are assigned to the nearest grid point and the importance-weighted
 * squared error is measured; the best candidate wins. The block's exponent
 * byte is the largest group code, other groups are coded relative to it
 * (clamped 15 steps below). The search is written as straight-line compares
 * and selects over 8 values at a time so the compiler vectorises it; on
 * x86-64 an AVX2 copy is selected at run time. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../include/ferry_kernels.h"
#include "formats.h"
#include "kernels.h"

#define GROUP 64
/* Scale codes tried: c0 - 4 .. c0 around c0 = round(8 log2(absmax / max|grid|)). Measured on the demo
 * and K3-shaped matrices (docs/QUANTIZATION.md): 8 codes (c0-6..c0+1) gain < 0.0003 in relative error. */
#ifndef CANDIDATES
#define CANDIDATES 5
#endif
#ifndef CAND_BELOW
#define CAND_BELOW 4
#endif

/* The scale of code c (= e - j in formats.h): 2^(c/8 - 20), c in -14..255. */
static float scale_of_code(int c) {
    uint8_t blk[99] = {0};
    int e = c < 1 ? 1 : c;
    blk[96] = (uint8_t)e;
    blk[97] = (uint8_t)(e - c);
    return fe_q3_group_scale(blk, 0);
}

typedef struct {
    float thr[7];   /* midpoints between grid points */
    float step[7];  /* grid[i+1] - grid[i] */
    float lmax;     /* max |grid| */
} q3_grid;

static void grid_init(q3_grid *g) {
    g->lmax = 0;
    for (int i = 0; i < 8; i++) g->lmax = fmaxf(g->lmax, fabsf(fe_q3_levels[i]));
    for (int i = 0; i < 7; i++) {
        g->thr[i] = 0.5f * (fe_q3_levels[i] + fe_q3_levels[i + 1]);
        g->step[i] = fe_q3_levels[i + 1] - fe_q3_levels[i];
    }
}

/* Weighted squared error of one group at scale s (nearest grid point each). */
static inline __attribute__((always_inline)) float group_error(const float *x, const float *h, float s,
                                                               const q3_grid *g) {
    float ts[7], ds[7];
    for (int i = 0; i < 7; i++) ts[i] = g->thr[i] * s, ds[i] = g->step[i] * s;
    float base = fe_q3_levels[0] * s;
    float err[8] = {0};
    for (int k = 0; k < GROUP; k += 8)
        for (int l = 0; l < 8; l++) {
            float v = x[k + l], q = base;
            for (int i = 0; i < 7; i++) q += v > ts[i] ? ds[i] : 0.0f;
            float d = v - q;
            err[l] += h[k + l] * (d * d);
        }
    return ((err[0] + err[1]) + (err[2] + err[3])) + ((err[4] + err[5]) + (err[6] + err[7]));
}

#if defined(__x86_64__)
#include <immintrin.h>
/* group_error for 8 candidate scales at once would need 8x the registers;
 * instead one candidate at a time, 8 values per vector. */
__attribute__((target("avx2,fma"))) static inline float group_error_avx2(const float *x, const float *h, float s,
                                                                        const q3_grid *g) {
    __m256 ts[7], ds[7];
    for (int i = 0; i < 7; i++) ts[i] = _mm256_set1_ps(g->thr[i] * s), ds[i] = _mm256_set1_ps(g->step[i] * s);
    const __m256 base = _mm256_set1_ps(fe_q3_levels[0] * s);
    __m256 e0 = _mm256_setzero_ps(), e1 = e0;
    for (int k = 0; k < GROUP; k += 16) {
        __m256 v0 = _mm256_loadu_ps(x + k), v1 = _mm256_loadu_ps(x + k + 8), q0 = base, q1 = base;
        for (int i = 0; i < 7; i++) {
            q0 = _mm256_add_ps(q0, _mm256_and_ps(_mm256_cmp_ps(v0, ts[i], _CMP_GT_OQ), ds[i]));
            q1 = _mm256_add_ps(q1, _mm256_and_ps(_mm256_cmp_ps(v1, ts[i], _CMP_GT_OQ), ds[i]));
        }
        __m256 d0 = _mm256_sub_ps(v0, q0), d1 = _mm256_sub_ps(v1, q1);
        e0 = _mm256_fmadd_ps(_mm256_mul_ps(d0, d0), _mm256_loadu_ps(h + k), e0);
        e1 = _mm256_fmadd_ps(_mm256_mul_ps(d1, d1), _mm256_loadu_ps(h + k + 8), e1);
    }
    __m256 e = _mm256_add_ps(e0, e1);
    __m128 r = _mm_add_ps(_mm256_castps256_ps128(e), _mm256_extractf128_ps(e, 1));
    r = _mm_add_ps(r, _mm_movehl_ps(r, r));
    r = _mm_add_ss(r, _mm_movehdup_ps(r));
    return _mm_cvtss_f32(r);
}
#define GROUP_ERROR_AVX2(x, h, s, g) group_error_avx2(x, h, s, g)
#endif

/* The best scale code of one group; `simd` selects the AVX2 error (x86-64). */
static inline __attribute__((always_inline)) int best_code(const float *x, const float *h, const q3_grid *g,
                                                           const int simd) {
    float amax = 0;
    for (int i = 0; i < GROUP; i++) amax = fmaxf(amax, fabsf(x[i]));
    if (amax == 0.0f) return -1000; /* an all-zero group: the smallest scale there is */
    int c0 = (int)lrintf(8.0f * log2f(amax / g->lmax)) + 160;
    int best = c0;
    float best_err = INFINITY;
    for (int k = 0; k < CANDIDATES; k++) {
        int c = c0 - CAND_BELOW + k;
        if (c < -14 || c > 255) continue;
        float e;
#if defined(__x86_64__)
        if (simd) e = GROUP_ERROR_AVX2(x, h, scale_of_code(c), g);
        else
#endif
            e = group_error(x, h, scale_of_code(c), g);
        (void)simd;
        if (e < best_err) best_err = e, best = c;
    }
    return best < -14 ? -14 : best > 255 ? 255 : best;
}

/* One block of 256 values x (importance h) into 99 bytes. */
static inline __attribute__((always_inline)) void quant_block(const float *x, const float *h, uint8_t *out,
                                                              const q3_grid *g, const int simd) {
    int c[4], e = -1000;
    for (int k = 0; k < 4; k++) {
        c[k] = best_code(x + GROUP * k, h + GROUP * k, g, simd);
        if (c[k] > e) e = c[k];
    }
    memset(out, 0, FE_Q3_BYTES);
    if (e == -1000) return; /* all zero: e = 0 means scale 0 */
    if (e < 1) e = 1;
    out[96] = (uint8_t)e;
    for (int k = 0; k < 4; k++) {
        int j = e - c[k];
        if (j > 15 || c[k] == -1000) j = 15;
        out[97 + (k >> 1)] |= (uint8_t)(j << (4 * (k & 1)));
    }
    uint64_t lo[8] = {0};
    uint32_t hi[8] = {0};
    for (int k = 0; k < 4; k++) {
        float s = fe_q3_group_scale(out, k), ts[7];
        for (int i = 0; i < 7; i++) ts[i] = g->thr[i] * s;
        for (int v = GROUP * k; v < GROUP * (k + 1); v++) {
            int q = 0;
            for (int i = 0; i < 7; i++) q += x[v] > ts[i];
            int bit = 3 * (v >> 3), l = v & 7;
            if (bit < 64) lo[l] |= (uint64_t)q << bit;
            if (bit + 3 > 64) hi[l] |= (uint32_t)q >> (64 - bit > 0 ? 64 - bit : 0) << (bit > 64 ? bit - 64 : 0);
        }
    }
    for (int l = 0; l < 8; l++) {
        uint32_t w[3] = {(uint32_t)lo[l], (uint32_t)(lo[l] >> 32), hi[l]};
        for (int k = 0; k < 3; k++)
            for (int b = 0; b < 4; b++) out[32 * k + 4 * l + b] = (uint8_t)(w[k] >> (8 * b));
    }
}

static inline __attribute__((always_inline)) void quant_rows_body(const float *src, int rows, int cols,
                                                                  const float *imp, const float *ones,
                                                                  uint8_t *dst, const int simd) {
    q3_grid g;
    grid_init(&g);
    for (int r = 0; r < rows; r++)
        for (int b = 0; b < cols / FE_Q3_BLOCK; b++)
            quant_block(src + (size_t)r * cols + FE_Q3_BLOCK * b, imp ? imp + FE_Q3_BLOCK * b : ones,
                        dst + ((size_t)r * (cols / FE_Q3_BLOCK) + b) * FE_Q3_BYTES, &g, simd);
}

static void quant_rows_base(const float *src, int rows, int cols, const float *imp, const float *ones, uint8_t *dst) {
    quant_rows_body(src, rows, cols, imp, ones, dst, 0);
}

#if defined(__x86_64__)
__attribute__((target("avx2,fma"))) static void quant_rows_avx2(const float *src, int rows, int cols,
                                                               const float *imp, const float *ones, uint8_t *dst) {
    quant_rows_body(src, rows, cols, imp, ones, dst, 1);
}
#endif

static int quant_f32(const float *src, int rows, int cols, const float *imp, void *dst) {
    float ONES[FE_Q3_BLOCK];
    for (int i = 0; i < FE_Q3_BLOCK; i++) ONES[i] = 1.0f;
    if (!src || !dst || rows < 0 || cols <= 0 || cols % FE_Q3_BLOCK) return -1;
    for (size_t i = 0; i < (size_t)rows * (size_t)cols; i++)
        if (!isfinite(src[i])) return -1;
    if (imp)
        for (int i = 0; i < cols; i++)
            if (!(imp[i] >= 0.0f) || !isfinite(imp[i])) return -1;
#if defined(__x86_64__)
    if (fe_cpu_has_avx2()) {
        quant_rows_avx2(src, rows, cols, imp, ONES, dst);
        return 0;
    }
#endif
    quant_rows_base(src, rows, cols, imp, ONES, dst);
    return 0;
}

int ferry_q3_quantize_f32(const float *src, int rows, int cols, const float *importance, void *dst) {
    return quant_f32(src, rows, cols, importance, dst);
}

/* Row by row through a float buffer, so memory stays at one row. */
int ferry_q3_quantize_bf16(const uint16_t *src, int rows, int cols, const float *importance, void *dst) {
    if (!src || !dst || rows < 0 || cols <= 0 || cols % FE_Q3_BLOCK) return -1;
    float *row = malloc(sizeof(float) * (size_t)cols);
    if (!row) return -1;
    int rc = 0;
    for (int r = 0; r < rows && rc == 0; r++) {
        for (int i = 0; i < cols; i++) row[i] = fe_bf16_to_f32(src[(size_t)r * cols + i]);
        rc = quant_f32(row, 1, cols, importance, (uint8_t *)dst + (size_t)r * (cols / FE_Q3_BLOCK) * FE_Q3_BYTES);
    }
    free(row);
    return rc;
}

int ferry_q3_quantize_mxfp4(const uint8_t *packed, const uint8_t *scales, int rows, int cols,
                            const float *importance, void *dst) {
    static const float E2M1[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    if (!packed || !scales || !dst || rows < 0 || cols <= 0 || cols % FE_Q3_BLOCK) return -1;
    float *row = malloc(sizeof(float) * (size_t)cols);
    if (!row) return -1;
    int rc = 0;
    for (int r = 0; r < rows && rc == 0; r++) {
        const uint8_t *p = packed + (size_t)r * (cols / 2), *sc = scales + (size_t)r * (cols / 32);
        for (int g = 0; g < cols / 32; g++) {
            float lut[16], s = ldexpf(1.0f, (int)sc[g] - 127); /* exact: E8M0 is a power of two */
            for (int k = 0; k < 8; k++) lut[k] = E2M1[k] * s, lut[k + 8] = -(E2M1[k] * s);
            for (int i = 32 * g; i < 32 * g + 32; i += 2) {
                row[i] = lut[p[i >> 1] & 15];
                row[i + 1] = lut[p[i >> 1] >> 4];
            }
        }
        rc = quant_f32(row, 1, cols, importance, (uint8_t *)dst + (size_t)r * (cols / FE_Q3_BLOCK) * FE_Q3_BYTES);
    }
    free(row);
    return rc;
}
