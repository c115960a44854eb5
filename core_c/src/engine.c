/* engine.c — the public API of ferry.h over container.c and model.c. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../include/ferry_kernels.h"
#include "cache_policy.h"
#include "formats.h"
#include "kernels.h"
#include "kimi_manifest.h"
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

/* GiB from 1 GiB up, MiB below (a small model's budget and floor would both
 * read "0.01 GiB"), with the exact bytes. */
static void fmt_bytes(char *buf, size_t cap, uint64_t n) {
    const double gib = 1024.0 * 1024.0 * 1024.0;
    if ((double)n >= gib) snprintf(buf, cap, "%.2f GiB (%llu bytes)", (double)n / gib, (unsigned long long)n);
    else snprintf(buf, cap, "%.1f MiB (%llu bytes)", (double)n / (1024.0 * 1024.0), (unsigned long long)n);
}

/* The kernel set ferry_open_options.kernels names (NULL or "auto": the best
 * this CPU supports), or a refusal saying why it cannot run here. *q8_impl is
 * the set the 8-bit-activation mode would use with it: the same, except
 * "avx512vnni" (AVX2's exact kernels, VNNI integer products) and "auto" on a
 * CPU with AVX-512 VNNI. */
static ferry_status choose_kernels(const char *want, const fe_kernels **out, int *q8_impl, ferry_error *err) {
    int id;
    if (!want || !*want || strcmp(want, "auto") == 0) {
        id = fe_kernels_best();
        *q8_impl = fe_q8_best(id);
    } else if (strcmp(want, "avx512vnni") == 0) {
        id = FE_KERNELS_AVX2;
        *q8_impl = FE_Q8_AVX512VNNI;
        if (!fe_q8_kernels_avx512vnni())
            return fe_fail(err, FERRY_E_UNSUPPORTED, "the avx512vnni kernels are not built into this core: they are "
                           "for x86-64 CPUs; use auto or scalar");
        if (!fe_q8_kernels_get(FE_Q8_AVX512VNNI))
            return fe_fail(err, FERRY_E_UNSUPPORTED, "the avx512vnni kernels need AVX-512 F, BW, VL and VNNI with "
                           "AVX2, FMA and F16C (and the OS saving the zmm state), and this CPU lacks them; use auto, "
                           "avx2 or scalar");
    } else {
        id = fe_kernels_by_name(want);
        *q8_impl = id;
    }
    if (id < 0)
        return fe_fail(err, FERRY_E_ARG, "unknown kernel set \"%s\" (choose auto, scalar, avx2, avx512vnni or neon)",
                       want);
    *out = fe_kernels_get(id);
    if (*out) return FERRY_OK;
    if (id == FE_KERNELS_AVX2 && fe_kernels_avx2_table())
        return fe_fail(err, FERRY_E_UNSUPPORTED,
                       "the %s kernels need AVX2, FMA and F16C (with the OS saving AVX registers), and this CPU "
                       "lacks them; use auto or scalar", want);
    return fe_fail(err, FERRY_E_UNSUPPORTED, "the %s kernels are not built into this core: they are for %s CPUs; use "
                   "auto or scalar", want, id == FE_KERNELS_AVX2 ? "x86-64" : "aarch64");
}

/* The 8-bit-activation kernels ferry_open_options.activations asks for with
 * the q8 set chosen beside the engine's kernels (NULL: the exact f32 path),
 * or a refusal. "auto" (and NULL or "") takes them when the set has them and
 * the exact path when it has none; "q8" insists; "exact" and its alias "f32"
 * are the exact path. Whether any weights have integer products is decided
 * after the container is open (has_q8_weights). */
static ferry_status choose_activations(const char *want, int q8_impl, const fe_q8_kernels **out, int *automatic_out,
                                       ferry_error *err) {
    *out = NULL;
    *automatic_out = 0;
    if (want && (strcmp(want, "exact") == 0 || strcmp(want, "f32") == 0)) return FERRY_OK;
    const int automatic = !want || !*want || strcmp(want, "auto") == 0;
    *automatic_out = automatic;
    if (!automatic && strcmp(want, "q8") != 0)
        return fe_fail(err, FERRY_E_ARG, "unknown activations \"%s\" (choose auto, the default, exact or q8)", want);
    *out = fe_q8_kernels_get(q8_impl);
    if (*out || automatic) return FERRY_OK;
    return fe_fail(err, FERRY_E_UNSUPPORTED, "the %s kernel set has no 8-bit-activation kernels",
                   ferry_q8_kernels_name(q8_impl));
}

