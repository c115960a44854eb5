/* attention.c — the attention kernels' rates, one thread (bench/attention.py builds and runs it).
 *
 *     attention HEAD_DIM POSITIONS QUERIES REPS
 *
 * For every kernel set this build and CPU run (scalar, avx2, neon; on a CPU
 * with AVX-512 the AVX2 set's zmm attention, avx2_zmm, and its ymm one,
 * avx2_ymm), times
 * att_scores, att_wsum and att_softmax over POSITIONS cached positions of
 * one KV head for QUERIES heads, by the thread's CPU clock, in two states:
 * "cached" (the same K and V again, in L2 when they fit) and "cold" (a 64 MB
 * buffer walked before every call, so K and V come from L3 or memory).
 * Prints one line of JSON: G MACs/s for the products, ns per value for the
 * softmax. The inputs are random normal-range values, with softmax weights
 * of the spread a real model's scores give (no denormals: kernels.h). */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../core_c/include/ferry_kernels.h"
#include "../core_c/src/kernels.h"

static double cpu_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static unsigned long long seed = 88172645463325252ull;
static float frand(void) {
    seed ^= seed << 13, seed ^= seed >> 7, seed ^= seed << 17;
    return (float)(seed >> 40) / 16777216.0f * 2.0f - 1.0f;
}

static volatile unsigned char sink;
static void evict(unsigned char *buf, size_t n) {
    for (size_t i = 0; i < n; i += 64) buf[i]++;
    sink = buf[n / 2];
}

int main(int argc, char **argv) {
    if (argc != 5) {
        fprintf(stderr, "usage: attention HEAD_DIM POSITIONS QUERIES REPS\n");
        return 2;
    }
    const int hd = atoi(argv[1]), np = atoi(argv[2]), nq = atoi(argv[3]), reps = atoi(argv[4]);
    if (hd < 1 || np < 1 || nq < 1 || nq > 16 || reps < 1) {
        fprintf(stderr, "bad arguments\n");
        return 2;
    }
    const size_t os = (size_t)FE_KT_PAD(np), evict_bytes = (size_t)64 << 20;
    float *q = malloc(sizeof(float) * (size_t)(nq * hd)), *kt = malloc(sizeof(float) * os * (size_t)hd);
    float *v = malloc(sizeof(float) * (size_t)np * (size_t)hd), *p = malloc(sizeof(float) * os * (size_t)nq);
    float *pw = malloc(sizeof(float) * os * (size_t)nq), *out = malloc(sizeof(float) * (size_t)(nq * hd));
    unsigned char *buf = calloc(evict_bytes, 1);
    if (!q || !kt || !v || !p || !pw || !out || !buf) return 1;
    for (int i = 0; i < nq * hd; i++) q[i] = frand();
    for (size_t i = 0; i < os * (size_t)hd; i++) kt[i] = frand();
    for (size_t i = 0; i < (size_t)np * (size_t)hd; i++) v[i] = frand();
    printf("{\"head_dim\": %d, \"positions\": %d, \"queries\": %d, \"reps\": %d, \"sets\": {", hd, np, nq, reps);
    int first = 1;
    /* the sets, and the AVX2 set's ymm attention where its own runs in zmm (on CPUs with AVX-512) */
    const fe_kernels *sets[FE_KERNELS_N + 1];
    const char *names[FE_KERNELS_N + 1];
    int n_sets = 0;
    for (int impl = 0; impl < FE_KERNELS_N; impl++) {
        if (!ferry_kernels_available(impl)) continue;
        sets[n_sets] = fe_kernels_get(impl);
        names[n_sets++] = impl == FE_KERNELS_AVX2 && fe_cpu_has_avx512() ? "avx2_zmm" : fe_kernels_get(impl)->name;
        if (impl == FE_KERNELS_AVX2 && fe_cpu_has_avx512())
            sets[n_sets] = fe_kernels_avx2_ymm_table(), names[n_sets++] = "avx2_ymm";
    }
    for (int set = 0; set < n_sets; set++) {
        const fe_kernels *K = sets[set];
        /* weights: the softmax of scores with a real spread (scale 1 / sqrt(hd) x 3) */
        K->att_scores(q, nq, kt, hd, np, 3.0f, pw, os);
        for (int r = 0; r < nq; r++) K->att_softmax(pw + (size_t)r * os, np);
        printf("%s\"%s\": {", first ? "" : ", ", names[set]);
        first = 0;
        for (int cold = 0; cold < 2; cold++) {
            double ts = 0, tw = 0, tx = 0;
            for (int r = 0; r < reps; r++) {
                if (cold) evict(buf, evict_bytes);
                double t0 = cpu_now();
                K->att_scores(q, nq, kt, hd, np, 0.125f, p, os);
                ts += cpu_now() - t0;
                if (cold) evict(buf, evict_bytes);
                t0 = cpu_now();
                K->att_wsum(out, nq, pw, os, v, (size_t)hd, np, hd);
                tw += cpu_now() - t0;
                t0 = cpu_now();
                for (int x = 0; x < nq; x++) K->att_softmax(p + (size_t)x * os, np);
                tx += cpu_now() - t0;
            }
            const double macs = (double)nq * np * hd * reps;
            printf("%s\"%s\": {\"scores_gmacs\": %.2f, \"wsum_gmacs\": %.2f, \"softmax_ns_per_value\": %.3f}",
                   cold ? ", " : "", cold ? "cold" : "cached", macs / ts * 1e-9, macs / tw * 1e-9,
                   tx / ((double)nq * np * reps) * 1e9);
        }
        printf("}");
    }
    printf("}}\n");
    free(q), free(kt), free(v), free(p), free(pw), free(out), free(buf);
    return 0;
}
