/* common.h — small helpers shared by the core's source files. */
#ifndef FERRY_COMMON_H
#define FERRY_COMMON_H

#include <stddef.h>
#include <stdint.h>

#include "../include/ferry.h"

/* Fill `err` (may be NULL) with a code and a printf-style message; returns code. */
ferry_status fe_fail(ferry_error *err, ferry_status code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Monotonic wall-clock seconds. */
double fe_now(void);

/* 64-byte aligned allocation, zero-filled; NULL on failure or overflow. */
void *fe_alloc(size_t nbytes);
/* 4096-byte aligned and sized allocation (direct I/O buffers), zero-filled. */
void *fe_alloc_pages(size_t nbytes);
void fe_free(void *p);
/* Page-aligned zero memory whose pages the OS provides on first touch (so a
 * KV cache costs RAM only for the positions written), or NULL; freed with
 * fe_free_lazy and the same size. */
void *fe_alloc_lazy(size_t nbytes);
void fe_free_lazy(void *p, size_t nbytes);
/* fe_alloc_lazy on FE_HUGE_PAGE boundaries, the OS asked for huge pages
 * where it gives them on request (Linux transparent huge pages, "madvise"
 * mode; elsewhere a plain lazy allocation): for the weights decode reads
 * every token, megabytes in sequence, where 4 KiB pages cost a TLB miss
 * and a restart of the hardware prefetcher every 4 KiB. Freed with
 * fe_free_lazy and the same size. */
#define FE_HUGE_PAGE ((size_t)2 << 20)
void *fe_alloc_huge(size_t nbytes);

/* size arithmetic that reports overflow: returns 0 and leaves *out alone on overflow. */
int fe_mul_size(uint64_t a, uint64_t b, uint64_t *out);
int fe_add_size(uint64_t a, uint64_t b, uint64_t *out);

/* CRC-32 (IEEE 802.3, the zlib one), continuing from `crc` (start with 0). */
uint32_t fe_crc32(uint32_t crc, const void *data, size_t n);

/* Read exactly n bytes at offset; a short read is an error. */
ferry_status fe_pread_full(int fd, void *buf, size_t n, uint64_t offset,
                           const char *what, ferry_error *err);

#define FE_ALIGN_UP(x, a) (((x) + ((a) - 1)) / (a) * (a))

#endif