/* Whether any matrix of the container is stored in a format the 8-bit-
 * activation mode multiplies with integer products (without one, that mode
 * is the exact path and the engine reports it as such). */
static int has_q8_weights(const fe_container *c) {
    for (int i = 0; i < c->n_tensors; i++)
        if (c->tensors[i].n_dims == 2 && ferry_q8_activations_supported(c->tensors[i].fmt)) return 1;
    for (int l = 0; c->banks && l < c->hp.n_layers; l++)
        for (int p = 0; c->banks[l].fd >= 0 && p < 3; p++)
            if (ferry_q8_activations_supported(c->banks[l].part[p].fmt)) return 1;
    return 0;
}

/* A session's buffer for set k's q8 kernels (fe_q8_plan_bytes): one chunk
 * of tokens at the widest input of any matrix in the container, in the
 * layouts k reads for the container's formats only (*kinds: those layouts). */
static uint64_t q8_buffer_bytes(const fe_container *c, const fe_q8_kernels *k, int chunk, unsigned *kinds) {
    uint64_t cols = 0;
    unsigned char fmts[FE_N_FORMATS] = {0};
    for (int i = 0; i < c->n_tensors; i++)
        if (c->tensors[i].n_dims == 2) {
            if (c->tensors[i].shape[1] > cols) cols = c->tensors[i].shape[1];
            if (c->tensors[i].fmt >= 0 && c->tensors[i].fmt < FE_N_FORMATS) fmts[c->tensors[i].fmt] = 1;
        }
    for (int l = 0; c->banks && l < c->hp.n_layers; l++)
        for (int p = 0; c->banks[l].fd >= 0 && p < 3; p++) {
            if (c->banks[l].part[p].cols > cols) cols = c->banks[l].part[p].cols;
            if (c->banks[l].part[p].fmt >= 0 && c->banks[l].part[p].fmt < FE_N_FORMATS) fmts[c->banks[l].part[p].fmt] = 1;
        }
    if (cols > (1u << 24)) cols = 1u << 24; /* the manifest bounds shapes well below this */
    /* at least FE_MATMUL_MULTI_MAX tokens: fe_matmul_each quantizes up to that many one-token inputs
     * (a decode token's experts) at once, whatever the prompt chunk */
    return fe_q8_plan_bytes(k, fmts, (int)cols, chunk > FE_MATMUL_MULTI_MAX ? chunk : FE_MATMUL_MULTI_MAX, kinds);
}

/* The architecture's session sizes plus the q8 buffer at the end of scratch. */
static void session_sizes(const ferry_engine *e, int n_ctx, int n_threads, fe_session_sizes *sz) {
    e->arch->sizes(e, n_ctx, n_threads, sz);
    sz->scratch += e->q8 ? e->q8_bytes : 0;
}

#define DEFAULT_CTX 4096

static int n_moe_layers(const fe_hparams *hp);

int fe_prompt_chunk(const fe_hparams *hp, int asked) {
    if (asked > 0) return asked < FE_MAX_CHUNK ? asked : FE_MAX_CHUNK;
    return n_moe_layers(hp) ? FE_MOE_CHUNK : FE_CHUNK;
}

static int n_moe_layers(const fe_hparams *hp) {
    int n = 0;
    for (int l = 0; l < hp->n_layers; l++) n += hp->layer_is_moe[l];
    return n;
}

/* Fixed parts of the budget: trunk and one session at opts.n_ctx. */
static void fixed_parts(const ferry_engine *e, int n_ctx, uint64_t *trunk, uint64_t *session) {
    fe_session_sizes sz;
    session_sizes(e, n_ctx, e->opts.n_threads, &sz);
    *trunk = fe_container_resident_bytes(&e->c);
    *session = sz.state + sz.scratch;
}

/* The token embedding table stays on disk (rows read per token) unless the
 * output head shares it or the caller keeps it resident. */
static void embeddings_on_demand(ferry_engine *e) {
    if (!e->c.hp.tied_embeddings && !(e->opts.flags & FERRY_NO_EMBEDDING_READS))
        fe_container_set_on_demand(&e->c, "token_embd");
}

/* The vision tower's tensors (ferry_vision.h) are not the language model's:
 * left on disk by the engine, so they cost it no RAM. */
