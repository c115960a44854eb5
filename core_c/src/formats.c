/* formats.c — block layouts and scalar dequantization (see formats.h). */
#include "formats.h"

#include <string.h>

static const fe_format_info FORMATS[FE_N_FORMATS] = {
    [FE_F32] = {"f32", 1, 4},     [FE_F16] = {"f16", 1, 2},    [FE_BF16] = {"bf16", 1, 2},
    [FE_Q8_0] = {"q8_0", 32, 34}, [FE_Q4_0] = {"q4_0", 32, 18}, [FE_Q4_1] = {"q4_1", 32, 20},
    [FE_Q4_K] = {"q4_k", 256, 144}, [FE_Q6_K] = {"q6_k", 256, 210},
    [FE_Q3_NL] = {"q3_nl", FE_Q3_BLOCK, FE_Q3_BYTES}, [FE_Q5_K] = {"q5_k", 256, 176},
};

/* Trained once (docs/QUANTIZATION.md) and frozen: part of the format. */
const float fe_q3_levels[8] = {-2.1959f, -1.3138f, -0.7133f, -0.2161f, 0.2301f, 0.7209f, 1.3177f, 2.1983f};

const float fe_q3_frac[8] = {1.0f, 1.09050773f, 1.18920712f, 1.29683955f,
                             1.41421356f, 1.54221083f, 1.68179283f, 1.83400809f};

int fe_q3_index(const uint8_t *block, int i) {
    int s = i >> 3, l = i & 7, bit = 3 * s;
    uint32_t w[3];
    for (int k = 0; k < 3; k++)
        w[k] = (uint32_t)block[32 * k + 4 * l] | (uint32_t)block[32 * k + 4 * l + 1] << 8 |
               (uint32_t)block[32 * k + 4 * l + 2] << 16 | (uint32_t)block[32 * k + 4 * l + 3] << 24;
    uint64_t lo = (uint64_t)w[0] | (uint64_t)w[1] << 32;
    if (bit + 3 <= 64) return (int)((lo >> bit) & 7);
    if (bit >= 64) return (int)((w[2] >> (bit - 64)) & 7);
    return (int)(((lo >> bit) | ((uint64_t)w[2] << (64 - bit))) & 7);
}

const fe_format_info *fe_format_get(int fmt) {
    return (fmt >= 0 && fmt < FE_N_FORMATS) ? &FORMATS[fmt] : NULL;
}

int fe_format_from_name(const char *name) {
    for (int i = 0; i < FE_N_FORMATS; i++)
        if (strcmp(FORMATS[i].name, name) == 0) return i;
    return -1;
}

uint64_t fe_row_bytes(int fmt, uint64_t cols) {
    const fe_format_info *f = fe_format_get(fmt);
    if (!f || cols == 0 || cols % (uint64_t)f->block_elems) return 0;
    return cols / (uint64_t)f->block_elems * (uint64_t)f->block_bytes;
}

