/* kernels_avx2.c — fused dequantize-and-dot row kernels for x86-64 with
 * AVX2 + FMA + F16C. Compiled with per-function target attributes, so the
 * extension still loads on x86-64 CPUs without AVX2; kernels.c only selects
 * this table when the CPU reports all three features.
 *
 * Every format is decoded 32 values at a time into four vectors w0..w3;
 * each token keeps four accumulators (w_j goes to accumulator j), tokens run
 * in pairs, and the four accumulators are summed ((a0+a1)+(a2+a3)) and then
 * across lanes in one fixed order. A token's arithmetic is therefore the
 * same whether it is computed alone or in a batch. */
#include "kernels.h"

#if defined(__x86_64__) || defined(_M_X64)
#include <cpuid.h>
#include <immintrin.h>
#include <math.h>

#include "kernels_avx2_util.h"
#include <string.h>

#define TGT __attribute__((target("avx2,fma,f16c")))
#define INL static inline __attribute__((always_inline, target("avx2,fma,f16c")))

/* AVX2, FMA and F16C from cpuid (clang 14 cannot ask __builtin_cpu_supports
 * about f16c), and the OS saving the AVX registers (OSXSAVE + XCR0). */
int fe_cpu_has_avx2(void) {
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return 0;
    int fma = (c >> 12) & 1, osxsave = (c >> 27) & 1, avx = (c >> 28) & 1, f16c = (c >> 29) & 1;
    if (!(fma && osxsave && avx && f16c)) return 0;
    unsigned lo, hi;
    __asm__("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    if ((lo & 6) != 6) return 0; /* XMM and YMM state enabled by the OS */
    if (__get_cpuid_max(0, NULL) < 7) return 0;
    __cpuid_count(7, 0, a, b, c, d);
    return (b >> 5) & 1; /* AVX2 */
}

/* Accumulators of a token pair. */
typedef struct { __m256 a0, a1, a2, a3, b0, b1, b2, b3; } acc2;

INL void acc_zero(acc2 *A) {
    A->a0 = A->a1 = A->a2 = A->a3 = A->b0 = A->b1 = A->b2 = A->b3 = _mm256_setzero_ps();
}

INL void acc_add(acc2 *A, const __m256 w[4], const float *xa, const float *xb, const int two) {
    if (two == FE_STORE) { /* xa is the widened row (kernels.h) */
        for (int k = 0; k < 4; k++) _mm256_storeu_ps((float *)xa + 8 * k, w[k]);
        return;
    }
    A->a0 = _mm256_fmadd_ps(w[0], _mm256_loadu_ps(xa), A->a0);
    A->a1 = _mm256_fmadd_ps(w[1], _mm256_loadu_ps(xa + 8), A->a1);
    A->a2 = _mm256_fmadd_ps(w[2], _mm256_loadu_ps(xa + 16), A->a2);
    A->a3 = _mm256_fmadd_ps(w[3], _mm256_loadu_ps(xa + 24), A->a3);
    if (two) {
        A->b0 = _mm256_fmadd_ps(w[0], _mm256_loadu_ps(xb), A->b0);
        A->b1 = _mm256_fmadd_ps(w[1], _mm256_loadu_ps(xb + 8), A->b1);
        A->b2 = _mm256_fmadd_ps(w[2], _mm256_loadu_ps(xb + 16), A->b2);
        A->b3 = _mm256_fmadd_ps(w[3], _mm256_loadu_ps(xb + 24), A->b3);
    }
}

INL void acc_done(const acc2 *A, float *ya, float *yb, const int two) {
    if (two == FE_STORE) return;
    *ya = hsum8(_mm256_add_ps(_mm256_add_ps(A->a0, A->a1), _mm256_add_ps(A->a2, A->a3)));
    if (two) *yb = hsum8(_mm256_add_ps(_mm256_add_ps(A->b0, A->b1), _mm256_add_ps(A->b2, A->b3)));
}

/* A partial chunk of a plain-float row: values and x padded with zeros. */
INL void acc_tail(acc2 *A, const float *wt, const float *xa, const float *xb, int m, const int two) {
    float xpa[32] = {0}, xpb[32] = {0};
    memcpy(xpa, xa, (size_t)m * 4);
    if (two) memcpy(xpb, xb, (size_t)m * 4);
    __m256 w[4] = {_mm256_loadu_ps(wt), _mm256_loadu_ps(wt + 8), _mm256_loadu_ps(wt + 16), _mm256_loadu_ps(wt + 24)};
    acc_add(A, w, xpa, xpb, two);
}

/* The per-format pair kernels: PAIR(name) defines name##_pair(row, cols, xa, xb, ya, yb, two). */
#define PAIR(name) INL void name##_pair(const uint8_t *row, int cols, const float *xa, const float *xb, float *ya, \
                                        float *yb, const int two)

PAIR(f32) {
    acc2 A;
    acc_zero(&A);
    const float *w = (const float *)row;
    int c = 0;
    for (; c + 32 <= cols; c += 32) {
        __m256 v[4] = {_mm256_loadu_ps(w + c), _mm256_loadu_ps(w + c + 8), _mm256_loadu_ps(w + c + 16),
                       _mm256_loadu_ps(w + c + 24)};
        acc_add(&A, v, xa + c, xb + c, two);
    }
    if (c < cols) {
        float wt[32] = {0};
        memcpy(wt, w + c, (size_t)(cols - c) * 4);
        acc_tail(&A, wt, xa + c, xb + c, cols - c, two);
    }
    acc_done(&A, ya, yb, two);
}

INL __m256 ld_f16(const uint8_t *p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)); }

