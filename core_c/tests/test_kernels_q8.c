/* test_kernels_q8.c — the 8-bit-activation kernels (kernels_q8*.c).
 *
 *   cc -std=c11 -O2 -ffp-contract=off -Iinclude src/formats.c src/kernels*.c src/quant3.c \
 *      src/quant_blocks.c tests/test_kernels_q8.c -lm
 *
 * For each integer format, every built-in implementation this CPU runs
 * (scalar, AVX2, AVX-512 VNNI, NEON; an x86 CPU without AVX-512 VNNI prints
 * why that set is skipped), awkward sizes, 1-7 rows and token counts 1-9,
 * 11, 16, 33 (around the SIMD tiles of 4 and 8): (1) bit-identical to the scalar reference, (2) a
 * token's result in a batch bit-identical to the token alone, (3) within the
 * activations' own rounding error of the exact f32 product (the bound
 * sum_i |w_i| * |x_i - dequantized q8 x_i|, plus float rounding), and the
 * mean relative error over rows small; (4) the quantizer's invariants.
 * Prints "N passed, M failed" last and exits nonzero on any failure. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../include/ferry_kernels.h"
#include "../src/formats.h"
#include "../src/kernels.h"
#include "../src/kernels_q8.h"

static int passed, failed;
static uint64_t rng = 0x243F6A8885A308D3ull;

static uint32_t rnd(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 16);
}
static float frand(void) { return (float)rnd() / 4294967296.0f * 2.0f - 1.0f; }

static void check(int ok, const char *fmt_name, int impl, int cols, int n, const char *what) {
    if (ok) {
        passed++;
        return;
    }
    failed++;
    printf("FAIL %s %s cols=%d n=%d: %s\n", fmt_name, ferry_q8_kernels_name(impl), cols, n, what);
}

static void set_f16(uint8_t *p, float f) { /* positive normal values, truncated */
    uint32_t u;
    memcpy(&u, &f, 4);
    int e = (int)((u >> 23) & 0xFF) - 127 + 15;
    uint16_t h = e <= 0 ? 0 : (uint16_t)((u >> 31) << 15 | (uint32_t)e << 10 | ((u >> 13) & 0x3FF));
    p[0] = (uint8_t)h, p[1] = (uint8_t)(h >> 8);
}

/* Random blocks with sane scales (the extreme bytes included: q = -128, 15, 63). */
static void random_row(int fmt, uint8_t *row, int cols) {
    uint64_t nb = fe_row_bytes(fmt, (uint64_t)cols);
    for (uint64_t i = 0; i < nb; i++) row[i] = (uint8_t)rnd();
    const fe_format_info *f = fe_format_get(fmt);
    for (int b = 0; b < cols / f->block_elems; b++) {
        uint8_t *p = row + (size_t)b * (size_t)f->block_bytes;
        if (fmt == FE_Q6_K) set_f16(p + 208, 0.001f + 0.01f * fabsf(frand()));
        else set_f16(p, 0.01f + 0.1f * fabsf(frand()));
        if (fmt == FE_Q4_1) set_f16(p + 2, 0.05f * frand());
        if (fmt == FE_Q4_K || fmt == FE_Q5_K) set_f16(p + 2, 0.005f + 0.02f * fabsf(frand()));
        if (fmt == FE_Q8_0 && b % 3 == 0) p[2 + b % 32] = 0x80; /* -128 */
        if (fmt == FE_Q3_NL) p[96] = b % 5 == 3 ? 0 : (uint8_t)(150 + rnd() % 24); /* e = 0: a zero block */
        if (fmt == FE_IQ4_XS) set_f16(p, b % 5 == 3 ? 0.0f : 0.0005f + 0.003f * fabsf(frand())); /* d = 0: a zero block */
    }
}

static void random_x(float *x, int count, int kind) {
    for (int i = 0; i < count; i++) {
        float v = frand();
        if (kind == 1) v *= (i % 97 == 5) ? 40.0f : 1.0f;     /* outliers */
        if (kind == 2 && (i / 32) % 3 == 1) v = 0.0f;          /* all-zero blocks */
        x[i] = v;
    }
}

static const int FORMATS[] = {FE_Q8_0, FE_Q4_0, FE_Q4_1, FE_Q4_K, FE_Q5_K, FE_Q6_K, FE_Q3_NL, FE_IQ4_XS};

