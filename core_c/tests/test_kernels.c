/* test_kernels.c — every built-in SIMD kernel against the scalar reference.
 *
 *   cc -std=c11 -O2 -Iinclude src/formats.c src/kernels*.c src/quant3.c tests/test_kernels.c -lm
 *
 * For each format and implementation: random rows of awkward sizes, token
 * counts 1..9, 16 and 33. Checks (1) each result is within TOL * sum|w_i x_i| of the
 * scalar reference (the SIMD kernels sum in another order and fuse
 * multiply-adds), (2) every token's result in a batch is bit-identical to the
 * same token computed alone (batches run in pairs or in tiles of 3-4 tokens
 * over the widened row, kernels.h, so n = 1..9 covers every remainder),
 * (3) the q3_nl quantizer round-trips. Prints
 * "N passed, M failed" last and exits nonzero on any failure. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../include/ferry_kernels.h"
#include "../src/formats.h"
#include "../src/kernels.h"

#define TOL 1e-5

static int passed, failed;
static uint64_t rng_state = 0x9E3779B97F4A7C15ull;

static uint32_t rnd(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 16);
}
static float frand(void) { return (float)rnd() / 4294967296.0f * 2.0f - 1.0f; } /* [-1, 1) roughly */

static void check(int ok, const char *what) {
    if (ok) {
        passed++;
    } else {
        failed++;
        printf("FAIL %s\n", what);
    }
}

static uint16_t f16_bits(float f) { /* normal range, truncating: good enough for test scales */
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t sign = (u >> 16) & 0x8000u;
    int e = (int)((u >> 23) & 0xFF) - 127 + 15;
    if (e <= 0) return (uint16_t)sign;
    return (uint16_t)(sign | (uint32_t)e << 10 | ((u >> 13) & 0x3FF));
}
static void put16(uint8_t *p, uint16_t v) { p[0] = (uint8_t)v, p[1] = (uint8_t)(v >> 8); }

/* A random row: random bytes, with every scale field made finite and sane. */
static void random_row(int fmt, uint8_t *row, int cols) {
    uint64_t nb = fe_row_bytes(fmt, (uint64_t)cols);
    for (uint64_t i = 0; i < nb; i++) row[i] = (uint8_t)rnd();
    const fe_format_info *f = fe_format_get(fmt);
    int blocks = cols / f->block_elems;
    for (int b = 0; b < blocks; b++) {
        uint8_t *p = row + (size_t)b * (size_t)f->block_bytes;
        switch (fmt) {
        case FE_F32: { float v = frand(); memcpy(p, &v, 4); } break;
        case FE_F16: put16(p, f16_bits(frand())); break;
        case FE_BF16: { float v = frand(); uint32_t u; memcpy(&u, &v, 4); put16(p, (uint16_t)(u >> 16)); } break;
        case FE_Q8_0: case FE_Q4_0: put16(p, f16_bits(0.01f + 0.1f * fabsf(frand()))); break;
        case FE_Q4_1: case FE_Q4_K: case FE_Q5_K:
            put16(p, f16_bits(0.01f + 0.1f * fabsf(frand())));
            put16(p + 2, f16_bits(0.05f * frand()));
            break;
        case FE_Q6_K: put16(p + 208, f16_bits(0.001f + 0.01f * fabsf(frand()))); break;
        case FE_Q3_NL: p[96] = (uint8_t)(b % 7 == 3 ? 0 : 120 + rnd() % 60); break;
        case FE_Q2_VQ: p[64] = (uint8_t)(b % 7 == 3 ? 0 : 120 + rnd() % 60); break;
        case FE_IQ4_XS: put16(p, f16_bits(b % 7 == 3 ? 0.0f : 0.0005f + 0.003f * fabsf(frand()))); break;
        default: break;
        }
    }
}

static void test_format(int fmt, int impl, int cols, int n) {
    const fe_format_info *f = fe_format_get(fmt);
    const int rows = 29; /* rowsdot calls of 12, 12 and 5 rows: groups of 3 and a rest of 2 */
    uint64_t rb = fe_row_bytes(fmt, (uint64_t)cols);
    uint8_t *w = malloc(rb * rows);
    float *x = malloc(sizeof(float) * (size_t)cols * (size_t)n);
    float *dq = malloc(sizeof(float) * (size_t)cols);
    float *ref = malloc(sizeof(float) * (size_t)rows * (size_t)n), *got = malloc(sizeof(float) * (size_t)rows * (size_t)n);
    float one[29];
    for (int r = 0; r < rows; r++) random_row(fmt, w + r * rb, cols);
    for (int i = 0; i < cols * n; i++) x[i] = frand() * (i % 17 == 0 ? 8.0f : 1.0f);
    char what[160];
    snprintf(what, sizeof what, "%s impl=%s cols=%d n=%d", f->name, ferry_kernels_name(impl), cols, n);
    check(ferry_kernel_matmul(FERRY_KERNELS_SCALAR, fmt, w, rows, cols, x, n, ref) == 0, what);
    check(ferry_kernel_matmul(impl, fmt, w, rows, cols, x, n, got) == 0, what);
    int ok = 1;
    double worst = 0;
    for (int r = 0; r < rows; r++) {
        fe_dequant_row(fmt, w + r * rb, dq, cols);
        for (int t = 0; t < n; t++) {
            double mag = 0;
            for (int i = 0; i < cols; i++) mag += fabs((double)dq[i] * x[(size_t)t * cols + i]);
            double diff = fabs((double)got[(size_t)t * rows + r] - ref[(size_t)t * rows + r]);
            if (!(diff <= TOL * mag + 1e-30)) ok = 0;
            if (mag > 0 && diff / mag > worst) worst = diff / mag;
        }
    }
    if (!ok) printf("  worst |simd - scalar| / sum|wx| = %.3g\n", worst);
    check(ok, what);
    /* Batch invariance: token t alone gives the same bits as within the batch. */
    int same = 1;
    for (int t = 0; t < n; t++) {
        ferry_kernel_matmul(impl, fmt, w, rows, cols, x + (size_t)t * cols, 1, one);
        for (int r = 0; r < rows; r++) same &= memcmp(&one[r], &got[(size_t)t * rows + r], 4) == 0;
    }
    snprintf(what, sizeof what, "%s impl=%s cols=%d n=%d batch bit-identical", f->name, ferry_kernels_name(impl), cols, n);
    check(same, what);
    free(w), free(x), free(dq), free(ref), free(got);
}

