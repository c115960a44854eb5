/* kernels_q8_avx512.c — the 8-bit-activation row kernels for x86-64 CPUs
 * with AVX-512 VNNI (F, BW, VL and VNNI, the OS saving the opmask and zmm
 * state: fe_cpu_has_avx512vnni). Per-function target attributes: the rest of
 * the core stays AVX2-baseline, and nothing here is built off x86-64.
 *
 * The integer sums are the reference's (kernels_q8.h) exactly, obtained with
 * vpdpbusd (unsigned x signed bytes, four products summed into an int32
 * lane) instead of maddubs + madd; the float steps are the reference's, lane
 * for lane, in the same order, so the set is bit-identical to the scalar one
 * and to AVX2.
 *
 * K-quants: a zmm holds two 32-value sub-blocks (k in the low 256 bits, k + 1
 * in the high), matching 64 contiguous activations. vpdpbusd gives each
 * lane's 4-value sum p (|p| <= 4 * 63 * 127 = 32004: an int16, its upper
 * half the sign extension), and vpdpwssd with the integer scale in the low
 * int16 of each lane (upper int16 0) adds S * p to the super-block's lanes.
 * The two halves are added at the end of the super-block (int32: any order).
 *
 * Q8_0 and Q4_0 (signed weights): vpdpbusd needs one unsigned operand, so
 * the activations come flipped to x + 128 (x ^ 0x80, by the quantizer:
 * FE_Q8_KIND_32Z, which also interleaves blocks 2p and 2p + 1 so that one
 * zmm holds both) and the accumulator starts at -128 * (sum of the lane's 4
 * weights), computed once per block pair and shared by the tile's tokens.
 * The per-block float scales D_b * d_b are multiplied 16 blocks at a time
 * (the same single IEEE products). Q4_0 and Q8_0 over 1-3 tokens take four
 * rows a call (the table's rowdot4: tile_r4_pairs, Q4_0 on FE_Q8_KIND_32S,
 * the lanes' -8 x-sum starts precomputed per token, Q8_0 on FE_Q8_KIND_32), and
 * so does Q4_1 (q4_1_tile_r4 on FE_Q8_KIND_32); a last 1-3 rows of a
 * thread's share, and Q4_1 from 4 tokens, use the AVX2 set's kernels,
 * faster there: see the drivers.
 *
 * Tokens run in tiles of up to 16 (Q8_0, Q4_0) or 8 (K-quants) sharing each
 * decoded weight block (32 vector registers); a token's arithmetic does not
 * depend on its tile. From 2 tokens the K-quants take two or four rows per
 * call (rowdot2: k2_tile, k2_rows_long), a row pair per zmm, one row in each
 * 256-bit half, so one zmm fold serves both rows, and four rows share each
 * activation load; each lane's arithmetic stays the reference's.
 *
 * q3_nl (where the CPU also has AVX-512 VBMI; else AVX2's kernel): a zmm
 * holds one 64-value group, its 3-bit indices turned into grid levels + 128
 * (unsigned) by at most one vpermb gathering the group's bytes, then
 * vpmultishiftqb + vpermb (q3_levels), vpdpbusd with the activations as
 * stored (the accumulator starting at -128 times the token's lane sum of q, precomputed per token: FE_Q8_KIND_32TS);
 * a block's 8 float factors in one ymm product. */
#include "kernels.h"
#include "kernels_q8.h"

#if defined(__x86_64__) || defined(_M_X64)
#include <cpuid.h>
#include <immintrin.h>

#include "kernels_avx2_util.h"
#include <string.h>

#define ISA "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c"
#define INL static inline __attribute__((always_inline, target(ISA)))
#define TGT __attribute__((target(ISA)))
#define TILE FE_Q8_Z_TILE /* the most tokens in one tile (the 32-value formats', 16; the K-quants' are 8) */

int fe_cpu_has_avx512vnni(void) {
    unsigned a, b, c, d;
    if (!fe_cpu_has_avx2() || __get_cpuid_max(0, NULL) < 7) return 0;
    __cpuid_count(7, 0, a, b, c, d);
    const int f = (b >> 16) & 1, bw = (b >> 30) & 1, vl = (b >> 31) & 1, vnni = (c >> 11) & 1;
    if (!(f && bw && vl && vnni)) return 0;
    unsigned lo, hi;
    __asm__("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    (void)hi;
    return (lo & 0xe6) == 0xe6; /* XMM, YMM, opmask, ZMM 0-15 upper halves, ZMM 16-31 saved by the OS */
}

INL __m256i ld(const void *p) { return _mm256_loadu_si256((const __m256i *)p); }
INL __m512i ld512(const void *p) { return _mm512_loadu_si512(p); }
/* 32 bytes at p in both halves */
INL __m512i ld2x(const void *p) { return _mm512_broadcast_i64x4(ld(p)); }

#define QX(t) ((const uint8_t *)(xq + (size_t)(t) * st))
#define DX(t) ((const float *)(xq + (size_t)(t) * st + (size_t)cols))
#define BS(t) ((const int16_t *)(DX(t) + nsb))
#define CX(t) ((const int32_t *)(xq + (size_t)(t) * st + so)) /* so: fe_q8_sums_offset(cols) */

/* P += S * (the 4-value sums of w . x), lane by lane. */
INL __m512i dp(__m512i P, __m512i w, __m512i x, __m512i s) {
    return _mm512_dpwssd_epi32(P, _mm512_dpbusd_epi32(_mm512_setzero_si512(), w, x), s);
}

/* ------------------------------------------------ the 32-value formats */

/* The 32 nibbles of 16 bytes as bytes: low nibbles (values 0-15), then high ones (16-31). */
INL __m256i nibbles(const uint8_t *q) {
    __m128i v = _mm_loadu_si128((const __m128i *)q);
    return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(v, 4), v), _mm256_set1_epi8(15));
}

/* Four tokens or more (FE_Q8_KIND_32Z: x flipped to x + 128, blocks 2p and
 * 2p + 1 interleaved four bytes at a time): two blocks per zmm, the even
 * block's 8 lanes in the even lanes and the odd block's in the odd ones,
 * which are the reference's two accumulator sets (acc[b % 2]), so each lane
 * takes exactly the reference's multiply-adds. The weights of a block pair
 * are interleaved the same way once per row (vpermt2d) and their scales
 * D_b * d_b, adjacent in sc, are one 64-bit broadcast. A last odd block
 * runs in ymm and adds to the even lanes only. */
INL __m256i w32(const uint8_t *row, int b, const int four) {
    return four ? _mm256_sub_epi8(nibbles(row + 18 * (size_t)b + 2), _mm256_set1_epi8(8)) : ld(row + 34 * (size_t)b + 2);
}

/* The f16 scales D_b of m <= 16 Q4_0 blocks from p (18-byte blocks: word 9i)
 * as floats, lanes from m on zero: blocks 0-7 from bytes 0-127, 8-15 from
 * bytes 144-271, each a word permute of two masked loads (no byte past the m
 * blocks is read), instead of 16 scalar conversions (1.1-1.2x the whole tile
 * at 4-20 tokens, a 768 x 2048 or 2048 x 768 matrix). */
INL __mmask64 upto(size_t len, size_t off) {
    return len <= off ? 0 : len - off >= 64 ? ~(__mmask64)0 : ((__mmask64)1 << (len - off)) - 1;
}
INL __m512 q4_0_scales16(const uint8_t *p, int m) {
    const __m512i w9 = _mm512_set_epi16(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 63, 54, 45, 36, 27, 18, 9, 0, 63,
                                        54, 45, 36, 27, 18, 9, 0);
    const size_t len = 18 * (size_t)m;
    const __m512i a = _mm512_permutex2var_epi16(_mm512_maskz_loadu_epi8(upto(len, 0), p), w9,
                                                _mm512_maskz_loadu_epi8(upto(len, 64), p + 64));
    const __m512i b = _mm512_permutex2var_epi16(_mm512_maskz_loadu_epi8(upto(len, 144), p + 144), w9,
                                                _mm512_maskz_loadu_epi8(upto(len, 208), p + 208));
    const __m256i h = _mm256_blend_epi32(_mm512_castsi512_si256(a), _mm256_permute4x64_epi64(_mm512_castsi512_si256(b), 0x44), 0xf0);
    return _mm512_maskz_mov_ps((__mmask16)((1u << m) - 1), _mm512_cvtph_ps(h));
}

/* The tile's results: per token acc[0] + acc[1] lane by lane (its even and
 * odd lanes), then the reference's sum of 8, ((v0 + v4) + (v2 + v6)) + ((v1 +
 * v5) + (v3 + v7)). Four tokens at a time share each step's vector (v of
 * tokens t, t + 1 in alternate lanes, of t + 2, t + 3 beside them), about
 * half the instructions of one token at a time; the rest one by one. */
INL void sums32z(const __m512 *Z, float *y, size_t ys, const int nt) {
    const __m512i ev = _mm512_setr_epi32(0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28, 14, 30);
    const __m512i od = _mm512_setr_epi32(1, 17, 3, 19, 5, 21, 7, 23, 9, 25, 11, 27, 13, 29, 15, 31);
    int t = 0;
    for (; t + 4 <= nt; t += 4) {
        /* lane 2l + j: v_l of token t + j (resp. t + 2 + j) */
        const __m512 v01 = _mm512_add_ps(_mm512_permutex2var_ps(Z[t], ev, Z[t + 1]), _mm512_permutex2var_ps(Z[t], od, Z[t + 1]));
        const __m512 v23 = _mm512_add_ps(_mm512_permutex2var_ps(Z[t + 2], ev, Z[t + 3]), _mm512_permutex2var_ps(Z[t + 2], od, Z[t + 3]));
        /* v_l + v_l+4, l < 4: tokens t, t + 1 in the low 256 bits, t + 2, t + 3 in the high */
        const __m512 s = _mm512_add_ps(_mm512_shuffle_f32x4(v01, v23, 0x44), _mm512_shuffle_f32x4(v01, v23, 0xee));
        /* + the same of l + 2: 128-bit lane 0 tokens t, t + 1, lane 1 tokens t + 2, t + 3 */
        const __m256 r = _mm512_castps512_ps256(_mm512_add_ps(_mm512_shuffle_f32x4(s, s, 0x88), _mm512_shuffle_f32x4(s, s, 0xdd)));
        const __m256 f = _mm256_add_ps(r, _mm256_permute_ps(r, 0x4e)); /* (l = 0) + (l = 1): elements 0, 1, 4, 5 */
        float out[8];
        _mm256_storeu_ps(out, f);
        y[(size_t)t * ys] = out[0], y[(size_t)(t + 1) * ys] = out[1];
        y[(size_t)(t + 2) * ys] = out[4], y[(size_t)(t + 3) * ys] = out[5];
    }
    const __m512i evens = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 0, 2, 4, 6, 8, 10, 12, 14);
    for (; t < nt; t++) {
        const __m512 ab = _mm512_add_ps(Z[t], _mm512_permute_ps(Z[t], 0xb1));
        y[(size_t)t * ys] = hsum8(_mm512_castps512_ps256(_mm512_permutexvar_ps(evens, ab)));
    }
}

/* Q4_0 blocks b and b + 1 (their nibbles at q and q + 18) as signed values
 * in FE_Q8_KIND_32Z's order: one dword permute puts dword l of both blocks'
 * bytes side by side (twice), the high 256 bits take the high nibbles (values
 * 16-31: lanes 4-7), then & 15 and - 8 (a permute, a shift, an AND and a
 * subtraction a pair instead of two nibble splits and a permute). */
