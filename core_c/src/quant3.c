/* quant3.c — the q3_nl quantizer (ferry_kernels.h; format in formats.h).
 *
 * Per group of 64 values the scale is searched over the format's own scale
 * codes (2^(1/8) apart) near absmax / max|grid|: for each candidate the
 * values are assigned to the nearest grid point and the importance-weighted
 * squared error is measured; the best candidate wins. The block's exponent
 * byte is the largest group code, other groups are coded relative to it
 * (clamped 15 steps below).
 *
 * Two paths that give identical bytes (tests/kernels/test_quant3.py and
 * core_c/tests/test_kernels.c check it):
 *  - portable: the nearest grid point by 7 compare-and-selects against the
 *    midpoints (monotone, so the last midpoint below v picks the point);
 *    straight-line code over 8 lanes that compilers auto-vectorise;
 *  - AVX2 (x86-64, picked at run time like the matmul kernels): v / s falls
 *    in one of 8 cells of width 0.45 on [-1.8, 1.8) (clamped at the ends),
 *    each holding at most one midpoint (checked by grid_init), so one
 *    permute fetches that midpoint, one compare decides, and two permutes
 *    and a blend give the grid point: the same comparison v > midpoint * s
 *    as the portable path, hence the same index and the same error sums
 *    (lanes are summed in the same order, without fused multiply-adds).
 * The 3-bit indices are packed 8 lanes at a time (lane l of step s is value
 * 8s + l, the format's own lane order), so packing is shifts and ORs.
 * bf16 and MXFP4 sources are decoded one 256-value block at a time into a
 * buffer on the stack, inside the same loop. */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../include/ferry_kernels.h"
#include "formats.h"
#include "kernels.h"

#define GROUP 64
/* Scale codes tried: c0 - CAND_BELOW .. c0 - CAND_BELOW + CANDIDATES - 1 around
 * c0 = round(8 log2(absmax / max|grid|)). docs/QUANTIZATION.md has the measurements. */
#ifndef CANDIDATES
#define CANDIDATES 5
#endif
#ifndef CAND_BELOW
#define CAND_BELOW 4
#endif
#define ZERO_CODE (-1000) /* an all-zero group */

/* Cells of the AVX2 assignment, in units of the scale: [CELL_LO + k W, CELL_LO + (k+1) W). */
#define CELL_W 0.45f
#define CELL_LO (-1.8f)

typedef struct {
    float thr[7];    /* midpoints between grid points */
    float lmax;      /* max |grid| */
    int cell_mid[8]; /* the midpoint inside cell k, or -1 */
    int cell_base[8];/* the grid index just below cell k's midpoint (or of the whole cell) */
    int ok;          /* every cell holds at most one midpoint */
    float ucthr[8], uclo[8], uchi[8]; /* the q3_cand cell tables at s = 1 */
    int32_t ucbase[8];
} q3_grid;

/* One candidate scale s for the portable path (the AVX2 path scales q3_grid's cell tables). */
typedef struct {
    float ts[7]; /* thr * s */
    float ls[8]; /* grid * s */
} q3_cand;

static void grid_init(q3_grid *g) {
    g->lmax = 0;
    for (int i = 0; i < 8; i++) g->lmax = fmaxf(g->lmax, fabsf(fe_q3_levels[i]));
    for (int i = 0; i < 7; i++) g->thr[i] = 0.5f * (fe_q3_levels[i] + fe_q3_levels[i + 1]);
    /* Cell k is [CELL_LO + k W, CELL_LO + (k+1) W), the end cells reaching to -inf / +inf. Every midpoint
     * must lie well inside a cell (1e-3 of a scale from its edges: far more than float rounding of v / s). */
    g->ok = 1;
    for (int k = 0; k < 8; k++) g->cell_mid[k] = -1, g->cell_base[k] = 0;
    for (int i = 0; i < 7; i++) {
        int k = 0;
        for (int b = 1; b < 8; b++) {
            float edge = CELL_LO + CELL_W * (float)b;
            if (fabsf(g->thr[i] - edge) < 1e-3f) g->ok = 0;
            if (g->thr[i] >= edge) k = b;
        }
        if (g->cell_mid[k] >= 0) g->ok = 0;
        g->cell_mid[k] = i;
    }
    /* The grid index of a value in cell k below its midpoint (or anywhere in a cell without one). */
    for (int k = 0, below = 0; k < 8; k++) {
        g->cell_base[k] = below;
        if (g->cell_mid[k] >= 0) below++;
    }
    for (int k = 0; k < 8; k++) {
        int m = g->cell_mid[k], b = g->cell_base[k];
        g->ucthr[k] = m >= 0 ? g->thr[m] : INFINITY;
        g->uclo[k] = fe_q3_levels[b];
        g->uchi[k] = fe_q3_levels[m >= 0 ? b + 1 : b];
        g->ucbase[k] = b;
    }
}

