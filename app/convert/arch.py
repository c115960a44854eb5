"""What each supported source architecture is, in the container's terms.

A source (a Hugging Face config, or GGUF metadata) becomes a :class:`ModelSpec`:
the ``model`` section of the manifest that the C core reads, plus where each
canonical tensor comes from. Canonical names follow GGUF's (``blk.3.attn_q``)
so that GGUF files map one to one. Unknown or unsupported features are
refused here, with the reason, before anything is written.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from app.convert.errors import SourceError

#: Per-layer trunk tensors in the order they are laid out in trunk.bin.
LLAMA_LAYER_TENSORS = ("attn_norm", "attn_q", "attn_q_bias", "attn_k", "attn_k_bias", "attn_v", "attn_v_bias",
                 "attn_q_norm", "attn_k_norm", "attn_output", "attn_output_bias", "ffn_norm", "ffn_gate_inp",
                 "ffn_gate", "ffn_up", "ffn_down")
#: Tensors that are vectors (always stored as f32).
LLAMA_VECTOR_SUFFIXES = ("attn_norm", "ffn_norm", "attn_q_bias", "attn_k_bias", "attn_v_bias", "attn_output_bias",
                   "attn_q_norm", "attn_k_norm")
#: The "kimi" architecture's per-layer tensors (see docs/KIMI.md), after the llama ones.
KIMI_LAYER_TENSORS = ("attnres_attn_norm", "attnres_attn_proj",
                      "attn_q_a", "attn_q_a_norm", "attn_q_b", "attn_kv_a_mqa", "attn_kv_a_norm", "attn_kv_b",
                      "attn_gate",
                      "kda_q", "kda_k", "kda_v", "kda_q_conv", "kda_k_conv", "kda_v_conv", "kda_f_a", "kda_f_b",
                      "kda_dt_bias", "kda_a_log", "kda_beta", "kda_g", "kda_g_a", "kda_g_b", "kda_o_norm",
                      "kda_output",
                      "attnres_mlp_norm", "attnres_mlp_proj",
                      "ffn_router", "ffn_router_bias", "ffn_gate_shexp", "ffn_up_shexp", "ffn_down_shexp",
                      "ffn_latent_down", "ffn_latent_norm", "ffn_latent_up",
                      "attnres_out_norm", "attnres_out_proj")
#: Kept in f32 whatever the trunk format: norms, biases, the KDA convolution
#: and decay parameters, AttnRes weights, and the router (exact routing).
KIMI_VECTOR_SUFFIXES = ("attn_q_a_norm", "attn_kv_a_norm", "kda_q_conv", "kda_k_conv", "kda_v_conv",
                        "kda_dt_bias", "kda_a_log", "kda_o_norm", "attnres_attn_norm", "attnres_attn_proj",
                        "attnres_mlp_norm", "attnres_mlp_proj", "attnres_out_norm", "attnres_out_proj",
                        "ffn_router", "ffn_router_bias", "ffn_latent_norm")
#: Per-layer trunk tensors in the order they are laid out in trunk.bin.
LAYER_TENSORS = LLAMA_LAYER_TENSORS + KIMI_LAYER_TENSORS
#: Tensors that are vectors (always stored as f32).
VECTOR_SUFFIXES = LLAMA_VECTOR_SUFFIXES + KIMI_VECTOR_SUFFIXES
EXPERT_PARTS = ("gate", "up", "down")


@dataclass
class ModelSpec:
    """The manifest's ``model`` section and the source names of every tensor."""

    model: dict[str, Any]
    #: canonical trunk name -> source tensor name
    trunk: dict[str, str] = field(default_factory=dict)
    #: layer -> expert -> part ("gate"/"up"/"down") -> source tensor name
    experts: dict[int, list[dict[str, str]]] = field(default_factory=dict)

    @property
    def n_layers(self) -> int:
        return int(self.model["n_layers"])


def _require(cfg: dict, key: str, where: str = "config.json"):
    if key not in cfg or cfg[key] is None:
        raise SourceError(where, f"{where} has no '{key}'")
    return cfg[key]


def _rope_theta(cfg: dict) -> float:
    params = cfg.get("rope_parameters") or {}
    scaling = cfg.get("rope_scaling") or {}
    kind = params.get("rope_type") or scaling.get("rope_type") or scaling.get("type") or "default"
    if kind != "default":
        raise SourceError("config.json", f"RoPE scaling '{kind}' is not supported yet")
    return float(params.get("rope_theta", cfg.get("rope_theta", 10000.0)))


