/* q3_int8.c — experiment, not product code: a q3_nl matrix-vector kernel
 * with int8 activations (AVX2), timed and checked against the product's f32
 * AVX2 kernel. bench/kernel_speed.py --int8-experiment builds and runs it:
 *
 *   cc -DABLK=64 -std=c11 -O3 -ffp-contract=off -Icore_c/include bench/q3_int8.c core_c/src/formats.c \
 *      core_c/src/kernels.c core_c/src/kernels_avx2.c core_c/src/kernels_neon.c core_c/src/quant3.c -lm
 *   ./a.out [weight MB] [repeats]      (prints one JSON object)
 *
 * Activations are quantized once per token to int8 with one float scale per
 * ABLK = 32 or 64 values (round to nearest, scale = max|x| / 127), stored in
 * the order of the weight indices; with 64 (one per weight group) a group's
 * two 32-value chunks are summed as int32 before one conversion. Per 32 weights the kernel spreads four 3-bit fields
 * of each 32-bit lane into bytes (shifts, ands, ors), looks up int8 grid
 * levels with vpshufb, multiplies with vpmaddubsw (|level| times the
 * activation given the level's sign with vpsignb; the grid is scaled to
 * |level| <= 127, so pairs cannot saturate), sums with vpmaddwd, converts to
 * float and accumulates with the activation scale times the group scale.
 * With ABLK 64 a second variant ("u8") looks the grid up as unsigned 0..127
 * plus an offset (one vpshufb, no vpsignb). Each variant has a plain-C
 * reference of the same integer arithmetic. Measures weight GB/s against the f32 kernel in the same run and the
 * relative error of y against the f32 kernel (and the q3_nl error itself:
 * y of the f32 source against y of its q3_nl quantization) on Gaussian
 * weights and Gaussian activations with log-normal per-channel scales.
 * First it times the instruction mixes that bound the f32 kernel (port_mix). */
#define _POSIX_C_SOURCE 200809L
#include <immintrin.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../core_c/include/ferry_kernels.h"
#include "../core_c/src/formats.h"
#include "../core_c/src/kernels_avx2_util.h"

#define TGT __attribute__((target("avx2,fma,f16c")))
#define INL static inline __attribute__((always_inline, target("avx2,fma,f16c")))

#ifndef ABLK
#define ABLK 64 /* activation values per scale: 32, or 64 (one per weight group) */
#endif
enum { CHUNK = 32, CHUNKS = FE_Q3_BLOCK / CHUNK, ASCALES = FE_Q3_BLOCK / ABLK };

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* The grid as int8, |level| <= 127: level_i ~= q8_grid[i] / GRID_K. */
static int8_t q8_grid[16];
static float GRID_K;

static void make_grid(void) {
    float m = 0;
    for (int i = 0; i < 8; i++) m = fmaxf(m, fabsf(fe_q3_levels[i]));
    GRID_K = 127.0f / m;
    for (int i = 0; i < 16; i++) q8_grid[i] = (int8_t)lrintf(fe_q3_levels[i & 7] * GRID_K);
}

/* One token's activations: per 32-value chunk, 32 int8 in weight-index
 * order (byte 4l + j holds value 8j + l of the chunk) and its scale / GRID_K. */
typedef struct { int8_t *q; float *d; } qx_t;

static void quantize_x(const float *x, int cols, qx_t *out) {
    for (int a = 0; a < cols / ABLK; a++) {
        float m = 0;
        for (int i = 0; i < ABLK; i++) m = fmaxf(m, fabsf(x[ABLK * a + i]));
        float d = m / 127.0f, inv = m > 0 ? 127.0f / m : 0.0f;
        for (int c = ABLK * a / CHUNK; c < ABLK * (a + 1) / CHUNK; c++)
            for (int l = 0; l < 8; l++)
                for (int j = 0; j < 4; j++)
                    out->q[CHUNK * c + 4 * l + j] = (int8_t)lrintf(x[CHUNK * c + 8 * j + l] * inv);
        out->d[a] = d / GRID_K;
    }
}

/* Bits 12q .. 12q + 11 of each lane's 96-bit index number (fields 4q .. 4q + 3) at the bottom. */
INL __m256i fields12(__m256i w0, __m256i w1, __m256i w2, const int q) { return fe_q3_bits(w0, w1, w2, 12 * q, 12); }