int fe_q3_cells_ok(void) {
    q3_grid g;
    grid_init(&g);
    return g.ok;
}

/* The scale of code c (= e - j in formats.h, c in -14..255): what fe_q3_group_scale gives. */
static inline float scale_of_code(int c) {
    int v = c + 16;
    union { uint32_t u; float f; } p;
    p.u = (uint32_t)((v >> 3) + 105) << 23;
    return fe_q3_frac[v & 7] * p.f;
}

/* About 1 / (CELL_W scale_of_code(c)) without a division: it only picks cells, which have margins. */
static inline float inv_cell_width(int c) {
    static const float inv_frac[8] = {1.0f / 1.0f, 1.0f / 1.09050773f, 1.0f / 1.18920712f, 1.0f / 1.29683955f,
                                      1.0f / 1.41421356f, 1.0f / 1.54221083f, 1.0f / 1.68179283f, 1.0f / 1.83400809f};
    int v = c + 16;
    union { uint32_t u; float f; } p;
    p.u = (uint32_t)(149 - (v >> 3)) << 23; /* 2^(22 - (v >> 3)) */
    return inv_frac[v & 7] * (1.0f / CELL_W) * p.f;
}

static inline __attribute__((always_inline)) void cand_init(q3_cand *c, const q3_grid *g, float s) {
    for (int i = 0; i < 7; i++) c->ts[i] = g->thr[i] * s;
    for (int i = 0; i < 8; i++) c->ls[i] = fe_q3_levels[i] * s;
}

static inline float sum8(const float *a) {
    return ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
}

/* Weighted squared errors err[i] of one group at the CANDIDATES candidates c[i] (nearest grid
 * point each), in one pass over the values. */
static inline __attribute__((always_inline)) void group_errors(const float *x, const float *h, const q3_cand *c,
                                                               float *err) {
    float acc[CANDIDATES][8] = {{0}};
    for (int k = 0; k < GROUP; k += 8)
        for (int l = 0; l < 8; l++) {
            float v = x[k + l];
            for (int j = 0; j < CANDIDATES; j++) {
                float q = c[j].ls[0];
                for (int i = 0; i < 7; i++) q = v > c[j].ts[i] ? c[j].ls[i + 1] : q;
                float d = v - q, e = d * d;
                acc[j][l] += h ? h[k + l] * e : e;
            }
        }
    for (int j = 0; j < CANDIDATES; j++) err[j] = sum8(acc[j]);
}

/* The indices of one group at candidate c, packed into the lane words w[3][8]; g0 = group 0..3. */
static inline __attribute__((always_inline)) void group_pack(const float *x, const q3_cand *c, int g0,
                                                             uint32_t w[3][8]) {
    for (int st = 8 * g0; st < 8 * g0 + 8; st++) {
        int bit = 3 * st, k = bit >> 5, off = bit & 31;
        for (int l = 0; l < 8; l++) {
            float v = x[8 * st + l];
            uint32_t q = 0;
            for (int i = 0; i < 7; i++) q += v > c->ts[i];
            w[k][l] |= q << off;
            if (off > 29) w[k + 1][l] |= q >> (32 - off);
        }
    }
}

#if defined(__x86_64__)
#include <immintrin.h>
#define AVX2 __attribute__((target("avx2,fma")))

typedef struct {
    __m256 a, off, top, cthr, clo, chi;
    __m256i cbase;
} cand_v;

