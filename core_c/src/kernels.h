/* kernels.h — matrix-row kernels: y[t] = W[row] . x[t] for a few tokens.
 *
 * One table of row-dot kernels per implementation (scalar reference, AVX2 +
 * FMA + F16C on x86-64, NEON on aarch64), indexed by fe_format. Every kernel
 * computes each token's result with the same sequence of operations whatever
 * the number of tokens n, so a batch is bit-identical to n single calls.
 * SIMD kernels fuse dequantization into the dot product and sum in a
 * different order from the scalar reference; they agree with it within a few
 * float32 rounding errors of the dot product (core_c/tests/test_kernels.c). */
#ifndef FERRY_KERNELS_H
#define FERRY_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "formats.h"

/* For t < n: y[t * y_stride] = dot(row of `cols` stored values, x + t * x_stride).
 * scratch holds at least `cols` floats (used by the scalar reference). */
typedef void (*fe_rowdot_fn)(const uint8_t *row, int cols, const float *x, size_t x_stride, int n, float *y,
                             size_t y_stride, float *scratch);

enum { FE_KERNELS_SCALAR = 0, FE_KERNELS_AVX2 = 1, FE_KERNELS_NEON = 2, FE_KERNELS_N = 3 };

typedef struct fe_kernels {
    const char *name;                    /* "scalar", "avx2", "neon" */
    fe_rowdot_fn rowdot[FE_N_FORMATS];   /* NULL entries fall back to the scalar one */
} fe_kernels;

/* An implementation, or NULL when it is not built in or this CPU lacks it. */
const fe_kernels *fe_kernels_get(int impl);
/* The best implementation this CPU supports (a pure function of the build
 * and cpuid; nothing is cached). Engines choose their set at open and keep
 * it (ferry_open_options.kernels); there is no process-wide choice. */
int fe_kernels_best(void);
/* The implementation named "scalar", "avx2" or "neon", or -1. */
int fe_kernels_by_name(const char *name);
/* The row kernel of `fmt` in implementation `k`, falling back to scalar. */
fe_rowdot_fn fe_kernel_for(const fe_kernels *k, int fmt);

/* Tables built in by kernels_avx2.c / kernels_neon.c (NULL elsewhere). */
const fe_kernels *fe_kernels_avx2_table(void);
const fe_kernels *fe_kernels_neon_table(void);
int fe_cpu_has_avx2(void);
/* SIMD memory read loop (kernels_avx2.c; 0 when AVX2 is missing or on other CPUs). */
uint64_t fe_memory_read_simd(const void *p, size_t nbytes, int reps, int streams);

#endif
