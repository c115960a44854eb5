/* experts.h — how a forward pass gets expert weights: the expert cache.
 *
 * The engine owns a cache of expert records (equal-sized, 4096-aligned
 * buffers) under the RAM budget, a replacement policy (cache_policy.h), and
 * reader threads (io.h) that read misses with direct I/O while the forward
 * pass computes. The lookahead router's predictions are read straight into
 * cache slots the policy gives up, so a right guess is a plain hit.
 *
 * A forward pass uses it one layer visit at a time:
 *
 *     fe_experts_begin(s, layer, ids, n);        // hits resolved, misses queued
 *     fe_experts_prefetch(s, next_layer, predicted, k);   // optional, while open
 *     while (fe_experts_next(s, &i, &rec) == FERRY_OK && i >= 0)
 *         compute expert ids[i] from rec;         // in the order records land
 *     fe_experts_end(s);
 *
 * Placement may change speed, never output: every record handed out is the
 * record of the expert asked for, checked, whatever buffer it sits in. */
#ifndef FERRY_EXPERTS_H
#define FERRY_EXPERTS_H

#include "common.h"
#include "ops.h"

struct ferry_session;
struct ferry_engine;
struct fe_bank;
typedef struct fe_ecache fe_ecache;

/* Sizing, decided by the engine from its budget. */
typedef struct fe_ecache_config {
    int n_slots;          /* cached records */
    int n_readers;        /* reader threads */
    int flags;            /* FERRY_NO_* */
    int verify_reads;     /* check each record's CRC */
} fe_ecache_config;

ferry_status fe_ecache_new(struct ferry_engine *e, const fe_ecache_config *cfg, fe_ecache **out, ferry_error *err);
void fe_ecache_free(fe_ecache *c);
int fe_ecache_direct_io(const fe_ecache *c, char *note, size_t note_len);
/* The readers' own work, for a session's pool to watch (pool.h), or NULL. */
const struct fe_own_work *fe_ecache_own_work(const fe_ecache *c);
/* Most distinct experts one visit may ask for (the cache's slot count). */
int fe_experts_max_visit(const struct ferry_session *s);
ferry_status fe_ecache_usage(const fe_ecache *c, uint32_t *counts, size_t n, ferry_error *err);
/* The policy's learned state (ferry_engine_policy_state). */
ferry_status fe_ecache_policy_state(const fe_ecache *c, void *buf, size_t n, size_t *size, ferry_error *err);

/* Open a visit of `layer` asking for n distinct experts (n <= max_visit). */
ferry_status fe_experts_begin(struct ferry_session *s, int layer, const int *ids, int n, ferry_error *err);
/* The next record ready to compute: *which indexes ids, or -1 when all were
 * handed out. On an error the visit must still be ended. */
ferry_status fe_experts_next(struct ferry_session *s, int *which, const uint8_t **record, ferry_error *err);
/* Has every record of the open visit landed (next hands each out without waiting)? */
int fe_experts_all_landed(struct ferry_session *s);
/* Has a record of the open visit not handed out yet landed (next hands it out without waiting)? */
int fe_experts_any_landed(struct ferry_session *s);
/* Close the visit; waits for any read still in flight. */
void fe_experts_end(struct ferry_session *s);
/* Hint, during an open visit of another layer: the next visit of `layer`
 * will likely ask for these experts; the cache starts reading them. */
void fe_experts_prefetch(struct ferry_session *s, int layer, const int *ids, int n);

/* Is the record of (layer, expert) in RAM or already being read into it? */
int fe_experts_cached(const struct ferry_session *s, int layer, int expert);
/* Should the lookahead of `layer` run this decode step? No when the
 * lookahead is off, or idle there (it had nothing to read lately) and this
 * is not a probe step: counted in stats.lookahead_skipped. */
int fe_experts_lookahead_wanted(struct ferry_session *s, int layer);
/* Are misses read while the compute goes on (not FERRY_NO_OVERLAP)? */
int fe_experts_overlap_on(const struct ferry_session *s);
/* The lookahead gate's running precision per [layer][rank] (n_layers * top_k floats). */
void fe_ecache_lookahead_gate(const fe_ecache *c, float *precision);

/* One expert as a visit of its own: *record stays valid until the next call
 * into the cache on this session. Simple, but nothing overlaps. */
ferry_status fe_expert_get(struct ferry_session *s, int layer, int expert, const uint8_t **record,
                           ferry_error *err);

/* Matrix `part` (0 gate, 1 up, 2 down) of a record of bank b. */
fe_mat fe_expert_mat(const struct fe_bank *b, int part, const uint8_t *record);

#endif
