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
    FE_Q4_K = 6, FE_Q6_K = 7, FE_N_FORMATS = 8
} fe_format;

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
float fe_bf16_to_f32(uint16_t h);

/* Dot product of n floats, summed in a fixed order (8 lanes, then pairwise). */
float fe_dot_f32(const float *a, const float *b, int n);

#endif
