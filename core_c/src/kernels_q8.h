/* kernels_q8.h — the 8-bit-activation matrix products
 * (ferry_open_options.activations "auto", the default, and "q8"; see
 * docs/ARCHITECTURE.md, "Kernels", for which models "auto" keeps exact).
 *
 * Each token's input vector is quantized once per product, in one of two
 * layouts chosen by the weight's format (fe_q8_kind):
 *  - per 32 values (Q8_0, Q4_0, Q4_1, IQ4_XS): d = max|x| / 127, q = round-to-
 *    nearest-even(x / d) in -127..127, and s = d * sum(q) (for Q4_1's minimum);
 *  - per 256 values (Q4_K, Q5_K, Q6_K: their super-blocks, as llama.cpp's
 *    Q8_K): the same rounding with one d per 256 values, and the exact int16
 *    sums of q per 16 values ("bsums", for the minimums and Q6_K's offset).
 * A set may read the first layout rearranged or extended (its table's
 * `layout`: the AVX-512 VNNI set's FE_Q8_KIND_32Z, FE_Q8_KIND_32S and
 * FE_Q8_KIND_32TS: fe_q8_finish); the numbers are the same.
 * The row kernels take integer dot products of the stored weight integers
 * with q and scale them in float. This changes results slightly (the
 * activation's rounding error, ~0.2-0.4 % of each block's largest value);
 * "exact" (f32 activations) is the mode for verification.
 *
 * The float arithmetic is defined once, by the scalar reference, and every
 * SIMD set repeats it operation for operation, so the sets are bit-identical
 * (core_c/tests/test_kernels_q8.c). Lane l (0..7) of a 32-value block holds
 * its values 4l..4l+3.
 *
 * 32-value formats, per token and block b of a row:
 *   p[l] = sum_{i=4l}^{4l+3} qw[i] * qx[i]                          exact int32
 *   acc[b % 2][l] = fma(D_b * d_b, (float)p[l], acc[b % 2][l])   (one rounding: fmaf / FMA;
 *                   two sets, even and odd blocks, halve the chain of dependent adds)
 *   Q4_1:      m1[b % 2] = fma(M_b, s_b, m1[b % 2])              (M = m)
 * with D_b the weight block's float scale (IQ4_XS: its sub-block's exact
 * d * (ls - 32), qw the int8 levels); the result is
 *   h(acc[0] + acc[1], lane by lane) [+ (m1[0] + m1[1]) for Q4_1],
 *   h(v) = ((v0 + v4) + (v2 + v6)) + ((v1 + v5) + (v3 + v7)).
 * Every integer is below 2^24 in magnitude, so each conversion is exact.
 *
 * K-quants, per token and super-block j (256 values, sub-blocks k = 0..7 of
 * 32, activation scale dx_j, bsums bs[0..15] of its 16-value groups):
 *   P[l] = sum_k S_k(l) * sum_{i=4l}^{4l+3} qw_k[i] * qx[32k + i]   int32, any order
 *          qw unsigned (Q4_K 0..15, Q5_K 0..31, Q6_K 0..63: its stored q,
 *          the -32 comes below); S_k(l) the weight's integer scale of the
 *          16 values holding lane l (Q4_K/Q5_K: the 6-bit sc_k; Q6_K: the int8
 *          scale sc[2k + l/4])
 *   Q6_K:      P[l] -= 32 * (sc[2l] * bs[2l] + sc[2l+1] * bs[2l+1])
 *   acc[l] = fma(D * dx_j, (float)P[l], acc[l])
 *   Q4_K/Q5_K: acc[l] = fma(-(Dmin * dx_j), (float)(m_l * (bs[2l] + bs[2l+1])), acc[l])
 * (D, Dmin the super-block's f16 scales, m_l the 6-bit minimum of sub-block
 * l); the result is h(acc). So the float work is one or two multiply-adds per
 * 256 values and token; the rest is integer. Bounds (|qx| <= 127): a
 * maddubs pair sum is at most 2 * 63 * 127 = 16002 (no int16 saturation); a
 * bsum at most 16 * 127 = 2032 (int16); Q4_K/Q5_K lanes at most
 * 8 * 4 * 31 * 127 * 63 < 2^23 and their minimum terms 63 * 4064 < 2^18,
 * exact in float; Q6_K's P before the offset at most 8 * 4 * 63 * 127 * 128
 * < 2^25 and the offset 32 * 2 * 128 * 2032 < 2^24, so P stays far inside
 * int32 (< 2^26), but may exceed 2^24: its conversion then rounds to
 * nearest even (cvtdq2ps, scvtf and C's conversion in the default rounding
 * mode alike), a relative 2^-24, far below the activations' own rounding.
 *
 * q3_nl, per token, block b of 256 values (weight block p) and its 32-value
 * chunk c = 0..7 (activation scale d_c of FE_Q8_KIND_32T, whose byte
 * 32c + 4l + j is the q of value 32c + 8j + l):
 *   P[l] = sum_{j=0}^{3} G[index(32c + 8j + l)] * qx[32c + 8j + l]   exact int32
 *          (G = FE_Q3_Q8_GRID, |P| <= 4 * 123 * 127)
 *   acc[c % 2][l] = fma(fe_q3_q8_scale(p, c / 2) * d_c, (float)P[l], acc[c % 2][l])
 * and the result h(acc[0] + acc[1]) as for the 32-value formats. Beside the
 * activations' rounding this replaces each grid level by G / 56 (at most
 * 0.9 % away, the smallest levels; docs/QUANTIZATION.md, "8-bit activations").
 *
 * A token's arithmetic never depends on the others in the call, so a batch is
 * bit-identical to single tokens. */
