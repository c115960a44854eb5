/* ceiling.c — benchmark, not product code: this CPU's peak multiply-accumulate
 * rates, for bench/ceiling.py (which builds and runs it and turns the rates
 * into the best tok/s any kernel could reach on a model):
 *
 *   cc -std=c11 -O2 -pthread bench/ceiling.c -o ceiling && ./ceiling [threads]   (one JSON object)
 *
 * Each loop is register-only (no memory operands), with enough independent
 * accumulator chains to cover the instruction's latency, so it runs at the
 * throughput of the execution ports the instruction uses. Rates are in MACs
 * (multiply-accumulates) per second of each thread's own CPU time (so that
 * other processes taking turns on the cores do not count), best of 5 runs of
 * ~0.1 s, on one thread and summed over `threads` threads run at once:
 *   f32_fma_avx2     vfmadd231ps ymm: 8 f32 MACs an instruction (what an exact,
 *                    f32-activation kernel needs at least once per weight and token)
 *   f32_fma_avx512   vfmadd231ps zmm: 16
 *   i8_maddubs_avx2  vpmaddubsw + vpmaddwd (pairs to int32) + vpaddd: 32 u8 x s8
 *                    MACs per three instructions (llama.cpp's AVX2 int8 dot)
 *   i8_block_avx2    the above plus vcvtdq2ps and one vfmadd231ps per 32 MACs
 *                    (one 32-value block scaled into a float sum: Q8_0 x Q8_0)
 *   i8_vnni_avx512   vpdpbusd zmm: 64 u8 x s8 MACs an instruction (AVX512-VNNI,
 *                    which llama.cpp uses on this CPU when built for it)
 * Missing instruction sets report null. Optimisation is kept modest (-O2) and
 * every chain feeds a sink, so no loop is folded away. */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define X86 1
#endif

#define ITERS 4000000L /* loop trips per run; each trip does 12 instructions of the kind measured */

/* The calling thread's CPU time: on a shared machine, the time it actually ran. */
static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static volatile float sinkf;
static volatile int sinki;

#ifdef X86
#define T2 __attribute__((target("avx2,fma"), noinline))
#define T5 __attribute__((target("avx512f,avx512bw,avx512vnni"), noinline))

/* Returns MACs done. */
T2 static double f32_fma_avx2(long it) {
    __m256 a[12], x = _mm256_set1_ps(1.0000001f), y = _mm256_set1_ps(0.9999999f);
    for (int j = 0; j < 12; j++) a[j] = _mm256_set1_ps((float)j);
    for (long i = 0; i < it; i++) {
        __asm__ volatile("" : "+x"(x), "+x"(y));
#pragma GCC unroll 12
        for (int j = 0; j < 12; j++) a[j] = _mm256_fmadd_ps(a[j], x, y);
    }
    __m256 s = a[0];
    for (int j = 1; j < 12; j++) s = _mm256_add_ps(s, a[j]);
    sinkf = _mm256_cvtss_f32(s);
    return (double)it * 12 * 8;
}

T5 static double f32_fma_avx512(long it) {
    __m512 a[12], x = _mm512_set1_ps(1.0000001f), y = _mm512_set1_ps(0.9999999f);
    for (int j = 0; j < 12; j++) a[j] = _mm512_set1_ps((float)j);
    for (long i = 0; i < it; i++) {
        __asm__ volatile("" : "+v"(x), "+v"(y));
#pragma GCC unroll 12
        for (int j = 0; j < 12; j++) a[j] = _mm512_fmadd_ps(a[j], x, y);
    }
    __m512 s = a[0];
    for (int j = 1; j < 12; j++) s = _mm512_add_ps(s, a[j]);
    sinkf = _mm512_reduce_add_ps(s);
    return (double)it * 12 * 16;
}

T2 static double i8_maddubs_avx2(long it) {
    __m256i a[4], u[4], s = _mm256_set1_epi8(-2), one = _mm256_set1_epi16(1);
    for (int j = 0; j < 4; j++) a[j] = _mm256_set1_epi32(j), u[j] = _mm256_set1_epi8((char)(j + 1));
    for (long i = 0; i < it; i++) {
        /* each chain its own operand, changed behind the compiler's back: nothing is shared or hoisted */
        __asm__ volatile("" : "+x"(u[0]), "+x"(u[1]), "+x"(u[2]), "+x"(u[3]), "+x"(s));
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++)
            a[j] = _mm256_add_epi32(a[j], _mm256_madd_epi16(_mm256_maddubs_epi16(u[j], s), one));
    }
    __m256i t = _mm256_add_epi32(_mm256_add_epi32(a[0], a[1]), _mm256_add_epi32(a[2], a[3]));
    sinki = _mm256_extract_epi32(t, 0);
    return (double)it * 4 * 32; /* 12 instructions, 4 x 32 MACs */
}