static void test_quantizer(void) {
    const int rows = 7, cols = 512;
    float *src = malloc(sizeof(float) * rows * cols), *back = malloc(sizeof(float) * rows * cols);
    uint8_t *q = malloc((size_t)rows * cols / 256 * 99);
    double num = 0, den = 0;
    for (int i = 0; i < rows * cols; i++) {
        float g = frand() + frand() + frand(); /* roughly bell-shaped */
        src[i] = (i / cols == 3) ? 0.0f : 0.02f * g;
    }
    check(ferry_q3_quantize_f32(src, rows, cols, NULL, q) == 0, "q3 quantize");
    check(ferry_dequantize(FE_Q3_NL, q, rows, cols, back) == 0, "q3 dequantize");
    for (int i = 0; i < rows * cols; i++) num += (double)(src[i] - back[i]) * (src[i] - back[i]), den += (double)src[i] * src[i];
    printf("q3_nl round trip: relative error %.4f\n", sqrt(num / den));
    check(sqrt(num / den) < 0.21, "q3 round trip error < 0.21");
    int zero = 1;
    for (int i = 3 * cols; i < 4 * cols; i++) zero &= back[i] == 0.0f;
    check(zero, "q3 all-zero row stays zero");
    src[5] = NAN;
    check(ferry_q3_quantize_f32(src, rows, cols, NULL, q) == -1, "q3 refuses NaN");
    check(ferry_q3_quantize_f32(src, rows, 100, NULL, q) == -1, "q3 refuses cols % 256");
    src[5] = 0.0f;
    check(ferry_q3_quantize(FERRY_KERNELS_SCALAR, FERRY_Q3_SOURCE_F32, src, NULL, rows, cols, NULL, q) == 0,
          "q3 with a named implementation");
    check(ferry_q3_quantize(FERRY_KERNELS_SCALAR, 7, src, NULL, rows, cols, NULL, q) == -1, "q3 refuses a bad source");
    for (int impl = 0; impl < 3; impl++)
        if (!ferry_kernels_available(impl))
            check(ferry_q3_quantize(impl, FERRY_Q3_SOURCE_F32, src, NULL, rows, cols, NULL, q) == -1,
                  "q3 refuses an implementation this CPU cannot run");
    free(src), free(back), free(q);
}

/* The portable and AVX2 quantizers give the same bytes, from every source kind, with and without
 * importance, on heavy-tailed values with zero groups and huge / tiny magnitudes. */
static void test_quantizer_paths(void) {
    check(fe_q3_cells_ok(), "q3 grid midpoints sit inside the AVX2 cells");
    const int rows = 9, cols = 768, nq = rows * cols / 256 * 99;
    float *src = malloc(sizeof(float) * rows * cols), imp[768];
    uint16_t *bf = malloc(2 * (size_t)rows * cols);
    uint8_t *packed = malloc((size_t)rows * cols / 2), *scales = malloc((size_t)rows * cols / 32);
    uint8_t *a = malloc(nq), *b = malloc(nq);
    for (int i = 0; i < rows * cols; i++) {
        float u = frand(), t = u / (1.02f - fabsf(frand())); /* heavy-tailed */
        int r = i / cols;
        src[i] = r == 2 && i % cols < 64 ? 0.0f : t * (r == 5 ? 3e3f : r == 6 ? 1e-6f : 0.02f);
        uint32_t bits;
        memcpy(&bits, &src[i], 4);
        bf[i] = (uint16_t)(bits >> 16);
    }
    for (int i = 0; i < cols; i++) imp[i] = 0.1f + fabsf(frand()) * 4.0f;
    for (int i = 0; i < rows * cols / 2; i++) packed[i] = (uint8_t)rnd();
    for (int i = 0; i < rows * cols / 32; i++) scales[i] = (uint8_t)(100 + rnd() % 40);
    int impls[2] = {FE_KERNELS_SCALAR, FE_KERNELS_AVX2};
    for (int kind = 0; kind < 3; kind++)
        for (int wi = 0; wi < 2; wi++) {
            const void *p = kind == FE_Q3_SRC_F32 ? (const void *)src : kind == FE_Q3_SRC_BF16 ? (const void *)bf
                                                                                                : (const void *)packed;
            uint8_t *out[2] = {a, b};
            for (int k = 0; k < 2; k++) {
                memset(out[k], 0xAB, nq);
                check(fe_q3_quantize_impl(impls[k], kind, p, scales, rows, cols, wi ? imp : NULL, out[k]) == 0,
                      "q3 quantize (path test)");
            }
            char what[96];
            snprintf(what, sizeof what, "q3 portable and avx2 quantizers agree (source %d, importance %d)", kind, wi);
            check(memcmp(a, b, nq) == 0, what);
        }
    scales[3] = 255; /* E8M0 NaN */
    check(fe_q3_quantize_impl(FE_KERNELS_AVX2, FE_Q3_SRC_MXFP4, packed, scales, rows, cols, NULL, a) == -1,
          "q3 refuses an MXFP4 NaN scale");
    check(fe_q3_quantize_impl(FE_KERNELS_SCALAR, FE_Q3_SRC_MXFP4, packed, scales, rows, cols, NULL, a) == -1,
          "q3 refuses an MXFP4 NaN scale (portable)");
    free(src), free(bf), free(packed), free(scales), free(a), free(b);
}

