/* experts.c — the expert cache (see experts.h). */
#define _POSIX_C_SOURCE 200809L
#include "experts.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../include/ferry.h"
#include "cache_policy.h"
#include "container.h"
#include "io.h"
#include "pool.h"
#include "model.h"

/* The open visit: arrays of n_slots entries. */
typedef struct visit {
    int *ids;         /* experts asked for */
    int *slot;        /* where each is (or will be) */
    uint8_t *ready;   /* its slot holds its checked record */
    uint8_t *given;   /* handed out already */
} visit;

struct fe_ecache {
    struct ferry_engine *e;   /* the engine (borrowed) */
    fe_ecache_config cfg;     /* sizes and switches */
    fe_cache_policy *policy;  /* which slot holds what, and what to evict */
    uint8_t **slot_buf;       /* n_slots record buffers, slot_stride apart in slot_mem */
    uint8_t *slot_mem;        /* one huge-page allocation (fe_alloc_huge) of n_slots x slot_stride bytes */
    size_t slot_stride;       /* the largest record rounded up to 4 KiB (direct reads) */
    uint8_t *slot_valid;      /* the slot's bytes are the checked record the policy says it holds */
    uint8_t *slot_prefetched; /* filled by the lookahead and not yet requested */
    fe_io_job *slot_job;      /* a read into each slot; job.buf != NULL while in flight */
    int *record_fd;           /* per layer: the fd records are read through (-1 dense) */
    int direct;               /* record fds bypass the page cache */
    char io_note[160];        /* why they do not, when they do not */
    fe_io *io;                /* reader threads */
    int lookahead;            /* the policy supports prefetching and it is not switched off */
    int *predicted;           /* [n_layers][top_k]: last lookahead per layer */
    int *n_predicted;         /* [n_layers] */
    uint8_t *predicted_cold;  /* [n_layers][top_k]: that prediction was not cached when made */
    float *gate;              /* [n_layers][top_k]: per layer and lookahead rank, the running share of
                                 cold predictions the real router then chose (the lookahead gate) */
    int gated;                /* reads are gated (not FERRY_NO_LOOKAHEAD_GATE) */
    int *idle;                /* [n_layers]: the layer's lookaheads running that had nothing to read (every
                                 prediction in RAM, landing or gated), reset by a decode miss there */
    int *probe;               /* [n_layers]: decode steps since an idle layer's lookahead last ran */
    int layer;                /* the open visit's layer, -1 when none is open */
    int n;                    /* experts it asked for */
    visit visit;              /* its bookkeeping */
    void *visit_mem;          /* the one allocation behind visit's arrays */
};

/* The lookahead gate. A prediction that is not cached costs a read and an
 * evicted record; it pays only when the real router then chooses it. How
 * often that happens differs between layers (some layers' routing follows
 * the residual closely, others' does not) and between the ranks of one
 * prediction (the lookahead's first choice is right far more often than its
 * k-th). So each (layer, rank) keeps its own running precision: the share of
 * its cold predictions the real router then chose. A cold prediction is read
 * only while its (layer, rank) precision is at least LOOKAHEAD_MIN; a layer
 * with a reliable head and a noisy tail reads its first few choices, a layer
 * that predicts poorly reads none. The lookahead keeps predicting and
 * scoring every step either way (the router's product, no read), so a layer
 * whose routing becomes predictable opens again: probing costs no I/O. */
#define LOOKAHEAD_PRIOR 0.4f    /* before any is measured: closed until right twice running */
#define LOOKAHEAD_MIN 0.5f      /* read a prediction only at or above this running precision */
#define LOOKAHEAD_DECAY 0.9f    /* weight of the past in the running precision */

/* An idle lookahead. When a layer's lookahead has had nothing to read
 * LOOKAHEAD_IDLE times running (every prediction already in RAM or landing,
 * or left unread by the gate: the cache holds what the routing keeps
 * choosing there, the common case when the cache is most of the model, or
 * the layer predicts poorly), its router product buys nothing; it then runs
 * only every LOOKAHEAD_PROBE-th decode step of that layer, as a probe (which
 * also scores the gate), until a probe finds a prediction to read or a
 * decode visit of the layer misses, when it runs every step again. On the 16-layer Qwen3-30B-A3B-shaped file at
 * 50 % of its size that is 15 router products (16 MB of f32 rows and 15 pool
 * jobs) a token. Reads only, so output never changes. */
