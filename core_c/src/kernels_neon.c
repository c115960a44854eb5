/* kernels_neon.c — fused dequantize-and-dot row kernels for aarch64 NEON
 * (baseline on every aarch64 CPU, so no run-time check).
 *
 * Same structure as kernels_avx2.c: 32 values are decoded into eight
 * 4-lane vectors, vector j goes to accumulator j % 4 of its token, tokens
 * run in pairs, and the reduction order is fixed, so a token's arithmetic
 * does not depend on the batch. */
#include "kernels.h"

#if defined(__aarch64__)
#include <arm_neon.h>
#include <math.h>
#include <string.h>

#define INL static inline __attribute__((always_inline))

typedef struct { float32x4_t a[4], b[4]; } acc2;

INL void acc_zero(acc2 *A) {
    for (int i = 0; i < 4; i++) A->a[i] = A->b[i] = vdupq_n_f32(0.0f);
}

INL void acc_add(acc2 *A, const float32x4_t w[8], const float *xa, const float *xb, const int two) {
    if (two == FE_STORE) { /* xa is the widened row (kernels.h) */
        for (int j = 0; j < 8; j++) vst1q_f32((float *)xa + 4 * j, w[j]);
        return;
    }
    for (int j = 0; j < 8; j++) A->a[j & 3] = vfmaq_f32(A->a[j & 3], w[j], vld1q_f32(xa + 4 * j));
    if (two)
        for (int j = 0; j < 8; j++) A->b[j & 3] = vfmaq_f32(A->b[j & 3], w[j], vld1q_f32(xb + 4 * j));
}

INL float hsum4(float32x4_t v) {
    float32x2_t s = vadd_f32(vget_low_f32(v), vget_high_f32(v));
    return vget_lane_f32(s, 0) + vget_lane_f32(s, 1);
}

INL void acc_done(const acc2 *A, float *ya, float *yb, const int two) {
    if (two == FE_STORE) return;
    *ya = hsum4(vaddq_f32(vaddq_f32(A->a[0], A->a[1]), vaddq_f32(A->a[2], A->a[3])));
    if (two) *yb = hsum4(vaddq_f32(vaddq_f32(A->b[0], A->b[1]), vaddq_f32(A->b[2], A->b[3])));
}

INL void acc_tail(acc2 *A, const float *wt, const float *xa, const float *xb, int m, const int two) {
    float xpa[32] = {0}, xpb[32] = {0};
    memcpy(xpa, xa, (size_t)m * 4);
    if (two) memcpy(xpb, xb, (size_t)m * 4);
    float32x4_t w[8];
    for (int j = 0; j < 8; j++) w[j] = vld1q_f32(wt + 4 * j);
    acc_add(A, w, xpa, xpb, two);
}

INL float f16_1(const uint8_t *p) { return fe_f16_to_f32((uint16_t)(p[0] | p[1] << 8)); }

/* 16 bytes widened to four float vectors (bytes 0-3, 4-7, 8-11, 12-15). */
INL void u8x16_f32(uint8x16_t v, float32x4_t out[4]) {
    uint16x8_t lo = vmovl_u8(vget_low_u8(v)), hi = vmovl_u8(vget_high_u8(v));
    out[0] = vcvtq_f32_u32(vmovl_u16(vget_low_u16(lo)));
    out[1] = vcvtq_f32_u32(vmovl_u16(vget_high_u16(lo)));
    out[2] = vcvtq_f32_u32(vmovl_u16(vget_low_u16(hi)));
    out[3] = vcvtq_f32_u32(vmovl_u16(vget_high_u16(hi)));
}

#define PAIR(name) INL void name##_pair(const uint8_t *row, int cols, const float *xa, const float *xb, float *ya, \
                                        float *yb, const int two)

