"""The JSON configs of a checkpoint (config.json, tokenizer_config.json,
generation_config.json) checked before anything uses them.

They come from wherever the model came from (a hub, a mirror, a download),
so every key Ferry reads is checked for its type and a sane range here, once,
and a bad value is a :class:`SourceError` naming the file and the key
(``config.json: num_hidden_layers: 1000000000.0 is not a whole number``)
instead of a TypeError, a MemoryError or a loop of a billion layers later.
The JSON itself is read with bounded size and depth (app.untrusted). Keys
Ferry does not read are left alone.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from app.convert.errors import SourceError, load_json_file
from app.untrusted import shown

#: Whole-number keys and their largest accepted value (every one may also be null).
INTS = {
    "num_hidden_layers": 4096, "hidden_size": 1 << 18, "intermediate_size": 1 << 20,
    "moe_intermediate_size": 1 << 20, "routed_expert_hidden_size": 1 << 20, "shared_expert_intermediate_size": 1 << 20,
    "num_attention_heads": 4096, "num_key_value_heads": 4096, "head_dim": 1 << 14, "vocab_size": 1 << 24,
    "num_experts": 1 << 16, "num_local_experts": 1 << 16, "n_routed_experts": 1 << 16,
    "num_experts_per_tok": 1024, "num_experts_per_token": 1024, "n_shared_experts": 1024,
    "num_shared_experts": 1024, "first_k_dense_replace": 4096, "moe_layer_freq": 4096, "decoder_sparse_step": 4096,
    "kv_lora_rank": 1 << 16, "q_lora_rank": 1 << 16, "qk_nope_head_dim": 1 << 14, "qk_rope_head_dim": 1 << 14,
    "v_head_dim": 1 << 14, "max_position_embeddings": 1 << 30, "original_max_position_embeddings": 1 << 30,
    "sliding_window": 1 << 30, "attn_res_block_size": 4096, "topk_group": 1 << 16, "n_group": 1 << 16,
    "num_heads": 4096, "short_conv_kernel_size": 1024, "linear_num_heads": 4096, "linear_head_dim": 1 << 14,
    "linear_conv_kernel_dim": 1024, "bos_token_id": 1 << 24,
}
#: Keys holding one id or a list of ids.
IDS = {"eos_token_id": 1 << 24}
#: Number keys (finite).
FLOATS = {"rms_norm_eps", "rope_theta", "routed_scaling_factor", "activation_situ_beta",
          "activation_situ_linear_beta", "factor", "beta_fast", "beta_slow", "mscale", "mscale_all_dim",
          "attention_factor", "low_freq_factor", "high_freq_factor", "partial_rotary_factor", "clip_qkv"}
BOOLS = {"tie_word_embeddings", "attention_bias", "mlp_bias", "norm_topk_prob", "use_sliding_window",
         "rope_interleave", "mla_use_output_gate", "use_full_rank_gate", "mla_use_nope", "add_bos_token"}
STRS = {"model_type", "hidden_act", "scoring_func", "moe_router_activation_func", "torch_dtype", "quant_method",
        "format", "rope_type", "type"}
#: List keys: element type and the longest list accepted.
LISTS = {"architectures": (str, 64), "mlp_only_layers": (int, 4096), "full_attn_layers": (int, 4096),
         "kda_layers": (int, 4096), "layer_types": (str, 4096), "mlp_layer_types": (str, 4096),
         "weight_block_size": (int, 8)}
DICTS = {"text_config", "linear_attn_config", "rope_scaling", "rope_parameters", "quantization_config"}


def _bad(where: Path, key: str, value: Any, why: str) -> SourceError:
    return SourceError(where, f"{shown(key)}: {shown(_short(value))} {why}")


def _short(value: Any) -> str:
    import json
    try:
        text = json.dumps(value)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _int_ok(v: Any, top: int) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= top


def check_config(cfg: Any, where: Path, depth: int = 0) -> dict:
    """``cfg`` (a config.json) if every key Ferry reads has a value of its type
    and range; SourceError naming the key otherwise. Nested sections
    (text_config, rope_scaling...) are checked the same way."""
    if not isinstance(cfg, dict):
        raise SourceError(where, "is not a JSON object")
    for key, v in cfg.items():
        if v is None:
            continue
        if key in INTS:
            if isinstance(v, float) or isinstance(v, bool) or not isinstance(v, int):
                raise _bad(where, key, v, "is not a whole number")
            if not _int_ok(v, INTS[key]):
                raise _bad(where, key, v, f"is out of range (0 to {INTS[key]})")
        elif key in IDS:
            ids = v if isinstance(v, list) else [v]
            if len(ids) > 1024 or not all(_int_ok(i, IDS[key]) for i in ids):
                raise _bad(where, key, v, f"is not a token id or a list of token ids (0 to {IDS[key]})")
        elif key in FLOATS:
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or abs(v) > 1e30:
                raise _bad(where, key, v, "is not a finite number")
        elif key in BOOLS:
            if not isinstance(v, bool):
                raise _bad(where, key, v, "is not true or false")
        elif key in STRS:
            if not isinstance(v, str) or len(v) > 256:
                raise _bad(where, key, v, "is not a short string")
        elif key in LISTS:
            kind, longest = LISTS[key]
            if not isinstance(v, list) or len(v) > longest:
                raise _bad(where, key, v, f"is not a list of at most {longest} items")
            ok = (lambda x: _int_ok(x, 1 << 20)) if kind is int else (lambda x: isinstance(x, str) and len(x) <= 256)
            if not all(ok(x) for x in v):
                item = "a whole number" if kind is int else "a short string"
                raise _bad(where, key, v, f"has an item that is not {item}")
        elif key in DICTS:
            if not isinstance(v, dict):
                raise _bad(where, key, v, "is not an object")
            if depth < 4:
                check_config(v, where, depth + 1)
    return cfg


def check_tokenizer_config(cfg: Any, where: Path) -> dict:
    """tokenizer_config.json: chat_template a string or a list of {name,
    template} strings; the special tokens strings or {content: string}."""
    if not isinstance(cfg, dict):
        raise SourceError(where, "is not a JSON object")
    t = cfg.get("chat_template")
    if t is not None and not isinstance(t, str):
        if not isinstance(t, list) or not all(isinstance(x, dict) and isinstance(x.get("name"), str)
                                              and isinstance(x.get("template"), str) for x in t):
            raise _bad(where, "chat_template", t, "is neither a template (a string) nor a list of "
                                                  "{\"name\": ..., \"template\": ...} strings")
    for key in ("bos_token", "eos_token", "unk_token", "pad_token"):
        v = cfg.get(key)
        if v is not None and not isinstance(v, str) and not (isinstance(v, dict) and isinstance(v.get("content"), str)):
            raise _bad(where, key, v, "is neither a string nor {\"content\": a string}")
    v = cfg.get("add_bos_token")
    if v is not None and not isinstance(v, bool):
        raise _bad(where, "add_bos_token", v, "is not true or false")
    return cfg


def load_config(path: Path) -> dict:
    """config.json read with the JSON limits and checked (see :func:`check_config`)."""
    return check_config(load_json_file(path), path)


#: GGUF metadata keys (after "ARCH.") read as the config.json key of the same meaning.
GGUF_AS = {"block_count": "num_hidden_layers", "embedding_length": "hidden_size",
           "attention.head_count": "num_attention_heads", "attention.head_count_kv": "num_key_value_heads",
           "attention.key_length": "head_dim", "rope.dimension_count": "head_dim", "expert_count": "num_experts",
           "expert_used_count": "num_experts_per_tok", "feed_forward_length": "intermediate_size",
           "expert_feed_forward_length": "moe_intermediate_size", "context_length": "max_position_embeddings",
           "vocab_size": "vocab_size", "attention.layer_norm_rms_epsilon": "rms_norm_eps",
           "rope.freq_base": "rope_theta"}


def check_gguf_meta(meta: dict, arch: str, where) -> None:
    """The GGUF metadata Ferry reads (the model's sizes under ``arch.``, the
    chat template, the special ids) checked as :func:`check_config` checks a
    config.json; SourceError naming the key otherwise."""
    as_config = {GGUF_AS[k[len(arch) + 1:]]: v for k, v in meta.items()
                 if k.startswith(f"{arch}.") and k[len(arch) + 1:] in GGUF_AS}
    for k, v in meta.items():
        if k.startswith("tokenizer.ggml.") and k.endswith("_token_id"):
            as_config["bos_token_id" if k.endswith("bos_token_id") else "eos_token_id"] = v
    try:
        check_config(as_config, Path(str(where)))
    except SourceError as exc:
        key, _, rest = exc.problem.partition(": ")
        back = {v: k for k, v in GGUF_AS.items()}
        name = f"{arch}.{back[key]}" if key in back else f"tokenizer.ggml.{key}"
        raise SourceError(where, f"GGUF metadata {shown(name)}: {rest}") from None
    t = meta.get("tokenizer.chat_template")
    if t is not None and not isinstance(t, str):
        raise SourceError(where, f"GGUF metadata tokenizer.chat_template: {shown(_short(t))} is not a string")
