/* test_crc32.c — fe_crc32 against the bytewise definition of CRC-32, at
 * every length and alignment around the fast paths' thresholds, whole and
 * chained. Built natively and for aarch64 with the CRC extension (run under
 * qemu) by tests/engine/test_crc32.py. Prints "crc32 ok" and exits 0. */
#include <stdint.h>
#include <stdio.h>

#include "../src/common.h"

static uint32_t reference(const uint8_t *p, size_t n) {
    uint32_t c = 0xFFFFFFFFu;
    for (size_t i = 0; i < n; i++) {
        c ^= p[i];
        for (int k = 0; k < 8; k++) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
    }
    return ~c;
}

int main(void) {
    static uint8_t buf[1031];
    uint32_t seed = 12345;
    for (size_t i = 0; i < sizeof buf; i++) buf[i] = (uint8_t)((seed = seed * 1103515245u + 12345u) >> 16);
    int ok = fe_crc32(0, "123456789", 9) == 0xCBF43926u && fe_crc32(0, "", 0) == 0;
    for (size_t start = 0; start < 9; start++)
        for (size_t n = 0; start + n <= sizeof buf; n++) {
            uint32_t want = reference(buf + start, n);
            ok &= fe_crc32(0, buf + start, n) == want;
            ok &= fe_crc32(fe_crc32(0, buf + start, n / 3), buf + start + n / 3, n - n / 3) == want;
        }
    printf(ok ? "crc32 ok\n" : "crc32 WRONG\n");
    return ok ? 0 : 1;
}