PAIR(f16) {
    acc2 A;
    acc_zero(&A);
    int c = 0;
    for (; c + 32 <= cols; c += 32) {
        const uint8_t *p = row + 2 * c;
        __m256 v[4] = {ld_f16(p), ld_f16(p + 16), ld_f16(p + 32), ld_f16(p + 48)};
        acc_add(&A, v, xa + c, xb + c, two);
    }
    if (c < cols) {
        float wt[32] = {0};
        for (int i = c; i < cols; i++) wt[i - c] = f16_1(row + 2 * i);
        acc_tail(&A, wt, xa + c, xb + c, cols - c, two);
    }
    acc_done(&A, ya, yb, two);
}

INL __m256 ld_bf16(const uint8_t *p) {
    __m256i u = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(u, 16));
}

PAIR(bf16) {
    acc2 A;
    acc_zero(&A);
    int c = 0;
    for (; c + 32 <= cols; c += 32) {
        const uint8_t *p = row + 2 * c;
        __m256 v[4] = {ld_bf16(p), ld_bf16(p + 16), ld_bf16(p + 32), ld_bf16(p + 48)};
        acc_add(&A, v, xa + c, xb + c, two);
    }
    if (c < cols) {
        float wt[32] = {0};
        for (int i = c; i < cols; i++) wt[i - c] = fe_bf16_to_f32((uint16_t)(row[2 * i] | row[2 * i + 1] << 8));
        acc_tail(&A, wt, xa + c, xb + c, cols - c, two);
    }
    acc_done(&A, ya, yb, two);
}

INL __m256i u8x8(const uint8_t *p) { return _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p)); }

PAIR(q8_0) {
    acc2 A;
    acc_zero(&A);
    for (int b = 0; b < cols / 32; b++) {
        const uint8_t *p = row + 34 * b;
        __m256 d = _mm256_set1_ps(f16_1(p));
        __m256 v[4];
        for (int j = 0; j < 4; j++)
            v[j] = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(p + 2 + 8 * j)))));
        acc_add(&A, v, xa + 32 * b, xb + 32 * b, two);
    }
    acc_done(&A, ya, yb, two);
}

/* Nibbles of 16 bytes as four vectors of 8: low of 0-7, low of 8-15, high of 0-7, high of 8-15. */
INL void nibbles16(const uint8_t *q, __m256 out[4]) {
    const __m256i m = _mm256_set1_epi32(15);
    __m256i lo = u8x8(q), hi = u8x8(q + 8);
    out[0] = _mm256_cvtepi32_ps(_mm256_and_si256(lo, m));
    out[1] = _mm256_cvtepi32_ps(_mm256_and_si256(hi, m));
    out[2] = _mm256_cvtepi32_ps(_mm256_srli_epi32(lo, 4));
    out[3] = _mm256_cvtepi32_ps(_mm256_srli_epi32(hi, 4));
}

PAIR(q4_0) {
    acc2 A;
    acc_zero(&A);
    for (int b = 0; b < cols / 32; b++) {
        const uint8_t *p = row + 18 * b;
        float df = f16_1(p);
        __m256 d = _mm256_set1_ps(df), off = _mm256_set1_ps(-8.0f * df);
        __m256 v[4];
        nibbles16(p + 2, v);
        for (int j = 0; j < 4; j++) v[j] = _mm256_fmadd_ps(v[j], d, off);
        acc_add(&A, v, xa + 32 * b, xb + 32 * b, two);
    }
    acc_done(&A, ya, yb, two);
}

PAIR(q4_1) {
    acc2 A;
    acc_zero(&A);
    for (int b = 0; b < cols / 32; b++) {
        const uint8_t *p = row + 20 * b;
        __m256 d = _mm256_set1_ps(f16_1(p)), m = _mm256_set1_ps(f16_1(p + 2));
        __m256 v[4];
        nibbles16(p + 4, v);
        for (int j = 0; j < 4; j++) v[j] = _mm256_fmadd_ps(v[j], d, m);
        acc_add(&A, v, xa + 32 * b, xb + 32 * b, two);
    }
    acc_done(&A, ya, yb, two);
}

/* 32 bytes (signed, or unsigned when `uns`) widened to four vectors of 8
 * floats: bytes 0-7, 8-15, 16-23, 24-31. */
INL void bytes_f32(__m256i q, __m256 out[4], const int uns) {
    __m128i lo = _mm256_castsi256_si128(q), hi = _mm256_extracti128_si256(q, 1);
    __m128i part[4] = {lo, _mm_unpackhi_epi64(lo, lo), hi, _mm_unpackhi_epi64(hi, hi)};
    for (int k = 0; k < 4; k++)
        out[k] = _mm256_cvtepi32_ps(uns ? _mm256_cvtepu8_epi32(part[k]) : _mm256_cvtepi8_epi32(part[k]));
}

/* d * sc_j and -(dmin * m_j) for the eight sub-blocks j of a Q4_K/Q5_K
 * block at `p`, computed in two vectors (the products are those of the scalar
 * d * (float)sc, one rounding each) and stored for the loop's broadcasts. */
INL void k45_scales(const uint8_t *p, float ds[8], float ms[8]) {
    uint32_t sm[4];
    fe_q4k_scales_mins(p + 4, sm);
    const __m128i v = _mm_set_epi32((int)sm[3], (int)sm[2], (int)sm[1], (int)sm[0]);
    const __m256 sc = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v));
    const __m256 mn = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_unpackhi_epi64(v, v)));
    _mm256_storeu_ps(ds, _mm256_mul_ps(_mm256_set1_ps(f16_1(p)), sc));
    _mm256_storeu_ps(ms, _mm256_xor_ps(_mm256_mul_ps(_mm256_set1_ps(f16_1(p + 2)), mn), _mm256_set1_ps(-0.0f)));
}

