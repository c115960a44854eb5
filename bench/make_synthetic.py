"""Write a deterministic random-weight checkpoint in a real release layout.

Qwen3-MoE-shaped for now (config.json, sharded safetensors with an index,
tokenizer.json): the layout `ferry convert` reads from a real download. Every
tensor is generated from its own seed, so any size can be written with
bounded memory, and the same flags always give the same bytes.

    python bench/make_synthetic.py --out /tmp/synth --layers 8 --experts 64 --size-gb 4
"""
from __future__ import annotations

import argparse
import json
import struct
import sys
import zlib
from pathlib import Path

import numpy as np

DTYPES = {"bf16": ("BF16", 2), "f32": ("F32", 4)}


def qwen3moe_config(a) -> dict:
    return {
        "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
        "vocab_size": a.vocab, "hidden_size": a.dim, "intermediate_size": a.expert_ffn * 4,
        "moe_intermediate_size": a.expert_ffn, "num_hidden_layers": a.layers,
        "num_attention_heads": a.heads, "num_key_value_heads": max(1, a.heads // 4), "head_dim": a.dim // a.heads,
        "num_experts": a.experts, "num_experts_per_tok": a.top_k, "norm_topk_prob": True,
        "decoder_sparse_step": 1, "mlp_only_layers": [], "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "tie_word_embeddings": False,
        "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": "bfloat16" if a.dtype == "bf16" else "float32",
    }


def tensor_list(cfg: dict) -> list[tuple[str, tuple[int, ...]]]:
    d, hd = cfg["hidden_size"], cfg["head_dim"]
    q, kv, f = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd, cfg["moe_intermediate_size"]
    out = [("model.embed_tokens.weight", (cfg["vocab_size"], d))]
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        out += [(p + "input_layernorm.weight", (d,)), (p + "post_attention_layernorm.weight", (d,)),
                (p + "self_attn.q_proj.weight", (q, d)), (p + "self_attn.k_proj.weight", (kv, d)),
                (p + "self_attn.v_proj.weight", (kv, d)), (p + "self_attn.o_proj.weight", (d, q)),
                (p + "self_attn.q_norm.weight", (hd,)), (p + "self_attn.k_norm.weight", (hd,)),
                (p + "mlp.gate.weight", (cfg["num_experts"], d))]
        for e in range(cfg["num_experts"]):
            out += [(p + f"mlp.experts.{e}.gate_proj.weight", (f, d)), (p + f"mlp.experts.{e}.up_proj.weight", (f, d)),
                    (p + f"mlp.experts.{e}.down_proj.weight", (d, f))]
    return out + [("model.norm.weight", (d,)), ("lm_head.weight", (cfg["vocab_size"], d))]


def values(name: str, shape: tuple[int, ...], seed: int, same_router: bool = False) -> np.ndarray:
    # Correlated routing, as in real models: one router for every layer, and
    # blocks that nudge the residual stream rather than replace it.
    small = same_router and name.endswith(("o_proj.weight", "down_proj.weight"))
    if same_router and name.endswith("mlp.gate.weight"):
        name = "router"
    rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
    if len(shape) == 1:
        return (1.0 + 0.1 * rng.standard_normal(shape)).astype(np.float32)
    scale = (0.05 if small else 1.0) / np.sqrt(shape[1])
    return (scale * rng.standard_normal(shape, dtype=np.float32)).astype(np.float32)


def encode(x: np.ndarray, dtype: str) -> bytes:
    if dtype == "f32":
        return x.astype("<f4").tobytes()
    bits = x.astype(np.float32).view(np.uint32)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16  # round to nearest even
    return rounded.astype("<u2").tobytes()


def write_shard(path: Path, items: list[tuple[str, tuple[int, ...]]], dtype: str, seed: int,
                same_router: bool = False) -> None:
    st_dtype, size = DTYPES[dtype]
    header, offset = {}, 0
    for name, shape in items:
        n = int(np.prod(shape)) * size
        header[name] = {"dtype": st_dtype, "shape": list(shape), "data_offsets": [offset, offset + n]}
        offset += n
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(blob)) + blob)
        for name, shape in items:
            f.write(encode(values(name, shape, seed, same_router), dtype))


def write_tokenizer(out: Path, vocab: int) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel(vocab={f"w{i}": i for i in range(vocab)}, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(out / "tokenizer.json"))


def make(a) -> Path:
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    cfg = qwen3moe_config(a)
    tensors = tensor_list(cfg)
    size = DTYPES[a.dtype][1]
    total = sum(int(np.prod(s)) * size for _, s in tensors)
    per_shard = total / a.shards
    shards: list[list] = [[] for _ in range(a.shards)]
    acc = 0
    for name, shape in tensors:
        shards[min(int(acc / per_shard), a.shards - 1)].append((name, shape))
        acc += int(np.prod(shape)) * size
    weight_map = {}
    for i, items in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{a.shards:05d}.safetensors"
        write_shard(out / fname, items, a.dtype, a.seed, a.same_router)
        weight_map.update({name: fname for name, _ in items})
    (out / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=1))
    (out / "config.json").write_text(json.dumps(cfg, indent=1))
    write_tokenizer(out, a.vocab)
    return out


def parse(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--experts", type=int, default=16)
    ap.add_argument("--top-k", type=int, default=4)
    ap.add_argument("--dim", type=int, default=256)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--expert-ffn", type=int, default=256)
    ap.add_argument("--vocab", type=int, default=512)
    ap.add_argument("--shards", type=int, default=2)
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--same-router", action="store_true",
                    help="one router for every layer (routing correlated across layers, as in real models)")
    ap.add_argument("--size-gb", type=float, default=None,
                    help="grow --experts until the checkpoint is about this large")
    a = ap.parse_args(argv)
    if a.size_gb:
        per_expert = 3 * a.dim * a.expert_ffn * DTYPES[a.dtype][1] * a.layers
        a.experts = max(a.top_k, int(a.size_gb * 2**30 / per_expert))
    return a


if __name__ == "__main__":
    print(make(parse(sys.argv[1:])))
