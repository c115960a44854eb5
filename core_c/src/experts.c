/* experts.c — expert records for the forward pass (see experts.h). This
 * version reads each requested record synchronously into the session's one
 * record buffer. */
#define _POSIX_C_SOURCE 200809L
#include "experts.h"

#include "container.h"
#include "formats.h"
#include "model.h"

ferry_status fe_expert_get(ferry_session *s, int layer, int expert, const uint8_t **record, ferry_error *err) {
    const fe_bank *bk = &s->e->c.banks[layer];
    double t0 = fe_now();
    uint64_t at = FE_BANK_HEADER_BYTES + (uint64_t)expert * bk->record_size;
    ferry_status st = fe_pread_full(bk->fd, s->expert_buf, bk->record_size, at, bk->rel, err);
    s->stats.read_seconds += fe_now() - t0;
    if (st) return st;
    s->stats.expert_reads++;
    s->stats.misses++;
    s->stats.bytes_read += bk->record_size;
    st = fe_bank_check_record(bk, (uint32_t)expert, s->expert_buf, s->e->opts.verify_reads, err);
    if (st) return st;
    *record = s->expert_buf;
    return FERRY_OK;
}

fe_mat fe_expert_mat(const fe_bank *b, int part, const uint8_t *record) {
    const fe_expert_part *p = &b->part[part];
    return fe_mat_view(record + p->offset, p->fmt, (int)p->rows, (int)p->cols);
}