#define LOOKAHEAD_IDLE 4
#define LOOKAHEAD_PROBE 8

/* ---------------------------------------------------------------- setup */

static uint64_t record_offset(const fe_bank *b, int expert) {
    return FE_BANK_HEADER_BYTES + (uint64_t)expert * b->record_size;
}

static ferry_status open_record_fds(fe_ecache *c, ferry_error *err) {
    const fe_container *ct = &c->e->c;
    c->direct = 1;
    for (int l = 0; l < ct->hp.n_layers; l++) {
        const fe_bank *b = &ct->banks[l];
        if (b->fd < 0) continue;
        int direct = 0;
        char why[160];
        c->record_fd[l] = fe_io_open_records(b->path, record_offset(b, 0), b->record_size,
                                             !(c->cfg.flags & FERRY_NO_DIRECT_IO), &direct, why, sizeof why);
        if (c->record_fd[l] < 0)
            return fe_fail(err, FERRY_E_IO, "cannot open %s for reading records: %s", b->rel, strerror(errno));
        struct stat a, o;   /* the file checked when the container was opened, not one swapped in since */
        if (fstat(c->record_fd[l], &a) != 0 || fstat(b->fd, &o) != 0 || a.st_dev != o.st_dev || a.st_ino != o.st_ino)
            return fe_fail(err, FERRY_E_IO, "%s changed while the model was opened", b->rel);
        fcntl(c->record_fd[l], F_SETFL, fcntl(c->record_fd[l], F_GETFL) & ~O_NONBLOCK);
        if (!direct && c->direct) snprintf(c->io_note, sizeof c->io_note, "%s", why);
        c->direct &= direct;
    }
    return FERRY_OK;
}

static void fill(fe_ecache *c);

ferry_status fe_ecache_new(ferry_engine *e, const fe_ecache_config *cfg, fe_ecache **out, ferry_error *err) {
    const fe_hparams *hp = &e->c.hp;
    *out = NULL;
    fe_ecache *c = calloc(1, sizeof *c);
    if (!c) return fe_fail(err, FERRY_E_NOMEM, "out of memory");
    c->e = e;
    c->cfg = *cfg;
    c->layer = -1;
    const int n = cfg->n_slots;
    const uint64_t rec = fe_max_record(&e->c);
    c->slot_buf = calloc((size_t)n, sizeof *c->slot_buf);
    c->slot_valid = calloc((size_t)n, 1);
    c->slot_prefetched = calloc((size_t)n, 1);
    c->slot_job = calloc((size_t)n, sizeof *c->slot_job);
    c->visit_mem = calloc((size_t)n, 2 * sizeof(int) + 2);
    c->record_fd = malloc((size_t)hp->n_layers * sizeof *c->record_fd);
    c->predicted = calloc((size_t)hp->n_layers * (size_t)(hp->top_k > 0 ? hp->top_k : 1), sizeof(int));
    c->n_predicted = calloc((size_t)hp->n_layers, sizeof(int));
    c->predicted_cold = calloc((size_t)hp->n_layers * (size_t)(hp->top_k > 0 ? hp->top_k : 1), 1);
    c->gate = malloc((size_t)hp->n_layers * (size_t)(hp->top_k > 0 ? hp->top_k : 1) * sizeof(float));
    c->idle = calloc((size_t)hp->n_layers, sizeof(int));
    c->probe = calloc((size_t)hp->n_layers, sizeof(int));
    if (!c->idle || !c->probe || !c->predicted_cold || !c->gate || !c->slot_buf || !c->slot_valid || !c->slot_prefetched || !c->slot_job || !c->visit_mem || !c->record_fd ||
        !c->predicted || !c->n_predicted) {
        fe_ecache_free(c);
        return fe_fail(err, FERRY_E_NOMEM, "out of memory for the expert cache");
    }
    visit *v = &c->visit;
    v->ids = c->visit_mem;
    v->slot = v->ids + n;
    v->ready = (uint8_t *)(v->slot + n);
    v->given = v->ready + n;
    for (int l = 0; l < hp->n_layers; l++) c->record_fd[l] = -1;
    c->slot_stride = FE_ALIGN_UP((size_t)rec, 4096);
    if (n > 0 && (c->slot_stride > SIZE_MAX / (size_t)n || !(c->slot_mem = fe_alloc_huge(c->slot_stride * (size_t)n)))) {
        fe_ecache_free(c);
        return fe_fail(err, FERRY_E_NOMEM, "cannot allocate %d expert cache slots of %llu bytes", n,
                       (unsigned long long)rec);
    }
    for (int i = 0; i < n; i++) c->slot_buf[i] = c->slot_mem + (size_t)i * c->slot_stride;
    int perr = 0;
    c->policy = fe_cache_policy_create(n, hp->n_layers, hp->n_experts, FERRY_CACHE_POLICY_ENGINE, &perr);
    if (!c->policy) {
        fe_ecache_free(c);
        return fe_fail(err, FERRY_E_NOMEM, "cannot create the cache policy (%d)", perr);
    }
    if (e->opts.usage_counts &&
        fe_cache_policy_load_counts(c->policy, e->opts.usage_counts, e->opts.n_usage_counts) != 0) {
        fe_ecache_free(c);
        return fe_fail(err, FERRY_E_ARG, "the usage counts do not fit this model (%zu given, %d expected)",
                       e->opts.n_usage_counts, hp->n_layers * hp->n_experts);
    }
    if (e->opts.policy_state &&
        fe_cache_policy_load_state(c->policy, e->opts.policy_state, e->opts.n_policy_state) != 0) {
        fe_ecache_free(c);
        return fe_fail(err, FERRY_E_ARG,
                       "the cache policy state (%zu bytes) does not fit this model or is damaged",
                       e->opts.n_policy_state);
    }
    c->lookahead = !(cfg->flags & (FERRY_NO_LOOKAHEAD | FERRY_NO_OVERLAP));
    c->gated = !(cfg->flags & FERRY_NO_LOOKAHEAD_GATE);
    for (int i = 0; i < hp->n_layers * (hp->top_k > 0 ? hp->top_k : 1); i++) c->gate[i] = LOOKAHEAD_PRIOR;
    ferry_status st = open_record_fds(c, err);
    if (!st && !(c->io = fe_io_new(cfg->n_readers > 0 ? cfg->n_readers : 1)))
        st = fe_fail(err, FERRY_E_NOMEM, "cannot start reader threads");
    if (st) {
        fe_ecache_free(c);
        return st;
    }
    fill(c);
    *out = c;
    return FERRY_OK;
}

