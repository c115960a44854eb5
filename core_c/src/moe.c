/* moe.c — the one mixture-of-experts layer loop (see moe.h). */
#define _POSIX_C_SOURCE 200809L
#include "moe.h"

#include <math.h>
#include <string.h>

#include "experts.h"
#include "kimi_manifest.h"
#include "model.h"
#include "ops.h"

uint64_t fe_moe_carve(const fe_hparams *hp, int chunk, int ed, uint8_t *base, fe_moe_bufs *b) {
    uint64_t off = 0;
    const uint64_t C = (uint64_t)chunk, E = (uint64_t)hp->n_experts, K = (uint64_t)hp->top_k;
    const uint64_t dim = (uint64_t)hp->dim, w = (uint64_t)ed;
#define TAKE(field, type, count)                                                                      \
    do {                                                                                              \
        if (base) b->field = (type *)(base + off);                                                   \
        off += FE_ALIGN_UP((uint64_t)(count) * sizeof(type), 64);                                     \
    } while (0)
    TAKE(logits, float, C * E);
    TAKE(choice, float, E);
    TAKE(group, float, E);
    TAKE(mark, uint8_t, E);
    TAKE(count, int, E);
    TAKE(ids, int, E);
    TAKE(first, int, C * K + 1);
    TAKE(rows, int, C * K);
    TAKE(sel, int, C * K);
    TAKE(sel_w, float, C * K);
    TAKE(slots, float, C * K * w);
    TAKE(ex_in, float, C * w);
    TAKE(ex_out, float, C * w);
    TAKE(look_in, float, dim);
    TAKE(look_ids, int, K);
    TAKE(look_w, float, K);
    TAKE(in_ram, uint8_t, E);
#undef TAKE
    if (base) { /* these are kept zero between uses */
        memset(b->mark, 0, (size_t)E);
        memset(b->count, 0, (size_t)E * sizeof(int));
    }
    return off;
}

/* ---------------------------------------------------------------- routing */

/* The k best of key[] (skipping -inf), highest first, ties to the lower id,
 * in one pass that keeps the best so far in order: a key enters only when it
 * beats the k-th, so this costs about E comparisons plus k log(E/k)
 * insertions for keys in random order (a selection of k passes over E keys
 * cost E k: 14,336 comparisons per token and layer on K3). Returns how many
 * were found. */
static int best_k(const float *key, int E, int k, int *ids) {
    int found = 0;
    for (int e = 0; e < E; e++) {
        const float v = key[e];
        if (v == -INFINITY || (found == k && !(v > key[ids[k - 1]]))) continue;
        int j = found < k ? found++ : k - 1;
        for (; j > 0 && v > key[ids[j - 1]]; j--) ids[j] = ids[j - 1]; /* an equal key keeps its lower id first */
        ids[j] = e;
    }
    return found;
}

/* DeepSeek-V3 group limit: keep the topk_group groups whose two best keys sum
 * highest; the others' keys become -inf. */
static void limit_groups(const fe_route_params *p, float *choice, float *gs, uint8_t *keep) {
    const int G = p->n_group, per = p->n_experts / G;
    for (int g = 0; g < G; g++) {
        float a = -INFINITY, c = -INFINITY; /* the two largest */
        for (int e = g * per; e < (g + 1) * per; e++) {
            float v = choice[e];
            if (v > a) { c = a; a = v; }
            else if (v > c) c = v;
        }
        gs[g] = a + c;
    }
    for (int r = 0; r < p->topk_group; r++) {
        int best = -1;
        for (int g = 0; g < G; g++)
            if (!keep[g] && (best < 0 || gs[g] > gs[best])) best = g;
        keep[best] = 1;
    }
    for (int g = 0; g < G; g++) {
        if (!keep[g])
            for (int e = g * per; e < (g + 1) * per; e++) choice[e] = -INFINITY;
        keep[g] = 0;
    }
}