/* Q4_K: sub-blocks j, j+1 of a block are the low and high nibbles of the
 * same 32 bytes; w = q * d * sc_j - dmin * m_j. The block's scales and mins
 * are unpacked all at once (k45_scales): unpacking them one sub-block at a
 * time in scalar code took about a third of the kernel's time. */
PAIR(q4_k) {
    acc2 A;
    acc_zero(&A);
    const __m256i m15 = _mm256_set1_epi32(15);
    for (int b = 0; b < cols / 256; b++) {
        const uint8_t *p = row + 144 * b, *q = p + 16;
        float ds[8], ms[8]; /* broadcast from memory: loads, not shuffles */
        k45_scales(p, ds, ms);
        const float *xa0 = xa + 256 * b, *xb0 = xb + 256 * b;
        for (int j = 0; j < 8; j += 2, q += 32) {
            __m256 d1 = _mm256_broadcast_ss(ds + j), m1 = _mm256_broadcast_ss(ms + j);
            __m256 d2 = _mm256_broadcast_ss(ds + j + 1), m2 = _mm256_broadcast_ss(ms + j + 1);
            __m256i r[4] = {u8x8(q), u8x8(q + 8), u8x8(q + 16), u8x8(q + 24)};
            __m256 v[4];
            for (int k = 0; k < 4; k++) v[k] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_and_si256(r[k], m15)), d1, m1);
            acc_add(&A, v, xa0 + 32 * j, xb0 + 32 * j, two);
            for (int k = 0; k < 4; k++) v[k] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(r[k], 4)), d2, m2);
            acc_add(&A, v, xa0 + 32 * j + 32, xb0 + 32 * j + 32, two);
        }
    }
    acc_done(&A, ya, yb, two);
}

/* Q5_K: Q4_K's nibbles plus a fifth bit, bit j of qh[l] for value 32j + l of
 * the block, put in place bytewise (a compare against the bit) for all 32
 * values of a sub-block at once. */
PAIR(q5_k) {
    acc2 A;
    acc_zero(&A);
    const __m256i m15 = _mm256_set1_epi8(15), m16 = _mm256_set1_epi8(16);
    for (int b = 0; b < cols / 256; b++) {
        const uint8_t *p = row + 176 * b, *q = p + 48;
        float ds[8], ms[8];
        k45_scales(p, ds, ms);
        const __m256i h = _mm256_loadu_si256((const __m256i *)(p + 16));
        const float *xa0 = xa + 256 * b, *xb0 = xb + 256 * b;
        for (int j = 0; j < 8; j += 2, q += 32) {
            __m256 d1 = _mm256_broadcast_ss(ds + j), m1 = _mm256_broadcast_ss(ms + j);
            __m256 d2 = _mm256_broadcast_ss(ds + j + 1), m2 = _mm256_broadcast_ss(ms + j + 1);
            const __m256i b1 = _mm256_set1_epi8((char)(1 << j)), b2 = _mm256_set1_epi8((char)(2 << j));
            const __m256i r = _mm256_loadu_si256((const __m256i *)q);
            __m256i lo = _mm256_or_si256(_mm256_and_si256(r, m15),
                                         _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(h, b1), b1), m16));
            __m256i hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(r, 4), m15),
                                         _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(h, b2), b2), m16));
            __m256 v[4];
            bytes_f32(lo, v, 1);
            for (int k = 0; k < 4; k++) v[k] = _mm256_fmadd_ps(v[k], d1, m1);
            acc_add(&A, v, xa0 + 32 * j, xb0 + 32 * j, two);
            bytes_f32(hi, v, 1);
            for (int k = 0; k < 4; k++) v[k] = _mm256_fmadd_ps(v[k], d2, m2);
            acc_add(&A, v, xa0 + 32 * j + 32, xb0 + 32 * j + 32, two);
        }
    }
    acc_done(&A, ya, yb, two);
}



/* Per half block (128 values): 64 bytes of low nibbles ql and 32 of high
 * bit pairs qh; value 32c + l (c < 4, l < 32) is nibble (c >> 1) of
 * ql[32 (c & 1) + l] with bits 2c, 2c+1 of qh[l] above it, minus 32, times
 * d * sc[2c + l / 16]. The 6-bit values of 32 values are built bytewise in
 * one register, then widened. */
PAIR(q6_k) {
    acc2 A;
    acc_zero(&A);
    const __m256i m15 = _mm256_set1_epi8(15), m48 = _mm256_set1_epi8(48), k32 = _mm256_set1_epi8(32);
    for (int b = 0; b < cols / 256; b++) {
        const uint8_t *p = row + 210 * b;
        float ds[16]; /* d * sc[i], all sixteen in two vectors, broadcast from memory */
        const __m256 d = _mm256_set1_ps(f16_1(p + 208));
        const __m128i sc16 = _mm_loadu_si128((const __m128i *)(p + 192));
        _mm256_storeu_ps(ds, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(sc16))));
        _mm256_storeu_ps(ds + 8, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_unpackhi_epi64(sc16, sc16)))));
        for (int half = 0; half < 2; half++) {
            const uint8_t *ql = p + 64 * half, *qh = p + 128 + 32 * half;
            const float *sc = ds + 8 * half;
            const int base = 256 * b + 128 * half;
            const __m256i l0 = _mm256_loadu_si256((const __m256i *)ql), l1 = _mm256_loadu_si256((const __m256i *)(ql + 32));
            const __m256i h = _mm256_loadu_si256((const __m256i *)qh);
            __m256i q[4];
            q[0] = _mm256_or_si256(_mm256_and_si256(l0, m15), _mm256_and_si256(_mm256_slli_epi16(h, 4), m48));
            q[1] = _mm256_or_si256(_mm256_and_si256(l1, m15), _mm256_and_si256(_mm256_slli_epi16(h, 2), m48));
            q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m15), _mm256_and_si256(h, m48));
            q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m15),
                                   _mm256_and_si256(_mm256_srli_epi16(h, 2), m48));
            for (int c = 0; c < 4; c++) {
                __m256 v[4];
                bytes_f32(_mm256_sub_epi8(q[c], k32), v, 0);
                const __m256 s0 = _mm256_broadcast_ss(sc + 2 * c), s1 = _mm256_broadcast_ss(sc + 2 * c + 1);
                v[0] = _mm256_mul_ps(s0, v[0]), v[1] = _mm256_mul_ps(s0, v[1]);
                v[2] = _mm256_mul_ps(s1, v[2]), v[3] = _mm256_mul_ps(s1, v[3]);
                acc_add(&A, v, xa + base + 32 * c, xb + base + 32 * c, two);
            }
        }
    }
    acc_done(&A, ya, yb, two);
}

