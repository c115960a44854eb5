/* experts.h — how a forward pass gets an expert's weights.
 *
 * A forward pass asks for the record of (layer, expert) and gets a pointer to
 * its bytes in RAM, valid until the next fe_expert_get on the same session.
 * Where the bytes come from (a synchronous read now; the expert cache,
 * reader threads and lookahead prefetch of the streaming engine later) is
 * this module's business alone: placement may change speed, never output. */
#ifndef FERRY_EXPERTS_H
#define FERRY_EXPERTS_H

#include "common.h"
#include "ops.h"

struct ferry_session;
struct fe_bank;

ferry_status fe_expert_get(struct ferry_session *s, int layer, int expert, const uint8_t **record,
                           ferry_error *err);

/* Matrix `part` (0 gate, 1 up, 2 down) of a record of bank b. */
fe_mat fe_expert_mat(const struct fe_bank *b, int part, const uint8_t *record);

#endif
