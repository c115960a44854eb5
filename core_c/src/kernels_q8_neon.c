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
#include <string.h>

#include "kernels_q8_neon_util.h"


#define INL static inline __attribute__((always_inline))
#define TILE 4 /* tokens sharing a decoded weight block (FE_Q8_DRIVER) */


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

/* The K-quants (kernels_q8.h): per super-block, integer lanes P (lo: lanes
 * 0-3, hi: 4-7) summed over its 8 sub-blocks, then one or two float
 * multiply-adds per token. */
typedef struct { int32x4_t lo, hi; } i8v;

#define BS(t) ((const int16_t *)(DX(t) + nsb))

/* P[t] += sub-block k's lanes (weights w0: values 0-15, w1: 16-31; scales
 * s0, s1 of those halves) with every token of the tile. */
INL void k_sub(int8x16_t w0, int8x16_t w1, int s0, int s1, const uint8_t *xq, size_t st, size_t off, const int nt,
               i8v *P) {
    for (int t = 0; t < nt; t++) {
        const int8_t *x = QX(t) + off;
        P[t].lo = vmlaq_n_s32(P[t].lo, dot16(w0, vld1q_s8(x)), s0);
        P[t].hi = vmlaq_n_s32(P[t].hi, dot16(w1, vld1q_s8(x + 16)), s1);
    }
}

INL v8 fold_k(v8 acc, float a, i8v p) {
    float32x4_t av = vdupq_n_f32(a);
    acc.lo = vfmaq_f32(acc.lo, av, vcvtq_f32_s32(p.lo));
    acc.hi = vfmaq_f32(acc.hi, av, vcvtq_f32_s32(p.hi));
    return acc;
}

INL v8 fold_k_neg(v8 acc, float a, i8v p) { /* fma(-a, p, acc), one rounding */
    float32x4_t av = vdupq_n_f32(a);
    acc.lo = vfmsq_f32(acc.lo, av, vcvtq_f32_s32(p.lo));
    acc.hi = vfmsq_f32(acc.hi, av, vcvtq_f32_s32(p.hi));
    return acc;
}

/* Q4_K, and Q5_K (five = 1: the fifth bit of value 32k + l is bit k of qh[l]). */
INL void k45_tile(const uint8_t *row, int cols, const uint8_t *xq, size_t st, float *y, size_t ys, const int nt,
                  const int five) {
    const int nsb = cols / 256;
    v8 acc[TILE];
    for (int t = 0; t < nt; t++) acc[t] = v8_zero();
    for (int sb = 0; sb < nsb; sb++) {
        const uint8_t *p = row + (five ? 176 : 144) * (size_t)sb;
        const float d = f16(p), dmin = f16(p + 2);
        uint8_t sm[16]; /* scales 0-7, minimums 0-7 */
        fe_q8_k4_scales(p + 4, sm);
        i8v P[TILE];
        for (int t = 0; t < nt; t++) P[t].lo = P[t].hi = vdupq_n_s32(0);
        const uint8x16_t h0 = five ? vld1q_u8(p + 16) : vdupq_n_u8(0), h1 = five ? vld1q_u8(p + 32) : vdupq_n_u8(0);
        for (int k = 0; k < 8; k++) {
            const uint8_t *q = p + (five ? 48 : 16) + 32 * (k >> 1);
            uint8x16_t q0 = vld1q_u8(q), q1 = vld1q_u8(q + 16);
            if (k & 1) q0 = vshrq_n_u8(q0, 4), q1 = vshrq_n_u8(q1, 4);
            else q0 = vandq_u8(q0, vdupq_n_u8(15)), q1 = vandq_u8(q1, vdupq_n_u8(15));
            if (five) {
                const uint8x16_t bit = vdupq_n_u8((uint8_t)(1 << k)), sixteen = vdupq_n_u8(16);
                q0 = vorrq_u8(q0, vandq_u8(vtstq_u8(h0, bit), sixteen));
                q1 = vorrq_u8(q1, vandq_u8(vtstq_u8(h1, bit), sixteen));
            }
            k_sub(vreinterpretq_s8_u8(q0), vreinterpretq_s8_u8(q1), sm[k], sm[k], xq, st,
                  256 * (size_t)sb + 32 * (size_t)k, nt, P);
        }
        const int16x8_t m16 = vreinterpretq_s16_u16(vmovl_u8(vld1_u8(sm + 8)));
        for (int t = 0; t < nt; t++) {
            const int16_t *bs = BS(t) + 16 * (size_t)sb;
            const int16x8_t b32 = vpaddq_s16(vld1q_s16(bs), vld1q_s16(bs + 8)); /* bs[2l] + bs[2l+1] */
            i8v M = {vmull_s16(vget_low_s16(m16), vget_low_s16(b32)), vmull_high_s16(m16, b32)};
            const float dx = DX(t)[sb];
            acc[t] = fold_k(acc[t], d * dx, P[t]);
            acc[t] = fold_k_neg(acc[t], dmin * dx, M);
        }
    }
    for (int t = 0; t < nt; t++) y[(size_t)t * ys] = hsum(acc[t]);
}

