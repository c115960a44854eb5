/* experts.c — the expert cache (see experts.h). */
#define _POSIX_C_SOURCE 200809L
#include "experts.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../include/ferry.h"
#include "cache_policy.h"
#include "container.h"
#include "io.h"
#include "model.h"

/* A prefetch buffer: a record read ahead for the next visit of its layer. */
typedef struct pf_entry {
    int layer, expert;    /* whose record, or layer -1 when free */
    uint8_t *buf;         /* the record (swapped into a slot when used) */
    fe_io_job job;        /* its read */
    int submitted;        /* a read was queued and may not have been waited for */
} pf_entry;

/* How one expert of the open visit is served. */
enum { FROM_SLOT, FROM_READ, FROM_PREFETCH };

/* The open visit: arrays of n_slots entries. */
typedef struct visit {
    int *ids;         /* experts asked for */
    int *slot;        /* where each is (or will be) */
    int *how;         /* FROM_* */
    int *pf_index;    /* prefetch entry for FROM_PREFETCH */
    uint8_t *given;   /* handed out already */
} visit;

struct fe_ecache {
    struct ferry_engine *e;   /* the engine (borrowed) */
    fe_ecache_config cfg;     /* sizes and switches */
    fe_cache_policy *policy;  /* which slot holds what, and what to evict */
    uint8_t **slot_buf;       /* n_slots record buffers (pointers, swapped with prefetch ones) */
    uint8_t *slot_valid;      /* the slot's bytes are the record the policy says it holds */
    fe_io_job *slot_job;      /* a read into each slot */
    pf_entry *pf;             /* n_prefetch entries */
    int *record_fd;           /* per layer: the fd records are read through (-1 dense) */
    int direct;               /* record fds bypass the page cache */
    char io_note[160];        /* why they do not, when they do not */
    fe_io *io;                /* reader threads */
    int *predicted;           /* [n_layers][top_k]: last lookahead per layer, -1 = none */
    int *n_predicted;         /* [n_layers] */
    int layer;                /* the open visit's layer, -1 when none is open */
    int n;                    /* experts it asked for */
    visit visit;              /* its bookkeeping */
    int *visit_mem;           /* the one allocation behind visit's arrays */
};

static visit *V(fe_ecache *c) { return &c->visit; }

/* ---------------------------------------------------------------- setup */

static uint64_t record_offset(const fe_bank *b, int expert) {
    return FE_BANK_HEADER_BYTES + (uint64_t)expert * b->record_size;
}