#ifndef FERRY_KERNELS_Q8_H
#define FERRY_KERNELS_Q8_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "formats.h"

#define FE_Q8_BLOCK 32
#define FE_Q8K_BLOCK 256

/* The activation layout a weight format's q8 kernel reads. FE_Q8_KIND_32Z
 * is FE_Q8_KIND_32 rearranged for AVX-512 (fe_q8_finish), read only by that
 * set's Q8_0 and Q4_0 kernels over 4 tokens or more (its table's `layout`).
 * FE_Q8_KIND_32T is FE_Q8_KIND_32 in q3_nl's index order (fe_q8_finish),
 * read by every set's q3_nl kernel. FE_Q8_KIND_32S is FE_Q8_KIND_32 with
 * each token's record followed by Q4_0's offset term precomputed
 * (fe_q8_finish): read by the AVX-512 VNNI set's Q4_0 kernels under 4
 * tokens (its four-row kernel; the one-row one reads the record as
 * FE_Q8_KIND_32, token by token). FE_Q8_KIND_32TS is FE_Q8_KIND_32T with
 * q3_nl's offset term precomputed the same way (read by the AVX-512 VBMI
 * q3_nl kernels). */
enum { FE_Q8_KIND_32 = 0, FE_Q8_KIND_256 = 1, FE_Q8_KIND_32Z = 2, FE_Q8_KIND_32T = 3, FE_Q8_KIND_32S = 4, FE_Q8_KIND_32TS = 5, FE_Q8_KINDS = 6 };
int fe_q8_kind(int fmt);

/* One token's quantized activations of `cols` values, per 32 (cols a
 * multiple of 32): int8 q[cols], then float d[cols/32], then float s[cols/32]. */
size_t fe_q8_stride(int cols);
/* Per 256 (cols a multiple of 256): int8 q[cols], float d[cols/256], int16 bs[cols/16]. */
size_t fe_q8k_stride(int cols);
/* FE_Q8_KIND_32S (FE_Q8_KIND_32TS): fe_q8_stride(cols) bytes of FE_Q8_KIND_32
 * (FE_Q8_KIND_32T), then int32 c[cols/4] (cols bytes, rounded up to 64) at
 * fe_q8_sums_offset(cols). */