/* Is key a within the margin above (sign +1) or below (-1) the reference?
 * Softmax keys are probabilities: the margin is in log-probability (logit)
 * units, so it means the same at any expert count; sigmoid keys are compared
 * directly. */
static int within(int kind, float key, float ref, float margin, int sign) {
    if (kind == FE_ROUTE_SOFTMAX) return sign > 0 ? key <= ref * expf(margin) : key >= ref * expf(-margin);
    return sign > 0 ? key <= ref + margin : key >= ref - margin;
}

/* Cache-aware routing: chosen experts that are not in RAM and score within
 * the margin of the last choice give way, weakest first, to the best experts
 * in RAM that were not chosen but score within the margin below it (best
 * first; equal scores, lower id first). The candidates are found in one pass
 * over the E experts, as best_k finds the choice. */
static int prefer_cached(const fe_route_params *p, const float *choice, const uint8_t *in_ram, uint8_t *mark,
                         int *ids, int k) {
    enum { MAX_K = 256 }; /* the largest top_k a container may give (container.c) */
    const int E = p->n_experts;
    const float ref = choice[ids[k - 1]];
    int cold = 0; /* chosen, not in RAM, within the margin above the last choice: may give way */
    for (int r = 0; r < k; r++) {
        mark[ids[r]] = 1;
        cold += !in_ram[ids[r]] && within(p->kind, choice[ids[r]], ref, p->margin, +1);
    }
    if (cold > MAX_K) cold = MAX_K;
    int cand[MAX_K], n = 0;
    for (int c = 0; c < E && cold; c++) {
        const float v = choice[c];
        if (mark[c] || !in_ram[c] || v == -INFINITY || !within(p->kind, v, ref, p->margin, -1)) continue;
        if (n == cold && !(v > choice[cand[n - 1]])) continue;
        int j = n < cold ? n++ : cold - 1;
        for (; j > 0 && v > choice[cand[j - 1]]; j--) cand[j] = cand[j - 1];
        cand[j] = c;
    }
    for (int r = 0; r < k; r++) mark[ids[r]] = 0;
    int swapped = 0;
    for (int r = k - 1; r >= 0 && swapped < n; r--)
        if (!in_ram[ids[r]] && within(p->kind, choice[ids[r]], ref, p->margin, +1)) ids[r] = cand[swapped++];
    if (swapped) /* back into rank order: by key, ties to the lower id */
        for (int i = 1; i < k; i++)
            for (int j = i; j > 0; j--) {
                int a = ids[j - 1], c = ids[j];
                if (choice[c] > choice[a] || (choice[c] == choice[a] && c < a)) { ids[j - 1] = c; ids[j] = a; }
                else break;
            }
    return swapped;
}

int fe_moe_route(const fe_route_params *p, float *logits, float *choice, float *group, uint8_t *mark,
                 const uint8_t *in_ram, int *ids, float *w, int *swapped) {
    const int E = p->n_experts, K = p->top_k;
    int k = p->k_used > 0 && p->k_used < K ? p->k_used : K;
    const float *key;
    if (p->kind == FE_ROUTE_SOFTMAX) {
        fe_softmax(logits, E);
        key = logits;
    } else {
        for (int e = 0; e < E; e++) {
            logits[e] = fe_sigmoid(logits[e]);
            choice[e] = logits[e] + p->bias[e];
        }
        if (p->n_group > 1 && p->topk_group < p->n_group) limit_groups(p, choice, group, mark);
        key = choice;
    }
    /* The model's k, so that a smaller k can keep their weight mass. */
    int found = best_k(key, E, K, ids);
    float mass = 0.0f;
    if (k < K && !p->norm)
        for (int r = 0; r < found; r++) mass += logits[ids[r]];
    if (found < k) k = found; /* a group limit left fewer experts than that (a malformed model) */
    for (int r = k; r < K; r++) ids[r] = -1;
    if (k == 0) return 0;
    *swapped = 0;
    if (p->margin > 0.0f && in_ram) *swapped = prefer_cached(p, key, in_ram, mark, ids, k);
    for (int r = 0; r < k; r++) w[r] = logits[ids[r]];
    if (p->norm) {
        float sum = 0.0f;
        for (int r = 0; r < k; r++) sum += w[r];
        sum += p->norm_eps;
        for (int r = 0; r < k; r++) w[r] /= sum;
    } else if (k < K) { /* unnormalised routing: the fewer experts carry the k's weight */
        float sum = 0.0f;
        for (int r = 0; r < k; r++) sum += w[r];
        for (int r = 0; r < k; r++) w[r] *= mass / sum;
    }
    if (p->scale != 1.0f)
        for (int r = 0; r < k; r++) w[r] *= p->scale;
    return k;
}