/* q3_nl's weights as its q8 kernel sees them: s_g * G[index] / 56 (kernels_q8.h). */
static void q3_q8_weights(const uint8_t *w, int rows, int cols, float *out) {
    static const int8_t G[8] = FE_Q3_Q8_GRID;
    const uint64_t rb = fe_row_bytes(FE_Q3_NL, (uint64_t)cols);
    for (int r = 0; r < rows; r++)
        for (int b = 0; b < cols / FE_Q3_BLOCK; b++) {
            const uint8_t *p = w + (size_t)r * rb + FE_Q3_BYTES * (size_t)b;
            for (int i = 0; i < FE_Q3_BLOCK; i++)
                out[(size_t)r * cols + FE_Q3_BLOCK * b + i] = fe_q3_group_scale(p, i / 64) * (float)G[fe_q3_index(p, i)] / 56.0f;
        }
}

static void test_format(int fmt, int cols, int n, int xkind, int rows) {
    const char *name = fe_format_get(fmt)->name;
    uint64_t rb = fe_row_bytes(fmt, (uint64_t)cols);
    uint8_t *w = malloc(rb * rows);
    float *x = malloc(sizeof(float) * (size_t)cols * (size_t)n);
    float *wf = malloc(sizeof(float) * (size_t)cols * rows);
    float *ref = malloc(sizeof(float) * (size_t)rows * (size_t)n), *exact = malloc(sizeof(float) * (size_t)rows * (size_t)n);
    float *got = malloc(sizeof(float) * (size_t)rows * (size_t)n), *one = malloc(sizeof(float) * (size_t)rows);
    /* the values in their natural order (q3_nl's FE_Q8_KIND_32T is FE_Q8_KIND_32 rearranged) */
    const int kind = fe_q8_kind(fmt) == FE_Q8_KIND_32T ? FE_Q8_KIND_32 : fe_q8_kind(fmt);
    const int len = kind == FE_Q8_KIND_256 ? FE_Q8K_BLOCK : FE_Q8_BLOCK;
    float *w8 = malloc(sizeof(float) * (size_t)cols * rows); /* the weights the integer kernel multiplies */
    const size_t st = fe_q8_stride_kind(kind, cols);
    uint8_t *xq = malloc(st * (size_t)n);
    for (int r = 0; r < rows; r++) random_row(fmt, w + (size_t)r * rb, cols);
    random_x(x, cols * n, xkind);
    ferry_dequantize(fmt, w, rows, cols, wf);
    if (fmt == FE_Q3_NL) q3_q8_weights(w, rows, cols, w8);
    else memcpy(w8, wf, sizeof(float) * (size_t)cols * rows);
    check(ferry_kernel_matmul_q8(FERRY_KERNELS_SCALAR, fmt, w, rows, cols, x, n, ref) == 0, name, 0, cols, n, "call");
    check(ferry_kernel_matmul(FERRY_KERNELS_SCALAR, fmt, w, rows, cols, x, n, exact) == 0, name, 0, cols, n, "f32");
    fe_q8_quantize(kind, x, (size_t)cols, cols, n, xq);
    /* (3) the activation rounding bound, and the mean relative error */
    double rel_sum = 0.0;
    int bound_ok = 1;
    for (int t = 0; t < n; t++) {
        const int8_t *q = (const int8_t *)(xq + (size_t)t * st);
        const float *d = (const float *)(xq + (size_t)t * st + (size_t)cols);
        for (int r = 0; r < rows; r++) {
            double bound = 0.0, mag = 0.0;
            for (int i = 0; i < cols; i++) {
                double xi = x[(size_t)t * cols + i], wi = wf[(size_t)r * cols + i], vi = w8[(size_t)r * cols + i];
                /* the activation's rounding, and q3_nl's int8 grid (0 for the other formats) */
                bound += fabs(vi) * fabs(xi - (double)d[i / len] * q[i]) + fabs(wi - vi) * fabs(xi);
                mag += fabs(wi * xi);
            }
            double err = fabs((double)ref[(size_t)t * rows + r] - (double)exact[(size_t)t * rows + r]);
            if (err > 1.001 * bound + 2e-6 * mag + 1e-30) bound_ok = 0;
            rel_sum += mag > 0 ? err / mag : 0.0;
        }
    }
    check(bound_ok, name, 0, cols, n, "error above the activation rounding bound");
    /* an outlier 40x the rest coarsens its block's other values (kind 1) */
    check(rel_sum / (rows * n) < (xkind == 1 ? 0.03 : fmt == FE_Q3_NL ? 0.015 : 0.01), name, 0, cols, n, "mean error / sum|w x| too large");
    /* (1) every implementation bit-identical to the reference; (2) batch invariance */
    for (int impl = 0; impl <= FERRY_KERNELS_AVX512VNNI; impl++) {
        if (!ferry_q8_kernels_available(impl)) continue;
        check(ferry_kernel_matmul_q8(impl, fmt, w, rows, cols, x, n, got) == 0, name, impl, cols, n, "call");
        check(memcmp(got, ref, sizeof(float) * (size_t)rows * (size_t)n) == 0, name, impl, cols, n,
              "not bit-identical to the scalar reference");
        for (int t = 0; t < n; t += 3) {
            ferry_kernel_matmul_q8(impl, fmt, w, rows, cols, x + (size_t)t * cols, 1, one);
            check(memcmp(one, got + (size_t)t * rows, sizeof(float) * rows) == 0, name, impl, cols, n,
                  "a token alone differs from the same token in a batch");
        }
    }
    free(w8), free(w), free(x), free(wf), free(ref), free(exact), free(got), free(one), free(xq);
}

