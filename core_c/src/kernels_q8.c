/* kernels_q8.c — the 8-bit-activation mode's quantizer, its scalar reference
 * kernels (the definition every SIMD set repeats bit for bit: kernels_q8.h),
 * the table of sets, and the public ferry_kernel_matmul_q8. No state. */
#define _POSIX_C_SOURCE 200809L
#include "kernels_q8.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../include/ferry_kernels.h"
#include "common.h"
#include "kernels.h"

size_t fe_q8_stride(int cols) { return FE_ALIGN_UP((size_t)cols + 8 * (size_t)(cols / FE_Q8_BLOCK), 64); }

size_t fe_q8k_stride(int cols) {
    return FE_ALIGN_UP((size_t)cols + 4 * (size_t)(cols / FE_Q8K_BLOCK) + 2 * (size_t)(cols / 16), 64);
}

size_t fe_q8_stride_kind(int kind, int cols) {
    return kind == FE_Q8_KIND_256 ? fe_q8k_stride(cols)
           : kind == FE_Q8_KIND_32S || kind == FE_Q8_KIND_32TS ? fe_q8_stride(cols) + FE_ALIGN_UP((size_t)cols, 64)
                                    : fe_q8_stride(cols);
}

int fe_q8_kind(int fmt) {
    return fmt == FE_Q4_K || fmt == FE_Q5_K || fmt == FE_Q6_K ? FE_Q8_KIND_256 : fmt == FE_Q3_NL ? FE_Q8_KIND_32T : FE_Q8_KIND_32;
}

int fe_q8_layout(const fe_q8_kernels *k, int fmt, int n) { return k->layout ? k->layout(fmt, n) : fe_q8_kind(fmt); }

unsigned fe_q8_kinds(const fe_q8_kernels *k, const unsigned char fmts[FE_N_FORMATS], int n_max) {
    unsigned kinds = 0;
    for (int f = 0; k && f < FE_N_FORMATS; f++)
        if (fmts[f] && fe_q8_rowdot(k, f))
            for (int n = 1; n <= n_max; n++) kinds |= 1u << fe_q8_layout(k, f, n);
    return kinds;
}

size_t fe_q8_buffer_bytes(unsigned kinds, int cols, int n) {
    size_t bytes = 0;
    for (int kind = 0; kind < FE_Q8_KINDS; kind++)
        if (kinds >> kind & 1u) bytes += (size_t)n * fe_q8_stride_kind(kind, cols);
    return bytes;
}

size_t fe_q8_plan_bytes(const fe_q8_kernels *k, const unsigned char fmts[FE_N_FORMATS], int cols, int chunk,
                        unsigned *kinds_out) {
    const unsigned kinds = cols > 0 && chunk > 0 ? fe_q8_kinds(k, fmts, chunk) : 0;
    if (kinds_out) *kinds_out = kinds;
    return kinds ? fe_q8_buffer_bytes(kinds, cols / FE_Q8_BLOCK * FE_Q8_BLOCK, chunk) : 0;
}

/* The regions of q->kinds side by side in the enum's order. */
uint8_t *fe_q8_region(const fe_q8_ctx *q, int kind, int cols, int n) {
    return q->buf + fe_q8_buffer_bytes(q->kinds & ((1u << kind) - 1u), cols, n);
}

static void add_sums(uint8_t *xq, int cols, int n, size_t st, int k) {
    for (int t = 0; t < n; t++) {
        const int8_t *q = (const int8_t *)(xq + (size_t)t * st);
        int32_t *c = (int32_t *)(xq + (size_t)t * st + fe_q8_sums_offset(cols));
        for (int i = 0; i < cols / 4; i++) c[i] = k * (q[4 * i] + q[4 * i + 1] + q[4 * i + 2] + q[4 * i + 3]);
    }
}

static void to_32t(uint8_t *xq, int cols, int n, size_t st) {
    for (int t = 0; t < n; t++)
        for (int b = 0; b < cols / FE_Q8_BLOCK; b++) {
            uint8_t tmp[FE_Q8_BLOCK], *p = xq + (size_t)t * st + (size_t)b * FE_Q8_BLOCK;
            for (int l = 0; l < 8; l++)
                for (int j = 0; j < 4; j++) tmp[4 * l + j] = p[8 * j + l];
            memcpy(p, tmp, sizeof tmp);
        }
}

