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
 * bf16 sources are decoded one 256-value block at a time into a buffer on
 * the stack, inside the same loop. MXFP4 blocks whose scales keep every
 * product a normal float take tables instead (see "MXFP4 by tables" below):
 * the same comparisons and the same error terms, looked up per nibble; the
 * others are decoded like bf16. */
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

/* Index q of value 8 st + l into the lane words w[3][8] (3 bits at 3 st of lane l's 96). */
static inline __attribute__((always_inline)) void put3(uint32_t w[3][8], int st, int l, uint32_t q) {
    int bit = 3 * st, k = bit >> 5, off = bit & 31;
    w[k][l] |= q << off;
    if (off > 29) w[k + 1][l] |= q >> (32 - off);
}

static inline void store_words(const uint32_t w[3][8], uint8_t *out) {
    for (int k = 0; k < 3; k++)
        for (int l = 0; l < 8; l++)
            for (int b = 0; b < 4; b++) out[32 * k + 4 * l + b] = (uint8_t)(w[k][l] >> (8 * b));
}

/* The indices of one group at candidate c, packed into the lane words w[3][8]; g0 = group 0..3. */
static inline __attribute__((always_inline)) void group_pack(const float *x, const q3_cand *c, int g0,
                                                             uint32_t w[3][8]) {
    for (int st = 8 * g0; st < 8 * g0 + 8; st++)
        for (int l = 0; l < 8; l++) {
            float v = x[8 * st + l];
            uint32_t q = 0;
            for (int i = 0; i < 7; i++) q += v > c->ts[i];
            put3(w, st, l, q);
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

/* err[0..n-1] = sum8 of acc[0..n-1] (n <= 4), in sum8's order: ((a0 + a1) + (a2 + a3)) + ((a4 + a5) + (a6 + a7)). */
AVX2 static inline void sum8x4_avx2(const __m256 *acc, int n, float *err) {
    __m256 a = acc[0], b = acc[n > 1], c = acc[n > 2 ? 2 : 0], d = acc[n > 3 ? 3 : 0];
    __m256 q = _mm256_hadd_ps(_mm256_hadd_ps(a, b), _mm256_hadd_ps(c, d));
    float r[4];
    _mm_storeu_ps(r, _mm_add_ps(_mm256_castps256_ps128(q), _mm256_extractf128_ps(q, 1)));
    for (int i = 0; i < n; i++) err[i] = r[i];
}

AVX2 static inline void sum8_all_avx2(const __m256 *acc, float *err) {
    for (int j = 0; j < CANDIDATES; j += 4) sum8x4_avx2(acc + j, CANDIDATES - j < 4 ? CANDIDATES - j : 4, err + j);
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
    sum8_all_avx2(acc, err);
}

/* put3 for 8 lanes at once. */
AVX2 static inline void put3_avx2(__m256i w[3], int st, __m256i q) {
    int bit = 3 * st, k = bit >> 5, off = bit & 31;
    w[k] = _mm256_or_si256(w[k], _mm256_sll_epi32(q, _mm_cvtsi32_si128(off)));
    if (off > 29) w[k + 1] = _mm256_or_si256(w[k + 1], _mm256_srl_epi32(q, _mm_cvtsi32_si128(32 - off)));
}

/* The indices of a block whose group codes are e - j[k], into out[0..95]. */
AVX2 static inline void block_pack_avx2(const float *x, const q3_grid *g, int e, const int j[4], uint8_t *out) {
    __m256i w[3] = {_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256()};
    for (int g0 = 0; g0 < 4; g0++) {
        cand_v c = cand_load(g, e - j[g0]);
        for (int st = 8 * g0; st < 8 * g0 + 8; st++) {
            __m256i cell;
            __m256 up = cell_of(_mm256_loadu_ps(x + 8 * st), &c, &cell);
            put3_avx2(w, st, _mm256_sub_epi32(_mm256_permutevar8x32_epi32(c.cbase, cell), _mm256_castps_si256(up)));
        }
    }
    for (int k = 0; k < 3; k++) _mm256_storeu_si256((__m256i *)(out + 32 * k), w[k]);
}
#endif

static inline int clamp_code(int c) { return c < -14 ? -14 : c > 255 ? 255 : c; }

/* The code nearest to amax / max|grid| (amax > 0): the candidates are c0 - CAND_BELOW .. */
static inline int first_code(const q3_grid *g, float amax) {
    return (int)floorf(8.0f * log2f(amax / g->lmax) + 0.5f) + 160;
}

/* The candidate codes around c0, clamped to the format's codes. */
static inline void cand_codes(int c0, int code[CANDIDATES]) {
    for (int k = 0; k < CANDIDATES; k++) code[k] = clamp_code(c0 - CAND_BELOW + k);
}

/* The best of the candidates around c0 given their errors: the lowest, ties to the smaller code. */
static inline int pick_code(int c0, const float *err) {
    int best = c0;
    float best_err = INFINITY;
    for (int k = 0; k < CANDIDATES; k++) {
        int code = c0 - CAND_BELOW + k;
        if (code < -14 || code > 255) continue; /* codes the format lacks are not candidates */
        if (err[k] < best_err) best_err = err[k], best = code;
    }
    return clamp_code(best);
}

/* The best scale code of one group; `simd` selects the AVX2 errors (x86-64). */
static inline __attribute__((always_inline)) int best_code(const float *x, const float *h, const q3_grid *g,
                                                           float amax, const int simd) {
    if (amax == 0.0f) return ZERO_CODE;
    int code[CANDIDATES];
    float err[CANDIDATES];
    int c0 = first_code(g, amax);
    cand_codes(c0, code);
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
    return pick_code(c0, err);
}

/* The block's exponent byte e (>= 1) from its groups' codes c (ZERO_CODE: an all-zero group) and each
 * group's offset j (its code is e - j); 0 for an all-zero block. */
static inline int block_scales(const int c[4], int j[4]) {
    int e = ZERO_CODE;
    for (int k = 0; k < 4; k++)
        if (c[k] > e) e = c[k];
    if (e == ZERO_CODE) return 0;
    if (e < 1) e = 1;
    for (int k = 0; k < 4; k++) {
        j[k] = e - c[k];
        if (j[k] > 15 || c[k] == ZERO_CODE) j[k] = 15;
    }
    return e;
}

static inline void put_scales(uint8_t *out, int e, const int j[4]) {
    out[96] = (uint8_t)e;
    out[97] = (uint8_t)(j[0] | j[1] << 4);
    out[98] = (uint8_t)(j[2] | j[3] << 4);
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
    int c[4], e, bad = 0;
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
    for (int k = 0; k < 4; k++) c[k] = best_code(x + GROUP * k, h ? h + GROUP * k : NULL, g, amax[k], simd);
    int j[4];
    if (!(e = block_scales(c, j))) { /* all zero: e = 0 means scale 0 */
        memset(out, 0, FE_Q3_BYTES);
        return 0;
    }
    put_scales(out, e, j);
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
    store_words(w, out);
    return 0;
}

/* The sources: a block of 256 values of row r, block b, as floats in buf (or a pointer into src). */
enum { SRC_F32 = FE_Q3_SRC_F32, SRC_BF16 = FE_Q3_SRC_BF16, SRC_MXFP4 = FE_Q3_SRC_MXFP4 };

/* e2m1 by nibble (bit 3 the sign). */
static const float E2M1[16] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f,
                               -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

/* An E8M0 scale byte as the float 2^(e - 127), exact (e = 0 is the subnormal 2^-127). */
static inline float e8m0_scale(uint8_t e) {
    union { uint32_t u; float f; } s = {e ? (uint32_t)e << 23 : 0x00400000u};
    return s.f;
}

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
        __m256 sv = _mm256_set1_ps(e8m0_scale(sc[gi]));
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
    const uint8_t *p = (const uint8_t *)src + i0 / 2, *sc = scales + i0 / 32;
    for (int gi = 0; gi < FE_Q3_BLOCK / 32; gi++) {
        float s = e8m0_scale(sc[gi]);
        for (int i = 0; i < 16; i++) {
            buf[32 * gi + 2 * i] = E2M1[p[16 * gi + i] & 15] * s;
            buf[32 * gi + 2 * i + 1] = E2M1[p[16 * gi + i] >> 4] * s;
        }
    }
    return buf;
}

/* ---- MXFP4 by tables ----
 * An MXFP4 value is v = E2M1[n] 2^k (n its nibble, k = its scale byte - 127), and the scale of code c
 * is S(c) = S(c - 8k) 2^k exactly (scale_of_code). While every product stays a normal float, scaling by
 * 2^k commutes with float rounding, so v > thr S(c) exactly when E2M1[n] > thr S(c - 8k), and the
 * search's error term (v - grid S(c))^2 is (E2M1[n] - grid S(c - 8k))^2 2^2k, bit for bit. So for each
 * relative code d = c - 8k the nearest grid point's index and error of the 16 nibbles are tabulated once
 * per call; a block then costs lookups (AVX2: two vpermps and a blend per 8 values and candidate, the
 * error scaled by 2^2k in the table) instead of the search's arithmetic, and the errors are summed over
 * the same lanes in the same order: the same codes, the same indices, the same bytes. The scales
 * MX_KLO..MX_KHI keep every product normal (the smallest non-zero |v - grid S| is over 2^(k-33), its
 * square over 2^-126; no error exceeds 2^127); d stays in the tables unless a group's two scales are
 * more than ~2^3 apart or a 32-value half is all zero next to a much larger one. Any other block is
 * decoded to floats and quantized as before. */
#define MX_DLO 112
#define MX_ROWS 160
#define MX_KLO (-30)
#define MX_KHI 40

typedef struct {
    float err[MX_ROWS][16];  /* (E2M1[n] - nearest grid point * S(d))^2, d = MX_DLO + row */
    int32_t idx[MX_ROWS][16]; /* that grid point */
    int16_t c0[MX_KHI - MX_KLO + 1][8]; /* first_code of amax = E2M1[top] 2^k */
} mx_tables;

static inline float pow2i(int k) { /* 2^k, k in -126..127 */
    union { uint32_t u; float f; } p = {(uint32_t)(k + 127) << 23};
    return p.f;
}

static void mx_tables_init(mx_tables *t, const q3_grid *g) {
    for (int r = 0; r < MX_ROWS; r++) {
        q3_cand c;
        cand_init(&c, g, scale_of_code(MX_DLO + r));
        for (int n = 0; n < 16; n++) {
            float v = E2M1[n];
            int q = 0;
            for (int i = 0; i < 7; i++) q += v > c.ts[i];
            float d = v - c.ls[q];
            t->err[r][n] = d * d;
            t->idx[r][n] = q;
        }
    }
    for (int k = MX_KLO; k <= MX_KHI; k++)
        for (int top = 0; top < 8; top++)
            t->c0[k - MX_KLO][top] = (int16_t)(top ? first_code(g, E2M1[top] * pow2i(k)) : 0);
}

/* The errors err[j] of one group (nibbles nib[64], importance h or NULL) at the candidates whose table
 * rows are row[j][half] (half 0: values 0..31, scale 2^k0; half 1: 32..63), p2[half] = 2^2k. */
static inline __attribute__((always_inline)) void mx_errors(const uint8_t *nib, const float *h,
                                                            const float *row[CANDIDATES][2], const float p2[2],
                                                            float *err) {
    float tab[CANDIDATES][2][16], acc[CANDIDATES][8] = {{0}};
    for (int j = 0; j < CANDIDATES; j++)
        for (int half = 0; half < 2; half++)
            for (int n = 0; n < 16; n++) tab[j][half][n] = row[j][half][n] * p2[half];
    for (int k = 0; k < GROUP; k += 8)
        for (int l = 0; l < 8; l++) {
            int n = nib[k + l], half = k >= GROUP / 2;
            for (int j = 0; j < CANDIDATES; j++) {
                float e = tab[j][half][n];
                acc[j][l] += h ? h[k + l] * e : e;
            }
        }
    for (int j = 0; j < CANDIDATES; j++) err[j] = sum8(acc[j]);
}

#if defined(__x86_64__)
/* 16-entry lookups by the nibbles in n (bit 3 moved to the sign of neg): two permutes and a blend. */
AVX2 static inline __m256 lookup16_avx2(__m256 lo, __m256 hi, __m256i n, __m256 neg) {
    return _mm256_blendv_ps(_mm256_permutevar8x32_ps(lo, n), _mm256_permutevar8x32_ps(hi, n), neg);
}

AVX2 static inline __m256i nibbles8_avx2(const uint8_t *nib, __m256 *neg) {
    __m256i n = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)nib));
    *neg = _mm256_castsi256_ps(_mm256_slli_epi32(n, 28));
    return n;
}