static const void *layer_field(const fe_moe_arch *a, int layer, size_t at) {
    return (const uint8_t *)a->layers + (size_t)layer * a->layer_size + at;
}

/* What a profiled layer pass spends outside the dispatch's own work
 * (ferry_profile_part); NULL when the session does not profile. */
typedef struct moe_clock {
    double router; /* the router's products (this layer's and the lookahead's) */
    double ffn;    /* the experts' feed-forward */
} moe_clock;

static void router(const fe_moe_arch *a, int layer, const float *in, int n, float *logits, moe_clock *clk) {
    double t0 = clk ? fe_now() : 0.0;
    fe_matmul(&a->ops, layer_field(a, layer, a->router_at), in, n, logits);
    if (clk) clk->router += fe_now() - t0;
}

static fe_route_params route_params(const ferry_session *s, const fe_moe_arch *a, int layer) {
    const fe_hparams *hp = &s->e->c.hp;
    fe_route_params p;
    memset(&p, 0, sizeof p);
    p.kind = a->kind;
    p.n_experts = hp->n_experts;
    p.top_k = hp->top_k;
    p.k_used = s->route_k;
    p.norm = hp->norm_topk_prob;
    p.scale = 1.0f;
    p.margin = s->route_margin;
    if (a->kind == FE_ROUTE_SIGMOID_GROUPED) {
        const fe_kimi_hparams *k = hp->kimi;
        p.n_group = k->n_group;
        p.topk_group = k->topk_group;
        p.norm_eps = 1e-20f;
        p.scale = k->routed_scale;
        p.bias = *(const float *const *)layer_field(a, layer, a->bias_at);
    }
    return p;
}

/* Which of the layer's experts the cache holds (only for cache-aware routing). */
static const uint8_t *in_ram(ferry_session *s, const fe_moe_bufs *b, int layer) {
    if (s->route_margin <= 0.0f) return NULL;
    for (int e = 0; e < s->e->c.hp.n_experts; e++) b->in_ram[e] = (uint8_t)fe_experts_cached(s, layer, e);
    return b->in_ram;
}

/* -------------------------------------------------------------- lookahead */

/* Run the next MoE layer's router on the current residual and let the cache
 * start reading its likely experts while this layer computes. The real
 * router still decides, so this changes speed, never output. */
static void lookahead(ferry_session *s, const fe_moe_arch *a, const fe_moe_bufs *b, int layer, const float *x,
                      moe_clock *clk) {
    const fe_hparams *hp = &s->e->c.hp;
    int next = layer + 1;
    while (next < hp->n_layers && !hp->layer_is_moe[next]) next++;
    if (next >= hp->n_layers || !fe_experts_lookahead_wanted(s, next)) return;
    fe_rmsnorm(b->look_in, x, *(const float *const *)layer_field(a, next, a->norm_at), hp->dim, hp->norm_eps);
    float *logits = b->logits + (size_t)hp->n_experts; /* row 1: free in a single-token step */
    router(a, next, b->look_in, 1, logits, clk);
    fe_route_params p = route_params(s, a, next);
    int swapped;
    int k = fe_moe_route(&p, logits, b->choice, b->group, b->mark, in_ram(s, b, next), b->look_ids, b->look_w,
                         &swapped);
    fe_experts_prefetch(s, next, b->look_ids, k);
}