/* MXFP4 blocks go through tables (quant3.c, "MXFP4 by tables") when their scales allow, else through
 * floats: either way the bytes must be those of the same values given as floats, on both paths. Scales
 * spread wide (subnormal to overflowing products, neighbours far apart), narrow (every block by
 * tables), all-zero and -0 halves next to large ones, every nibble. */
static void test_quantizer_mxfp4_tables(void) {
    static const float E2M1[16] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6, -0.0f, -0.5f, -1, -1.5f, -2, -3, -4, -6};
    const int rows = 16, cols = 1024, nq = rows * cols / 256 * 99;
    uint8_t *packed = malloc((size_t)rows * cols / 2), *scales = malloc((size_t)rows * cols / 32);
    float *vals = malloc(sizeof(float) * rows * cols), imp[1024];
    uint8_t *a = malloc(nq), *b = malloc(nq);
    for (int i = 0; i < cols; i++) imp[i] = 0.1f + fabsf(frand()) * 4.0f;
    static const int lo[6] = {118, 97, 0, 60, 150, 120}, width[6] = {5, 71, 255, 40, 30, 1};
    for (int trial = 0; trial < 12; trial++) {
        for (int i = 0; i < rows * cols / 2; i++) {
            uint32_t r = rnd();
            packed[i] = (uint8_t)r;
            if (trial % 4 == 1) packed[i] &= 0x77;                      /* positive only */
            if (trial % 4 == 2 && i % 3 == 0) packed[i] = 0x88;         /* -0 */
            if (trial % 4 == 3 && (r >> 8) % 10 < 7) packed[i] = 0;     /* mostly zeros */
        }
        for (int i = 0; i < 16; i++) packed[i] = (uint8_t)(17 * i);    /* every nibble */
        memset(packed + 16 * 5, trial & 1 ? 0x88 : 0, 16);             /* a zero half */
        for (int i = 0; i < rows * cols / 32; i++) scales[i] = (uint8_t)(lo[trial % 6] + rnd() % width[trial % 6]);
        for (int i = 0; i < rows * cols / 32; i++)
            if (scales[i] > 252) scales[i] = 252;                        /* no overflow: -1 is tested elsewhere */
        scales[7] = (uint8_t)(scales[6] + 40 < 252 ? scales[6] + 40 : 252); /* neighbours far apart */
        for (int i = 0; i < rows * cols; i++) {
            int nib = (packed[i / 2] >> (4 * (i & 1))) & 15;
            union { uint32_t u; float f; } s = {scales[i / 32] ? (uint32_t)scales[i / 32] << 23 : 0x00400000u};
            vals[i] = E2M1[nib] * s.f;
        }
        int impls[2] = {FE_KERNELS_SCALAR, FE_KERNELS_AVX2};
        for (int k = 0; k < 2; k++)
            for (int wi = 0; wi < 2; wi++) {
                memset(a, 0xAB, nq), memset(b, 0xCD, nq);
                int ra = fe_q3_quantize_impl(impls[k], FE_Q3_SRC_MXFP4, packed, scales, rows, cols, wi ? imp : NULL, a);
                int rb = fe_q3_quantize_impl(impls[k], FE_Q3_SRC_F32, vals, NULL, rows, cols, wi ? imp : NULL, b);
                char what[112];
                snprintf(what, sizeof what, "q3 MXFP4 source = its float values (trial %d, impl %d, importance %d)",
                         trial, impls[k], wi);
                check(ra == rb && (ra != 0 || memcmp(a, b, nq) == 0), what);
            }
    }
    free(packed), free(scales), free(vals), free(a), free(b);
}

/* ferry_quantize_blocks: the trunk formats round-trip within half a step of
 * their stored (f16) scale, the scale's f16 rounding at its edges (subnormal,
 * the largest half, overflow to inf), and bad input refused. The bytes
 * themselves are compared with the numpy reference in tests/convert/test_quant.py. */