size_t fe_q8_stride_kind(int kind, int cols);
static inline size_t fe_q8_sums_offset(int cols) { return fe_q8_stride(cols); }
/* FE_Q8_KIND_32Z keeps each token's bytes within its tile of tokens: n
 * tokens (n >= 1) run in ceil(n / FE_Q8_Z_TILE) tiles of near-equal size
 * (n = 20: 10 + 10), and the k tokens of the tile starting at token t0 fill
 * out + t0 * st .. + k * st (st = fe_q8_stride(cols)) as their q bytes block
 * pair by block pair, token by token within each (64 bytes a token: pair p
 * of token i at p * 64 * k + i * 64; a last odd block, 32 bytes a token, at
 * (cols / 32 - 1) * 32 * k + i * 32), then each token's d and s (st - cols
 * bytes a token, at k * cols + i * (st - cols)). A tile's kernel then reads
 * token i's block pair at a constant offset from one pointer (AVX-512's
 * tiles of 16 tokens ran out of general registers with one pointer a token:
 * docs/bench-log/2026-12-07.md, session 22). */
#define FE_Q8_Z_TILE 16
/* The tile holding token t of n: its first token and size. */
static inline void fe_q8_z_tile(int n, int t, int *t0, int *k) {
    const int tiles = (n + FE_Q8_Z_TILE - 1) / FE_Q8_Z_TILE;
    int first = 0, size = n;
    for (int j = 0; j < tiles; j++) {
        size = (n - first) / (tiles - j);
        if (t < first + size) break;
        first += size;
    }
    *t0 = first;
    *k = size;
}
/* Where block b (of cols / 32) of token i of a 32Z tile of k tokens at `tile` starts. */
static inline uint8_t *fe_q8_z_block(uint8_t *tile, int cols, int k, int i, int b) {
    const int nb = cols / FE_Q8_BLOCK;
    return b < (nb & ~1) ? tile + (size_t)(b / 2) * 64 * (size_t)k + (size_t)i * 64 + (size_t)(b % 2) * FE_Q8_BLOCK
                         : tile + (size_t)b * FE_Q8_BLOCK * (size_t)k + (size_t)i * FE_Q8_BLOCK;
}

/* Quantize n tokens x[t * x_stride .. + cols) into out + t * fe_q8_stride_kind(kind, cols)
 * (FE_Q8_KIND_32Z: into their tiles, above): the scalar reference; each SIMD
 * set has its own, bit-identical (the table's `quantize`). */
void fe_q8_quantize(int kind, const float *x, size_t x_stride, int cols, int n, uint8_t *out);
typedef void (*fe_q8quant_fn)(int kind, const float *x, size_t x_stride, int cols, int n, uint8_t *out);
/* The quantizers' last step: n tokens quantized as FE_Q8_KIND_32 into out +
 * t * fe_q8_stride_kind(kind, cols) (FE_Q8_KIND_32Z: each block, d and s
 * already in its tile's place, above) turned into layout `kind` in place:
 *  - FE_Q8_KIND_32Z: each q byte flipped to q + 128 (as uint8: q ^ 0x80),
 *    and the bytes of blocks 2p and 2p + 1 interleaved four at a time
 *    (bytes 4l..4l+3 of block 2p, then bytes 4l..4l+3 of block 2p + 1, for
 *    l = 0..7); a last odd block is only flipped;
 *  - FE_Q8_KIND_32T (and 32TS): within each 32-value block, byte 4l + j
 *    becomes the q of value 8j + l (l = 0..7, j = 0..3), the order in which a
 *    q3_nl block's lane l holds its indices (formats.h);
 *  - FE_Q8_KIND_32S (32TS): c[i] = k * (the stored q bytes 4i..4i+3 summed)
 *    at fe_q8_sums_offset(cols), exact, with k = -8 (32S) or -128 (32TS):
 *    the start of a lane whose weights are taken unsigned, offset by -k
 *    (Q4_0's nibbles: sum (w - 8) x = sum w x - 8 sum x; q3_nl's levels +
 *    128), made once per token instead of once per row.
 * d and s are unchanged; FE_Q8_KIND_32 and FE_Q8_KIND_256 are left as they are. */
