/* kimi_manifest.c — parse manifest model.kimi (see kimi_manifest.h). */
#include "kimi_manifest.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "container.h"

typedef struct {
    const fe_json *doc;
    ferry_error *err;
} kreader;

static ferry_status kbad(kreader *r, const char *where, const char *key, const char *what) {
    return fe_fail(r->err, FERRY_E_FORMAT, "manifest.json: model.kimi%s%s.%s %s", *where ? "." : "", where, key,
                   what);
}

static const fe_json_node *kobj(kreader *r, const fe_json_node *o, const char *key) {
    const fe_json_node *n = fe_json_get(r->doc, o, key);
    return n && n->type == FE_JSON_OBJECT ? n : NULL;
}

static ferry_status kint(kreader *r, const fe_json_node *o, const char *where, const char *key, int lo, int hi,
                         int *out) {
    const fe_json_node *n = fe_json_get(r->doc, o, key);
    if (!n) return kbad(r, where, key, "is missing");
    if (n->type != FE_JSON_NUMBER || !n->is_integer || n->num < lo || n->num > hi) {
        char msg[96];
        snprintf(msg, sizeof msg, "must be an integer from %d to %d", lo, hi);
        return kbad(r, where, key, msg);
    }
    *out = (int)n->num;
    return FERRY_OK;
}

static ferry_status kfloat(kreader *r, const fe_json_node *o, const char *where, const char *key, double lo,
                           double hi, float *out) {
    const fe_json_node *n = fe_json_get(r->doc, o, key);
    if (!n) return kbad(r, where, key, "is missing");
    if (n->type != FE_JSON_NUMBER || !(n->num >= lo) || !(n->num <= hi) || !isfinite(n->num))
        return kbad(r, where, key, "is not a number in range");
    *out = (float)n->num;
    return FERRY_OK;
}

static ferry_status kbool(kreader *r, const fe_json_node *o, const char *where, const char *key, int *out) {
    const fe_json_node *n = fe_json_get(r->doc, o, key);
    if (!n) return kbad(r, where, key, "is missing");
    if (n->type != FE_JSON_TRUE && n->type != FE_JSON_FALSE) return kbad(r, where, key, "must be true or false");
    *out = n->type == FE_JSON_TRUE;
    return FERRY_OK;
}

static ferry_status kstr(kreader *r, const fe_json_node *o, const char *where, const char *key, const char **out) {
    const fe_json_node *n = fe_json_get(r->doc, o, key);
    if (!n) return kbad(r, where, key, "is missing");
    if (n->type != FE_JSON_STRING) return kbad(r, where, key, "must be a string");
    *out = n->str;
    return FERRY_OK;
}

/* YaRN / plain RoPE inverse frequencies, as transformers computes them. */
static void rope_freqs(fe_kimi_hparams *k) {
    int dim = k->qk_rope_dim, half = dim / 2;
    for (int i = 0; i < half; i++) {
        float pos_freq = powf(k->rope_theta, (float)(2 * i) / (float)dim);
        float extra = 1.0f / pos_freq;
        if (k->yarn_factor <= 0.0f) {
            k->rope_inv_freq[i] = extra;
            continue;
        }
        float inter = 1.0f / (k->yarn_factor * pos_freq);
        double lo = (dim * log(k->yarn_orig_ctx / (k->yarn_beta_fast * 2 * 3.14159265358979323846))) / (2 * log(k->rope_theta));
        double hi = (dim * log(k->yarn_orig_ctx / (k->yarn_beta_slow * 2 * 3.14159265358979323846))) / (2 * log(k->rope_theta));
        lo = floor(lo);
        hi = ceil(hi);
        if (lo < 0) lo = 0;
        if (hi > dim - 1) hi = dim - 1;
        if (lo == hi) hi += 0.001;
        float ramp = ((float)i - (float)lo) / (float)(hi - lo);
        ramp = ramp < 0.0f ? 0.0f : ramp > 1.0f ? 1.0f : ramp;
        float extra_factor = 1.0f - ramp;
        k->rope_inv_freq[i] = inter * (1.0f - extra_factor) + extra * extra_factor;
    }
}