static void test_block_quantizer(void) {
    static const char *names[] = {"q8_0", "q4_0", "q4_1"};
    static const float steps[] = {127.0f, 8.0f, 15.0f};
    enum { N = 32 * 40 };
    static float x[N], back[N];
    static uint8_t q[N / 32 * 34];
    for (int f = 0; f < 3; f++) {
        int fmt = ferry_format_code(names[f]);
        for (int b = 0; b < N / 32; b++) {
            float scale = b % 4 == 0 ? 1e-3f : b % 4 == 1 ? 1.0f : b % 4 == 2 ? 300.0f : 0.0f;
            for (int i = 0; i < 32; i++) x[32 * b + i] = scale * frand();
        }
        check(ferry_quantize_blocks(fmt, x, N, q) == 0, "block quantizer runs");
        ferry_dequantize(fmt, q, 1, N, back);
        int within = 1;
        for (int b = 0; b < N / 32; b++) {
            float lo = x[32 * b], hi = x[32 * b];
            for (int i = 0; i < 32; i++) lo = fminf(lo, x[32 * b + i]), hi = fmaxf(hi, x[32 * b + i]);
            float span = fmaxf(fabsf(lo), fabsf(hi)) * 2.0f, step = span / steps[f];
            for (int i = 0; i < 32; i++) within &= fabsf(back[32 * b + i] - x[32 * b + i]) <= step * 0.51f + 1e-6f;
        }
        check(within, "block quantizer round trip within half a step");
        x[5] = NAN;
        check(ferry_quantize_blocks(fmt, x, N, q) == -1, "block quantizer refuses nan");
        x[5] = INFINITY;
        check(ferry_quantize_blocks(fmt, x, N, q) == -1, "block quantizer refuses inf");
        check(ferry_quantize_blocks(fmt, x, 33, q) == -1, "block quantizer refuses a partial block");
    }
    check(ferry_quantize_blocks(ferry_format_code("f32"), x, 32, q) == -1, "block quantizer refuses f32");
    /* q8_0 scale = max/127 stored as f16: 65504 * 127 stays the largest half, 65520 * 127 overflows,
     * 2^-24 * 127 is the smallest subnormal, 2^-26 * 127 rounds to zero */
    static const struct { float amax; uint16_t bits; } edges[] = {
        {65504.0f * 127.0f, 0x7bff}, {65520.0f * 127.0f, 0x7c00}, {5.9604645e-8f * 127.0f, 0x0001},
        {1.4901161e-8f * 127.0f, 0x0000}, {1.0f * 127.0f, 0x3c00}};
    for (size_t e = 0; e < sizeof edges / sizeof *edges; e++) {
        float blk[32] = {0};
        blk[3] = edges[e].amax;
        ferry_quantize_blocks(ferry_format_code("q8_0"), blk, 32, q);
        check((uint16_t)(q[0] | q[1] << 8) == edges[e].bits, "q8_0 scale rounds to the right half");
    }
}

/* Attention's dot and axpy: bit-identical to the scalar ones, every length. */
static void test_vector_steps(const fe_kernels *k) {
    float a[203] = {0}, b[203] = {0}, y1[203] = {0}, y2[203] = {0};
    int same = 1;
    for (int n = 0; n <= 200; n += (n < 40 ? 1 : 13)) {
        for (int i = 0; i < n; i++) a[i] = frand() * (i % 5 == 0 ? 100.0f : 1.0f), b[i] = frand();
        float d1 = fe_dot_f32(a, b, n), d2 = k->dot(a, b, n);
        same &= memcmp(&d1, &d2, 4) == 0;
        for (int i = 0; i < n; i++) y1[i] = y2[i] = frand();
        float w = frand();
        fe_axpy_f32(y1, w, a, n);
        k->axpy(y2, w, a, n);
        same &= memcmp(y1, y2, sizeof(float) * (size_t)n) == 0;
    }
    char what[80];
    snprintf(what, sizeof what, "%s dot and axpy bit-identical to scalar", k->name);
    check(same, what);
    /* attention: scores of nq queries over nk positions in K tiles, weighted
     * sums over V rows `vs` apart, softmax: bit-identical to the scalar ones */
    enum { MAXHD = 136, MAXNK = 263, MAXQ = 18, OS = FE_KT_PAD(MAXNK) + 5 };
    static float q[MAXQ * MAXHD], kt[FE_KT_PAD(MAXNK) * MAXHD], v[MAXNK * (MAXHD + 16)];
    static float o1[MAXQ * OS], o2[MAXQ * OS], w1[MAXQ * MAXHD], w2[MAXQ * MAXHD];
    static const int hds[] = {1, 3, 7, 8, 12, 16, 24, 40, 56, 64, 72, 80, 96, 128, 136};
    static const int nks[] = {0, 1, 2, 5, 15, 16, 17, 31, 33, 40, 64, 100, 263};
    int same_s = 1, same_w = 1;
    for (size_t hi = 0; hi < sizeof hds / sizeof *hds; hi++)
        for (size_t ni = 0; ni < sizeof nks / sizeof *nks; ni++)
            for (int nq = 1; nq <= MAXQ; nq += nq < 5 || nq >= 16 ? 1 : 3 + (int)(ni % 3)) { /* 1-5, some of 6-15, 16-18 */
                const int hd = hds[hi], nk = nks[ni];
                const size_t vs = (size_t)hd + (size_t)(ni % 3) * 8;
                for (int i = 0; i < nq * hd; i++) q[i] = frand() * (i % 5 == 0 ? 30.0f : 1.0f);
                for (int i = 0; i < FE_KT_PAD(nk) * hd; i++) kt[i] = frand();
                for (size_t i = 0; i < (size_t)nk * vs; i++) v[i] = frand();
                for (int i = 0; i < MAXQ * OS; i++) o1[i] = o2[i] = frand();
                fe_att_scores_f32(q, nq, kt, hd, nk, 0.125f, o1, OS);
                k->att_scores(q, nq, kt, hd, nk, 0.125f, o2, OS);
                for (int r = 0; r < nq; r++) same_s &= memcmp(o1 + r * OS, o2 + r * OS, sizeof(float) * (size_t)nk) == 0;
                for (int i = 0; i < MAXQ * OS; i++) o1[i] = frand() * frand(); /* weights */
                for (int i = 0; i < MAXQ * MAXHD; i++) w1[i] = frand(), w2[i] = frand(); /* overwritten */
                fe_att_wsum_f32(w1, nq, o1, OS, v, vs, nk, hd);
                k->att_wsum(w2, nq, o1, OS, v, vs, nk, hd);
                same_w &= memcmp(w1, w2, sizeof(float) * (size_t)(nq * hd)) == 0;
                same_w &= memcmp(w1, w2, sizeof(float) * (size_t)(nq * hd)) == 0;
            }
    snprintf(what, sizeof what, "%s attention scores bit-identical to scalar", k->name);
    check(same_s, what);
    snprintf(what, sizeof what, "%s attention weighted sums bit-identical to scalar", k->name);
    check(same_w, what);
    /* softmax: bit-identical to the scalar one for every length's tail and
     * spreads of scores up to far below exp's range */
    static float s1[1100], s2[1100];
    int ok = 1;
    for (int n = 1; n <= 1100; n += (n < 40 ? 1 : 97))
        for (int spread = 0; spread < 4; spread++) {
            static const float spreads[4] = {0.01f, 3.0f, 30.0f, 300.0f};
            for (int i = 0; i < n; i++) s1[i] = s2[i] = frand() * spreads[spread] + 5.0f;
            fe_att_softmax(s1, n);
            k->att_softmax(s2, n);
            ok &= memcmp(s1, s2, sizeof(float) * (size_t)n) == 0;
        }
    snprintf(what, sizeof what, "%s attention softmax bit-identical to scalar", k->name);
    check(ok, what);
}