/* q3_nl (formats.h): per 64-value group, the grid times the group scale is
 * one 8-float table; each index vector then costs a shift and a vpermps
 * (which reads only the low 3 bits of each lane). */
INL __m256i q3_field(__m256i w0, __m256i w1, __m256i w2, const int s) { return fe_q3_bits(w0, w1, w2, 3 * s, 3); }

PAIR(q3_nl) {
    acc2 A;
    acc_zero(&A);
    const __m256 grid = _mm256_loadu_ps(fe_q3_levels);
    for (int b = 0; b < cols / FE_Q3_BLOCK; b++) {
        const uint8_t *p = row + FE_Q3_BYTES * b;
        const float *xa0 = xa + FE_Q3_BLOCK * b, *xb0 = xb + FE_Q3_BLOCK * b;
        __m256i w0 = _mm256_loadu_si256((const __m256i *)p), w1 = _mm256_loadu_si256((const __m256i *)(p + 32)),
                w2 = _mm256_loadu_si256((const __m256i *)(p + 64));
        __m256 lut = grid;
        __m256 v[4];
#define Q3_CHUNK(c)                                                                                        \
    do {                                                                                                   \
        if (((c) & 1) == 0) lut = _mm256_mul_ps(grid, _mm256_set1_ps(fe_q3_group_scale(p, (c) >> 1)));     \
        v[0] = _mm256_permutevar8x32_ps(lut, q3_field(w0, w1, w2, 4 * (c)));                               \
        v[1] = _mm256_permutevar8x32_ps(lut, q3_field(w0, w1, w2, 4 * (c) + 1));                           \
        v[2] = _mm256_permutevar8x32_ps(lut, q3_field(w0, w1, w2, 4 * (c) + 2));                           \
        v[3] = _mm256_permutevar8x32_ps(lut, q3_field(w0, w1, w2, 4 * (c) + 3));                           \
        acc_add(&A, v, xa0 + 32 * (c), xb0 + 32 * (c), two);                                               \
    } while (0)
        Q3_CHUNK(0);
        Q3_CHUNK(1);
        Q3_CHUNK(2);
        Q3_CHUNK(3);
        Q3_CHUNK(4);
        Q3_CHUNK(5);
        Q3_CHUNK(6);
        Q3_CHUNK(7);
#undef Q3_CHUNK
    }
    acc_done(&A, ya, yb, two);
}

/* T tokens (x, x + xs, ...) against a row widened to f32 (cols a multiple
 * of 32: the tiled formats' blocks are 256): per token the operations of
 * acc_add / acc_done on the same values, with the
 * weight vector loaded once for the tile (12 accumulators for T = 3). */
INL void tile_avx2(const float *w, int cols, const float *x, size_t xs, float *y, size_t ys, const int T) {
    __m256 a[3][4];
    for (int t = 0; t < T; t++)
        for (int k = 0; k < 4; k++) a[t][k] = _mm256_setzero_ps();
    for (int c = 0; c + 32 <= cols; c += 32)
        for (int k = 0; k < 4; k++) {
            __m256 wv = _mm256_loadu_ps(w + c + 8 * k);
            for (int t = 0; t < T; t++)
                a[t][k] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x + (size_t)t * xs + c + 8 * k), a[t][k]);
        }
    for (int t = 0; t < T; t++)
        y[(size_t)t * ys] = hsum8(_mm256_add_ps(_mm256_add_ps(a[t][0], a[t][1]), _mm256_add_ps(a[t][2], a[t][3])));
}

TGT static void avx2_tiles(const float *w, int cols, const float *x, size_t xs, int n, float *y, size_t ys) {
    int t = 0;
    for (; t + 3 <= n; t += 3) tile_avx2(w, cols, x + (size_t)t * xs, xs, y + (size_t)t * ys, ys, 3);
    if (n - t == 2) tile_avx2(w, cols, x + (size_t)t * xs, xs, y + (size_t)t * ys, ys, 2);
    if (n - t == 1) tile_avx2(w, cols, x + (size_t)t * xs, xs, y + (size_t)t * ys, ys, 1);
}

/* Several rows widened to f32 (rows_tiles below, for rowsdot): R rows x T
 * tokens, one chain k of the four at a time, over columns [c0, c1). Each
 * chain gets exactly tile_avx2's FMAs in the same order (chains are
 * independent, so running them one after another changes no bit); the R
 * rows share each x load (tile_avx2 loads x once per FMA). A is the tile's
 * accumulators, [r][t][k], kept between column blocks. */