/* Wait for a slot's read if one is in flight (its buffer is about to be reused). */
static void quiesce(fe_ecache *c, int slot) {
    if (c->slot_job[slot].buf) {
        fe_io_wait(c->io, &c->slot_job[slot]);
        c->slot_job[slot].buf = NULL;
    }
}

void fe_ecache_free(fe_ecache *c) {
    if (!c) return;
    if (c->io)
        for (int i = 0; i < c->cfg.n_slots; i++) { /* a fill still queued is taken back, not waited for */
            if (c->slot_job[i].buf && fe_io_cancel(c->io, &c->slot_job[i])) c->slot_job[i].buf = NULL;
            quiesce(c, i);
        }
    fe_io_free(c->io);
    if (c->record_fd)
        for (int l = 0; l < c->e->c.hp.n_layers; l++)
            if (c->record_fd[l] >= 0) close(c->record_fd[l]);
    if (c->slot_mem) fe_free_lazy(c->slot_mem, c->slot_stride * (size_t)c->cfg.n_slots);
    fe_cache_policy_destroy(c->policy);
    free(c->slot_buf);
    free(c->slot_valid);
    free(c->slot_prefetched);
    free(c->slot_job);
    free(c->visit_mem);
    free(c->record_fd);
    free(c->predicted);
    free(c->n_predicted);
    free(c->predicted_cold);
    free(c->gate);
    free(c->idle);
    free(c->probe);
    free(c);
}

const fe_own_work *fe_ecache_own_work(const fe_ecache *c) { return c && c->io ? fe_io_own_work(c->io) : NULL; }

int fe_ecache_direct_io(const fe_ecache *c, char *note, size_t note_len) {
    snprintf(note, note_len, "%s", c->io_note);
    return c->direct;
}

int fe_experts_max_visit(const ferry_session *s) { return s->e->cache->cfg.n_slots; }