static void vision_on_demand(ferry_engine *e) {
    for (int i = 0; i < e->c.n_tensors; i++) {
        const char *n = e->c.tensors[i].name;
        if (!strncmp(n, "v.", 2) || !strncmp(n, "mm.", 3)) fe_container_set_on_demand(&e->c, n);
    }
}

/* Least number of cached records that runs: one layer's top_k set. */
static int min_slots(const fe_hparams *hp) { return hp->top_k; }

/* RAM of the engine's cache policy over `slots` records (its key maps and
 * what it learns), as fe_ecache_new creates it: over every layer index. */
static uint64_t policy_bytes(const fe_hparams *hp, int slots) {
    if (!n_moe_layers(hp) || slots < 1) return 0;
    return fe_cache_policy_bytes(FERRY_CACHE_POLICY_ENGINE, slots, hp->n_layers, hp->n_experts);
}

/* Decide the cache and prefetch sizes from the budget; FERRY_E_BUDGET with
 * the floor when the budget cannot hold the minimum. */
static ferry_status size_cache(ferry_engine *e, ferry_error *err) {
    const fe_hparams *hp = &e->c.hp;
    uint64_t trunk, session, rec = fe_max_record(&e->c);
    fixed_parts(e, e->opts.n_ctx, &trunk, &session);
    e->session_bytes = session;
    int moe = n_moe_layers(hp);
    if (!moe) {
        if (e->opts.ram_budget && trunk + session > e->opts.ram_budget) goto too_small;
        return FERRY_OK;
    }
    int all = moe * hp->n_experts;
    if (e->opts.cache_slots > 0) {
        e->cache_slots = e->opts.cache_slots < all ? e->opts.cache_slots : all;
    } else if (e->opts.ram_budget == 0) {
        e->cache_slots = all;
    } else {
        /* Records and the policy's state over them share what is left. The
         * state is affine in the slots (p1 for one, k more per slot), so the
         * most slots that fit is (left - p1 + k) / (rec + k); the check below
         * adds the exact state up again. */
        uint64_t fixed = trunk + session, p1 = policy_bytes(hp, 1), k = policy_bytes(hp, 2) - p1;
        uint64_t left = e->opts.ram_budget > fixed + p1 ? e->opts.ram_budget - fixed - p1 + k : 0;
        uint64_t slots = left / (rec + k);
        e->cache_slots = slots > (uint64_t)all ? all : (int)slots;
    }
    if (e->cache_slots < min_slots(hp)) e->cache_slots = e->opts.ram_budget ? 0 : min_slots(hp);
    e->cache_bytes = (uint64_t)e->cache_slots * rec;
    uint64_t policy = policy_bytes(hp, e->cache_slots);
    if (e->cache_slots < min_slots(hp) ||
        (e->opts.ram_budget && trunk + session + e->cache_bytes + policy > e->opts.ram_budget))
        goto too_small;
    return FERRY_OK;
too_small:;
    ferry_memory_plan plan;
    ferry_engine_plan(e, e->opts.n_ctx, &plan);
    char need[64], have[64];
    fmt_bytes(need, sizeof need, plan.floor_bytes);
    fmt_bytes(have, sizeof have, e->opts.ram_budget);
    return fe_fail(err, FERRY_E_BUDGET,
                   "the RAM budget of %s is below the floor of %s for a %d-token context (trunk %llu, attention "
                   "state %llu, scratch %llu, minimum expert cache %llu, cache policy %llu bytes)",
                   have, need, e->opts.n_ctx, (unsigned long long)plan.trunk_bytes,
                   (unsigned long long)plan.state_bytes, (unsigned long long)plan.scratch_bytes,
                   (unsigned long long)(plan.floor_bytes - plan.trunk_bytes - plan.state_bytes -
                                        plan.scratch_bytes - plan.policy_floor_bytes),
                   (unsigned long long)plan.policy_floor_bytes);
}