/* Products with s exactly as cand_init's: the same midpoints * s and grid points * s. */
AVX2 static inline __attribute__((always_inline)) cand_v cand_load(const q3_grid *g, int code) {
    cand_v r;
    __m256 sv = _mm256_set1_ps(scale_of_code(code));
    r.a = _mm256_set1_ps(inv_cell_width(code));
    r.off = _mm256_set1_ps(-CELL_LO / CELL_W);
    r.top = _mm256_set1_ps(7.5f);
    r.cthr = _mm256_mul_ps(_mm256_loadu_ps(g->ucthr), sv);
    r.clo = _mm256_mul_ps(_mm256_loadu_ps(g->uclo), sv);
    r.chi = _mm256_mul_ps(_mm256_loadu_ps(g->uchi), sv);
    r.cbase = _mm256_loadu_si256((const __m256i *)g->ucbase);
    return r;
}

/* The cell of each value (clamped to 0..7) and whether it is above the cell's midpoint. */
AVX2 static inline __attribute__((always_inline)) __m256 cell_of(__m256 v, const cand_v *c, __m256i *cell) {
    __m256 t = _mm256_add_ps(_mm256_mul_ps(v, c->a), c->off);
    t = _mm256_min_ps(_mm256_max_ps(t, _mm256_setzero_ps()), c->top);
    *cell = _mm256_cvttps_epi32(t);
    return _mm256_cmp_ps(v, _mm256_permutevar8x32_ps(c->cthr, *cell), _CMP_GT_OQ);
}

/* (Not always_inline: the portable copy of best_code holds a call it never makes.) */
AVX2 static inline __attribute__((flatten)) void group_errors_avx2(const float *x, const float *h, const q3_grid *g, const int *code,
                                          float *err) {
    cand_v c[CANDIDATES];
    __m256 acc[CANDIDATES];
    for (int j = 0; j < CANDIDATES; j++) c[j] = cand_load(g, code[j]), acc[j] = _mm256_setzero_ps();
    for (int k = 0; k < GROUP; k += 8) {
        __m256 v = _mm256_loadu_ps(x + k), hv = h ? _mm256_loadu_ps(h + k) : _mm256_setzero_ps();
        for (int j = 0; j < CANDIDATES; j++) {
            __m256i cell;
            __m256 up = cell_of(v, &c[j], &cell);
            __m256 q = _mm256_blendv_ps(_mm256_permutevar8x32_ps(c[j].clo, cell),
                                        _mm256_permutevar8x32_ps(c[j].chi, cell), up);
            __m256 d = _mm256_sub_ps(v, q), e = _mm256_mul_ps(d, d);
            if (h) e = _mm256_mul_ps(hv, e);
            acc[j] = _mm256_add_ps(acc[j], e);
        }
    }
    for (int j = 0; j < CANDIDATES; j++) {
        float a[8];
        _mm256_storeu_ps(a, acc[j]);
        err[j] = sum8(a);
    }
}

/* The indices of a block whose group codes are e - j[k], into out[0..95]. */
AVX2 static inline void block_pack_avx2(const float *x, const q3_grid *g, int e, const int j[4], uint8_t *out) {
    __m256i w[3] = {_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256()};
    for (int g0 = 0; g0 < 4; g0++) {
        cand_v c = cand_load(g, e - j[g0]);
        for (int st = 8 * g0; st < 8 * g0 + 8; st++) {
            int bit = 3 * st, k = bit >> 5, off = bit & 31;
            __m256i cell;
            __m256 up = cell_of(_mm256_loadu_ps(x + 8 * st), &c, &cell);
            __m256i q = _mm256_sub_epi32(_mm256_permutevar8x32_epi32(c.cbase, cell), _mm256_castps_si256(up));
            w[k] = _mm256_or_si256(w[k], _mm256_sll_epi32(q, _mm_cvtsi32_si128(off)));
            if (off > 29) w[k + 1] = _mm256_or_si256(w[k + 1], _mm256_srl_epi32(q, _mm_cvtsi32_si128(32 - off)));
        }
    }
    for (int k = 0; k < 3; k++) _mm256_storeu_si256((__m256i *)(out + 32 * k), w[k]);
}
#endif

static inline int clamp_code(int c) { return c < -14 ? -14 : c > 255 ? 255 : c; }

/* The best scale code of one group (the lowest error, ties to the smaller code); `simd` selects the
 * AVX2 errors (x86-64). */
