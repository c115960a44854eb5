/* kernels.c — the scalar reference row kernels, the table of implementations
 * (which ones this build and CPU can run), and the public kernel entry points
 * of ferry_kernels.h. Nothing here keeps state: engines hold their own choice. */
#define _POSIX_C_SOURCE 200809L
#include "kernels.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../include/ferry_kernels.h"

/* The reference: widen the row to f32 (fe_dequant_row), then fe_dot_f32. */
static void rowdot_scalar(int fmt, const uint8_t *row, int cols, const float *x, size_t xs, int n, float *y,
                          size_t ys, float *scratch) {
    const float *w = (const float *)row;
    if (fmt != FE_F32) {
        fe_dequant_row(fmt, row, scratch, cols);
        w = scratch;
    }
    for (int t = 0; t < n; t++) y[(size_t)t * ys] = fe_dot_f32(w, x + (size_t)t * xs, cols);
}

#define SCALAR(F, CODE)                                                                                  \
    static void rowdot_scalar_##F(const uint8_t *row, int cols, const float *x, size_t xs, int n, float *y, \
                                  size_t ys, float *scratch) {                                           \
        rowdot_scalar(CODE, row, cols, x, xs, n, y, ys, scratch);                                        \
    }
SCALAR(f32, FE_F32)
SCALAR(f16, FE_F16)
SCALAR(bf16, FE_BF16)
SCALAR(q8_0, FE_Q8_0)
SCALAR(q4_0, FE_Q4_0)
SCALAR(q4_1, FE_Q4_1)
SCALAR(q4_k, FE_Q4_K)
SCALAR(q5_k, FE_Q5_K)
SCALAR(q6_k, FE_Q6_K)
SCALAR(q3_nl, FE_Q3_NL)
SCALAR(q2_vq, FE_Q2_VQ)
SCALAR(iq4_xs, FE_IQ4_XS)
#undef SCALAR

void fe_axpy_f32(float *y, float w, const float *x, int n) {
    for (int i = 0; i < n; i++) y[i] += w * x[i];
}
void fe_att_scores_f32(const float *q, int nq, const float *kt, int hd, int nk, float scale, float *out, size_t os) {
    for (int r = 0; r < nq; r++)
        for (int i = 0; i < nk; i++) {
            float s = 0.0f;
            for (int c = 0; c < hd; c++) s = fmaf(q[(size_t)r * (size_t)hd + (size_t)c], kt[fe_kt_index(i, c, hd)], s);
            out[(size_t)r * os + (size_t)i] = s * scale;
        }
}

void fe_att_wsum_f32(float *out, int nq, const float *p, size_t ps, const float *v, size_t vs, int np, int hd) {
    for (int r = 0; r < nq; r++)
        for (int c = 0; c < hd; c++) {
            float a = 0.0f;
            for (int i = 0; i < np; i++) a = fmaf(p[(size_t)r * ps + (size_t)i], v[(size_t)i * vs + (size_t)c], a);
            out[(size_t)r * (size_t)hd + (size_t)c] = a;
        }
}

float fe_exp_neg(float x) {
    x = x > -87.33654f ? x : -87.33654f;
    const float n = nearbyintf(x * 1.44269504088896341f);
    float r = fmaf(-n, 0.693359375f, x);
    r = fmaf(-n, -2.12194440e-4f, r);
    float p = 1.9875691500e-4f;
    p = fmaf(p, r, 1.3981999507e-3f);
    p = fmaf(p, r, 8.3334519073e-3f);
    p = fmaf(p, r, 4.1665795894e-2f);
    p = fmaf(p, r, 1.6666665459e-1f);
    p = fmaf(p, r, 5.0000001201e-1f);
    p = fmaf(p, r * r, r + 1.0f);
    const uint32_t bits = (uint32_t)((int32_t)n + 127) << 23;
    float two_n;
    memcpy(&two_n, &bits, sizeof two_n);
    return p * two_n;
}

void fe_att_softmax(float *x, int n) {
    if (n <= 0) return;
    float m = x[0];
    for (int i = 1; i < n; i++) m = x[i] > m ? x[i] : m;
    float s[16] = {0};
    for (int i = 0; i < n; i++) {
        const float d = x[i] - m;
        x[i] = d >= FE_ATT_CUT ? fe_exp_neg(d) : 0.0f;
        s[i % 16] += x[i];
    }
    float a[4];
    for (int l = 0; l < 4; l++) a[l] = (s[l] + s[l + 8]) + (s[l + 4] + s[l + 12]);
    const float inv = 1.0f / ((a[0] + a[2]) + (a[1] + a[3]));
    for (int i = 0; i < n; i++) x[i] *= inv;
}

void fe_softmax(float *x, int n) {
    float m = x[0];
    for (int i = 1; i < n; i++) m = x[i] > m ? x[i] : m;
    double sum = 0.0;
    for (int i = 0; i < n; i++) { x[i] = expf(x[i] - m); sum += x[i]; }
    float inv = (float)(1.0 / sum);
    for (int i = 0; i < n; i++) x[i] *= inv;
}
#define dot_scalar fe_dot_f32
#define axpy_scalar fe_axpy_f32
#define att_scores_scalar fe_att_scores_f32
#define att_wsum_scalar fe_att_wsum_f32
#define att_softmax_scalar fe_att_softmax

FE_KERNEL_TABLE(SCALAR_TABLE, scalar);

const fe_kernels *fe_kernels_get(int impl) {
    switch (impl) {
    case FE_KERNELS_SCALAR: return &SCALAR_TABLE;
    case FE_KERNELS_AVX2: return fe_cpu_has_avx2() ? fe_kernels_avx2_table() : NULL;
    case FE_KERNELS_NEON: return fe_kernels_neon_table();
    default: return NULL;
    }
}