INL float hsum4x8(const __m256 acc[4]) {
    __m256 s = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_movehdup_ps(h));
    return _mm_cvtss_f32(h);
}

/* Four 3-bit fields at bits 0, 3, 6, 9 of each lane (garbage above) into
 * the low 4 bits of bytes 0..3 (bit 3 is the next field's: the tables repeat
 * after 8 entries): byte j = lane bits 3j..3j+7. 16-bit halves from bits 0
 * and 6, then byte 1 of each half from the half shifted by 5. */
INL __m256i spread(__m256i t) {
    __m256i v = _mm256_blend_epi16(t, _mm256_slli_epi32(t, 10), 0xAA);
    __m256i u = _mm256_blendv_epi8(v, _mm256_slli_epi16(v, 5), _mm256_set1_epi32((int)0xFF00FF00u));
    return _mm256_and_si256(u, _mm256_set1_epi8(15));
}

TGT static float dot_int8(const uint8_t *row, int cols, const qx_t *x) {
    const __m256i tl = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)q8_grid));
    const __m256i ta = _mm256_abs_epi8(tl), ones = _mm256_set1_epi16(1);
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    for (int b = 0; b < cols / FE_Q3_BLOCK; b++) {
        const uint8_t *p = row + FE_Q3_BYTES * b;
        const int8_t *q = x->q + FE_Q3_BLOCK * b;
        __m256i w0 = _mm256_loadu_si256((const __m256i *)p), w1 = _mm256_loadu_si256((const __m256i *)(p + 32)),
                w2 = _mm256_loadu_si256((const __m256i *)(p + 64));
        const float *d = x->d + ASCALES * b;
#define DOT32(c)                                                                                         \
    _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_shuffle_epi8(ta, idx##c),                             \
                                           _mm256_sign_epi8(_mm256_loadu_si256((const __m256i *)(q + CHUNK * (c))), \
                                                            _mm256_shuffle_epi8(tl, idx##c))),          \
                      ones)
#if ABLK == 32
#define CH(c)                                                                                            \
    do {                                                                                                 \
        if (((c) & 1) == 0) sg = _mm256_set1_ps(fe_q3_group_scale(p, (c) >> 1));                        \
        __m256i idx##c = spread(fields12(w0, w1, w2, c));                                                \
        acc[(c) & 3] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(DOT32(c)), _mm256_mul_ps(sg, _mm256_broadcast_ss(d + (c))), \
                                       acc[(c) & 3]);                                                    \
    } while (0)
        __m256 sg = _mm256_setzero_ps();
        CH(0); CH(1); CH(2); CH(3); CH(4); CH(5); CH(6); CH(7);
#else /* 64: one activation scale per weight group, the group's two chunks summed as int32 */
#define CH(g)                                                                                            \
    do {                                                                                                 \
        __m256i idx##g##0 = spread(fields12(w0, w1, w2, 2 * (g)));                                      \
        __m256i idx##g##1 = spread(fields12(w0, w1, w2, 2 * (g) + 1));                                  \
        __m256i s = _mm256_add_epi32(DOT32g(g, 0), DOT32g(g, 1));                                        \
        acc[g] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_set1_ps(fe_q3_group_scale(p, g) * d[g]), acc[g]); \
    } while (0)
#define DOT32g(g, h)                                                                                     \
    _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_shuffle_epi8(ta, idx##g##h),                          \
                                           _mm256_sign_epi8(_mm256_loadu_si256((const __m256i *)(q + CHUNK * (2 * (g) + (h)))), \
                                                            _mm256_shuffle_epi8(tl, idx##g##h))),       \
                      ones)
        CH(0); CH(1); CH(2); CH(3);
#undef DOT32g
#endif
#undef DOT32
#undef CH
    }
    return hsum4x8(acc);
}

/* The same integer arithmetic in plain C (the reference a product path would be tested against). */
static float dot_int8_ref(const uint8_t *row, int cols, const qx_t *x) {
    double y = 0;
    for (int b = 0; b < cols / FE_Q3_BLOCK; b++)
        for (int c = 0; c < CHUNKS; c++) {
            int32_t s = 0;
            for (int l = 0; l < 8; l++)
                for (int j = 0; j < 4; j++)
                    s += q8_grid[fe_q3_index(row + FE_Q3_BYTES * b, CHUNK * c + 8 * j + l)] *
                         x->q[FE_Q3_BLOCK * b + CHUNK * c + 4 * l + j];
            y += (double)s * fe_q3_group_scale(row + FE_Q3_BYTES * b, c >> 1) * x->d[(FE_Q3_BLOCK * b + CHUNK * c) / ABLK];
        }
    return (float)y;
}

/* Variant "u8": the grid as unsigned 0..127 with an offset (u_i ~= (level_i + OFF) * KU), so one vpshufb
 * and no vpsignb per 32 weights; the offset's share, OFF * sum(q) per activation scale, is taken off once
 * per group in float (ABLK 64 only). */
static uint8_t u8_grid[16];
static float KU, OFF;

static void make_u8_grid(void) {
    OFF = 0;
    for (int i = 0; i < 8; i++) OFF = fmaxf(OFF, fabsf(fe_q3_levels[i]));
    KU = 127.0f / (2 * OFF);
    for (int i = 0; i < 16; i++) u8_grid[i] = (uint8_t)lrintf((fe_q3_levels[i & 7] + OFF) * KU);
}

/* Per activation scale a: du[a] = d_a / KU and cq[a] = d_a * OFF * sum of the block's q. */
static void u8_scales(const qx_t *x, int cols, float *du, float *cq) {
    for (int a = 0; a < cols / ABLK; a++) {
        int sum = 0;
        for (int i = 0; i < ABLK; i++) sum += x->q[ABLK * a + i];
        float d = x->d[a] * GRID_K;
        du[a] = d / KU, cq[a] = d * OFF * (float)sum;
    }
}

TGT static float dot_u8(const uint8_t *row, int cols, const qx_t *x, const float *du, const float *cq) {
    const __m256i tu = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)u8_grid)), ones = _mm256_set1_epi16(1);
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    float corr = 0;
    for (int b = 0; b < cols / FE_Q3_BLOCK; b++) {
        const uint8_t *p = row + FE_Q3_BYTES * b;
        const int8_t *q = x->q + FE_Q3_BLOCK * b;
        __m256i w0 = _mm256_loadu_si256((const __m256i *)p), w1 = _mm256_loadu_si256((const __m256i *)(p + 32)),
                w2 = _mm256_loadu_si256((const __m256i *)(p + 64));
#define U32(c)                                                                                           \
    _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_shuffle_epi8(tu, spread(fields12(w0, w1, w2, c))),     \
                                           _mm256_loadu_si256((const __m256i *)(q + CHUNK * (c)))),      \
                      ones)