/* ------------------------------------------------------------------ layer */

static ferry_status moe_layer(ferry_session *s, const fe_moe_arch *a, const fe_moe_bufs *b, int layer, int n,
                              const float *xb, const float *z, const float *x, float *acc, moe_clock *clk,
                              ferry_error *err) {
    const fe_hparams *hp = &s->e->c.hp;
    const int E = hp->n_experts, K = hp->top_k, ed = a->ed;
    router(a, layer, xb, n, b->logits, clk);
    fe_route_params p = route_params(s, a, layer);
    const uint8_t *ram = in_ram(s, b, layer);
    for (int t = 0; t < n; t++) {
        int swapped;
        int k = fe_moe_route(&p, b->logits + (size_t)t * E, b->choice, b->group, b->mark, ram, b->sel + t * K,
                         b->sel_w + t * K, &swapped);
        s->stats.routed_choices += (uint64_t)k;
        s->stats.routed_swaps += (uint64_t)swapped;
    }
    /* The distinct experts, counted: O(n k). */
    for (int t = 0; t < n; t++)
        for (int r = 0; r < K; r++) {
            int e = b->sel[t * K + r];
            if (e >= 0) b->count[e]++;
        }
    /* In visiting order: those in RAM (or landing) first, then the misses,
     * each part ascending. One pass over the counts, O(E), no sort. */
    int n_ids = 0;
    for (int pass = 0; pass < 2; pass++)
        for (int e = 0; e < E; e++)
            if (b->count[e] && fe_experts_cached(s, layer, e) == !pass) b->ids[n_ids++] = e;
    int at = 0;
    for (int i = 0; i < n_ids; i++) {
        int e = b->ids[i];
        b->first[i] = at;
        at += b->count[e];
        b->count[e] = b->first[i]; /* now: the next free place of e's rows */
    }
    b->first[n_ids] = at;
    for (int t = 0; t < n; t++)
        for (int r = 0; r < K; r++) {
            int e = b->sel[t * K + r];
            if (e >= 0) b->rows[b->count[e]++] = t * K + r;
        }
    for (int i = 0; i < n_ids; i++) b->count[b->ids[i]] = 0;

    const int per_visit = fe_experts_max_visit(s);
    for (int g = 0; g < n_ids; g += per_visit) {
        int cnt = n_ids - g < per_visit ? n_ids - g : per_visit;
        ferry_status st = fe_experts_begin(s, layer, b->ids + g, cnt, err);
        if (st) return st;
        if (g == 0 && n == 1) lookahead(s, a, b, layer, x, clk); /* a prompt chunk reads each expert once anyway */
        int which;
        const uint8_t *rec;
        if (n == 1 && a->experts1 && cnt <= FE_MOE_BATCH && (fe_experts_overlap_on(s) || fe_experts_all_landed(s))) {
            /* a single token: the records in RAM together, in a few jobs;
             * with misses, those landed first, then each later batch as it
             * lands (the read of a miss overlaps the others' products). No
             * overlap (reads one at a time) and a miss: one at a time below.
             * Each token-expert pair's output lands in its slot as below. */
            while (!st) {
                const uint8_t *recs[FE_MOE_BATCH];
                float *outs[FE_MOE_BATCH];
                int got = 0;
                do { /* the next record (waiting for one if none has landed), then every other landed one */
                    if ((st = fe_experts_next(s, &which, &rec, err)) != FERRY_OK || which < 0) break;
                    recs[got] = rec;
                    outs[got++] = b->slots + (size_t)b->rows[b->first[g + which]] * ed;
                } while (fe_experts_any_landed(s));
                if (st || !got) break;
                double t0 = clk ? fe_now() : 0.0;
                a->experts1(a->ctx, layer, recs, got, z, outs);
                if (clk) clk->ffn += fe_now() - t0;
            }
            fe_experts_end(s);
            if (st) return st;
            continue;
        }
        while ((st = fe_experts_next(s, &which, &rec, err)) == FERRY_OK && which >= 0) {
            int i = g + which, m = b->first[i + 1] - b->first[i];
            const int *rows = b->rows + b->first[i];
            for (int j = 0; j < m; j++)
                memcpy(b->ex_in + (size_t)j * ed, z + (size_t)(rows[j] / K) * ed, (size_t)ed * sizeof(float));
            double t0 = clk ? fe_now() : 0.0;
            a->expert(a->ctx, layer, rec, b->ex_in, m, b->ex_out);
            if (clk) clk->ffn += fe_now() - t0;
            for (int j = 0; j < m; j++)
                memcpy(b->slots + (size_t)rows[j] * ed, b->ex_out + (size_t)j * ed, (size_t)ed * sizeof(float));
        }
        fe_experts_end(s);
        if (st) return st;
    }
    /* Sum in rank order so a token's result does not depend on its chunk or
     * on the order the records landed. */
    for (int t = 0; t < n; t++) {
        float *o = acc + (size_t)t * ed;
        for (int r = 0; r < K && b->sel[t * K + r] >= 0; r++) {
            const float *y = b->slots + ((size_t)t * K + r) * ed;
            float w = b->sel_w[t * K + r];
            for (int i = 0; i < ed; i++) o[i] += w * y[i];
        }
    }
    return FERRY_OK;
}