static void test_quantizer(void) {
    const int cols = 96;
    float x[96];
    random_x(x, cols, 1);
    for (int i = 32; i < 64; i++) x[i] = 0.0f;
    x[70] = NAN;
    uint8_t buf[256];
    fe_q8_quantize(FE_Q8_KIND_32, x, cols, cols, 1, buf);
    const int8_t *q = (const int8_t *)buf;
    const float *d = (const float *)(buf + cols), *s = d + 3;
    int ok = 1;
    for (int b = 0; b < 3; b++) {
        int sum = 0, top = 0;
        for (int i = 32 * b; i < 32 * b + 32; i++) {
            ok &= q[i] != -128;
            sum += q[i];
            top = abs(q[i]) > top ? abs(q[i]) : top;
            if (i != 70) ok &= fabsf(x[i] - d[b] * (float)q[i]) <= 0.5001f * d[b];
        }
        ok &= s[b] == d[b] * (float)sum;
        ok &= b == 1 ? (d[b] == 0.0f && top == 0) : top == 127;
    }
    ok &= q[70] == 0;
    check(ok, "quantizer", 0, cols, 1, "invariants");
    check(ferry_kernel_matmul_q8(FERRY_KERNELS_SCALAR, FE_F16, buf, 1, 32, x, 1, x) == -1, "f16", 0, 32, 1,
          "a format without an integer kernel is refused");
    check(ferry_q8_activations_supported(FE_Q4_K) && ferry_q8_activations_supported(FE_Q3_NL) &&
              ferry_q8_activations_supported(FE_IQ4_XS) && !ferry_q8_activations_supported(FE_Q2_VQ) &&
              !ferry_q8_activations_supported(FE_BF16),
          "supported", 0, 0, 0, "the supported formats");
    /* FE_Q8_KIND_32T: FE_Q8_KIND_32 with byte 4l + j of each block holding value 8j + l */
    uint8_t a32[256], a32t[256];
    fe_q8_quantize(FE_Q8_KIND_32, x, cols, cols, 1, a32);
    fe_q8_quantize(FE_Q8_KIND_32T, x, cols, cols, 1, a32t);
    int t_ok = memcmp(a32 + cols, a32t + cols, 8 * 3) == 0;
    for (int b = 0; b < 3; b++)
        for (int l = 0; l < 8; l++)
            for (int j = 0; j < 4; j++) t_ok &= a32t[32 * b + 4 * l + j] == a32[32 * b + 8 * j + l];
    check(t_ok, "quantizer 32t", 0, cols, 1, "the q3_nl layout is not the 32-value one in index order");
    /* FE_Q8_KIND_32S: FE_Q8_KIND_32's record, then c[i] = -8 * (q[4i] + ... + q[4i + 3]) */
    uint8_t a32s[512];
    const size_t s_st = fe_q8_stride_kind(FE_Q8_KIND_32S, cols);
    check(s_st <= sizeof a32s && s_st == fe_q8_stride(cols) + 128, "quantizer 32s", 0, cols, 1, "its stride");
    fe_q8_quantize(FE_Q8_KIND_32S, x, cols, cols, 1, a32s);
    int s_ok = memcmp(a32, a32s, cols + 8 * 3) == 0;
    const int32_t *c = (const int32_t *)(a32s + fe_q8_sums_offset(cols));
    for (int i = 0; i < cols / 4; i++) {
        int sum = 0;
        for (int j = 0; j < 4; j++) sum += (int8_t)a32[4 * i + j];
        s_ok &= c[i] == -8 * sum;
    }
    check(s_ok, "quantizer 32s", 0, cols, 1, "the Q4_0 sums layout is not the 32-value one with -8 x its 4-value sums");
    /* FE_Q8_KIND_32TS: FE_Q8_KIND_32T's record, then -128 x its stored 4-byte sums */
    fe_q8_quantize(FE_Q8_KIND_32TS, x, cols, cols, 1, a32s);
    s_ok = fe_q8_stride_kind(FE_Q8_KIND_32TS, cols) == s_st && memcmp(a32t, a32s, cols + 8 * 3) == 0;
    for (int i = 0; i < cols / 4; i++) {
        int sum = 0;
        for (int j = 0; j < 4; j++) sum += (int8_t)a32t[4 * i + j];
        s_ok &= c[i] == -128 * sum;
    }
    check(s_ok, "quantizer 32ts", 0, cols, 1, "the q3_nl sums layout is not the 32t one with -128 x its 4-byte sums");
}

