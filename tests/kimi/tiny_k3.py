"""A tiny random Kimi K3 checkpoint in the release's exact layout: the nested
config (KimiK3ForConditionalGeneration with text_config), the
`language_model.` prefix, bf16 matrices with the f32 exceptions of the
release (norms, A_log padded to a longer vector, dt_bias, conv kernels, the
router bias), compressed-tensors MXFP4 experts (weight_packed u8 with the
low nibble the even column, weight_scale u8 E8M0, group 32), three shards
behind model.safetensors.index.json, a vision tensor in the last shard, and
a tiktoken.model. 7 layers with AttnRes blocks of 3 (three block sums),
MLA at 1-based layers 4 and 7, KDA elsewhere, layer 0 dense. The expert
sizes can be raised (`moe_ffn`, `latent`) to rows that 256-value block
formats such as q3_nl can hold. With ``vision=True`` the last shard holds a
tiny random vision tower in the release's layout and names (MoonViT-V2 +
patchmergerv2, `vision_config` with every key the release has; bf16 like
the release) instead of the lone placeholder tensor."""
from __future__ import annotations

import base64
import json
from pathlib import Path

import numpy as np

HIDDEN, LAYERS, BLOCK = 64, 7, 3
HEADS, HEAD_DIM = 4, 16          # KDA and MLA heads
NOPE, ROPE, VDIM, QLORA, KVLORA = 16, 8, 16, 32, 32
EXPERTS, TOPK, MOE_FFN, LATENT, SHARED = 16, 4, 32, 32, 2
DENSE_FFN = 96
BASE_VOCAB = 256
VOCAB = BASE_VOCAB + 256
A_LOG_LEN = 8                    # padded beyond the 4 real heads, as the release pads 96 to 128
MEDIA_PAD = BASE_VOCAB + 21      # media_placeholder_token_id (163605 in the release)


def vision_config(**sizes) -> dict:
    """The release's vision_config keys at tiny sizes: patch 4, hidden 32,
    attention width 48 (3 heads of 16), MLP 64, 2 blocks, an 8x8 initial
    position grid, 2x2 merge, projector to the text width 64."""
    return {"activation_func": "gelu_pytorch_tanh", "attn_bias": False, "init_pos_emb_height": 8,
            "init_pos_emb_time": 4, "init_pos_emb_width": 8, "linear_bias": False, "merge_kernel_size": [2, 2],
            "merge_type": "sd2_tpool", "mlp_type": "mlp2", "mm_hidden_size": 32, "mm_projector_type": "patchmergerv2",
            "norm_type": "rmsnorm", "patch_embed_proj_bias": False, "patch_size": 4,
            "pos_emb_interpolation_mode": "bilinear", "pos_emb_type": "divided_fixed", "projector_hidden_act": "gelu",
            "projector_ln_eps": 1e-05, "qkv_hidden_size": 48, "text_hidden_size": HIDDEN, "vt_hidden_size": 32,
            "vt_intermediate_size": 64, "vt_num_attention_heads": 3, "vt_num_hidden_layers": 2, **sizes}