#define UG(g)                                                                                            \
    do {                                                                                                 \
        float sg = fe_q3_group_scale(p, g);                                                              \
        acc[g] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_add_epi32(U32(2 * (g)), U32(2 * (g) + 1))),   \
                                 _mm256_set1_ps(sg * du[ASCALES * b + (g)]), acc[g]);                    \
        corr += sg * cq[ASCALES * b + (g)];                                                              \
    } while (0)
        UG(0); UG(1); UG(2); UG(3);
#undef UG
#undef U32
    }
    return hsum4x8(acc) - corr;
}

static float dot_u8_ref(const uint8_t *row, int cols, const qx_t *x, const float *du, const float *cq) {
    double y = 0;
    for (int b = 0; b < cols / FE_Q3_BLOCK; b++)
        for (int g = 0; g < ASCALES; g++) {
            int32_t s = 0;
            for (int c = 2 * g; c < 2 * g + 2; c++)
                for (int l = 0; l < 8; l++)
                    for (int j = 0; j < 4; j++)
                        s += u8_grid[fe_q3_index(row + FE_Q3_BYTES * b, CHUNK * c + 8 * j + l)] *
                             x->q[FE_Q3_BLOCK * b + CHUNK * c + 4 * l + j];
            double sg = fe_q3_group_scale(row + FE_Q3_BYTES * b, g);
            y += (double)s * sg * du[ASCALES * b + g] - sg * cq[ASCALES * b + g];
        }
    return (float)y;
}

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static double gauss(void) {
    double u[2];
    for (int k = 0; k < 2; k++) {
        rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
        u[k] = ((double)(rng >> 11) + 0.5) / 9007199254740992.0;
    }
    return sqrt(-2 * log(u[0])) * cos(6.283185307179586 * u[1]);
}

static double rel(const float *a, const float *b, int n) {
    double num = 0, den = 0;
    for (int i = 0; i < n; i++) num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]), den += (double)b[i] * b[i];
    return sqrt(num / den);
}