PAIR(f32) {
    acc2 A;
    acc_zero(&A);
    const float *w = (const float *)row;
    int c = 0;
    for (; c + 32 <= cols; c += 32) {
        float32x4_t v[8];
        for (int j = 0; j < 8; j++) v[j] = vld1q_f32(w + c + 4 * j);
        acc_add(&A, v, xa + c, xb + c, two);
    }
    if (c < cols) {
        float wt[32] = {0};
        memcpy(wt, w + c, (size_t)(cols - c) * 4);
        acc_tail(&A, wt, xa + c, xb + c, cols - c, two);
    }
    acc_done(&A, ya, yb, two);
}

PAIR(f16) {
    acc2 A;
    acc_zero(&A);
    int c = 0;
    for (; c + 32 <= cols; c += 32) {
        float32x4_t v[8];
        for (int j = 0; j < 8; j++)
            v[j] = vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16((const uint16_t *)(const void *)(row + 2 * c + 8 * j))));
        acc_add(&A, v, xa + c, xb + c, two);
    }
    if (c < cols) {
        float wt[32] = {0};
        for (int i = c; i < cols; i++) wt[i - c] = f16_1(row + 2 * i);
        acc_tail(&A, wt, xa + c, xb + c, cols - c, two);
    }
    acc_done(&A, ya, yb, two);
}

PAIR(bf16) {
    acc2 A;
    acc_zero(&A);
    int c = 0;
    for (; c + 32 <= cols; c += 32) {
        float32x4_t v[8];
        for (int j = 0; j < 8; j++) {
            uint16x4_t h;
            memcpy(&h, row + 2 * c + 8 * j, 8);
            v[j] = vreinterpretq_f32_u32(vshll_n_u16(h, 16));
        }
        acc_add(&A, v, xa + c, xb + c, two);
    }
    if (c < cols) {
        float wt[32] = {0};
        for (int i = c; i < cols; i++) wt[i - c] = fe_bf16_to_f32((uint16_t)(row[2 * i] | row[2 * i + 1] << 8));
        acc_tail(&A, wt, xa + c, xb + c, cols - c, two);
    }
    acc_done(&A, ya, yb, two);
}

PAIR(q8_0) {
    acc2 A;
    acc_zero(&A);
    for (int b = 0; b < cols / 32; b++) {
        const uint8_t *p = row + 34 * b;
        float d = f16_1(p);
        float32x4_t v[8];
        for (int h = 0; h < 2; h++) {
            int8x16_t q = vreinterpretq_s8_u8(vld1q_u8(p + 2 + 16 * h));
            int16x8_t lo = vmovl_s8(vget_low_s8(q)), hi = vmovl_s8(vget_high_s8(q));
            v[4 * h + 0] = vmulq_n_f32(vcvtq_f32_s32(vmovl_s16(vget_low_s16(lo))), d);
            v[4 * h + 1] = vmulq_n_f32(vcvtq_f32_s32(vmovl_s16(vget_high_s16(lo))), d);
            v[4 * h + 2] = vmulq_n_f32(vcvtq_f32_s32(vmovl_s16(vget_low_s16(hi))), d);
            v[4 * h + 3] = vmulq_n_f32(vcvtq_f32_s32(vmovl_s16(vget_high_s16(hi))), d);
        }
        acc_add(&A, v, xa + 32 * b, xb + 32 * b, two);
    }
    acc_done(&A, ya, yb, two);
}

/* 16 nibble bytes: low nibbles are values 0..15, high nibbles 16..31; w = q*d + m. */
INL void nib16(const uint8_t *q, float d, float m, float32x4_t v[8]) {
    uint8x16_t raw = vld1q_u8(q);
    u8x16_f32(vandq_u8(raw, vdupq_n_u8(15)), v);
    u8x16_f32(vshrq_n_u8(raw, 4), v + 4);
    float32x4_t vm = vdupq_n_f32(m);
    for (int j = 0; j < 8; j++) v[j] = vfmaq_n_f32(vm, v[j], d);
}

PAIR(q4_0) {
    acc2 A;
    acc_zero(&A);
    for (int b = 0; b < cols / 32; b++) {
        const uint8_t *p = row + 18 * b;
        float d = f16_1(p);
        float32x4_t v[8];
        nib16(p + 2, d, -8.0f * d, v);
        acc_add(&A, v, xa + 32 * b, xb + 32 * b, two);
    }
    acc_done(&A, ya, yb, two);
}

