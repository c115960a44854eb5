/* kernels_q8_neon_util.h — the small NEON helpers both 8-bit-activation NEON
 * kernel files use (kernels_q8_neon.c, kernels_q8_iq4xs.c): a 16-byte signed
 * dot product into four lanes, and the two 4-lane halves of the scalar
 * reference's 8 lanes. aarch64 only; include after <arm_neon.h>. */
#ifndef FERRY_KERNELS_Q8_NEON_UTIL_H
#define FERRY_KERNELS_Q8_NEON_UTIL_H

static inline __attribute__((always_inline)) int32x4_t dot16(int8x16_t a, int8x16_t b) {
#if defined(__ARM_FEATURE_DOTPROD)
    return vdotq_s32(vdupq_n_s32(0), a, b);
#else
    int16x8_t lo = vmull_s8(vget_low_s8(a), vget_low_s8(b)), hi = vmull_high_s8(a, b);
    return vpaddq_s32(vpaddlq_s16(lo), vpaddlq_s16(hi));
#endif
}

/* Two 4-lane halves of the reference's 8 lanes. */
typedef struct { float32x4_t lo, hi; } v8;

#endif