INL void rows_chain(const float *w, int cols, const float *x, size_t xs, const int R, const int T, int k, int c0,
                    int c1, __m256 *A) {
    __m256 a[3][4];
    for (int r = 0; r < R; r++)
        for (int t = 0; t < T; t++) a[r][t] = A[(r * 4 + t) * 4 + k];
    for (int c = c0 + 8 * k; c < c1; c += 32) {
        __m256 wv[3];
        for (int r = 0; r < R; r++) wv[r] = _mm256_loadu_ps(w + (size_t)r * cols + c);
        for (int t = 0; t < T; t++) {
            const __m256 xv = _mm256_loadu_ps(x + (size_t)t * xs + c);
            for (int r = 0; r < R; r++) a[r][t] = _mm256_fmadd_ps(wv[r], xv, a[r][t]);
        }
    }
    for (int r = 0; r < R; r++)
        for (int t = 0; t < T; t++) A[(r * 4 + t) * 4 + k] = a[r][t];
}

/* The four chains' sum, as acc_done's. */
INL float rows_sum(const __m256 *a) { return hsum8(_mm256_add_ps(_mm256_add_ps(a[0], a[1]), _mm256_add_ps(a[2], a[3]))); }

FE_ROWS_TILES(avx2, TGT, __m256, _mm256_setzero_ps())

/* Bit-identical to fe_dot_f32: lane l of the accumulator is its acc[l]
 * (multiply, then add: no FMA), the tail goes to lanes 0.. in order, then
 * ((a0 + a4) + (a1 + a5)) + ((a2 + a6) + (a3 + a7)). */
TGT static float dot_avx2(const float *a, const float *b, int n) {
    __m256 acc = _mm256_setzero_ps();
    int i = 0;
    for (; i + 8 <= n; i += 8) acc = _mm256_add_ps(acc, _mm256_mul_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i)));
    float l[8];
    _mm256_storeu_ps(l, acc);
    for (int k = 0; i < n; i++, k++) l[k] += a[i] * b[i];
    return ((l[0] + l[4]) + (l[1] + l[5])) + ((l[2] + l[6]) + (l[3] + l[7]));
}

/* Bit-identical to fe_axpy_f32. */
TGT static void axpy_avx2(float *y, float w, const float *x, int n) {
    const __m256 wv = _mm256_set1_ps(w);
    int i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_add_ps(_mm256_loadu_ps(y + i), _mm256_mul_ps(wv, _mm256_loadu_ps(x + i))));
    for (; i < n; i++) y[i] += w * x[i];
}

/* ------------------------------------------------------------- attention
 * The kernels of kernels.h's attention contract, bit-identical to
 * fe_att_scores_f32 / fe_att_wsum_f32 / fe_att_softmax: every output is its
 * own chain of fused multiply-adds in the reference's order, and a call
 * only chooses how many chains run side by side (enough to cover the FMA
 * latency: 8 ymm accumulators) and which loads they share. */
/* NQ queries x NT tiles of 16 positions (2 NQ NT <= 8 chains of 8 lanes):
 * per column, each tile's 16 values are loaded once for all the queries. */
INL void scores_tiles_avx2(const float *q, int hd, const float *t, float scale, float *out, size_t os,
                            const int NQ, const int NT) {
    __m256 a[8];
    const size_t ts = (size_t)hd * FE_KT;
#pragma GCC unroll 8
    for (int x = 0; x < 2 * NQ * NT; x++) a[x] = _mm256_setzero_ps();
    for (int c = 0; c < hd; c++) {
        const float *col = t + (size_t)c * FE_KT;
#pragma GCC unroll 4
        for (int j = 0; j < NT; j++) {
            __builtin_prefetch(col + (size_t)j * ts + 8 * FE_KT); /* 8 columns ahead (speed only) */
            const __m256 k0 = _mm256_loadu_ps(col + (size_t)j * ts), k1 = _mm256_loadu_ps(col + (size_t)j * ts + 8);
#pragma GCC unroll 4
            for (int r = 0; r < NQ; r++) {
                const __m256 qb = _mm256_broadcast_ss(q + (size_t)r * (size_t)hd + (size_t)c);
                a[(r * NT + j) * 2] = _mm256_fmadd_ps(qb, k0, a[(r * NT + j) * 2]);
                a[(r * NT + j) * 2 + 1] = _mm256_fmadd_ps(qb, k1, a[(r * NT + j) * 2 + 1]);
            }
        }
    }
    const __m256 sc = _mm256_set1_ps(scale);
#pragma GCC unroll 4
    for (int r = 0; r < NQ; r++)
#pragma GCC unroll 4
        for (int j = 0; j < NT; j++) {
            float *o = out + (size_t)r * os + (size_t)j * FE_KT;
            _mm256_storeu_ps(o, _mm256_mul_ps(a[(r * NT + j) * 2], sc));
            _mm256_storeu_ps(o + 8, _mm256_mul_ps(a[(r * NT + j) * 2 + 1], sc));
        }
}

/* How far ahead att_wsum's first column pass asks for the V rows. */
#define WSUM_AHEAD 32

/* Columns [c0, c0 + 8 CB) of NQ queries' weighted sums (NQ CB <= 8 chains):
 * each V row's columns loaded once for all the queries. */