INL __m512i q4_0_pair(const uint8_t *q) {
    const __m512i pick = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 0, 16, 1, 17, 2, 18, 3, 19);
    __m512i W = _mm512_permutex2var_epi32(_mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)q)), pick,
                                          _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)(q + 18))));
    W = _mm512_mask_srli_epi16(W, (__mmask32)0xffff0000u, W, 4);
    return _mm512_sub_epi8(_mm512_and_si512(W, _mm512_set1_epi8(15)), _mm512_set1_epi8(8));
}

/* Token t's bytes in a 32Z tile of nt tokens at xq (kernels_q8.h, fe_q8_z_block): block b (even: the pair
 * b, b + 1, 64 bytes a token; the last odd block, 32) and its d and s (fe_q8_stride's record's tail). With nt
 * a constant, every token's load is one pointer plus a constant. */
#define ZX(t, b, bytes) (xq + (size_t)(b) * 32 * (size_t)nt + (size_t)(bytes) * (size_t)(t))
#define ZD(t) ((const float *)(xq + (size_t)nt * (size_t)cols + (size_t)(t) * (st - (size_t)cols)))

INL void tile32z(const uint8_t *row, int cols, const uint8_t *xq, size_t st, float *y, size_t ys, const int nt,
                 const int four) {
    const int nb = cols / 32, bb = four ? 18 : 34;
    const __m512i pairs = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
    const __m512i c80 = _mm512_set1_epi8((char)0x80);
    __m512 Z[TILE];
    for (int t = 0; t < nt; t++) Z[t] = _mm512_setzero_ps();
    for (int b0 = 0; b0 < nb; b0 += 16) {
        const int m = nb - b0 < 16 ? nb - b0 : 16;
        const __mmask16 k = (__mmask16)((1u << m) - 1);
        float D[16], sc[TILE][16];
        if (!four)
            for (int i = 0; i < m; i++) D[i] = f16_1(row + bb * (size_t)(b0 + i));
        const __m512 Dv = four ? q4_0_scales16(row + bb * (size_t)b0, m) : _mm512_maskz_loadu_ps(k, D);
        for (int t = 0; t < nt; t++) /* the reference's D_b * d_b, 16 at a time */
            _mm512_storeu_ps(sc[t], _mm512_mul_ps(Dv, _mm512_maskz_loadu_ps(k, ZD(t) + b0)));
        int i = 0;
        for (; i + 2 <= m; i += 2) {
            const int b = b0 + i;
            const __m512i w = four ? q4_0_pair(row + 18 * (size_t)b + 2)
                                   : _mm512_permutex2var_epi32(_mm512_castsi256_si512(w32(row, b, 0)), pairs,
                                                               _mm512_castsi256_si512(w32(row, b + 1, 0)));
            /* -128 * (the lane's 4 weights summed): (x + 128) . w - 128 * sum w = x . w */
            const __m512i init = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_dpbusd_epi32(_mm512_setzero_si512(), c80, w));
            for (int t = 0; t < nt; t++) {
                const __m512i p = _mm512_dpbusd_epi32(init, ld512(ZX(t, b, 64)), w);
                double s2;
                memcpy(&s2, &sc[t][i], sizeof s2); /* D_b d_b and D_b+1 d_b+1, alternating */
                Z[t] = _mm512_fmadd_ps(_mm512_castpd_ps(_mm512_set1_pd(s2)), _mm512_cvtepi32_ps(p), Z[t]);
            }
        }
        if (i < m) { /* the row's last block, even, alone */
            const int b = b0 + i;
            const __m256i w = w32(row, b, four);
            const __m256i init = _mm256_sub_epi32(_mm256_setzero_si256(),
                                                  _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_set1_epi8((char)0x80), w));
            for (int t = 0; t < nt; t++) {
                const __m256i p = _mm256_dpbusd_epi32(init, ld(ZX(t, b, 32)), w);
                Z[t] = _mm512_mask3_fmadd_ps(_mm512_set1_ps(sc[t][i]), _mm512_cvtepi32_ps(_mm512_cvtepu32_epi64(p)), Z[t],
                                             (__mmask16)0x5555);
            }
        }
    }
    sums32z(Z, y, ys, nt);
}

#define R4_TOKENS 3
/* vgf2p8affineqb's matrices for x >> 4 and x & 15 in every byte: output bit i (i < 4) is input bit i + 4
 * (or i), row i in byte 7 - i */
#define HI_NIBBLE 0x1020408000000000LL
#define LO_NIBBLE 0x0102040800000000LL

/* Q4_1's block b0 + j of four rows (row i at row + i rb) for nt tokens
 * (q4_1_tile_r4): a zmm holds the four rows' block, one row per 128-bit
 * lane: W = the rows' 16 nibble bytes, W & 15 = values 0-15 (the
 * reference's lanes 0-3) and W >> 4 = values 16-31 (lanes 4-7), each
 * multiplied by the token's 16 matching activations broadcast to all four
 * lanes (vpdpbusd, the nibbles unsigned as stored: p = sum w x exactly).
 * S[t] holds D_b d_b of block b0 + j' and row i at element 4j' + i; lanes of
 * even and odd blocks go to separate accumulators (acc[b % 2]), so every
 * lane takes the reference's multiply-adds in its order; and the minimum's
 * chain mn[t][b % 2] = fma(M_b, s_b, .) runs in every element of row i's
 * lane, M_b at element 4j' + i of M, s_b the token's float at byte so + 4b. */
INL void r4_nib(const uint8_t *row, size_t rb, size_t so, const uint8_t *xq, size_t st, int b0, const int j, const int nt,
                const __m512 S[R4_TOKENS], const __m512 M, __m512 lo[R4_TOKENS][2], __m512 hi[R4_TOKENS][2],
                __m512 mn[R4_TOKENS][2]) {
    const size_t b = (size_t)b0 + (size_t)j;
    const __m512i m15 = _mm512_set1_epi8(15);
    const __m512i pick = _mm512_setr_epi32(4 * j, 4 * j, 4 * j, 4 * j, 4 * j + 1, 4 * j + 1, 4 * j + 1, 4 * j + 1,
                                           4 * j + 2, 4 * j + 2, 4 * j + 2, 4 * j + 2, 4 * j + 3, 4 * j + 3, 4 * j + 3,
                                           4 * j + 3);
    const uint8_t *q = row + 20 * b + 4;
    const __m512i W = _mm512_inserti32x4(
        _mm512_inserti32x4(_mm512_inserti32x4(_mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)q)),
                                              _mm_loadu_si128((const __m128i *)(q + rb)), 1),
                           _mm_loadu_si128((const __m128i *)(q + 2 * rb)), 2),
        _mm_loadu_si128((const __m128i *)(q + 3 * rb)), 3);
    const __m512i wl = _mm512_and_si512(W, m15);
    const __m512i wh = _mm512_and_si512(_mm512_srli_epi16(W, 4), m15);
    const __m512 mj = _mm512_permutexvar_ps(pick, M);
    for (int t = 0; t < nt; t++) {
        const __m512i xl = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(QX(t) + 32 * b)));
        const __m512i xh = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(QX(t) + 32 * b + 16)));
        const __m512 sc = _mm512_permutexvar_ps(pick, S[t]);
        lo[t][j & 1] = _mm512_fmadd_ps(sc, _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(_mm512_setzero_si512(), wl, xl)), lo[t][j & 1]);
        hi[t][j & 1] = _mm512_fmadd_ps(sc, _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(_mm512_setzero_si512(), wh, xh)), hi[t][j & 1]);
        mn[t][j & 1] = _mm512_fmadd_ps(mj, _mm512_set1_ps(((const float *)CX(t))[b]), mn[t][j & 1]);
    }
}

/* Q8_0 and Q4_0 over 1-3 tokens, four rows a call (the table's rowdot4).
 * A zmm holds one row's blocks b (low 256 bits: the reference's even
 * accumulator acc[0]) and b + 1 (high: acc[1]); the 16 scales D_b of a row's
 * next 16 blocks come in one gather, D_b * d_b one product each, spread per
 * pair by one vpermps; each row runs its 16 blocks before the next row's
 * (four independent multiply-add chains), and a last odd block (even:
 * acc[0]) adds to the low 8 lanes only. The end is the reference's: acc[0]
 * + acc[1] lane by lane (the two halves), then hsum8.
 *  - Q8_0 (FE_Q8_KIND_32 activations, signed): the signed weights go to
 *    vpdpbusd as |w| (unsigned; |-128| = 128) against x with w's sign (x is
 *    never -128: the quantizer's range), so each lane's p is the reference's
 *    exact sum. (The AVX2 set's one-row kernel, used at 1-3 tokens before,
 *    ran a row's blocks as one chain.)
 *  - Q4_0 (FE_Q8_KIND_32S): each block's 16 nibble bytes twice, the low
 *    nibbles (values 0-15, the reference's lanes 0-3) taken from the first
 *    copy and the high ones (16-31, lanes 4-7) from the second: one
 *    vgf2p8affineqb with a matrix per 64-bit lane (without GFNI a per-word
 *    shift and a mask); against the pair's 64 activation bytes as stored,
 *    vpdpbusd (nibbles unsigned, each lane started at -8 times its 4
 *    activations' sum, from the quantizer) gives the reference's p = sum
 *    (w - 8) x. The four rows are read 288 bytes at a time: the kernel before
 *    this one (a zmm of the four rows' block b, a row per 128-bit lane) read
 *    four 18-line streams 16 bytes at a time, 1.1x slower from L2 and 1.25x
 *    from L3 on one thread of the Xeon VM (docs/bench-log/2026-12-07.md).
 *
 * The prefetch (rowdot4_prefetch: Q4_0 and Q8_0): as it reads row i's 16
 * blocks, the same bytes R4_PF_L1 calls on into L1 and R4_PF_L2 calls on
 * into L2, a few lines at a time between the loads. Before each call, all of
 * the next calls' bytes at once (ops.c's prefetch_past) stalled on the
 * core's fill buffers (most of the decode's samples on prefetch
 * instructions): the spread prefetch read Q4_0 1.1x as fast from DRAM and
 * 1.15x from L3 (the same log), Q8_0 1.16-1.28x and 1.13-1.52x (session 22). */
#ifndef R4_PF_L1
#define R4_PF_L1 1
#endif
#ifndef R4_PF_L2
#define R4_PF_L2 4
#endif
static const int32_t PAIR_IDX[8][16] __attribute__((aligned(64))) = {
    {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1},         {2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3},
    {4, 4, 4, 4, 4, 4, 4, 4, 5, 5, 5, 5, 5, 5, 5, 5},         {6, 6, 6, 6, 6, 6, 6, 6, 7, 7, 7, 7, 7, 7, 7, 7},
    {8, 8, 8, 8, 8, 8, 8, 8, 9, 9, 9, 9, 9, 9, 9, 9},         {10, 10, 10, 10, 10, 10, 10, 10, 11, 11, 11, 11, 11, 11, 11, 11},
    {12, 12, 12, 12, 12, 12, 12, 12, 13, 13, 13, 13, 13, 13, 13, 13}, {14, 14, 14, 14, 14, 14, 14, 14, 15, 15, 15, 15, 15, 15, 15, 15}};