AVX2 static inline __attribute__((flatten)) void mx_errors_avx2(const uint8_t *nib, const float *h,
                                                                const float *row[CANDIDATES][2], const float p2[2],
                                                                float *err) {
    __m256 acc[CANDIDATES];
    for (int j = 0; j < CANDIDATES; j++) acc[j] = _mm256_setzero_ps();
    for (int half = 0; half < 2; half++) {
        __m256 lo[CANDIDATES], hi[CANDIDATES], s = _mm256_set1_ps(p2[half]);
        for (int j = 0; j < CANDIDATES; j++) {
            lo[j] = _mm256_mul_ps(_mm256_loadu_ps(row[j][half]), s);
            hi[j] = _mm256_mul_ps(_mm256_loadu_ps(row[j][half] + 8), s);
        }
        for (int k = GROUP / 2 * half; k < GROUP / 2 * (half + 1); k += 8) {
            __m256 neg, hv = h ? _mm256_loadu_ps(h + k) : _mm256_setzero_ps();
            __m256i n = nibbles8_avx2(nib + k, &neg);
            for (int j = 0; j < CANDIDATES; j++) {
                __m256 e = lookup16_avx2(lo[j], hi[j], n, neg);
                if (h) e = _mm256_mul_ps(hv, e);
                acc[j] = _mm256_add_ps(acc[j], e);
            }
        }
    }
    sum8_all_avx2(acc, err);
}