void fe_q8_finish(int kind, uint8_t *out, int cols, int n);
/* Room for n tokens of `cols` values in each layout of `kinds` (a fe_q8_ctx buffer). */
size_t fe_q8_buffer_bytes(unsigned kinds, int cols, int n);

/* For t < n: y[t * ys] = the q8 dot of a stored weight row with token t's
 * quantized activations at xq + t * fe_q8_stride_kind(fe_q8_kind(fmt), cols). */
typedef void (*fe_q8dot_fn)(const uint8_t *row, int cols, const uint8_t *xq, int n, float *y, size_t ys);
/* nr consecutive rows at once (nr = 2 or 4: row + i * row_bytes, i < nr):
 * y[t * ys + i], each bit for bit its rowdot's result (a set may lay two
 * rows side by side in a vector so that one float step serves both, and
 * share each activation load among the nr rows). */
typedef void (*fe_q8dot2_fn)(const uint8_t *row, size_t row_bytes, int nr, int cols, const uint8_t *xq, int n,
                             float *y, size_t ys);
#define FE_Q8_ROWS_MAX 4
/* How many of `left` rows one call takes: 4, 2 (a rowdot2 call) or 1 (rowdot). */
static inline int fe_q8_rows_per_call(int left) { return left >= 4 ? 4 : left >= 2 ? 2 : 1; }
/* How many of `left` rows the next call takes when the set has a four-row
 * kernel of few tokens (`four`: 4 while 4 are left, else 1 row) or a
 * multi-row one (`two`: fe_q8_rows_per_call); 1 (rowdot) without either. */
static inline int fe_q8_rows_next(int four, int two, int left) {
    return four ? (left >= 4 ? 4 : 1) : two ? fe_q8_rows_per_call(left) : 1;
}
/* Exactly four consecutive rows over 1-3 tokens (row + i * row_bytes into
 * y[t * ys + i], i < 4), each bit for bit its rowdot's result: a decode
 * kernel that shares each activation load among the four rows. A kernel
 * whose format's bit is set in the set's rowdot4_prefetch also prefetches
 * the rows after its four, spread through its own loads, none at or past
 * pf_end (NULL: no prefetch); the others ignore pf_end. */
typedef void (*fe_q8dot4_fn)(const uint8_t *row, size_t row_bytes, int cols, const uint8_t *xq, int n, float *y,
                             size_t ys, const uint8_t *pf_end);

/* iq4_xs's SIMD q8 row kernel of set impl (kernels.h: fe_iq4xs_kernel), or NULL. */
fe_q8dot_fn fe_iq4xs_q8_kernel(int impl);

typedef struct fe_q8_kernels {
    const char *name;                   /* "scalar", "avx2", "neon", "avx512vnni" */
    fe_q8dot_fn rowdot[FE_N_FORMATS];   /* NULL: no integer kernel (f32, f16, bf16, q2_vq use the exact path) */
    fe_q8quant_fn quantize;             /* the quantizer (fe_q8_quantize's results) */
    int (*layout)(int fmt, int n);      /* the layout rowdot[fmt] reads over n tokens (NULL: fe_q8_kind(fmt)) */
    fe_q8dot2_fn rowdot2[FE_N_FORMATS]; /* NULL: rows one at a time (rowdot) */
    int rowdot2_min_tokens;             /* rowdot2 is used from this many tokens */
    fe_q8dot4_fn rowdot4[FE_N_FORMATS]; /* four consecutive rows at once (row + i * row_bytes into
                                         * y[t * ys + i], i < 4), each bit for bit its rowdot's result;
                                         * NULL: none (then pairs or single rows) */
    int rowdot4_max_tokens;             /* rowdot4 is used up to this many tokens */
    unsigned rowdot4_prefetch;          /* bit fmt: rowdot4[fmt] prefetches the rows after its four itself
                                         * (below pf_end), so its caller does not */
} fe_q8_kernels;
/* The layout set k's kernel for format fmt reads over n tokens. */
int fe_q8_layout(const fe_q8_kernels *k, int fmt, int n);
/* The layouts (bit `kind` set for each) set k's kernels read for the formats
 * with fmts[fmt] != 0 over 1..n_max tokens: the regions a buffer needs. */