#: Keys a config.json states its trained context length under, in order of
#: preference (the Kimi-Linear release states only ``model_max_length``).
CONTEXT_KEYS = ("max_position_embeddings", "model_max_length", "max_sequence_length", "seq_length")
#: The context a converted model gets when its config states none of those:
#: the engine's default session length, which every supported family runs.
DEFAULT_CONTEXT = 4096


def stated_context(cfg: dict) -> int:
    """The trained context length the config states, else DEFAULT_CONTEXT."""
    value = _first(cfg, *CONTEXT_KEYS)
    if value is None:
        return DEFAULT_CONTEXT
    try:
        ctx = int(value)
    except (TypeError, ValueError):
        raise SourceError("config.json", f"config.json states a context length of {value!r}, not a number")
    if ctx < 1:
        raise SourceError("config.json", f"config.json states a context length of {ctx}")
    return ctx


def _context(cfg: dict) -> int:
    ctx = stated_context(cfg)
    window = cfg.get("sliding_window")
    if window and (cfg.get("use_sliding_window", True)) and int(window) < ctx:
        # Exact inside the window; beyond it the model would need windowed attention.
        ctx = int(window)
    return ctx


# Hugging Face architectures: the attention flavour and the MoE naming.
_HF_ARCHS = {
    "LlamaForCausalLM": dict(qkv_bias=None, qk_norm="none", moe=None),  # bias from attention_bias
    "MistralForCausalLM": dict(qkv_bias=False, qk_norm="none", moe=None),
    "Qwen2ForCausalLM": dict(qkv_bias=True, qk_norm="none", moe=None),
    "Qwen3ForCausalLM": dict(qkv_bias=False, qk_norm="head", moe=None),
    "Qwen3MoeForCausalLM": dict(qkv_bias=False, qk_norm="head", moe="qwen"),
    "MixtralForCausalLM": dict(qkv_bias=False, qk_norm="none", moe="mixtral"),
    "OlmoeForCausalLM": dict(qkv_bias=False, qk_norm="full", moe="qwen"),
}


def supported_hf_architectures() -> list[str]:
    return sorted(list(_HF_ARCHS) + list(KIMI_HF_ARCHS))


def _hf_moe_layers(cfg: dict, arch: str, n_layers: int) -> list[bool]:
    if arch == "Qwen3MoeForCausalLM":
        step = int(cfg.get("decoder_sparse_step", 1) or 1)
        dense = set(cfg.get("mlp_only_layers") or [])
        return [(i not in dense) and (i + 1) % step == 0 for i in range(n_layers)]
    return [True] * n_layers


def spec_from_hf(cfg: dict) -> ModelSpec:
    if not isinstance(cfg, dict):
        raise SourceError("config.json", "config.json is not a JSON object")
    archs = cfg.get("architectures") or []
    if any(a in KIMI_HF_ARCHS for a in archs):
        return spec_from_kimi(cfg)
    arch = next((a for a in archs if a in _HF_ARCHS), None)
    if arch is None:
        raise SourceError("config.json", f"architecture {archs or '(none)'} is not supported; "
                                         f"supported: {', '.join(supported_hf_architectures())}")
    if cfg.get("clip_qkv"):
        raise SourceError("config.json", "clip_qkv is not supported")
    traits = _HF_ARCHS[arch]
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


# ----------------------------------------------------------------------------
# The "kimi" architecture: DeepSeek-V3 / Kimi-K2, Kimi-Linear, Kimi K3.
# Source tensor names are the releases' (not transformers' internal ones).
# A source name may end in "@flat" (read as a vector) or "@2d" (read as
# [rows, everything else]); sources.py applies these views.

KIMI_HF_ARCHS = ("DeepseekV3ForCausalLM", "KimiLinearForCausalLM", "KimiK3ForConditionalGeneration")


def _first(cfg: dict, *keys, default=None):
    for k in keys:
        if cfg.get(k) is not None:
            return cfg[k]
    return default