/* (the blocks are in their tiles already: fe_q8_z_block) */
static void to_32z(uint8_t *xq, int cols, int n, size_t st) {
    const int pairs = cols / FE_Q8_BLOCK / 2;
    for (int t0 = 0, k; t0 < n; t0 += k) {
        int first;
        fe_q8_z_tile(n, t0, &first, &k);
        uint8_t *q = xq + (size_t)t0 * st;
        for (size_t i = 0; i < (size_t)k * (size_t)cols; i++) q[i] ^= 0x80;
        for (size_t c = 0; c < (size_t)pairs * (size_t)k; c++) { /* each token's block pair: 64 bytes */
            uint8_t tmp[2 * FE_Q8_BLOCK], *p = q + c * 2 * FE_Q8_BLOCK;
            for (int l = 0; l < 8; l++) {
                memcpy(tmp + 8 * l, p + 4 * l, 4);
                memcpy(tmp + 8 * l + 4, p + FE_Q8_BLOCK + 4 * l, 4);
            }
            memcpy(p, tmp, sizeof tmp);
        }
    }
}

void fe_q8_finish(int kind, uint8_t *out, int cols, int n) {
    const size_t st = fe_q8_stride_kind(kind, cols);
    if (kind == FE_Q8_KIND_32Z) to_32z(out, cols, n, st);
    if (kind == FE_Q8_KIND_32T || kind == FE_Q8_KIND_32TS) to_32t(out, cols, n, st);
    if (kind == FE_Q8_KIND_32S || kind == FE_Q8_KIND_32TS) add_sums(out, cols, n, st, kind == FE_Q8_KIND_32S ? -8 : -128);
}

/* Round to nearest, ties to even, for |v| < 2^22 (the default rounding mode
 * of the add; the core is built without fast-math, so it is not folded). */
static inline float round_even(float v) {
    const float magic = 12582912.0f; /* 1.5 * 2^23 */
    return v >= 0.0f ? (v + magic) - magic : (v - magic) + magic;
}

/* `len` values v into q[len] with one scale and the sums of q per 16 values:
 * returns d = max|v| / 127 (the reference of every set's quantizer). */
static float quantize_run(const float *v, int len, int8_t *q, int *sums) {
    float amax = 0.0f;
    for (int i = 0; i < len; i++) {
        float a = fabsf(v[i]);
        amax = a > amax ? a : amax; /* a NaN is skipped */
    }
    const float id = amax > 0.0f ? 127.0f / amax : 0.0f;
    for (int i = 0; i < len; i++) {
        float r = v[i] * id;
        r = r > 127.0f ? 127.0f : r < -127.0f ? -127.0f : r == r ? round_even(r) : 0.0f;
        q[i] = (int8_t)r;
    }
    for (int g = 0; g < len / 16; g++) {
        sums[g] = 0;
        for (int i = 16 * g; i < 16 * g + 16; i++) sums[g] += q[i];
    }
    return amax / 127.0f;
}

FE_Q8_QUANTIZER(quantize_scalar, , quantize_run)

void fe_q8_quantize(int kind, const float *x, size_t xs, int cols, int n, uint8_t *out) {
    quantize_scalar(kind, x, xs, cols, n, out);
}

/* ---------------------------------------------------- the scalar reference */

static float rd_f16(const uint8_t *p) { return fe_f16_to_f32((uint16_t)(p[0] | p[1] << 8)); }

/* Block b (32 values) of a stored row as integers: qw[32], the integer
 * scales S[0] (values 0-15) and S[1] (16-31), the float scale D and the
 * float minimum M (0 for formats without one). */