unsigned fe_q8_kinds(const fe_q8_kernels *k, const unsigned char fmts[FE_N_FORMATS], int n_max);
/* THE rule for a session's buffer (the engine's plan and ferry_q8_buffer_bytes):
 * prompt chunks of `chunk` tokens at the widest input `cols` (rounded down to
 * whole blocks) in the layouts set k reads for those formats (*kinds_out,
 * when not NULL); 0 without a set or any format it multiplies. */
size_t fe_q8_plan_bytes(const fe_q8_kernels *k, const unsigned char fmts[FE_N_FORMATS], int cols, int chunk,
                        unsigned *kinds_out);

/* The q8-only set after the FE_KERNELS_* ids: AVX-512 VNNI integer products
 * (kernels_q8_avx512.c); its exact (f32) kernels are AVX2's. */
#define FE_Q8_AVX512VNNI 3
#define FE_Q8_IMPLS 4

/* Set k's q8 row kernel of format fmt (NULL: none, the exact path): its
 * table's entry, or iq4_xs's kernel kept outside the tables. */
fe_q8dot_fn fe_q8_rowdot(const fe_q8_kernels *k, int fmt);

/* The q8 set of a kernel implementation (FE_KERNELS_* or FE_Q8_AVX512VNNI),
 * or NULL when it is not built in or this CPU cannot run it. */
const fe_q8_kernels *fe_q8_kernels_get(int impl);
/* The q8 set "auto" picks beside the exact set `impl`: AVX-512 VNNI with AVX2
 * when this CPU has it, else impl itself. */
int fe_q8_best(int impl);
const fe_q8_kernels *fe_q8_kernels_avx2(void);       /* kernels_q8_avx2.c (NULL elsewhere) */
const fe_q8_kernels *fe_q8_kernels_neon(void);       /* kernels_q8_neon.c (NULL elsewhere) */
const fe_q8_kernels *fe_q8_kernels_avx512vnni(void); /* kernels_q8_avx512.c (NULL off x86-64) */
/* AVX2, FMA, F16C and AVX-512 F, BW, VL, VNNI, with the OS saving the opmask
 * and zmm state (cpuid and xgetbv; 0 off x86-64). */
int fe_cpu_has_avx512vnni(void);

/* A session's q8 state, carried to fe_matmul by fe_ops.q8 (NULL: exact f32 path). */
typedef struct fe_q8_ctx {
    const fe_q8_kernels *k; /* the engine's set */
    uint8_t *buf;           /* quantized activations of one product: fe_q8_buffer_bytes */
    size_t bytes;           /* its size */
    unsigned kinds;         /* the layouts it has a region for (fe_q8_kinds) */
} fe_q8_ctx;

/* Where a product of n tokens over `cols` keeps the activations of layout
 * `kind` (one of q->kinds) in q->buf (the layouts side by side, so a job
 * mixing formats quantizes x once per layout). */
uint8_t *fe_q8_region(const fe_q8_ctx *q, int kind, int cols, int n);

/* The q8 kernel for a matrix of format fmt and `cols` columns over n tokens
 * with this context, or NULL when the product must take the exact path (no
 * context, no integer kernel for the format, no region for its layout, or
 * too little buffer). */
