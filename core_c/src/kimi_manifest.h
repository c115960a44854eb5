/* kimi_manifest.h — the extra hyperparameters of the "kimi" architecture
 * (DeepSeek-V3 / Kimi-K2, Kimi-Linear, Kimi K3), read from manifest
 * model.kimi into a struct hung off fe_hparams. See docs/KIMI.md. */
#ifndef FERRY_KIMI_MANIFEST_H
#define FERRY_KIMI_MANIFEST_H

#include "common.h"
#include "json.h"

struct fe_hparams;

enum { FE_KIMI_ACT_SILU = 0, FE_KIMI_ACT_SITU = 1 };
enum { FE_KIMI_DECAY_SOFTPLUS = 0, FE_KIMI_DECAY_BOUNDED = 1 };

typedef struct fe_kimi_hparams {
    uint8_t *layer_kda;     /* n_layers flags: 1 KDA (Kimi Delta Attention), 0 MLA */
    int n_mla, n_kda;       /* how many layers of each kind */
    /* MLA (multi-head latent attention) */
    int mla_heads;          /* query heads */
    int q_lora_rank;        /* 0: plain q projection; else q_a -> norm -> q_b */
    int kv_lora_rank;       /* latent width c (cached) */
    int qk_nope_dim;        /* per-head key/query width without position */
    int qk_rope_dim;        /* the shared key slice k_r (cached), rotated or not */
    int v_dim;              /* per-head value width */
    int mla_rope;           /* 1: rotate the rope slice (DeepSeek); 0: NoPE (Kimi) */
    int rope_interleaved;   /* pairs (2i, 2i+1) when 1, (i, i+d/2) when 0 */
    int mla_out_gate;       /* context * sigmoid(g_proj x) before o_proj (K3) */
    float softmax_scale;    /* score scale (YaRN mscale folded in) */
    float latent_eps;       /* epsilon of the q_a and kv_a RMSNorms (1e-6 in the releases) */
    float rope_theta;       /* RoPE base */
    float yarn_factor;      /* 0: plain RoPE; else YaRN scaling factor */
    int yarn_orig_ctx;      /* YaRN original_max_position_embeddings */
    float yarn_beta_fast, yarn_beta_slow; /* YaRN ramp bounds */
    float rope_attn_factor; /* multiplies cos and sin (YaRN attention factor) */
    float *rope_inv_freq;   /* qk_rope_dim / 2 frequencies, computed at parse */
    /* KDA */
    int kda_heads, kda_head_dim, conv_kernel;
    int kda_full_gate;      /* 1: g_proj [HD, dim] (K3); 0: g_b(g_a x) (Kimi-Linear) */
    int kda_decay;          /* FE_KIMI_DECAY_* */
    float gate_lower_bound; /* bounded decay: log a = lb * sigmoid(exp(A) z) */
    int a_log_len;          /* stored length of A_log (>= kda_heads; the rest is padding) */
    /* feed-forward */
    int act;                /* FE_KIMI_ACT_* */
    float situ_beta, situ_linear_beta;
    int n_group, topk_group;/* group-limited routing */
    float routed_scale;     /* routed_scaling_factor */
    int shared_ffn_dim;     /* fused shared experts' width, 0 = none */
    int latent_dim;         /* latent MoE width (experts run on it), 0 = none */
    /* Attention Residuals */
    int attn_res_block;     /* block size B, 0 = plain residual stream */
    int n_res_blocks;       /* block sums stored: ceil(n_layers / B) */
} fe_kimi_hparams;

/* Parse model.kimi of the manifest into hp->kimi (and hp->expert_dim). */
ferry_status fe_kimi_parse(const fe_json *doc, const fe_json_node *model, struct fe_hparams *hp,
                           ferry_error *err);
void fe_kimi_free(fe_kimi_hparams *k);

#endif