/* Q4_0's per-word shifts: 0 for a pair's low nibbles (words 0-7, 16-23), 4 for its high ones */
#define NIB_SHIFTS _mm512_set_epi64(0x0004000400040004LL, 0x0004000400040004LL, 0, 0, 0x0004000400040004LL, \
                                    0x0004000400040004LL, 0, 0)

/* A row's blocks j, j + 1 of its 16-block chunk at r (block j is the row's
 * b) into acc[t] for nt tokens: Q4_0 (q4) or Q8_0. */
INL void r4_pair(const uint8_t *r, const int j, size_t b, const uint8_t *xq, size_t st, size_t so, const int nt,
                 const __m512 S[R4_TOKENS], __m512 *acc, const int q4, const int gfni) {
    const __m512i pj = _mm512_load_si512(PAIR_IDX[j / 2]);
    if (q4) {
        const uint8_t *q = r + 18 * (size_t)j + 2;
        const __m512i W = _mm512_mask_broadcast_i32x4(_mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)q)),
                                                      (__mmask16)0xff00, _mm_loadu_si128((const __m128i *)(q + 18)));
        __m512i w;
        if (gfni)
            __asm__("vgf2p8affineqb $0, %[a], %[w], %[h]"
                    : [h] "=v"(w)
                    : [w] "v"(W), [a] "v"(_mm512_set_epi64(HI_NIBBLE, HI_NIBBLE, LO_NIBBLE, LO_NIBBLE, HI_NIBBLE,
                                                            HI_NIBBLE, LO_NIBBLE, LO_NIBBLE)));
        else
            w = _mm512_and_si512(_mm512_srlv_epi16(W, NIB_SHIFTS), _mm512_set1_epi8(15));
        for (int t = 0; t < nt; t++) {
            const __m512i p = _mm512_dpbusd_epi32(ld512(CX(t) + 8 * b), w, ld512(QX(t) + 32 * b));
            acc[t] = _mm512_fmadd_ps(_mm512_permutexvar_ps(pj, S[t]), _mm512_cvtepi32_ps(p), acc[t]);
        }
        return;
    }
    const uint8_t *q = r + 34 * (size_t)j + 2;
    const __m512i w = _mm512_inserti64x4(_mm512_castsi256_si512(ld(q)), ld(q + 34), 1);
    const __m512i u = _mm512_abs_epi8(w);
    const __mmask64 neg = _mm512_movepi8_mask(w);
    for (int t = 0; t < nt; t++) {
        const __m512i x = ld512(QX(t) + 32 * b);
        const __m512i p = _mm512_dpbusd_epi32(_mm512_setzero_si512(), u, _mm512_mask_sub_epi8(x, neg, _mm512_setzero_si512(), x));
        acc[t] = _mm512_fmadd_ps(_mm512_permutexvar_ps(pj, S[t]), _mm512_cvtepi32_ps(p), acc[t]);
    }
}
/* A row's last block j of its chunk (b; even: acc[0], the low 8 lanes) alone. */
INL void r4_last(const uint8_t *r, const int j, size_t b, const uint8_t *xq, size_t st, size_t so, const int nt,
                 const __m512 S[R4_TOKENS], __m512 *acc, const int q4) {
    __m256i w, u = _mm256_setzero_si256();
    __mmask32 neg = 0;
    if (q4)
        w = _mm256_and_si256(_mm256_srlv_epi16(_mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(r + 18 * (size_t)j + 2))),
                                               _mm512_castsi512_si256(NIB_SHIFTS)),
                             _mm256_set1_epi8(15));
    else
        w = ld(r + 34 * (size_t)j + 2), u = _mm256_abs_epi8(w), neg = _mm256_movepi8_mask(w);
    for (int t = 0; t < nt; t++) {
        const __m256i x = ld(QX(t) + 32 * b);
        const __m256i p = q4 ? _mm256_dpbusd_epi32(ld(CX(t) + 8 * b), w, x)
                             : _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, _mm256_mask_sub_epi8(x, neg, _mm256_setzero_si256(), x));
        acc[t] = _mm512_mask3_fmadd_ps(_mm512_permutexvar_ps(_mm512_set1_epi32(j), S[t]),
                                       _mm512_cvtepi32_ps(_mm512_castsi256_si512(p)), acc[t], (__mmask16)0x00ff);
    }
}
INL void tile_r4_pairs(const uint8_t *row, size_t rb, int cols, const uint8_t *xq, size_t st, float *y, size_t ys,
                       const int nt, const uint8_t *pf_end, const int q4, const int gfni) {
    const int nb = cols / 32, bs = q4 ? 18 : 34;
    const size_t so = q4 ? fe_q8_sums_offset(cols) : 0;
    const __m512i gidx = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                            _mm512_set1_epi32(bs));
    __m512 acc[4][R4_TOKENS];
    for (int i = 0; i < 4; i++)
        for (int t = 0; t < nt; t++) acc[i][t] = _mm512_setzero_ps();
    for (int b0 = 0; b0 < nb; b0 += 16) {
        const int m = nb - b0 < 16 ? nb - b0 : 16;
        const __mmask16 k = (__mmask16)((1u << m) - 1);
        __m512 X[R4_TOKENS];
        for (int t = 0; t < nt; t++) X[t] = _mm512_maskz_loadu_ps(k, DX(t) + b0);
#pragma GCC unroll 4
        for (int i = 0; i < 4; i++) {
            const uint8_t *r = row + (size_t)i * rb + (size_t)bs * (size_t)b0;
            if (pf_end) /* the same bytes R4_PF_L1 and R4_PF_L2 calls on (speed only) */
                for (int c = 0; c < bs * m; c += 64) {
                    const uint8_t *a = r + R4_PF_L1 * 4 * rb + c, *a2 = r + R4_PF_L2 * 4 * rb + c;
                    if (a < pf_end) __builtin_prefetch(a, 0, 3);
                    if (a2 < pf_end) __builtin_prefetch(a2, 0, 1);
                }
            const __m512 D = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(
                _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), k, gidx, r, 1)));
            __m512 S[R4_TOKENS]; /* the reference's D_b * d_b, element j for block b0 + j */
            for (int t = 0; t < nt; t++) S[t] = _mm512_mul_ps(D, X[t]);
            int j = 0;
            if (m == 16) { /* each pair's index vector a constant */
#pragma GCC unroll 8
                for (; j < 16; j += 2) r4_pair(r, j, (size_t)(b0 + j), xq, st, so, nt, S, acc[i], q4, gfni);
            } else
                for (; j + 2 <= m; j += 2) r4_pair(r, j, (size_t)(b0 + j), xq, st, so, nt, S, acc[i], q4, gfni);
            if (j < m) r4_last(r, j, (size_t)(b0 + j), xq, st, so, nt, S, acc[i], q4);
        }
    }
    for (int t = 0; t < nt; t++)
        for (int i = 0; i < 4; i++)
            y[(size_t)t * ys + (size_t)i] = hsum8(_mm256_add_ps(_mm512_castps512_ps256(acc[i][t]),
                                                                _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc[i][t]), 1))));
}

/* Q4_1 over 1-3 tokens, four rows at a time (rowdot4), on FE_Q8_KIND_32:
 * a block of the four rows a zmm (r4_nib), the nibbles unsigned as stored
 * (the lanes start at 0: p = sum w x exactly), and the minimum's term, the
 * reference's scalar chain m1[b % 2] = fma(M_b, s_b, m1[b % 2]) (s_b = d_b *
 * sum q, the record's), run for the four rows at once, one per 128-bit lane.
 * A block's d and m are its first 4 bytes, so one 64-byte load per row holds
 * both for 4 blocks (bytes 20j..20j+3), and two word permutes put row i's d
 * of block j at word 4j + i and its m at word 16 + 4j + i. The result is the
 * reference's: h(acc[0] + acc[1]) + (m1[0] + m1[1]). The one-row kernel (a
 * thread's last 1-3 rows, and 4 tokens or more) stays AVX2's: its minimum is
 * the same chain, one row at a time, which was this file's weak point. */
INL void q4_1_tile_r4(const uint8_t *row, size_t rb, int cols, const uint8_t *xq, size_t st, float *y, size_t ys,
                      const int nt) {
    const int nb = cols / 32;
    const size_t so = (size_t)cols + 4 * (size_t)nb; /* the record's s[] (kernels_q8.h) */
    /* words 4j + i (d) and 16 + 4j + i (m) of rows 0, 1 from (R0, R1) and of rows 2, 3 from (R2, R3) */
    static const uint16_t I01[32] = {0, 32, 0, 0, 10, 42, 0, 0, 20, 52, 0, 0, 30, 62, 0, 0,
                                     1, 33, 0, 0, 11, 43, 0, 0, 21, 53, 0, 0, 31, 63, 0, 0};
    static const uint16_t I23[32] = {0, 0, 0, 32, 0, 0, 10, 42, 0, 0, 20, 52, 0, 0, 30, 62,
                                     0, 0, 1, 33, 0, 0, 11, 43, 0, 0, 21, 53, 0, 0, 31, 63};
    const __m512i w01 = _mm512_loadu_si512(I01), w23 = _mm512_loadu_si512(I23);
    const __m512i rep4 = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    __m512 lo[R4_TOKENS][2], hi[R4_TOKENS][2], mn[R4_TOKENS][2];
    for (int t = 0; t < nt; t++) lo[t][0] = lo[t][1] = hi[t][0] = hi[t][1] = mn[t][0] = mn[t][1] = _mm512_setzero_ps();
    for (int b0 = 0; b0 < nb; b0 += 4) {
        const int m = nb - b0 < 4 ? nb - b0 : 4;
        /* the 4 rows' next 64 bytes (at most 20m: masked, no read past the matrix) */
        const __mmask64 lm = m == 4 ? ~(__mmask64)0 : ((__mmask64)1 << (20 * m)) - 1;
        const uint8_t *p = row + 20 * (size_t)b0;
        const __m512i A = _mm512_permutex2var_epi16(_mm512_maskz_loadu_epi8(lm, p), w01, _mm512_maskz_loadu_epi8(lm, p + rb));
        const __m512i B = _mm512_permutex2var_epi16(_mm512_maskz_loadu_epi8(lm, p + 2 * rb), w23,
                                                    _mm512_maskz_loadu_epi8(lm, p + 3 * rb));
        const __m512i DM = _mm512_mask_mov_epi16(A, (__mmask32)0xccccccccu, B);
        const __m512 D = _mm512_cvtph_ps(_mm512_castsi512_si256(DM));
        const __m512 M = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(DM, 1));
        __m512 S[R4_TOKENS]; /* the reference's D_b * d_b, element 4j + i */
        for (int t = 0; t < nt; t++)
            S[t] = _mm512_mul_ps(D, _mm512_permutexvar_ps(rep4, _mm512_castps128_ps512(_mm_maskz_loadu_ps(
                                                                    (__mmask8)((1u << m) - 1), DX(t) + b0))));
        r4_nib(row, rb, so, xq, st, b0, 0, nt, S, M, lo, hi, mn);
        if (m > 1) r4_nib(row, rb, so, xq, st, b0, 1, nt, S, M, lo, hi, mn);
        if (m > 2) r4_nib(row, rb, so, xq, st, b0, 2, nt, S, M, lo, hi, mn);
        if (m > 3) r4_nib(row, rb, so, xq, st, b0, 3, nt, S, M, lo, hi, mn);
    }
    for (int t = 0; t < nt; t++) { /* per row (128-bit lane): h(acc[0] + acc[1]) as Q4_0's, then + (m1[0] + m1[1]) */
        const __m512 T = _mm512_add_ps(_mm512_add_ps(lo[t][0], lo[t][1]), _mm512_add_ps(hi[t][0], hi[t][1]));
        const __m512 U = _mm512_add_ps(T, _mm512_permute_ps(T, 0x4e));
        const __m512 V = _mm512_add_ps(_mm512_add_ps(U, _mm512_permute_ps(U, 0xb1)), _mm512_add_ps(mn[t][0], mn[t][1]));
        float out[16];
        _mm512_storeu_ps(out, V);
        for (int i = 0; i < 4; i++) y[(size_t)t * ys + (size_t)i] = out[4 * i];
    }
}