INL void q4_k_tile(const uint8_t *row, int cols, const uint8_t *xq, size_t st, float *y, size_t ys, const int nt) {
    k45_tile(row, cols, xq, st, y, ys, nt, 0);
}
INL void q5_k_tile(const uint8_t *row, int cols, const uint8_t *xq, size_t st, float *y, size_t ys, const int nt) {
    k45_tile(row, cols, xq, st, y, ys, nt, 1);
}

/* Q6_K: q = 4 low bits | 2 high bits << 4 (0..63, as it is: the -32 comes
 * off through the bsums), scales per 16 values. */
INL void q6_k_tile(const uint8_t *row, int cols, const uint8_t *xq, size_t st, float *y, size_t ys, const int nt) {
    const int nsb = cols / 256;
    v8 acc[TILE];
    for (int t = 0; t < nt; t++) acc[t] = v8_zero();
    for (int sb = 0; sb < nsb; sb++) {
        const uint8_t *p = row + 210 * (size_t)sb;
        const int8_t *sc = (const int8_t *)(p + 192);
        const float d = f16(p + 208);
        i8v P[TILE];
        for (int t = 0; t < nt; t++) P[t].lo = P[t].hi = vdupq_n_s32(0);
        for (int k = 0; k < 8; k++) {
            const int half = k >> 2, r = k & 3;
            const uint8_t *ql = p + 64 * half + 32 * (r & 1), *qh = p + 128 + 32 * half;
            uint8x16_t l0 = vld1q_u8(ql), l1 = vld1q_u8(ql + 16);
            if (r >> 1) l0 = vshrq_n_u8(l0, 4), l1 = vshrq_n_u8(l1, 4);
            else l0 = vandq_u8(l0, vdupq_n_u8(15)), l1 = vandq_u8(l1, vdupq_n_u8(15));
            const int8x16_t sh = vdupq_n_s8((int8_t)(-2 * r));
            const uint8x16_t m3 = vdupq_n_u8(3);
            l0 = vorrq_u8(l0, vshlq_n_u8(vandq_u8(vshlq_u8(vld1q_u8(qh), sh), m3), 4));
            l1 = vorrq_u8(l1, vshlq_n_u8(vandq_u8(vshlq_u8(vld1q_u8(qh + 16), sh), m3), 4));
            k_sub(vreinterpretq_s8_u8(l0), vreinterpretq_s8_u8(l1), sc[2 * k], sc[2 * k + 1], xq, st,
                  256 * (size_t)sb + 32 * (size_t)k, nt, P);
        }
        const int8x16_t s8 = vld1q_s8(sc);
        const int16x8_t sa = vmovl_s8(vget_low_s8(s8)), sb16 = vmovl_high_s8(s8);
        for (int t = 0; t < nt; t++) {
            const int16_t *bs = BS(t) + 16 * (size_t)sb;
            const int16x8_t ba = vld1q_s16(bs), bb = vld1q_s16(bs + 8);
            /* lane l: sc[2l] * bs[2l] + sc[2l+1] * bs[2l+1] */
            const int32x4_t Olo = vpaddq_s32(vmull_s16(vget_low_s16(sa), vget_low_s16(ba)), vmull_high_s16(sa, ba));
            const int32x4_t Ohi = vpaddq_s32(vmull_s16(vget_low_s16(sb16), vget_low_s16(bb)), vmull_high_s16(sb16, bb));
            i8v Pt = {vsubq_s32(P[t].lo, vshlq_n_s32(Olo, 5)), vsubq_s32(P[t].hi, vshlq_n_s32(Ohi, 5))};
            acc[t] = fold_k(acc[t], d * DX(t)[sb], Pt);
        }
    }
    for (int t = 0; t < nt; t++) y[(size_t)t * ys] = hsum(acc[t]);
}

/* The quantizer (kernels_q8.c's quantize_run, lane for lane): the maximum
 * by the reference's comparison (a NaN skipped), the product, NaN to 0,
 * rounding to nearest even and the clamp; the sums exact. */
INL float qrun(const float *v, int len, int8_t *q, int *sums) {
    float32x4_t m = vdupq_n_f32(0.0f);
    for (int i = 0; i < len; i += 4) {
        const float32x4_t a = vabsq_f32(vld1q_f32(v + i));
        m = vbslq_f32(vcgtq_f32(a, m), a, m);
    }
    const float amax = vmaxvq_f32(m); /* no NaN in m: exact, any order */
    const float32x4_t idv = vdupq_n_f32(amax > 0.0f ? 127.0f / amax : 0.0f);
    const float32x4_t lo = vdupq_n_f32(-127.0f), hi = vdupq_n_f32(127.0f);
    for (int i = 0; i < len; i += 16) {
        int32x4_t r[4];
        for (int j = 0; j < 4; j++) {
            float32x4_t f = vmulq_f32(vld1q_f32(v + i + 4 * j), idv);
            f = vreinterpretq_f32_u32(vandq_u32(vreinterpretq_u32_f32(f), vceqq_f32(f, f))); /* NaN -> 0 */
            r[j] = vcvtq_s32_f32(vminq_f32(vmaxq_f32(vrndnq_f32(f), lo), hi));
        }
        sums[i / 16] = vaddvq_s32(vaddq_s32(vaddq_s32(r[0], r[1]), vaddq_s32(r[2], r[3])));
        const int16x8_t a16 = vcombine_s16(vmovn_s32(r[0]), vmovn_s32(r[1]));
        const int16x8_t b16 = vcombine_s16(vmovn_s32(r[2]), vmovn_s32(r[3]));
        vst1q_s8(q + i, vcombine_s8(vmovn_s16(a16), vmovn_s16(b16)));
    }
    return amax / 127.0f;
}

