/* model.c — what every architecture shares: the registry, tensor lookup for
 * binding, the stage observer. */
#include "model.h"

#include <stdio.h>
#include <string.h>

#include "formats.h"

static const fe_arch *const ARCHS[] = {&fe_arch_llama, &fe_arch_kimi};

const fe_arch *fe_arch_find(const char *name) {
    for (size_t i = 0; i < sizeof ARCHS / sizeof ARCHS[0]; i++)
        if (strcmp(ARCHS[i]->name, name) == 0) return ARCHS[i];
    return NULL;
}

uint64_t fe_max_record(const fe_container *c) {
    uint64_t m = 0;
    for (int l = 0; l < c->hp.n_layers; l++)
        if (c->banks[l].record_size > m) m = c->banks[l].record_size;
    return m;
}

ferry_status fe_embed(const ferry_engine *e, const fe_mat *emb, const int32_t *tokens, int n, float *out,
                      float *tmp, ferry_error *err) {
    const int d = emb->cols;
    const fe_tensor *t = emb->data ? NULL : fe_container_find(&e->c, "token_embd");
    for (int i = 0; i < n; i++) {
        const uint8_t *row;
        if (t) {
            ferry_status s = fe_container_read_rows(&e->c, t, (uint64_t)tokens[i], 1, emb->row_bytes,
                                                    tmp + (size_t)i * d, err);
            if (s) return s;
            row = (const uint8_t *)(tmp + (size_t)i * d);
        } else {
            row = emb->data + (uint64_t)tokens[i] * emb->row_bytes;
        }
        fe_dequant_row(emb->fmt, row, out + (size_t)i * d, d);
    }
    return FERRY_OK;
}

void fe_stage(ferry_session *s, int stage, int n, const float *hidden) {
    if (s->stage_fn) s->stage_fn(s->stage_user, stage, s->pos, n, s->e->c.hp.dim, hidden);
}

void fe_embed_override(const ferry_session *s, int n, float *x) {
    if (!s->embd) return;
    const int d = s->e->c.hp.dim;
    for (int i = 0; i < n; i++)
        if (s->embd_use[i]) memcpy(x + (size_t)i * d, s->embd + (size_t)i * d, (size_t)d * sizeof(float));
}

ferry_status fe_bind_mat(const fe_container *c, const char *name, int rows, int cols, fe_mat *m,
                         ferry_error *err) {
    const fe_tensor *t = fe_container_find(c, name);
    if (!t) return fe_fail(err, FERRY_E_FORMAT, "manifest.json: tensor %s is missing", name);
    if (t->n_dims != 2 || t->shape[0] != (uint64_t)rows || t->shape[1] != (uint64_t)cols)
        return fe_fail(err, FERRY_E_FORMAT, "manifest.json: tensor %s should be [%d, %d]", name, rows, cols);
    *m = fe_mat_view(t->data, t->fmt, rows, cols);
    return FERRY_OK;
}

ferry_status fe_bind_vec(const fe_container *c, const char *name, int n, int optional, const float **v,
                         ferry_error *err) {
    const fe_tensor *t = fe_container_find(c, name);
    *v = NULL;
    if (!t) return optional ? FERRY_OK : fe_fail(err, FERRY_E_FORMAT, "manifest.json: tensor %s is missing", name);
    if (t->n_dims != 1 || t->shape[0] != (uint64_t)n || t->fmt != FE_F32)
        return fe_fail(err, FERRY_E_FORMAT, "manifest.json: tensor %s should be f32 [%d]", name, n);
    *v = (const float *)t->data;
    return FERRY_OK;
}