ferry_status fe_ecache_usage(const fe_ecache *c, uint32_t *counts, size_t n, ferry_error *err) {
    if (fe_cache_policy_save_counts(c->policy, counts, n) != 0)
        return fe_fail(err, FERRY_E_ARG, "usage counts need %d entries", c->e->c.hp.n_layers * c->e->c.hp.n_experts);
    return FERRY_OK;
}

ferry_status fe_ecache_policy_state(const fe_ecache *c, void *buf, size_t n, size_t *size, ferry_error *err) {
    size_t need = (size_t)fe_cache_policy_state_bytes(c->policy);
    if (size) *size = need;
    if (!buf) return FERRY_OK;
    if (fe_cache_policy_save_state(c->policy, buf, n) != 0)
        return fe_fail(err, FERRY_E_ARG, "the cache policy state needs %zu bytes (%zu given)", need, n);
    return FERRY_OK;
}

/* ---------------------------------------------------------------- reads */

/* Start reading (layer, expert) into `slot`; urgent (1) when the compute
 * waits for it, 0 for a prefetch, FE_IO_BACKGROUND for the fill (io.h). */
static void submit(fe_ecache *c, int slot, int layer, int expert, int urgent) {
    const fe_bank *b = &c->e->c.banks[layer];
    fe_io_job *job = &c->slot_job[slot];
    job->fd = c->record_fd[layer];
    job->buf = c->slot_buf[slot];
    job->size = b->record_size;
    job->offset = record_offset(b, expert);
    job->crc_from = FE_RECORD_HEADER_BYTES; /* --verify-reads: the reader computes the payload's CRC */
    job->crc_len = c->cfg.verify_reads ? b->payload_size : 0;
    fe_io_submit(c->io, job, urgent);
}

/* The fill. When the cache holds every expert of the model (the budget
 * allows it; the default when the model fits in RAM), every record is queued
 * for reading as soon as the cache exists, layer by layer in file order (the
 * order a forward pass first needs them), behind any read a visit waits for
 * and as background reads (io.h: one sequential stream that pauses while
 * such a read runs): the banks stream in while the caller goes on, and a visit finds each record resident or landing (its read is then
 * promoted), never a miss. A filled slot is checked, accounted and marked
 * valid when a visit first settles it, exactly as a read on demand; so the
 * fill changes when bytes arrive, never which bytes a product reads. Off
 * with FERRY_NO_CACHE or FERRY_NO_OVERLAP (nothing overlaps there) and when
 * the cache is smaller than the model (what to keep is the policy's call).
 * A filled cache runs no lookahead (nothing to read ahead). */
static void fill(fe_ecache *c) {
    const fe_container *ct = &c->e->c;
    if (c->cfg.flags & (FERRY_NO_CACHE | FERRY_NO_OVERLAP | FERRY_NO_FILL)) return;
    long records = 0;
    for (int l = 0; l < ct->hp.n_layers; l++)
        if (c->record_fd[l] >= 0) records += ct->banks[l].n_experts;
    if (records > c->cfg.n_slots) return;
    for (int l = 0; l < ct->hp.n_layers; l++) {
        if (c->record_fd[l] < 0) continue;
        for (int x = 0; x < (int)ct->banks[l].n_experts; x++) {
            int already = 0;
            int slot = fe_cache_policy_preload(c->policy, l, x, &already);
            if (slot < 0) return; /* cannot happen when everything fits: the fill just stops */
            if (already) continue;
            submit(c, slot, l, x, FE_IO_BACKGROUND);
        }
    }
    /* Every expert is resident or landing: the lookahead has nothing to read,
     * so its router product (one per MoE layer and decode step) is not run. */
    c->lookahead = 0;
}

/* A record read from the disk, in the session's counters: every one counts,
 * an unused lookahead's too (reuse_slot). */
static void count_read(ferry_session *s, const fe_io_job *job) {
    s->stats.read_seconds += job->seconds;
    s->stats.bytes_read += job->got;
    s->stats.expert_reads++;
}

/* The compute waited since t0 for the readers: a stall, and for the pool a
 * time the caller slept outside it (not a thread short of CPU). */
static void stalled(ferry_session *s, double t0) {
    const double dt = fe_now() - t0;
    s->stats.stall_seconds += dt;
    fe_pool_caller_slept(s->pool, (int64_t)(dt * 1e9));
}

