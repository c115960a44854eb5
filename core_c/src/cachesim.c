/* cachesim.c: ferry_cachesim.h, a routing trace replayed through the same
 * fe_cache_policy object the engine uses, so online policies and the
 * offline optimum share one cache model (pinning included). */
#include "ferry_cachesim.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>

#include "cache_policy.h"

/* The dimensions of one replay, checked once. */
typedef struct trace_shape {
    const int32_t *trace; /* [n_tokens][n_layers][top_k] expert ids */
    int n_tokens;         /* tokens in the trace */
    int n_layers;         /* layers per token */
    int top_k;            /* experts requested per layer */
    int n_experts;        /* experts per layer */
    int n_slots;          /* cache size in records */
} trace_shape;

static int fail(char *err, size_t err_len, int status, const char *fmt, ...)
{
    if (err && err_len > 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, err_len, fmt, ap);
        va_end(ap);
    }
    return status;
}

static const int32_t *layer_set(const trace_shape *s, uint64_t visit)
{
    return s->trace + visit * (uint64_t)s->top_k;
}

static uint64_t visit_count(const trace_shape *s)
{
    return (uint64_t)s->n_tokens * (uint64_t)s->n_layers;
}

/* Validates sizes, then every expert id and every set's distinctness. */
static int check_shape(const trace_shape *s, const ferry_cachesim_result *out,
                       char *err, size_t err_len)
{
    if (!s->trace || !out)
        return fail(err, err_len, FERRY_CACHE_EINVAL, "trace and out must not be NULL");
    if (s->n_tokens < 1 || s->n_layers < 1 || s->top_k < 1)
        return fail(err, err_len, FERRY_CACHE_EINVAL,
                    "n_tokens, n_layers and top_k must be >= 1 (got %d, %d, %d)",
                    s->n_tokens, s->n_layers, s->top_k);
    if (s->n_experts < s->top_k)
        return fail(err, err_len, FERRY_CACHE_EINVAL,
                    "experts_per_layer (%d) must be >= top_k (%d)", s->n_experts, s->top_k);
    if (s->n_slots < s->top_k)
        return fail(err, err_len, FERRY_CACHE_EINVAL,
                    "n_slots (%d) must be >= top_k (%d): a layer's experts must fit at once",
                    s->n_slots, s->top_k);
    if (s->n_layers > INT32_MAX / s->n_experts || visit_count(s) >= UINT32_MAX ||
        visit_count(s) > SIZE_MAX / sizeof(int32_t) / (uint64_t)s->top_k)
        return fail(err, err_len, FERRY_CACHE_EINVAL, "trace dimensions too large");
    for (uint64_t v = 0; v < visit_count(s); v++) {
        const int32_t *set = layer_set(s, v);
        int token = (int)(v / (uint64_t)s->n_layers), layer = (int)(v % (uint64_t)s->n_layers);
        for (int i = 0; i < s->top_k; i++) {
            if (set[i] < 0 || set[i] >= s->n_experts)
                return fail(err, err_len, FERRY_CACHE_EINVAL,
                            "token %d layer %d: expert id %d out of range [0, %d)",
                            token, layer, set[i], s->n_experts);
            for (int j = 0; j < i; j++)
                if (set[j] == set[i])
                    return fail(err, err_len, FERRY_CACHE_EINVAL,
                                "token %d layer %d: expert id %d requested twice",
                                token, layer, set[i]);
        }
    }
    return FERRY_CACHE_OK;
}

/* For request r (visit * top_k + i), the visit at which its key is
 * requested next, UINT32_MAX for never. Caller frees; NULL if out of memory. */
static uint32_t *next_uses(const trace_shape *s)
{
    size_t keys = (size_t)s->n_layers * (size_t)s->n_experts;
    size_t requests = (size_t)visit_count(s) * (size_t)s->top_k;
    uint32_t *next = malloc(requests * sizeof *next);
    uint32_t *upcoming = malloc(keys * sizeof *upcoming);
    if (!next || !upcoming) {
        free(next);
        free(upcoming);
        return NULL;
    }
    for (size_t k = 0; k < keys; k++) upcoming[k] = UINT32_MAX;
    for (uint64_t v = visit_count(s); v-- > 0;) {
        const int32_t *set = layer_set(s, v);
        size_t base = (size_t)(v % (uint64_t)s->n_layers) * (size_t)s->n_experts;
        for (int i = 0; i < s->top_k; i++) {
            next[v * (uint64_t)s->top_k + (uint64_t)i] = upcoming[base + (size_t)set[i]];
            upcoming[base + (size_t)set[i]] = (uint32_t)v;
        }
    }
    free(upcoming);
    return next;
}

/* One layer visit through the engine's protocol. */
static int replay_visit(fe_cache_policy *p, const trace_shape *s, uint64_t v,
                        const uint32_t *next)
{
    const int32_t *set = layer_set(s, v);
    int layer = (int)(v % (uint64_t)s->n_layers);
    int status = fe_cache_policy_begin_layer(p, layer, set, s->top_k);
    for (int i = 0; status == FERRY_CACHE_OK && i < s->top_k; i++) {
        if (fe_cache_policy_lookup(p, layer, set[i]) < 0) {
            int slot = fe_cache_policy_choose_victim(p, NULL, NULL);
            status = slot < 0 ? slot : fe_cache_policy_insert(p, layer, set[i], slot);
        }
        if (status == FERRY_CACHE_OK && next) {
            uint32_t when = next[v * (uint64_t)s->top_k + (uint64_t)i];
            status = fe_cache_policy_set_next_use(p, layer, set[i],
                                                  when == UINT32_MAX ? UINT64_MAX : when);
        }
    }
    return status == FERRY_CACHE_OK ? fe_cache_policy_end_layer(p) : status;
}