/* the tiles the drivers below call by format name */
#define q8_0_ztile(...) tile32z(__VA_ARGS__, 0)
#define q4_0_ztile(...) tile32z(__VA_ARGS__, 1)

/* ------------------------------------------------------------ K-quants */

/* Lane i of a pair's scale vector takes int32 element lo + i / 8 * (hi - lo)
 * ... as an index vector: elements e0 (lanes 0-7) and e1 (lanes 8-15). */
INL __m512i pair_idx(int e0, int e1) {
    return _mm512_inserti64x4(_mm512_set1_epi32(e0), _mm256_set1_epi32(e1), 1);
}

/* A token's super-block into acc: the reference's two multiply-adds, with
 * the minimums' lanes m_l * (bs[2l] + bs[2l+1]) from md (m_k twice, int16). */
INL __m256 k45_fold(__m256 acc, __m256i P8, __m256i md, const int16_t *bs, float d, float dmin, float dx) {
    const __m256i M = _mm256_madd_epi16(md, ld(bs));
    acc = _mm256_fmadd_ps(_mm256_set1_ps(d * dx), _mm256_cvtepi32_ps(P8), acc);
    return _mm256_fnmadd_ps(_mm256_set1_ps(dmin * dx), _mm256_cvtepi32_ps(M), acc);
}

/* Super-block sb of a Q4_K/Q5_K row: its address; d, dmin; the scales
 * and minimums as bytes sm[0..7], sm[8..15]; md = m_k twice, as int16. */
INL const uint8_t *k45_head(const uint8_t *row, int sb, const int five, float *d, float *dmin, uint8_t sm[16],
                            __m256i *md) {
    const uint8_t *p = row + (five ? 176 : 144) * (size_t)sb;
    *d = f16_1(p), *dmin = f16_1(p + 2);
    fe_q8_k4_scales(p + 4, sm);
    const __m128i smv = _mm_loadu_si128((const __m128i *)sm);
    *md = _mm256_cvtepu8_epi16(_mm_unpackhi_epi8(smv, smv));
    return p;
}

/* Q4_K, and Q5_K (five = 1: the fifth bit of value 32k + l is bit k of qh[l]). */
INL void k45_tile(const uint8_t *row, int cols, const uint8_t *xq, size_t st, float *y, size_t ys, const int nt,
                  const int five) {
    const int nsb = cols / 256;
    const __m512i m15 = _mm512_set1_epi8(15), sixteen = _mm512_set1_epi8(16);
    __m256 acc[TILE];
    for (int t = 0; t < nt; t++) acc[t] = _mm256_setzero_ps();
    for (int sb = 0; sb < nsb; sb++) {
        float d, dmin;
        uint8_t sm[16];
        __m256i md;
        const uint8_t *p = k45_head(row, sb, five, &d, &dmin, sm, &md);
        const __m512i s32 = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)sm)); /* sc, m as int32 */
        __m512i P[TILE];
        for (int t = 0; t < nt; t++) P[t] = _mm512_setzero_si512();
        const __m512i hb = five ? ld2x(p + 16) : _mm512_setzero_si512();
        for (int k = 0; k < 8; k += 2) {
            /* sub-block k: low nibbles of the 32 bytes; k + 1: their high nibbles */
            const __m512i qb = ld2x(p + (five ? 48 : 16) + 16 * k);
            __m512i w = _mm512_and_si512(_mm512_mask_srli_epi16(qb, (__mmask32)0xffff0000u, qb, 4), m15);
            if (five) {
                const __m512i bit = _mm512_inserti64x4(_mm512_set1_epi8((char)(1 << k)),
                                                       _mm256_set1_epi8((char)(2 << k)), 1);
                w = _mm512_mask_add_epi8(w, _mm512_test_epi8_mask(hb, bit), w, sixteen);
            }
            const __m512i s = _mm512_permutexvar_epi32(pair_idx(k, k + 1), s32);
            const size_t off = 256 * (size_t)sb + 32 * (size_t)k;
            for (int t = 0; t < nt; t++) P[t] = dp(P[t], w, ld512(QX(t) + off), s);
        }
        for (int t = 0; t < nt; t++)
            acc[t] = k45_fold(acc[t], _mm256_add_epi32(_mm512_castsi512_si256(P[t]), _mm512_extracti64x4_epi64(P[t], 1)),
                              md, BS(t) + 16 * (size_t)sb, d, dmin, DX(t)[sb]);
    }
    for (int t = 0; t < nt; t++) y[(size_t)t * ys] = hsum8(acc[t]);
}

/* The same with one 32-value sub-block per ymm: the scale in every lane
 * (vpdpwssd with (S, 0) pairs), no permutes and no half-sums. Faster than
 * the zmm version above from 2 tokens up on Zen 4, which runs a zmm
 * instruction as two halves (docs/bench-log/2026-12-04.md, section "vnni"); slower on
 * CPUs with full-width zmm (Intel Xeon, 2026-12-05: the zmm tile 1.05-1.15x
 * at 8 and 64 tokens), which is what the drivers below use now. Kept for
 * Zen 4 measurements (FE_Q8_K_YMM_TILES=1 at build time). */
INL void k45_tile_y(const uint8_t *row, int cols, const uint8_t *xq, size_t st, float *y, size_t ys, const int nt,
                    const int five) {
    const int nsb = cols / 256;
    const __m256i m15 = _mm256_set1_epi8(15), sixteen = _mm256_set1_epi8(16);
    __m256 acc[TILE];
    for (int t = 0; t < nt; t++) acc[t] = _mm256_setzero_ps();
    for (int sb = 0; sb < nsb; sb++) {
        float d, dmin;
        uint8_t sm[16];
        __m256i md;
        const uint8_t *p = k45_head(row, sb, five, &d, &dmin, sm, &md);
        __m256i P[TILE];
        for (int t = 0; t < nt; t++) P[t] = _mm256_setzero_si256();
        const __m256i hb = five ? ld(p + 16) : _mm256_setzero_si256();
        for (int k = 0; k < 8; k += 2) {
            const __m256i qq = ld(p + (five ? 48 : 16) + 16 * k);
            __m256i w0 = _mm256_and_si256(qq, m15), w1 = _mm256_and_si256(_mm256_srli_epi16(qq, 4), m15);
            if (five) {
                w0 = _mm256_mask_add_epi8(w0, _mm256_test_epi8_mask(hb, _mm256_set1_epi8((char)(1 << k))), w0, sixteen);
                w1 = _mm256_mask_add_epi8(w1, _mm256_test_epi8_mask(hb, _mm256_set1_epi8((char)(2 << k))), w1, sixteen);
            }
            const __m256i s0 = _mm256_set1_epi32(sm[k]), s1 = _mm256_set1_epi32(sm[k + 1]);
            const size_t off = 256 * (size_t)sb + 32 * (size_t)k;
            for (int t = 0; t < nt; t++) {
                const __m256i a = _mm256_dpbusd_epi32(_mm256_setzero_si256(), w0, ld(QX(t) + off));
                const __m256i b = _mm256_dpbusd_epi32(_mm256_setzero_si256(), w1, ld(QX(t) + off + 32));
                P[t] = _mm256_dpwssd_epi32(_mm256_dpwssd_epi32(P[t], a, s0), b, s1);
            }
        }
        for (int t = 0; t < nt; t++) acc[t] = k45_fold(acc[t], P[t], md, BS(t) + 16 * (size_t)sb, d, dmin, DX(t)[sb]);
    }
    for (int t = 0; t < nt; t++) y[(size_t)t * ys] = hsum8(acc[t]);
}

/* nt is a constant in every call: the choice folds away */
#if FE_Q8_K_YMM_TILES
#define q4_k_tile(r, c, x, s, y, ys, nt) \
    ((nt) == 1 ? k45_tile(r, c, x, s, y, ys, nt, 0) : k45_tile_y(r, c, x, s, y, ys, nt, 0))
#define q5_k_tile(r, c, x, s, y, ys, nt) \
    ((nt) == 1 ? k45_tile(r, c, x, s, y, ys, nt, 1) : k45_tile_y(r, c, x, s, y, ys, nt, 1))
#else
#define q4_k_tile(r, c, x, s, y, ys, nt) k45_tile(r, c, x, s, y, ys, nt, 0)
#define q5_k_tile(r, c, x, s, y, ys, nt) k45_tile(r, c, x, s, y, ys, nt, 1)
#endif

/* Q6_K: half h of a super-block holds ql[64] (p + 64h), qh[32] (p + 128 +
 * 32h) and sub-blocks r = 0..3: low nibbles of ql[0..31] | bits 0-1 of qh,
 * low of ql[32..63] | bits 2-3, high of ql[0..31] | bits 4-5, high of
 * ql[32..63] | bits 6-7 (the high pair shifted to bits 4-5). Pair (0, 1) is
 * one 64-byte load of ql, pair (2, 3) the same shifted. The int8 scale of
 * values 16g..16g+15 of the half is sc[8h + g]: lane i of pair (0, 1) takes
 * sc[8h + i/4], of pair (2, 3) sc[8h + 4 + i/4]. */
INL void q6_k_tile(const uint8_t *row, int cols, const uint8_t *xq, size_t st, float *y, size_t ys, const int nt) {
    const int nsb = cols / 256;
    const __m512i m15 = _mm512_set1_epi8(15), m48 = _mm512_set1_epi8(48), lo16 = _mm512_set1_epi32(0xffff);
    const __m512i sh01 = _mm512_inserti64x4(_mm512_set1_epi16(4), _mm256_set1_epi16(2), 1);
    const __m512i sh23 = _mm512_inserti64x4(_mm512_set1_epi16(0), _mm256_set1_epi16(2), 1);
    const __m512i quarter = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    __m256 acc[TILE];
    for (int t = 0; t < nt; t++) acc[t] = _mm256_setzero_ps();
    for (int sb = 0; sb < nsb; sb++) {
        const uint8_t *p = row + 210 * (size_t)sb;
        const int8_t *sc = (const int8_t *)(p + 192);
        const float d = f16_1(p + 208);
        /* the 16 scales as int32 with the upper int16 cleared: (S, 0) pairs for vpdpwssd */
        const __m512i s32 = _mm512_and_si512(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)sc)), lo16);
        __m512i P[TILE];
        for (int t = 0; t < nt; t++) P[t] = _mm512_setzero_si512();
        for (int h = 0; h < 2; h++) {
            const __m512i L = ld512(p + 64 * h), QH = ld2x(p + 128 + 32 * h);
            const __m512i w01 = _mm512_or_si512(_mm512_and_si512(L, m15),
                                                _mm512_and_si512(_mm512_sllv_epi16(QH, sh01), m48));
            const __m512i w23 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(L, 4), m15),
                                                _mm512_and_si512(_mm512_srlv_epi16(QH, sh23), m48));
            const __m512i base = _mm512_add_epi32(quarter, _mm512_set1_epi32(8 * h));
            const __m512i s01 = _mm512_permutexvar_epi32(base, s32);
            const __m512i s23 = _mm512_permutexvar_epi32(_mm512_add_epi32(base, _mm512_set1_epi32(4)), s32);
            const size_t off = 256 * (size_t)sb + 128 * (size_t)h;
            for (int t = 0; t < nt; t++) {
                P[t] = dp(P[t], w01, ld512(QX(t) + off), s01);
                P[t] = dp(P[t], w23, ld512(QX(t) + off + 64), s23);
            }
        }
        /* the offset: 32 * (sc[2l] * bs[2l] + sc[2l+1] * bs[2l+1]) in lane l */
        const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)sc));
        for (int t = 0; t < nt; t++) {
            const __m256i O = _mm256_madd_epi16(sc16, ld(BS(t) + 16 * (size_t)sb));
            __m256i P8 = _mm256_add_epi32(_mm512_castsi512_si256(P[t]), _mm512_extracti64x4_epi64(P[t], 1));
            P8 = _mm256_sub_epi32(P8, _mm256_slli_epi32(O, 5));
            acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(d * DX(t)[sb]), _mm256_cvtepi32_ps(P8), acc[t]);
        }
    }
    for (int t = 0; t < nt; t++) y[(size_t)t * ys] = hsum8(acc[t]);
}