/* Wait for a slot's read, account it, and check the record it brought. */
static ferry_status finish_read(ferry_session *s, int slot, int layer, int expert, ferry_error *err) {
    fe_ecache *c = s->e->cache;
    fe_io_job *job = &c->slot_job[slot];
    double t0 = fe_now();
    fe_io_wait(c->io, job);
    stalled(s, t0);
    job->buf = NULL;
    const fe_bank *b = &s->e->c.banks[layer];
    count_read(s, job);
    if (job->err_no > 0)
        return fe_fail(err, FERRY_E_IO, "reading expert %d of layer %d from %s failed: %s", expert, layer, b->rel,
                       strerror(job->err_no));
    if (job->err_no < 0)
        return fe_fail(err, FERRY_E_IO,
                       "reading expert %d of layer %d from %s returned %llu of %llu bytes (the file was cut short?)",
                       expert, layer, b->rel, (unsigned long long)job->got, (unsigned long long)job->size);
    ferry_status st = fe_bank_check_record(b, (uint32_t)expert, c->slot_buf[slot], 0, err);
    if (!st && c->cfg.verify_reads) st = fe_bank_check_crc(b, (uint32_t)expert, c->slot_buf[slot], job->crc, err);
    return st;
}

/* A slot is being given to another key: a read still queued into it is taken
 * back, one already running is waited for (as a stall); a lookahead that was
 * never used is accounted, and so is its read when it was not taken back
 * (it came from the disk: expert_reads and bytes_read count every record
 * read, the unused lookaheads' too). */
static void reuse_slot(ferry_session *s, int slot) {
    fe_ecache *c = s->e->cache;
    fe_io_job *job = &c->slot_job[slot];
    if (job->buf && fe_io_cancel(c->io, job)) job->buf = NULL;
    const int was_read = job->buf != NULL && c->slot_prefetched[slot];
    double t0 = fe_now();
    quiesce(c, slot);
    stalled(s, t0);
    if (was_read) count_read(s, job);
    if (c->slot_prefetched[slot]) s->stats.prefetch_wasted++;
    c->slot_prefetched[slot] = 0;
    c->slot_valid[slot] = 0;
}

/* ---------------------------------------------------------------- visits */

static void score_lookahead(ferry_session *s, int layer, const int *ids, int n) {
    fe_ecache *c = s->e->cache;
    int k = s->e->c.hp.top_k, np = c->n_predicted[layer];
    if (!np) return;
    int correct = 0;
    for (int i = 0; i < np; i++) {
        int chosen = 0;
        for (int j = 0; j < n && !chosen; j++) chosen = c->predicted[layer * k + i] == ids[j];
        correct += chosen;
        if (c->predicted_cold[layer * k + i]) { /* what a read of it would have bought */
            float *g = &c->gate[layer * k + i];
            *g = LOOKAHEAD_DECAY * *g + (1.0f - LOOKAHEAD_DECAY) * (float)chosen;
        }
    }
    s->stats.lookahead_predicted += (uint64_t)np;
    s->stats.lookahead_correct += (uint64_t)correct;
    c->n_predicted[layer] = 0;
}

ferry_status fe_experts_begin(ferry_session *s, int layer, const int *ids, int n, ferry_error *err) {
    fe_ecache *c = s->e->cache;
    visit *v = &c->visit;
    if (n < 1 || n > c->cfg.n_slots || c->layer >= 0)
        return fe_fail(err, FERRY_E_ARG, "bad expert visit (%d experts, %d slots)", n, c->cfg.n_slots);
    fe_cache_counters before, after;
    fe_cache_policy_counters(c->policy, &before);
    if (fe_cache_policy_begin_layer(c->policy, layer, (const int32_t *)ids, n) != 0)
        return fe_fail(err, FERRY_E_ARG, "the cache refused a visit of layer %d", layer);
    c->layer = layer;
    c->n = n;
    score_lookahead(s, layer, ids, n);
    const int overlap = !(c->cfg.flags & FERRY_NO_OVERLAP);
    for (int i = 0; i < n; i++) {
        int e = ids[i];
        v->ids[i] = e;
        v->given[i] = 0;
        int slot = fe_cache_policy_lookup(c->policy, layer, e);
        if (slot >= 0) {
            if (c->slot_prefetched[slot]) { /* the lookahead was right */
                s->stats.prefetch_used++;
                c->slot_prefetched[slot] = 0;
            }
            v->slot[i] = slot;
            v->ready[i] = c->slot_valid[slot];
            if (c->slot_job[slot].buf) fe_io_promote(c->io, &c->slot_job[slot]); /* still landing */
            else if (!c->slot_valid[slot] && overlap) submit(c, slot, layer, e, 1); /* a failed read: again */
            continue;
        }
        slot = fe_cache_policy_choose_victim(c->policy, NULL, NULL);
        if (slot < 0 || fe_cache_policy_insert(c->policy, layer, e, slot) != 0) {
            fe_experts_end(s);
            return fe_fail(err, FERRY_E_ARG, "the expert cache has no free slot (layer %d)", layer);
        }
        reuse_slot(s, slot);
        v->slot[i] = slot;
        v->ready[i] = 0;
        if (overlap) submit(c, slot, layer, e, 1);
    }
    fe_cache_policy_counters(c->policy, &after);
    uint64_t hits = after.hits - before.hits, misses = after.misses - before.misses;
    s->stats.hits += hits;
    s->stats.misses += misses;
    if (s->decoding) { s->stats.decode_hits += hits; s->stats.decode_misses += misses; }
    if (s->decoding && misses) c->idle[layer] = 0; /* a lookahead would have had something to read */
    return FERRY_OK;
}