ferry_status fe_ecache_new(ferry_engine *e, const fe_ecache_config *cfg, fe_ecache **out, ferry_error *err) {
    const fe_hparams *hp = &e->c.hp;
    *out = NULL;
    fe_ecache *c = calloc(1, sizeof *c);
    if (!c) return fe_fail(err, FERRY_E_NOMEM, "out of memory");
    c->e = e;
    c->cfg = *cfg;
    c->layer = -1;
    int n = cfg->n_slots, np = cfg->n_prefetch;
    uint64_t rec = fe_max_record(&e->c);
    c->slot_buf = calloc((size_t)n, sizeof *c->slot_buf);
    c->slot_valid = calloc((size_t)n, 1);
    c->slot_job = calloc((size_t)n, sizeof *c->slot_job);
    c->visit_mem = calloc((size_t)n, 5 * sizeof(int));
    c->pf = calloc((size_t)(np > 0 ? np : 1), sizeof *c->pf);
    c->record_fd = malloc((size_t)hp->n_layers * sizeof *c->record_fd);
    c->predicted = malloc((size_t)hp->n_layers * (size_t)(hp->top_k > 0 ? hp->top_k : 1) * sizeof(int));
    c->n_predicted = calloc((size_t)hp->n_layers, sizeof(int));
    if (!c->slot_buf || !c->slot_valid || !c->slot_job || !c->visit_mem || !c->pf || !c->record_fd || !c->predicted ||
        !c->n_predicted) {
        fe_ecache_free(c);
        return fe_fail(err, FERRY_E_NOMEM, "out of memory for the expert cache");
    }
    visit *v = V(c);
    v->ids = c->visit_mem;
    v->slot = v->ids + n;
    v->how = v->slot + n;
    v->pf_index = v->how + n;
    v->given = (uint8_t *)(v->pf_index + n);
    for (int l = 0; l < hp->n_layers; l++) c->record_fd[l] = -1;
    for (int i = 0; i < n; i++)
        if (!(c->slot_buf[i] = fe_alloc_pages(rec))) {
            fe_ecache_free(c);
            return fe_fail(err, FERRY_E_NOMEM, "cannot allocate %d expert cache slots of %llu bytes", n,
                           (unsigned long long)rec);
        }
    for (int i = 0; i < np; i++) {
        c->pf[i].layer = -1;
        if (!(c->pf[i].buf = fe_alloc_pages(rec))) {
            fe_ecache_free(c);
            return fe_fail(err, FERRY_E_NOMEM, "out of memory for prefetch buffers");
        }
    }
    int perr = 0;
    c->policy = fe_cache_policy_create(n, hp->n_layers, hp->n_experts, FERRY_CACHE_POLICY_ENGINE, &perr);
    if (!c->policy) {
        fe_ecache_free(c);
        return fe_fail(err, FERRY_E_NOMEM, "cannot create the cache policy (%d)", perr);
    }
    if (e->opts.usage_counts) {
        if (fe_cache_policy_load_counts(c->policy, e->opts.usage_counts, e->opts.n_usage_counts) != 0) {
            fe_ecache_free(c);
            return fe_fail(err, FERRY_E_ARG, "the usage counts do not fit this model (%zu given, %d expected)",
                           e->opts.n_usage_counts, hp->n_layers * hp->n_experts);
        }
    }
    c->direct = 1;
    for (int l = 0; l < hp->n_layers; l++) {
        const fe_bank *b = &e->c.banks[l];
        if (b->fd < 0) continue;
        int direct = 0;
        char why[160];
        c->record_fd[l] = fe_io_open_records(b->path, record_offset(b, 0), b->record_size,
                                             !(cfg->flags & FERRY_NO_DIRECT_IO), &direct, why, sizeof why);
        if (c->record_fd[l] < 0) {
            fe_ecache_free(c);
            return fe_fail(err, FERRY_E_IO, "cannot open %s for reading records: %s", b->rel, strerror(errno));
        }
        if (!direct && c->direct) snprintf(c->io_note, sizeof c->io_note, "%s", why);
        c->direct &= direct;
    }
    c->io = fe_io_new(cfg->n_readers > 0 ? cfg->n_readers : 1);
    if (!c->io) {
        fe_ecache_free(c);
        return fe_fail(err, FERRY_E_NOMEM, "cannot start reader threads");
    }
    *out = c;
    return FERRY_OK;
}

static void drain(fe_ecache *c);

void fe_ecache_free(fe_ecache *c) {
    if (!c) return;
    if (c->io) drain(c);
    fe_io_free(c->io);
    if (c->record_fd)
        for (int l = 0; l < c->e->c.hp.n_layers; l++)
            if (c->record_fd[l] >= 0) close(c->record_fd[l]);
    if (c->slot_buf)
        for (int i = 0; i < c->cfg.n_slots; i++) fe_free(c->slot_buf[i]);
    if (c->pf)
        for (int i = 0; i < c->cfg.n_prefetch; i++) fe_free(c->pf[i].buf);
    fe_cache_policy_destroy(c->policy);
    free(c->slot_buf);
    free(c->slot_valid);
    free(c->slot_job);
    free(c->visit_mem);
    free(c->pf);
    free(c->record_fd);
    free(c->predicted);
    free(c->n_predicted);
    free(c);
}

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

/* ---------------------------------------------------------------- reads */

static void submit(fe_ecache *c, fe_io_job *job, int layer, int expert, uint8_t *buf, int urgent) {
    const fe_bank *b = &c->e->c.banks[layer];
    job->fd = c->record_fd[layer];
    job->buf = buf;
    job->size = b->record_size;
    job->offset = record_offset(b, expert);
    fe_io_submit(c->io, job, urgent);
}

/* Wait for a job and turn its outcome into a status; account its bytes. */
static ferry_status finish_read(ferry_session *s, fe_io_job *job, int layer, int expert, ferry_error *err) {
    fe_ecache *c = s->e->cache;
    double t0 = fe_now();
    fe_io_wait(c->io, job);
    s->stats.stall_seconds += fe_now() - t0;
    const fe_bank *b = &s->e->c.banks[layer];
    s->stats.read_seconds += job->seconds;
    s->stats.bytes_read += job->got;
    s->stats.expert_reads++;
    if (job->err_no > 0)
        return fe_fail(err, FERRY_E_IO, "reading expert %d of layer %d from %s failed: %s", expert, layer, b->rel,
                       strerror(job->err_no));
    if (job->err_no < 0)
        return fe_fail(err, FERRY_E_IO,
                       "reading expert %d of layer %d from %s returned %llu of %llu bytes (the file was cut short?)",
                       expert, layer, b->rel, (unsigned long long)job->got, (unsigned long long)job->size);
    return fe_bank_check_record(b, (uint32_t)expert, job->buf, c->cfg.verify_reads, err);
}