ferry_status ferry_engine_open(const char *path, const ferry_open_options *opts, ferry_engine **out,
                               ferry_error *err) {
    if (err) { err->code = FERRY_OK; err->message[0] = '\0'; }
    if (!path || !out) return fe_fail(err, FERRY_E_ARG, "ferry_engine_open needs a path and an output handle");
    *out = NULL;
    const fe_kernels *kernels = NULL;
    const fe_q8_kernels *q8 = NULL;
    int q8_impl = FE_KERNELS_SCALAR, automatic = 0;
    ferry_status s = choose_kernels(opts ? opts->kernels : NULL, &kernels, &q8_impl, err);
    if (!s) s = choose_activations(opts ? opts->activations : NULL, q8_impl, &q8, &automatic, err);
    if (s) return s;
    ferry_engine *e = calloc(1, sizeof *e);
    if (!e) return fe_fail(err, FERRY_E_NOMEM, "out of memory");
    pthread_mutex_init(&e->lock, NULL);
    if (opts) e->opts = *opts;
    e->opts.kernels = NULL; /* borrowed only for the call */
    e->kernels = kernels;
    e->opts.activations = NULL; /* borrowed only for the call */
    e->q8 = q8;
    e->opts.n_threads = resolve_threads(e->opts.n_threads);
    if (e->opts.n_readers <= 0) e->opts.n_readers = FERRY_DEFAULT_READERS;
    s = fe_container_open(&e->c, path, err);
    if (s) { pthread_mutex_destroy(&e->lock); free(e); return s; }
    e->chunk = fe_prompt_chunk(&e->c.hp, e->opts.prompt_chunk);
    if (e->q8 && !has_q8_weights(&e->c)) e->q8 = NULL; /* no integer products: the exact path, reported so */
    e->q8_auto = automatic; /* a model with KDA layers keeps classes of products exact under "auto" (arch_kimi.c) */
    if (e->q8) e->q8_bytes = q8_buffer_bytes(&e->c, e->q8, e->chunk, &e->q8_kinds);
    const int max_ctx = e->c.hp.max_ctx;
    if (e->opts.n_ctx <= 0) e->opts.n_ctx = max_ctx < DEFAULT_CTX ? max_ctx : DEFAULT_CTX;
    if (e->opts.n_ctx > max_ctx) e->opts.n_ctx = max_ctx;
    e->arch = fe_arch_find(e->c.hp.arch);
    if (!e->arch)
        s = fe_fail(err, FERRY_E_UNSUPPORTED, "model.arch \"%s\" is not an architecture this core runs",
                    e->c.hp.arch);
    if (!s) embeddings_on_demand(e), vision_on_demand(e);
    /* Refuse a budget under the floor before anything big is loaded. */
    if (!s) s = size_cache(e, err);
    if (!s) s = fe_container_load_trunk(&e->c, e->opts.flags & FERRY_NO_TRUNK_CHECK ? 0 : e->opts.n_threads, err);
    if (!s) s = e->arch->bind(e, err);
    if (!s && e->cache_slots) {
        fe_ecache_config cfg = {e->cache_slots, e->opts.n_readers, e->opts.flags, e->opts.verify_reads};
        s = fe_ecache_new(e, &cfg, &e->cache, err);
    }
    if (s) { ferry_engine_close(e); return s; }
    e->opts.usage_counts = NULL; /* borrowed only for the call */
    e->opts.n_usage_counts = 0;
    e->opts.policy_state = NULL;
    e->opts.n_policy_state = 0;
    *out = e;
    return FERRY_OK;
}

void ferry_engine_close(ferry_engine *e) {
    if (!e) return;
    fe_ecache_free(e->cache);
    if (e->arch && e->arch_data) e->arch->unbind(e);
    fe_container_close(&e->c);
    pthread_mutex_destroy(&e->lock);
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
    info->trunk_bytes = fe_container_resident_bytes(&e->c);
    info->n_threads = e->opts.n_threads;
    info->n_moe_layers = n_moe_layers(hp);
    info->expert_bytes = fe_max_record(&e->c);
    info->cache_slots = e->cache_slots;
    info->ram_budget = e->opts.ram_budget;
    info->prompt_chunk = e->chunk;
    /* in the q8 mode, the set of its integer products (e.g. "avx512vnni"; the exact ones are AVX2's) */
    snprintf(info->kernels, sizeof info->kernels, "%s", e->q8 ? e->q8->name : e->kernels->name);
    snprintf(info->activations, sizeof info->activations, "%s", e->q8 ? "q8" : "f32");
    if (e->cache) info->direct_io = fe_ecache_direct_io(e->cache, info->io_note, sizeof info->io_note);
}