/* Can item i be handed out without waiting? */
static int landed(fe_ecache *c, int i) {
    const visit *v = &c->visit;
    if (v->ready[i]) return 1;
    const fe_io_job *job = &c->slot_job[v->slot[i]];
    return job->buf && fe_io_is_done(c->io, (fe_io_job *)job);
}

int fe_experts_all_landed(ferry_session *s) {
    fe_ecache *c = s->e->cache;
    for (int i = 0; i < c->n; i++)
        if (!c->visit.given[i] && !landed(c, i)) return 0;
    return 1;
}

int fe_experts_any_landed(ferry_session *s) {
    fe_ecache *c = s->e->cache;
    for (int i = 0; i < c->n; i++)
        if (!c->visit.given[i] && landed(c, i)) return 1;
    return 0;
}

/* Bring item i's record into its slot (reading or waiting as needed) and check it. */
static ferry_status settle(ferry_session *s, int i, ferry_error *err) {
    fe_ecache *c = s->e->cache;
    visit *v = &c->visit;
    if (v->ready[i]) return FERRY_OK;
    int slot = v->slot[i];
    if (!c->slot_job[slot].buf) submit(c, slot, c->layer, v->ids[i], 1); /* no overlap: read now */
    ferry_status st = finish_read(s, slot, c->layer, v->ids[i], err);
    if (!st) v->ready[i] = c->slot_valid[slot] = 1;
    return st;
}

/* Nothing of the visit has landed: wait for whichever of its reads lands
 * first (they run concurrently and finish in any order; waiting for the
 * first in visiting order left a landed record idle behind a slower read).
 * Returns its index, or -1 when none of the visit's records has a read in
 * flight. The wait is a stall, as in finish_read. */
static int wait_landed(ferry_session *s) {
    fe_ecache *c = s->e->cache;
    const visit *v = &c->visit;
    double t0 = fe_now();
    int pick = -1;
    while (pick < 0) {
        unsigned seen = fe_io_completions(c->io);
        int in_flight = 0;
        for (int i = 0; i < c->n && pick < 0; i++) {
            if (v->given[i]) continue;
            if (landed(c, i)) pick = i;
            else in_flight += c->slot_job[v->slot[i]].buf != NULL;
        }
        if (pick >= 0 || !in_flight) break;
        fe_io_wait_any(c->io, &seen);
    }
    stalled(s, t0);
    return pick;
}

ferry_status fe_experts_next(ferry_session *s, int *which, const uint8_t **record, ferry_error *err) {
    fe_ecache *c = s->e->cache;
    visit *v = &c->visit;
    const int overlap = !(c->cfg.flags & FERRY_NO_OVERLAP);
    *which = -1;
    int pick = -1, first = -1;
    for (int i = 0; i < c->n && pick < 0; i++) {
        if (v->given[i]) continue;
        if (first < 0) first = i;
        if (!overlap || landed(c, i)) pick = i;
    }
    if (first < 0) return FERRY_OK;     /* every record was handed out */
    if (pick < 0 && overlap) pick = wait_landed(s);
    if (pick < 0) pick = first;         /* no read in flight: read the first, in order */
    v->given[pick] = 1;
    ferry_status st = settle(s, pick, err);
    if (st) return st;
    *which = pick;
    *record = c->slot_buf[v->slot[pick]];
    return FERRY_OK;
}