/* Two rows at once (row and row + rb): the low 256 bits of every vector hold
 * row 0's eight lanes, the high 256 bits row 1's, so each lane takes exactly
 * the one-row tile's integer sums and float steps (the reference's), while
 * one zmm fold (convert, two multiply-adds, the minimums' madd) serves both
 * rows: the one-row tile spends about a third of its time on that fold for
 * one row in a ymm (docs/bench-log/2026-12-05.md, "what the q8 Q4_K tile
 * spends its time on"). A super-block's set-up for the pair (scales
 * unpacked, nibbles split, scale vectors permuted) goes into a k2_sb record
 * (k45_decode2, q6_decode2) that the token tiles read (k2_tokens): a zmm of
 * weights is sub-block k of both rows, the activations the token's sub-block
 * k in both halves (one broadcast load, shared by the call's row pairs).
 * Up to 8 tokens (k2_tile) a record per super-block, the accumulators in
 * registers; over more than 8 (k2_rows_long) the set-up is made once per
 * group of K2_GROUP tokens, K2_CHUNK super-blocks at a time into records in
 * L1, which the tiles of 8 tokens then read, the accumulators waiting in
 * memory between chunks (over 8 tokens or fewer that costs more than it
 * saves: 0.74-0.98x, docs/bench-log/2026-12-06.md, h8). */
#define K2_CHUNK 4
#define K2_GROUP 32
typedef struct {
    __m512i w[8], s[8], md; /* s: the scale in both int16 halves of each lane (twice16) */
    __m512 dd, dm;
} k2_sb;

/* (S, 0) int16 pairs as (S, S) */
INL __m512i twice16(__m512i s) { return _mm512_or_si512(s, _mm512_slli_epi32(s, 16)); }

/* P += S * (the 4-value sums of w . x), lane by lane, s holding S in both int16 halves: vpmaddubsw's
 * 2-value sums (at most 2 * 63 * 127, no saturation) into vpdpwssd, the same integers as dp(). */
INL __m512i dp2(__m512i P, __m512i w, __m512i x, __m512i s) {
    return _mm512_dpwssd_epi32(P, _mm512_maddubs_epi16(w, x), s);
}

/* Q4_K/Q5_K's set-up into a record: w[k] sub-block k of both rows (values 0..15, Q5_K 0..31), s[k] its
 * 6-bit scales, md the minimums m_l twice as int16 (row 0, then row 1), dd and dm each row's d and dmin. */
INL void k45_decode2(const uint8_t *p0, const uint8_t *p1, const int five, k2_sb *o) {
    const int qo = five ? 48 : 16;
    const __m512i m15 = _mm512_set1_epi8(15), sixteen = _mm512_set1_epi8(16);
    uint8_t sm0[16], sm1[16];
    fe_q8_k4_scales(p0 + 4, sm0);
    fe_q8_k4_scales(p1 + 4, sm1);
    const __m128i a = _mm_loadu_si128((const __m128i *)sm0), b = _mm_loadu_si128((const __m128i *)sm1);
    const __m512i s32 = twice16(_mm512_cvtepu8_epi32(_mm_unpacklo_epi64(a, b))); /* (S, S) int16 pairs */
    const __m128i m = _mm_unpackhi_epi64(a, b);
    o->md = _mm512_cvtepu8_epi16(_mm256_set_m128i(_mm_unpackhi_epi8(m, m), _mm_unpacklo_epi8(m, m)));
    o->dd = _mm512_mask_blend_ps((__mmask16)0xff00, _mm512_set1_ps(f16_1(p0)), _mm512_set1_ps(f16_1(p1)));
    o->dm = _mm512_mask_blend_ps((__mmask16)0xff00, _mm512_set1_ps(f16_1(p0 + 2)), _mm512_set1_ps(f16_1(p1 + 2)));
    __m512i hb = _mm512_setzero_si512();
    if (five) hb = _mm512_inserti64x4(_mm512_castsi256_si512(ld(p0 + 16)), ld(p1 + 16), 1);
    for (int k = 0; k < 8; k += 2) {
        const __m512i q = _mm512_inserti64x4(_mm512_castsi256_si512(ld(p0 + qo + 16 * k)), ld(p1 + qo + 16 * k), 1);
        __m512i w0 = _mm512_and_si512(q, m15), w1 = _mm512_and_si512(_mm512_srli_epi16(q, 4), m15);
        if (five) {
            w0 = _mm512_mask_add_epi8(w0, _mm512_test_epi8_mask(hb, _mm512_set1_epi8((char)(1 << k))), w0, sixteen);
            w1 = _mm512_mask_add_epi8(w1, _mm512_test_epi8_mask(hb, _mm512_set1_epi8((char)(2 << k))), w1, sixteen);
        }
        o->w[k] = w0, o->w[k + 1] = w1;
        o->s[k] = _mm512_permutexvar_epi32(pair_idx(k, 8 + k), s32);
        o->s[k + 1] = _mm512_permutexvar_epi32(pair_idx(k + 1, 9 + k), s32);
    }
}

/* Q6_K's set-up into a record (half h of a super-block as q6_k_tile's comment
 * says, row 0 in the low 256 bits, row 1 in the high): w[4h + r] sub-block r of
 * half h, lane i taking the int8 scale sc[8h + 2r + (i % 8) / 4] of its row in
 * s, md the 16 int8 scales of both rows as int16, dd the d of each row. */
INL void q6_decode2(const uint8_t *p0, const uint8_t *p1, k2_sb *o) {
    const __m512i m15 = _mm512_set1_epi8(15), m48 = _mm512_set1_epi8(48), lo16 = _mm512_set1_epi32(0xffff);
    const __m512i quarter = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 16, 16, 16, 16, 17, 17, 17, 17);
    const __m128i c0 = _mm_loadu_si128((const __m128i *)(p0 + 192)), c1 = _mm_loadu_si128((const __m128i *)(p1 + 192));
    const __m512i s0 = twice16(_mm512_and_si512(_mm512_cvtepi8_epi32(c0), lo16)),
                  s1 = twice16(_mm512_and_si512(_mm512_cvtepi8_epi32(c1), lo16));
    o->dd = _mm512_mask_blend_ps((__mmask16)0xff00, _mm512_set1_ps(f16_1(p0 + 208)), _mm512_set1_ps(f16_1(p1 + 208)));
    o->dm = _mm512_setzero_ps();
    o->md = _mm512_cvtepi8_epi16(_mm256_set_m128i(c1, c0));
    for (int h = 0; h < 2; h++) {
        const __m512i A = _mm512_inserti64x4(_mm512_castsi256_si512(ld(p0 + 64 * h)), ld(p1 + 64 * h), 1);
        const __m512i B = _mm512_inserti64x4(_mm512_castsi256_si512(ld(p0 + 64 * h + 32)), ld(p1 + 64 * h + 32), 1);
        const __m512i QH = _mm512_inserti64x4(_mm512_castsi256_si512(ld(p0 + 128 + 32 * h)), ld(p1 + 128 + 32 * h), 1);
        o->w[4 * h] = _mm512_or_si512(_mm512_and_si512(A, m15), _mm512_and_si512(_mm512_slli_epi16(QH, 4), m48));
        o->w[4 * h + 1] = _mm512_or_si512(_mm512_and_si512(B, m15), _mm512_and_si512(_mm512_slli_epi16(QH, 2), m48));
        o->w[4 * h + 2] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(A, 4), m15), _mm512_and_si512(QH, m48));
        o->w[4 * h + 3] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(B, 4), m15),
                                          _mm512_and_si512(_mm512_srli_epi16(QH, 2), m48));
        for (int r = 0; r < 4; r++)
            o->s[4 * h + r] = _mm512_permutex2var_epi32(s0, _mm512_add_epi32(quarter, _mm512_set1_epi32(8 * h + 2 * r)), s1);
    }
}

/* nt tokens over the decoded super-blocks of np row pairs (c[K2_CHUNK * q + j]: pair q's super-block sb0 + j,
 * j < nc), their accumulators in a[K2_GROUP * q + t]; six: Q6_K's fold (md its int16 scales), else
 * Q4_K/Q5_K's. Sub-block k is values 32k..32k + 31. Each activation load serves the np pairs. */
INL void k2_tokens(const k2_sb *c, int sb0, int nc, int cols, const uint8_t *xq, size_t st, __m512 *a, const int nt,
                   const int six, const int np) {
    const int nsb = cols / 256;
    for (int j = 0; j < nc; j++) {
        const int sb = sb0 + j;
        __m512i P[2][8];
        for (int q = 0; q < np; q++)
            for (int t = 0; t < nt; t++) P[q][t] = _mm512_setzero_si512();
        for (int k = 0; k < 8; k++) {
            const size_t off = 256 * (size_t)sb + 32 * (size_t)k;
            for (int t = 0; t < nt; t++) {
                const __m512i x = ld2x(QX(t) + off);
                for (int q = 0; q < np; q++)
                    P[q][t] = dp2(P[q][t], _mm512_load_si512(&c[K2_CHUNK * q + j].w[k]), x,
                                 _mm512_load_si512(&c[K2_CHUNK * q + j].s[k]));
            }
        }
        for (int t = 0; t < nt; t++) {
            const __m512 dx = _mm512_set1_ps(DX(t)[sb]);
            const __m512i bs = ld2x(BS(t) + 16 * (size_t)sb);
            for (int q = 0; q < np; q++) {
                const k2_sb *d = c + K2_CHUNK * q + j;
                __m512 acc = _mm512_load_ps((const float *)&a[K2_GROUP * q + t]);
                const __m512i M = _mm512_madd_epi16(d->md, bs);
                if (six) { /* Q6_K's offset 32 * (sc[2l] * bs[2l] + sc[2l+1] * bs[2l+1]), one multiply-add */
                    const __m512i P8 = _mm512_sub_epi32(P[q][t], _mm512_slli_epi32(M, 5));
                    acc = _mm512_fmadd_ps(_mm512_mul_ps(d->dd, dx), _mm512_cvtepi32_ps(P8), acc);
                } else {
                    acc = _mm512_fmadd_ps(_mm512_mul_ps(d->dd, dx), _mm512_cvtepi32_ps(P[q][t]), acc);
                    acc = _mm512_fnmadd_ps(_mm512_mul_ps(d->dm, dx), _mm512_cvtepi32_ps(M), acc);
                }
                _mm512_store_ps((float *)&a[K2_GROUP * q + t], acc);
            }
        }
    }
}