def _kimi_rope(cfg: dict) -> tuple[float, dict | None]:
    """RoPE base and YaRN parameters (or None) of a DeepSeek-style config."""
    params = dict(cfg.get("rope_parameters") or cfg.get("rope_scaling") or {})
    theta = float(params.get("rope_theta", cfg.get("rope_theta", 10000.0)))
    kind = params.get("rope_type") or params.get("type") or "default"
    if kind == "default":
        return theta, None
    if kind != "yarn":
        raise SourceError("config.json", f"RoPE scaling '{kind}' is not supported for MLA (only YaRN)")
    orig = int(_first(params, "original_max_position_embeddings",
                      default=cfg.get("original_max_position_embeddings") or stated_context(cfg)))
    factor = float(params.get("factor") or stated_context(cfg) / orig)

    def mscale(scale, m=1.0):
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    ms, ms_all = params.get("mscale"), params.get("mscale_all_dim")
    attn_factor = params.get("attention_factor")
    if attn_factor is None:
        attn_factor = mscale(factor, ms) / mscale(factor, ms_all) if (ms and ms_all) else mscale(factor)
    if params.get("truncate", True) is False:
        raise SourceError("config.json", "YaRN with truncate=false is not supported")
    yarn = {"factor": factor, "original_ctx": orig, "beta_fast": float(params.get("beta_fast") or 32),
            "beta_slow": float(params.get("beta_slow") or 1), "attn_factor": float(attn_factor),
            "softmax_mscale": mscale(factor, ms_all) ** 2 if ms_all else 1.0}
    return theta, yarn


