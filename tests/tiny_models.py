"""Tiny random-weight checkpoints built offline with `transformers`, saved as
real safetensors checkpoints (with a real tokenizer.json) for the converter
and the engine to be checked against."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer, models, pre_tokenizers

VOCAB = 96
COMMON = dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=3, num_attention_heads=4,
              num_key_value_heads=2, head_dim=16, max_position_embeddings=256, rms_norm_eps=1e-5,
              bos_token_id=1, eos_token_id=2, pad_token_id=0)

#: name -> (transformers class names, config overrides)
ARCHS = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", dict(intermediate_size=96, rope_theta=10000.0)),
    "llama_tied_bias": ("LlamaConfig", "LlamaForCausalLM",
                        dict(intermediate_size=96, tie_word_embeddings=True, attention_bias=True)),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", dict(intermediate_size=96, rope_theta=1e6)),
    "qwen3moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM",
                 dict(intermediate_size=96, moe_intermediate_size=32, num_experts=8, num_experts_per_tok=2,
                      norm_topk_prob=True, mlp_only_layers=[1], decoder_sparse_step=1)),
    "mixtral": ("MixtralConfig", "MixtralForCausalLM",
                dict(intermediate_size=32, num_local_experts=4, num_experts_per_tok=2)),
    "olmoe": ("OlmoeConfig", "OlmoeForCausalLM",
              dict(intermediate_size=32, num_experts=8, num_experts_per_tok=2, norm_topk_prob=False)),
}


def write_tokenizer(out: Path, vocab: int = VOCAB) -> None:
    tok = Tokenizer(models.WordLevel(vocab={f"w{i}": i for i in range(vocab)}, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({"add_bos_token": False, "eos_token": "w2"}))


def build(name: str, out: Path, *, seed: int = 0, shard_size: str | None = None, dtype=None):
    """Write a random checkpoint of architecture ``name`` to ``out``; returns the torch model."""
    import torch
    import transformers

    cfg_cls, model_cls, extra = ARCHS[name]
    cfg = getattr(transformers, cfg_cls)(**{**COMMON, **extra})
    torch.manual_seed(seed)
    model = getattr(transformers, model_cls)(cfg)
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if p.ndim == 1 and "bias" not in pname:
                p.copy_(1.0 + 0.2 * torch.randn_like(p))   # norms: not all ones
            else:
                p.copy_(0.08 * torch.randn_like(p))
    model.eval()
    out.mkdir(parents=True, exist_ok=True)
    kwargs = {"max_shard_size": shard_size} if shard_size else {}
    if dtype is not None:
        model.to(dtype)
    model.save_pretrained(out, **kwargs)
    if dtype is not None:
        model.to(torch.float32)
    write_tokenizer(out)
    return model


def reference(model, tokens: list[int]):
    """Hidden states (stage-indexed like the engine's) and logits from transformers."""
    import torch

    with torch.no_grad():
        res = model(torch.tensor([tokens]), output_hidden_states=True)
    hidden = [h[0].float().numpy() for h in res.hidden_states]
    return hidden, res.logits[0].float().numpy()


def rel_l2(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a.astype(np.float64) - b) / max(np.linalg.norm(b.astype(np.float64)), 1e-30))


def dequantized_reference_model(container: Path, work: Path):
    """A transformers model whose weights are exactly the container's stored
    values (dequantized), so the engine's arithmetic can be checked alone,
    apart from the quantization error of the format."""
    import transformers
    from safetensors.numpy import save_file

    from app.convert import quant
    from app.convert.arch import spec_from_hf

    manifest = json.loads((container / "manifest.json").read_text())
    config = manifest["source"]["config"]
    spec = spec_from_hf(config)

    def values(raw: np.ndarray, dtype: str, shape) -> np.ndarray:
        return quant.dequantize(raw, dtype.upper(), int(np.prod(shape))).reshape(shape)

    trunk = np.fromfile(container / "trunk.bin", dtype=np.uint8)
    tensors = {}
    for t in manifest["tensors"]:
        tensors[spec.trunk[t["name"]]] = values(trunk[t["offset"]:t["offset"] + t["nbytes"]], t["dtype"], t["shape"])
    for bank in manifest["expert_banks"]:
        data = np.fromfile(container / bank["file"], dtype=np.uint8)
        for e, names in enumerate(spec.experts[bank["layer"]]):
            rec = data[4096 + e * bank["record_size"]:]
            for part, name in names.items():
                p = bank[part]
                tensors[name] = values(rec[p["offset"]:p["offset"] + p["nbytes"]], p["dtype"], p["shape"])
    work.mkdir(parents=True, exist_ok=True)
    (work / "config.json").write_text(json.dumps(config))
    save_file({k: np.ascontiguousarray(v, dtype=np.float32) for k, v in tensors.items()},
              str(work / "model.safetensors"))
    model = transformers.AutoModelForCausalLM.from_pretrained(work, dtype="float32")
    model.eval()
    return model
