"""What each supported source architecture is, in the container's terms.

A source (a Hugging Face config, or GGUF metadata) becomes a :class:`ModelSpec`:
the ``model`` section of the manifest that the C core reads, plus where each
canonical tensor comes from. Canonical names follow GGUF's (``blk.3.attn_q``)
so that GGUF files map one to one. Unknown or unsupported features are
refused here, with the reason, before anything is written.

One module per family, as the C core has one ``arch_*.c`` per forward pass:
``llama`` (Llama, Mistral, Qwen2/3, Qwen3-MoE, Mixtral, OLMoE; Hugging Face
and GGUF) and ``kimi`` (DeepSeek-V3 / Kimi-K2, Kimi-Linear, Kimi K3);
``spec`` holds what they share. This module keeps the public names and picks
the family of a Hugging Face config.
"""
from __future__ import annotations

from app.convert.arch import kimi, llama
from app.convert.arch.kimi import KIMI_HF_ARCHS, KIMI_LAYER_TENSORS, KIMI_VECTOR_SUFFIXES, spec_from_kimi
from app.convert.arch.llama import LLAMA_LAYER_TENSORS, LLAMA_VECTOR_SUFFIXES, spec_from_gguf
from app.convert.arch.spec import CONTEXT_KEYS, DEFAULT_CONTEXT, EXPERT_PARTS, ModelSpec, stated_context
from app.convert.errors import SourceError

__all__ = ["CONTEXT_KEYS", "DEFAULT_CONTEXT", "EXPERT_PARTS", "KIMI_HF_ARCHS", "KIMI_LAYER_TENSORS",
           "KIMI_VECTOR_SUFFIXES", "LAYER_TENSORS", "LLAMA_LAYER_TENSORS", "LLAMA_VECTOR_SUFFIXES", "ModelSpec",
           "VECTOR_SUFFIXES", "spec_from_gguf", "spec_from_hf", "spec_from_kimi", "stated_context",
           "supported_hf_architectures"]

#: Per-layer trunk tensors in the order they are laid out in trunk.bin.
LAYER_TENSORS = LLAMA_LAYER_TENSORS + KIMI_LAYER_TENSORS
#: Tensors that are vectors (always stored as f32).
VECTOR_SUFFIXES = LLAMA_VECTOR_SUFFIXES + KIMI_VECTOR_SUFFIXES


def supported_hf_architectures() -> list[str]:
    return sorted(list(llama.HF_ARCHS) + list(kimi.KIMI_HF_ARCHS))


def spec_from_hf(cfg: dict) -> ModelSpec:
    """The spec of a Hugging Face config.json, by its family's module."""
    if not isinstance(cfg, dict):
        raise SourceError("config.json", "config.json is not a JSON object")
    archs = cfg.get("architectures") or []
    if any(a in KIMI_HF_ARCHS for a in archs):
        return spec_from_kimi(cfg)
    arch = next((a for a in archs if a in llama.HF_ARCHS), None)
    if arch is None:
        raise SourceError("config.json", f"architecture {archs or '(none)'} is not supported; "
                                         f"supported: {', '.join(supported_hf_architectures())}")
    return llama.spec_from_hf(cfg, arch)