def spec_from_kimi(top: dict) -> ModelSpec:
    archs = top.get("architectures") or []
    k3 = "KimiK3ForConditionalGeneration" in archs
    cfg = top.get("text_config") if k3 else top
    if not isinstance(cfg, dict):
        raise SourceError("config.json", "config.json has no text_config object")
    prefix = "language_model." if k3 else ""
    deepseek = "DeepseekV3ForCausalLM" in archs
    n_layers = int(_require(cfg, "num_hidden_layers"))
    dim = int(_require(cfg, "hidden_size"))
    lin = cfg.get("linear_attn_config") or {}

    # Which layers are KDA and which MLA (1-based lists in the release configs).
    if deepseek:
        kinds = ["mla"] * n_layers
    elif lin.get("kda_layers") is not None or lin.get("full_attn_layers") is not None:
        kinds = [None] * n_layers
        for i in lin.get("full_attn_layers") or []:
            kinds[int(i) - 1] = "mla"
        for i in lin.get("kda_layers") or []:
            kinds[int(i) - 1] = "kda"
        if None in kinds:
            raise SourceError("config.json", f"layer {kinds.index(None) + 1} is neither in kda_layers nor in "
                                             "full_attn_layers")
    elif cfg.get("layer_types"):
        kinds = ["mla" if t == "full_attention" else "kda" for t in cfg["layer_types"]]
    else:
        raise SourceError("config.json", "config.json does not say which layers are KDA (linear_attn_config)")

    # Which layers are MoE.
    n_exp = int(_first(cfg, "n_routed_experts", "num_experts", "num_local_experts", default=0) or 0)
    first_dense = int(_first(cfg, "first_k_dense_replace", default=0 if not deepseek else 3))
    freq = int(cfg.get("moe_layer_freq") or 1)
    if cfg.get("mlp_layer_types") and not deepseek:
        is_moe = [t == "sparse" for t in cfg["mlp_layer_types"]]
    else:
        is_moe = [n_exp > 0 and i >= first_dense and i % freq == 0 for i in range(n_layers)]
    if len(is_moe) != n_layers or len(kinds) != n_layers:
        raise SourceError("config.json", "layer lists do not have one entry per layer")

    act = cfg.get("hidden_act", "silu")
    if act not in ("silu", "situ"):
        raise SourceError("config.json", f"activation '{act}' is not supported")
    if cfg.get("scoring_func", "sigmoid") != "sigmoid" or cfg.get("moe_router_activation_func", "sigmoid") != "sigmoid":
        raise SourceError("config.json", "only sigmoid router scoring is supported")
    eps = float(cfg.get("rms_norm_eps", 1e-6))
    n_mla_heads = int(_require(cfg, "num_attention_heads"))
    nope = int(cfg.get("qk_nope_head_dim") or 128)
    rope_d = int(cfg.get("qk_rope_head_dim") or 64)
    v_dim = int(cfg.get("v_head_dim") or 128)
    q_lora = int(cfg.get("q_lora_rank") or 0)
    kv_lora = int(cfg.get("kv_lora_rank") or 512)
    mla_rope = deepseek and not cfg.get("mla_use_nope", False)
    theta, yarn = _kimi_rope(cfg) if mla_rope else (10000.0, None)
    scale = (nope + rope_d) ** -0.5 * (yarn["softmax_mscale"] if yarn else 1.0)
    kda_heads = int(_first(lin, "num_heads", default=cfg.get("linear_num_heads") or 32))
    kda_hd = int(_first(lin, "head_dim", default=cfg.get("linear_head_dim") or 128))
    conv_k = int(_first(lin, "short_conv_kernel_size", default=cfg.get("linear_conv_kernel_dim") or 4))
    lower = lin.get("gate_lower_bound")
    full_gate = bool(lin.get("use_full_rank_gate", False))
    latent = int(cfg.get("routed_expert_hidden_size") or 0)
    if latent == dim:
        latent = 0
    block = int(cfg.get("attn_res_block_size") or 0)
    n_shared = int(_first(cfg, "n_shared_experts", "num_shared_experts", default=0) or 0)
    moe_ffn = int(cfg.get("moe_intermediate_size") or 0)
    has_mla, has_kda = "mla" in kinds, "kda" in kinds
    ctx = stated_context(cfg)

    kimi: dict[str, Any] = {
        "variant": "k3" if k3 else ("deepseek" if deepseek else "kimi_linear"),
        "layer_attn": kinds,
        "mla": None if not has_mla else {
            "heads": n_mla_heads, "q_lora_rank": q_lora, "kv_lora_rank": kv_lora, "qk_nope_dim": nope,
            "qk_rope_dim": rope_d, "v_dim": v_dim, "rope": mla_rope,
            "rope_interleaved": bool(cfg.get("rope_interleave", True)),
            "output_gate": bool(cfg.get("mla_use_output_gate", False)), "softmax_scale": scale,
            # q_a_layernorm / kv_a_layernorm are built without the config's eps in the releases' code
            "latent_norm_eps": 1e-6,
            "rope_theta": theta,
            "yarn": None if not yarn else {k: yarn[k] for k in ("factor", "original_ctx", "beta_fast",
                                                                 "beta_slow", "attn_factor")}},
        "kda": None if not has_kda else {
            "heads": kda_heads, "head_dim": kda_hd, "conv_kernel": conv_k, "full_rank_gate": full_gate,
            "decay": "bounded" if lower is not None else "softplus", "gate_lower_bound": lower,
            "a_log_len": kda_heads},
        "ffn": {"act": act, "situ_beta": float(cfg.get("activation_situ_beta", 4.0)),
                "situ_linear_beta": float(cfg.get("activation_situ_linear_beta", 25.0)),
                "n_group": int(_first(cfg, "n_group", "num_expert_group", default=1) or 1),
                "topk_group": int(cfg.get("topk_group") or 1),
                "routed_scale": float(cfg.get("routed_scaling_factor", 1.0)),
                "shared_ffn_dim": n_shared * moe_ffn, "latent_dim": latent},
        "attn_res_block": block,
    }
    model: dict[str, Any] = {
        "arch": "kimi",
        "source_arch": "KimiK3ForConditionalGeneration" if k3 else next(a for a in archs if a in KIMI_HF_ARCHS),
        "n_layers": n_layers,
        "dim": dim,
        "n_heads": n_mla_heads if has_mla else kda_heads,
        "n_kv_heads": n_mla_heads if has_mla else kda_heads,
        "head_dim": nope + rope_d if has_mla else kda_hd,
        "ffn_dim": int(cfg.get("intermediate_size") or 0) if not all(is_moe) else 0,
        "vocab": int(_require(cfg, "vocab_size")),
        "max_ctx": ctx,
        "norm_eps": eps,
        "rope_theta": theta,
        "rope_dim": rope_d if mla_rope else 0,
        "rope_pairing": "interleaved" if cfg.get("rope_interleave", True) else "half",
        "qkv_bias": False,
        "o_bias": False,
        "qk_norm": "none",
        "tied_embeddings": bool(cfg.get("tie_word_embeddings", top.get("tie_word_embeddings", False))),
        "moe": None if not any(is_moe) else {
            "n_experts": n_exp, "top_k": int(_first(cfg, "num_experts_per_tok", "num_experts_per_token")),
            "expert_ffn_dim": moe_ffn,
            "norm_topk_prob": bool(_first(cfg, "norm_topk_prob", "moe_renormalize", default=True)),
            "scoring": "sigmoid"},
        "layer_ffn": ["moe" if m else "dense" for m in is_moe],
        "kimi": kimi,
    }
    if cfg.get("attention_bias"):
        raise SourceError("config.json", "attention_bias is not supported for MLA")

    spec = ModelSpec(model=model)
    t = spec.trunk
    t["token_embd"] = prefix + "model.embed_tokens.weight"
    t["output_norm"] = prefix + "model.norm.weight"
    if not model["tied_embeddings"]:
        t["output"] = prefix + "lm_head.weight"
    moe_block = "mlp." if deepseek else "block_sparse_moe."
    part_names = ({"gate": "gate_proj", "up": "up_proj", "down": "down_proj"} if deepseek
                  else {"gate": "w1", "up": "w3", "down": "w2"})
    for i in range(n_layers):
        p = f"{prefix}model.layers.{i}."
        b = f"blk.{i}."
        a = p + "self_attn."
        t[b + "attn_norm"] = p + "input_layernorm.weight"
        t[b + "ffn_norm"] = p + "post_attention_layernorm.weight"
        if kinds[i] == "mla":
            if q_lora:
                t[b + "attn_q_a"] = a + "q_a_proj.weight"
                t[b + "attn_q_a_norm"] = a + "q_a_layernorm.weight"
                t[b + "attn_q_b"] = a + "q_b_proj.weight"
            else:
                t[b + "attn_q"] = a + "q_proj.weight"
            t[b + "attn_kv_a_mqa"] = a + "kv_a_proj_with_mqa.weight"
            t[b + "attn_kv_a_norm"] = a + "kv_a_layernorm.weight"
            t[b + "attn_kv_b"] = a + "kv_b_proj.weight"
            t[b + "attn_output"] = a + "o_proj.weight"
            if kimi["mla"]["output_gate"]:
                t[b + "attn_gate"] = a + "g_proj.weight"
        else:
            for ours, theirs in (("q", "q_proj"), ("k", "k_proj"), ("v", "v_proj")):
                t[b + f"kda_{ours}"] = a + f"{theirs}.weight"
                t[b + f"kda_{ours}_conv"] = a + f"{ours}_conv1d.weight@2d"
            t[b + "kda_f_a"] = a + "f_a_proj.weight"
            t[b + "kda_f_b"] = a + "f_b_proj.weight"
            t[b + "kda_dt_bias"] = a + "dt_bias@flat"
            t[b + "kda_a_log"] = a + f"A_log@first:{kda_heads}"
            t[b + "kda_beta"] = a + "b_proj.weight"
            if full_gate:
                t[b + "kda_g"] = a + "g_proj.weight"
            else:
                t[b + "kda_g_a"] = a + "g_a_proj.weight"
                t[b + "kda_g_b"] = a + "g_b_proj.weight"
            t[b + "kda_o_norm"] = a + "o_norm.weight"
            t[b + "kda_output"] = a + "o_proj.weight"
        if block:
            t[b + "attnres_attn_norm"] = p + "self_attention_res_norm.weight"
            t[b + "attnres_attn_proj"] = p + "self_attention_res_proj.weight@flat"
            t[b + "attnres_mlp_norm"] = p + "mlp_res_norm.weight"
            t[b + "attnres_mlp_proj"] = p + "mlp_res_proj.weight@flat"
        if not is_moe[i]:
            for ours, theirs in (("gate", "gate_proj"), ("up", "up_proj"), ("down", "down_proj")):
                t[b + f"ffn_{ours}"] = p + f"mlp.{theirs}.weight"
            continue
        m = p + moe_block
        t[b + "ffn_router"] = m + "gate.weight"
        t[b + "ffn_router_bias"] = m + "gate.e_score_correction_bias"
        if n_shared:
            for ours, theirs in (("gate", "gate_proj"), ("up", "up_proj"), ("down", "down_proj")):
                t[b + f"ffn_{ours}_shexp"] = m + f"shared_experts.{theirs}.weight"
        if latent:
            t[b + "ffn_latent_down"] = m + "routed_expert_down_proj.weight"
            t[b + "ffn_latent_up"] = m + "routed_expert_up_proj.weight"
            t[b + "ffn_latent_norm"] = m + "routed_expert_norm.weight"
        spec.experts[i] = [{part: m + f"experts.{e}.{part_names[part]}.weight" for part in EXPERT_PARTS}
                           for e in range(n_exp)]
    if k3:
        kimi_vision(top, spec)
    if block:
        # Laid out with the last layer's segment (the layout orders per-layer tensors only).
        t[f"blk.{n_layers - 1}.attnres_out_norm"] = prefix + "model.output_attn_res_norm.weight"
        t[f"blk.{n_layers - 1}.attnres_out_proj"] = prefix + "model.output_attn_res_proj.weight@flat"
    return spec