/* The scalar attention references against double-precision arithmetic
 * written from their definitions' meaning (not their order of operations):
 * scores and weighted sums within float rounding of the exact sums, the
 * softmax within 1e-5 relative of exp() / sum (0 below e^-64 of the largest), fe_exp_neg within 4 ulps of
 * exp() where the result is normal. */
static void test_attention_reference(void) {
    enum { HD = 72, NK = 300, OS = FE_KT_PAD(NK) };
    static float q[4 * HD], kt[OS * HD], out[4 * OS], v[NK * HD], w[4 * HD];
    for (int i = 0; i < 4 * HD; i++) q[i] = frand() * 3.0f;
    for (int i = 0; i < OS * HD; i++) kt[i] = frand();
    fe_att_scores_f32(q, 4, kt, HD, NK, 0.125f, out, OS);
    int ok = 1;
    for (int r = 0; r < 4; r++)
        for (int i = 0; i < NK; i++) {
            double exact = 0.0, mag = 0.0;
            for (int c = 0; c < HD; c++) {
                const double t = (double)q[r * HD + c] * kt[fe_kt_index(i, c, HD)];
                exact += t, mag += fabs(t);
            }
            ok &= fabs(out[r * OS + i] - 0.125 * exact) <= 0.125 * mag * 1e-6 + 1e-30;
        }
    check(ok, "attention scores: the exact dot product x scale, within float rounding");
    for (int i = 0; i < NK * HD; i++) v[i] = frand();
    for (int i = 0; i < 4 * OS; i++) out[i] = frand() * frand();
    fe_att_wsum_f32(w, 4, out, OS, v, HD, NK, HD);
    ok = 1;
    for (int r = 0; r < 4; r++)
        for (int c = 0; c < HD; c++) {
            double exact = 0.0, mag = 0.0;
            for (int i = 0; i < NK; i++) {
                const double t = (double)out[r * OS + i] * v[i * HD + c];
                exact += t, mag += fabs(t);
            }
            ok &= fabs(w[r * HD + c] - exact) <= mag * 1e-5 + 1e-30;
        }
    check(ok, "attention weighted sums: the exact sums, within float rounding");
    static float x[1100];
    double worst = 0.0;
    ok = 1;
    for (int n = 1; n <= 1100; n += (n < 40 ? 1 : 97))
        for (int spread = 0; spread < 4; spread++) {
            static const float spreads[4] = {0.01f, 3.0f, 30.0f, 300.0f};
            for (int i = 0; i < n; i++) x[i] = frand() * spreads[spread] + 5.0f;
            double m = x[0], sum = 0.0;
            for (int i = 1; i < n; i++) m = x[i] > m ? x[i] : m;
            for (int i = 0; i < n; i++) sum += exp((double)x[i] - m);
            static double want[1100];
            static int cut[1100];
            for (int i = 0; i < n; i++) want[i] = exp((double)x[i] - m) / sum, cut[i] = (float)(x[i] - m) < FE_ATT_CUT;
            fe_att_softmax(x, n);
            for (int i = 0; i < n; i++) {
                if (cut[i]) { /* below e^-64 of the largest term: exactly 0 */
                    ok &= x[i] == 0.0f;
                    continue;
                }
                const double rel = fabs(x[i] - want[i]) / want[i];
                if (rel > worst) worst = rel;
                if (rel > 1e-5) ok = 0;
            }
        }
    char what[96];
    snprintf(what, sizeof what, "attention softmax within 1e-5 of exp() / sum (worst %.2g)", worst);
    check(ok, what);
    printf("%s\n", what);
    ok = 1;
    for (double t = -87.0; t <= 0.0; t += 0.0137) {
        const float got = fe_exp_neg((float)t);
        const double want = exp((double)(float)t);
        ok &= fabs(got - want) <= 4.0 * want * 1.1920929e-7;
    }
    check(ok, "fe_exp_neg within 4 ulps of exp() on [-87, 0]");
}

