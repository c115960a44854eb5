/* formats.h — numeric formats of stored weights and their scalar kernels.
 *
 * A matrix is stored [rows, cols] row-major; quantized formats store each row
 * as cols / block_elems consecutive blocks (the ggml layouts, so GGUF tensors
 * are kept byte for byte). These are the reference kernels: any faster kernel
 * must agree with them. */
#ifndef FERRY_FORMATS_H
#define FERRY_FORMATS_H

#include <stddef.h>
#include <stdint.h>

typedef enum {
    FE_F32 = 0, FE_F16 = 1, FE_BF16 = 2, FE_Q8_0 = 3, FE_Q4_0 = 4, FE_Q4_1 = 5,
    FE_Q4_K = 6, FE_Q6_K = 7, FE_Q3_NL = 8, FE_Q5_K = 9, FE_Q2_VQ = 10, FE_IQ4_XS = 11,
    FE_N_FORMATS = 12
} fe_format;

/* q3_nl: Ferry's 3-bit expert format (docs/FORMAT.md, docs/QUANTIZATION.md).
 * A block of 256 values is 99 bytes: 96 bytes of 3-bit indices into the
 * fixed non-uniform grid fe_q3_levels, then one byte e (the block's scale
 * exponent code) and four 4-bit codes j[g], one per group of 64 values:
 * value = s_g * fe_q3_levels[index], s_g = 2^((e - j[g]) / 8 - 20), s_g = 0
 * when e = 0. Index layout: the 96 bytes are three rows k of eight
 * little-endian u32 words (word (k, l) at byte 32k + 4l); for lane l the
 * three words form a 96-bit number whose bits 3s..3s+2 are the index of
 * value 8s + l (s = 0..31). Group g holds values 64g..64g+63 (s = 8g..8g+7). */
#define FE_Q3_BLOCK 256
#define FE_Q3_BYTES 99
extern const float fe_q3_levels[8];
/* 2^(i/8) for i = 0..7, rounded to float. */
extern const float fe_q3_frac[8];

/* The log scale of q3_nl and q2_vq: 2^((e - j) / 8 - 20) for an exponent
 * code e (1..255) and a group code j (0..15), 0 when e = 0. */
static inline float fe_log_scale(int e, int j) {
    if (e == 0) return 0.0f;
    int v = e - j + 16; /* 2..270 */
    union { uint32_t u; float f; } p;
    p.u = (uint32_t)((v >> 3) + 105) << 23; /* 2^((v >> 3) - 22) */
    return fe_q3_frac[v & 7] * p.f;
}
/* Scale of group g (0..3) of a q3_nl block (inline: the SIMD kernels call it
 * between vector operations). */
static inline float fe_q3_group_scale(const uint8_t *block, int g) {
    return fe_log_scale(block[96], (block[97 + (g >> 1)] >> (4 * (g & 1))) & 15);
}

/* q2_vq: Ferry's 2-bit expert format (docs/QUANTIZATION.md, "Two-bit
 * experts"). A block of 256 values is 73 bytes (2.28125 bits per value):
 * 32 little-endian u16 words, word k for values 8k..8k+7: bits 0-8 index
 * the fixed codebook fe_q2_codebook (512 non-negative 8-vectors), bits 9-15
 * are the signs of values 8k..8k+6 (1 = negative) and value 8k+7 is negative
 * when those seven bits hold an odd number of ones (even parity); then one
 * byte e (the block's scale exponent code, 0 = the whole block is zero) and
 * eight bytes of sixteen 4-bit codes j[g] (g even: the low nibble of byte
 * 65 + g/2, g odd: its high nibble), one per sub-block of 16 values:
 * value 8k+i = (sign) s_g * fe_q2_codebook[8 * index + i], g = k / 2,
 * s_g = fe_log_scale(e, j[g]). */
#define FE_Q2_BLOCK 256
#define FE_Q2_BYTES 73
#define FE_Q2_CODES 512
extern const float fe_q2_codebook[FE_Q2_CODES * 8];
/* The full 8-bit sign mask of a word (bit i set: value i negative). */
static inline int fe_q2_signs(unsigned word) {
    unsigned s = (word >> 9) & 127u, p = s;
    p ^= p >> 4, p ^= p >> 2, p ^= p >> 1;
    return (int)(s | (p & 1u) << 7);
}
/* Scale of sub-block g (0..15) of a q2_vq block. */
static inline float fe_q2_group_scale(const uint8_t *block, int g) {
    return fe_log_scale(block[64], (block[65 + (g >> 1)] >> (4 * (g & 1))) & 15);
}
/* Q4_K: the 6-bit scale and min of sub-block j (0..7) from a block's 12
 * packed bytes `s` (inline: the scalar decoder and the SIMD kernels share it). */
