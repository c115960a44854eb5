/* quant_iq4xs.c — the iq4_xs quantizer (format in formats.h): ferry_iq4xs_quantize_f32
 * of ferry_kernels.h. Portable C, no allocation, blocks independent (the
 * bytes do not depend on how a caller splits the rows).
 *
 * Per block of 256 values:
 * 1. Each 32-value sub-block's best float scale on the non-linear grid: the
 *    value of largest magnitude xm is put on a grid level near either end
 *    (xm / L for L = -127 - 8 .. -127 + 8 and 113 - 8 .. 113 + 8, in steps
 *    of 4: steps of 1 gave the same error to 5 digits on the demo and K3
 *    stand-in matrices at 2.6x the time); for each candidate every value
 *    takes its nearest level, and the
 *    least-squares scale for those levels, s = sum(w x l) / sum(w l^2), is
 *    scored by the error it leaves (sum(w x^2) - sum(w x l)^2 / sum(w l^2));
 *    the best is kept.
 * 2. The block's d: the largest-magnitude sub-block scale over -32 (that
 *    sub-block gets code 0, i.e. exactly its scale), rounded to f16.
 * 3. Each sub-block's 6-bit code ls: round(s / d) + 32 clamped to 0..63,
 *    and its neighbours ls - 1, ls + 1 are tried too; each with every value
 *    on its nearest level of d * (ls - 32); the least weighted squared error
 *    wins.
 * w is the column's importance (1 without). Measured error:
 * docs/QUANTIZATION.md. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "ferry_kernels.h"
#include "formats.h"

#define SUB 32

/* Midpoints between consecutive levels of fe_iq4_values. */
static const float MID[15] = {-115.5f, -93.5f, -74.0f, -57.0f, -42.0f, -28.5f, -16.0f, -4.5f,
                              7.0f,    19.0f,  31.5f,  45.5f,  61.0f,  79.0f,  101.0f};

/* The index of the level nearest v (in level units): how many midpoints lie below v. */
static inline int nearest(float v) {
    int i = v > MID[7] ? 8 : 0;
    i += v > MID[i + 3] ? 4 : 0;
    i += v > MID[i + 1] ? 2 : 0;
    i += v > MID[i] ? 1 : 0;
    return i;
}

/* Step 1: the best scale of n values x (weights w) on the grid; 0 for an all-zero run. */
static float best_scale(const float *x, const float *w) {
    float amax = 0.0f, xm = 0.0f;
    for (int i = 0; i < SUB; i++)
        if (fabsf(x[i]) > amax) amax = fabsf(x[i]), xm = x[i];
    if (amax == 0.0f) return 0.0f;
    float best = 0.0f, best_score = -1.0f;
    for (int end = 0; end < 2; end++)
        for (int k = -8; k <= 8; k += 4) {
            const float inv = (float)((end ? 113 : -127) + k) / xm;
            float sxl = 0.0f, sll = 0.0f;
            for (int i = 0; i < SUB; i++) {
                const float l = (float)fe_iq4_values[nearest(x[i] * inv)];
                sxl += w[i] * x[i] * l;
                sll += w[i] * l * l;
            }
            if (sll > 0.0f && sxl * sxl / sll > best_score) best_score = sxl * sxl / sll, best = sxl / sll;
        }
    return best;
}

/* The weighted squared error of x on the levels of scale s, and the indices in q (32 values). */
static float assign(const float *x, const float *w, float s, uint8_t q[SUB]) {
    const float inv = s != 0.0f ? 1.0f / s : 0.0f;
    float err = 0.0f;
    for (int i = 0; i < SUB; i++) {
        q[i] = (uint8_t)nearest(x[i] * inv);
        const float e = x[i] - s * (float)fe_iq4_values[q[i]];
        err += w[i] * e * e;
    }
    return err;
}

static void quantize_block(const float *x, const float *w, uint8_t *out) {
    float s[8], smax = 0.0f;
    for (int ib = 0; ib < 8; ib++) {
        s[ib] = best_scale(x + SUB * ib, w + SUB * ib);
        if (fabsf(s[ib]) > fabsf(smax)) smax = s[ib];
    }
    const uint16_t h = fe_f32_to_f16(smax / -32.0f);
    const float d = fe_f16_to_f32(h);
    memset(out, 0, FE_IQ4_BYTES);
    out[0] = (uint8_t)(h & 0xff), out[1] = (uint8_t)(h >> 8);
    unsigned hi = 0;
    for (int ib = 0; ib < 8; ib++) {
        int ls = 32;
        uint8_t q[SUB], qb[SUB];
        if (d != 0.0f && isfinite(d)) {
            const float r = s[ib] / d;
            const int l0 = r > 31.0f ? 63 : r < -32.0f ? 0 : (int)lrintf(r) + 32;
            float best = INFINITY;
            for (int l = l0 - 1; l <= l0 + 1; l++) {
                if (l < 0 || l > 63) continue;
                const float e = assign(x + SUB * ib, w + SUB * ib, d * (float)(l - 32), q);
                if (e < best) best = e, ls = l, memcpy(qb, q, SUB);
            }
        } else {
            assign(x + SUB * ib, w + SUB * ib, 0.0f, qb);
        }
        out[4 + ib / 2] |= (uint8_t)((ls & 15) << (4 * (ib & 1)));
        hi |= (unsigned)(ls >> 4) << (2 * ib);
        uint8_t *p = out + 8 + 16 * ib;
        for (int l = 0; l < 16; l++) p[l] = (uint8_t)(qb[l] | qb[l + 16] << 4);
    }
    out[2] = (uint8_t)(hi & 0xff), out[3] = (uint8_t)(hi >> 8);
}

int ferry_iq4xs_quantize_f32(const float *src, int rows, int cols, const float *importance, void *dst) {
    if (!src || !dst || rows < 0 || cols <= 0 || cols % FE_IQ4_BLOCK) return -1;
    float ones[FE_IQ4_BLOCK];
    for (int i = 0; i < FE_IQ4_BLOCK; i++) ones[i] = 1.0f;
    if (importance)
        for (int c = 0; c < cols; c++)
            if (!(importance[c] >= 0.0f) || !isfinite(importance[c])) return -1;
    const size_t n = (size_t)rows * (size_t)cols;
    for (size_t i = 0; i < n; i++)
        if (!isfinite(src[i])) return -1;
    uint8_t *out = (uint8_t *)dst;
    for (int r = 0; r < rows; r++)
        for (int b = 0; b < cols / FE_IQ4_BLOCK; b++, out += FE_IQ4_BYTES)
            quantize_block(src + (size_t)r * (size_t)cols + (size_t)b * FE_IQ4_BLOCK,
                           importance ? importance + (size_t)b * FE_IQ4_BLOCK : ones, out);
    return 0;
}