void fe_experts_end(ferry_session *s) {
    fe_ecache *c = s->e->cache;
    if (c->layer < 0) return;
    visit *v = &c->visit;
    for (int i = 0; i < c->n; i++) {
        int slot = v->slot[i];
        if (!v->ready[i]) quiesce(c, slot);  /* an error stopped the visit: the slot stays invalid */
        if (c->cfg.flags & FERRY_NO_CACHE) c->slot_valid[slot] = 0;
    }
    fe_cache_policy_end_layer(c->policy);
    c->layer = -1;
}

void fe_experts_prefetch(ferry_session *s, int layer, const int *ids, int n) {
    fe_ecache *c = s->e->cache;
    const int k = s->e->c.hp.top_k;
    if (!c->lookahead || c->layer < 0) return;
    int keep = n < k ? n : k;
    memcpy(c->predicted + layer * k, ids, (size_t)keep * sizeof(int));
    c->n_predicted[layer] = keep;
    int wanted = 0; /* predictions to read: not in RAM and their (layer, rank) gate open */
    for (int i = 0; i < keep; i++) {
        int slot = fe_cache_policy_lookup(c->policy, layer, ids[i]);
        c->predicted_cold[layer * k + i] = slot < 0;
        wanted += slot < 0 && !(c->gated && c->gate[layer * k + i] < LOOKAHEAD_MIN);
    }
    if (wanted) c->idle[layer] = 0;
    else if (c->idle[layer] < LOOKAHEAD_IDLE) c->idle[layer]++;
    for (int i = 0; i < keep; i++) {
        if (!c->predicted_cold[layer * k + i]) continue; /* in RAM or landing: nothing to read */
        if (c->gated && c->gate[layer * k + i] < LOOKAHEAD_MIN) { /* scored, not read */
            s->stats.prefetch_gated++;
            continue;
        }
        int already = 0;
        int slot = fe_cache_policy_prefetch(c->policy, layer, ids[i], &already);
        if (slot < 0) {
            if (slot == FERRY_CACHE_EINVAL) c->lookahead = 0; /* this policy cannot prefetch */
            return;
        }
        if (already) continue;
        reuse_slot(s, slot);
        c->slot_prefetched[slot] = 1;
        submit(c, slot, layer, ids[i], 0);
        s->stats.prefetch_issued++;
    }
}

int fe_experts_cached(const ferry_session *s, int layer, int expert) {
    const fe_ecache *c = s->e->cache;
    int slot = fe_cache_policy_lookup(c->policy, layer, expert);
    return slot >= 0 && (c->slot_valid[slot] || c->slot_job[slot].buf != NULL);
}

int fe_experts_lookahead_wanted(ferry_session *s, int layer) {
    fe_ecache *c = s->e->cache;
    if (!c->lookahead) return 0;
    if (c->idle[layer] < LOOKAHEAD_IDLE || ++c->probe[layer] >= LOOKAHEAD_PROBE) {
        c->probe[layer] = 0;
        return 1;
    }
    s->stats.lookahead_skipped++;
    return 0;
}

int fe_experts_overlap_on(const ferry_session *s) { return !(s->e->cache->cfg.flags & FERRY_NO_OVERLAP); }

void fe_ecache_lookahead_gate(const fe_ecache *c, float *precision) {
    const fe_hparams *hp = &c->e->c.hp;
    memcpy(precision, c->gate, (size_t)hp->n_layers * (size_t)hp->top_k * sizeof(float));
}

ferry_status fe_expert_get(ferry_session *s, int layer, int expert, const uint8_t **record, ferry_error *err) {
    int which;
    ferry_status st = fe_experts_begin(s, layer, &expert, 1, err);
    if (!st) st = fe_experts_next(s, &which, record, err);
    fe_experts_end(s);
    return st;
}

fe_mat fe_expert_mat(const fe_bank *b, int part, const uint8_t *record) {
    const fe_expert_part *p = &b->part[part];
    return fe_mat_view(record + p->offset, p->fmt, (int)p->rows, (int)p->cols);
}