PAIR(q4_1) {
    acc2 A;
    acc_zero(&A);
    for (int b = 0; b < cols / 32; b++) {
        const uint8_t *p = row + 20 * b;
        float32x4_t v[8];
        nib16(p + 4, f16_1(p), f16_1(p + 2), v);
        acc_add(&A, v, xa + 32 * b, xb + 32 * b, two);
    }
    acc_done(&A, ya, yb, two);
}

/* d * sc_j and -(dmin * m_j) for the eight sub-blocks j of a Q4_K/Q5_K
 * block at `p`, in vectors (the scalar products, one rounding each), stored
 * for the loop: unpacked at once instead of one sub-block at a time. */
INL void k45_scales(const uint8_t *p, float ds[8], float ms[8]) {
    uint32_t sm[4];
    fe_q4k_scales_mins(p + 4, sm);
    const uint8x8_t sc = vcreate_u8((uint64_t)sm[0] | (uint64_t)sm[1] << 32);
    const uint8x8_t mn = vcreate_u8((uint64_t)sm[2] | (uint64_t)sm[3] << 32);
    const uint16x8_t sc16 = vmovl_u8(sc), mn16 = vmovl_u8(mn);
    const float d = f16_1(p), dmin = f16_1(p + 2);
    vst1q_f32(ds, vmulq_n_f32(vcvtq_f32_u32(vmovl_u16(vget_low_u16(sc16))), d));
    vst1q_f32(ds + 4, vmulq_n_f32(vcvtq_f32_u32(vmovl_u16(vget_high_u16(sc16))), d));
    vst1q_f32(ms, vnegq_f32(vmulq_n_f32(vcvtq_f32_u32(vmovl_u16(vget_low_u16(mn16))), dmin)));
    vst1q_f32(ms + 4, vnegq_f32(vmulq_n_f32(vcvtq_f32_u32(vmovl_u16(vget_high_u16(mn16))), dmin)));
}

/* Q4_K, and Q5_K (five = 1): Q4_K's nibbles plus a fifth bit from qh, bit
 * j of qh[l] for value 32j + l of the block. */
INL void k45_pair(const uint8_t *row, int cols, const float *xa, const float *xb, float *ya, float *yb,
                  const int two, const int five) {
    acc2 A;
    acc_zero(&A);
    const int bb = five ? 176 : 144;
    const uint8x16_t one = vdupq_n_u8(1), m15 = vdupq_n_u8(15);
    for (int b = 0; b < cols / 256; b++) {
        const uint8_t *p = row + bb * b;
        float ds[8], ms[8];
        k45_scales(p, ds, ms);
        const uint8_t *q = p + (five ? 48 : 16);
        uint8x16_t h0 = m15, h1 = m15;
        if (five) h0 = vld1q_u8(p + 16), h1 = vld1q_u8(p + 32);
        const float *xa0 = xa + 256 * b, *xb0 = xb + 256 * b;
        for (int j = 0; j < 8; j += 2, q += 32) {
            const float d1 = ds[j], m1 = ms[j], d2 = ds[j + 1], m2 = ms[j + 1];
            const int8x16_t s1 = vdupq_n_s8((int8_t)-j), s2 = vdupq_n_s8((int8_t)(-j - 1));
            uint8x16_t r0 = vld1q_u8(q), r1 = vld1q_u8(q + 16);
            uint8x16_t l0 = vandq_u8(r0, m15), l1 = vandq_u8(r1, m15);
            if (five) {
                l0 = vorrq_u8(l0, vshlq_n_u8(vandq_u8(vshlq_u8(h0, s1), one), 4));
                l1 = vorrq_u8(l1, vshlq_n_u8(vandq_u8(vshlq_u8(h1, s1), one), 4));
            }
            float32x4_t v[8];
            u8x16_f32(l0, v);
            u8x16_f32(l1, v + 4);
            for (int k = 0; k < 8; k++) v[k] = vfmaq_n_f32(vdupq_n_f32(m1), v[k], d1);
            acc_add(&A, v, xa0 + 32 * j, xb0 + 32 * j, two);
            uint8x16_t u0 = vshrq_n_u8(r0, 4), u1 = vshrq_n_u8(r1, 4);
            if (five) {
                u0 = vorrq_u8(u0, vshlq_n_u8(vandq_u8(vshlq_u8(h0, s2), one), 4));
                u1 = vorrq_u8(u1, vshlq_n_u8(vandq_u8(vshlq_u8(h1, s2), one), 4));
            }
            u8x16_f32(u0, v);
            u8x16_f32(u1, v + 4);
            for (int k = 0; k < 8; k++) v[k] = vfmaq_n_f32(vdupq_n_f32(m2), v[k], d2);
            acc_add(&A, v, xa0 + 32 * j + 32, xb0 + 32 * j + 32, two);
        }
    }
    acc_done(&A, ya, yb, two);
}