/* Why the f32 kernel is where it is: ns per loop of 8 independent copies of
 * each instruction mix (registers only, 8 accumulator chains for the FMAs),
 * best of 3 runs of 2e7 loops. On a CPU where vpermps issues beside the
 * FMAs, "fma+vpermps" costs about max(fma, vpermps); where they share
 * pipes, about the sum. */
#define OPS8(op) op(0) op(1) op(2) op(3) op(4) op(5) op(6) op(7)
#define OPS8HI(op) op(8) op(9) op(10) op(11) op(12) op(13) op(8) op(9) /* beside OPS8, sources ymm14/15 */
#define FMA_(d) "vfmadd231ps %%ymm15, %%ymm14, %%ymm" #d "\n"
#define PERM_(d) "vpermps %%ymm15, %%ymm14, %%ymm" #d "\n"
#define SHIFT_(d) "vpsrld $3, %%ymm15, %%ymm" #d "\n"
#define SHUF_(d) "vpshufb %%ymm15, %%ymm14, %%ymm" #d "\n"
#define MIX(name, body)                                                                                   \
    do {                                                                                                  \
        double best = 1e9;                                                                                \
        for (int r = 0; r < 3; r++) {                                                                     \
            double t = now();                                                                             \
            for (long i = 0; i < 20000000L; i++)                                                          \
                __asm__ volatile(body ::: "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", \
                                 "xmm8", "xmm9", "xmm10", "xmm11", "xmm12", "xmm13", "xmm14", "xmm15");   \
            t = now() - t;                                                                                \
            best = t < best ? t : best;                                                                   \
        }                                                                                                 \
        printf("%s\"%s\": %.3f", first ? "" : ", ", name, best / 2e7 * 1e9);                              \
        first = 0;                                                                                        \
    } while (0)

TGT static void port_mix(void) {
    int first = 1;
    __asm__ volatile("vxorps %%ymm15, %%ymm15, %%ymm15\n vxorps %%ymm14, %%ymm14, %%ymm14" ::: "xmm14", "xmm15");
    printf("\"port_mix_ns_per_8\": {");
    MIX("fma", OPS8(FMA_));
    MIX("vpermps", OPS8(PERM_));
    MIX("vpsrld", OPS8(SHIFT_));
    MIX("vpshufb", OPS8(SHUF_));
    /* the f32 kernel's mix per 8 vectors of weights: a shift, a vpermps and an FMA each */
    MIX("fma+vpermps", OPS8(FMA_) OPS8HI(PERM_));
    MIX("fma+vpsrld", OPS8(FMA_) OPS8HI(SHIFT_));
    MIX("fma+vpshufb", OPS8(FMA_) OPS8HI(SHUF_));
    MIX("fma+vpermps+vpsrld", OPS8(FMA_) OPS8HI(PERM_) OPS8HI(SHIFT_));
    printf("}, ");
}

/* Relative error of a kernel's y over `rows` rows, and its worst relative distance from its integer reference. */
typedef struct { double vs_f32_kernel, vs_source, vs_reference; } acc_t;

