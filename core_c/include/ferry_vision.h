/* ferry_vision.h — Kimi K3's vision tower (MoonViT-V2 + the patchmergerv2
 * projector) over one image's patches, from a container's trunk.bin.
 *
 * Conventions as ferry.h: an opaque handle, every call that can fail returns
 * a ferry_status and fills the caller-owned ferry_error, no global state,
 * nothing printed. A handle serves one call at a time. The tower's tensors
 * are the trunk tensors named "v.*" and "mm.*" (docs/KIMI.md, "Images");
 * the language model's tensors are not loaded by it. */
#ifndef FERRY_VISION_H
#define FERRY_VISION_H

#include <stdint.h>

#include "ferry.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ferry_vision ferry_vision;

/* The tower's shape (the manifest's "vision" section, read by the caller):
 * every tensor is checked against it when the tower is opened. */
typedef struct ferry_vision_config {
    int patch_size;        /* pixels per patch side (14) */
    int hidden;            /* residual width (1024) */
    int qkv_hidden;        /* attention width, heads x head_dim (1536) */
    int heads;             /* attention heads (12); head_dim a multiple of 4 */
    int layers;            /* transformer blocks (27) */
    int intermediate;      /* MLP width (4096) */
    int pos_h, pos_w;      /* the position table's grid (64 x 64) */
    int merge_h, merge_w;  /* patches merged into one output row (2 x 2) */
    int text_hidden;       /* the projector's output width (7168) */
    float norm_eps;        /* the tower's RMSNorm epsilon */
    float projector_eps;   /* the projector's post-norm epsilon */
    uint64_t weight_bytes; /* filled by ferry_vision_info: the tower's bytes in RAM */
} ferry_vision_config;

/* Called after each stage of an encode (stage 0: patches embedded; 1..L:
 * block outputs; L + 1: final norm; L + 2: merged rows; L + 3: projector
 * output) with that stage's rows [rows][dim]; a nonzero return stops the
 * encode with FERRY_E_CANCELLED. */
typedef int (*ferry_vision_stage_fn)(void *user, int stage, int rows, int dim, const float *data);

ferry_status ferry_vision_open(const char *path, const ferry_vision_config *config, int n_threads,
                               ferry_vision **out, ferry_error *err);
void ferry_vision_close(ferry_vision *vision);
void ferry_vision_info(const ferry_vision *vision, ferry_vision_config *config);

/* One image: patches [gh * gw][3 * patch * patch] (row-major over the patch
 * grid; each patch channel-major, then pixel rows, then columns; values
 * normalised), gh a multiple of merge_h and gw of merge_w. Writes out
 * [(gh / merge_h) * (gw / merge_w)][text_hidden]. */
ferry_status ferry_vision_encode(ferry_vision *vision, const float *patches, int gh, int gw, float *out,
                                 ferry_vision_stage_fn stage, void *user, ferry_error *err);

#ifdef __cplusplus
}
#endif

#endif