/* Wait for every read still in flight (slots and prefetches). */
static void drain(fe_ecache *c) {
    for (int i = 0; i < c->cfg.n_slots; i++)
        if (c->slot_job[i].buf) { fe_io_wait(c->io, &c->slot_job[i]); c->slot_job[i].buf = NULL; }
    for (int i = 0; i < c->cfg.n_prefetch; i++)
        if (c->pf[i].submitted) { fe_io_wait(c->io, &c->pf[i].job); c->pf[i].submitted = 0; }
}

static int find_prefetch(const fe_ecache *c, int layer, int expert) {
    for (int i = 0; i < c->cfg.n_prefetch; i++)
        if (c->pf[i].layer == layer && c->pf[i].expert == expert) return i;
    return -1;
}

/* ---------------------------------------------------------------- visits */

static void score_lookahead(ferry_session *s, int layer, const int *ids, int n) {
    fe_ecache *c = s->e->cache;
    int k = s->e->c.hp.top_k, np = c->n_predicted[layer];
    if (!np) return;
    s->stats.lookahead_predicted += (uint64_t)np;
    for (int i = 0; i < np; i++)
        for (int j = 0; j < n; j++)
            if (c->predicted[layer * k + i] == ids[j]) { s->stats.lookahead_correct++; break; }
    c->n_predicted[layer] = 0;
}

ferry_status fe_experts_begin(ferry_session *s, int layer, const int *ids, int n, ferry_error *err) {
    fe_ecache *c = s->e->cache;
    visit *v = V(c);
    if (n < 1 || n > c->cfg.n_slots || c->layer >= 0)
        return fe_fail(err, FERRY_E_ARG, "bad expert visit (%d experts, %d slots)", n, c->cfg.n_slots);
    fe_cache_counters before;
    fe_cache_policy_counters(c->policy, &before);
    if (fe_cache_policy_begin_layer(c->policy, layer, (const int32_t *)ids, n) != 0)
        return fe_fail(err, FERRY_E_ARG, "the cache refused a visit of layer %d", layer);
    c->layer = layer;
    c->n = n;
    score_lookahead(s, layer, ids, n);
    int overlap = !(c->cfg.flags & FERRY_NO_OVERLAP);
    for (int i = 0; i < n; i++) {
        int e = ids[i];
        v->ids[i] = e;
        v->given[i] = 0;
        int slot = fe_cache_policy_lookup(c->policy, layer, e);
        if (slot >= 0 && c->slot_valid[slot]) {
            v->slot[i] = slot;
            v->how[i] = FROM_SLOT;
            continue;
        }
        if (slot < 0) {
            slot = fe_cache_policy_choose_victim(c->policy, NULL, NULL);
            if (slot < 0 || fe_cache_policy_insert(c->policy, layer, e, slot) != 0) {
                fe_experts_end(s);
                return fe_fail(err, FERRY_E_ARG, "the expert cache has no free slot (layer %d)", layer);
            }
        }
        c->slot_valid[slot] = 0;
        v->slot[i] = slot;
        int pf = find_prefetch(c, layer, e);
        if (pf >= 0) {
            v->how[i] = FROM_PREFETCH;
            v->pf_index[i] = pf;
            fe_io_promote(c->io, &c->pf[pf].job);
        } else {
            v->how[i] = FROM_READ;
            if (overlap) submit(c, &c->slot_job[slot], layer, e, c->slot_buf[slot], 1);
        }
    }
    fe_cache_counters after;
    fe_cache_policy_counters(c->policy, &after);
    uint64_t hits = after.hits - before.hits, misses = after.misses - before.misses;
    s->stats.hits += hits;
    s->stats.misses += misses;
    if (s->decoding) { s->stats.decode_hits += hits; s->stats.decode_misses += misses; }
    return FERRY_OK;
}

/* Is item i ready to hand out without waiting? */
static int ready(fe_ecache *c, visit *v, int i) {
    switch (v->how[i]) {
    case FROM_SLOT: return 1;
    case FROM_PREFETCH: return c->pf[v->pf_index[i]].submitted ? fe_io_is_done(c->io, &c->pf[v->pf_index[i]].job) : 1;
    default: return c->slot_job[v->slot[i]].buf ? fe_io_is_done(c->io, &c->slot_job[v->slot[i]]) : 0;
    }
}