PAIR(q4_k) { k45_pair(row, cols, xa, xb, ya, yb, two, 0); }
PAIR(q5_k) { k45_pair(row, cols, xa, xb, ya, yb, two, 1); }

PAIR(q6_k) {
    acc2 A;
    acc_zero(&A);
    for (int b = 0; b < cols / 256; b++) {
        const uint8_t *p = row + 210 * b;
        float ds[16]; /* d * sc[i], all sixteen at once */
        const float d = f16_1(p + 208);
        const int8x16_t sc8 = vld1q_s8((const int8_t *)(p + 192));
        const int16x8_t sl = vmovl_s8(vget_low_s8(sc8)), sh = vmovl_s8(vget_high_s8(sc8));
        vst1q_f32(ds, vmulq_n_f32(vcvtq_f32_s32(vmovl_s16(vget_low_s16(sl))), d));
        vst1q_f32(ds + 4, vmulq_n_f32(vcvtq_f32_s32(vmovl_s16(vget_high_s16(sl))), d));
        vst1q_f32(ds + 8, vmulq_n_f32(vcvtq_f32_s32(vmovl_s16(vget_low_s16(sh))), d));
        vst1q_f32(ds + 12, vmulq_n_f32(vcvtq_f32_s32(vmovl_s16(vget_high_s16(sh))), d));
        for (int half = 0; half < 2; half++) {
            const uint8_t *ql = p + 64 * half, *qh = p + 128 + 32 * half;
            const float *sc = ds + 8 * half;
            int base = 256 * b + 128 * half;
            for (int c = 0; c < 4; c++) {
                const uint8_t *lq = ql + (c & 1) * 32;
                float32x4_t v[8];
                for (int h = 0; h < 2; h++) { /* values 16h .. 16h+15 of the run, scale sc[2c + h] */
                    uint8x16_t l = vld1q_u8(lq + 16 * h), hb = vld1q_u8(qh + 16 * h);
                    l = (c >> 1) ? vshrq_n_u8(l, 4) : vandq_u8(l, vdupq_n_u8(15));
                    uint8x16_t hh = vandq_u8(vshlq_u8(hb, vdupq_n_s8((int8_t)(-2 * c))), vdupq_n_u8(3));
                    int8x16_t q = vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(l, vshlq_n_u8(hh, 4))), vdupq_n_s8(32));
                    int16x8_t lo16 = vmovl_s8(vget_low_s8(q)), hi16 = vmovl_s8(vget_high_s8(q));
                    const float s = sc[2 * c + h];
                    v[4 * h + 0] = vmulq_n_f32(vcvtq_f32_s32(vmovl_s16(vget_low_s16(lo16))), s);
                    v[4 * h + 1] = vmulq_n_f32(vcvtq_f32_s32(vmovl_s16(vget_high_s16(lo16))), s);
                    v[4 * h + 2] = vmulq_n_f32(vcvtq_f32_s32(vmovl_s16(vget_low_s16(hi16))), s);
                    v[4 * h + 3] = vmulq_n_f32(vcvtq_f32_s32(vmovl_s16(vget_high_s16(hi16))), s);
                }
                acc_add(&A, v, xa + base + 32 * c, xb + base + 32 * c, two);
            }
        }
    }
    acc_done(&A, ya, yb, two);
}