static void decode_block(int fmt, const uint8_t *row, int b, int qw[32], int S[2], float *D, float *M) {
    S[0] = S[1] = 1;
    *M = 0.0f;
    switch (fmt) {
    case FE_Q8_0: {
        const uint8_t *p = row + 34 * (size_t)b;
        *D = rd_f16(p);
        for (int i = 0; i < 32; i++) qw[i] = (int8_t)p[2 + i];
    } break;
    case FE_Q4_0: case FE_Q4_1: {
        const int one = fmt == FE_Q4_1;
        const uint8_t *p = row + (one ? 20 : 18) * (size_t)b, *q = p + (one ? 4 : 2);
        *D = rd_f16(p);
        if (one) *M = rd_f16(p + 2);
        for (int i = 0; i < 16; i++) {
            qw[i] = (q[i] & 15) - (one ? 0 : 8);
            qw[i + 16] = (q[i] >> 4) - (one ? 0 : 8);
        }
    } break;
    case FE_Q4_K: case FE_Q5_K: {
        const int five = fmt == FE_Q5_K, k = b & 7;
        const uint8_t *p = row + (five ? 176 : 144) * (size_t)(b >> 3);
        const uint8_t *qh = p + 16, *q = p + (five ? 48 : 16) + 32 * (k >> 1);
        int sc, m;
        fe_q4k_scale_min(k, p + 4, &sc, &m);
        *D = rd_f16(p);
        *M = rd_f16(p + 2) * (float)m;
        S[0] = S[1] = sc;
        for (int l = 0; l < 32; l++)
            qw[l] = ((k & 1) ? q[l] >> 4 : q[l] & 15) | (five ? ((qh[l] >> k) & 1) << 4 : 0);
    } break;
    case FE_Q6_K: {
        const int k = b & 7, half = k >> 2, r = k & 3;
        const uint8_t *p = row + 210 * (size_t)(b >> 3);
        const uint8_t *ql = p + 64 * half + 32 * (r & 1), *qh = p + 128 + 32 * half;
        const int8_t *sc = (const int8_t *)(p + 192 + 8 * half);
        *D = rd_f16(p + 208);
        S[0] = sc[2 * r];
        S[1] = sc[2 * r + 1];
        for (int l = 0; l < 32; l++)
            qw[l] = (int)(((r >> 1) ? ql[l] >> 4 : ql[l] & 15) | ((qh[l] >> (2 * r)) & 3) << 4) - 32;
    } break;
    case FE_IQ4_XS: {
        const uint8_t *p = row + FE_IQ4_BYTES * (size_t)(b >> 3), *q = p + 8 + 16 * (b & 7);
        *D = fe_iq4xs_scale(p, b & 7);
        for (int i = 0; i < 16; i++) {
            qw[i] = fe_iq4_values[q[i] & 15];
            qw[i + 16] = fe_iq4_values[q[i] >> 4];
        }
    } break;
    default: memset(qw, 0, 32 * sizeof *qw); *D = 0.0f; break;
    }
}

/* The K-quants (kernels_q8.h): super-block j of a row as unsigned integers
 * qw[256], the integer scale of each 16 values S[16], the minimum of each
 * 32 m[8] (Q4_K/Q5_K; 0 for Q6_K), and the float scales D and Dmin. */
static void decode_super(int fmt, const uint8_t *row, int j, int qw[256], int S[16], int m[8], float *D, float *Dmin) {
    *Dmin = 0.0f;
    for (int k = 0; k < 8; k++) {
        int q[32], S2[2];
        float Dk, Mk;
        decode_block(fmt, row, 8 * j + k, q, S2, &Dk, &Mk);
        for (int i = 0; i < 32; i++) qw[32 * k + i] = q[i] + (fmt == FE_Q6_K ? 32 : 0);
        S[2 * k] = S2[0], S[2 * k + 1] = S2[1];
        m[k] = 0;
        if (fmt != FE_Q6_K) fe_q4k_scale_min(k, row + (fmt == FE_Q5_K ? 176 : 144) * (size_t)j + 4, &S2[0], &m[k]);
        *D = Dk;
    }
    if (fmt != FE_Q6_K) *Dmin = rd_f16(row + (fmt == FE_Q5_K ? 176 : 144) * (size_t)j + 2);
}