/* Bring item i's record into its slot (waiting if needed) and check it. */
static ferry_status settle(ferry_session *s, visit *v, int i, ferry_error *err) {
    fe_ecache *c = s->e->cache;
    int slot = v->slot[i], layer = c->layer, e = v->ids[i];
    ferry_status st = FERRY_OK;
    if (v->how[i] == FROM_PREFETCH) {
        pf_entry *p = &c->pf[v->pf_index[i]];
        if (p->submitted) st = finish_read(s, &p->job, layer, e, err);
        p->submitted = 0;
        p->layer = -1;
        uint8_t *tmp = c->slot_buf[slot];  /* swap: no copy */
        c->slot_buf[slot] = p->buf;
        p->buf = tmp;
        if (!st) s->stats.prefetch_used++;
    } else if (v->how[i] == FROM_READ) {
        fe_io_job *job = &c->slot_job[slot];
        if (!job->buf) submit(c, job, layer, e, c->slot_buf[slot], 1); /* no overlap: read now */
        st = finish_read(s, job, layer, e, err);
        job->buf = NULL;
    }
    if (!st) {
        c->slot_valid[slot] = 1;
        v->how[i] = FROM_SLOT;
    }
    return st;
}

ferry_status fe_experts_next(ferry_session *s, int *which, const uint8_t **record, ferry_error *err) {
    fe_ecache *c = s->e->cache;
    visit *v = V(c);
    int overlap = !(c->cfg.flags & FERRY_NO_OVERLAP);
    *which = -1;
    int pick = -1, left = 0;
    for (int i = 0; i < c->n; i++) {
        if (v->given[i]) continue;
        left++;
        if (pick < 0 && (ready(c, v, i) || !overlap)) pick = i;
    }
    if (left == 0) return FERRY_OK;
    if (pick < 0) /* nothing landed yet: wait for the first still pending, in order */
        for (int i = 0; i < c->n && pick < 0; i++)
            if (!v->given[i]) pick = i;
    ferry_status st = settle(s, v, pick, err);
    v->given[pick] = 1;
    if (st) return st;
    *which = pick;
    *record = c->slot_buf[v->slot[pick]];
    return FERRY_OK;
}

void fe_experts_end(ferry_session *s) {
    fe_ecache *c = s->e->cache;
    if (c->layer < 0) return;
    visit *v = V(c);
    /* Reads of this visit that were never settled (an error stopped it). */
    for (int i = 0; i < c->n; i++) {
        int slot = v->slot[i];
        if (v->how[i] == FROM_READ && c->slot_job[slot].buf) {
            fe_io_wait(c->io, &c->slot_job[slot]);
            c->slot_job[slot].buf = NULL;
        }
        if (c->cfg.flags & FERRY_NO_CACHE) c->slot_valid[slot] = 0;
    }
    /* Prefetches for this layer that the visit did not use. */
    for (int i = 0; i < c->cfg.n_prefetch; i++) {
        pf_entry *p = &c->pf[i];
        if (p->layer != c->layer) continue;
        if (p->submitted) fe_io_wait(c->io, &p->job);
        p->submitted = 0;
        p->layer = -1;
        s->stats.prefetch_wasted++;
    }
    fe_cache_policy_end_layer(c->policy);
    c->layer = -1;
}

void fe_experts_prefetch(ferry_session *s, int layer, const int *ids, int n) {
    fe_ecache *c = s->e->cache;
    int k = s->e->c.hp.top_k;
    if (c->cfg.n_prefetch == 0 || (c->cfg.flags & (FERRY_NO_LOOKAHEAD | FERRY_NO_OVERLAP))) return;
    int keep = n < k ? n : k;
    memcpy(c->predicted + layer * k, ids, (size_t)keep * sizeof(int));
    c->n_predicted[layer] = keep;
    for (int i = 0; i < n; i++) {
        int slot = fe_cache_policy_lookup(c->policy, layer, ids[i]);
        if ((slot >= 0 && c->slot_valid[slot]) || find_prefetch(c, layer, ids[i]) >= 0) continue;
        int free_i = -1;
        for (int j = 0; j < c->cfg.n_prefetch && free_i < 0; j++)
            if (c->pf[j].layer < 0) free_i = j;
        if (free_i < 0) return;
        pf_entry *p = &c->pf[free_i];
        if (p->submitted) fe_io_wait(c->io, &p->job); /* a discarded read still in flight */
        p->layer = layer;
        p->expert = ids[i];
        p->submitted = 1;
        submit(c, &p->job, layer, ids[i], p->buf, 0);
        s->stats.prefetch_issued++;
    }
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