INL void wsum_cols_avx2(float *out, const float *p, size_t ps, const float *v, size_t vs, int np, int hd, int c0,
                         const int NQ, const int CB) {
    __m256 a[8];
#pragma GCC unroll 8
    for (int x = 0; x < NQ * CB; x++) a[x] = _mm256_setzero_ps();
    const float *row = v + c0;
    for (int i = 0; i < np; i++, row += vs) {
        if (c0 == 0 && i + WSUM_AHEAD < np) /* the first pass: the whole row WSUM_AHEAD ahead (speed only) */
            for (int b = 0; b < hd; b += 16) __builtin_prefetch(row + WSUM_AHEAD * vs + b);
        __m256 w[4];
#pragma GCC unroll 4
        for (int r = 0; r < NQ; r++) w[r] = _mm256_broadcast_ss(p + (size_t)r * ps + (size_t)i);
#pragma GCC unroll 8
        for (int b = 0; b < CB; b++) {
            const __m256 x = _mm256_loadu_ps(row + 8 * b);
#pragma GCC unroll 4
            for (int r = 0; r < NQ; r++) a[r * CB + b] = _mm256_fmadd_ps(w[r], x, a[r * CB + b]);
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < NQ; r++)
#pragma GCC unroll 8
        for (int b = 0; b < CB; b++) _mm256_storeu_ps(out + (size_t)r * (size_t)hd + (size_t)c0 + 8 * (size_t)b, a[r * CB + b]);
}

FE_ATT_DRIVERS(avx2, TGT, 8, 8)

/* The same attention kernels in zmm registers, for CPUs with AVX-512
 * (fe_cpu_has_avx512): one vector is a whole K tile column (FE_KT = 16
 * positions) or 16 columns of a V row, and 32 registers hold up to 16
 * (scores) or 24 (weighted sums) chains side by side: the scores of up to
 * 16 queries (a prompt's block of tokens, each with its heads) per pass over
 * K, three queries' weighted sums in one pass over V. Every output is still
 * its own chain of fused multiply-adds in the reference's order: the same
 * bits as fe_att_scores_f32 / fe_att_wsum_f32 (and as the AVX2 ones).
 * Prompts of many tokens spend a growing share of their time here (each
 * token's attention reads its whole context). */
#define ISA5 "avx512f,avx512bw,avx512vl,avx2,fma,f16c"
#define TGT5 __attribute__((target(ISA5)))
#define INL5 static inline __attribute__((always_inline, target(ISA5)))
/* Accumulator chains side by side (of 32 zmm registers). */
#ifndef WSUM_CHAINS
#define WSUM_CHAINS 24
#endif

int fe_cpu_has_avx512(void) {
    unsigned a, b, c, d;
    if (!fe_cpu_has_avx2() || __get_cpuid_max(0, NULL) < 7) return 0;
    __cpuid_count(7, 0, a, b, c, d);
    if (!(((b >> 16) & 1) && ((b >> 30) & 1) && ((b >> 31) & 1))) return 0;
    unsigned lo, hi;
    __asm__("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    (void)hi;
    return (lo & 0xe6) == 0xe6; /* XMM, YMM, opmask and both ZMM halves */
}

/* NQ queries x NT tiles (NQ NT <= 16 chains): per column, each tile's 16
 * values are loaded once for all the queries (each query's value broadcast
 * from memory). */
INL5 void scores_tiles_avx512(const float *q, int hd, const float *t, float scale, float *out, size_t os,
                              const int NQ, const int NT) {
    __m512 a[16];
    const size_t ts = (size_t)hd * FE_KT;
#pragma GCC unroll 16
    for (int x = 0; x < NQ * NT; x++) a[x] = _mm512_setzero_ps();
    for (int c = 0; c < hd; c++) {
        const float *col = t + (size_t)c * FE_KT;
#pragma GCC unroll 2
        for (int j = 0; j < NT; j++) {
            __builtin_prefetch(col + (size_t)j * ts + 8 * FE_KT); /* 8 columns ahead (speed only) */
            const __m512 k = _mm512_loadu_ps(col + (size_t)j * ts);
#pragma GCC unroll 16
            for (int r = 0; r < NQ; r++)
                a[r * NT + j] = _mm512_fmadd_ps(_mm512_set1_ps(q[(size_t)r * (size_t)hd + (size_t)c]), k, a[r * NT + j]);
        }
    }
    const __m512 sc = _mm512_set1_ps(scale);
#pragma GCC unroll 16
    for (int r = 0; r < NQ; r++)
#pragma GCC unroll 2
        for (int j = 0; j < NT; j++)
            _mm512_storeu_ps(out + (size_t)r * os + (size_t)j * FE_KT, _mm512_mul_ps(a[r * NT + j], sc));
}

/* One pass of NQ = 5..16 queries over all tiles: two tiles at a time up to
 * 8 queries (beside their broadcasts), else one. */
INL5 void scores_q_avx512(const float *q, const float *kt, int hd, int tiles, float scale, float *out, size_t os,
                          const int NQ) {
    const int NT = NQ <= 8 ? 2 : 1;
    const size_t ts = (size_t)hd * FE_KT;
    int j = 0;
    for (; j + NT <= tiles; j += NT) scores_tiles_avx512(q, hd, kt + j * ts, scale, out + (size_t)j * FE_KT, os, NQ, NT);
    if (NT > 1)
        for (; j < tiles; j++) scores_tiles_avx512(q, hd, kt + j * ts, scale, out + (size_t)j * FE_KT, os, NQ, 1);
}

/* Up to SCORES_QUERIES queries a pass over K (a prompt's block of tokens
 * and heads: each K line loaded once for all of them); 4 or fewer (one
 * token's heads in decode) go through the AVX2 kernel, faster there
 * (measured: docs/bench-log/2026-12-06.md, session 17, h2). */
#define SCORES_QUERIES 16
#define SCORES_CASE(M) case M: scores_q_avx512(qr, kt, hd, tiles, scale, o, os, M); break;
TGT5 static void att_scores_avx512(const float *q, int nq, const float *kt, int hd, int nk, float scale, float *out,
                                   size_t os) {
    const int tiles = (nk + FE_KT - 1) / FE_KT;
    for (int r0 = 0; r0 < nq; r0 += SCORES_QUERIES) {
        const int m = nq - r0 < SCORES_QUERIES ? nq - r0 : SCORES_QUERIES;
        const float *qr = q + (size_t)r0 * (size_t)hd;
        float *o = out + (size_t)r0 * os;
        if (m <= 4) {
            att_scores_avx2(qr, m, kt, hd, nk, scale, o, os);
            continue;
        }
        switch (m) {
            SCORES_CASE(5) SCORES_CASE(6)
            SCORES_CASE(7) SCORES_CASE(8) SCORES_CASE(9) SCORES_CASE(10) SCORES_CASE(11) SCORES_CASE(12)
            SCORES_CASE(13) SCORES_CASE(14) SCORES_CASE(15) default: scores_q_avx512(qr, kt, hd, tiles, scale, o, os, 16);
        }
    }
}
#undef SCORES_CASE

/* Columns [c0, c0 + 16 CB) of NQ queries' weighted sums (NQ CB <= 24
 * chains): each V row's columns loaded once for all the queries. */
INL5 void wsum_cols_avx512(float *out, const float *p, size_t ps, const float *v, size_t vs, int np, int hd, int c0,
                           const int NQ, const int CB) {
    __m512 a[24];
#pragma GCC unroll 24
    for (int x = 0; x < NQ * CB; x++) a[x] = _mm512_setzero_ps();
    const float *row = v + c0;
    for (int i = 0; i < np; i++, row += vs) {
        if (c0 == 0 && i + WSUM_AHEAD < np) /* the first pass: the whole row WSUM_AHEAD ahead (speed only) */
            for (int b = 0; b < hd; b += 16) __builtin_prefetch(row + WSUM_AHEAD * vs + b);
        __m512 w[4];
#pragma GCC unroll 4
        for (int r = 0; r < NQ; r++) w[r] = _mm512_set1_ps(p[(size_t)r * ps + (size_t)i]);
#pragma GCC unroll 8
        for (int b = 0; b < CB; b++) {
            const __m512 x = _mm512_loadu_ps(row + 16 * b);
#pragma GCC unroll 4
            for (int r = 0; r < NQ; r++) a[r * CB + b] = _mm512_fmadd_ps(w[r], x, a[r * CB + b]);
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < NQ; r++)
#pragma GCC unroll 8
        for (int b = 0; b < CB; b++) _mm512_storeu_ps(out + (size_t)r * (size_t)hd + (size_t)c0 + 16 * (size_t)b, a[r * CB + b]);
}

/* NQ queries' weighted sums: passes of up to WSUM_CHAINS / NQ vectors of
 * columns (8, 6, 4, 2, 1 at a time: up to three queries' 128 columns in one
 * pass over V), the last hd % 16 columns in the AVX2 kernel (the same bits,
 * kernels.h). */
INL5 void wsum_q_avx512(float *out, const float *p, size_t ps, const float *v, size_t vs, int np, int hd,
                        const int NQ) {
    const int CB = WSUM_CHAINS / NQ;
    int c = 0;
    if (CB >= 8)
        for (; c + 16 * 8 <= hd; c += 16 * 8) wsum_cols_avx512(out, p, ps, v, vs, np, hd, c, NQ, 8);
    if (CB >= 6)
        for (; c + 16 * 6 <= hd; c += 16 * 6) wsum_cols_avx512(out, p, ps, v, vs, np, hd, c, NQ, 6);
    if (CB >= 4)
        for (; c + 16 * 4 <= hd; c += 16 * 4) wsum_cols_avx512(out, p, ps, v, vs, np, hd, c, NQ, 4);
    for (; c + 16 * 2 <= hd; c += 16 * 2) wsum_cols_avx512(out, p, ps, v, vs, np, hd, c, NQ, 2);
    for (; c + 16 <= hd; c += 16) wsum_cols_avx512(out, p, ps, v, vs, np, hd, c, NQ, 1);
    if (c < hd) { /* the rest through the AVX2 kernel's column passes: the same chains */
        float tail[FE_ATT_Q * 16];
        const int rest = hd - c;
        att_wsum_avx2(tail, NQ, p, ps, v + c, vs, np, rest);
        for (int r = 0; r < NQ; r++)
            memcpy(out + (size_t)r * (size_t)hd + (size_t)c, tail + (size_t)r * (size_t)rest, sizeof(float) * (size_t)rest);
    }
}

TGT5 static void att_wsum_avx512(float *out, int nq, const float *p, size_t ps, const float *v, size_t vs, int np,
                                 int hd) {
    for (int r0 = 0; r0 < nq; r0 += FE_ATT_Q) {
        const int m = nq - r0 < FE_ATT_Q ? nq - r0 : FE_ATT_Q;
        float *o = out + (size_t)r0 * (size_t)hd;
        const float *pr = p + (size_t)r0 * ps;
        if (m == 4) wsum_q_avx512(o, pr, ps, v, vs, np, hd, 4);
        else if (m == 3) wsum_q_avx512(o, pr, ps, v, vs, np, hd, 3);
        else if (m == 2) wsum_q_avx512(o, pr, ps, v, vs, np, hd, 2);
        else wsum_q_avx512(o, pr, ps, v, vs, np, hd, 1);
    }
}

/* e^x for x <= 0 (arguments below -87.3 as -87.3): x = n ln2 + r with
 * |r| <= ln2/2 (ln2 in two parts), e^r by a degree-6 polynomial (the
 * classic single-precision minimax coefficients), times 2^n built in the
 * exponent bits. The NEON version is the same operations. */
static inline __attribute__((always_inline, target("avx2,fma,f16c"))) __m256 exp_avx2(__m256 x) {
    x = _mm256_max_ps(x, _mm256_set1_ps(-87.33654f));
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

/* e^d, or 0 where d < FE_ATT_CUT (fe_att_softmax). */
INL __m256 exp_cut_avx2(__m256 d) {
    return _mm256_and_ps(exp_avx2(d), _mm256_cmp_ps(d, _mm256_set1_ps(FE_ATT_CUT), _CMP_GE_OQ));
}

/* fe_att_softmax: sums s_0..7 in one register and s_8..15 in another. */
TGT static void att_softmax_avx2(float *x, int n) {
    if (n <= 0) return;
    int i = 0;
    __m256 mv = _mm256_set1_ps(x[0]);
    for (; i + 8 <= n; i += 8) mv = _mm256_max_ps(mv, _mm256_loadu_ps(x + i));
    float ml[8], m = x[0];
    _mm256_storeu_ps(ml, mv);
    for (int l = 0; l < 8; l++) m = ml[l] > m ? ml[l] : m;
    for (; i < n; i++) m = x[i] > m ? x[i] : m;
    const __m256 m8 = _mm256_set1_ps(m);
    __m256 s0 = _mm256_setzero_ps(), s1 = s0;
    for (i = 0; i + 16 <= n; i += 16) {
        const __m256 e0 = exp_cut_avx2(_mm256_sub_ps(_mm256_loadu_ps(x + i), m8));
        const __m256 e1 = exp_cut_avx2(_mm256_sub_ps(_mm256_loadu_ps(x + i + 8), m8));
        _mm256_storeu_ps(x + i, e0);
        _mm256_storeu_ps(x + i + 8, e1);
        s0 = _mm256_add_ps(s0, e0);
        s1 = _mm256_add_ps(s1, e1);
    }
    if (i < n) { /* the tail through the same exp; the lanes past n add +0, which changes no sum */
        float t[16];
        for (int l = 0; l < 16; l++) t[l] = i + l < n ? x[i + l] : m;
        __m256 e0 = exp_cut_avx2(_mm256_sub_ps(_mm256_loadu_ps(t), m8));
        __m256 e1 = exp_cut_avx2(_mm256_sub_ps(_mm256_loadu_ps(t + 8), m8));
        const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), left = _mm256_set1_epi32(n - i);
        e0 = _mm256_and_ps(e0, _mm256_castsi256_ps(_mm256_cmpgt_epi32(left, lane)));
        e1 = _mm256_and_ps(e1, _mm256_castsi256_ps(_mm256_cmpgt_epi32(left, _mm256_add_epi32(lane, _mm256_set1_epi32(8)))));
        s0 = _mm256_add_ps(s0, e0);
        s1 = _mm256_add_ps(s1, e1);
        _mm256_storeu_ps(t, e0);
        _mm256_storeu_ps(t + 8, e1);
        for (int l = 0; i + l < n; l++) x[i + l] = t[l];
    }
    const __m256 h = _mm256_add_ps(s0, s1);                                                 /* s_l + s_l+8 */
    const __m128 a = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1)); /* a_l, l < 4 */
    const __m128 c = _mm_add_ps(a, _mm_movehl_ps(a, a));                                  /* a0 + a2, a1 + a3 */
    const float inv = 1.0f / _mm_cvtss_f32(_mm_add_ss(c, _mm_shuffle_ps(c, c, _MM_SHUFFLE(1, 1, 1, 1))));
    const __m256 iv = _mm256_set1_ps(inv);
    for (i = 0; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), iv));
    for (; i < n; i++) x[i] *= inv;
}

