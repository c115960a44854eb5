/* container.h — a Ferry container on disk: manifest, trunk, expert banks.
 *
 * Everything here is untrusted input. Opening parses manifest.json, bounds
 * every number, checks every tensor against the file that holds it and every
 * expert bank's header against the manifest. See docs/FORMAT.md. */
#ifndef FERRY_CONTAINER_H
#define FERRY_CONTAINER_H

#include <stdint.h>

#include "common.h"

#define FE_MAX_NAME 96
#define FE_MAX_PATH 4096
#define FE_MAX_DIMS 4
#define FE_RECORD_ALIGN 4096u
#define FE_RECORD_HEADER_BYTES 64u
#define FE_BANK_HEADER_BYTES 4096u

/* Model hyperparameters the forward pass needs (manifest "model"). */
typedef struct fe_hparams {
    char arch[32];          /* family: "llama" or "kimi" */
    int n_layers;           /* transformer blocks */
    int dim;                /* residual width */
    int n_heads;            /* query heads */
    int n_kv_heads;         /* key/value heads */
    int head_dim;           /* width of one head */
    int ffn_dim;            /* dense feed-forward width (0 if no dense layer) */
    int vocab;              /* vocabulary size */
    int max_ctx;            /* trained context length */
    float norm_eps;         /* RMSNorm epsilon */
    float rope_theta;       /* RoPE base */
    int rope_dim;           /* leading dims of each head that rotate */
    int rope_interleaved;   /* 1: pairs (2i, 2i+1) (GGUF); 0: pairs (i, i+d/2) (HF) */
    int qkv_bias;           /* q, k, v projections have biases */
    int o_bias;             /* the output projection has a bias */
    int qk_norm;            /* 0 none, 1 per-head RMSNorm, 2 RMSNorm over all heads */
    int tied_embeddings;    /* output projection is the embedding matrix */
    int n_experts;          /* experts per MoE layer, 0 for dense models */
    int top_k;              /* experts per token */
    int expert_ffn_dim;     /* hidden width of one expert */
    int norm_topk_prob;     /* renormalise the chosen experts' weights to sum 1 */
    uint8_t *layer_is_moe;  /* n_layers flags */
    int expert_dim;         /* width experts read and write, 0 = dim (latent MoE: narrower) */
    struct fe_kimi_hparams *kimi; /* arch "kimi" only (kimi_manifest.h), else NULL */
} fe_hparams;

/* One resident tensor of the trunk. */
typedef struct fe_tensor {
    char name[FE_MAX_NAME]; /* canonical name, e.g. "blk.3.attn_q" */
    int fmt;                /* fe_format */
    int n_dims;             /* 1 or 2 */
    uint64_t shape[FE_MAX_DIMS]; /* [rows, cols] for matrices, [n] for vectors */
    uint64_t offset;        /* byte offset in trunk.bin */
    uint64_t nbytes;        /* stored size */
    uint32_t crc32;         /* CRC-32 of the stored bytes */
    const uint8_t *data;    /* into the loaded trunk, NULL until loaded or when on demand */
    int on_demand;          /* not held in RAM: its rows are read from trunk.bin when used
                             * (fe_container_read_rows); set before loading the trunk */
} fe_tensor;

/* One matrix of an expert record. */
typedef struct fe_expert_part {
    int fmt;                /* fe_format */
    uint64_t rows, cols;    /* shape */
    uint32_t offset;        /* from the start of the record */
    uint32_t nbytes;        /* stored size */
} fe_expert_part;

/* The expert bank of one MoE layer: one file of fixed-size records. */
typedef struct fe_bank {
    int layer;              /* which layer */
    char path[FE_MAX_PATH]; /* absolute-or-relative path of the bank file */
    char rel[FE_MAX_NAME];  /* name inside the container, for messages */
    int fd;                 /* open file, or -1 */
    uint32_t n_experts;     /* records in the file */
    uint64_t record_size;   /* bytes per record, a multiple of 4096 */
    uint32_t payload_size;  /* bytes covered by each record's CRC */
    fe_expert_part part[3]; /* gate, up, down */
} fe_bank;

typedef struct fe_container {
    char dir[FE_MAX_PATH];  /* the container directory */
    fe_hparams hp;          /* model shape */
    fe_tensor *tensors;     /* trunk tensors */
    int n_tensors;          /* their count */
    uint64_t trunk_size;    /* size of trunk.bin */
    fe_bank *banks;         /* n_layers entries; banks[l].fd < 0 for dense layers */
    uint8_t *trunk;         /* trunk.bin in RAM without its on-demand tensors, or NULL when not loaded */
    size_t trunk_alloc;     /* its allocation's bytes (fe_alloc_huge) */
    int trunk_fd;           /* trunk.bin, kept open for on-demand reads when trunk_fd_open */
    int trunk_fd_open;
    uint64_t fingerprint;   /* identity of this exact container: CRC-32 of the manifest, and its length */
} fe_container;

/* Open the container's file `rel` (a plain relative name) for reading, into
 * *fd (its size in *size when not NULL): it must resolve, links followed, to
 * a regular file inside the folder `dir`. A FIFO is never waited on (it is
 * opened non-blocking and refused after fstat); a device, a folder or a link
 * out of the folder is refused, naming the file. */
ferry_status fe_container_open_file(const char *dir, const char *rel, uint64_t *size, int *fd, ferry_error *err);
/* Parse and validate the manifest and the headers of all bank files. Does
 * not load the trunk. */
ferry_status fe_container_open(fe_container *c, const char *dir, ferry_error *err);
/* Read trunk.bin into RAM and point the tensors at it; with check_threads
 * > 0, every tensor's CRC32 is then checked on that many threads
 * (fe_container_check_trunk). */
ferry_status fe_container_load_trunk(fe_container *c, int check_threads, ferry_error *err);
/* Keep the 2-D tensor `name` out of RAM (call before loading the trunk): its
 * rows are then read from trunk.bin when used. 1 if marked, 0 if absent. */
int fe_container_set_on_demand(fe_container *c, const char *name);
/* Bytes of trunk.bin the loaded trunk holds: all but the on-demand tensors'
 * (their 64-byte-aligned inner spans, so every resident tensor keeps its
 * alignment). */
uint64_t fe_container_resident_bytes(const fe_container *c);
/* Read rows [row, row + n) of the on-demand tensor t (row_bytes each) into
 * buf: one pread through the page cache. */
ferry_status fe_container_read_rows(const fe_container *c, const fe_tensor *t, uint64_t row, int n,
                                    uint64_t row_bytes, void *buf, ferry_error *err);
/* FERRY_E_CHECKSUM naming the first loaded tensor (in manifest order) whose
 * bytes do not match its CRC32, checked on n_threads threads. */
ferry_status fe_container_check_trunk(const fe_container *c, int n_threads, ferry_error *err);
void fe_container_close(fe_container *c);

/* Tensor by name, or NULL. */
const fe_tensor *fe_container_find(const fe_container *c, const char *name);

/* Check one record read into `buf` (record_size bytes) for (layer, expert):
 * magic, identity, formats, sizes; and its CRC when check_crc is set. */
ferry_status fe_bank_check_record(const fe_bank *b, uint32_t expert, const uint8_t *buf,
                                  int check_crc, ferry_error *err);
/* FERRY_E_CHECKSUM naming the record when `got` (the CRC32 of its payload,
 * computed by whoever read it) is not the one its header holds. */
ferry_status fe_bank_check_crc(const fe_bank *b, uint32_t expert, const uint8_t *buf, uint32_t got,
                               ferry_error *err);

#endif