/* q3_nl: the scaled 8-float grid is a 32-byte table; an index i becomes the
 * byte indices 4i..4i+3 of its float, looked up with one tbl2. */
INL uint32x4_t q3_field(uint32x4_t w0, uint32x4_t w1, uint32x4_t w2, const int s) {
    const int bit = 3 * s;
    if (bit + 3 <= 32) return vshlq_u32(w0, vdupq_n_s32(-bit));
    if (bit < 32) return vorrq_u32(vshlq_u32(w0, vdupq_n_s32(-bit)), vshlq_u32(w1, vdupq_n_s32(32 - bit)));
    if (bit + 3 <= 64) return vshlq_u32(w1, vdupq_n_s32(32 - bit));
    if (bit < 64) return vorrq_u32(vshlq_u32(w1, vdupq_n_s32(32 - bit)), vshlq_u32(w2, vdupq_n_s32(64 - bit)));
    return vshlq_u32(w2, vdupq_n_s32(64 - bit));
}

INL float32x4_t q3_look(uint8x16x2_t lut, uint32x4_t f) {
    uint32x4_t i = vandq_u32(f, vdupq_n_u32(7));
    uint32x4_t bi = vorrq_u32(vmulq_n_u32(i, 0x04040404u), vdupq_n_u32(0x03020100u));
    return vreinterpretq_f32_u8(vqtbl2q_u8(lut, vreinterpretq_u8_u32(bi)));
}

PAIR(q3_nl) {
    acc2 A;
    acc_zero(&A);
    const float32x4_t g0 = vld1q_f32(fe_q3_levels), g1 = vld1q_f32(fe_q3_levels + 4);
    for (int b = 0; b < cols / FE_Q3_BLOCK; b++) {
        const uint8_t *p = row + FE_Q3_BYTES * b;
        const float *xa0 = xa + FE_Q3_BLOCK * b, *xb0 = xb + FE_Q3_BLOCK * b;
        uint32x4_t wl[3], wh[3];
        for (int k = 0; k < 3; k++) {
            uint8x16_t lo = vld1q_u8(p + 32 * k), hi = vld1q_u8(p + 32 * k + 16);
            wl[k] = vreinterpretq_u32_u8(lo);
            wh[k] = vreinterpretq_u32_u8(hi);
        }
        uint8x16x2_t lut = {{vreinterpretq_u8_f32(g0), vreinterpretq_u8_f32(g1)}};
        for (int c = 0; c < 8; c++) {
            if ((c & 1) == 0) {
                float s = fe_q3_group_scale(p, c >> 1);
                lut.val[0] = vreinterpretq_u8_f32(vmulq_n_f32(g0, s));
                lut.val[1] = vreinterpretq_u8_f32(vmulq_n_f32(g1, s));
            }
            float32x4_t v[8];
            for (int i = 0; i < 4; i++) {
                int s = 4 * c + i;
                v[2 * i] = q3_look(lut, q3_field(wl[0], wl[1], wl[2], s));
                v[2 * i + 1] = q3_look(lut, q3_field(wh[0], wh[1], wh[2], s));
            }
            acc_add(&A, v, xa0 + 32 * c, xb0 + 32 * c, two);
        }
    }
    acc_done(&A, ya, yb, two);
}

/* T tokens (x, x + xs, ...) against a row widened to f32 (cols a multiple
 * of 32: the tiled formats' blocks are 256): per token the operations of
 * acc_add / acc_done on the same values, with each
 * weight vector loaded once for the tile (16 accumulators for T = 4). */
INL void tile_neon(const float *w, int cols, const float *x, size_t xs, float *y, size_t ys, const int T) {
    float32x4_t a[4][4];
    for (int t = 0; t < T; t++)
        for (int k = 0; k < 4; k++) a[t][k] = vdupq_n_f32(0.0f);
    for (int c = 0; c + 32 <= cols; c += 32)
        for (int j = 0; j < 8; j++) {
            float32x4_t wv = vld1q_f32(w + c + 4 * j);
            for (int t = 0; t < T; t++)
                a[t][j & 3] = vfmaq_f32(a[t][j & 3], wv, vld1q_f32(x + (size_t)t * xs + c + 4 * j));
        }
    for (int t = 0; t < T; t++)
        y[(size_t)t * ys] = hsum4(vaddq_f32(vaddq_f32(a[t][0], a[t][1]), vaddq_f32(a[t][2], a[t][3])));
}