FE_SIMD_KERNELS_ROWS(AVX2_TABLE, avx2, TGT);

/* The AVX2 set with the zmm attention kernels (the same bits), for CPUs with AVX-512. */
static const fe_kernels AVX2_TABLE_ZMM_ATTENTION = {
    "avx2", FE_PER_FORMAT(rowdot, avx2), dot_avx2, axpy_avx2, att_scores_avx512, att_wsum_avx512,
    att_softmax_avx2, FE_PER_FORMAT(rowsdot, avx2)};

const fe_kernels *fe_kernels_avx2_table(void) {
    return fe_cpu_has_avx512() ? &AVX2_TABLE_ZMM_ATTENTION : &AVX2_TABLE;
}
const fe_kernels *fe_kernels_avx2_ymm_table(void) { return &AVX2_TABLE; }

TGT static uint64_t read_avx2(const void *p, size_t nbytes, int reps, int streams) {
    __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
    size_t per = nbytes / (size_t)streams / 128 * 128;
    for (int r = 0; r < reps; r++)
        for (size_t off = 0; off < per; off += 128)
            for (int s = 0; s < streams; s++) {
                const __m256i *v = (const __m256i *)((const uint8_t *)p + (size_t)s * per + off);
                a0 = _mm256_xor_si256(a0, _mm256_loadu_si256(v));
                a1 = _mm256_xor_si256(a1, _mm256_loadu_si256(v + 1));
                a2 = _mm256_xor_si256(a2, _mm256_loadu_si256(v + 2));
                a3 = _mm256_xor_si256(a3, _mm256_loadu_si256(v + 3));
            }
    __m256i s = _mm256_xor_si256(_mm256_xor_si256(a0, a1), _mm256_xor_si256(a2, a3));
    uint64_t out[4];
    _mm256_storeu_si256((__m256i *)out, s);
    return out[0] ^ out[1] ^ out[2] ^ out[3];
}

uint64_t fe_memory_read_simd(const void *p, size_t nbytes, int reps, int streams) {
    return fe_cpu_has_avx2() ? read_avx2(p, nbytes, reps, streams) : 0;
}

#else /* not x86-64 */

int fe_cpu_has_avx2(void) { return 0; }
int fe_cpu_has_avx512(void) { return 0; }
const fe_kernels *fe_kernels_avx2_table(void) { return 0; }
const fe_kernels *fe_kernels_avx2_ymm_table(void) { return 0; }
uint64_t fe_memory_read_simd(const void *p, size_t nbytes, int reps, int streams) {
    (void)p, (void)nbytes, (void)reps, (void)streams;
    return 0;
}

#endif