static ferry_status parse_mla(kreader *r, const fe_json_node *m, fe_kimi_hparams *k) {
    const char *w = "mla";
    ferry_status s;
    if (!m) return kbad(r, "", "mla", "must be an object when a layer is \"mla\"");
    if ((s = kint(r, m, w, "heads", 1, 1024, &k->mla_heads))) return s;
    if ((s = kint(r, m, w, "q_lora_rank", 0, 65536, &k->q_lora_rank))) return s;
    if ((s = kint(r, m, w, "kv_lora_rank", 1, 65536, &k->kv_lora_rank))) return s;
    if ((s = kint(r, m, w, "qk_nope_dim", 1, 1024, &k->qk_nope_dim))) return s;
    if ((s = kint(r, m, w, "qk_rope_dim", 0, 1024, &k->qk_rope_dim))) return s;
    if ((s = kint(r, m, w, "v_dim", 1, 1024, &k->v_dim))) return s;
    if ((s = kbool(r, m, w, "rope", &k->mla_rope))) return s;
    if ((s = kbool(r, m, w, "rope_interleaved", &k->rope_interleaved))) return s;
    if ((s = kbool(r, m, w, "output_gate", &k->mla_out_gate))) return s;
    if ((s = kfloat(r, m, w, "softmax_scale", 1e-9, 1e6, &k->softmax_scale))) return s;
    if ((s = kfloat(r, m, w, "latent_norm_eps", 1e-12, 1.0, &k->latent_eps))) return s;
    if (k->qk_rope_dim % 2) return kbad(r, w, "qk_rope_dim", "must be even");
    k->rope_attn_factor = 1.0f;
    if (k->mla_rope) {
        if ((s = kfloat(r, m, w, "rope_theta", 1e-6, 1e12, &k->rope_theta))) return s;
        const fe_json_node *y = fe_json_get(r->doc, m, "yarn");
        if (y && y->type == FE_JSON_OBJECT) {
            const char *yw = "mla.yarn";
            if ((s = kfloat(r, y, yw, "factor", 1.0, 1e6, &k->yarn_factor))) return s;
            if ((s = kint(r, y, yw, "original_ctx", 1, 1 << 24, &k->yarn_orig_ctx))) return s;
            if ((s = kfloat(r, y, yw, "beta_fast", 1e-6, 1e6, &k->yarn_beta_fast))) return s;
            if ((s = kfloat(r, y, yw, "beta_slow", 1e-6, 1e6, &k->yarn_beta_slow))) return s;
            if ((s = kfloat(r, y, yw, "attn_factor", 1e-6, 1e6, &k->rope_attn_factor))) return s;
        } else if (y && y->type != FE_JSON_NULL) {
            return kbad(r, w, "yarn", "must be an object or null");
        }
        k->rope_inv_freq = calloc((size_t)(k->qk_rope_dim / 2 + 1), sizeof(float));
        if (!k->rope_inv_freq) return fe_fail(r->err, FERRY_E_NOMEM, "out of memory");
        rope_freqs(k);
    }
    return FERRY_OK;
}

static ferry_status parse_kda(kreader *r, const fe_json_node *m, fe_kimi_hparams *k) {
    const char *w = "kda", *decay;
    ferry_status s;
    if (!m) return kbad(r, "", "kda", "must be an object when a layer is \"kda\"");
    if ((s = kint(r, m, w, "heads", 1, 1024, &k->kda_heads))) return s;
    if ((s = kint(r, m, w, "head_dim", 1, 1024, &k->kda_head_dim))) return s;
    if ((s = kint(r, m, w, "conv_kernel", 1, 64, &k->conv_kernel))) return s;
    if ((s = kint(r, m, w, "a_log_len", k->kda_heads, 1 << 20, &k->a_log_len))) return s;
    if ((s = kbool(r, m, w, "full_rank_gate", &k->kda_full_gate))) return s;
    if ((s = kstr(r, m, w, "decay", &decay))) return s;
    if (strcmp(decay, "softplus") == 0) k->kda_decay = FE_KIMI_DECAY_SOFTPLUS;
    else if (strcmp(decay, "bounded") == 0) {
        k->kda_decay = FE_KIMI_DECAY_BOUNDED;
        if ((s = kfloat(r, m, w, "gate_lower_bound", -1e4, -1e-9, &k->gate_lower_bound))) return s;
    } else
        return kbad(r, w, "decay", "must be \"softplus\" or \"bounded\"");
    return FERRY_OK;
}