static void neon_tiles(const float *w, int cols, const float *x, size_t xs, int n, float *y, size_t ys) {
    int t = 0;
    for (; t + 4 <= n; t += 4) tile_neon(w, cols, x + (size_t)t * xs, xs, y + (size_t)t * ys, ys, 4);
    if (n - t == 3) tile_neon(w, cols, x + (size_t)t * xs, xs, y + (size_t)t * ys, ys, 3);
    if (n - t == 2) tile_neon(w, cols, x + (size_t)t * xs, xs, y + (size_t)t * ys, ys, 2);
    if (n - t == 1) tile_neon(w, cols, x + (size_t)t * xs, xs, y + (size_t)t * ys, ys, 1);
}

/* Several rows widened to f32 (rows_tiles below, for rowsdot): R rows x T
 * tokens, one chain k of the four at a time, over columns [c0, c1). Chain k
 * takes vectors k and k + 4 of each 32 columns, in that order: exactly
 * tile_neon's FMAs for it, in the same order; the R rows share each x load.
 * A is the tile's accumulators, [r][t][k], kept between column blocks. */
INL void rows_chain(const float *w, int cols, const float *x, size_t xs, const int R, const int T, int k, int c0,
                    int c1, float32x4_t *A) {
    float32x4_t a[3][4];
    for (int r = 0; r < R; r++)
        for (int t = 0; t < T; t++) a[r][t] = A[(r * 4 + t) * 4 + k];
    for (int c = c0 + 4 * k; c < c1; c += 32)
        for (int h = 0; h < 32; h += 16) {
            float32x4_t wv[3];
            for (int r = 0; r < R; r++) wv[r] = vld1q_f32(w + (size_t)r * cols + c + h);
            for (int t = 0; t < T; t++) {
                const float32x4_t xv = vld1q_f32(x + (size_t)t * xs + c + h);
                for (int r = 0; r < R; r++) a[r][t] = vfmaq_f32(a[r][t], wv[r], xv);
            }
        }
    for (int r = 0; r < R; r++)
        for (int t = 0; t < T; t++) A[(r * 4 + t) * 4 + k] = a[r][t];
}

/* The four chains' sum, as acc_done's. */
INL float rows_sum(const float32x4_t *a) { return hsum4(vaddq_f32(vaddq_f32(a[0], a[1]), vaddq_f32(a[2], a[3]))); }

FE_ROWS_TILES(neon, , float32x4_t, vdupq_n_f32(0.0f))

/* Bit-identical to fe_dot_f32: lanes 0-3 and 4-7 of its eight accumulators
 * in two vectors (multiply, then add: no FMA), the tail to lanes 0.. in
 * order, then ((a0 + a4) + (a1 + a5)) + ((a2 + a6) + (a3 + a7)). */
static float dot_neon(const float *a, const float *b, int n) {
    float32x4_t lo = vdupq_n_f32(0.0f), hi = lo;
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        lo = vaddq_f32(lo, vmulq_f32(vld1q_f32(a + i), vld1q_f32(b + i)));
        hi = vaddq_f32(hi, vmulq_f32(vld1q_f32(a + i + 4), vld1q_f32(b + i + 4)));
    }
    float l[8];
    vst1q_f32(l, lo);
    vst1q_f32(l + 4, hi);
    for (int k = 0; i < n; i++, k++) l[k] += a[i] * b[i];
    return ((l[0] + l[4]) + (l[1] + l[5])) + ((l[2] + l[6]) + (l[3] + l[7]));
}