/* np (1 or 2) row pairs: rows row + i * rb, i < 2 * np. fmt: 0 Q4_K, 1 Q5_K, 2 Q6_K */
INL void k2_rows_long(const uint8_t *row, size_t rb, int cols, const uint8_t *xq, int n, float *y, size_t ys,
                      const int fmt, const int np) {
    const int nsb = cols / 256, sbb = fmt == 2 ? 210 : fmt ? 176 : 144;
    const size_t st = fe_q8k_stride(cols);
    k2_sb c[2 * K2_CHUNK];
    __m512 acc[2 * K2_GROUP];
    for (int t0 = 0; t0 < n; t0 += K2_GROUP) {
        const int g = n - t0 < K2_GROUP ? n - t0 : K2_GROUP;
        const uint8_t *x0 = xq + (size_t)t0 * st;
        for (int q = 0; q < np; q++)
            for (int t = 0; t < g; t++) acc[K2_GROUP * q + t] = _mm512_setzero_ps();
        for (int sb0 = 0; sb0 < nsb; sb0 += K2_CHUNK) {
            const int nc = nsb - sb0 < K2_CHUNK ? nsb - sb0 : K2_CHUNK;
            for (int q = 0; q < np; q++)
                for (int j = 0; j < nc; j++) {
                    const uint8_t *p0 = row + 2 * rb * q + (size_t)sbb * (sb0 + j);
                    if (fmt == 2)
                        q6_decode2(p0, p0 + rb, &c[K2_CHUNK * q + j]);
                    else
                        k45_decode2(p0, p0 + rb, fmt, &c[K2_CHUNK * q + j]);
                }
            int t = 0;
            for (; t + 8 <= g; t += 8) k2_tokens(c, sb0, nc, cols, x0 + (size_t)t * st, st, acc + t, 8, fmt == 2, np);
            const uint8_t *x = x0 + (size_t)t * st;
            switch (g - t) {
            case 1: k2_tokens(c, sb0, nc, cols, x, st, acc + t, 1, fmt == 2, np); break;
            case 2: k2_tokens(c, sb0, nc, cols, x, st, acc + t, 2, fmt == 2, np); break;
            case 3: k2_tokens(c, sb0, nc, cols, x, st, acc + t, 3, fmt == 2, np); break;
            case 4: k2_tokens(c, sb0, nc, cols, x, st, acc + t, 4, fmt == 2, np); break;
            case 5: k2_tokens(c, sb0, nc, cols, x, st, acc + t, 5, fmt == 2, np); break;
            case 6: k2_tokens(c, sb0, nc, cols, x, st, acc + t, 6, fmt == 2, np); break;
            case 7: k2_tokens(c, sb0, nc, cols, x, st, acc + t, 7, fmt == 2, np); break;
            default: break;
            }
        }
        for (int q = 0; q < np; q++)
            for (int t = 0; t < g; t++) {
                float *o = y + (size_t)(t0 + t) * ys + 2 * q;
                const __m512 v = acc[K2_GROUP * q + t];
                o[0] = hsum8(_mm512_castps512_ps256(v));
                o[1] = hsum8(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
            }
    }
}

/* Up to 8 tokens over a row pair (fmt as k2_rows_long's), a super-block at a time: its record (k45_decode2,
 * q6_decode2) then k2_tokens, the accumulators in registers. */
INL void k2_tile(const uint8_t *row, size_t rb, int cols, const uint8_t *xq, size_t st, float *y, size_t ys,
                 const int nt, const int fmt) {
    const int sbb = fmt == 2 ? 210 : fmt ? 176 : 144;
    __m512 acc[8];
    for (int t = 0; t < nt; t++) acc[t] = _mm512_setzero_ps();
    for (int sb = 0; sb < cols / 256; sb++) {
        k2_sb c;
        const uint8_t *p0 = row + (size_t)sbb * sb;
        if (fmt == 2)
            q6_decode2(p0, p0 + rb, &c);
        else
            k45_decode2(p0, p0 + rb, fmt, &c);
        k2_tokens(&c, sb, 1, cols, xq, st, acc, nt, fmt == 2, 1);
    }
    for (int t = 0; t < nt; t++) {
        y[(size_t)t * ys] = hsum8(_mm512_castps512_ps256(acc[t]));
        y[(size_t)t * ys + 1] = hsum8(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc[t]), 1)));
    }
}

/* ------------------------------------------------------ drivers, table */

/* One tile of k tokens, k a constant in each case (every size its own unrolled code). */
#define TILE_CASES_1_7(tile, x, o)                                                                            \
    case 1: tile(row, cols, x, st, o, ys, 1); break;                                                          \
    case 2: tile(row, cols, x, st, o, ys, 2); break;                                                          \
    case 3: tile(row, cols, x, st, o, ys, 3); break;                                                          \
    case 4: tile(row, cols, x, st, o, ys, 4); break;                                                          \
    case 5: tile(row, cols, x, st, o, ys, 5); break;                                                          \
    case 6: tile(row, cols, x, st, o, ys, 6); break;                                                          \
    case 7: tile(row, cols, x, st, o, ys, 7); break;
#define TILE_CASES_8_15(tile, x, o)                                                                           \
    case 8: tile(row, cols, x, st, o, ys, 8); break;                                                          \
    case 9: tile(row, cols, x, st, o, ys, 9); break;                                                          \
    case 10: tile(row, cols, x, st, o, ys, 10); break;                                                        \
    case 11: tile(row, cols, x, st, o, ys, 11); break;                                                        \
    case 12: tile(row, cols, x, st, o, ys, 12); break;                                                        \
    case 13: tile(row, cols, x, st, o, ys, 13); break;                                                        \
    case 14: tile(row, cols, x, st, o, ys, 14); break;                                                        \
    case 15: tile(row, cols, x, st, o, ys, 15); break;

/* The tiles of a row kernel: `big` tokens at a time (16 or 8), then 8, then
 * the rest as one tile (each nt a constant, so every tile size is its own
 * unrolled code). */
#define TILES(tile, big, stride)                                                                              \
    const size_t st = stride(cols);                                                                          \
    int t = 0;                                                                                               \
    for (; t + (big) <= n; t += (big)) tile(row, cols, xq + (size_t)t * st, st, y + (size_t)t * ys, ys, (big)); \
    for (; t + 8 <= n; t += 8) tile(row, cols, xq + (size_t)t * st, st, y + (size_t)t * ys, ys, 8);          \
    const uint8_t *x = xq + (size_t)t * st;                                                                  \
    float *o = y + (size_t)t * ys;                                                                           \
    switch (n - t) {                                                                                          \
        TILE_CASES_1_7(tile, x, o)                                                                            \
    default: break;                                                                                           \
    }

#define FE_q8_0 FE_Q8_0
#define FE_q4_0 FE_Q4_0
#define FE_q4_k FE_Q4_K
#define FE_q5_k FE_Q5_K
#define FE_q6_k FE_Q6_K

/* The K-quants: tiles of 8 tokens (a 16-token tile ran out of registers: 0.69-0.91x). */
#define DRIVER(fmt, stride)                                                                                  \
    TGT static void rowdot_vnni_##fmt(const uint8_t *row, int cols, const uint8_t *xq, int n, float *y, size_t ys) { \
        TILES(fmt##_tile, 8, stride)                                                                          \
    }

/* n tokens in ceil(n / TILE) tiles of near-equal size (n = 20: 10 + 10, not
 * 16 + 4), each size a constant (its own unrolled code): a block pair's
 * weight set-up is shared by its tile's tokens, so a small last tile costs
 * nearly as much as a full one (Q4_0 768 x 2048: 9 tokens 1.27x, 12 1.23x,
 * 20 1.07x as fast as tiles of 16, 8 and the rest; docs/bench-log/2026-12-06.md,
 * session 19 h2). The experts of a prompt's chunk see every count. The
 * split is FE_Q8_KIND_32Z's own (fe_q8_z_tile), whose tiles the quantizer
 * laid out. */
#define BALANCED_TILES(tile, stride)                                                                         \
    const size_t st = stride(cols);                                                                          \
    for (int t = 0, k = 0; t < n; t += k) {                                                                  \
        int first;                                                                                           \
        fe_q8_z_tile(n, t, &first, &k);                                                                      \
        const uint8_t *x = xq + (size_t)t * st;                                                              \
        float *o = y + (size_t)t * ys;                                                                       \
        switch (k) {                                                                                          \
            TILE_CASES_1_7(tile, x, o)                                                                        \
            TILE_CASES_8_15(tile, x, o)                                                                       \
        default: tile(row, cols, x, st, o, ys, 16); break;                                                   \
        }                                                                                                    \
    }

/* Q8_0 and Q4_0: under Z_TOKENS the AVX2 set's kernel on FE_Q8_KIND_32 (the
 * per-block set-up here pays off only over several tokens: bench/q8_speed.py
 * --kernels --sets); from Z_TOKENS, balanced tiles of up to 16 (16 was
 * 1.12-1.26x faster than 8 on the Intel VM of 2026-12-05) on
 * FE_Q8_KIND_32Z (vnni_layout). */
#define Z_TOKENS 4
#ifndef Q8_ROWDOT2_MIN_TOKENS
#define Q8_ROWDOT2_MIN_TOKENS 2
#endif
#define DRIVER32Z(fmt)                                                                                       \
    TGT static void rowdot_vnni_##fmt(const uint8_t *row, int cols, const uint8_t *xq, int n, float *y, size_t ys) { \
        if (n < Z_TOKENS) {                                                                                  \
            few_##fmt(row, cols, xq, n, y, ys);                                                              \
            return;                                                                                          \
        }                                                                                                    \
        BALANCED_TILES(fmt##_ztile, fe_q8_stride)                                                            \
    }
/* Under Z_TOKENS: Q8_0 on FE_Q8_KIND_32, Q4_0 on FE_Q8_KIND_32S (its four-row
 * kernel's layout), whose records AVX2's kernel reads as FE_Q8_KIND_32 one
 * token at a time (a token's arithmetic is the same alone or in a tile; these
 * are a thread's last 1-3 rows of a product). */
static void few_q8_0(const uint8_t *row, int cols, const uint8_t *xq, int n, float *y, size_t ys) {
    fe_q8_kernels_avx2()->rowdot[FE_Q8_0](row, cols, xq, n, y, ys);
}
static void few_q4_0(const uint8_t *row, int cols, const uint8_t *xq, int n, float *y, size_t ys) {
    const size_t st = fe_q8_stride_kind(FE_Q8_KIND_32S, cols);
    for (int t = 0; t < n; t++) fe_q8_kernels_avx2()->rowdot[FE_Q4_0](row, cols, xq + (size_t)t * st, 1, y + (size_t)t * ys, ys);
}
DRIVER32Z(q8_0)
DRIVER32Z(q4_0)
DRIVER(q4_k, fe_q8k_stride)
DRIVER(q5_k, fe_q8k_stride)
DRIVER(q6_k, fe_q8k_stride)