static inline void fe_q4k_scale_min(int j, const uint8_t *s, int *sc, int *m) {
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4);
        *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}
/* All eight 6-bit scales and mins of a Q4_K/Q5_K block at once, as the
 * bytes of four words (byte k of v[i] is value 4i + k): values 0..7 the scales
 * of sub-blocks 0..7, 8..15 their mins (the same values as fe_q4k_scale_min,
 * by word-wide masks and shifts instead of eight calls; the SIMD kernels
 * widen them to floats in one go). Words, not bytes: a vector built from
 * bytes just stored would wait for the stores. */
static inline void fe_q4k_scales_mins(const uint8_t *s, uint32_t v[4]) {
    uint32_t u[3];
    for (int i = 0; i < 3; i++) /* little-endian words, whatever the host's order */
        u[i] = (uint32_t)s[4 * i] | (uint32_t)s[4 * i + 1] << 8 | (uint32_t)s[4 * i + 2] << 16 | (uint32_t)s[4 * i + 3] << 24;
    v[0] = u[0] & 0x3f3f3f3fu;                                                   /* scales 0-3 */
    v[1] = (u[2] & 0x0f0f0f0fu) | (((u[0] >> 6) & 0x03030303u) << 4);            /* scales 4-7 */
    v[2] = u[1] & 0x3f3f3f3fu;                                                   /* mins 0-3 */
    v[3] = ((u[2] >> 4) & 0x0f0f0f0fu) | (((u[1] >> 6) & 0x03030303u) << 4);     /* mins 4-7 */
}
/* The 3-bit index of value i (0..255) of a block. */
int fe_q3_index(const uint8_t *block, int i);

typedef struct {
    const char *name;   /* manifest spelling, e.g. "q4_1" */
    int block_elems;    /* elements per block (1 for plain floats) */
    int block_bytes;    /* bytes per block */
} fe_format_info;

const fe_format_info *fe_format_get(int fmt);
/* Format by manifest name, or -1. */
int fe_format_from_name(const char *name);
/* Bytes of one row of `cols` elements, or 0 when cols is not a whole number of blocks. */
uint64_t fe_row_bytes(int fmt, uint64_t cols);

/* Widen one stored row of `cols` elements to floats. */
void fe_dequant_row(int fmt, const void *row, float *out, int cols);

float fe_f16_to_f32(uint16_t h);
/* f32 -> IEEE half, round to nearest even, overflow to inf (as numpy's astype(float16); quant_blocks.c). */
uint16_t fe_f32_to_f16(float f);
float fe_bf16_to_f32(uint16_t h);

/* iq4_xs: ggml's IQ4_XS layout (GGUF type 23; docs/FORMAT.md), 4.25 bits
 * per value. A block of 256 values is 136 bytes: f16 d (bytes 0-1), a
 * little-endian u16 of high scale bits (2-3), 4 bytes of low scale bits
 * (4-7), then 128 bytes of 4-bit indices (8-135). Sub-block ib (0..7) holds
 * values 32ib..32ib+31 with the 6-bit code ls = (low nibble ib % 2 of byte
 * 4 + ib / 2) | (bits 2ib, 2ib+1 of the u16) << 4 and the scale
 * d * (ls - 32); its 16 index bytes 8 + 16ib.. hold values 0-15 in their low
 * nibbles and 16-31 in their high ones; an index i selects fe_iq4_values[i].
 * Every decoded value d * (ls - 32) * fe_iq4_values[i] is exact in float
 * (11 + 5 + 7 significant bits), whatever the order of the products. */
#define FE_IQ4_BLOCK 256
#define FE_IQ4_BYTES 136
extern const int8_t fe_iq4_values[16];
static inline int fe_iq4xs_code(const uint8_t *block, int ib) {
    const unsigned h = (unsigned)block[2] | (unsigned)block[3] << 8;
    return (int)(((block[4 + (ib >> 1)] >> (4 * (ib & 1))) & 15u) | ((h >> (2 * ib)) & 3u) << 4);
}
/* The float scale d * (ls - 32) of sub-block ib (exact). */
static inline float fe_iq4xs_scale(const uint8_t *block, int ib) {
    return fe_f16_to_f32((uint16_t)(block[0] | block[1] << 8)) * (float)(fe_iq4xs_code(block, ib) - 32);
}

/* Dot product of n floats, summed in a fixed order (8 lanes, then pairwise). */
float fe_dot_f32(const float *a, const float *b, int n);

#endif