float fe_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h >> 15) << 31;
    uint32_t exp = (h >> 10) & 0x1F;
    uint32_t man = h & 0x3FF;
    uint32_t bits;
    if (exp == 0) {
        if (man == 0) {
            bits = sign;
        } else { /* subnormal: normalise */
            int e = -1;
            do { man <<= 1; e++; } while (!(man & 0x400));
            bits = sign | ((uint32_t)(127 - 15 - e) << 23) | ((man & 0x3FF) << 13);
        }
    } else if (exp == 0x1F) {
        bits = sign | 0x7F800000u | (man << 13);
    } else {
        bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

float fe_bf16_to_f32(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static uint16_t rd16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }

static void dequant_q8_0(const uint8_t *b, float *out, int nb) {
    for (int i = 0; i < nb; i++, b += 34, out += 32) {
        float d = fe_f16_to_f32(rd16(b));
        const int8_t *q = (const int8_t *)(b + 2);
        for (int j = 0; j < 32; j++) out[j] = d * (float)q[j];
    }
}

static void dequant_q4_0(const uint8_t *b, float *out, int nb) {
    for (int i = 0; i < nb; i++, b += 18, out += 32) {
        float d = fe_f16_to_f32(rd16(b));
        const uint8_t *q = b + 2;
        for (int j = 0; j < 16; j++) {
            out[j] = d * (float)((q[j] & 0x0F) - 8);
            out[j + 16] = d * (float)((q[j] >> 4) - 8);
        }
    }
}

static void dequant_q4_1(const uint8_t *b, float *out, int nb) {
    for (int i = 0; i < nb; i++, b += 20, out += 32) {
        float d = fe_f16_to_f32(rd16(b));
        float m = fe_f16_to_f32(rd16(b + 2));
        const uint8_t *q = b + 4;
        for (int j = 0; j < 16; j++) {
            out[j] = d * (float)(q[j] & 0x0F) + m;
            out[j + 16] = d * (float)(q[j] >> 4) + m;
        }
    }
}

/* Q4_K: f16 d, f16 dmin, 12 bytes of packed 6-bit (scale, min) for 8
 * sub-blocks of 32, then 128 bytes of nibbles: each 64-element half-pair j
 * uses bytes 32j..32j+31, low nibbles first, high nibbles second.
 * Q5_K (five = 1): the same with 32 bytes qh of fifth bits before the
 * nibbles (bit j of qh[l] belongs to value 32j + l). */
static void dequant_k45(const uint8_t *b, float *out, int nb, const int five) {
    for (int i = 0; i < nb; i++, b += five ? 176 : 144) {
        float d = fe_f16_to_f32(rd16(b));
        float dmin = fe_f16_to_f32(rd16(b + 2));
        const uint8_t *scales = b + 4, *qh = b + 16;
        const uint8_t *q = b + (five ? 48 : 16);
        for (int j = 0; j < 8; j += 2, q += 32) {
            int sc, m;
            fe_q4k_scale_min(j, scales, &sc, &m);
            float d1 = d * (float)sc, m1 = dmin * (float)m;
            fe_q4k_scale_min(j + 1, scales, &sc, &m);
            float d2 = d * (float)sc, m2 = dmin * (float)m;
            for (int l = 0; l < 32; l++)
                *out++ = d1 * (float)((q[l] & 0x0F) | (five ? ((qh[l] >> j) & 1) << 4 : 0)) - m1;
            for (int l = 0; l < 32; l++)
                *out++ = d2 * (float)((q[l] >> 4) | (five ? ((qh[l] >> (j + 1)) & 1) << 4 : 0)) - m2;
        }
    }
}

/* Q6_K: 128 bytes of low 4 bits, 64 bytes of high 2 bits, 16 int8 scales,
 * f16 d; two halves of 128 elements, each in four interleaved runs of 32. */
static void dequant_q6_k(const uint8_t *b, float *out, int nb) {
    for (int i = 0; i < nb; i++, b += 210) {
        const uint8_t *ql = b;
        const uint8_t *qh = b + 128;
        const int8_t *sc = (const int8_t *)(b + 192);
        float d = fe_f16_to_f32(rd16(b + 208));
        for (int half = 0; half < 2; half++, ql += 64, qh += 32, sc += 8, out += 128) {
            for (int l = 0; l < 32; l++) {
                int is = l / 16;
                int q1 = (int)((ql[l] & 0x0F) | (((qh[l] >> 0) & 3) << 4)) - 32;
                int q2 = (int)((ql[l + 32] & 0x0F) | (((qh[l] >> 2) & 3) << 4)) - 32;
                int q3 = (int)((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
                int q4 = (int)((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
                out[l] = d * (float)sc[is] * (float)q1;
                out[l + 32] = d * (float)sc[is + 2] * (float)q2;
                out[l + 64] = d * (float)sc[is + 4] * (float)q3;
                out[l + 96] = d * (float)sc[is + 6] * (float)q4;
            }
        }
    }
}

static void dequant_q3_nl(const uint8_t *b, float *out, int nb) {
    for (int i = 0; i < nb; i++, b += FE_Q3_BYTES, out += FE_Q3_BLOCK)
        for (int g = 0; g < 4; g++) {
            float s = fe_q3_group_scale(b, g);
            for (int v = 64 * g; v < 64 * g + 64; v++) out[v] = s * fe_q3_levels[fe_q3_index(b, v)];
        }
}

void fe_dequant_row(int fmt, const void *row, float *out, int cols) {
    const uint8_t *b = (const uint8_t *)row;
    switch (fmt) {
    case FE_F32: memcpy(out, row, (size_t)cols * 4); break;
    case FE_F16:
        for (int i = 0; i < cols; i++) out[i] = fe_f16_to_f32(rd16(b + 2 * i));
        break;
    case FE_BF16:
        for (int i = 0; i < cols; i++) out[i] = fe_bf16_to_f32(rd16(b + 2 * i));
        break;
    case FE_Q8_0: dequant_q8_0(b, out, cols / 32); break;
    case FE_Q4_0: dequant_q4_0(b, out, cols / 32); break;
    case FE_Q4_1: dequant_q4_1(b, out, cols / 32); break;
    case FE_Q4_K: dequant_k45(b, out, cols / 256, 0); break;
    case FE_Q5_K: dequant_k45(b, out, cols / 256, 1); break;
    case FE_Q6_K: dequant_q6_k(b, out, cols / 256); break;
    case FE_Q3_NL: dequant_q3_nl(b, out, cols / FE_Q3_BLOCK); break;
    default: memset(out, 0, (size_t)cols * 4); break;
    }
}

float fe_dot_f32(const float *a, const float *b, int n) {
    float acc[8] = {0};
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++) acc[l] += a[i + l] * b[i + l];
    for (int l = 0; i < n; i++, l++) acc[l] += a[i] * b[i];
    return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}