/* Two or four rows: up to 8 tokens k2_tile on each pair (tiles of 8 tokens,
 * then the rest), over more than K2_LONG_MIN (8) k2_rows_long over all of
 * them, the two pairs of a 4-row call sharing each activation load (Q6_K
 * 1.05-1.13x, Q4_K 1.0-1.06x at 32 tokens; docs/bench-log/2026-12-06.md, h7). */
#ifndef K2_LONG_MIN
#define K2_LONG_MIN 8
#endif
#ifndef K2_LONG
#define K2_LONG 1
#endif
#define LONG2_q4_k K2_LONG
#define LONG2_q5_k K2_LONG
#define LONG2_q6_k K2_LONG
#define long2_q4_k(r, rb, nr, ...) (nr == 4 ? k2_rows_long(r, rb, __VA_ARGS__, 0, 2) : k2_rows_long(r, rb, __VA_ARGS__, 0, 1))
#define long2_q5_k(r, rb, nr, ...) (nr == 4 ? k2_rows_long(r, rb, __VA_ARGS__, 1, 2) : k2_rows_long(r, rb, __VA_ARGS__, 1, 1))
#define long2_q6_k(r, rb, nr, ...) (nr == 4 ? k2_rows_long(r, rb, __VA_ARGS__, 2, 2) : k2_rows_long(r, rb, __VA_ARGS__, 2, 1))
#define q4_k_tile2(...) k2_tile(__VA_ARGS__, 0)
#define q5_k_tile2(...) k2_tile(__VA_ARGS__, 1)
#define q6_k_tile2(...) k2_tile(__VA_ARGS__, 2)
#define DRIVER2(fmt)                                                                                    \
    TGT static void rowdot2_vnni_##fmt(const uint8_t *row, size_t rb, int nr, int cols, const uint8_t *xq, int n, \
                                       float *y, size_t ys) {                                                 \
        if (LONG2_##fmt && n > K2_LONG_MIN) {                                                                         \
            long2_##fmt(row, rb, nr, cols, xq, n, y, ys);                                                     \
            return;                                                                                           \
        }                                                                                                     \
        const size_t st = fe_q8k_stride(cols);                                                                \
        for (int q = 0; q < nr; q += 2, row += 2 * rb, y += 2) {                                              \
            int t = 0;                                                                                        \
            for (; t + 8 <= n; t += 8) fmt##_tile2(row, rb, cols, xq + (size_t)t * st, st, y + (size_t)t * ys, ys, 8); \
            const uint8_t *x = xq + (size_t)t * st;                                                           \
            float *o = y + (size_t)t * ys;                                                                    \
            switch (n - t) {                                                                                  \
            case 1: fmt##_tile2(row, rb, cols, x, st, o, ys, 1); break;                                   \
            case 2: fmt##_tile2(row, rb, cols, x, st, o, ys, 2); break;                                   \
            case 3: fmt##_tile2(row, rb, cols, x, st, o, ys, 3); break;                                   \
            case 4: fmt##_tile2(row, rb, cols, x, st, o, ys, 4); break;                                   \
            case 5: fmt##_tile2(row, rb, cols, x, st, o, ys, 5); break;                                   \
            case 6: fmt##_tile2(row, rb, cols, x, st, o, ys, 6); break;                                   \
            case 7: fmt##_tile2(row, rb, cols, x, st, o, ys, 7); break;                                   \
            default: break;                                                                                   \
            }                                                                                                 \
        }                                                                                                     \
    }
DRIVER2(q4_k)
DRIVER2(q5_k)
DRIVER2(q6_k)

/* The four-row kernel `name` over `tile` (Q4_0's above, q3_nl's below):
 * up to R4_TOKENS tokens a tile, on layout `kind` (each nt a constant); pf:
 * WITH_PF passes the prefetch bound on to a tile that prefetches (the set's
 * rowdot4_prefetch bit), NO_PF for the others (which ignore it). */
#define WITH_PF , pf_end
#define NO_PF
#define DRIVER4(attr, name, tile, kind, pf)                                                                   \
    attr static void name(const uint8_t *row, size_t rb, int cols, const uint8_t *xq, int n, float *y, size_t ys,   \
                          const uint8_t *pf_end) {                                                           \
        const size_t st = fe_q8_stride_kind(kind, cols);                                                     \
        (void)pf_end;                                                                                        \
        for (int t = 0; t < n; t += R4_TOKENS) {                                                             \
            const uint8_t *x = xq + (size_t)t * st;                                                          \
            float *o = y + (size_t)t * ys;                                                                   \
            switch (n - t) {                                                                                 \
            case 1: tile(row, rb, cols, x, st, o, ys, 1 pf); break;                                   \
            case 2: tile(row, rb, cols, x, st, o, ys, 2 pf); break;                                   \
            default: tile(row, rb, cols, x, st, o, ys, 3 pf); break;                                  \
            }                                                                                                \
        }                                                                                                    \
    }

/* the four-row tiles by format (tile_r4_pairs above) */
#define q8_0_tile_r4(...) tile_r4_pairs(__VA_ARGS__, 0, 0)
#define q4_0_tile_r4_and(...) tile_r4_pairs(__VA_ARGS__, 1, 0)
#define q4_0_tile_r4_gfni(...) tile_r4_pairs(__VA_ARGS__, 1, 1)
DRIVER4(TGT, rowdot4_vnni_q8_0, q8_0_tile_r4, FE_Q8_KIND_32, WITH_PF)
DRIVER4(TGT, rowdot4_vnni_q4_0, q4_0_tile_r4_and, FE_Q8_KIND_32S, WITH_PF)
DRIVER4(TGT, rowdot4_gfni_q4_0, q4_0_tile_r4_gfni, FE_Q8_KIND_32S, WITH_PF)
DRIVER4(TGT, rowdot4_vnni_q4_1, q4_1_tile_r4, FE_Q8_KIND_32, NO_PF)

/* ---------------------------------------------- q3_nl (AVX-512 VBMI as well) */

#define ISA_VBMI ISA ",avx512vbmi"
#define INLV static inline __attribute__((always_inline, target(ISA_VBMI)))
#define TGTV __attribute__((target(ISA_VBMI)))

static int cpu_has_avx512vbmi(void) {
    unsigned a, b, c, d;
    if (!fe_cpu_has_avx512vnni()) return 0;
    __cpuid_count(7, 0, a, b, c, d);
    return (c >> 1) & 1;
}

/* A group g (values 64g..64g+63, chunks 2g and 2g + 1) of a block is bits
 * 24g..24g+23 of every lane's 96-bit index number, i.e. three whole bytes of
 * each lane's words (formats.h): group 0 bytes 0-2 of word (0, l), group 3
 * bytes 1-3 of word (2, l) (both read by a 32-byte broadcast load, the
 * shift folded into the control below), groups 1 and 2 straddling two words
 * (one vpermb of 64 loaded bytes gathers them, in both 256-bit halves).
 * vpmultishiftqb takes each index's byte (the low half: fields 0-3 of the
 * lane's window, chunk 2g; the high half: fields 4-7, chunk 2g + 1) and
 * vpermb looks up the grid levels plus 128 (5..251, unsigned: vpdpbusd's
 * unsigned operand), in the grid repeated 8 times (it reads the low 6 bits
 * of each byte). The bytes land in FE_Q8_KIND_32T's order, 64 activations
 * apart per group. A lane's sum (G + 128) . q - 128 * (the sum of its 4 q)
 * is the reference's exact P: the accumulator starts at -128 times the
 * token's lane sum of q (FE_Q8_KIND_32TS, made once per token). The zmm's low half is the reference's even chunk's
 * accumulator, the high half the odd one's; the block's 8 float factors
 * s_{c/2} * d_c are made at once (the reference's two roundings, lane by
 * lane: fe_q3_q8_scale's vectorised, times d_c) and spread per group by one
 * vpermps. */
INLV __m512i q3_levels(__m512i fields, const int shifted, __m512i table) {
    const __m512i ctrl = _mm512_set_epi64(0x35322f2c15120f0cLL, 0x35322f2c15120f0cLL, 0x35322f2c15120f0cLL,
                                          0x35322f2c15120f0cLL, 0x2926232009060300LL, 0x2926232009060300LL,
                                          0x2926232009060300LL, 0x2926232009060300LL);
    const __m512i c = shifted ? _mm512_add_epi8(ctrl, _mm512_set1_epi8(8)) : ctrl;
    return _mm512_permutexvar_epi8(_mm512_multishift_epi64_epi8(c, fields), table);
}

/* fe_q3_q8_scale(p, c / 2) for the block's chunks c = 0..7, the same float steps. */
INLV __m256 q3_chunk_scales(const uint8_t *p) {
    if (p[96] == 0) return _mm256_setzero_ps();
    const __m256i j = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(p[97] | p[98] << 8),
                                                         _mm256_setr_epi32(0, 0, 4, 4, 8, 8, 12, 12)),
                                       _mm256_set1_epi32(15));
    const __m256i v = _mm256_sub_epi32(_mm256_set1_epi32(p[96] + 16), j); /* 2..270 */
    const __m256 pw = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_srli_epi32(v, 3), _mm256_set1_epi32(105)), 23));
    const __m256 f = _mm256_permutevar8x32_ps(_mm256_loadu_ps(fe_q3_frac), v); /* fe_q3_frac[v & 7] */
    return _mm256_mul_ps(_mm256_mul_ps(f, pw), _mm256_set1_ps(1.0f / 56.0f));
}

/* A block's decoding constants: the grid + 128 repeated 8 times (q3_levels'
 * table) and the byte picks of groups 1 and 2 (group 1: bytes 3 of word
 * (0, l) and 0-1 of word (1, l) of p; group 2: bytes 2-3 of word (1, l) and
 * 0 of word (2, l) of p + 32; lane l's three bytes at 4l, the fourth
 * repeating one: multishift never reads it). */
typedef struct q3_consts {
    __m512i table, pick1, pick2;
} q3_consts;

INLV q3_consts q3_consts_make(void) {
#define G8 5, 54, 88, 116, 141, 168, 202, 251 /* FE_Q3_Q8_GRID + 128 */
    static const uint8_t g64[64] = {G8, G8, G8, G8, G8, G8, G8, G8};
#undef G8
    q3_consts c;
    c.table = ld512(g64);
    c.pick1 = _mm512_set_epi32(0x22212003 + 0x1c1c1c1c, 0x22212003 + 0x18181818, 0x22212003 + 0x14141414,
                               0x22212003 + 0x10101010, 0x22212003 + 0x0c0c0c0c, 0x22212003 + 0x08080808,
                               0x22212003 + 0x04040404, 0x22212003, 0x22212003 + 0x1c1c1c1c, 0x22212003 + 0x18181818,
                               0x22212003 + 0x14141414, 0x22212003 + 0x10101010, 0x22212003 + 0x0c0c0c0c,
                               0x22212003 + 0x08080808, 0x22212003 + 0x04040404, 0x22212003);
    c.pick2 = _mm512_sub_epi32(c.pick1, _mm512_set1_epi32(0x22212003 - 0x21200302)); /* 4l + 2, 4l + 3, 32 + 4l */
    return c;
}