int fe_kernels_best(void) {
    for (int i = FE_KERNELS_N - 1; i > 0; i--)
        if (fe_kernels_get(i)) return i;
    return FE_KERNELS_SCALAR;
}

int fe_kernels_by_name(const char *name) {
    for (int i = 0; name && i < FE_KERNELS_N; i++)
        if (strcmp(name, ferry_kernels_name(i)) == 0) return i;
    return -1;
}

int fe_simd_variant(int impl) {
    if (impl == FE_KERNELS_AVX2) return fe_cpu_has_avx512() ? FE_SIMD_AVX512 : FE_SIMD_AVX2;
    if (impl == FE_KERNELS_NEON) return FE_SIMD_NEON;
    return FE_SIMD_SCALAR;
}

fe_rowdot_fn fe_kernel_for(const fe_kernels *k, int fmt) {
    if (fmt < 0 || fmt >= FE_N_FORMATS) return NULL;
    if (fmt == FE_IQ4_XS) { /* kept outside the tables (kernels.h) */
        fe_rowdot_fn f = k ? fe_iq4xs_kernel(fe_simd_variant(fe_kernels_by_name(k->name))) : NULL;
        return f ? f : rowdot_scalar_iq4_xs;
    }
    if (fmt == FE_Q2_VQ) { /* kept outside the tables (kernels.h) */
        fe_rowdot_fn f = k ? fe_q2vq_kernel(fe_simd_variant(fe_kernels_by_name(k->name))) : NULL;
        return f ? f : rowdot_scalar_q2_vq;
    }
    if (k && k->rowdot[fmt]) return k->rowdot[fmt];
    return SCALAR_TABLE.rowdot[fmt];
}

/* ----------------------------------------------------------- public API */

const char *ferry_kernels_name(int impl) {
    static const char *names[FE_KERNELS_N] = {"scalar", "avx2", "neon"};
    return (impl >= 0 && impl < FE_KERNELS_N) ? names[impl] : "unknown";
}

int ferry_kernels_available(int impl) { return fe_kernels_get(impl) != NULL; }

int ferry_kernels_best(void) { return fe_kernels_best(); }

int ferry_format_code(const char *name) { return name ? fe_format_from_name(name) : -1; }

uint64_t ferry_format_row_bytes(int fmt, uint64_t cols) { return fe_row_bytes(fmt, cols); }

int ferry_formats(ferry_format_record *out, int cap) {
    for (int i = 0; out && i < FE_N_FORMATS && i < cap; i++) {
        const fe_format_info *f = fe_format_get(i);
        out[i] = (ferry_format_record){i, f->name, f->block_elems, f->block_bytes};
    }
    return FE_N_FORMATS;
}

int ferry_dequantize(int fmt, const void *src, int rows, int cols, float *out) {
    uint64_t rb = fe_row_bytes(fmt, (uint64_t)(cols > 0 ? cols : 0));
    if (!src || !out || rows < 0 || rb == 0) return -1;
    for (int r = 0; r < rows; r++)
        fe_dequant_row(fmt, (const uint8_t *)src + (uint64_t)r * rb, out + (size_t)r * (size_t)cols, cols);
    return 0;
}

int ferry_kernel_matmul(int impl, int fmt, const void *w, int rows, int cols, const float *x, int n, float *y) {
    const fe_kernels *k = fe_kernels_get(impl);
    uint64_t rb = fe_row_bytes(fmt, (uint64_t)(cols > 0 ? cols : 0));
    if (!k || !w || !x || !y || rows < 0 || n < 0 || rb == 0) return -1;
    fe_rowdot_fn f = fe_kernel_for(k, fmt);
    /* a batch goes through the set's several-rows kernel when it has one, as in the engine (ops.c) */
    fe_rowsdot_fn many = n > 1 && fmt >= 0 && fmt < FE_N_FORMATS ? k->rowsdot[fmt] : NULL;
    float *scratch = malloc((size_t)FE_ROWS_PER_CALL * (size_t)FE_ROWS_WS(cols > 0 ? cols : 1) * sizeof(float));
    if (!scratch) return -1;
    for (int r = 0; r < rows; r += many ? FE_ROWS_PER_CALL : 1) {
        const uint8_t *row = (const uint8_t *)w + (uint64_t)r * rb;
        if (many)
            many(row, rb, rows - r < FE_ROWS_PER_CALL ? rows - r : FE_ROWS_PER_CALL, cols, x, (size_t)cols, n, y + r,
                 (size_t)rows, scratch);
        else
            f(row, cols, x, (size_t)cols, n, y + r, (size_t)rows, scratch);
    }
    free(scratch);
    return 0;
}

uint64_t ferry_memory_read(const void *p, size_t nbytes, int reps, int streams) {
    if (!p || reps <= 0 || streams < 1 || streams > 8) return 0;
    if (fe_cpu_has_avx2()) return fe_memory_read_simd(p, nbytes, reps, streams);
    size_t per = nbytes / (size_t)streams / 128 * 128;
    uint64_t a0 = 0, a1 = 0, a2 = 0, a3 = 0;
    for (int r = 0; r < reps; r++)
        for (size_t off = 0; off < per; off += 128)
            for (int s = 0; s < streams; s++) {
                const uint64_t *v = (const uint64_t *)((const uint8_t *)p + (size_t)s * per + off);
                for (int i = 0; i < 16; i += 4) {
                    a0 ^= v[i];
                    a1 ^= v[i + 1];
                    a2 ^= v[i + 2];
                    a3 ^= v[i + 3];
                }
            }
    return a0 ^ a1 ^ a2 ^ a3;
}