def vision_tensors(rng, c: dict | None = None) -> dict:
    """The tower's tensors by release name (bf16), random with norms around 1 (``c``: its vision_config)."""
    import torch

    c = c or vision_config()
    D, Q, I, p = c["vt_hidden_size"], c["qkv_hidden_size"], c["vt_intermediate_size"], c["patch_size"]
    M, T = 4 * c["mm_hidden_size"], c["text_hidden_size"]

    def bf(a):
        return torch.tensor(a, dtype=torch.float32).to(torch.bfloat16)

    def mat(*shape, scale=0.15):
        return bf(scale * rng.standard_normal(shape))

    def norm(n):
        return bf(1.0 + 0.2 * rng.standard_normal(n))

    v = {"vision_tower.patch_embed.proj.weight": mat(D, 3, p, p, scale=0.2),
         "vision_tower.patch_embed.pos_emb.weight": mat(c["init_pos_emb_height"], c["init_pos_emb_width"], D, scale=0.5)}
    for i in range(c["vt_num_hidden_layers"]):
        b = f"vision_tower.encoder.blocks.{i}."
        v.update({b + "norm0.weight": norm(D), b + "norm1.weight": norm(D), b + "wqkv.weight": mat(3 * Q, D),
                  b + "wo.weight": mat(D, Q), b + "mlp.fc0.weight": mat(I, D), b + "mlp.fc1.weight": mat(D, I)})
    v["vision_tower.encoder.final_layernorm.weight"] = norm(D)
    v["mm_projector.proj.0.weight"] = mat(M, M, scale=0.08)
    v["mm_projector.proj.2.weight"] = mat(T, M, scale=0.08)
    v["mm_projector.post_norm.weight"] = norm(T)
    return v


def text_config(moe_ffn: int = MOE_FFN, latent: int = LATENT, experts: int = EXPERTS, top_k: int = TOPK,
                layers: int = LAYERS) -> dict:
    # MLA at 1-based layers 4 and 7; a shorter model (bench/stream.py --true-shape) keeps its last layer MLA
    full = [i for i in (4, 7) if i <= layers] or [layers]
    return {
        "activation_situ_beta": 4.0, "activation_situ_linear_beta": 25.0,
        "architectures": ["KimiLinearForCausalLM"], "attn_res_block_size": BLOCK,
        "bos_token_id": BASE_VOCAB, "eos_token_id": BASE_VOCAB + 2, "pad_token_id": VOCAB - 1,
        "first_k_dense_replace": 1, "hidden_act": "situ", "hidden_size": HIDDEN,
        "intermediate_size": DENSE_FFN, "kv_lora_rank": KVLORA, "latent_moe_use_norm": True,
        "linear_attn_config": {"full_attn_layers": full, "gate_lower_bound": -5.0, "head_dim": HEAD_DIM,
                               "kda_layers": [i for i in range(1, layers + 1) if i not in full],
                               "num_heads": HEADS, "short_conv_kernel_size": 4, "use_full_rank_gate": True},
        "max_position_embeddings": 4096, "mla_use_nope": True, "mla_use_output_gate": True,
        "model_type": "kimi_linear", "moe_intermediate_size": moe_ffn, "moe_layer_freq": 1,
        "moe_renormalize": True, "moe_router_activation_func": "sigmoid", "num_attention_heads": HEADS,
        "num_expert_group": 1, "num_experts": experts, "num_experts_per_token": top_k,
        "num_hidden_layers": layers, "num_key_value_heads": HEADS, "num_nextn_predict_layers": 0,
        "num_shared_experts": SHARED, "q_lora_rank": QLORA, "qk_nope_head_dim": NOPE, "qk_rope_head_dim": ROPE,
        "quantization_config": {
            "config_groups": {"group_0": {"format": "mxfp4-pack-quantized", "targets": ["Linear"],
                                          "weights": {"group_size": 32, "num_bits": 4, "strategy": "group",
                                                      "symmetric": True, "type": "float",
                                                      "scale_dtype": "torch.uint8"}}},
            "format": "mxfp4-pack-quantized", "quant_method": "compressed-tensors",
            "ignore": ["re:.*self_attn.*", "re:.*shared_experts.*", "re:.*mlp\\.(gate|up|gate_up|down)_proj.*",
                       "re:.*lm_head.*", "re:.*vision_tower.*", "re:.*mm_projector.*"],
            "quantization_status": "compressed"},
        "rms_norm_eps": 1e-5, "routed_expert_hidden_size": latent, "routed_scaling_factor": 1.0,
        "tie_word_embeddings": False, "topk_group": 1, "topk_method": "noaux_tc", "use_grouped_topk": True,
        "v_head_dim": VDIM, "vocab_size": VOCAB,
    }