void ferry_engine_plan(const ferry_engine *e, int n_ctx, ferry_memory_plan *plan) {
    const fe_hparams *hp = &e->c.hp;
    fe_session_sizes sz;
    if (n_ctx <= 0 || n_ctx > hp->max_ctx) n_ctx = hp->max_ctx;
    session_sizes(e, n_ctx, e->opts.n_threads, &sz);
    memset(plan, 0, sizeof *plan);
    plan->n_ctx = (uint64_t)n_ctx;
    plan->trunk_bytes = fe_container_resident_bytes(&e->c);
    plan->state_bytes = sz.state;
    plan->scratch_bytes = sz.scratch;
    plan->expert_bytes = e->cache_bytes;
    plan->policy_bytes = policy_bytes(hp, e->cache_slots);
    plan->total_bytes =
        plan->trunk_bytes + plan->state_bytes + plan->scratch_bytes + plan->expert_bytes + plan->policy_bytes;
    plan->record_bytes = fe_max_record(&e->c);
    plan->token_set_bytes = (uint64_t)n_moe_layers(hp) * (uint64_t)hp->top_k * plan->record_bytes;
    uint64_t min_cache = n_moe_layers(hp) ? (uint64_t)min_slots(hp) * plan->record_bytes : 0;
    plan->policy_floor_bytes = policy_bytes(hp, min_slots(hp));
    plan->floor_bytes =
        plan->trunk_bytes + plan->state_bytes + plan->scratch_bytes + min_cache + plan->policy_floor_bytes;
    unsigned kinds; /* the engine's q8 set, or (exact mode, a container's plan) the one "auto" takes here */
    plan->q8_bytes = q8_buffer_bytes(&e->c, e->q8 ? e->q8 : fe_q8_kernels_get(fe_q8_best(fe_kernels_best())), e->chunk,
                                     &kinds);
}

ferry_status ferry_container_plan(const char *path, int n_ctx, int n_threads, ferry_memory_plan *plan,
                                  ferry_error *err) {
    if (err) { err->code = FERRY_OK; err->message[0] = '\0'; }
    ferry_engine e;
    memset(&e, 0, sizeof e);
    e.opts.n_threads = resolve_threads(n_threads);
    ferry_status s = fe_container_open(&e.c, path, err);
    if (s) return s;
    e.arch = fe_arch_find(e.c.hp.arch);
    if (!e.arch) {
        s = fe_fail(err, FERRY_E_UNSUPPORTED, "model.arch \"%s\" is not an architecture this core runs", e.c.hp.arch);
    } else {
        embeddings_on_demand(&e);
        vision_on_demand(&e);
        e.chunk = fe_prompt_chunk(&e.c.hp, 0);
        e.cache_slots = n_moe_layers(&e.c.hp) * e.c.hp.n_experts;
        e.cache_bytes = (uint64_t)e.cache_slots * fe_max_record(&e.c);
        ferry_engine_plan(&e, n_ctx, plan);
    }
    fe_container_close(&e.c);
    return s;
}

ferry_status ferry_engine_usage(const ferry_engine *e, uint32_t *counts, size_t n, ferry_error *err) {
    if (!e->cache) return fe_fail(err, FERRY_E_ARG, "this model has no experts");
    pthread_mutex_lock((pthread_mutex_t *)&e->lock);
    ferry_status s = fe_ecache_usage(e->cache, counts, n, err);
    pthread_mutex_unlock((pthread_mutex_t *)&e->lock);
    return s;
}

ferry_status ferry_engine_lookahead_gate(const ferry_engine *e, float *precision, size_t n, ferry_error *err) {
    const fe_hparams *hp = &e->c.hp;
    if (!e->cache) return fe_fail(err, FERRY_E_ARG, "this model has no experts");
    if (!precision || n != (size_t)hp->n_layers * (size_t)hp->top_k)
        return fe_fail(err, FERRY_E_ARG, "the lookahead gate needs %d entries", hp->n_layers * hp->top_k);
    pthread_mutex_lock((pthread_mutex_t *)&e->lock);
    fe_ecache_lookahead_gate(e->cache, precision);
    pthread_mutex_unlock((pthread_mutex_t *)&e->lock);
    return FERRY_OK;
}

ferry_status ferry_engine_policy_state(const ferry_engine *e, void *buf, size_t n, size_t *size,
                                       ferry_error *err) {
    if (!e->cache) return fe_fail(err, FERRY_E_ARG, "this model has no experts");
    pthread_mutex_lock((pthread_mutex_t *)&e->lock);
    ferry_status s = fe_ecache_policy_state(e->cache, buf, n, size, err);
    pthread_mutex_unlock((pthread_mutex_t *)&e->lock);
    return s;
}