/* Bit-identical to fe_axpy_f32. */
static void axpy_neon(float *y, float w, const float *x, int n) {
    int i = 0;
    for (; i + 4 <= n; i += 4) vst1q_f32(y + i, vaddq_f32(vld1q_f32(y + i), vmulq_f32(vdupq_n_f32(w), vld1q_f32(x + i))));
    for (; i < n; i++) y[i] += w * x[i];
}

/* ------------------------------------------------------------- attention
 * kernels.h's attention contract, bit-identical to the fe_att_* references
 * (vfmaq_f32 is the fused multiply-add): 16 chains of 4 lanes side by side,
 * enough for four FMA pipes of 4-cycle latency. */

/* NQ queries x NT tiles of 16 positions (4 NQ NT <= 16 chains). */
INL void scores_tiles_neon(const float *q, int hd, const float *t, float scale, float *out, size_t os, const int NQ,
                           const int NT) {
    float32x4_t a[16];
    const size_t ts = (size_t)hd * FE_KT;
#pragma GCC unroll 16
    for (int x = 0; x < 4 * NQ * NT; x++) a[x] = vdupq_n_f32(0.0f);
    for (int c = 0; c < hd; c++) {
        const float *col = t + (size_t)c * FE_KT;
#pragma GCC unroll 4
        for (int j = 0; j < NT; j++) {
            float32x4_t k[4];
#pragma GCC unroll 4
            for (int b = 0; b < 4; b++) k[b] = vld1q_f32(col + (size_t)j * ts + 4 * b);
#pragma GCC unroll 4
            for (int r = 0; r < NQ; r++) {
                const float32x4_t qb = vdupq_n_f32(q[(size_t)r * (size_t)hd + (size_t)c]);
#pragma GCC unroll 4
                for (int b = 0; b < 4; b++) a[(r * NT + j) * 4 + b] = vfmaq_f32(a[(r * NT + j) * 4 + b], qb, k[b]);
            }
        }
    }
    const float32x4_t sc = vdupq_n_f32(scale);
#pragma GCC unroll 4
    for (int r = 0; r < NQ; r++)
#pragma GCC unroll 4
        for (int j = 0; j < NT; j++)
#pragma GCC unroll 4
            for (int b = 0; b < 4; b++)
                vst1q_f32(out + (size_t)r * os + (size_t)j * FE_KT + 4 * b, vmulq_f32(a[(r * NT + j) * 4 + b], sc));
}

