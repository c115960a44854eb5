/*
 * ferry_kernels.h — the core's compute kernels and its 3-bit expert quantizer,
 * for the converter, tests and benchmarks. Independent of engines: nothing
 * here allocates beyond the call or keeps state. Every kernel call names the
 * implementation it uses (the three plain quantizer calls take the best); an engine picks its own set when it is opened
 * (ferry_open_options.kernels in ferry.h) and ferry_model_info.kernels says
 * which.
 *
 * Formats are the container's codes (docs/FORMAT.md): 0 f32, 1 f16, 2 bf16,
 * 3 q8_0, 4 q4_0, 5 q4_1, 6 q4_k, 7 q6_k, 8 q3_nl, 9 q5_k,
 * 10 q2_vq, 11 iq4_xs; ferry_formats lists them all.
 */
#ifndef FERRY_KERNELS_H_PUBLIC
#define FERRY_KERNELS_H_PUBLIC

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Kernel implementations. */
#define FERRY_KERNELS_SCALAR 0
#define FERRY_KERNELS_AVX2 1
#define FERRY_KERNELS_NEON 2
/* For the 8-bit-activation products only (ferry_kernel_matmul_q8 and an
 * engine's kernels "avx512vnni" or "auto"): AVX-512 VNNI integer products on
 * x86-64, with the AVX2 kernels for everything exact. */
#define FERRY_KERNELS_AVX512VNNI 3

/* The q3_nl format: 256 values in 99 bytes (3.09375 bits per value). */
#define FERRY_Q3_BLOCK 256
#define FERRY_Q3_BLOCK_BYTES 99
/* The q2_vq format: 256 values in 73 bytes (2.28125 bits per value). */
#define FERRY_Q2_BLOCK 256
#define FERRY_Q2_BLOCK_BYTES 73

/* The iq4_xs format (ggml's IQ4_XS): 256 values in 136 bytes (4.25 bits per value). */
#define FERRY_IQ4_BLOCK 256
#define FERRY_IQ4_BLOCK_BYTES 136

/* "scalar", "avx2", "neon" (or "unknown"). */
const char *ferry_kernels_name(int impl);
/* Nonzero when `impl` is built in and this CPU can run it. */
int ferry_kernels_available(int impl);
/* The best implementation this CPU supports: what an engine opened with
 * kernels "auto" uses. */
int ferry_kernels_best(void);

/* Format code by manifest name, or -1; bytes of one row (0 if impossible). */
int ferry_format_code(const char *name);
uint64_t ferry_format_row_bytes(int fmt, uint64_t cols);

/* One row of the core's table of weight formats (core_c/src/formats.c), the
 * one source of these facts: Python builds its table from it once, at import
 * (app/engine/binding.py, FORMATS). Bits per weight are
 * 8 * block_bytes / block_elems. */
typedef struct {
    int code;            /* the container's format byte, ferry_format_code(name) */
    const char *name;    /* manifest spelling, e.g. "q4_1"; constant data, never freed */
    int block_elems;     /* values per block (1 for the plain floats) */
    int block_bytes;     /* bytes per block */
} ferry_format_record;

/* Every weight format the core knows, in code order: fills the caller's
 * out[0 .. min(count, cap) - 1] (out may be NULL when cap is 0) and returns
 * the count, so a caller asks once with cap 0 for the size, then again. */
int ferry_formats(ferry_format_record *out, int cap);

/* y[t][r] = W[r] . x[t] for a [rows, cols] matrix stored in `fmt`, x [n][cols],
 * y [n][rows], on the calling thread with implementation `impl`.
 * Returns 0, or -1 for a bad argument or an unavailable implementation. */
int ferry_kernel_matmul(int impl, int fmt, const void *w, int rows, int cols, const float *x, int n, float *y);

/* The same product in the opt-in 8-bit-activation mode (ferry_open_options.
 * activations = "q8"): each token's x quantized per 32 values to int8 with a
 * float scale, integer dot products with the stored weights. Every
 * implementation gives bit-identical results. Returns -1 also for a format
 * without an integer kernel (ferry_q8_activations_supported) or cols not a
 * multiple of 32. */
int ferry_kernel_matmul_q8(int impl, int fmt, const void *w, int rows, int cols, const float *x, int n, float *y);
/* Nonzero for the formats the 8-bit-activation mode computes with integer
 * kernels: q8_0, q4_0, q4_1, q4_k, q5_k, q6_k (the others stay exact). */
int ferry_q8_activations_supported(int fmt);
/* The bytes of a session's 8-bit-activation buffer with the set the default
 * ("auto") takes on this CPU, for a model whose matrices are stored in the n
 * format codes fmts[] (widest matrix input `cols`, prompt chunks of `chunk`
 * tokens): the engine's own rule (ferry_memory_plan.q8_bytes), a region only
 * for each layout that set reads for those formats. 0 when none of them has
 * integer kernels. */
uint64_t ferry_q8_buffer_bytes(const int *fmts, int n, int cols, int chunk);
/* Nonzero when the 8-bit-activation set `impl` (FERRY_KERNELS_*, including
 * FERRY_KERNELS_AVX512VNNI) is built in and this CPU can run it; its name
 * ("scalar", "avx2", "neon", "avx512vnni", or "unknown"). */