ferry_status ferry_session_new(ferry_engine *e, int n_ctx, ferry_session **out, ferry_error *err) {
    if (err) { err->code = FERRY_OK; err->message[0] = '\0'; }
    if (!e || !out) return fe_fail(err, FERRY_E_ARG, "ferry_session_new needs an engine and an output handle");
    *out = NULL;
    if (n_ctx < 0 || n_ctx > e->c.hp.max_ctx)
        return fe_fail(err, FERRY_E_ARG, "a context of %d tokens is outside 1..%d, the model's trained length", n_ctx,
                       e->c.hp.max_ctx);
    if (n_ctx == 0) n_ctx = e->opts.n_ctx;
    ferry_session *s = calloc(1, sizeof *s);
    if (!s) return fe_fail(err, FERRY_E_NOMEM, "out of memory");
    s->e = e;
    s->n_ctx = n_ctx;
    atomic_init(&s->cancel, 0);
    s->pool = fe_pool_new(e->opts.n_threads);
    if (!s->pool) { free(s); return fe_fail(err, FERRY_E_NOMEM, "cannot start compute threads"); }
    fe_pool_watch(s->pool, fe_ecache_own_work(e->cache)); /* the expert readers' work is not a busy machine */
    session_sizes(e, n_ctx, fe_pool_threads(s->pool), &s->sizes);
    uint64_t need = s->sizes.state + s->sizes.scratch;
    pthread_mutex_lock(&e->lock);
    int fits = !e->opts.ram_budget || e->sessions_in_use + need <= e->session_bytes;
    if (fits) e->sessions_in_use += need;
    pthread_mutex_unlock(&e->lock);
    if (!fits) {
        char want[64], room[64];
        fmt_bytes(want, sizeof want, need);
        fmt_bytes(room, sizeof room, e->session_bytes - e->sessions_in_use);
        fe_pool_free(s->pool);
        free(s);
        return fe_fail(err, FERRY_E_BUDGET,
                       "a %d-token session needs %s but the RAM budget leaves %s for sessions (the budget "
                       "was planned for a %d-token context; open the model with a larger context or budget)",
                       n_ctx, want, room, e->opts.n_ctx);
    }
    /* Lazily backed: the KV cache takes RAM as the context grows (the budget
     * still reserves the whole context), the chunk scratch as it is used. */
    s->state = fe_alloc_lazy(s->sizes.state);
    s->scratch = fe_alloc_lazy(s->sizes.scratch);
    if (!s->state || !s->scratch) {
        ferry_session_free(s);
        return fe_fail(err, FERRY_E_NOMEM, "cannot allocate %llu bytes for a %d-token session",
                       (unsigned long long)need, n_ctx);
    }
    if (e->q8) { /* the last q8_bytes of scratch, after the architecture's buffers */
        s->q8.k = e->q8;
        s->q8.bytes = e->q8_bytes;
        s->q8.kinds = e->q8_kinds;
        s->q8.buf = s->scratch + s->sizes.scratch - e->q8_bytes;
    }
    *out = s;
    return FERRY_OK;
}