static inline __attribute__((always_inline)) int best_code(const float *x, const float *h, const q3_grid *g,
                                                           float amax, const int simd) {
    if (amax == 0.0f) return ZERO_CODE;
    int c0 = (int)floorf(8.0f * log2f(amax / g->lmax) + 0.5f) + 160;
    int code[CANDIDATES];
    float err[CANDIDATES];
    for (int k = 0; k < CANDIDATES; k++) code[k] = clamp_code(c0 - CAND_BELOW + k);
#if defined(__x86_64__)
    if (simd) group_errors_avx2(x, h, g, code, err);
    else
#endif
    {
        q3_cand c[CANDIDATES];
        for (int k = 0; k < CANDIDATES; k++) cand_init(&c[k], g, scale_of_code(code[k]));
        group_errors(x, h, c, err);
    }
    (void)simd;
    int best = c0;
    float best_err = INFINITY;
    for (int k = 0; k < CANDIDATES; k++) {
        int code = c0 - CAND_BELOW + k;
        if (code < -14 || code > 255) continue; /* codes the format lacks are not candidates */
        if (err[k] < best_err) best_err = err[k], best = code;
    }
    return clamp_code(best);
}

/* max |x| of a group; *bad is set when a value is not finite. */
static inline __attribute__((always_inline)) float group_absmax(const float *x, int *bad) {
    float m[8] = {0};
    int nf = 0;
    for (int k = 0; k < GROUP; k += 8)
        for (int l = 0; l < 8; l++) {
            float a = fabsf(x[k + l]);
            nf |= !(a <= FLT_MAX);
            m[l] = fmaxf(a, m[l]);
        }
    *bad |= nf;
    return fmaxf(fmaxf(fmaxf(m[0], m[1]), fmaxf(m[2], m[3])), fmaxf(fmaxf(m[4], m[5]), fmaxf(m[6], m[7])));
}

#if defined(__x86_64__)
/* (Not always_inline, like the other AVX2 helpers the portable quant_block names.) */
AVX2 static inline float group_absmax_avx2(const float *x, int *bad) {
    const __m256 sign = _mm256_set1_ps(-0.0f), big = _mm256_set1_ps(FLT_MAX);
    __m256 m = _mm256_setzero_ps(), nf = m;
    for (int k = 0; k < GROUP; k += 8) {
        __m256 a = _mm256_andnot_ps(sign, _mm256_loadu_ps(x + k));
        nf = _mm256_or_ps(nf, _mm256_cmp_ps(a, big, _CMP_NLE_UQ));
        m = _mm256_max_ps(m, a);
    }
    *bad |= _mm256_movemask_ps(nf);
    __m128 r = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    r = _mm_max_ps(r, _mm_movehl_ps(r, r));
    r = _mm_max_ss(r, _mm_movehdup_ps(r));
    return _mm_cvtss_f32(r);
}
#endif

/* One block of 256 values x (importance h or NULL) into 99 bytes; -1 for a non-finite value. */
static inline __attribute__((always_inline)) int quant_block(const float *x, const float *h, uint8_t *out,
                                                             const q3_grid *g, const int simd) {
    int c[4], e = ZERO_CODE, bad = 0;
    float amax[4];
    for (int k = 0; k < 4; k++) {
#if defined(__x86_64__)
        if (simd) {
            amax[k] = group_absmax_avx2(x + GROUP * k, &bad);
            continue;
        }
#endif
        amax[k] = group_absmax(x + GROUP * k, &bad);
    }
    if (bad) return -1;
    for (int k = 0; k < 4; k++) {
        c[k] = best_code(x + GROUP * k, h ? h + GROUP * k : NULL, g, amax[k], simd);
        if (c[k] > e) e = c[k];
    }
    if (e == ZERO_CODE) { /* all zero: e = 0 means scale 0 */
        memset(out, 0, FE_Q3_BYTES);
        return 0;
    }
    if (e < 1) e = 1;
    int j[4];
    for (int k = 0; k < 4; k++) {
        j[k] = e - c[k];
        if (j[k] > 15 || c[k] == ZERO_CODE) j[k] = 15;
    }
    out[96] = (uint8_t)e;
    out[97] = (uint8_t)(j[0] | j[1] << 4);
    out[98] = (uint8_t)(j[2] | j[3] << 4);
#if defined(__x86_64__)
    if (simd) {
        block_pack_avx2(x, g, e, j, out);
        return 0;
    }
#endif
    uint32_t w[3][8] = {{0}};
    for (int k = 0; k < 4; k++) {
        q3_cand cs;
        cand_init(&cs, g, scale_of_code(e - j[k]));
        group_pack(x, &cs, k, w);
    }
    for (int k = 0; k < 3; k++)
        for (int l = 0; l < 8; l++)
            for (int b = 0; b < 4; b++) out[32 * k + 4 * l + b] = (uint8_t)(w[k][l] >> (8 * b));
    return 0;
}