fe_q8dot_fn fe_q8_kernel_for(const fe_q8_ctx *q, int fmt, int cols, int n);
/* Its two-row kernel for n tokens, or NULL (then rows go one at a time). */
fe_q8dot2_fn fe_q8_kernel2_for(const fe_q8_kernels *k, int fmt, int n);
/* Its four-row kernel for n tokens, or NULL (then pairs or single rows). */
fe_q8dot4_fn fe_q8_kernel4_for(const fe_q8_kernels *k, int fmt, int n);

/* The row kernel rowdot_<prefix>_<fmt> of a SIMD set over the including
 * file's <fmt>_tile(row, cols, xq, stride, y, ys, nt): tiles of 4 tokens,
 * then the rest as one tile (nt a constant in every call). `attr` is the
 * functions' attribute (a target, or nothing); `stride` the layout's. */
#define FE_Q8_DRIVER(prefix, attr, fmt, stride)                                                             \
    attr static void rowdot_##prefix##_##fmt(const uint8_t *row, int cols, const uint8_t *xq, int n, float *y, \
                                             size_t ys) {                                                   \
        const size_t st = stride(cols);                                                                     \
        int t = 0;                                                                                          \
        for (; t + 4 <= n; t += 4) fmt##_tile(row, cols, xq + (size_t)t * st, st, y + (size_t)t * ys, ys, 4); \
        switch (n - t) {                                                                                    \
        case 1: fmt##_tile(row, cols, xq + (size_t)t * st, st, y + (size_t)t * ys, ys, 1); break;           \
        case 2: fmt##_tile(row, cols, xq + (size_t)t * st, st, y + (size_t)t * ys, ys, 2); break;           \
        case 3: fmt##_tile(row, cols, xq + (size_t)t * st, st, y + (size_t)t * ys, ys, 3); break;           \
        default: break;                                                                                     \
        }                                                                                                   \
    }

/* The quantizer `name` over the including file's
 * float run(const float *v, int len, int8_t *q, int sums[len / 16]):
 * len (32 or 256) values v into q, the sums of q per 16 values, returns d. */
#define FE_Q8_QUANTIZER(name, attr, run)                                                                    \
    attr static void name(int kind, const float *x, size_t xs, int cols, int n, uint8_t *out) {             \
        const int big = kind == FE_Q8_KIND_256, len = big ? FE_Q8K_BLOCK : FE_Q8_BLOCK, nb = cols / len;    \
        const size_t st = fe_q8_stride_kind(kind, cols);                                                    \
        for (int t = 0; t < n; t++) {                                                                       \
            const float *v = x + (size_t)t * xs;                                                            \
            int t0 = t, k = 1; /* FE_Q8_KIND_32Z: the token's tile (else itself alone) */                  \
            if (kind == FE_Q8_KIND_32Z) fe_q8_z_tile(n, t, &t0, &k);                                        \
            uint8_t *tile = out + (size_t)t0 * st;                                                          \
            float *d = (float *)(tile + (size_t)k * cols + (size_t)(t - t0) * (st - (size_t)cols)), *s = d + nb; \
            int16_t *bs = (int16_t *)(d + nb);                                                              \
            for (int b = 0; b < nb; b++, v += len) {                                                        \
                int8_t *q = (int8_t *)(kind == FE_Q8_KIND_32Z ? fe_q8_z_block(tile, cols, k, t - t0, b)      \
                                                              : tile + (size_t)b * len);                    \
                int sums[FE_Q8K_BLOCK / 16];                                                                \
                d[b] = run(v, len, q, sums);                                                                \
                if (big) /* |sum| <= 16 * 127: int16 */                                                     \
                    for (int g = 0; g < FE_Q8K_BLOCK / 16; g++) bs[b * (FE_Q8K_BLOCK / 16) + g] = (int16_t)sums[g]; \
                else                                                                                        \
                    s[b] = d[b] * (float)(sums[0] + sums[1]);                                               \
            }                                                                                               \
        }                                                                                                   \
        fe_q8_finish(kind, out, cols, n);                                                                   \
    }