/* The 256 nibbles of 128 packed bytes in value order (the low nibble first). */
AVX2 static inline void unpack_nibbles_avx2(const uint8_t *p, uint8_t *nib) {
    const __m128i low4 = _mm_set1_epi8(15);
    for (int i = 0; i < FE_Q3_BLOCK / 2; i += 16) {
        __m128i b = _mm_loadu_si128((const __m128i *)(p + i));
        __m128i lo = _mm_and_si128(b, low4), hi = _mm_and_si128(_mm_srli_epi16(b, 4), low4);
        _mm_storeu_si128((__m128i *)(nib + 2 * i), _mm_unpacklo_epi8(lo, hi));
        _mm_storeu_si128((__m128i *)(nib + 2 * i + 16), _mm_unpackhi_epi8(lo, hi));
    }
}

/* The largest magnitude (nibble & 7) of the 32 values in 16 packed bytes. */
AVX2 static inline int max_magnitude_avx2(const uint8_t *p) {
    const __m128i seven = _mm_set1_epi8(7);
    __m128i b = _mm_loadu_si128((const __m128i *)p);
    __m128i m = _mm_max_epu8(_mm_and_si128(b, seven), _mm_and_si128(_mm_srli_epi16(b, 4), seven));
    m = _mm_max_epu8(m, _mm_srli_si128(m, 8));
    m = _mm_max_epu8(m, _mm_srli_si128(m, 4));
    m = _mm_max_epu8(m, _mm_srli_si128(m, 2));
    m = _mm_max_epu8(m, _mm_srli_si128(m, 1));
    return _mm_cvtsi128_si32(m) & 0xFF;
}