/* The sources: a block of 256 values of row r, block b, as floats in buf (or a pointer into src). */
enum { SRC_F32 = FE_Q3_SRC_F32, SRC_BF16 = FE_Q3_SRC_BF16, SRC_MXFP4 = FE_Q3_SRC_MXFP4 };

#if defined(__x86_64__)
/* The same values as source_block's loops (E2M1 * 2^(e-127), the sign applied after: the same bits). */
AVX2 static inline void bf16_block_avx2(const uint16_t *p, float *buf) {
    for (int i = 0; i < FE_Q3_BLOCK; i += 8) {
        __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(p + i)));
        _mm256_storeu_si256((__m256i *)(buf + i), _mm256_slli_epi32(v, 16));
    }
}

AVX2 static inline void mxfp4_block_avx2(const uint8_t *p, const uint8_t *sc, float *buf) {
    const __m256 mag = _mm256_setr_ps(0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f);
    const __m128i low4 = _mm_set1_epi8(15);
    const __m256i sign = _mm256_set1_epi32((int)0x80000000u);
    for (int gi = 0; gi < FE_Q3_BLOCK / 32; gi++) {
        union { uint32_t u; float f; } s = {sc[gi] ? (uint32_t)sc[gi] << 23 : 0x00400000u};
        __m256 sv = _mm256_set1_ps(s.f);
        __m128i b = _mm_loadu_si128((const __m128i *)(p + 16 * gi));
        __m128i lo = _mm_and_si128(b, low4), hi = _mm_and_si128(_mm_srli_epi16(b, 4), low4);
        __m128i n[2] = {_mm_unpacklo_epi8(lo, hi), _mm_unpackhi_epi8(lo, hi)};
        for (int q = 0; q < 4; q++) {
            __m128i part = (q & 1) ? _mm_srli_si128(n[q >> 1], 8) : n[q >> 1];
            __m256i nib = _mm256_cvtepu8_epi32(part);
            __m256 m = _mm256_mul_ps(_mm256_permutevar8x32_ps(mag, nib), sv);
            __m256 sg = _mm256_castsi256_ps(_mm256_and_si256(_mm256_slli_epi32(nib, 28), sign));
            _mm256_storeu_ps(buf + 32 * gi + 8 * q, _mm256_xor_ps(m, sg));
        }
    }
}
#endif

static inline __attribute__((always_inline)) const float *source_block(int kind, const void *src, const uint8_t *scales,
                                                                       int cols, int r, int b, float *buf,
                                                                       const int simd) {
    size_t i0 = (size_t)r * (size_t)cols + (size_t)FE_Q3_BLOCK * (size_t)b;
    if (kind == SRC_F32) return (const float *)src + i0;
#if defined(__x86_64__)
    if (simd && kind == SRC_BF16) return bf16_block_avx2((const uint16_t *)src + i0, buf), buf;
    if (simd) return mxfp4_block_avx2((const uint8_t *)src + i0 / 2, scales + i0 / 32, buf), buf;
#endif
    (void)simd;
    if (kind == SRC_BF16) {
        const uint16_t *p = (const uint16_t *)src + i0;
        for (int i = 0; i < FE_Q3_BLOCK; i++) {
            union { uint32_t u; float f; } v = {(uint32_t)p[i] << 16};
            buf[i] = v.f;
        }
        return buf;
    }
    static const float E2M1[16] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f,
                                   -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};
    const uint8_t *p = (const uint8_t *)src + i0 / 2, *sc = scales + i0 / 32;
    for (int gi = 0; gi < FE_Q3_BLOCK / 32; gi++) {
        /* 2^(e - 127), exact (E8M0 is a power of two; e = 0 is the subnormal 2^-127). */
        union { uint32_t u; float f; } s = {sc[gi] ? (uint32_t)sc[gi] << 23 : 0x00400000u};
        for (int i = 0; i < 16; i++) {
            buf[32 * gi + 2 * i] = E2M1[p[16 * gi + i] & 15] * s.f;
            buf[32 * gi + 2 * i + 1] = E2M1[p[16 * gi + i] >> 4] * s.f;
        }
    }
    return buf;
}