void ferry_session_free(ferry_session *s) {
    if (!s) return;
    if (s->state || s->scratch) {
        pthread_mutex_lock(&s->e->lock);
        s->e->sessions_in_use -= s->sizes.state + s->sizes.scratch;
        pthread_mutex_unlock(&s->e->lock);
    }
    fe_pool_free(s->pool);
    fe_free_lazy(s->state, s->sizes.state);
    fe_free_lazy(s->scratch, s->sizes.scratch);
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

static ferry_status eval_impl(ferry_session *s, const int32_t *tokens, const float *embd, const uint8_t *use, int n,
                              float *logits, int all_logits, ferry_error *err);

ferry_status ferry_session_eval(ferry_session *s, const int32_t *tokens, int n, float *logits, int all_logits,
                                ferry_error *err) {
    return eval_impl(s, tokens, NULL, NULL, n, logits, all_logits, err);
}

ferry_status ferry_session_eval_embd(ferry_session *s, const int32_t *tokens, const float *embd, const uint8_t *use,
                                     int n, float *logits, int all_logits, ferry_error *err) {
    if ((!embd) != (!use)) {
        if (err) { err->code = FERRY_OK; err->message[0] = '\0'; }
        return fe_fail(err, FERRY_E_ARG, "ferry_session_eval_embd: embd and use go together");
    }
    return eval_impl(s, tokens, embd, use, n, logits, all_logits, err);
}

static ferry_status eval_impl(ferry_session *s, const int32_t *tokens, const float *embd, const uint8_t *use, int n,
                              float *logits, int all_logits, ferry_error *err) {
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
    pthread_mutex_lock(&s->e->lock); /* the expert cache serves one evaluation at a time */
    const double t0 = fe_now(), stall0 = s->stats.stall_seconds;
    s->decoding = n == 1;
    ferry_profile_part *P = s->profiling ? (n == 1 ? &s->prof.decode : &s->prof.prompt) : NULL;
    s->prof_cur = P;
    if (P) {
        fe_pool_profile pp = {&P->pool_wait_seconds, &P->pool_jobs, &P->pool_spin_jobs, &P->pool_backoffs};
        fe_pool_set_profile(s->pool, &pp);
    }
    ferry_status st = FERRY_OK;
    for (int done = 0; done < n && st == FERRY_OK;) {
        const int chunk = s->e->chunk;
        int m = n - done < chunk ? n - done : chunk;
        int last = done + m == n;
        float *out = NULL;
        if (logits && all_logits) out = logits + (size_t)done * vocab;
        else if (logits && last) out = logits;
        const double tf = P ? fe_now() : 0.0;
        s->embd = embd ? embd + (size_t)done * s->e->c.hp.dim : NULL;
        s->embd_use = use ? use + done : NULL;
        st = s->e->arch->forward(s, tokens + done, m, out, all_logits, err);
        s->embd = NULL;
        s->embd_use = NULL;
        if (P) {
            P->evals++;
            P->tokens += (uint64_t)m;
            P->total_seconds += fe_now() - tf;
        }
        if (st == FERRY_OK) {
            s->pos += m;
            done += m;
        }
    }
    double dt = fe_now() - t0;
    s->prof_cur = NULL;
    fe_pool_set_profile(s->pool, NULL);
    pthread_mutex_unlock(&s->e->lock);
    if (st != FERRY_OK) {
        s->pos = start; /* the caches beyond start are garbage now, and unused */
        return st;
    }
    if (n == 1) { s->stats.decode_tokens++; s->stats.decode_seconds += dt; }
    else { s->stats.prompt_tokens += (uint64_t)n; s->stats.prompt_seconds += dt; }
    s->stats.compute_seconds += dt - (s->stats.stall_seconds - stall0);
    return FERRY_OK;
}

/* Blob: magic, version, fingerprint, position, context, payload size, CRC-32 of the payload. */
#define STATE_MAGIC 0x54535846u /* "FXST" */
#define STATE_HEADER 40

static uint64_t blob_payload(const ferry_session *s, int pos) {
    const fe_arch *a = s->e->arch;
    return a->state_blob_size ? a->state_blob_size(s, pos) : s->sizes.state;
}

static void put32(uint8_t *p, uint32_t v) { for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i)); }
static void put64(uint8_t *p, uint64_t v) { put32(p, (uint32_t)v); put32(p + 4, (uint32_t)(v >> 32)); }
static uint32_t get32(const uint8_t *p) { return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24; }
static uint64_t get64(const uint8_t *p) { return (uint64_t)get32(p) | (uint64_t)get32(p + 4) << 32; }

uint64_t ferry_session_state_size(const ferry_session *s) { return STATE_HEADER + blob_payload(s, s->pos); }

ferry_status ferry_session_export(const ferry_session *s, void *buf, uint64_t size, ferry_error *err) {
    uint64_t payload = blob_payload(s, s->pos);
    if (!buf || size < STATE_HEADER + payload)
        return fe_fail(err, FERRY_E_ARG, "the state needs %llu bytes", (unsigned long long)(STATE_HEADER + payload));
    uint8_t *p = buf;
    const fe_arch *a = s->e->arch;
    if (a->state_blob_copy) a->state_blob_copy((ferry_session *)s, s->pos, p + STATE_HEADER, 1);
    else memcpy(p + STATE_HEADER, s->state, payload);
    put32(p, STATE_MAGIC);
    put32(p + 4, 1);
    put64(p + 8, s->e->c.fingerprint);
    put32(p + 16, (uint32_t)s->pos);
    put32(p + 20, (uint32_t)s->n_ctx);
    put64(p + 24, payload);
    put32(p + 32, fe_crc32(0, p + STATE_HEADER, payload));
    put32(p + 36, 0);
    return FERRY_OK;
}