/* The indices of a block, idx[m] the table row of 32-value part m, into out[0..95]. */
AVX2 static inline void mx_pack_avx2(const uint8_t *nib, const int32_t *const idx[8], uint8_t *out) {
    __m256i w[3] = {_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256()};
#pragma GCC unroll 32 /* constant word and shift per step: w stays in registers */
    for (int st = 0; st < 32; st++) {
        const int32_t *r = idx[st >> 2];
        __m256 neg;
        __m256i n = nibbles8_avx2(nib + 8 * st, &neg);
        __m256 q = lookup16_avx2(_mm256_castsi256_ps(_mm256_loadu_si256((const __m256i *)r)),
                                 _mm256_castsi256_ps(_mm256_loadu_si256((const __m256i *)(r + 8))), n, neg);
        put3_avx2(w, st, _mm256_castps_si256(q));
    }
    for (int k = 0; k < 3; k++) _mm256_storeu_si256((__m256i *)(out + 32 * k), w[k]);
}
#endif

/* One MXFP4 block (128 packed bytes p, 8 scale bytes sc, importance h or NULL) by the tables into out;
 * 0 when it has to take the float path instead (out untouched). */
static inline __attribute__((always_inline)) int mx_block(const uint8_t *p, const uint8_t *sc, const float *h,
                                                          uint8_t *out, const mx_tables *t, const int simd) {
    (void)simd;
    int k[8];
    for (int m = 0; m < 8; m++) {
        k[m] = (int)sc[m] - 127;
        if (k[m] < MX_KLO || k[m] > MX_KHI) return 0;
    }
    uint8_t nib[FE_Q3_BLOCK];
#if defined(__x86_64__)
    if (simd) unpack_nibbles_avx2(p, nib);
    else
#endif
        for (int i = 0; i < FE_Q3_BLOCK / 2; i++) nib[2 * i] = p[i] & 15, nib[2 * i + 1] = p[i] >> 4;
    /* max |v| of each 32 values: the largest magnitude nibble times the scale, as the float path's. */
    float part_max[8];
    int top[8];
    for (int m = 0; m < 8; m++) {
#if defined(__x86_64__)
        if (simd) top[m] = max_magnitude_avx2(p + 16 * m);
        else
#endif
        {
            uint8_t t8 = 0;
            for (int i = 0; i < 32; i++) t8 = (uint8_t)(nib[32 * m + i] & 7) > t8 ? (uint8_t)(nib[32 * m + i] & 7) : t8;
            top[m] = t8;
        }
        part_max[m] = E2M1[top[m]] * pow2i(k[m]);
    }
    int c[4];
    for (int g0 = 0; g0 < 4; g0++) {
        float amax = fmaxf(part_max[2 * g0], part_max[2 * g0 + 1]);
        if (amax == 0.0f) {
            c[g0] = ZERO_CODE;
            continue;
        }
        /* amax is one part's max, E2M1[top] 2^k: its c0 is tabulated from the same float */
        int m = part_max[2 * g0] >= part_max[2 * g0 + 1] ? 2 * g0 : 2 * g0 + 1;
        int code[CANDIDATES], c0 = t->c0[k[m] - MX_KLO][top[m]];
        cand_codes(c0, code);
        const float *row[CANDIDATES][2];
        float p2[2] = {pow2i(2 * k[2 * g0]), pow2i(2 * k[2 * g0 + 1])};
        for (int j = 0; j < CANDIDATES; j++)
            for (int half = 0; half < 2; half++) {
                int r = code[j] - 8 * k[2 * g0 + half] - MX_DLO;
                if (r < 0 || r >= MX_ROWS) return 0;
                row[j][half] = t->err[r];
            }
        float err[CANDIDATES];
        const uint8_t *gn = nib + GROUP * g0;
        const float *gh = h ? h + GROUP * g0 : NULL;
#if defined(__x86_64__)
        if (simd) mx_errors_avx2(gn, gh, row, p2, err);
        else
#endif
            mx_errors(gn, gh, row, p2, err);
        c[g0] = pick_code(c0, err);
    }
    int j[4], e = block_scales(c, j);
    if (!e) {
        memset(out, 0, FE_Q3_BYTES);
        return 1;
    }
    const int32_t *idx[8];
    for (int m = 0; m < 8; m++) {
        int r = e - j[m >> 1] - 8 * k[m] - MX_DLO;
        if (r < 0 || r >= MX_ROWS) return 0;
        idx[m] = t->idx[r];
    }
    put_scales(out, e, j);
#if defined(__x86_64__)
    if (simd) {
        mx_pack_avx2(nib, idx, out);
        return 1;
    }
#endif
    uint32_t w[3][8] = {{0}};
    for (int st = 0; st < 32; st++)
        for (int l = 0; l < 8; l++) put3(w, st, l, (uint32_t)idx[st >> 2][nib[8 * st + l]]);
    store_words(w, out);
    return 1;
}

static inline __attribute__((always_inline)) int quant_rows_body(int kind, const void *src, const uint8_t *scales,
                                                                 int rows, int cols, const float *imp, uint8_t *dst,
                                                                 const int simd) {
    q3_grid g;
    grid_init(&g);
    float buf[FE_Q3_BLOCK];
    int nb = cols / FE_Q3_BLOCK;
    mx_tables *t = NULL, tables;
    if (kind == SRC_MXFP4) mx_tables_init(t = &tables, &g);
    for (int r = 0; r < rows; r++)
        for (int b = 0; b < nb; b++) {
            uint8_t *out = dst + ((size_t)r * nb + b) * FE_Q3_BYTES;
            size_t i0 = (size_t)r * (size_t)cols + (size_t)FE_Q3_BLOCK * (size_t)b;
            if (t && (imp ? mx_block((const uint8_t *)src + i0 / 2, scales + i0 / 32, imp + FE_Q3_BLOCK * b, out, t,
                                     simd)
                          : mx_block((const uint8_t *)src + i0 / 2, scales + i0 / 32, NULL, out, t, simd)))
                continue;
            const float *x = source_block(kind, src, scales, cols, r, b, buf, simd);
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