static void rowdot_ref_k(int fmt, const uint8_t *row, int cols, const uint8_t *xq, int n, float *y, size_t ys) {
    const int nsb = cols / FE_Q8K_BLOCK;
    const size_t st = fe_q8k_stride(cols);
    for (int t = 0; t < n; t++) {
        const int8_t *qx = (const int8_t *)(xq + (size_t)t * st);
        const float *dx = (const float *)(xq + (size_t)t * st + (size_t)cols);
        const int16_t *bs = (const int16_t *)(dx + nsb);
        float acc[8] = {0};
        for (int j = 0; j < nsb; j++) {
            int qw[256], S[16], m[8];
            float D, Dmin;
            decode_super(fmt, row, j, qw, S, m, &D, &Dmin);
            const int8_t *x = qx + 256 * (size_t)j;
            const int16_t *b = bs + 16 * (size_t)j;
            for (int l = 0; l < 8; l++) {
                int32_t P = 0;
                for (int k = 0; k < 8; k++) {
                    int p = 0;
                    for (int i = 32 * k + 4 * l; i < 32 * k + 4 * l + 4; i++) p += qw[i] * x[i];
                    P += S[2 * k + l / 4] * p;
                }
                if (fmt == FE_Q6_K) P -= 32 * (S[2 * l] * b[2 * l] + S[2 * l + 1] * b[2 * l + 1]);
                acc[l] = fmaf(D * dx[j], (float)P, acc[l]);
                if (fmt != FE_Q6_K) acc[l] = fmaf(-(Dmin * dx[j]), (float)(m[l] * (b[2 * l] + b[2 * l + 1])), acc[l]);
            }
        }
        y[(size_t)t * ys] = fe_q8_hsum8(acc);
    }
}

static void rowdot_ref(int fmt, const uint8_t *row, int cols, const uint8_t *xq, int n, float *y, size_t ys) {
    if (fe_q8_kind(fmt) == FE_Q8_KIND_256) {
        rowdot_ref_k(fmt, row, cols, xq, n, y, ys);
        return;
    }
    const int nb = cols / FE_Q8_BLOCK, sign = fmt == FE_Q4_1;
    const size_t st = fe_q8_stride(cols);
    for (int t = 0; t < n; t++) {
        const int8_t *qx = (const int8_t *)(xq + (size_t)t * st);
        const float *dx = (const float *)(xq + (size_t)t * st + (size_t)cols), *sx = dx + nb;
        float acc[2][8] = {{0}}, m1[2] = {0};
        for (int b = 0; b < nb; b++) {
            int qw[32], S[2];
            float D, M;
            decode_block(fmt, row, b, qw, S, &D, &M);
            const float a = D * dx[b];
            for (int l = 0; l < 8; l++) {
                int p = 0;
                for (int i = 4 * l; i < 4 * l + 4; i++) p += qw[i] * qx[32 * b + i];
                acc[b & 1][l] = fmaf(a, (float)(S[l >> 2] * p), acc[b & 1][l]);
            }
            if (sign) m1[b & 1] = fmaf(M, sx[b], m1[b & 1]);
        }
        float both[8];
        for (int l = 0; l < 8; l++) both[l] = acc[0][l] + acc[1][l];
        float r = fe_q8_hsum8(both);
        if (sign) r = r + (m1[0] + m1[1]);
        y[(size_t)t * ys] = r;
    }
}

/* q3_nl (kernels_q8.h): FE_Q8_KIND_32T activations. */
static void rowdot_q8ref_q3_nl(const uint8_t *row, int cols, const uint8_t *xq, int n, float *y, size_t ys) {
    static const int8_t G[8] = FE_Q3_Q8_GRID;
    const size_t st = fe_q8_stride(cols);
    for (int t = 0; t < n; t++) {
        const int8_t *qx = (const int8_t *)(xq + (size_t)t * st);
        const float *dx = (const float *)(xq + (size_t)t * st + (size_t)cols);
        float acc[2][8] = {{0}};
        for (int b = 0; b < cols / FE_Q3_BLOCK; b++) {
            const uint8_t *p = row + FE_Q3_BYTES * (size_t)b;
            for (int c = 0; c < 8; c++) {
                const float a = fe_q3_q8_scale(p, c >> 1) * dx[8 * b + c];
                const int8_t *x = qx + FE_Q3_BLOCK * (size_t)b + 32 * c;
                for (int l = 0; l < 8; l++) {
                    int32_t P = 0;
                    for (int j = 0; j < 4; j++) P += G[fe_q3_index(p, 32 * c + 8 * j + l)] * x[4 * l + j];
                    acc[c & 1][l] = fmaf(a, (float)P, acc[c & 1][l]);
                }
            }
        }
        float both[8];
        for (int l = 0; l < 8; l++) both[l] = acc[0][l] + acc[1][l];
        y[(size_t)t * ys] = fe_q8_hsum8(both);
    }
}