/* Every set's quantizer gives the scalar reference's bytes, every layout,
 * with outliers, zero blocks, NaN, infinities, ties and values at +-127.5 steps. */
static void test_quantizers(void) {
    const int cols = 768, n = 3;
    float *x = malloc(sizeof(float) * cols * n);
    for (int kind = 0; kind < FE_Q8_KINDS; kind++) {
        random_x(x, cols * n, kind + 1);
        for (int i = 256; i < 512; i++) x[i] = 0.0f;       /* a whole zero super-block */
        x[600] = NAN, x[1000] = INFINITY, x[1100] = -0.0f;
        for (int i = 1536; i < 1568; i++) x[i] = (float)(i - 1552) * 0.5f; /* ties */
        x[1567] = 127.0f; /* scale 1: the halves are ties */
        const size_t bytes = fe_q8_stride_kind(kind, cols) * n;
        uint8_t *ref = calloc(1, bytes), *got = calloc(1, bytes);
        fe_q8_quantize(kind, x, cols, cols, n, ref);
        for (int impl = 1; impl <= FERRY_KERNELS_AVX512VNNI; impl++) {
            const fe_q8_kernels *k = fe_q8_kernels_get(impl);
            if (!k) continue;
            memset(got, 0, bytes);
            k->quantize(kind, x, cols, cols, n, got);
            check(memcmp(got, ref, bytes) == 0, kind == 1 ? "quantizer 256" : kind == 2 ? "quantizer 32z" : kind == 3 ? "quantizer 32t" : kind == 4 ? "quantizer 32s" : kind == 5 ? "quantizer 32ts" : "quantizer 32", impl, cols, n,
                  "not bit-identical to the scalar quantizer");
        }
        free(ref), free(got);
    }
    free(x);
}

/* A session buffer holds a region only for the layouts its set reads for the
 * model's formats (fe_q8_kinds): every product of 1..N tokens still finds its
 * kernel and a region inside the buffer, the regions do not overlap, a
 * buffer without a layout's region takes the exact path, and the AVX-512 VNNI
 * set's Q4_1 (the demo model) needs only FE_Q8_KIND_32. */
