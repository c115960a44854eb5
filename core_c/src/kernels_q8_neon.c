/* kernels_q8_neon.c — the 8-bit-activation row kernels for aarch64 NEON.
 *
 * A 32-value block is two 16-byte vectors; dot16 gives the four int32 sums
 * of 4 consecutive byte products of one of them (SDOT where the compiler
 * targets the dot-product extension, as on every Apple Silicon Mac; else
 * widening multiplies and pairwise adds, the same integers), so lanes 0-3
 * and 4-7 are the reference's p[0..3] and p[4..7] before the integer scale.
 * The float steps are the reference's (kernels_q8.h), the same fused
 * multiply-adds. Tokens run in tiles of up to 4 sharing each decoded weight block. */
#include "kernels_q8.h"

#if defined(__aarch64__)
#include <arm_neon.h>
#include <math.h>


#define INL static inline __attribute__((always_inline))
#define TILE 4 /* tokens sharing a decoded weight block (FE_Q8_DRIVER) */

INL int32x4_t dot16(int8x16_t a, int8x16_t b) {
#if defined(__ARM_FEATURE_DOTPROD)
    return vdotq_s32(vdupq_n_s32(0), a, b);
#else
    int16x8_t lo = vmull_s8(vget_low_s8(a), vget_low_s8(b)), hi = vmull_high_s8(a, b);
    return vpaddq_s32(vpaddlq_s16(lo), vpaddlq_s16(hi));
#endif
}

/* Two 4-lane halves of the reference's 8 lanes. */
typedef struct { float32x4_t lo, hi; } v8;

INL v8 v8_zero(void) { v8 r = {vdupq_n_f32(0.0f), vdupq_n_f32(0.0f)}; return r; }

INL float hsum(v8 v) { /* ((v0+v4)+(v2+v6)) + ((v1+v5)+(v3+v7)) */
    float32x4_t s = vaddq_f32(v.lo, v.hi);
    float32x2_t h = vadd_f32(vget_low_f32(s), vget_high_f32(s));
    return vget_lane_f32(h, 0) + vget_lane_f32(h, 1);
}

INL v8 fold(v8 acc, float a, int32x4_t plo, int32x4_t phi) {
    float32x4_t av = vdupq_n_f32(a);
    acc.lo = vfmaq_f32(acc.lo, av, vcvtq_f32_s32(plo));
    acc.hi = vfmaq_f32(acc.hi, av, vcvtq_f32_s32(phi));
    return acc;
}

INL v8 fold_min(v8 mn, float32x4_t Mlo, float32x4_t Mhi, const float *s) {
    mn.lo = vfmaq_f32(mn.lo, Mlo, vld1q_f32(s));
    mn.hi = vfmaq_f32(mn.hi, Mhi, vld1q_f32(s + 4));
    return mn;
}

INL float f16(const uint8_t *p) { return fe_f16_to_f32((uint16_t)(p[0] | p[1] << 8)); }

#define QX(t) ((const int8_t *)(xq + (size_t)(t) * st))
#define DX(t) ((const float *)(xq + (size_t)(t) * st + (size_t)cols))
#define SX(t) (DX(t) + nb)

/* Blocks alternate between two accumulator sets per token (even blocks: A,
 * odd: B); the result adds the two lane by lane first (kernels_q8.h). */
INL float done2(v8 a, v8 b) {
    v8 s = {vaddq_f32(a.lo, b.lo), vaddq_f32(a.hi, b.hi)};
    return hsum(s);
}

/* Q8_0 (four = 0) and Q4_0 (four = 1): signed weights, no minimum. Block b into acc. */
INL void signed_block(const uint8_t *row, int cols, const uint8_t *xq, size_t st, int b, const int nt,
                      const int four, v8 *acc) {
    const uint8_t *p = row + (four ? 18 : 34) * (size_t)b;
    const float dw = f16(p);
    int8x16_t w0, w1;
    if (four) {
        uint8x16_t q = vld1q_u8(p + 2);
        w0 = vsubq_s8(vreinterpretq_s8_u8(vandq_u8(q, vdupq_n_u8(15))), vdupq_n_s8(8));
        w1 = vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(q, 4)), vdupq_n_s8(8));
    } else {
        w0 = vld1q_s8((const int8_t *)(p + 2));
        w1 = vld1q_s8((const int8_t *)(p + 18));
    }
    for (int t = 0; t < nt; t++) {
        const int8_t *x = QX(t) + 32 * (size_t)b;
        acc[t] = fold(acc[t], dw * DX(t)[b], dot16(w0, vld1q_s8(x)), dot16(w1, vld1q_s8(x + 16)));
    }
}

