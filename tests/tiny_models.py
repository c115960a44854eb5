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


def build(name: str, out: Path, *, seed: int = 0, shard_size: str | None = None, dtype=None, **overrides):
    """Write a random checkpoint of architecture ``name`` to ``out``; returns the torch model. ``overrides``
    replace entries of the config (e.g. wider experts for a benchmark)."""
    import torch
    import transformers

    cfg_cls, model_cls, extra = ARCHS[name]
    cfg = getattr(transformers, cfg_cls)(**{**COMMON, **extra, **overrides})
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
    """Hidden states (transformers' indexing) and logits from transformers."""
    import torch

    with torch.no_grad():
        res = model(torch.tensor([tokens]), output_hidden_states=True, use_cache=False)
    hidden = [h[0].float().numpy() for h in res.hidden_states]
    return hidden, res.logits[0].float().numpy()


def rel_l2(a, b) -> float:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def run_engine(container, tokens, prompt: int, threads: int = 2, n_ctx: int = 64):
    """Stages {stage: [T, dim]}, logits [T, vocab] and the layer count from the
    engine: a prompt of `prompt` tokens, then single decode steps. Exact
    activations, named (not the default): this is what the reference checks run."""
    from app.engine.binding import Engine

    with Engine(container, threads=threads, activations="exact") as engine:
        session = engine.session(n_ctx)
        stages: dict[int, list[np.ndarray]] = {}
        session.observe(lambda stage, pos, h: stages.setdefault(stage, []).append(h))
        logits = [session.eval(tokens[:prompt], all_logits=True)]
        for t in tokens[prompt:]:
            logits.append(session.eval([t])[None])
        n_layers = engine.info.n_layers
        session.close()
    return {k: np.concatenate(v) for k, v in stages.items()}, np.concatenate(logits), n_layers


def compare(stages, logits, n_layers, hidden, ref_logits) -> dict[str, float]:
    """Relative L2 per stage; transformers' hidden[0] is the embedding, hidden[i]
    block i-1's output, hidden[L] the final norm."""
    pairs = [(0, 0)] + [(i, i) for i in range(1, n_layers)] + [(n_layers + 1, n_layers)]
    errors = {f"stage {s}": rel_l2(stages[s], hidden[h]) for s, h in pairs}
    errors["logits"] = rel_l2(logits, ref_logits)
    return errors


def assert_prefill_equals_single_steps(container, tokens, threads: int = 2,
                                      modes: tuple[str, ...] = ("exact", "q8")) -> None:
    """A prompt evaluated at once, token by token, and in chunks that do not
    line up with the core's prompt chunks (32 tokens, 128 on a model with
    experts; and an engine opened with chunks of 7) gives bit-identical
    logits, in each arithmetic mode of ``modes`` (exact, and 8-bit
    activations asked for by name; the models with KDA layers add "auto",
    whose default keeps some classes of their products exact)."""
    from app.engine.binding import Engine

    for activations in modes:
        with Engine(container, threads=threads, activations=activations) as engine:
            batch = engine.session(64).eval(tokens, all_logits=True)
            s = engine.session(64)
            steps = np.stack([s.eval([t]) for t in tokens])
            s2 = engine.session(64)
            mixed = np.concatenate([s2.eval(tokens[:5], all_logits=True), s2.eval(tokens[5:], all_logits=True)])
            # over several chunks, with only the last token's logits asked for (the core then
            # computes the last layer's output for that row alone, or none in earlier chunks)
            long = list(tokens) * 3
            every = engine.session(128).eval(long, all_logits=True)
            s3 = engine.session(128)
            part, last = s3.eval(long[:40]), s3.eval(long[40:])
        with Engine(container, threads=threads, activations=activations, prompt_chunk=7) as small:
            assert small.info.prompt_chunk == 7
            sevens = small.session(128).eval(long, all_logits=True)
        assert np.array_equal(batch, steps), activations
        assert np.array_equal(batch, mixed), activations
        assert np.array_equal(every[:len(tokens)], batch), activations
        assert np.array_equal(part, every[39]) and np.array_equal(last, every[-1]), activations
        assert np.array_equal(sevens, every), activations


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