int ferry_q8_kernels_available(int impl);
const char *ferry_q8_kernels_name(int impl);

/* Widen rows x cols stored values to floats (the scalar reference decoder). */
int ferry_dequantize(int fmt, const void *src, int rows, int cols, float *out);

/* Quantize n floats (a multiple of 32) to q8_0, q4_0 or q4_1 blocks
 * (fmt: ferry_format_code("q8_0") etc.), byte for byte ggml's reference
 * quantizer (round half away from zero for q8_0, truncation after +8.5 / +0.5
 * for the 4-bit ones, scales as f16 rounded to nearest even). Returns 0, or -1
 * for another format, n not a multiple of 32, or a non-finite value (dst is
 * then written up to the block before it). Thread-safe: split n over threads. */
int ferry_quantize_blocks(int fmt, const float *src, uint64_t n, void *dst);

/* Read nbytes at p (64-byte aligned, a multiple of 128 * streams), `reps`
 * times, as `streams` (1..8) interleaved sequential streams; returns a value
 * that depends on every byte read (so nothing is skipped). One core reads
 * more with several streams in flight than with one. */
uint64_t ferry_memory_read(const void *p, size_t nbytes, int reps, int streams);

/* Quantize rows x cols values (cols a multiple of FERRY_Q3_BLOCK) to q3_nl,
 * writing rows * cols / 256 * 99 bytes to dst. importance: NULL, or `cols`
 * non-negative weights (e.g. mean squared activations of each input column)
 * that the scale search minimises the weighted error for.
 * Returns 0, or -1 for bad arguments or non-finite input (dst is then partly
 * written). */
int ferry_q3_quantize_f32(const float *src, int rows, int cols, const float *importance, void *dst);
int ferry_q3_quantize_bf16(const uint16_t *src, int rows, int cols, const float *importance, void *dst);
/* From MXFP4 (compressed-tensors mxfp4-pack-quantized): `packed` is
 * [rows][cols/2] bytes, low nibble the even column, each nibble e2m1 with bit 3
 * the sign; `scales` is [rows][cols/32] E8M0 bytes: w = e2m1 * 2^(scale-127). */
int ferry_q3_quantize_mxfp4(const uint8_t *packed, const uint8_t *scales, int rows, int cols,
                            const float *importance, void *dst);

/* The same three with the implementation named: impl FERRY_KERNELS_*, source
 * FERRY_Q3_SOURCE_* (src is float, uint16_t bf16 bits, or the MXFP4 `packed`
 * bytes; mxfp4_scales only for MXFP4). Every implementation writes the same
 * bytes; the three calls above use ferry_kernels_best(). Returns -1 as they
 * do, and for an implementation this CPU cannot run. */
#define FERRY_Q3_SOURCE_F32 0
#define FERRY_Q3_SOURCE_BF16 1
#define FERRY_Q3_SOURCE_MXFP4 2
int ferry_q3_quantize(int impl, int source, const void *src, const uint8_t *mxfp4_scales, int rows, int cols,
                      const float *importance, void *dst);

/* Quantize rows x cols values (cols a multiple of FERRY_Q2_BLOCK) to q2_vq,
 * writing rows * cols / 256 * 73 bytes to dst. importance: NULL, or `cols`
 * non-negative finite weights the codeword and scale search minimises the
 * weighted error for. Every implementation (portable, AVX2, AVX-512, NEON:
 * the best this CPU runs is used) writes the same bytes, and so does any
 * split of the rows between calls. Returns 0, or -1 for bad arguments,
 * non-finite input or no memory. */
int ferry_q2_quantize_f32(const float *src, int rows, int cols, const float *importance, void *dst);

/* The q2_vq search's tables (the codebook's neighbour lists, ~1.2 MB, a few
 * ms to make): ferry_q2_quantize_f32 makes them on every call; a caller
 * quantizing many matrices makes them once here and passes them to
 * ferry_q2_quantize_with (read only: one quantizer serves any number of
 * threads at once). Same bytes as ferry_q2_quantize_f32. new returns NULL
 * when out of memory; free(NULL) does nothing. */
typedef struct ferry_q2_quantizer ferry_q2_quantizer;
ferry_q2_quantizer *ferry_q2_quantizer_new(void);
void ferry_q2_quantizer_free(ferry_q2_quantizer *q);
int ferry_q2_quantize_with(const ferry_q2_quantizer *q, const float *src, int rows, int cols, const float *importance,
                           void *dst);

/* Quantize rows x cols values (cols a multiple of FERRY_IQ4_BLOCK) to
 * iq4_xs, writing rows * cols / 256 * 136 bytes to dst. importance: NULL, or
 * `cols` non-negative finite weights of the squared error the scale search
 * minimises. Portable; blocks are independent. Returns 0, or -1 for bad
 * arguments or non-finite input. */
int ferry_iq4xs_quantize_f32(const float *src, int rows, int cols, const float *importance, void *dst);

#ifdef __cplusplus
}
#endif
#endif /* FERRY_KERNELS_H_PUBLIC */