ferry_status fe_moe_layer(ferry_session *s, const fe_moe_arch *a, const fe_moe_bufs *b, int layer, int n,
                          const float *xb, const float *z, const float *x, float *acc, ferry_error *err) {
    ferry_profile_part *P = s->prof_cur;
    if (!P) return moe_layer(s, a, b, layer, n, xb, z, x, acc, NULL, err);
    moe_clock clk = {0.0, 0.0};
    const double t0 = fe_now(), stall0 = s->stats.stall_seconds;
    ferry_status st = moe_layer(s, a, b, layer, n, xb, z, x, acc, &clk, err);
    const double total = fe_now() - t0, wait = s->stats.stall_seconds - stall0;
    P->expert_seconds += total;
    P->expert_ffn_seconds += clk.ffn;
    P->expert_wait_seconds += wait;
    P->dispatch_seconds += total - clk.router - clk.ffn - wait;
    P->moe_layers++;
    return st;
}

void fe_moe_gated1(const fe_ops *ops, const fe_bank *bk, const uint8_t *const *rec, int n, const float *in,
                   float *h1, float *h2, void (*act)(void *act_ctx, float *h1, const float *h2, size_t len),
                   void *act_ctx, float *const *out) {
    fe_mat m[3][FE_MOE_BATCH];
    const fe_mat *w[FE_MATMUL_MULTI_MAX] = {0};
    float *y[FE_MATMUL_MULTI_MAX] = {0};
    const size_t f = (size_t)bk->part[0].rows;
    for (int i = 0; i < n; i++) {
        for (int part = 0; part < 3; part++) m[part][i] = fe_expert_mat(bk, part, rec[i]);
        w[2 * i] = &m[0][i], w[2 * i + 1] = &m[1][i];
        y[2 * i] = h1 + (size_t)i * f, y[2 * i + 1] = h2 + (size_t)i * f;
    }
    fe_matmul_multi(ops, w, 2 * n, in, 1, y);
    act(act_ctx, h1, h2, (size_t)n * f);
    for (int i = 0; i < n; i++) w[i] = &m[2][i];
    fe_matmul_each(ops, w, n, h1, f, out);
}