/* Every SIMD variant this CPU runs of a format kept outside the tables
 * (q2_vq, iq4_xs: on x86 both AVX2 and AVX-512, whichever the AVX2 set
 * picks) against the scalar reference, row by row, and single tokens
 * against pairs, bit for bit. */
static void test_simd_variants(int fmt, fe_rowdot_fn (*kernel)(int)) {
    static const char *names[FE_SIMD_VARIANTS] = {"scalar", "avx2", "neon", "avx512"};
    const char *name = fe_format_get(fmt)->name;
    const int cols = 768, rows = 5, n = 5;
    uint64_t rb = fe_row_bytes(fmt, (uint64_t)cols);
    uint8_t *w = malloc(rb * rows);
    float *x = malloc(sizeof(float) * cols * n), *scratch = malloc(sizeof(float) * cols), *dq = malloc(sizeof(float) * cols);
    for (int r = 0; r < rows; r++) random_row(fmt, w + r * rb, cols);
    for (int i = 0; i < cols * n; i++) x[i] = frand() * (i % 17 == 0 ? 8.0f : 1.0f);
    int ran = 0;
    for (int v = 1; v < FE_SIMD_VARIANTS; v++) {
        fe_rowdot_fn f = kernel(v);
        if (!f) continue;
        ran++;
        printf("testing %s %s against scalar\n", name, names[v]);
        int ok = 1, same = 1;
        for (int r = 0; r < rows; r++) {
            float ref[5], got[5], one;
            fe_kernel_for(fe_kernels_get(FE_KERNELS_SCALAR), fmt)(w + r * rb, cols, x, cols, n, ref, 1, scratch);
            f(w + r * rb, cols, x, cols, n, got, 1, scratch);
            fe_dequant_row(fmt, w + r * rb, dq, cols);
            for (int t = 0; t < n; t++) {
                double mag = 0;
                for (int i = 0; i < cols; i++) mag += fabs((double)dq[i] * x[t * cols + i]);
                ok &= fabs((double)got[t] - ref[t]) <= TOL * mag + 1e-30;
                f(w + r * rb, cols, x + t * cols, cols, 1, &one, 1, scratch);
                same &= memcmp(&one, &got[t], 4) == 0;
            }
        }
        char what[96];
        snprintf(what, sizeof what, "%s %s within the tolerance of scalar", name, names[v]);
        check(ok, what);
        snprintf(what, sizeof what, "%s %s batch bit-identical", name, names[v]);
        check(same, what);
    }
#if defined(__x86_64__) || defined(__aarch64__)
    check(ran > 0 || ferry_kernels_best() == FERRY_KERNELS_SCALAR, "a SIMD variant ran");
#endif
    free(w), free(x), free(scratch), free(dq);
}

/* The q2_vq quantizer: a bell-shaped matrix round-trips within the format's
 * error, an all-zero row stays zero, importance weighting lowers the
 * weighted error, and bad input is refused. */
