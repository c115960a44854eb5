"""The "kimi" architecture (core_c/src/arch_kimi.c): DeepSeek-V3 / Kimi-K2 (MLA
layers), Kimi-Linear (KDA and MLA layers) and Kimi K3 (KDA, MLA, AttnRes and
latent experts), from the releases' config.json (docs/KIMI.md)."""
from __future__ import annotations

import math
from typing import Any

from app.convert.arch.spec import EXPERT_PARTS, ModelSpec, _first, _require, stated_context
from app.convert.errors import SourceError

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

# Source tensor names are the releases' (not transformers' internal ones).
# A source name may end in "@flat" (read as a vector) or "@2d" (read as
# [rows, everything else]); sources.py applies these views.

KIMI_HF_ARCHS = ("DeepseekV3ForCausalLM", "KimiLinearForCausalLM", "KimiK3ForConditionalGeneration")


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