static ferry_status parse_ffn(kreader *r, const fe_json_node *m, fe_hparams *hp, fe_kimi_hparams *k) {
    const char *w = "ffn", *act;
    ferry_status s;
    if (!m) return kbad(r, "", "ffn", "is missing or not an object");
    if ((s = kstr(r, m, w, "act", &act))) return s;
    if (strcmp(act, "silu") == 0) k->act = FE_KIMI_ACT_SILU;
    else if (strcmp(act, "situ") == 0) {
        k->act = FE_KIMI_ACT_SITU;
        if ((s = kfloat(r, m, w, "situ_beta", 1e-6, 1e6, &k->situ_beta))) return s;
        if ((s = kfloat(r, m, w, "situ_linear_beta", 1e-6, 1e6, &k->situ_linear_beta))) return s;
    } else
        return kbad(r, w, "act", "must be \"silu\" or \"situ\"");
    if (hp->n_experts == 0) return FERRY_OK;
    if ((s = kint(r, m, w, "n_group", 1, 1024, &k->n_group))) return s;
    if ((s = kint(r, m, w, "topk_group", 1, k->n_group, &k->topk_group))) return s;
    if ((s = kfloat(r, m, w, "routed_scale", 1e-6, 1e6, &k->routed_scale))) return s;
    if ((s = kint(r, m, w, "shared_ffn_dim", 0, 1 << 20, &k->shared_ffn_dim))) return s;
    if ((s = kint(r, m, w, "latent_dim", 0, 65536, &k->latent_dim))) return s;
    if (hp->n_experts % k->n_group) return kbad(r, w, "n_group", "must divide model.moe.n_experts");
    int per_group = hp->n_experts / k->n_group;
    if (k->n_group > 1 && per_group < 2) return kbad(r, w, "n_group", "leaves fewer than 2 experts per group");
    if (hp->top_k > k->topk_group * per_group) return kbad(r, w, "topk_group", "holds fewer experts than top_k");
    hp->expert_dim = k->latent_dim ? k->latent_dim : hp->dim;
    return FERRY_OK;
}

ferry_status fe_kimi_parse(const fe_json *doc, const fe_json_node *model, fe_hparams *hp, ferry_error *err) {
    kreader r = {doc, err};
    const fe_json_node *m = fe_json_get(doc, model, "kimi");
    if (!m || m->type != FE_JSON_OBJECT)
        return fe_fail(err, FERRY_E_FORMAT, "manifest.json: model.kimi is missing or not an object");
    fe_kimi_hparams *k = calloc(1, sizeof *k);
    if (!k) return fe_fail(err, FERRY_E_NOMEM, "out of memory");
    hp->kimi = k;
    k->layer_kda = calloc((size_t)hp->n_layers, 1);
    if (!k->layer_kda) return fe_fail(err, FERRY_E_NOMEM, "out of memory");
    const fe_json_node *kinds = fe_json_get(doc, m, "layer_attn");
    if (!kinds || kinds->type != FE_JSON_ARRAY || kinds->count != hp->n_layers)
        return kbad(&r, "", "layer_attn", "must be an array with one entry per layer");
    for (int i = 0; i < hp->n_layers; i++) {
        const fe_json_node *n = fe_json_child(doc, kinds, i);
        if (n->type == FE_JSON_STRING && strcmp(n->str, "mla") == 0) k->n_mla++;
        else if (n->type == FE_JSON_STRING && strcmp(n->str, "kda") == 0) k->layer_kda[i] = 1, k->n_kda++;
        else return kbad(&r, "", "layer_attn", "entries must be \"mla\" or \"kda\"");
    }
    ferry_status s;
    if (k->n_mla && (s = parse_mla(&r, kobj(&r, m, "mla"), k))) return s;
    if (k->n_kda && (s = parse_kda(&r, kobj(&r, m, "kda"), k))) return s;
    if ((s = parse_ffn(&r, kobj(&r, m, "ffn"), hp, k))) return s;
    if ((s = kint(&r, m, "", "attn_res_block", 0, 1024, &k->attn_res_block))) return s;
    if (k->attn_res_block) k->n_res_blocks = (hp->n_layers + k->attn_res_block - 1) / k->attn_res_block;
    return FERRY_OK;
}

void fe_kimi_free(fe_kimi_hparams *k) {
    if (!k) return;
    free(k->layer_kda);
    free(k->rope_inv_freq);
    free(k);
}
