/* ops.c — see ops.h. */
#include "ops.h"

#include <math.h>
#include <stddef.h>

#include "formats.h"
#include "kernels.h"

fe_mat fe_mat_view(const uint8_t *data, int fmt, int rows, int cols) {
    fe_mat m = {data, fmt, rows, cols, fe_row_bytes(fmt, (uint64_t)cols)};
    return m;
}

typedef struct {
    const fe_ops *ops;  /* pool and row buffers */
    const fe_mat *w;    /* the matrix */
    const float *x;     /* [n][cols] */
    float *y;           /* [n][rows] */
    int n;              /* tokens */
    fe_rowdot_fn dot;   /* the row kernel of w's format (kernels.h) */
} matmul_job;

/* Rows [start, end) of y for every token: one kernel call per weight row, so
 * each output is computed by the same code whatever n is. */
static void matmul_rows(void *p, int start, int end, int tid) {
    matmul_job *j = p;
    const fe_mat *w = j->w;
    float *buf = j->ops->rows + (size_t)tid * (size_t)j->ops->rows_stride;
    for (int r = start; r < end; r++)
        j->dot(w->data + (uint64_t)r * w->row_bytes, w->cols, j->x, (size_t)w->cols, j->n, j->y + r,
               (size_t)w->rows, buf);
}

void fe_matmul(const fe_ops *ops, const fe_mat *w, const float *x, int n, float *y) {
    matmul_job j = {ops, w, x, y, n, fe_kernel_for(ops->kernels, w->fmt)};
    if (!j.dot) return;
    fe_pool_run(ops->pool, matmul_rows, &j, w->rows);
}

void fe_rmsnorm(float *out, const float *x, const float *w, int n, float eps) {
    double ss = 0.0;
    for (int i = 0; i < n; i++) ss += (double)x[i] * x[i];
    float scale = (float)(1.0 / sqrt(ss / n + eps));
    for (int i = 0; i < n; i++) out[i] = w[i] * (x[i] * scale);
}

float fe_silu(float x) { return x / (1.0f + expf(-x)); }

float fe_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

void fe_softmax(float *x, int n) {
    float m = x[0];
    for (int i = 1; i < n; i++) m = x[i] > m ? x[i] : m;
    double sum = 0.0;
    for (int i = 0; i < n; i++) { x[i] = expf(x[i] - m); sum += x[i]; }
    float inv = (float)(1.0 / sum);
    for (int i = 0; i < n; i++) x[i] *= inv;
}