static void test_q2_quantizer(void) {
    const int rows = 6, cols = 512;
    float *src = malloc(sizeof(float) * rows * cols), *back = malloc(sizeof(float) * rows * cols), h[512];
    uint8_t *q = malloc((size_t)rows * cols / 256 * 73);
    for (int i = 0; i < rows * cols; i++) src[i] = (i / cols == 2) ? 0.0f : 0.02f * (frand() + frand() + frand());
    for (int i = 0; i < cols; i++) h[i] = i % 4 == 0 ? 16.0f : 1.0f;
    check(ferry_q2_quantize_f32(src, rows, cols, NULL, q) == 0, "q2 quantize");
    check(ferry_dequantize(FE_Q2_VQ, q, rows, cols, back) == 0, "q2 dequantize");
    double num = 0, den = 0, wnum = 0, wden = 0;
    for (int i = 0; i < rows * cols; i++) {
        double d = (double)src[i] - back[i];
        num += d * d, den += (double)src[i] * src[i], wnum += h[i % cols] * d * d, wden += h[i % cols] * (double)src[i] * src[i];
    }
    printf("q2_vq round trip: relative error %.4f (weighted %.4f)\n", sqrt(num / den), sqrt(wnum / wden));
    check(sqrt(num / den) < 0.33, "q2 round trip error < 0.33");
    int zero = 1;
    for (int i = 2 * cols; i < 3 * cols; i++) zero &= back[i] == 0.0f;
    check(zero, "q2 all-zero row stays zero");
    check(ferry_q2_quantize_f32(src, rows, cols, h, q) == 0, "q2 quantize with importance");
    ferry_dequantize(FE_Q2_VQ, q, rows, cols, back);
    double inum = 0;
    for (int i = 0; i < rows * cols; i++) inum += h[i % cols] * ((double)src[i] - back[i]) * ((double)src[i] - back[i]);
    printf("q2_vq with importance: weighted error %.4f\n", sqrt(inum / wden));
    check(inum < wnum, "q2 importance lowers the weighted error");
    src[7] = NAN;
    check(ferry_q2_quantize_f32(src, rows, cols, NULL, q) == -1, "q2 refuses NaN");
    src[7] = 0.0f;
    check(ferry_q2_quantize_f32(src, rows, 100, NULL, q) == -1, "q2 refuses cols % 256");
    /* every scan this CPU runs (portable, AVX2 or NEON, AVX-512) writes the
     * portable path's bytes, with and without importance; so do shared
     * tables (ferry_q2_quantize_with) and any split of the rows */
    {
        const size_t nb = (size_t)rows * cols / 256 * 73;
        uint8_t *q2 = malloc(nb);
        for (int i = 0; i < rows * cols; i++) src[i] = i % 97 == 5 ? 0.3f : 0.02f * (frand() + frand() + frand());
        ferry_q2_quantizer *tables = ferry_q2_quantizer_new();
        check(tables != NULL, "q2 quantizer tables");
        for (int with = 0; with < 2; with++) {
            const float *hw = with ? h : NULL;
            check(fe_q2_quantize_scans(0, src, rows, cols, hw, q) == 0, "q2 portable");
            int ran = 0;
            for (int scans = 1; scans <= 2; scans++) {
                memset(q2, 0, nb);
                if (fe_q2_quantize_scans(scans, src, rows, cols, hw, q2) != 0) continue;
                ran++;
                check(memcmp(q, q2, nb) == 0, scans == 2 ? "q2 AVX-512 scans = portable bytes" : "q2 AVX2/NEON scans = portable bytes");
            }
            printf("q2_vq quantizer: %d SIMD scan set(s) = portable bytes (%s importance)\n", ran, with ? "with" : "no");
            memset(q2, 0, nb);
            check(ferry_q2_quantize_with(tables, src, rows, cols, hw, q2) == 0 && memcmp(q, q2, nb) == 0,
                  "q2 shared tables = the same bytes");
            memset(q2, 0, nb);
            check(ferry_q2_quantize_with(tables, src, 2, cols, hw, q2) == 0 &&
                      ferry_q2_quantize_with(tables, src + 2 * cols, rows - 2, cols, hw, q2 + nb / rows * 2) == 0 &&
                      memcmp(q, q2, nb) == 0,
                  "q2 rows split between calls = the same bytes");
        }
        /* values and importance far outside a weight's range (the SIMD searches hand such blocks to the
         * portable one, whose scans may meet infinities): still the portable path's bytes */
        {
            float hb[512];
            for (int i = 0; i < cols; i++) hb[i] = i % 5 == 0 ? 3e30f : 1.0f;
            for (int i = 0; i < rows * cols; i++) src[i] = i % 7 == 1 ? 3e38f : i % 11 == 2 ? -2e12f : src[i];
            for (int with = 0; with < 2; with++) {
                check(fe_q2_quantize_scans(0, src, rows, cols, with ? hb : NULL, q) == 0, "q2 portable, huge values");
                for (int scans = 1; scans <= 2; scans++) {
                    memset(q2, 0, nb);
                    if (fe_q2_quantize_scans(scans, src, rows, cols, with ? hb : NULL, q2) != 0) continue;
                    check(memcmp(q, q2, nb) == 0, "q2 SIMD scans = portable bytes on huge values");
                }
            }
        }
        check(ferry_q2_quantize_with(NULL, src, rows, cols, NULL, q2) == -1, "q2 refuses NULL tables");
        ferry_q2_quantizer_free(tables);
        ferry_q2_quantizer_free(NULL);
        free(q2);
    }
    h[3] = -1.0f;
    check(ferry_q2_quantize_f32(src, rows, cols, h, q) == -1, "q2 refuses negative importance");
    free(src), free(back), free(q);
}

/* fe_q4k_scales_mins (all eight scales and mins of a block at once, used by
 * the SIMD K-quant kernels) gives fe_q4k_scale_min's values: every byte value
 * in every one of the 12 positions, and random blocks. */
/* The iq4_xs quantizer: a bell-shaped matrix round-trips with a smaller error
 * than q4_0 gives it (the 4.5-bit format it replaces), an all-zero row stays
 * zero, importance lowers the weighted error, bad input is refused. */
