/* engine.c — the public API of ferry.h over container.c and model.c. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "formats.h"
#include "model.h"

#define MAX_THREADS 64

void ferry_open_options_init(ferry_open_options *opts) {
    memset(opts, 0, sizeof *opts);
}

static int resolve_threads(int asked) {
    if (asked > 0) return asked > MAX_THREADS ? MAX_THREADS : asked;
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    if (n < 1) n = 1;
    return n > MAX_THREADS ? MAX_THREADS : (int)n;
}

static void fmt_bytes(char *buf, size_t cap, uint64_t n) {
    snprintf(buf, cap, "%.2f GiB (%llu bytes)", (double)n / (1024.0 * 1024.0 * 1024.0), (unsigned long long)n);
}

ferry_status ferry_engine_open(const char *path, const ferry_open_options *opts, ferry_engine **out,
                               ferry_error *err) {
    if (err) { err->code = FERRY_OK; err->message[0] = '\0'; }
    if (!path || !out) return fe_fail(err, FERRY_E_ARG, "ferry_engine_open needs a path and an output handle");
    *out = NULL;
    ferry_engine *e = calloc(1, sizeof *e);
    if (!e) return fe_fail(err, FERRY_E_NOMEM, "out of memory");
    if (opts) e->opts = *opts;
    e->opts.n_threads = resolve_threads(e->opts.n_threads);
    ferry_status s = fe_container_open(&e->c, path, err);
    if (s) { free(e); return s; }
    if (e->opts.ram_budget && e->c.trunk_size > e->opts.ram_budget) {
        char need[64], have[64];
        fmt_bytes(need, sizeof need, e->c.trunk_size);
        fmt_bytes(have, sizeof have, e->opts.ram_budget);
        fe_container_close(&e->c);
        free(e);
        return fe_fail(err, FERRY_E_BUDGET, "the RAM budget of %s is below the trunk alone: %s", have, need);
    }
    e->arch = fe_arch_find(e->c.hp.arch);
    if (!e->arch)
        s = fe_fail(err, FERRY_E_UNSUPPORTED, "model.arch \"%s\" is not an architecture this core runs",
                    e->c.hp.arch);
    if (!s) s = fe_container_load_trunk(&e->c, err);
    if (!s) s = e->arch->bind(e, err);
    if (s) { ferry_engine_close(e); return s; }
    *out = e;
    return FERRY_OK;
}

void ferry_engine_close(ferry_engine *e) {
    if (!e) return;
    if (e->arch) e->arch->unbind(e);
    fe_container_close(&e->c);
    free(e);
}

void ferry_engine_info(const ferry_engine *e, ferry_model_info *info) {
    const fe_hparams *hp = &e->c.hp;
    memset(info, 0, sizeof *info);
    snprintf(info->arch, sizeof info->arch, "%s", hp->arch);
    info->n_layers = hp->n_layers;
    info->dim = hp->dim;
    info->n_heads = hp->n_heads;
    info->n_kv_heads = hp->n_kv_heads;
    info->head_dim = hp->head_dim;
    info->vocab = hp->vocab;
    info->max_ctx = hp->max_ctx;
    info->n_experts = hp->n_experts;
    info->top_k = hp->top_k;
    info->trunk_bytes = e->c.trunk_size;
    info->n_threads = e->opts.n_threads;
    for (int l = 0; l < hp->n_layers; l++) {
        info->n_moe_layers += hp->layer_is_moe[l];
        if (e->c.banks[l].record_size > info->expert_bytes) info->expert_bytes = e->c.banks[l].record_size;
    }
}

void ferry_engine_plan(const ferry_engine *e, int n_ctx, ferry_memory_plan *plan) {
    fe_session_sizes sz;
    if (n_ctx <= 0 || n_ctx > e->c.hp.max_ctx) n_ctx = e->c.hp.max_ctx;
    e->arch->sizes(e, n_ctx, e->opts.n_threads, &sz);
    plan->trunk_bytes = e->c.trunk_size;
    plan->state_bytes = sz.state;
    plan->scratch_bytes = sz.scratch;
    plan->expert_bytes = sz.expert;
    plan->total_bytes = plan->trunk_bytes + plan->state_bytes + plan->scratch_bytes + plan->expert_bytes;
}

ferry_status ferry_session_new(ferry_engine *e, int n_ctx, ferry_session **out, ferry_error *err) {
    if (err) { err->code = FERRY_OK; err->message[0] = '\0'; }
    if (!e || !out) return fe_fail(err, FERRY_E_ARG, "ferry_session_new needs an engine and an output handle");
    *out = NULL;
    if (n_ctx < 0 || n_ctx > e->c.hp.max_ctx)
        return fe_fail(err, FERRY_E_ARG, "a context of %d tokens is outside 1..%d, the model's trained length", n_ctx,
                       e->c.hp.max_ctx);
    if (n_ctx == 0) n_ctx = e->c.hp.max_ctx;
    ferry_memory_plan plan;
    ferry_engine_plan(e, n_ctx, &plan);
    if (e->opts.ram_budget && plan.total_bytes > e->opts.ram_budget) {
        char need[64], have[64];
        fmt_bytes(need, sizeof need, plan.total_bytes);
        fmt_bytes(have, sizeof have, e->opts.ram_budget);
        return fe_fail(err, FERRY_E_BUDGET,
                       "the RAM budget of %s is below the floor of %s for a %d-token context (trunk %llu, "
                       "attention state %llu, scratch %llu, expert buffer %llu bytes)",
                       have, need, n_ctx, (unsigned long long)plan.trunk_bytes,
                       (unsigned long long)plan.state_bytes, (unsigned long long)plan.scratch_bytes,
                       (unsigned long long)plan.expert_bytes);
    }
    ferry_session *s = calloc(1, sizeof *s);
    if (!s) return fe_fail(err, FERRY_E_NOMEM, "out of memory");
    s->e = e;
    s->n_ctx = n_ctx;
    atomic_init(&s->cancel, 0);
    s->pool = fe_pool_new(e->opts.n_threads);
    e->arch->sizes(e, n_ctx, fe_pool_threads(s->pool), &s->sizes);
    s->state = fe_alloc(s->sizes.state);
    s->scratch = fe_alloc(s->sizes.scratch);
    s->expert_buf = s->sizes.expert ? fe_alloc(s->sizes.expert) : NULL;
    if (!s->pool || !s->state || !s->scratch || (s->sizes.expert && !s->expert_buf)) {
        ferry_session_free(s);
        return fe_fail(err, FERRY_E_NOMEM, "cannot allocate %llu bytes for a %d-token session",
                       (unsigned long long)(plan.total_bytes - plan.trunk_bytes), n_ctx);
    }
    *out = s;
    return FERRY_OK;
}

void ferry_session_free(ferry_session *s) {
    if (!s) return;
    fe_pool_free(s->pool);
    fe_free(s->state);
    fe_free(s->scratch);
    fe_free(s->expert_buf);
    free(s);
}

void ferry_session_reset(ferry_session *s) { s->pos = 0; }

ferry_status ferry_session_truncate(ferry_session *s, int n_keep, ferry_error *err) {
    if (n_keep < 0 || n_keep > s->pos)
        return fe_fail(err, FERRY_E_ARG, "cannot keep %d tokens of a session that holds %d", n_keep, s->pos);
    s->pos = n_keep;
    return FERRY_OK;
}

int ferry_session_position(const ferry_session *s) { return s->pos; }
int ferry_session_context(const ferry_session *s) { return s->n_ctx; }

ferry_status ferry_session_eval(ferry_session *s, const int32_t *tokens, int n, float *logits, int all_logits,
                                ferry_error *err) {
    if (err) { err->code = FERRY_OK; err->message[0] = '\0'; }
    if (!s || (n > 0 && !tokens) || n < 0) return fe_fail(err, FERRY_E_ARG, "ferry_session_eval: bad arguments");
    if (n == 0) return FERRY_OK;
    if (n > s->n_ctx - s->pos)
        return fe_fail(err, FERRY_E_CONTEXT,
                       "%d tokens do not fit: the session holds %d of its %d-token context", n, s->pos, s->n_ctx);
    const int vocab = s->e->c.hp.vocab;
    for (int i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= vocab)
            return fe_fail(err, FERRY_E_ARG, "token %d (at index %d) is outside the vocabulary of %d", tokens[i], i,
                           vocab);
    const int start = s->pos;
    const double t0 = fe_now(), read0 = s->stats.read_seconds;
    ferry_status st = FERRY_OK;
    for (int done = 0; done < n && st == FERRY_OK;) {
        int m = n - done < FE_CHUNK ? n - done : FE_CHUNK;
        int last = done + m == n;
        float *out = NULL;
        if (logits && all_logits) out = logits + (size_t)done * vocab;
        else if (logits && last) out = logits;
        st = s->e->arch->forward(s, tokens + done, m, out, all_logits, err);
        if (st == FERRY_OK) {
            s->pos += m;
            done += m;
        }
    }
    if (st != FERRY_OK) {
        s->pos = start; /* the caches beyond start are garbage now, and unused */
        return st;
    }
    double dt = fe_now() - t0;
    if (n == 1) { s->stats.decode_tokens++; s->stats.decode_seconds += dt; }
    else { s->stats.prompt_tokens += (uint64_t)n; s->stats.prompt_seconds += dt; }
    s->stats.compute_seconds += dt - (s->stats.read_seconds - read0);
    return FERRY_OK;
}

void ferry_session_request_cancel(ferry_session *s) { atomic_store(&s->cancel, 1); }
void ferry_session_clear_cancel(ferry_session *s) { atomic_store(&s->cancel, 0); }

void ferry_session_set_stage_callback(ferry_session *s, ferry_stage_fn fn, void *user) {
    s->stage_fn = fn;
    s->stage_user = user;
}

void ferry_session_stats(const ferry_session *s, ferry_stats *out) { *out = s->stats; }

const char *ferry_status_name(int code) {
    static const char *const names[] = {"FERRY_OK", "FERRY_E_ARG", "FERRY_E_IO", "FERRY_E_FORMAT",
                                        "FERRY_E_VERSION", "FERRY_E_NOMEM", "FERRY_E_BUDGET",
                                        "FERRY_E_CANCELLED", "FERRY_E_CONTEXT", "FERRY_E_CHECKSUM",
                                        "FERRY_E_UNSUPPORTED"};
    if (code < 0 || code >= (int)(sizeof names / sizeof names[0])) return "FERRY_E_UNKNOWN";
    return names[code];
}