INL void signed_tile(const uint8_t *row, int cols, const uint8_t *xq, size_t st, float *y, size_t ys,
                     const int nt, const int four) {
    const int nb = cols / 32;
    v8 A[TILE], B[TILE];
    for (int t = 0; t < nt; t++) A[t] = B[t] = v8_zero();
    int b = 0;
    for (; b + 2 <= nb; b += 2) {
        signed_block(row, cols, xq, st, b, nt, four, A);
        signed_block(row, cols, xq, st, b + 1, nt, four, B);
    }
    if (b < nb) signed_block(row, cols, xq, st, b, nt, four, A);
    for (int t = 0; t < nt; t++) y[(size_t)t * ys] = done2(A[t], B[t]);
}

INL void q8_0_tile(const uint8_t *row, int cols, const uint8_t *xq, size_t st, float *y, size_t ys, const int nt) {
    signed_tile(row, cols, xq, st, y, ys, nt, 0);
}
INL void q4_0_tile(const uint8_t *row, int cols, const uint8_t *xq, size_t st, float *y, size_t ys, const int nt) {
    signed_tile(row, cols, xq, st, y, ys, nt, 1);
}

/* Q4_1: unsigned nibbles; the minimum's sums m (one float per token and set). */
INL void q4_1_block(const uint8_t *row, int cols, const uint8_t *xq, size_t st, int b, const int nt, v8 *acc,
                    float *m) {
    const int nb = cols / 32;
    const uint8_t *p = row + 20 * (size_t)b;
    const float dw = f16(p), mw = f16(p + 2);
    uint8x16_t q = vld1q_u8(p + 4);
    int8x16_t w0 = vreinterpretq_s8_u8(vandq_u8(q, vdupq_n_u8(15))), w1 = vreinterpretq_s8_u8(vshrq_n_u8(q, 4));
    for (int t = 0; t < nt; t++) {
        const int8_t *x = QX(t) + 32 * (size_t)b;
        acc[t] = fold(acc[t], dw * DX(t)[b], dot16(w0, vld1q_s8(x)), dot16(w1, vld1q_s8(x + 16)));
        m[t] = fmaf(mw, SX(t)[b], m[t]); /* one fused instruction on aarch64 */
    }
}

INL void q4_1_tile(const uint8_t *row, int cols, const uint8_t *xq, size_t st, float *y, size_t ys, const int nt) {
    const int nb = cols / 32;
    v8 A[TILE], B[TILE];
    float mA[TILE], mB[TILE];
    for (int t = 0; t < nt; t++) A[t] = B[t] = v8_zero(), mA[t] = mB[t] = 0.0f;
    int b = 0;
    for (; b + 2 <= nb; b += 2) {
        q4_1_block(row, cols, xq, st, b, nt, A, mA);
        q4_1_block(row, cols, xq, st, b + 1, nt, B, mB);
    }
    if (b < nb) q4_1_block(row, cols, xq, st, b, nt, A, mA);
    for (int t = 0; t < nt; t++) y[(size_t)t * ys] = done2(A[t], B[t]) + (mA[t] + mB[t]);
}

/* Q4_K, and Q5_K (five = 1: the fifth bit of value 32k + l is bit k of qh[l]):
 * sub-block k of super-block sb into acc. */
INL void k45_block(const uint8_t *p, const int *sc, int cols, const uint8_t *xq, size_t st, int sb, int k, float d,
                   const int nt, const int five, v8 *acc) {
    const uint8_t *q = p + (five ? 48 : 16) + 32 * (k >> 1);
    uint8x16_t q0 = vld1q_u8(q), q1 = vld1q_u8(q + 16);
    if (k & 1) q0 = vshrq_n_u8(q0, 4), q1 = vshrq_n_u8(q1, 4);
    else q0 = vandq_u8(q0, vdupq_n_u8(15)), q1 = vandq_u8(q1, vdupq_n_u8(15));
    if (five) {
        const int8x16_t sh = vdupq_n_s8((int8_t)-k);
        const uint8x16_t one = vdupq_n_u8(1);
        q0 = vorrq_u8(q0, vshlq_n_u8(vandq_u8(vshlq_u8(vld1q_u8(p + 16), sh), one), 4));
        q1 = vorrq_u8(q1, vshlq_n_u8(vandq_u8(vshlq_u8(vld1q_u8(p + 32), sh), one), 4));
    }
    const int8x16_t w0 = vreinterpretq_s8_u8(q0), w1 = vreinterpretq_s8_u8(q1);
    const int b = 8 * sb + k;
    for (int t = 0; t < nt; t++) {
        const int8_t *x = QX(t) + 32 * (size_t)b;
        acc[t] = fold(acc[t], d * DX(t)[b], vmulq_n_s32(dot16(w0, vld1q_s8(x)), sc[k]),
                      vmulq_n_s32(dot16(w1, vld1q_s8(x + 16)), sc[k]));
    }
}