/* What a replay starts from and keeps: an optional hot list or learned
 * state to load, and whether to hand the final learned state back. */
typedef struct replay_io {
    const uint32_t *prior;   /* hot list, or NULL */
    const void *state;       /* learned state (fe_cache_policy_save_state), or NULL */
    size_t state_len;        /* its bytes */
    void *saved;             /* out: malloc'ed final state if want_state */
    size_t saved_len;        /* out: its bytes */
    bool want_state;         /* save the state at the end */
} replay_io;

static int replay(const trace_shape *s, int kind, replay_io *io,
                  const uint32_t *next, ferry_cachesim_result *out, char *err,
                  size_t err_len)
{
    int status = FERRY_CACHE_OK;
    fe_cache_policy *p = fe_cache_policy_create(s->n_slots, s->n_layers, s->n_experts,
                                                kind, &status);
    if (!p) return fail(err, err_len, status, "cannot create the cache policy");
    if (io && io->prior)
        status = fe_cache_policy_load_counts(p, io->prior,
                                             (size_t)s->n_layers * (size_t)s->n_experts);
    if (io && io->state && status == FERRY_CACHE_OK)
        status = fe_cache_policy_load_state(p, io->state, io->state_len);
    for (uint64_t v = 0; status == FERRY_CACHE_OK && v < visit_count(s); v++)
        status = replay_visit(p, s, v, next);
    if (io && io->want_state && status == FERRY_CACHE_OK) {
        io->saved_len = (size_t)fe_cache_policy_state_bytes(p);
        io->saved = malloc(io->saved_len);
        status = io->saved ? fe_cache_policy_save_state(p, io->saved, io->saved_len)
                           : FERRY_CACHE_ENOMEM;
    }
    fe_cache_counters c;
    fe_cache_policy_counters(p, &c);
    fe_cache_policy_destroy(p);
    if (status != FERRY_CACHE_OK)
        return fail(err, err_len, status, "cache policy protocol failed (%d)", status);
    out->hits = c.hits;
    out->misses = c.misses;
    out->requests = c.hits + c.misses;
    out->evictions = c.evictions;
    out->hit_rate = (double)c.hits / (double)out->requests;
    return FERRY_CACHE_OK;
}

int ferry_cache_simulate(const int32_t *trace, int n_tokens, int n_layers, int top_k,
                         int experts_per_layer, int n_slots, int policy,
                         const uint32_t *prior_counts, ferry_cachesim_result *out,
                         char *err, size_t err_len)
{
    trace_shape s = {trace, n_tokens, n_layers, top_k, experts_per_layer, n_slots};
    int status = check_shape(&s, out, err, err_len);
    if (status != FERRY_CACHE_OK) return status;
    if (policy < 0 || policy >= FERRY_CACHE_POLICY_COUNT)
        return fail(err, err_len, FERRY_CACHE_EINVAL, "unknown policy %d", policy);
    replay_io io = {prior_counts, NULL, 0, NULL, 0, false};
    return replay(&s, policy, &io, NULL, out, err, err_len);
}

int ferry_cache_simulate_learned(const int32_t *trace, int n_tokens, int n_layers, int top_k,
                                 int experts_per_layer, int n_slots, int policy,
                                 int learn_tokens, ferry_cachesim_result *out, char *err,
                                 size_t err_len)
{
    trace_shape s = {trace, n_tokens, n_layers, top_k, experts_per_layer, n_slots};
    int status = check_shape(&s, out, err, err_len);
    if (status != FERRY_CACHE_OK) return status;
    if (policy < 0 || policy >= FERRY_CACHE_POLICY_COUNT)
        return fail(err, err_len, FERRY_CACHE_EINVAL, "unknown policy %d", policy);
    if (learn_tokens < 1 || learn_tokens >= n_tokens)
        return fail(err, err_len, FERRY_CACHE_EINVAL,
                    "learn_tokens must be in [1, %d) (got %d)", n_tokens, learn_tokens);
    trace_shape first = s, rest = s;
    first.n_tokens = learn_tokens;
    rest.trace = layer_set(&s, (uint64_t)learn_tokens * (uint64_t)n_layers);
    rest.n_tokens = n_tokens - learn_tokens;
    replay_io learn = {NULL, NULL, 0, NULL, 0, true};
    ferry_cachesim_result ignored;
    status = replay(&first, policy, &learn, NULL, &ignored, err, err_len);
    if (status != FERRY_CACHE_OK) return status;
    replay_io resume = {NULL, learn.saved, learn.saved_len, NULL, 0, false};
    status = replay(&rest, policy, &resume, NULL, out, err, err_len);
    free(learn.saved);
    return status;
}

int ferry_cache_simulate_opt(const int32_t *trace, int n_tokens, int n_layers, int top_k,
                             int experts_per_layer, int n_slots,
                             ferry_cachesim_result *out, char *err, size_t err_len)
{
    trace_shape s = {trace, n_tokens, n_layers, top_k, experts_per_layer, n_slots};
    int status = check_shape(&s, out, err, err_len);
    if (status != FERRY_CACHE_OK) return status;
    uint32_t *next = next_uses(&s);
    if (!next) return fail(err, err_len, FERRY_CACHE_ENOMEM, "out of memory");
    status = replay(&s, FE_CACHE_POLICY_OPT, NULL, next, out, err, err_len);
    free(next);
    return status;
}

uint64_t ferry_cache_policy_bytes(int policy, int n_layers, int experts_per_layer, int n_slots)
{
    if (policy < 0 || policy >= FERRY_CACHE_POLICY_COUNT) return 0;
    return fe_cache_policy_bytes(policy, n_slots, n_layers, experts_per_layer);
}