#define REF(F, CODE)                                                                                      \
    static void rowdot_q8ref_##F(const uint8_t *row, int cols, const uint8_t *xq, int n, float *y, size_t ys) { \
        rowdot_ref(CODE, row, cols, xq, n, y, ys);                                                        \
    }
REF(q8_0, FE_Q8_0)
REF(q4_0, FE_Q4_0)
REF(q4_1, FE_Q4_1)
REF(q4_k, FE_Q4_K)
REF(q5_k, FE_Q5_K)
REF(q6_k, FE_Q6_K)
REF(iq4_xs, FE_IQ4_XS)
#undef REF

static const fe_q8_kernels SCALAR_Q8 = {
    "scalar",
    {[FE_Q8_0] = rowdot_q8ref_q8_0, [FE_Q4_0] = rowdot_q8ref_q4_0, [FE_Q4_1] = rowdot_q8ref_q4_1,
     [FE_Q4_K] = rowdot_q8ref_q4_k, [FE_Q5_K] = rowdot_q8ref_q5_k, [FE_Q6_K] = rowdot_q8ref_q6_k,
     [FE_Q3_NL] = rowdot_q8ref_q3_nl, [FE_IQ4_XS] = rowdot_q8ref_iq4_xs},
    quantize_scalar,
    NULL,
    {NULL},
    0,
    {NULL},
    0,
    0,
};

const fe_q8_kernels *fe_q8_kernels_get(int impl) {
    switch (impl) {
    case FE_KERNELS_SCALAR: return &SCALAR_Q8;
    case FE_KERNELS_AVX2: return fe_cpu_has_avx2() ? fe_q8_kernels_avx2() : NULL;
    case FE_KERNELS_NEON: return fe_q8_kernels_neon();
    case FE_Q8_AVX512VNNI: return fe_cpu_has_avx512vnni() ? fe_q8_kernels_avx512vnni() : NULL;
    default: return NULL;
    }
}

_Static_assert(FE_Q8_AVX512VNNI == FE_KERNELS_N && FE_Q8_AVX512VNNI == FERRY_KERNELS_AVX512VNNI,
               "the q8-only set follows the exact sets' ids");

int fe_q8_best(int impl) {
    return impl == FE_KERNELS_AVX2 && fe_q8_kernels_get(FE_Q8_AVX512VNNI) ? FE_Q8_AVX512VNNI : impl;
}

fe_q8dot_fn fe_q8_rowdot(const fe_q8_kernels *k, int fmt) {
    if (!k || fmt < 0 || fmt >= FE_N_FORMATS) return NULL;
    if (fmt == FE_IQ4_XS && k != &SCALAR_Q8) {
        const int impl = strcmp(k->name, "avx512vnni") == 0 ? FE_Q8_AVX512VNNI : fe_kernels_by_name(k->name);
        fe_q8dot_fn f = fe_iq4xs_q8_kernel(impl);
        return f ? f : SCALAR_Q8.rowdot[fmt];
    }
    return k->rowdot[fmt];
}

fe_q8dot_fn fe_q8_kernel_for(const fe_q8_ctx *q, int fmt, int cols, int n) {
    if (!q || !q->k || fmt < 0 || fmt >= FE_N_FORMATS || cols <= 0 || cols % FE_Q8_BLOCK) return NULL;
    if ((fe_q8_kind(fmt) == FE_Q8_KIND_256 || fmt == FE_Q3_NL || fmt == FE_IQ4_XS) && cols % FE_Q8K_BLOCK) return NULL;
    if (!(q->kinds >> fe_q8_layout(q->k, fmt, n) & 1u) || fe_q8_buffer_bytes(q->kinds, cols, n) > q->bytes) return NULL;
    return fe_q8_rowdot(q->k, fmt);
}

