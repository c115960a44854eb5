/* fuzz_bank.c — libFuzzer target: the binary headers of an expert bank file
 * (the 4096-byte bank header, checked when a container opens) and of its
 * records (fe_bank_check_record, run on every expert read and by verify).
 *
 *   FERRY_FUZZ_CONTAINERS=DIR fuzz_bank [libFuzzer options]
 *
 * DIR is a real tiny MoE container; its first expert bank is copied into a
 * scratch mirror and damaged there for each input, then restored. An input is
 *
 *   byte 0      flags: bit 0 re-seals the bank header's CRC32 after the
 *               change, bit 1 re-seals the record's CRC32, bits 2..7 pick the
 *               expert whose record is changed
 *   bytes 1..128    replace the start of the bank header (fields end at 100)
 *   bytes 129..     replace the start of that expert's record
 *
 * Bytes the input does not reach keep the real file's values, so a one-byte
 * input is the undamaged bank. The re-sealing lets the fuzzer get past the
 * checksums to the field checks behind them. */
#include "fuzz_util.h"

#include "../include/ferry.h"
#include "../src/common.h"
#include "../src/container.h"

#define HEADER_SPAN 128

static char scratch[4096], bank_rel[FE_MAX_NAME], bank_path[8192];
static uint8_t orig_header[FE_BANK_HEADER_BYTES];
static uint8_t *orig_records, *record;
static uint32_t n_experts;
static uint64_t record_size;
static int bank_fd = -1;

static void cleanup(void) {
    if (bank_fd >= 0) close(bank_fd);
    free(orig_records);
    free(record);
    fz_remove_tree(scratch);
}

static void wr(const void *buf, size_t n, uint64_t at) {
    if (pwrite(bank_fd, buf, n, (off_t)at) != (ssize_t)n) fz_die("cannot write", bank_path);
}

static void rd32_put(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
    p[2] = (uint8_t)(v >> 16);
    p[3] = (uint8_t)(v >> 24);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    char dir[4096];
    if (!fz_env_item("FERRY_FUZZ_CONTAINERS", 0, dir, sizeof dir)) {
        fprintf(stderr, "fuzz_bank: set FERRY_FUZZ_CONTAINERS to a tiny MoE container\n");
        exit(2);
    }
    fe_container c;
    ferry_error err;
    if (fe_container_open(&c, dir, &err) != FERRY_OK) {
        fprintf(stderr, "fuzz_bank: %s does not open: %s\n", dir, err.message);
        exit(2);
    }
    for (int l = 0; l < c.hp.n_layers && !bank_rel[0]; l++) {
        if (c.banks[l].fd < 0) continue;
        snprintf(bank_rel, sizeof bank_rel, "%s", c.banks[l].rel);
        n_experts = c.banks[l].n_experts;
        record_size = c.banks[l].record_size;
    }
    fe_container_close(&c);
    if (!bank_rel[0]) {
        fprintf(stderr, "fuzz_bank: %s has no expert bank\n", dir);
        exit(2);
    }
    fz_scratch(scratch, sizeof scratch);
    const char *copy[] = {bank_rel, NULL};
    fz_mirror(dir, scratch, "", copy, 0);
    snprintf(bank_path, sizeof bank_path, "%s/%s", scratch, bank_rel);
    bank_fd = open(bank_path, O_RDWR);
    if (bank_fd < 0) fz_die("cannot open", bank_path);
    orig_records = malloc((size_t)(n_experts * record_size));
    record = malloc((size_t)record_size);
    if (!orig_records || !record) fz_die("out of memory", NULL);
    if (pread(bank_fd, orig_header, sizeof orig_header, 0) != (ssize_t)sizeof orig_header ||
        pread(bank_fd, orig_records, (size_t)(n_experts * record_size), FE_BANK_HEADER_BYTES) !=
            (ssize_t)(n_experts * record_size))
        fz_die("cannot read", bank_path);
    atexit(cleanup);
    return 0;
}

static void require_error(ferry_status s, const ferry_error *err) {
    if (s != FERRY_OK && (err->code != (int)s || err->message[0] == '\0')) {
        fprintf(stderr, "fuzz_bank: status %d came with code %d and message '%s'\n", s, err->code, err->message);
        abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size == 0) return 0;
    uint8_t flags = data[0];
    data++;
    size--;
    uint8_t header[FE_BANK_HEADER_BYTES];
    memcpy(header, orig_header, sizeof header);
    size_t hn = size < HEADER_SPAN ? size : HEADER_SPAN;
    memcpy(header, data, hn);
    if (flags & 1) rd32_put(header + 96, fe_crc32(0, header, 96));
    data += hn;
    size -= hn;
    uint32_t expert = (uint32_t)(flags >> 2) % n_experts;
    uint8_t *orig = orig_records + (size_t)expert * record_size;
    memcpy(record, orig, (size_t)record_size);
    size_t rn = size < record_size ? size : (size_t)record_size;
    memcpy(record, data, rn);
    uint32_t payload = (uint32_t)(record[28] | (record[29] << 8) | (record[30] << 16) | ((uint32_t)record[31] << 24));
    if ((flags & 2) && payload <= record_size - FE_RECORD_HEADER_BYTES)
        rd32_put(record + 56, fe_crc32(0, record + FE_RECORD_HEADER_BYTES, payload));
    uint64_t at = FE_BANK_HEADER_BYTES + (uint64_t)expert * record_size;
    wr(header, sizeof header, 0);
    wr(record, (size_t)record_size, at);

    /* The record check on its own, against the bank as the manifest and the
     * (possibly damaged) header describe it. */
    fe_container c;
    ferry_error err;
    ferry_status s = fe_container_open(&c, scratch, &err);
    require_error(s, &err);
    if (s == FERRY_OK) {
        for (int l = 0; l < c.hp.n_layers; l++) {
            const fe_bank *b = &c.banks[l];
            if (b->fd < 0 || strcmp(b->rel, bank_rel) != 0) continue;
            for (int crc = 0; crc < 2; crc++) {
                ferry_status own = fe_bank_check_record(b, expert, record, crc, &err);
                require_error(own, &err);
                /* Bytes that pass as this expert's record must be refused as
                 * another's. (Bytes refused here may well be another expert's
                 * genuine record, written to the wrong slot: that one must
                 * accept them.) */
                if (own == FERRY_OK && n_experts > 1 &&
                    fe_bank_check_record(b, (expert + 1) % n_experts, record, crc, &err) == FERRY_OK) {
                    fprintf(stderr, "fuzz_bank: a record passed as another expert's\n");
                    abort();
                }
            }
        }
        fe_container_close(&c);
    }
    /* And through the public API: open, evaluate with CRC checks, verify. */
    ferry_open_options opts;
    ferry_open_options_init(&opts);
    opts.n_threads = 1;
    opts.n_readers = 1;
    opts.n_ctx = 8;
    opts.verify_reads = 1;
    ferry_engine *e = NULL;
    s = ferry_engine_open(scratch, &opts, &e, &err);
    require_error(s, &err);
    if (s == FERRY_OK) {
        ferry_session *ses = NULL;
        if (ferry_session_new(e, 8, &ses, &err) == FERRY_OK) {
            int32_t tok[3] = {3, 5, 7};
            require_error(ferry_session_eval(ses, tok, 3, NULL, 0, &err), &err);
            ferry_session_free(ses);
        }
        ferry_engine_close(e);
    }
    require_error(ferry_verify(scratch, NULL, NULL, &err), &err);

    wr(orig_header, sizeof orig_header, 0);
    wr(orig, (size_t)record_size, at);
    return 0;
}
