/* common.c — error reports, clocks, aligned memory, CRC-32, full reads. */
#define _POSIX_C_SOURCE 200809L
#define _DEFAULT_SOURCE  /* MAP_ANONYMOUS (glibc) */
#define _DARWIN_C_SOURCE /* MAP_ANON (macOS) */
#include "common.h"

#include <sys/mman.h>

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#if defined(__aarch64__) && defined(__ARM_FEATURE_CRC32)
#include <arm_acle.h>
#endif

ferry_status fe_fail(ferry_error *err, ferry_status code, const char *fmt, ...) {
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->message, sizeof err->message, fmt, ap);
        va_end(ap);
        err->code = (int)code;
    }
    return code;
}

double fe_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void *fe_alloc(size_t nbytes) {
    if (nbytes == 0) nbytes = 64;
    if (nbytes > SIZE_MAX - 64) return NULL;
    void *p = NULL;
    if (posix_memalign(&p, 64, FE_ALIGN_UP(nbytes, 64)) != 0) return NULL;
    memset(p, 0, nbytes);
    return p;
}

void *fe_alloc_pages(size_t nbytes) {
    if (nbytes == 0) nbytes = 4096;
    if (nbytes > SIZE_MAX - 4096) return NULL;
    size_t size = FE_ALIGN_UP(nbytes, 4096);
    void *p = NULL;
    if (posix_memalign(&p, 4096, size) != 0) return NULL;
    memset(p, 0, size);
    return p;
}

void fe_free(void *p) { free(p); }

#ifndef MAP_ANONYMOUS
#define MAP_ANONYMOUS MAP_ANON
#endif

void *fe_alloc_lazy(size_t nbytes) {
    if (nbytes == 0) nbytes = 4096;
    if (nbytes > SIZE_MAX - 4096) return NULL;
    void *p = mmap(NULL, FE_ALIGN_UP(nbytes, 4096), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

void *fe_alloc_huge(size_t nbytes) {
    if (nbytes == 0) nbytes = 4096;
    if (nbytes > SIZE_MAX - 2 * FE_HUGE_PAGE) return NULL;
    const size_t size = FE_ALIGN_UP(nbytes, 4096), span = size + FE_HUGE_PAGE;
    uint8_t *p = mmap(NULL, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return NULL;
    /* keep the aligned part of the span (mmap gives 4 KiB alignment) */
    uint8_t *a = p + (FE_HUGE_PAGE - (uintptr_t)p % FE_HUGE_PAGE) % FE_HUGE_PAGE;
    if (a > p) munmap(p, (size_t)(a - p));
    if (p + span > a + size) munmap(a + size, (size_t)(p + span - (a + size)));
#ifdef MADV_HUGEPAGE
    (void)madvise(a, size, MADV_HUGEPAGE); /* a request: without it the pages are 4 KiB, the same bytes */
#endif
    return a;
}

void fe_free_lazy(void *p, size_t nbytes) {
    if (!p) return;
    munmap(p, FE_ALIGN_UP(nbytes ? nbytes : 4096, 4096));
}

int fe_mul_size(uint64_t a, uint64_t b, uint64_t *out) {
    if (a != 0 && b > UINT64_MAX / a) return 0;
    *out = a * b;
    return 1;
}

int fe_add_size(uint64_t a, uint64_t b, uint64_t *out) {
    if (b > UINT64_MAX - a) return 0;
    *out = a + b;
    return 1;
}

/* Byte-at-a-time CRC-32 over the reflected polynomial 0xEDB88320; the table
 * is computed per call into a local array (1 KiB, ~2 µs), so there is no
 * global state and no start-up ordering to worry about. */
/* CRC-32 (IEEE, reflected). With ARMv8's CRC instructions, those; otherwise
 * eight bytes at a step ("slicing by 8": table k holds the CRC of a byte
 * followed by k zero bytes), about 4.5 times the speed of the byte-at-a-time
 * loop, which finishes the tail. The tables are built per call (about 2k
 * entries, a few microseconds): no global state. */
uint32_t fe_crc32(uint32_t crc, const void *data, size_t n) {
#if defined(__aarch64__) && defined(__ARM_FEATURE_CRC32)
    /* ARMv8's CRC32 instructions compute this very polynomial (Apple Silicon
     * always has them): eight bytes per instruction. */
    const uint8_t *q = (const uint8_t *)data;
    crc = ~crc;
    for (; n >= 8; n -= 8, q += 8) {
        uint64_t v;
        memcpy(&v, q, 8);
        crc = __crc32d(crc, v);
    }
    for (; n > 0; n--, q++) crc = __crc32b(crc, *q);
    return ~crc;
#else
    uint32_t t[8][256];
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        t[0][i] = c;
    }
    const uint8_t *p = (const uint8_t *)data;
    crc = ~crc;
    if (n >= 64) {
        for (uint32_t i = 0; i < 256; i++)
            for (int k = 1; k < 8; k++) t[k][i] = (t[k - 1][i] >> 8) ^ t[0][t[k - 1][i] & 0xFF];
        for (; n >= 8; n -= 8, p += 8) {
            uint32_t lo = crc ^ ((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24);
            uint32_t hi = (uint32_t)p[4] | (uint32_t)p[5] << 8 | (uint32_t)p[6] << 16 | (uint32_t)p[7] << 24;
            crc = t[7][lo & 0xFF] ^ t[6][(lo >> 8) & 0xFF] ^ t[5][(lo >> 16) & 0xFF] ^ t[4][lo >> 24] ^
                  t[3][hi & 0xFF] ^ t[2][(hi >> 8) & 0xFF] ^ t[1][(hi >> 16) & 0xFF] ^ t[0][hi >> 24];
        }
    }
    for (; n > 0; n--, p++) crc = t[0][(crc ^ *p) & 0xFF] ^ (crc >> 8);
    return ~crc;
#endif
}

ferry_status fe_pread_full(int fd, void *buf, size_t n, uint64_t offset,
                           const char *what, ferry_error *err) {
    size_t done = 0;
    while (done < n) {
        ssize_t r = pread(fd, (char *)buf + done, n - done, (off_t)(offset + done));
        if (r < 0) {
            if (errno == EINTR) continue;
            return fe_fail(err, FERRY_E_IO, "reading %s at byte %llu failed: %s", what,
                           (unsigned long long)(offset + done), strerror(errno));
        }
        if (r == 0)
            return fe_fail(err, FERRY_E_FORMAT,
                           "%s is truncated: wanted %zu bytes at byte %llu, the file ends after %zu",
                           what, n, (unsigned long long)offset, done);
        done += (size_t)r;
    }
    return FERRY_OK;
}