/* The four groups of the block at p as levels + 128, in FE_Q8_KIND_32T's order. */
INLV void q3_block_levels(const uint8_t *p, const q3_consts *c, __m512i w[4]) {
    w[0] = q3_levels(ld2x(p), 0, c->table);
    w[1] = q3_levels(_mm512_permutexvar_epi8(c->pick1, ld512(p)), 0, c->table);
    w[2] = q3_levels(_mm512_permutexvar_epi8(c->pick2, ld512(p + 32)), 0, c->table);
    w[3] = q3_levels(ld2x(p + 64), 1, c->table);
}

/* Group g's float factors from the block's 8 (chunk c's in element c of s):
 * chunk 2g's in the low 8 lanes, 2g + 1's in the high ones. */
INLV __m512 q3_group_factors(__m512 s, const int g) {
    return _mm512_permutexvar_ps(_mm512_set_epi32(2 * g + 1, 2 * g + 1, 2 * g + 1, 2 * g + 1, 2 * g + 1, 2 * g + 1,
                                                  2 * g + 1, 2 * g + 1, 2 * g, 2 * g, 2 * g, 2 * g, 2 * g, 2 * g, 2 * g,
                                                  2 * g), s);
}

INLV void q3_nl_tile(const uint8_t *row, int cols, const uint8_t *xq, size_t st, float *y, size_t ys, const int nt) {
    const q3_consts qc = q3_consts_make();
    const size_t so = fe_q8_sums_offset(cols);
    __m512 acc[TILE];
    for (int t = 0; t < nt; t++) acc[t] = _mm512_setzero_ps();
    for (int b = 0; b < cols / FE_Q3_BLOCK; b++) {
        const uint8_t *p = row + FE_Q3_BYTES * (size_t)b;
        const __m256 sc = q3_chunk_scales(p);
        __m512i w[4];
        q3_block_levels(p, &qc, w);
        for (int t = 0; t < nt; t++) {
            const __m512 s = _mm512_castps256_ps512(_mm256_mul_ps(sc, _mm256_loadu_ps(DX(t) + 8 * b)));
            for (int g = 0; g < 4; g++) {
                const size_t v = FE_Q3_BLOCK * (size_t)b + 64 * (size_t)g;
                acc[t] = _mm512_fmadd_ps(q3_group_factors(s, g),
                                         _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(ld512(CX(t) + v / 4), w[g], ld512(QX(t) + v))),
                                         acc[t]);
            }
        }
    }
    for (int t = 0; t < nt; t++)
        y[(size_t)t * ys] = hsum8(_mm256_add_ps(_mm512_castps512_ps256(acc[t]), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc[t]), 1))));
}

static size_t stride_32ts(int cols) { return fe_q8_stride_kind(FE_Q8_KIND_32TS, cols); }
FE_Q8_DRIVER(vbmi, TGTV, q3_nl, stride_32ts)

/* Four rows of q3_nl over 1-3 tokens (the table's rowdot4): q3_nl_tile's
 * arithmetic row by row, lane by lane, in its order; the activation loads and
 * each group's -128 * (lane sum of q) start (FE_Q8_KIND_32TS) are shared by the four rows, the
 * four rows' chains of multiply-adds are independent (one row's chain of 4
 * per block is the one-row kernel's limit at decode), and the four sums are
 * taken together: per row v = acc's low half + high half, then
 * ((v0 + v4) + (v2 + v6)) + ((v1 + v5) + (v3 + v7)) as hsum8, the rows side
 * by side in the 128-bit lanes of two ymm. A decode token's experts are
 * mostly these products over 1-2 blocks a row, where the one-row kernel
 * spent as much on its call, set-up and final sum as on the block. */
INLV void q3_nl_tile_r4(const uint8_t *row, size_t rb, int cols, const uint8_t *xq, size_t st, float *y, size_t ys,
                        const int nt) {
    const q3_consts qc = q3_consts_make();
    const size_t so = fe_q8_sums_offset(cols);
    __m512 acc[R4_TOKENS][4];
    for (int t = 0; t < nt; t++) acc[t][0] = acc[t][1] = acc[t][2] = acc[t][3] = _mm512_setzero_ps();
    for (int b = 0; b < cols / FE_Q3_BLOCK; b++) {
        __m512i c0[R4_TOKENS][4];
        for (int t = 0; t < nt; t++)
            for (int g = 0; g < 4; g++) c0[t][g] = ld512(CX(t) + (FE_Q3_BLOCK * (size_t)b + 64 * (size_t)g) / 4);
        for (int i = 0; i < 4; i++) {
            const uint8_t *p = row + (size_t)i * rb + FE_Q3_BYTES * (size_t)b;
            const __m256 sc = q3_chunk_scales(p);
            __m512i w[4];
            q3_block_levels(p, &qc, w);
            for (int t = 0; t < nt; t++) {
                const __m512 s = _mm512_castps256_ps512(_mm256_mul_ps(sc, _mm256_loadu_ps(DX(t) + 8 * b)));
                for (int g = 0; g < 4; g++) {
                    const __m512i x = ld512(QX(t) + FE_Q3_BLOCK * (size_t)b + 64 * g);
                    acc[t][i] = _mm512_fmadd_ps(q3_group_factors(s, g),
                                                _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(c0[t][g], w[g], x)), acc[t][i]);
                }
            }
        }
    }
    for (int t = 0; t < nt; t++) {
        __m256 v[4];
        for (int i = 0; i < 4; i++)
            v[i] = _mm256_add_ps(_mm512_castps512_ps256(acc[t][i]),
                                 _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc[t][i]), 1)));
        /* u = (v0 + v4, v1 + v5, v2 + v6, v3 + v7): rows 0 | 1 and 2 | 3 in the 128-bit lanes */
        const __m256 u01 = _mm256_add_ps(_mm256_permute2f128_ps(v[0], v[1], 0x20), _mm256_permute2f128_ps(v[0], v[1], 0x31));
        const __m256 u23 = _mm256_add_ps(_mm256_permute2f128_ps(v[2], v[3], 0x20), _mm256_permute2f128_ps(v[2], v[3], 0x31));
        /* (u0 + u2, u1 + u3) of rows 0, 2 | 1, 3 */
        const __m256 h = _mm256_add_ps(_mm256_shuffle_ps(u01, u23, 0x44), _mm256_shuffle_ps(u01, u23, 0xee));
        /* rows 0, 2, 0, 2 | 1, 3, 1, 3 */
        const __m256 r = _mm256_add_ps(_mm256_shuffle_ps(h, h, 0x88), _mm256_shuffle_ps(h, h, 0xdd));
        float out[8];
        _mm256_storeu_ps(out, r);
        float *o = y + (size_t)t * ys;
        o[0] = out[0], o[1] = out[4], o[2] = out[1], o[3] = out[5];
    }
}

DRIVER4(TGTV, rowdot4_vbmi_q3_nl, q3_nl_tile_r4, FE_Q8_KIND_32TS, NO_PF)

/* Without VBMI: AVX2's q3_nl kernel (the same bits). */
static void rowdot_vnni_q3_nl(const uint8_t *row, int cols, const uint8_t *xq, int n, float *y, size_t ys) {
    fe_q8_kernels_avx2()->rowdot[FE_Q3_NL](row, cols, xq, n, y, ys);
}

/* The table's `layout`: what the drivers above read over n tokens (with
 * VBMI q3_nl reads FE_Q8_KIND_32TS; without, AVX2's kernel FE_Q8_KIND_32T). */
static int vnni_layout(int fmt, int n) {
    return (fmt == FE_Q8_0 || fmt == FE_Q4_0) && n >= Z_TOKENS ? FE_Q8_KIND_32Z
           : fmt == FE_Q4_0                                    ? FE_Q8_KIND_32S
                                                               : fe_q8_kind(fmt);
}
static int vbmi_layout(int fmt, int n) { return fmt == FE_Q3_NL ? FE_Q8_KIND_32TS : vnni_layout(fmt, n); }

/* Q4_1's one-row kernel (a thread's last 1-3 rows; 4 tokens or more) is
 * AVX2's: this file's one-row version was 0.63-0.79x as fast (its minimum's
 * scalar chain; bench/q8_speed.py); 1-3 tokens take q4_1_tile_r4 four rows
 * at a time (the table's rowdot4). */
static void rowdot_vnni_q4_1(const uint8_t *row, int cols, const uint8_t *xq, int n, float *y, size_t ys) {
    fe_q8_kernels_avx2()->rowdot[FE_Q4_1](row, cols, xq, n, y, ys);
}

/* The quantizer is AVX2's (bit-identical to the reference; its cost is one
 * pass over x per product, small beside the rows' products). */
static void quantize_vnni(int kind, const float *x, size_t xs, int cols, int n, uint8_t *out) {
    fe_q8_kernels_avx2()->quantize(kind, x, xs, cols, n, out);
}

#define VNNI_SET(name, q3, q3r4, q4r4, layout)                                                                  \
    static const fe_q8_kernels name = {                                                                     \
        "avx512vnni",                                                                                       \
        {[FE_Q8_0] = rowdot_vnni_q8_0, [FE_Q4_0] = rowdot_vnni_q4_0, [FE_Q4_1] = rowdot_vnni_q4_1,          \
         [FE_Q4_K] = rowdot_vnni_q4_k, [FE_Q5_K] = rowdot_vnni_q5_k, [FE_Q6_K] = rowdot_vnni_q6_k,          \
         [FE_Q3_NL] = q3},                                                                                  \
        quantize_vnni,                                                                                      \
        layout,                                                                                             \
        {[FE_Q4_K] = rowdot2_vnni_q4_k, [FE_Q5_K] = rowdot2_vnni_q5_k, [FE_Q6_K] = rowdot2_vnni_q6_k},      \
        Q8_ROWDOT2_MIN_TOKENS,                                                                              \
        {[FE_Q8_0] = rowdot4_vnni_q8_0, [FE_Q4_0] = q4r4, [FE_Q4_1] = rowdot4_vnni_q4_1, [FE_Q3_NL] = q3r4},    \
        Z_TOKENS - 1,                                                                                       \
        1u << FE_Q8_0 | 1u << FE_Q4_0,                                                                      \
    };
VNNI_SET(VNNI_Q8_GFNI, rowdot_vbmi_q3_nl, rowdot4_vbmi_q3_nl, rowdot4_gfni_q4_0, vbmi_layout)
VNNI_SET(VNNI_Q8, rowdot_vbmi_q3_nl, rowdot4_vbmi_q3_nl, rowdot4_vnni_q4_0, vbmi_layout)
VNNI_SET(VNNI_Q8_NO_VBMI, rowdot_vnni_q3_nl, NULL, rowdot4_vnni_q4_0, vnni_layout)

static int cpu_has_gfni(void) {
    unsigned a, b, c, d;
    __cpuid_count(7, 0, a, b, c, d);
    return (c >> 8) & 1;
}

/* With VBMI (Ice Lake and later, Zen 4 and later) the q3_nl kernel above,
 * and with GFNI too (the same CPUs) Q4_0's four-row kernel takes a block
 * pair's low and high nibbles with one vgf2p8affineqb instead of a shift and
 * an AND (bench-log 2026-12-06, session 19 h1). */
const fe_q8_kernels *fe_q8_kernels_avx512vnni(void) {
    return !cpu_has_avx512vbmi() ? &VNNI_Q8_NO_VBMI : cpu_has_gfni() ? &VNNI_Q8_GFNI : &VNNI_Q8;
}

#else

int fe_cpu_has_avx512vnni(void) { return 0; }
const fe_q8_kernels *fe_q8_kernels_avx512vnni(void) { return 0; }

#endif
