"""Tiny random DeepSeek-V3 and Kimi-Linear checkpoints from `transformers`,
saved in the *release* tensor naming (per-expert w1/w2/w3 or gate/up/down,
separate q/k/v conv kernels, forget-gate tensors directly under self_attn,
`block_sparse_moe.`), so that the converter reads what the real checkpoints
hold; plus the engine run and per-stage comparison used by the tests."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from tests.tiny_models import write_tokenizer

VOCAB = 96

DEEPSEEK = dict(
    vocab_size=VOCAB, hidden_size=64, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=4,
    q_lora_rank=32, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16,
    n_routed_experts=16, num_experts_per_tok=4, n_group=4, topk_group=2, moe_intermediate_size=24,
    intermediate_size=96, first_k_dense_replace=1, n_shared_experts=1, routed_scaling_factor=2.5,
    norm_topk_prob=True, max_position_embeddings=256, rms_norm_eps=1e-5, tie_word_embeddings=False,
    bos_token_id=1, eos_token_id=2, pad_token_id=0,
    rope_parameters=dict(rope_type="yarn", rope_theta=10000.0, factor=4.0, original_max_position_embeddings=64,
                         beta_fast=32, beta_slow=1, mscale=1.0, mscale_all_dim=1.0),
)

# Release-style config (linear_attn_config with 1-based layer lists).
KIMI_LINEAR = dict(
    architectures=["KimiLinearForCausalLM"], model_type="kimi_linear",
    vocab_size=VOCAB, hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=4,
    q_lora_rank=None, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16,
    mla_use_nope=True, num_experts=8, num_experts_per_token=2, num_shared_experts=1, moe_intermediate_size=24,
    intermediate_size=96, first_k_dense_replace=1, routed_scaling_factor=2.446, moe_renormalize=True,
    num_expert_group=1, topk_group=1, hidden_act="silu", max_position_embeddings=256, rms_norm_eps=1e-5,
    tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=0,
    linear_attn_config=dict(kda_layers=[1, 2, 4], full_attn_layers=[3], head_dim=16, num_heads=4,
                            short_conv_kernel_size=4),
)


def _randomize(model, torch):
    torch.manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 1 and "bias" not in name:
                p.copy_(1.0 + 0.2 * torch.randn_like(p))   # norms: not all ones
            else:
                p.copy_(0.08 * torch.randn_like(p))
        for name, buf in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                buf.copy_(0.05 * torch.randn_like(buf))


def release_names(state: dict, kind: str, conv_dim: int = 0) -> dict:
    """transformers' parameter names -> the release checkpoint's."""
    out = {}
    for name, t in state.items():
        t = t.detach().float().contiguous().numpy()
        if ".experts.gate_up_proj" in name:
            base = name.replace(".experts.gate_up_proj", ".experts.")
            if kind == "kimi":
                base = base.replace(".mlp.", ".block_sparse_moe.")
            half = t.shape[1] // 2
            g, u = ("gate_proj", "up_proj") if kind == "deepseek" else ("w1", "w3")
            for e in range(t.shape[0]):
                out[f"{base}{e}.{g}.weight"] = np.ascontiguousarray(t[e, :half])
                out[f"{base}{e}.{u}.weight"] = np.ascontiguousarray(t[e, half:])
            continue
        if ".experts.down_proj" in name:
            base = name.replace(".experts.down_proj", ".experts.")
            if kind == "kimi":
                base = base.replace(".mlp.", ".block_sparse_moe.")
            d = "down_proj" if kind == "deepseek" else "w2"
            for e in range(t.shape[0]):
                out[f"{base}{e}.{d}.weight"] = np.ascontiguousarray(t[e])
            continue
        if kind == "kimi":
            if ".mlp.gate." in name or ".mlp.shared_experts." in name:
                name = name.replace(".mlp.", ".block_sparse_moe.")
            name = name.replace(".self_attn.forget_gate.", ".self_attn.")
            if name.endswith(".self_attn.conv1d.weight"):
                base = name[:-len("conv1d.weight")]
                for i, w in enumerate("qkv"):
                    out[f"{base}{w}_conv1d.weight"] = np.ascontiguousarray(t[i * conv_dim:(i + 1) * conv_dim])
                continue
        out[name] = t
    return out


def build(kind: str, out: Path, **overrides):
    """Write a random checkpoint ('deepseek' or 'kimi_linear') in release naming; returns the torch model.
    ``overrides`` replace entries of the config (e.g. num_experts for a benchmark)."""
    import torch
    import transformers
    from safetensors.numpy import save_file

    if kind == "deepseek":
        cfg = transformers.DeepseekV3Config(**{**DEEPSEEK, **overrides})
        model = transformers.DeepseekV3ForCausalLM(cfg)
        config = cfg.to_dict()
        config["architectures"] = ["DeepseekV3ForCausalLM"]
        conv_dim, naming = 0, "deepseek"
    else:
        raw = {**KIMI_LINEAR, **overrides}
        cfg = transformers.KimiLinearConfig(**{k: v for k, v in raw.items() if k not in ("architectures",)})
        model = transformers.KimiLinearForCausalLM(cfg)
        config = raw
        conv_dim = raw["linear_attn_config"]["head_dim"] * raw["linear_attn_config"]["num_heads"]
        naming = "kimi"
    _randomize(model, torch)
    model.eval()
    out.mkdir(parents=True, exist_ok=True)
    tensors = release_names(model.state_dict(), naming, conv_dim)
    save_file(tensors, str(out / "model.safetensors"))
    (out / "config.json").write_text(json.dumps(config, default=str))
    write_tokenizer(out, VOCAB)
    return model