static void test_buffer_regions(void) {
    enum { N = 40 };
    const int cols = 1536;
    for (int impl = 0; impl <= FERRY_KERNELS_AVX512VNNI; impl++) {
        const fe_q8_kernels *k = fe_q8_kernels_get(impl);
        if (!k) continue;
        for (int only = -1; only < FE_N_FORMATS; only++) { /* each format alone, then (-1) all of them */
            unsigned char fmts[FE_N_FORMATS];
            for (int f = 0; f < FE_N_FORMATS; f++) fmts[f] = only < 0 || f == only;
            const unsigned kinds = fe_q8_kinds(k, fmts, N);
            const size_t bytes = fe_q8_buffer_bytes(kinds, cols, N);
            uint8_t *buf = malloc(bytes ? bytes : 1);
            fe_q8_ctx q = {k, buf, bytes, kinds};
            int ok = buf != NULL;
            for (int f = 0; f < FE_N_FORMATS; f++) {
                if (!fmts[f] || !fe_q8_rowdot(k, f)) continue;
                for (int n = 1; n <= N; n++) {
                    const int kind = fe_q8_layout(k, f, n);
                    const size_t at = (size_t)(fe_q8_region(&q, kind, cols, n) - buf);
                    ok &= fe_q8_kernel_for(&q, f, cols, n) != NULL && (kinds >> kind & 1u) &&
                          at + (size_t)n * fe_q8_stride_kind(kind, cols) <= q.bytes;
                    for (int o = 0; o < FE_Q8_KINDS; o++) /* another region starts at or past this one's end, or ends before it */
                        if (o != kind && (kinds >> o & 1u)) {
                            const size_t ao = (size_t)(fe_q8_region(&q, o, cols, n) - buf);
                            ok &= ao >= at + (size_t)n * fe_q8_stride_kind(kind, cols) ||
                                  ao + (size_t)n * fe_q8_stride_kind(o, cols) <= at;
                        }
                    fe_q8_ctx without = q;
                    without.kinds &= ~(1u << kind);
                    ok &= fe_q8_kernel_for(&without, f, cols, n) == NULL;
                }
            }
            free(buf);
            check(ok, only < 0 ? "all formats" : fe_format_get(only)->name, impl, cols, N, "q8 buffer regions");
        }
        if (impl == FERRY_KERNELS_AVX512VNNI) {
            unsigned char fmts[FE_N_FORMATS] = {0};
            fmts[FE_Q4_1] = 1;
            check(fe_q8_kinds(k, fmts, 128) == 1u << FE_Q8_KIND_32 &&
                      fe_q8_buffer_bytes(1u << FE_Q8_KIND_32, cols, 128) == 128 * fe_q8_stride(cols),
                  "q4_1", impl, cols, 128, "the q8 buffer holds only the plain layout");
        }
    }
}

int main(void) {
    for (int impl = 1; impl <= FERRY_KERNELS_AVX512VNNI; impl++)
        if (ferry_q8_kernels_available(impl)) printf("testing %s q8 against scalar\n", ferry_q8_kernels_name(impl));
#if defined(__x86_64__) || defined(_M_X64)
    if (!ferry_q8_kernels_available(FERRY_KERNELS_AVX512VNNI))
        printf("skipping avx512vnni q8: this CPU (or its OS) lacks AVX-512 F/BW/VL/VNNI\n");
#endif
    test_quantizer();
    test_quantizers();
    test_buffer_regions();
    /* token counts around the SIMD tiles (4 and 8 tokens) and their remainders */
    /* the K-quants' tiles of 8 and rests; Q8_0/Q4_0's balanced tiles of every size 1-16 (20: 10 + 10,
     * 24: 12 + 12, 27: 13 + 14, 31: 15 + 16, 33: 11 x 3) */
    static const int NS[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 11, 16, 20, 24, 27, 31, 33};
    for (size_t f = 0; f < sizeof FORMATS / sizeof FORMATS[0]; f++) {
        const int fmt = FORMATS[f], k = fe_format_get(fmt)->block_elems;
        /* 29 and 17 blocks of 32: groups of 16 blocks with odd tails; 3 super-blocks */
        const int sizes[] = {k, 2 * k, 5 * k, (k == 32 ? 29 : 3) * k, k == 32 ? 576 : 1536, k == 32 ? 544 : 256};
        for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++)
            for (size_t j = 0; j < sizeof NS / sizeof NS[0]; j++) {
                const int n = NS[j], rows = 1 + 2 * (int)((s + j) % 5); /* 1, 3, 5, 7, 9 */
                if (n > 11 && sizes[s] > 1024) continue; /* the wide rows at n <= 11 only */
                test_format(fmt, sizes[s], n, (int)((s + (size_t)n) % 3), rows);
            }
    }
    printf("%d passed, %d failed\n", passed, failed);
    return failed != 0;
}