static void test_iq4xs_quantizer(void) {
    const int rows = 6, cols = 512;
    float *src = malloc(sizeof(float) * rows * cols), *back = malloc(sizeof(float) * rows * cols), h[512];
    uint8_t *q = malloc((size_t)rows * cols / 256 * 136), *q4 = malloc((size_t)rows * cols / 32 * 18);
    for (int i = 0; i < rows * cols; i++) src[i] = (i / cols == 2) ? 0.0f : 0.02f * (frand() + frand() + frand());
    for (int i = 0; i < cols; i++) h[i] = i % 4 == 0 ? 16.0f : 1.0f;
    check(ferry_iq4xs_quantize_f32(src, rows, cols, NULL, q) == 0, "iq4_xs quantize");
    check(ferry_dequantize(FE_IQ4_XS, q, rows, cols, back) == 0, "iq4_xs dequantize");
    double num = 0, den = 0, wnum = 0, wden = 0, num4 = 0;
    for (int i = 0; i < rows * cols; i++) {
        double d = (double)src[i] - back[i];
        num += d * d, den += (double)src[i] * src[i], wnum += h[i % cols] * d * d, wden += h[i % cols] * (double)src[i] * src[i];
    }
    check(ferry_quantize_blocks(FE_Q4_0, src, rows * cols, q4) == 0, "q4_0 quantize");
    ferry_dequantize(FE_Q4_0, q4, rows, cols, back);
    for (int i = 0; i < rows * cols; i++) num4 += ((double)src[i] - back[i]) * ((double)src[i] - back[i]);
    printf("iq4_xs round trip: relative error %.4f (q4_0 %.4f)\n", sqrt(num / den), sqrt(num4 / den));
    check(num < num4, "iq4_xs round trip error below q4_0's");
    ferry_dequantize(FE_IQ4_XS, q, rows, cols, back);
    int zero = 1;
    for (int i = 2 * cols; i < 3 * cols; i++) zero &= back[i] == 0.0f;
    check(zero, "iq4_xs all-zero row stays zero");
    check(ferry_iq4xs_quantize_f32(src, rows, cols, h, q) == 0, "iq4_xs quantize with importance");
    ferry_dequantize(FE_IQ4_XS, q, rows, cols, back);
    double inum = 0;
    for (int i = 0; i < rows * cols; i++) inum += h[i % cols] * ((double)src[i] - back[i]) * ((double)src[i] - back[i]);
    check(inum < wnum, "iq4_xs importance lowers the weighted error");
    /* rows quantized apart give the same bytes as all at once */
    uint8_t *q2 = malloc((size_t)rows * cols / 256 * 136);
    for (int r = 0; r < rows; r++)
        ferry_iq4xs_quantize_f32(src + (size_t)r * cols, 1, cols, h, q2 + (size_t)r * cols / 256 * 136);
    check(memcmp(q, q2, (size_t)rows * cols / 256 * 136) == 0, "iq4_xs bytes independent of the row split");
    src[7] = NAN;
    check(ferry_iq4xs_quantize_f32(src, rows, cols, NULL, q) == -1, "iq4_xs refuses NaN");
    src[7] = 0.0f;
    check(ferry_iq4xs_quantize_f32(src, rows, 100, NULL, q) == -1, "iq4_xs refuses cols % 256");
    h[3] = -1.0f;
    check(ferry_iq4xs_quantize_f32(src, rows, cols, h, q) == -1, "iq4_xs refuses negative importance");
    free(src), free(back), free(q), free(q4), free(q2);
}

static void test_q4k_scales_mins(void) {
    int ok = 1;
    uint8_t s[12];
    for (int t = 0; t < 12 * 256 + 4000; t++) {
        for (int i = 0; i < 12; i++) s[i] = (uint8_t)rnd();
        if (t < 12 * 256) s[t / 256] = (uint8_t)(t % 256);
        uint32_t v[4];
        fe_q4k_scales_mins(s, v);
        for (int j = 0; j < 8; j++) {
            int sc, mn;
            fe_q4k_scale_min(j, s, &sc, &mn);
            ok &= (int)((v[j >> 2] >> (8 * (j & 3))) & 0xFF) == sc;
            ok &= (int)((v[2 + (j >> 2)] >> (8 * (j & 3))) & 0xFF) == mn;
        }
    }
    check(ok, "q4_k scales and mins unpacked at once equal the per-sub-block ones");
}

int main(void) {
    static const int sizes[] = {1, 7, 31, 32, 33, 100, 255};
    static const int ns[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 16, 33}; /* every tile remainder of 2, 3 and 4 */
    int impls = 0;
    test_q4k_scales_mins();
    test_attention_reference();
    for (int impl = 1; impl < FE_KERNELS_N; impl++) {
        if (!ferry_kernels_available(impl)) continue;
        impls++;
        printf("testing %s against scalar\n", ferry_kernels_name(impl));
        test_vector_steps(fe_kernels_get(impl));
        for (int fmt = 0; fmt < FE_N_FORMATS; fmt++) {
            const fe_format_info *f = fe_format_get(fmt);
            for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++) {
                int cols = f->block_elems == 1 ? sizes[s] * 3 + (int)s : f->block_elems * (1 + (int)s % 4);
                for (size_t k = 0; k < sizeof ns / sizeof *ns; k++) test_format(fmt, impl, cols, ns[k]);
            }
        }
    }
    if (fe_cpu_has_avx2() && fe_kernels_avx2_ymm_table() != fe_kernels_get(FE_KERNELS_AVX2)) {
        /* this CPU's AVX2 set runs its attention in zmm registers: the ymm kernels of CPUs without AVX-512 too */
        printf("testing avx2 with its ymm attention kernels against scalar\n");
        test_vector_steps(fe_kernels_avx2_ymm_table());
    }
    check(fe_kernels_get(FE_KERNELS_AVX2) == NULL || fe_cpu_has_avx512() ==
          (fe_kernels_get(FE_KERNELS_AVX2) != fe_kernels_avx2_ymm_table()), "avx2 attention in zmm where AVX-512 is");
    printf("simd implementations tested: %d (best: %s)\n", impls, ferry_kernels_name(ferry_kernels_best()));
    check(impls > 0 || ferry_kernels_best() == FERRY_KERNELS_SCALAR, "the best implementation is one tested");
    test_simd_variants(FE_Q2_VQ, fe_q2vq_kernel);
    test_simd_variants(FE_IQ4_XS, fe_iq4xs_kernel);
    test_iq4xs_quantizer();
    test_quantizer();
    test_q2_quantizer();
    test_quantizer_paths();
    test_quantizer_mxfp4_tables();
    test_block_quantizer();
    printf("%d passed, %d failed\n", passed, failed);
    return failed != 0;
}