ferry_status ferry_session_import(ferry_session *s, const void *buf, uint64_t size, ferry_error *err) {
    const uint8_t *p = buf;
    if (!buf || size < STATE_HEADER || get32(p) != STATE_MAGIC)
        return fe_fail(err, FERRY_E_FORMAT, "this is not a Ferry session state");
    if (get32(p + 4) != 1) return fe_fail(err, FERRY_E_VERSION, "session state version %u is not supported", get32(p + 4));
    if (get64(p + 8) != s->e->c.fingerprint)
        return fe_fail(err, FERRY_E_FORMAT, "this session state was saved by another model (or another conversion of it)");
    uint32_t pos = get32(p + 16), saved_ctx = get32(p + 20);
    uint64_t payload = get64(p + 24);
    if (pos > (uint32_t)s->n_ctx)
        return fe_fail(err, FERRY_E_CONTEXT, "the saved state holds %u tokens; this session's context is %d", pos,
                       s->n_ctx);
    if (!s->e->arch->state_blob_copy && saved_ctx != (uint32_t)s->n_ctx)
        return fe_fail(err, FERRY_E_CONTEXT, "the saved state needs a %u-token session", saved_ctx);
    if (payload != blob_payload(s, (int)pos) || size != STATE_HEADER + payload)
        return fe_fail(err, FERRY_E_FORMAT, "the session state is truncated or damaged (size)");
    if (fe_crc32(0, p + STATE_HEADER, payload) != get32(p + 32))
        return fe_fail(err, FERRY_E_CHECKSUM, "the session state is damaged (CRC32 mismatch)");
    if (s->e->arch->state_blob_copy) s->e->arch->state_blob_copy(s, (int)pos, (uint8_t *)p + STATE_HEADER, 0);
    else memcpy(s->state, p + STATE_HEADER, payload);
    s->pos = (int)pos;
    return FERRY_OK;
}

void ferry_session_request_cancel(ferry_session *s) { atomic_store(&s->cancel, 1); }
void ferry_session_clear_cancel(ferry_session *s) { atomic_store(&s->cancel, 0); }

void ferry_session_set_stage_callback(ferry_session *s, ferry_stage_fn fn, void *user) {
    s->stage_fn = fn;
    s->stage_user = user;
}

void ferry_session_stats(const ferry_session *s, ferry_stats *out) { *out = s->stats; }

ferry_status ferry_session_set_routing(ferry_session *s, int experts_per_token, float cache_aware_margin,
                                       ferry_error *err) {
    if (err) { err->code = FERRY_OK; err->message[0] = '\0'; }
    if (!s) return fe_fail(err, FERRY_E_ARG, "ferry_session_set_routing needs a session");
    const int k = s->e->c.hp.top_k;
    if ((!s->e->cache || k <= 0) && (experts_per_token || cache_aware_margin != 0.0f))
        return fe_fail(err, FERRY_E_ARG, "this model has no experts to route");
    if (experts_per_token < 0 || (experts_per_token > k && k > 0))
        return fe_fail(err, FERRY_E_ARG, "experts per token must be 1..%d (this model's top-k)", k);
    if (!(cache_aware_margin >= 0.0f) || cache_aware_margin > 1e6f)
        return fe_fail(err, FERRY_E_ARG, "the cache-aware margin must be a number >= 0 (0 = exact routing)");
    s->route_k = experts_per_token == k ? 0 : experts_per_token;
    s->route_margin = cache_aware_margin;
    return FERRY_OK;
}

void ferry_session_set_profiling(ferry_session *s, int on) {
    memset(&s->prof, 0, sizeof s->prof);
    s->profiling = on != 0;
}

void ferry_session_profile(const ferry_session *s, ferry_profile *out) { *out = s->prof; }

const char *ferry_status_name(int code) {
    static const char *const names[] = {"FERRY_OK", "FERRY_E_ARG", "FERRY_E_IO", "FERRY_E_FORMAT",
                                        "FERRY_E_VERSION", "FERRY_E_NOMEM", "FERRY_E_BUDGET",
                                        "FERRY_E_CANCELLED", "FERRY_E_CONTEXT", "FERRY_E_CHECKSUM",
                                        "FERRY_E_UNSUPPORTED"};
    if (code < 0 || code >= (int)(sizeof names / sizeof names[0])) return "FERRY_E_UNKNOWN";
    return names[code];
}