/* A whole SIMD set: the drivers of the seven formats, its quantizer
 * quantize_<prefix> (FE_Q8_QUANTIZER) and its table `name`. */
#define FE_Q8_SET(name, prefix, attr)                                                                       \
    FE_Q8_DRIVER(prefix, attr, q8_0, fe_q8_stride)                                                          \
    FE_Q8_DRIVER(prefix, attr, q4_0, fe_q8_stride)                                                          \
    FE_Q8_DRIVER(prefix, attr, q4_1, fe_q8_stride)                                                          \
    FE_Q8_DRIVER(prefix, attr, q4_k, fe_q8k_stride)                                                         \
    FE_Q8_DRIVER(prefix, attr, q5_k, fe_q8k_stride)                                                         \
    FE_Q8_DRIVER(prefix, attr, q6_k, fe_q8k_stride)                                                         \
    FE_Q8_DRIVER(prefix, attr, q3_nl, fe_q8_stride)                                                         \
    static const fe_q8_kernels name = {                                                                     \
        #prefix,                                                                                            \
        {[FE_Q8_0] = rowdot_##prefix##_q8_0, [FE_Q4_0] = rowdot_##prefix##_q4_0,                            \
         [FE_Q4_1] = rowdot_##prefix##_q4_1, [FE_Q4_K] = rowdot_##prefix##_q4_k,                            \
         [FE_Q5_K] = rowdot_##prefix##_q5_k, [FE_Q6_K] = rowdot_##prefix##_q6_k,                            \
         [FE_Q3_NL] = rowdot_##prefix##_q3_nl},                                                             \
        quantize_##prefix,                                                                                  \
        NULL,                                                                                               \
        {NULL},                                                                                             \
        0,                                                                                                  \
        {NULL},                                                                                             \
        0,                                                                                                  \
        0,                                                                                                  \
    };

/* The 8 6-bit scales and 8 6-bit minimums of a Q4_K/Q5_K super-block (its
 * 12 bytes at s) as bytes out[0..7] and out[8..15], four at a time (the same
 * values as fe_q4k_scale_min). */
static inline void fe_q8_k4_scales(const uint8_t *s, uint8_t out[16]) {
    uint32_t u[3], a[4];
    memcpy(u, s, 12);
    a[0] = u[0] & 0x3f3f3f3fu;                                              /* sc 0-3: low 6 bits of s[0..3] */
    a[1] = (u[2] & 0x0f0f0f0fu) | ((u[0] >> 6) & 0x03030303u) << 4;         /* sc 4-7 */
    a[2] = u[1] & 0x3f3f3f3fu;                                              /* m 0-3: low 6 bits of s[4..7] */
    a[3] = ((u[2] >> 4) & 0x0f0f0f0fu) | ((u[1] >> 6) & 0x03030303u) << 4;  /* m 4-7 */
    memcpy(out, a, 16);
}

/* q3_nl (kernels_q8.h's top comment, "q3_nl"): the grid as int8 levels
 * FE_Q3_Q8_GRID (round(56 * fe_q3_levels), at most 0.9 % from each level,
 * 0.3 % rms), and a group's float scale s_g / 56. */
#define FE_Q3_Q8_GRID {-123, -74, -40, -12, 13, 40, 74, 123}
static inline float fe_q3_q8_scale(const uint8_t *block, int g) { return fe_q3_group_scale(block, g) * (1.0f / 56.0f); }

/* Shared by the SIMD sets: 8 lanes summed in the order h() above. */
static inline float fe_q8_hsum8(const float v[8]) {
    return ((v[0] + v[4]) + (v[2] + v[6])) + ((v[1] + v[5]) + (v[3] + v[7]));
}

#endif
