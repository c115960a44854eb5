/* q8_0, q4_0 and q4_1 blocks of 32 from floats: the trunk formats a
 * conversion writes. Byte for byte ggml's reference quantizer, as is the numpy
 * one in app/convert/quant.py that the tests compare with: the scale in f32,
 * its inverse 1/d (0 for d = 0), every product and sum one f32 rounding
 * (the core is built with -ffp-contract=off), the scale stored as an f16
 * rounded to nearest even. One pass over the values, no allocation. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "ferry_kernels.h"
#include "formats.h"

#define QB 32 /* values per block */

uint16_t fe_f32_to_f16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000u, ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u) return (uint16_t)(sign | 0x7c00u | (ax > 0x7f800000u ? 0x200u : 0)); /* inf, nan */
    if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* >= 65520: rounds to inf */
    if (ax < 0x33000000u) return (uint16_t)sign;              /* < 2^-25: rounds to 0 */
    uint32_t h, rem, half;
    if (ax < 0x38800000u) { /* below 2^-14: a subnormal half, in units of 2^-24 */
        int shift = 126 - (int)(ax >> 23);                    /* 14..24 */
        uint32_t m = (ax & 0x7fffffu) | 0x800000u;
        h = m >> shift;
        rem = m & ((1u << shift) - 1);
        half = 1u << (shift - 1);
    } else { /* normal: rebias the exponent by 127 - 15, keep 10 of 23 mantissa bits */
        uint32_t r = ax - 0x38000000u;
        h = r >> 13;
        rem = r & 0x1fffu;
        half = 0x1000u;
    }
    if (rem > half || (rem == half && (h & 1))) h++; /* a carry into the exponent is right */
    return (uint16_t)(sign | h);
}

static void put_f16(uint8_t *p, float v) {
    uint16_t h = fe_f32_to_f16(v);
    p[0] = (uint8_t)(h & 0xff);
    p[1] = (uint8_t)(h >> 8);
}

static float inverse(float d) { return d != 0.0f ? 1.0f / d : 0.0f; }

/* C roundf for |v| < 2^23, without a libm call: truncate, then step away from
 * zero when the dropped part is at least a half (v - trunc(v) is exact). */
static inline int round_half_away(float v) {
    int q = (int)v;
    float f = v - (float)q;
    return q + (f >= 0.5f) - (f <= -0.5f);
}

static void block_q8_0(const float *x, uint8_t *out) {
    float amax = 0.0f;
    for (int i = 0; i < QB; i++) {
        float a = fabsf(x[i]);
        amax = a > amax ? a : amax;
    }
    float d = amax / 127.0f, id = inverse(d);
    put_f16(out, d);
    for (int i = 0; i < QB; i++) out[2 + i] = (uint8_t)(int8_t)round_half_away(x[i] * id);
}

static void block_q4_0(const float *x, uint8_t *out) {
    float amax = 0.0f, max = 0.0f;
    for (int i = 0; i < QB; i++)
        if (fabsf(x[i]) > amax) amax = fabsf(x[i]), max = x[i]; /* the first of the largest magnitudes */
    float d = max / -8.0f, id = inverse(d);
    put_f16(out, d);
    for (int j = 0; j < QB / 2; j++) {
        float a = x[j] * id + 8.5f, b = x[j + QB / 2] * id + 8.5f;
        int qa = (int)a, qb = (int)b; /* a, b >= 0: truncation */
        out[2 + j] = (uint8_t)((qa < 15 ? qa : 15) | (qb < 15 ? qb : 15) << 4);
    }
}

static void block_q4_1(const float *x, uint8_t *out) {
    float lo = x[0], hi = x[0];
    for (int i = 1; i < QB; i++) {
        lo = x[i] < lo ? x[i] : lo;
        hi = x[i] > hi ? x[i] : hi;
    }
    float d = (hi - lo) / 15.0f, id = inverse(d);
    put_f16(out, d);
    put_f16(out + 2, lo);
    for (int j = 0; j < QB / 2; j++) {
        float a = (x[j] - lo) * id + 0.5f, b = (x[j + QB / 2] - lo) * id + 0.5f;
        int qa = (int)a, qb = (int)b;
        out[4 + j] = (uint8_t)((qa < 15 ? qa : 15) | (qb < 15 ? qb : 15) << 4);
    }
}

int ferry_quantize_blocks(int fmt, const float *src, uint64_t n, void *dst) {
    void (*block)(const float *, uint8_t *);
    size_t bytes;
    if (fmt == FE_Q8_0) block = block_q8_0, bytes = 34;
    else if (fmt == FE_Q4_0) block = block_q4_0, bytes = 18;
    else if (fmt == FE_Q4_1) block = block_q4_1, bytes = 20;
    else return -1;
    if (!src || !dst || n % QB) return -1;
    uint8_t *out = dst;
    for (uint64_t b = 0; b < n / QB; b++) {
        const float *x = src + b * QB;
        int finite = 1;
        for (int i = 0; i < QB; i++) finite &= fabsf(x[i]) <= 3.40282347e38f; /* false for inf and nan */
        if (!finite) return -1;
        block(x, out + b * bytes);
    }
    return 0;
}