def config(moe_ffn: int = MOE_FFN, latent: int = LATENT, experts: int = EXPERTS, top_k: int = TOPK,
           vision: bool | dict = False, layers: int = LAYERS) -> dict:
    return {"architectures": ["KimiK3ForConditionalGeneration"], "model_type": "kimi_k3",
            "bos_token_id": BASE_VOCAB, "eos_token_id": BASE_VOCAB + 2, "pad_token_id": VOCAB - 1,
            "image_placeholder": "<|kimi_image_placeholder|>", "media_placeholder_token_id": MEDIA_PAD,
            "text_config": text_config(moe_ffn, latent, experts, top_k, layers), "tie_word_embeddings": False,
            "vision_config": vision_config(**vision) if isinstance(vision, dict) else vision_config() if vision
            else {"vt_hidden_size": 16}}


def build(out: Path, seed: int = 3, moe_ffn: int = MOE_FFN, latent: int = LATENT, experts: int = EXPERTS,
          top_k: int = TOPK, vision: bool | dict = False, layers: int = LAYERS) -> None:
    """``vision``: True for the tiny tower, or a dict of vision_config sizes to override (a bench's tower).
    ``layers``: fewer than LAYERS (layer 0 dense, the rest MoE) for a bench of few, large expert layers."""
    import torch
    from safetensors.torch import save_file

    rng = np.random.default_rng(seed)
    t: dict[str, torch.Tensor] = {}

    def mat(name, rows, cols, scale=0.08):
        t[name] = torch.tensor(scale * rng.standard_normal((rows, cols)), dtype=torch.float32).to(torch.bfloat16)

    def norm(name, n, dtype=torch.float32):
        t[name] = torch.tensor(1.0 + 0.2 * rng.standard_normal(n), dtype=torch.float32).to(dtype)

    def f32(name, shape, scale=0.08, offset=0.0):
        t[name] = torch.tensor(offset + scale * rng.standard_normal(shape), dtype=torch.float32)

    def mxfp4(name, rows, cols):
        t[name + ".weight_packed"] = torch.tensor(rng.integers(0, 256, (rows, cols // 2)), dtype=torch.uint8)
        # scales around 2^-6: e2m1 values up to 6 give weights of up to ~0.1
        t[name + ".weight_scale"] = torch.tensor(rng.integers(119, 123, (rows, cols // 32)), dtype=torch.uint8)

    P = "language_model.model."
    mat(P + "embed_tokens.weight", VOCAB, HIDDEN, 1.0)
    HD = HEADS * HEAD_DIM
    cfg = text_config(moe_ffn, latent, experts, top_k, layers)
    kda = {i - 1 for i in cfg["linear_attn_config"]["kda_layers"]}
    for i in range(layers):
        L = P + f"layers.{i}."
        a = L + "self_attn."
        norm(L + "input_layernorm.weight", HIDDEN)
        norm(L + "post_attention_layernorm.weight", HIDDEN)
        norm(L + "self_attention_res_norm.weight", HIDDEN)
        mat(L + "self_attention_res_proj.weight", 1, HIDDEN, 0.3)
        norm(L + "mlp_res_norm.weight", HIDDEN)
        mat(L + "mlp_res_proj.weight", 1, HIDDEN, 0.3)
        if i in kda:
            for w in "qkv":
                mat(a + f"{w}_proj.weight", HD, HIDDEN)
                f32(a + f"{w}_conv1d.weight", (HD, 1, 4), 0.5)
            mat(a + "f_a_proj.weight", HEAD_DIM, HIDDEN)
            mat(a + "f_b_proj.weight", HD, HEAD_DIM, 0.3)
            f32(a + "dt_bias", (HD,), 0.5)
            alog = np.zeros(A_LOG_LEN, dtype=np.float32)
            alog[:HEADS] = np.log(rng.uniform(1, 16, HEADS))
            t[a + "A_log"] = torch.tensor(alog)
            mat(a + "b_proj.weight", HEADS, HIDDEN)
            mat(a + "g_proj.weight", HD, HIDDEN)
            norm(a + "o_norm.weight", HEAD_DIM)
            mat(a + "o_proj.weight", HIDDEN, HD)
        else:
            mat(a + "q_a_proj.weight", QLORA, HIDDEN)
            norm(a + "q_a_layernorm.weight", QLORA)
            mat(a + "q_b_proj.weight", HEADS * (NOPE + ROPE), QLORA, 0.2)
            mat(a + "kv_a_proj_with_mqa.weight", KVLORA + ROPE, HIDDEN)
            norm(a + "kv_a_layernorm.weight", KVLORA)
            mat(a + "kv_b_proj.weight", HEADS * (NOPE + VDIM), KVLORA, 0.2)
            mat(a + "g_proj.weight", HEADS * VDIM, HIDDEN)
            mat(a + "o_proj.weight", HIDDEN, HEADS * VDIM)
        if i == 0:
            mat(L + "mlp.gate_proj.weight", DENSE_FFN, HIDDEN)
            mat(L + "mlp.up_proj.weight", DENSE_FFN, HIDDEN)
            mat(L + "mlp.down_proj.weight", HIDDEN, DENSE_FFN)
            continue
        m = L + "block_sparse_moe."
        mat(m + "gate.weight", experts, HIDDEN, 0.3)
        f32(m + "gate.e_score_correction_bias", (experts,), 0.05)
        mat(m + "routed_expert_down_proj.weight", latent, HIDDEN, 0.2)
        mat(m + "routed_expert_up_proj.weight", HIDDEN, latent, 0.2)
        norm(m + "routed_expert_norm.weight", latent)
        mat(m + "shared_experts.gate_proj.weight", SHARED * moe_ffn, HIDDEN)
        mat(m + "shared_experts.up_proj.weight", SHARED * moe_ffn, HIDDEN)
        mat(m + "shared_experts.down_proj.weight", HIDDEN, SHARED * moe_ffn)
        for e in range(experts):
            ex = m + f"experts.{e}."
            mxfp4(ex + "w1", moe_ffn, latent)
            mxfp4(ex + "w3", moe_ffn, latent)
            mxfp4(ex + "w2", latent, moe_ffn)
    norm(P + "norm.weight", HIDDEN)
    norm(P + "output_attn_res_norm.weight", HIDDEN)
    mat(P + "output_attn_res_proj.weight", 1, HIDDEN, 0.3)
    mat("language_model.lm_head.weight", VOCAB, HIDDEN)
    vcfg = vision_config(**(vision if isinstance(vision, dict) else {}))
    tower = (vision_tensors(np.random.default_rng(seed + 100), vcfg) if vision
             else {"vision_tower.patch_embed.proj.weight": torch.zeros(16, 12, dtype=torch.bfloat16)})

    out.mkdir(parents=True, exist_ok=True)
    names = list(t)
    shards = [names[: len(names) // 2], names[len(names) // 2:]]
    n_shards = len(shards) + 1
    weight_map = {}
    for k, group in enumerate(shards + [list(tower)]):
        fname = f"model-{k + 1:05d}-of-{n_shards:05d}.safetensors"
        src = tower if k == len(shards) else t
        save_file({n: src[n].contiguous() for n in group}, str(out / fname), metadata={"format": "pt"})
        weight_map.update({n: fname for n in group})
    (out / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    (out / "config.json").write_text(json.dumps(config(moe_ffn, latent, experts, top_k, vision=vision, layers=layers), indent=1))
    (out / "tiktoken.model").write_text("".join(f"{base64.b64encode(bytes([b])).decode()} {b}\n"
                                                for b in range(BASE_VOCAB)))
    (out / "tokenizer_config.json").write_text(json.dumps({"bos_token": "[BOS]", "eos_token": "[EOS]",
                                                           "add_bos_token": False}))