INL void k45_tile(const uint8_t *row, int cols, const uint8_t *xq, size_t st, float *y, size_t ys, const int nt,
                  const int five) {
    const int nb = cols / 32;
    v8 A[TILE], B[TILE], mn[TILE];
    for (int t = 0; t < nt; t++) A[t] = B[t] = mn[t] = v8_zero();
    for (int sb = 0; sb < nb / 8; sb++) {
        const uint8_t *p = row + (five ? 176 : 144) * (size_t)sb;
        const float d = f16(p), dmin = f16(p + 2);
        int sc[8], m[8];
        for (int k = 0; k < 8; k++) fe_q4k_scale_min(k, p + 4, &sc[k], &m[k]);
        for (int k = 0; k < 8; k += 2) {
            k45_block(p, sc, cols, xq, st, sb, k, d, nt, five, A);
            k45_block(p, sc, cols, xq, st, sb, k + 1, d, nt, five, B);
        }
        const int32x4_t mlo = {m[0], m[1], m[2], m[3]}, mhi = {m[4], m[5], m[6], m[7]};
        const float32x4_t dm = vdupq_n_f32(dmin);
        const float32x4_t Mlo = vmulq_f32(dm, vcvtq_f32_s32(mlo)), Mhi = vmulq_f32(dm, vcvtq_f32_s32(mhi));
        for (int t = 0; t < nt; t++) mn[t] = fold_min(mn[t], Mlo, Mhi, SX(t) + 8 * sb);
    }
    for (int t = 0; t < nt; t++) y[(size_t)t * ys] = done2(A[t], B[t]) - hsum(mn[t]);
}

INL void q4_k_tile(const uint8_t *row, int cols, const uint8_t *xq, size_t st, float *y, size_t ys, const int nt) {
    k45_tile(row, cols, xq, st, y, ys, nt, 0);
}
INL void q5_k_tile(const uint8_t *row, int cols, const uint8_t *xq, size_t st, float *y, size_t ys, const int nt) {
    k45_tile(row, cols, xq, st, y, ys, nt, 1);
}

/* Q6_K: (q - 32) as signed bytes, scales per 16 values. Run r of half `half`
 * of super-block sb into acc. */
INL void q6_block(const uint8_t *p, int cols, const uint8_t *xq, size_t st, int sb, int half, int r, float d,
                  const int nt, v8 *acc) {
    const uint8_t *ql = p + 64 * half + 32 * (r & 1), *qh = p + 128 + 32 * half;
    const int8_t *sc = (const int8_t *)(p + 192 + 8 * half);
    uint8x16_t l0 = vld1q_u8(ql), l1 = vld1q_u8(ql + 16);
    if (r >> 1) l0 = vshrq_n_u8(l0, 4), l1 = vshrq_n_u8(l1, 4);
    else l0 = vandq_u8(l0, vdupq_n_u8(15)), l1 = vandq_u8(l1, vdupq_n_u8(15));
    const int8x16_t sh = vdupq_n_s8((int8_t)(-2 * r));
    const uint8x16_t m3 = vdupq_n_u8(3);
    l0 = vorrq_u8(l0, vshlq_n_u8(vandq_u8(vshlq_u8(vld1q_u8(qh), sh), m3), 4));
    l1 = vorrq_u8(l1, vshlq_n_u8(vandq_u8(vshlq_u8(vld1q_u8(qh + 16), sh), m3), 4));
    const int8x16_t k32 = vdupq_n_s8(32);
    const int8x16_t w0 = vsubq_s8(vreinterpretq_s8_u8(l0), k32), w1 = vsubq_s8(vreinterpretq_s8_u8(l1), k32);
    const int b = 8 * sb + 4 * half + r;
    for (int t = 0; t < nt; t++) {
        const int8_t *x = QX(t) + 32 * (size_t)b;
        acc[t] = fold(acc[t], d * DX(t)[b], vmulq_n_s32(dot16(w0, vld1q_s8(x)), sc[2 * r]),
                      vmulq_n_s32(dot16(w1, vld1q_s8(x + 16)), sc[2 * r + 1]));
    }
}

INL void q6_k_tile(const uint8_t *row, int cols, const uint8_t *xq, size_t st, float *y, size_t ys, const int nt) {
    const int nb = cols / 32;
    v8 A[TILE], B[TILE];
    for (int t = 0; t < nt; t++) A[t] = B[t] = v8_zero();
    for (int sb = 0; sb < nb / 8; sb++) {
        const uint8_t *p = row + 210 * (size_t)sb;
        const float d = f16(p + 208);
        for (int half = 0; half < 2; half++)
            for (int r = 0; r < 4; r += 2) {
                q6_block(p, cols, xq, st, sb, half, r, d, nt, A);
                q6_block(p, cols, xq, st, sb, half, r + 1, d, nt, B);
            }
    }
    for (int t = 0; t < nt; t++) y[(size_t)t * ys] = done2(A[t], B[t]);
}

FE_Q8_SET(NEON_Q8, neon, )

const fe_q8_kernels *fe_q8_kernels_neon(void) { return &NEON_Q8; }

#else

const fe_q8_kernels *fe_q8_kernels_neon(void) { return 0; }

#endif