T2 static double i8_block_avx2(long it) {
    __m256 a[4];
    __m256i u[4], s = _mm256_set1_epi8(-2), one = _mm256_set1_epi16(1);
    __m256 d = _mm256_set1_ps(0.5f);
    for (int j = 0; j < 4; j++) a[j] = _mm256_set1_ps((float)j), u[j] = _mm256_set1_epi8((char)(j + 1));
    for (long i = 0; i < it; i++) {
        __asm__ volatile("" : "+x"(u[0]), "+x"(u[1]), "+x"(u[2]), "+x"(u[3]), "+x"(s), "+x"(d));
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++)
            a[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_madd_epi16(_mm256_maddubs_epi16(u[j], s), one)), d, a[j]);
    }
    sinkf = _mm256_cvtss_f32(_mm256_add_ps(_mm256_add_ps(a[0], a[1]), _mm256_add_ps(a[2], a[3])));
    return (double)it * 4 * 32; /* 16 instructions, 4 x 32 MACs */
}

T5 static double i8_vnni_avx512(long it) {
    __m512i a[12], u = _mm512_set1_epi8(3), s = _mm512_set1_epi8(-2);
    for (int j = 0; j < 12; j++) a[j] = _mm512_set1_epi32(j);
    for (long i = 0; i < it; i++) {
        __asm__ volatile("" : "+v"(u), "+v"(s));
#pragma GCC unroll 12
        for (int j = 0; j < 12; j++) a[j] = _mm512_dpbusd_epi32(a[j], u, s);
    }
    __m512i t = a[0];
    for (int j = 1; j < 12; j++) t = _mm512_add_epi32(t, a[j]);
    sinki = _mm512_reduce_add_epi32(t);
    return (double)it * 12 * 64;
}
#endif

typedef double (*loop_fn)(long);
typedef struct { loop_fn f; double macs, secs; } run_arg;

static void *run_one(void *p) {
    run_arg *r = p;
    double t0 = now();
    r->macs = r->f(ITERS);
    r->secs = now() - t0;
    return NULL;
}

/* Best MAC/s of 5 runs with `threads` threads at once: the sum over threads of
 * each one's MACs per second of its own CPU time. */
static double rate(loop_fn f, int threads) {
    double best = 0.0;
    for (int rep = 0; rep < 5; rep++) {
        pthread_t th[64];
        run_arg ra[64];
        for (int t = 0; t < threads; t++) {
            ra[t].f = f;
            pthread_create(&th[t], NULL, run_one, &ra[t]);
        }
        double sum = 0.0;
        for (int t = 0; t < threads; t++) {
            pthread_join(th[t], NULL);
            sum += ra[t].macs / ra[t].secs;
        }
        if (sum > best) best = sum;
    }
    return best;
}

int main(int argc, char **argv) {
    int threads = argc > 1 ? atoi(argv[1]) : 2;
    if (threads < 1 || threads > 64) threads = 2;
    struct { const char *name; loop_fn f; int ok; } loops[] = {
#ifdef X86
        {"f32_fma_avx2", f32_fma_avx2, __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")},
        {"f32_fma_avx512", f32_fma_avx512, __builtin_cpu_supports("avx512f")},
        {"i8_maddubs_avx2", i8_maddubs_avx2, __builtin_cpu_supports("avx2")},
        {"i8_block_avx2", i8_block_avx2, __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")},
        {"i8_vnni_avx512", i8_vnni_avx512,
         __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vnni")},
#endif
        {NULL, NULL, 0},
    };
    printf("{\"threads\": %d", threads);
    for (int i = 0; loops[i].name; i++) {
        if (!loops[i].ok) {
            printf(", \"%s\": null", loops[i].name);
            continue;
        }
        double one = rate(loops[i].f, 1), all = rate(loops[i].f, threads);
        printf(", \"%s\": {\"macs_per_s_1\": %.4g, \"macs_per_s_all\": %.4g}", loops[i].name, one, all);
    }
    printf("}\n");
    return 0;
}