int main(int argc, char **argv) {
    double mb = argc > 1 ? atof(argv[1]) : 96;
    int repeats = argc > 2 ? atoi(argv[2]) : 7;
    if (!ferry_kernels_available(FERRY_KERNELS_AVX2)) {
        printf("{\"error\": \"no AVX2\"}\n");
        return 0;
    }
    make_grid();
    make_u8_grid();
    const int cols = 3584, rb = cols / FE_Q3_BLOCK * FE_Q3_BYTES;
    const int rows = (int)(mb * 1048576 / rb) / 8 * 8, acc_rows = 512;
    /* Accuracy: Gaussian weights quantized by the core; activations Gaussian with log-normal channel scales. */
    float *wf = malloc(sizeof(float) * (size_t)acc_rows * cols), *x = malloc(sizeof(float) * cols);
    for (size_t i = 0; i < (size_t)acc_rows * cols; i++) wf[i] = (float)(0.02 * gauss());
    uint8_t *w = malloc((size_t)rows * rb);
    ferry_q3_quantize_f32(wf, acc_rows, cols, NULL, w);
    for (int r = acc_rows; r < rows; r++) memcpy(w + (size_t)r * rb, w + (size_t)(r % acc_rows) * rb, rb);
    qx_t qx = {malloc(cols), malloc(sizeof(float) * cols / ABLK)};
    float *du = malloc(sizeof(float) * cols / ABLK), *cq = malloc(sizeof(float) * cols / ABLK);
    float *y32 = malloc(sizeof(float) * rows), *y8 = malloc(sizeof(float) * rows), *yf = malloc(sizeof(float) * acc_rows),
          *yr = malloc(sizeof(float) * acc_rows);
    const int variants = ABLK == 64 ? 2 : 1;
    printf("{");
    port_mix();
    printf("\"cols\": %d, \"rows\": %d, \"weight_mb\": %.1f, \"activation_block\": %d, \"q3_nl_vs_f32_source\": [",
           cols, rows, (double)rows * rb / 1048576, ABLK);
    const double sigmas[2] = {0.5, 1.0};
    acc_t acc[2][2];
    for (int k = 0; k < 2; k++) {
        for (int i = 0; i < cols; i++) x[i] = (float)(gauss() * exp(sigmas[k] * gauss()));
        quantize_x(x, cols, &qx);
        u8_scales(&qx, cols, du, cq);
        ferry_kernel_matmul(FERRY_KERNELS_AVX2, FE_Q3_NL, w, acc_rows, cols, x, 1, y32);
        ferry_kernel_matmul(FERRY_KERNELS_SCALAR, FE_F32, wf, acc_rows, cols, x, 1, yf);
        printf("%s{\"log_normal_sigma\": %.1f, \"rel_l2\": %.5f}", k ? ", " : "", sigmas[k], rel(y32, yf, acc_rows));
        for (int v = 0; v < variants; v++) {
            double worst = 0;
            for (int r = 0; r < acc_rows; r++) {
                const uint8_t *wr = w + (size_t)r * rb;
                y8[r] = v ? dot_u8(wr, cols, &qx, du, cq) : dot_int8(wr, cols, &qx);
                yr[r] = v ? dot_u8_ref(wr, cols, &qx, du, cq) : dot_int8_ref(wr, cols, &qx);
                double e = fabs((double)y8[r] - yr[r]) / (fabs((double)yr[r]) + 1e-30);
                worst = e > worst ? e : worst;
            }
            acc[v][k] = (acc_t){rel(y8, y32, acc_rows), rel(y8, yf, acc_rows), worst};
        }
    }
    printf("], \"variants\": [");
    for (int v = 0; v < variants; v++) {
        /* Speed: interleaved repeats of the f32 kernel and this one (x quantization included). */
        double t32 = 1e9, t8 = 1e9;
        volatile float sink = 0;
        for (int rep = 0; rep < repeats; rep++) {
            double t = now();
            ferry_kernel_matmul(FERRY_KERNELS_AVX2, FE_Q3_NL, w, rows, cols, x, 1, y32);
            t = now() - t, t32 = t < t32 ? t : t32;
            t = now();
            quantize_x(x, cols, &qx);
            if (v) {
                u8_scales(&qx, cols, du, cq);
                for (int r = 0; r < rows; r++) y8[r] = dot_u8(w + (size_t)r * rb, cols, &qx, du, cq);
            } else {
                for (int r = 0; r < rows; r++) y8[r] = dot_int8(w + (size_t)r * rb, cols, &qx);
            }
            t = now() - t, t8 = t < t8 ? t : t8;
            sink += y8[rep] + y32[rep];
        }
        double bytes = (double)rows * rb;
        printf("%s{\"grid\": \"%s\", \"f32_kernel_weight_gb_s\": %.2f, \"int8_kernel_weight_gb_s\": %.2f, \"speedup\": %.2f, "
               "\"accuracy\": [",
               v ? ", " : "", v ? "u8 0..127 + offset" : "s8 |level| <= 127, vpsignb", bytes / t32 / 1e9, bytes / t8 / 1e9,
               t32 / t8);
        for (int k = 0; k < 2; k++)
            printf("%s{\"log_normal_sigma\": %.1f, \"vs_f32_kernel\": %.5f, \"vs_f32_source\": %.5f, "
                   "\"simd_vs_integer_reference_worst\": %.2g}",
                   k ? ", " : "", sigmas[k], acc[v][k].vs_f32_kernel, acc[v][k].vs_source, acc[v][k].vs_reference);
        printf("]}");
        (void)sink;
    }
    printf("]}\n");
    return 0;
}