static inline __attribute__((always_inline)) int quant_rows_body(int kind, const void *src, const uint8_t *scales,
                                                                 int rows, int cols, const float *imp, uint8_t *dst,
                                                                 const int simd) {
    q3_grid g;
    grid_init(&g);
    float buf[FE_Q3_BLOCK];
    int nb = cols / FE_Q3_BLOCK;
    for (int r = 0; r < rows; r++)
        for (int b = 0; b < nb; b++) {
            const float *x = source_block(kind, src, scales, cols, r, b, buf, simd);
            uint8_t *out = dst + ((size_t)r * nb + b) * FE_Q3_BYTES;
            /* Two calls so that the common case compiles with h = NULL known. */
            if (imp ? quant_block(x, imp + FE_Q3_BLOCK * b, out, &g, simd) : quant_block(x, NULL, out, &g, simd))
                return -1;
        }
    return 0;
}

/* One copy per source kind and path, so each inner loop is specialised. */
#define ROWS_FN(name, kind, attr, simd)                                                                        \
    attr static int name(const void *src, const uint8_t *scales, int rows, int cols, const float *imp,           \
                         uint8_t *dst) {                                                                         \
        return quant_rows_body(kind, src, scales, rows, cols, imp, dst, simd);                                   \
    }
ROWS_FN(rows_f32, SRC_F32, , 0)
ROWS_FN(rows_bf16, SRC_BF16, , 0)
ROWS_FN(rows_mxfp4, SRC_MXFP4, , 0)
#if defined(__x86_64__)
ROWS_FN(rows_f32_avx2, SRC_F32, AVX2, 1)
ROWS_FN(rows_bf16_avx2, SRC_BF16, AVX2, 1)
ROWS_FN(rows_mxfp4_avx2, SRC_MXFP4, AVX2, 1)
#endif

typedef int (*rows_fn)(const void *, const uint8_t *, int, int, const float *, uint8_t *);

int fe_q3_quantize_impl(int impl, int kind, const void *src, const uint8_t *scales, int rows, int cols,
                        const float *imp, void *dst) {
    if (!src || !dst || rows < 0 || cols <= 0 || cols % FE_Q3_BLOCK || (kind == SRC_MXFP4 && !scales)) return -1;
    if (imp)
        for (int i = 0; i < cols; i++)
            if (!(imp[i] >= 0.0f) || !isfinite(imp[i])) return -1;
    static const rows_fn portable[3] = {rows_f32, rows_bf16, rows_mxfp4};
    rows_fn fn = portable[kind];
    (void)impl;
#if defined(__x86_64__)
    static const rows_fn avx2[3] = {rows_f32_avx2, rows_bf16_avx2, rows_mxfp4_avx2};
    if (impl == FE_KERNELS_AVX2 && fe_cpu_has_avx2()) fn = avx2[kind];
#endif
    q3_grid g;
    grid_init(&g);
    if (!g.ok) fn = portable[kind]; /* a grid the cells do not fit: only the compare path is exact */
    return fn(src, scales, rows, cols, imp, dst);
}

int ferry_q3_quantize_f32(const float *src, int rows, int cols, const float *importance, void *dst) {
    return fe_q3_quantize_impl(fe_kernels_best(), SRC_F32, src, NULL, rows, cols, importance, dst);
}

int ferry_q3_quantize_bf16(const uint16_t *src, int rows, int cols, const float *importance, void *dst) {
    return fe_q3_quantize_impl(fe_kernels_best(), SRC_BF16, src, NULL, rows, cols, importance, dst);
}

int ferry_q3_quantize_mxfp4(const uint8_t *packed, const uint8_t *scales, int rows, int cols,
                            const float *importance, void *dst) {
    return fe_q3_quantize_impl(fe_kernels_best(), SRC_MXFP4, packed, scales, rows, cols, importance, dst);
}

int ferry_q3_quantize(int impl, int source, const void *src, const uint8_t *mxfp4_scales, int rows, int cols,
                      const float *importance, void *dst) {
    if (!fe_kernels_get(impl) || source < FERRY_Q3_SOURCE_F32 || source > FERRY_Q3_SOURCE_MXFP4) return -1;
    return fe_q3_quantize_impl(impl, source, src, mxfp4_scales, rows, cols, importance, dst);
}