#: The vision tower variant the core runs (ferry_vision.h): the release's
#: vision_config values that must hold, by key.
K3_VISION_REQUIRED = {"merge_type": "sd2_tpool", "mm_projector_type": "patchmergerv2", "norm_type": "rmsnorm",
                      "pos_emb_type": "divided_fixed", "pos_emb_interpolation_mode": "bilinear",
                      "activation_func": "gelu_pytorch_tanh", "projector_hidden_act": "gelu", "mlp_type": "mlp2",
                      "attn_bias": False, "linear_bias": False, "patch_embed_proj_bias": False}


def kimi_vision(top: dict, spec: ModelSpec) -> None:
    """K3's vision tower (MoonViT-V2 + patchmergerv2) into the trunk as
    ``v.*`` / ``mm.*`` tensors and the manifest's ``model.vision`` section,
    when config.json describes one the core runs; otherwise the container
    has no tower and images are refused by name (docs/KIMI.md, "Images")."""
    vc = top.get("vision_config")
    if not isinstance(vc, dict) or "vt_num_hidden_layers" not in vc:
        return
    if any(vc.get(k) != v for k, v in K3_VISION_REQUIRED.items()):
        bad = next(k for k, v in K3_VISION_REQUIRED.items() if vc.get(k) != v)
        raise SourceError("config.json", f"vision_config.{bad} is {vc.get(bad)!r}; the vision tower Ferry runs has "
                                         f"{K3_VISION_REQUIRED[bad]!r}")
    try:
        layers = int(vc["vt_num_hidden_layers"])
        mh, mw = (int(k) for k in vc["merge_kernel_size"])
        vision = {
            "patch_size": int(vc["patch_size"]), "hidden": int(vc["vt_hidden_size"]),
            "qkv_hidden": int(vc.get("qkv_hidden_size") or vc["vt_hidden_size"]),
            "heads": int(vc["vt_num_attention_heads"]), "layers": layers,
            "intermediate": int(vc["vt_intermediate_size"]),
            "pos_h": int(vc["init_pos_emb_height"]), "pos_w": int(vc["init_pos_emb_width"]),
            "merge_h": mh, "merge_w": mw, "text_hidden": int(vc["text_hidden_size"]),
            # nn.RMSNorm without an eps uses the machine epsilon of the f32 computation
            "norm_eps": 2.0 ** -23, "projector_eps": float(vc.get("projector_ln_eps", 1e-5)),
            "media_pad_id": int(top.get("media_placeholder_token_id", 163605)),
        }
    except (KeyError, TypeError, ValueError) as exc:
        raise SourceError("config.json", f"vision_config is incomplete or malformed ({exc})") from None
    if vision["text_hidden"] != spec.model["dim"]:
        raise SourceError("config.json", f"vision_config.text_hidden_size {vision['text_hidden']} is not the text "
                                         f"model's width {spec.model['dim']}")
    spec.model["vision"] = vision
    t = spec.trunk
    t["v.patch_embd"] = "vision_tower.patch_embed.proj.weight@2d"
    t["v.pos_embd"] = "vision_tower.patch_embed.pos_emb.weight@rows"
    for i in range(layers):
        b = f"vision_tower.encoder.blocks.{i}."
        for ours, theirs in (("norm0", "norm0.weight"), ("norm1", "norm1.weight"), ("qkv", "wqkv.weight"),
                             ("o", "wo.weight"), ("fc0", "mlp.fc0.weight"), ("fc1", "mlp.fc1.weight")):
            t[f"v.blk.{i}.{ours}"] = b + theirs
    t["v.final_norm"] = "vision_tower.encoder.final_layernorm.weight"
    t["mm.proj0"] = "mm_projector.proj.0.weight"
    t["mm.proj2"] = "mm_projector.proj.2.weight"
    t["mm.post_norm"] = "mm_projector.post_norm.weight"