/* Columns [c0, c0 + 4 CB) of NQ queries' weighted sums (NQ CB <= 16 chains). */
INL void wsum_cols_neon(float *out, const float *p, size_t ps, const float *v, size_t vs, int np, int hd, int c0,
                        const int NQ, const int CB) {
    float32x4_t a[16];
#pragma GCC unroll 16
    for (int x = 0; x < NQ * CB; x++) a[x] = vdupq_n_f32(0.0f);
    const float *row = v + c0;
    for (int i = 0; i < np; i++, row += vs) {
        float32x4_t w[4];
#pragma GCC unroll 4
        for (int r = 0; r < NQ; r++) w[r] = vdupq_n_f32(p[(size_t)r * ps + (size_t)i]);
#pragma GCC unroll 16
        for (int b = 0; b < CB; b++) {
            const float32x4_t x = vld1q_f32(row + 4 * b);
#pragma GCC unroll 4
            for (int r = 0; r < NQ; r++) a[r * CB + b] = vfmaq_f32(a[r * CB + b], w[r], x);
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < NQ; r++)
#pragma GCC unroll 16
        for (int b = 0; b < CB; b++) vst1q_f32(out + (size_t)r * (size_t)hd + (size_t)c0 + 4 * (size_t)b, a[r * CB + b]);
}

FE_ATT_DRIVERS(neon, , 4, 16)

/* exp_avx2's operations (kernels_avx2.c), 4 lanes. */
static inline float32x4_t exp_neon(float32x4_t x) {
    x = vmaxq_f32(x, vdupq_n_f32(-87.33654f));
    const float32x4_t n = vrndnq_f32(vmulq_f32(x, vdupq_n_f32(1.44269504088896341f)));
    float32x4_t r = vfmsq_f32(x, n, vdupq_n_f32(0.693359375f));
    r = vfmsq_f32(r, n, vdupq_n_f32(-2.12194440e-4f));
    float32x4_t p = vdupq_n_f32(1.9875691500e-4f);
    p = vfmaq_f32(vdupq_n_f32(1.3981999507e-3f), p, r);
    p = vfmaq_f32(vdupq_n_f32(8.3334519073e-3f), p, r);
    p = vfmaq_f32(vdupq_n_f32(4.1665795894e-2f), p, r);
    p = vfmaq_f32(vdupq_n_f32(1.6666665459e-1f), p, r);
    p = vfmaq_f32(vdupq_n_f32(5.0000001201e-1f), p, r);
    p = vfmaq_f32(vaddq_f32(r, vdupq_n_f32(1.0f)), p, vmulq_f32(r, r));
    const int32x4_t e = vshlq_n_s32(vaddq_s32(vcvtnq_s32_f32(n), vdupq_n_s32(127)), 23);
    return vmulq_f32(p, vreinterpretq_f32_s32(e));
}

/* e^d, or 0 where d < FE_ATT_CUT (fe_att_softmax). */
static inline float32x4_t exp_cut_neon(float32x4_t d) {
    return vreinterpretq_f32_u32(
        vandq_u32(vreinterpretq_u32_f32(exp_neon(d)), vcgeq_f32(d, vdupq_n_f32(FE_ATT_CUT))));
}

/* fe_att_softmax: the sixteen sums in four registers (s_0..3, s_4..7, s_8..11, s_12..15). */
static void att_softmax_neon(float *x, int n) {
    if (n <= 0) return;
    int i = 0;
    float32x4_t mv = vdupq_n_f32(x[0]);
    for (; i + 4 <= n; i += 4) mv = vmaxq_f32(mv, vld1q_f32(x + i));
    float m = vmaxvq_f32(mv);
    for (; i < n; i++) m = x[i] > m ? x[i] : m;
    const float32x4_t m4 = vdupq_n_f32(m);
    float32x4_t s[4];
    for (int b = 0; b < 4; b++) s[b] = vdupq_n_f32(0.0f);
    for (i = 0; i + 16 <= n; i += 16)
        for (int b = 0; b < 4; b++) {
            const float32x4_t e = exp_cut_neon(vsubq_f32(vld1q_f32(x + i + 4 * b), m4));
            vst1q_f32(x + i + 4 * b, e);
            s[b] = vaddq_f32(s[b], e);
        }
    if (i < n) { /* the tail through the same exp; the lanes past n add +0, which changes no sum */
        float t[16];
        for (int l = 0; l < 16; l++) t[l] = i + l < n ? x[i + l] : m;
        for (int b = 0; b < 4; b++) vst1q_f32(t + 4 * b, exp_cut_neon(vsubq_f32(vld1q_f32(t + 4 * b), m4)));
        for (int l = 0; l < 16; l++)
            if (i + l < n) x[i + l] = t[l];
            else t[l] = 0.0f;
        for (int b = 0; b < 4; b++) s[b] = vaddq_f32(s[b], vld1q_f32(t + 4 * b));
    }
    const float32x4_t a = vaddq_f32(vaddq_f32(s[0], s[2]), vaddq_f32(s[1], s[3])); /* a_l, l < 4 */
    const float32x2_t c = vadd_f32(vget_low_f32(a), vget_high_f32(a));              /* a0 + a2, a1 + a3 */
    const float inv = 1.0f / (vget_lane_f32(c, 0) + vget_lane_f32(c, 1));
    const float32x4_t iv = vdupq_n_f32(inv);
    for (i = 0; i + 4 <= n; i += 4) vst1q_f32(x + i, vmulq_f32(vld1q_f32(x + i), iv));
    for (; i < n; i++) x[i] *= inv;
}

FE_SIMD_KERNELS_ROWS(NEON_TABLE, neon, );

const fe_kernels *fe_kernels_neon_table(void) { return &NEON_TABLE; }

#else

const fe_kernels *fe_kernels_neon_table(void) { return 0; }

#endif
