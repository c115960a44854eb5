/* verify.c — ferry_verify: check every stored checksum of a container. */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "container.h"

#define VERIFY_CHUNK (4u << 20)

static ferry_status crc_range(int fd, uint64_t offset, uint64_t n, uint8_t *buf, const char *what,
                              uint32_t *crc, ferry_error *err) {
    *crc = 0;
    while (n > 0) {
        size_t m = n < VERIFY_CHUNK ? (size_t)n : VERIFY_CHUNK;
        ferry_status s = fe_pread_full(fd, buf, m, offset, what, err);
        if (s) return s;
        *crc = fe_crc32(*crc, buf, m);
        offset += m;
        n -= m;
    }
    return FERRY_OK;
}

static ferry_status verify_trunk(const fe_container *c, uint8_t *buf, ferry_progress_fn progress, void *user,
                                 uint64_t *done, uint64_t total, ferry_error *err) {
    int fd;
    ferry_status s = fe_container_open_file(c->dir, "trunk.bin", NULL, &fd, err);
    if (s) return s;
    for (int i = 0; i < c->n_tensors && !s; i++) {
        const fe_tensor *t = &c->tensors[i];
        uint32_t crc;
        s = crc_range(fd, t->offset, t->nbytes, buf, "trunk.bin", &crc, err);
        if (!s && crc != t->crc32)
            s = fe_fail(err, FERRY_E_CHECKSUM,
                        "trunk.bin: tensor %s (bytes %llu..%llu) is damaged: CRC32 %08x, expected %08x", t->name,
                        (unsigned long long)t->offset, (unsigned long long)(t->offset + t->nbytes), crc, t->crc32);
        ++*done;
        if (!s && progress && progress(user, *done, total)) s = fe_fail(err, FERRY_E_CANCELLED, "verification stopped");
    }
    close(fd);
    return s;
}

static ferry_status verify_bank(const fe_bank *b, uint8_t *buf, ferry_progress_fn progress, void *user,
                                uint64_t *done, uint64_t total, ferry_error *err) {
    for (uint32_t e = 0; e < b->n_experts; e++) {
        uint64_t at = FE_BANK_HEADER_BYTES + (uint64_t)e * b->record_size;
        ferry_status s = fe_pread_full(b->fd, buf, b->record_size, at, b->rel, err);
        if (!s) s = fe_bank_check_record(b, e, buf, 1, err);
        if (s) return s;
        ++*done;
        if (progress && progress(user, *done, total)) return fe_fail(err, FERRY_E_CANCELLED, "verification stopped");
    }
    return FERRY_OK;
}

ferry_status ferry_verify(const char *path, ferry_progress_fn progress, void *user, ferry_error *err) {
    if (err) { err->code = FERRY_OK; err->message[0] = '\0'; }
    fe_container c;
    ferry_status s = fe_container_open(&c, path, err);
    if (s) return s;
    uint64_t total = (uint64_t)c.n_tensors, done = 0, biggest = VERIFY_CHUNK;
    for (int l = 0; l < c.hp.n_layers; l++) {
        total += c.banks[l].n_experts;
        if (c.banks[l].record_size > biggest) biggest = c.banks[l].record_size;
    }
    uint8_t *buf = fe_alloc(biggest);
    if (!buf) s = fe_fail(err, FERRY_E_NOMEM, "out of memory");
    if (!s) s = verify_trunk(&c, buf, progress, user, &done, total, err);
    for (int l = 0; l < c.hp.n_layers && !s; l++)
        if (c.banks[l].fd >= 0) s = verify_bank(&c.banks[l], buf, progress, user, &done, total, err);
    fe_free(buf);
    fe_container_close(&c);
    return s;
}