/* ------------------------------------------------------------------ q3_nl */

/* Bits 12c .. 12c + 11 of each of 4 lanes' 96-bit index numbers at the bottom. */
INL uint32x4_t q3_fields12(uint32x4_t w0, uint32x4_t w1, uint32x4_t w2, const int c) {
    const int bit = 12 * c;
    if (bit + 12 <= 32) return vshlq_u32(w0, vdupq_n_s32(-bit));
    if (bit < 32) return vorrq_u32(vshlq_u32(w0, vdupq_n_s32(-bit)), vshlq_u32(w1, vdupq_n_s32(32 - bit)));
    if (bit + 12 <= 64) return vshlq_u32(w1, vdupq_n_s32(-(bit - 32)));
    if (bit < 64) return vorrq_u32(vshlq_u32(w1, vdupq_n_s32(-(bit - 32))), vshlq_u32(w2, vdupq_n_s32(64 - bit)));
    return vshlq_u32(w2, vdupq_n_s32(-(bit - 64)));
}

/* The fields at bits 0, 3, 6, 9 of each lane into bytes 0..3 (0..7 each). */
INL uint8x16_t q3_spread(uint32x4_t t) {
    const uint32x4_t m = vdupq_n_u32(7);
    uint32x4_t u = vandq_u32(t, m);
    u = vorrq_u32(u, vshlq_n_u32(vandq_u32(vshrq_n_u32(t, 3), m), 8));
    u = vorrq_u32(u, vshlq_n_u32(vandq_u32(vshrq_n_u32(t, 6), m), 16));
    u = vorrq_u32(u, vshlq_n_u32(vandq_u32(vshrq_n_u32(t, 9), m), 24));
    return vreinterpretq_u8_u32(u);
}

/* Per 32-value chunk the grid's int8 levels by tbl (lanes 0-3, then 4-7),
 * dot16 with the token's FE_Q8_KIND_32T bytes: the reference's P[l]. */
INL void q3_nl_tile(const uint8_t *row, int cols, const uint8_t *xq, size_t st, float *y, size_t ys, const int nt) {
    static const int8_t G[16] = FE_Q3_Q8_GRID;
    const int8x16_t grid = vld1q_s8(G); /* entries 8..15 are never read */
    v8 A[TILE], B[TILE];
    for (int t = 0; t < nt; t++) A[t] = B[t] = v8_zero();
    for (int b = 0; b < cols / FE_Q3_BLOCK; b++) {
        const uint8_t *p = row + FE_Q3_BYTES * (size_t)b;
        uint32_t wl[24];
        memcpy(wl, p, 96);
        const uint32x4_t w0l = vld1q_u32(wl), w0h = vld1q_u32(wl + 4), w1l = vld1q_u32(wl + 8),
                         w1h = vld1q_u32(wl + 12), w2l = vld1q_u32(wl + 16), w2h = vld1q_u32(wl + 20);
        float sg = 0.0f;
        for (int c = 0; c < 8; c++) {
            if ((c & 1) == 0) sg = fe_q3_q8_scale(p, c >> 1);
            const int8x16_t lo = vqtbl1q_s8(grid, q3_spread(q3_fields12(w0l, w1l, w2l, c)));
            const int8x16_t hi = vqtbl1q_s8(grid, q3_spread(q3_fields12(w0h, w1h, w2h, c)));
            for (int t = 0; t < nt; t++) {
                const int8_t *x = QX(t) + FE_Q3_BLOCK * (size_t)b + 32 * c;
                const int32x4_t plo = dot16(lo, vld1q_s8(x)), phi = dot16(hi, vld1q_s8(x + 16));
                if (c & 1) B[t] = fold(B[t], sg * DX(t)[8 * b + c], plo, phi);
                else A[t] = fold(A[t], sg * DX(t)[8 * b + c], plo, phi);
            }
        }
    }
    for (int t = 0; t < nt; t++) y[(size_t)t * ys] = done2(A[t], B[t]);
}

FE_Q8_QUANTIZER(quantize_neon, , qrun)

FE_Q8_SET(NEON_Q8, neon, )

const fe_q8_kernels *fe_q8_kernels_neon(void) { return &NEON_Q8; }

#else

const fe_q8_kernels *fe_q8_kernels_neon(void) { return 0; }

#endif
