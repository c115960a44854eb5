"""The "llama" architecture (core_c/src/arch_llama.c): Llama, Mistral, Qwen2,
Qwen3 and the MoE models shaped like them (Qwen3-MoE, Mixtral, OLMoE), from a
Hugging Face config or GGUF metadata."""
from __future__ import annotations

from typing import Any

from app.convert.arch.spec import EXPERT_PARTS, ModelSpec, _context, _require
from app.convert.errors import SourceError

#: Per-layer trunk tensors in the order they are laid out in trunk.bin.
LLAMA_LAYER_TENSORS = ("attn_norm", "attn_q", "attn_q_bias", "attn_k", "attn_k_bias", "attn_v", "attn_v_bias",
                       "attn_q_norm", "attn_k_norm", "attn_output", "attn_output_bias", "ffn_norm", "ffn_gate_inp",
                       "ffn_gate", "ffn_up", "ffn_down")
#: Tensors that are vectors (always stored as f32).
LLAMA_VECTOR_SUFFIXES = ("attn_norm", "ffn_norm", "attn_q_bias", "attn_k_bias", "attn_v_bias", "attn_output_bias",
                         "attn_q_norm", "attn_k_norm")


def _rope_theta(cfg: dict) -> float:
    params = cfg.get("rope_parameters") or {}
    scaling = cfg.get("rope_scaling") or {}
    kind = params.get("rope_type") or scaling.get("rope_type") or scaling.get("type") or "default"
    if kind != "default":
        raise SourceError("config.json", f"RoPE scaling '{kind}' is not supported yet")
    return float(params.get("rope_theta", cfg.get("rope_theta", 10000.0)))


# Hugging Face architectures: the attention flavour and the MoE naming.
HF_ARCHS = {
    "LlamaForCausalLM": dict(qkv_bias=None, qk_norm="none", moe=None),  # bias from attention_bias
    "MistralForCausalLM": dict(qkv_bias=False, qk_norm="none", moe=None),
    "Qwen2ForCausalLM": dict(qkv_bias=True, qk_norm="none", moe=None),
    "Qwen3ForCausalLM": dict(qkv_bias=False, qk_norm="head", moe=None),
    "Qwen3MoeForCausalLM": dict(qkv_bias=False, qk_norm="head", moe="qwen"),
    "MixtralForCausalLM": dict(qkv_bias=False, qk_norm="none", moe="mixtral"),
    "OlmoeForCausalLM": dict(qkv_bias=False, qk_norm="full", moe="qwen"),
}


def _hf_moe_layers(cfg: dict, arch: str, n_layers: int) -> list[bool]:
    if arch == "Qwen3MoeForCausalLM":
        step = int(cfg.get("decoder_sparse_step", 1) or 1)
        dense = set(cfg.get("mlp_only_layers") or [])
        return [(i not in dense) and (i + 1) % step == 0 for i in range(n_layers)]
    return [True] * n_layers