fe_q8dot2_fn fe_q8_kernel2_for(const fe_q8_kernels *k, int fmt, int n) {
    if (!k || fmt < 0 || fmt >= FE_N_FORMATS || n < k->rowdot2_min_tokens) return NULL;
    return k->rowdot2[fmt];
}

fe_q8dot4_fn fe_q8_kernel4_for(const fe_q8_kernels *k, int fmt, int n) {
    if (!k || fmt < 0 || fmt >= FE_N_FORMATS || n > k->rowdot4_max_tokens) return NULL;
    return k->rowdot4[fmt];
}

/* Rows [r0, r1) of a matrix (row stride rb) with kernel `one`, in fours with
 * `four` (1-3 tokens) or 4 or 2 at a time with `two` where they are not NULL
 * (as ops.c's product driver, without its prefetch); y + r for row r (ys
 * apart per token). */
static void q8_rows(fe_q8dot_fn one, fe_q8dot2_fn two, fe_q8dot4_fn four, const uint8_t *w, uint64_t rb, int r0,
                    int r1, int cols, const uint8_t *xq, int n, float *y, size_t ys) {
    for (int r = r0; r < r1;) {
        const int nr = fe_q8_rows_next(four != NULL, two != NULL, r1 - r);
        if (nr == 4 && four)
            four(w + (uint64_t)r * rb, (size_t)rb, cols, xq, n, y + r, ys, NULL);
        else if (nr > 1)
            two(w + (uint64_t)r * rb, (size_t)rb, nr, cols, xq, n, y + r, ys);
        else
            one(w + (uint64_t)r * rb, cols, xq, n, y + r, ys);
        r += nr;
    }
}

/* ----------------------------------------------------------- public API */

int ferry_kernel_matmul_q8(int impl, int fmt, const void *w, int rows, int cols, const float *x, int n, float *y) {
    const fe_q8_kernels *k = fe_q8_kernels_get(impl);
    uint64_t rb = fe_row_bytes(fmt, (uint64_t)(cols > 0 ? cols : 0));
    if (!k || fmt < 0 || fmt >= FE_N_FORMATS || !fe_q8_rowdot(k, fmt) || !w || !x || !y || rows < 0 || n < 0 || rb == 0 ||
        cols % FE_Q8_BLOCK || ((fe_q8_kind(fmt) == FE_Q8_KIND_256 || fmt == FE_Q3_NL || fmt == FE_IQ4_XS) && cols % FE_Q8K_BLOCK))
        return -1;
    const int kind = fe_q8_layout(k, fmt, n);
    uint8_t *xq = malloc(fe_q8_stride_kind(kind, cols) * (size_t)(n > 0 ? n : 1));
    if (!xq) return -1;
    k->quantize(kind, x, (size_t)cols, cols, n, xq);
    q8_rows(fe_q8_rowdot(k, fmt), fe_q8_kernel2_for(k, fmt, n), fe_q8_kernel4_for(k, fmt, n), (const uint8_t *)w, rb, 0,
            rows, cols, xq, n, y, (size_t)rows);
    free(xq);
    return 0;
}

int ferry_q8_kernels_available(int impl) { return fe_q8_kernels_get(impl) != NULL; }

const char *ferry_q8_kernels_name(int impl) {
    const fe_q8_kernels *k = impl == FE_Q8_AVX512VNNI ? fe_q8_kernels_avx512vnni() : fe_q8_kernels_get(impl);
    return k ? k->name : impl >= 0 && impl < FE_KERNELS_N ? ferry_kernels_name(impl) : "unknown";
}

uint64_t ferry_q8_buffer_bytes(const int *fmts, int n, int cols, int chunk) {
    unsigned char used[FE_N_FORMATS] = {0};
    for (int i = 0; fmts && i < n; i++)
        if (fmts[i] >= 0 && fmts[i] < FE_N_FORMATS) used[fmts[i]] = 1;
    return fe_q8_plan_bytes(fe_q8_kernels_get(fe_q8_best(fe_kernels_best())), used, cols, chunk, NULL);
}

int ferry_q8_activations_supported(int fmt) {
    return fmt >= 0 && fmt < FE_N_FORMATS && SCALAR_Q8.rowdot[fmt] != NULL;
}