def spec_from_hf(cfg: dict, arch: str) -> ModelSpec:
    """The spec of a Hugging Face config whose architecture ``arch`` is one of HF_ARCHS."""
    if cfg.get("clip_qkv"):
        raise SourceError("config.json", "clip_qkv is not supported")
    traits = HF_ARCHS[arch]
    dim = int(_require(cfg, "hidden_size"))
    n_heads = int(_require(cfg, "num_attention_heads"))
    n_layers = int(_require(cfg, "num_hidden_layers"))
    head_dim = int(cfg.get("head_dim") or dim // n_heads)
    qkv_bias, o_bias = traits["qkv_bias"], False
    if qkv_bias is None:  # Llama's attention_bias covers q, k, v and o
        qkv_bias = o_bias = bool(cfg.get("attention_bias", False))
    if arch in ("LlamaForCausalLM", "MistralForCausalLM") and cfg.get("mlp_bias"):
        raise SourceError("config.json", "mlp_bias is not supported")
    moe_kind = traits["moe"]
    is_moe = _hf_moe_layers(cfg, arch, n_layers) if moe_kind else [False] * n_layers
    model: dict[str, Any] = {
        "arch": "llama",
        "source_arch": arch,
        "n_layers": n_layers,
        "dim": dim,
        "n_heads": n_heads,
        "n_kv_heads": int(cfg.get("num_key_value_heads") or n_heads),
        "head_dim": head_dim,
        "ffn_dim": int(cfg.get("intermediate_size") or 0) if not all(is_moe) else 0,
        "vocab": int(_require(cfg, "vocab_size")),
        "max_ctx": _context(cfg),
        "norm_eps": float(cfg.get("rms_norm_eps", 1e-6)),
        "rope_theta": _rope_theta(cfg),
        "rope_dim": head_dim,
        "rope_pairing": "half",
        "qkv_bias": bool(qkv_bias),
        "o_bias": o_bias,
        "qk_norm": traits["qk_norm"],
        "tied_embeddings": bool(cfg.get("tie_word_embeddings", False)),
        "moe": None,
        "layer_ffn": ["moe" if m else "dense" for m in is_moe],
    }
    spec = ModelSpec(model=model)
    spec.trunk["token_embd"] = "model.embed_tokens.weight"
    spec.trunk["output_norm"] = "model.norm.weight"
    if not model["tied_embeddings"]:
        spec.trunk["output"] = "lm_head.weight"
    for i in range(n_layers):
        p = f"model.layers.{i}."
        t = spec.trunk
        t[f"blk.{i}.attn_norm"] = p + "input_layernorm.weight"
        t[f"blk.{i}.ffn_norm"] = p + "post_attention_layernorm.weight"
        for ours, theirs in (("q", "q_proj"), ("k", "k_proj"), ("v", "v_proj")):
            t[f"blk.{i}.attn_{ours}"] = p + f"self_attn.{theirs}.weight"
            if model["qkv_bias"]:
                t[f"blk.{i}.attn_{ours}_bias"] = p + f"self_attn.{theirs}.bias"
        t[f"blk.{i}.attn_output"] = p + "self_attn.o_proj.weight"
        if o_bias:
            t[f"blk.{i}.attn_output_bias"] = p + "self_attn.o_proj.bias"
        if model["qk_norm"] != "none":
            t[f"blk.{i}.attn_q_norm"] = p + "self_attn.q_norm.weight"
            t[f"blk.{i}.attn_k_norm"] = p + "self_attn.k_norm.weight"
        if not is_moe[i]:
            for ours, theirs in (("gate", "gate_proj"), ("up", "up_proj"), ("down", "down_proj")):
                t[f"blk.{i}.ffn_{ours}"] = p + f"mlp.{theirs}.weight"
            continue
        if moe_kind == "mixtral":
            block, names = p + "block_sparse_moe.", {"gate": "w1", "up": "w3", "down": "w2"}
            n_exp, ffn = int(_require(cfg, "num_local_experts")), int(_require(cfg, "intermediate_size"))
            renorm = True
        else:
            block, names = p + "mlp.", {"gate": "gate_proj", "up": "up_proj", "down": "down_proj"}
            n_exp = int(cfg.get("num_experts") or _require(cfg, "num_local_experts"))
            ffn = int(cfg.get("moe_intermediate_size") or _require(cfg, "intermediate_size"))
            renorm = bool(cfg.get("norm_topk_prob", False))
        model["moe"] = {"n_experts": n_exp, "top_k": int(_require(cfg, "num_experts_per_tok")),
                        "expert_ffn_dim": ffn, "norm_topk_prob": renorm, "scoring": "softmax"}
        t[f"blk.{i}.ffn_gate_inp"] = block + "gate.weight"
        spec.experts[i] = [{part: block + f"experts.{e}.{names[part]}.weight" for part in EXPERT_PARTS}
                           for e in range(n_exp)]
    return spec


# GGUF architectures: RoPE pairing as llama.cpp stores the weights.
_GGUF_ARCHS = {
    "llama": dict(pairing="interleaved", qk_norm="none"),
    "mistral": dict(pairing="interleaved", qk_norm="none"),
    "qwen2": dict(pairing="half", qk_norm="none"),
    "qwen3": dict(pairing="half", qk_norm="head"),
    "qwen3moe": dict(pairing="half", qk_norm="head"),
}


def spec_from_gguf(meta: dict, tensor_names: set[str], where: str) -> ModelSpec:
    arch = meta.get("general.architecture")
    if arch not in _GGUF_ARCHS:
        raise SourceError(where, f"GGUF architecture '{arch}' is not supported; supported: "
                                 f"{', '.join(sorted(_GGUF_ARCHS))}")

    from app.convert.config_check import check_gguf_meta

    check_gguf_meta(meta, arch, where)

    def key(name, default=None):
        value = meta.get(f"{arch}.{name}", default)
        if value is None:
            raise SourceError(where, f"GGUF metadata has no '{arch}.{name}'")
        return value

    scaling = meta.get(f"{arch}.rope.scaling.type", "none")
    if scaling not in ("none", None):
        raise SourceError(where, f"RoPE scaling '{scaling}' is not supported yet")
    traits = _GGUF_ARCHS[arch]
    n_layers = int(key("block_count"))
    dim = int(key("embedding_length"))
    n_heads = int(key("attention.head_count"))
    head_dim = int(meta.get(f"{arch}.attention.key_length") or dim // n_heads)
    n_exp = int(meta.get(f"{arch}.expert_count") or 0)
    vocab = len(meta.get("tokenizer.ggml.tokens") or []) or int(key("vocab_size"))
    model: dict[str, Any] = {
        "arch": "llama",
        "source_arch": f"gguf:{arch}",
        "n_layers": n_layers,
        "dim": dim,
        "n_heads": n_heads,
        "n_kv_heads": int(meta.get(f"{arch}.attention.head_count_kv") or n_heads),
        "head_dim": head_dim,
        "ffn_dim": int(meta.get(f"{arch}.feed_forward_length") or 0) if not n_exp else 0,
        "vocab": vocab,
        "max_ctx": int(key("context_length")),
        "norm_eps": float(key("attention.layer_norm_rms_epsilon")),
        "rope_theta": float(meta.get(f"{arch}.rope.freq_base", 10000.0)),
        "rope_dim": int(meta.get(f"{arch}.rope.dimension_count") or head_dim),
        "rope_pairing": traits["pairing"],
        "qkv_bias": "blk.0.attn_q.bias" in tensor_names,
        "o_bias": "blk.0.attn_output.bias" in tensor_names,
        "qk_norm": traits["qk_norm"],
        "tied_embeddings": "output.weight" not in tensor_names,
        "moe": None,
        "layer_ffn": ["moe" if n_exp else "dense"] * n_layers,
    }
    if n_exp:
        model["moe"] = {"n_experts": n_exp, "top_k": int(key("expert_used_count")),
                        "expert_ffn_dim": int(key("expert_feed_forward_length")),
                        "norm_topk_prob": bool(meta.get(f"{arch}.expert_weights_norm", True)),
                        "scoring": "softmax"}
    spec = ModelSpec(model=model)
    spec.trunk["token_embd"] = "token_embd.weight"
    spec.trunk["output_norm"] = "output_norm.weight"
    if not model["tied_embeddings"]:
        spec.trunk["output"] = "output.weight"
    for i in range(n_layers):
        for suffix in LLAMA_LAYER_TENSORS:
            base = suffix[:-5] if suffix.endswith("_bias") else suffix
            name = f"blk.{i}.{base}.{'bias' if suffix.endswith('_bias') else 'weight'}"
            if name in tensor_names:
                spec.trunk[f"blk.{i}.{suffix}"] = name
        if n_exp:
            # Experts are stacked 3-D tensors in GGUF; the writer slices them.
            spec.experts[i] = [{part: f"blk.{i}.ffn_{part}_exps.weight#{e}" for part in EXPERT_PARTS}
                               for e in range(n_exp)]
    return spec
