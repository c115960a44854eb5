"""Write a deterministic random-weight checkpoint in a real release layout.

Qwen3-MoE-shaped for now (config.json, sharded safetensors with an index,
tokenizer.json): the layout `ferry convert` reads from a real download. Every
tensor is generated from its own seed, so any size can be written with
bounded memory, and the same flags always give the same bytes.

`--expert-dtype mxfp4` stores the routed experts as Kimi K3 does:
compressed-tensors `mxfp4-pack-quantized` (`X.weight_packed` u8 [out, in/2],
element 2j in the low nibble of byte j; `X.weight_scale` u8 [out, in/32]
E8M0), with K3's `quantization_config`; the nibbles follow the distribution
of round-to-nearest MXFP4 of Gaussian weights.

    python bench/make_synthetic.py --out /tmp/synth --layers 8 --experts 64 --size-gb 4
    python bench/make_synthetic.py --out /tmp/synth-mx --dim 1024 --expert-dtype mxfp4 --size-gb 4
"""
from __future__ import annotations

import argparse
import json
import struct
import sys
import zlib
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

DTYPES = {"bf16": ("BF16", 2), "f32": ("F32", 4)}
MXFP4 = "mxfp4"
#: Bytes per weight of each expert dtype.
EXPERT_BYTES = {"bf16": 2, "f32": 4, MXFP4: 17 / 32}
#: K3's quantization_config (the release's config.json), for --expert-dtype mxfp4.
MXFP4_CONFIG = {
    "config_groups": {"group_0": {"format": "mxfp4-pack-quantized", "targets": ["Linear"],
                                  "weights": {"group_size": 32, "num_bits": 4, "strategy": "group",
                                              "symmetric": True, "type": "float", "scale_dtype": "torch.uint8"}}},
    "format": "mxfp4-pack-quantized", "quant_method": "compressed-tensors",
    "ignore": ["re:.*self_attn.*", "re:.*mlp\\.gate$", "re:.*lm_head.*"], "quantization_status": "compressed"}


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
        **({"quantization_config": MXFP4_CONFIG} if a.expert_dtype == MXFP4 else {}),
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


def is_expert(name: str) -> bool:
    return ".mlp.experts." in name


def _mxfp4_pool() -> np.ndarray:
    """Packed bytes of round-to-nearest MXFP4 Gaussian weights, to draw nibble pairs from."""
    from app.convert.quant3 import mxfp4_encode

    w = np.random.default_rng(12345).standard_normal((256, 4096), dtype=np.float32)
    return mxfp4_encode(w)[0].reshape(-1)


def mxfp4_tensors(name: str, shape: tuple[int, ...], seed: int, pool: np.ndarray) -> list[tuple[str, bytes]]:
    """`name` (X.weight) as compressed-tensors MXFP4: X.weight_packed and X.weight_scale."""
    rows, cols = shape
    rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
    packed = pool[rng.integers(0, pool.size, rows * cols // 2, dtype=np.uint32)]
    # E8M0 scales around 2^-7 (weights up to ~0.05, as in the bf16 checkpoints' experts)
    scales = (120 + rng.integers(-1, 2, rows * cols // 32, dtype=np.int32)).astype(np.uint8)
    base = name.removesuffix(".weight")
    return [(base + ".weight_packed", packed.tobytes()), (base + ".weight_scale", scales.tobytes())]


def stored(name: str, shape: tuple[int, ...], dtype: str, expert_dtype: str) -> list[tuple[str, str, list, int]]:
    """(name, safetensors dtype, shape, bytes) of what `name` is stored as."""
    if expert_dtype == MXFP4 and is_expert(name):
        rows, cols = shape
        base = name.removesuffix(".weight")
        return [(base + ".weight_packed", "U8", [rows, cols // 2], rows * cols // 2),
                (base + ".weight_scale", "U8", [rows, cols // 32], rows * cols // 32)]
    st_dtype, size = DTYPES[expert_dtype if is_expert(name) else dtype]
    return [(name, st_dtype, list(shape), int(np.prod(shape)) * size)]


def write_shard(path: Path, items: list[tuple[str, tuple[int, ...]]], dtype: str, seed: int,
                same_router: bool = False, expert_dtype: str | None = None) -> None:
    expert_dtype = expert_dtype or dtype
    header, offset = {}, 0
    for name, shape in items:
        for sname, st_dtype, sshape, n in stored(name, shape, dtype, expert_dtype):
            header[sname] = {"dtype": st_dtype, "shape": sshape, "data_offsets": [offset, offset + n]}
            offset += n
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    pool = _mxfp4_pool() if expert_dtype == MXFP4 else None
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(blob)) + blob)
        for name, shape in items:
            if pool is not None and is_expert(name):
                for _, data in mxfp4_tensors(name, shape, seed, pool):
                    f.write(data)
            else:
                f.write(encode(values(name, shape, seed, same_router), expert_dtype if is_expert(name) else dtype))


def write_tokenizer(out: Path, vocab: int) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel(vocab={f"w{i}": i for i in range(vocab)}, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(out / "tokenizer.json"))


def make_kimi(a) -> Path:
    """A K3- or Kimi-Linear-shaped checkpoint in the release layout, written by
    the generators the tests check against their references (tests/kimi):
    K3 (KDA + MLA, AttnRes, latent MoE, MXFP4 experts, sigmoid routing) or
    Kimi-Linear (KDA + NoPE MLA, sigmoid routing, shared expert), with the
    expert count, top-k and expert width asked for."""
    # Run as a script, bench/ is first on the path and its kernels.py would
    # shadow the `kernels` package transformers imports.
    here = Path(__file__).resolve().parent
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != here]
    from tests.kimi import tiny_k3, tiny_kimi

    out = Path(a.out)
    if a.family == "k3":
        tiny_k3.build(out, seed=a.seed, moe_ffn=a.expert_ffn, latent=a.latent, experts=a.experts, top_k=a.top_k)
    else:
        layers = range(1, a.layers + 1)  # one MLA layer in four, as the release (3 KDA : 1 MLA)
        lin = {**tiny_kimi.KIMI_LINEAR["linear_attn_config"], "kda_layers": [i for i in layers if i % 4],
               "full_attn_layers": [i for i in layers if not i % 4]}
        tiny_kimi.build("kimi_linear", out, num_experts=a.experts, num_experts_per_token=a.top_k,
                        moe_intermediate_size=a.expert_ffn, hidden_size=a.dim, num_hidden_layers=a.layers,
                        intermediate_size=2 * a.dim, linear_attn_config=lin)
    return out


def make(a) -> Path:
    if a.family != "qwen3moe":
        return make_kimi(a)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    cfg = qwen3moe_config(a)
    tensors = tensor_list(cfg)
    def nbytes(name, shape):
        return sum(n for *_, n in stored(name, shape, a.dtype, a.expert_dtype))

    total = sum(nbytes(n, s) for n, s in tensors)
    per_shard = total / a.shards
    shards: list[list] = [[] for _ in range(a.shards)]
    acc = 0
    for name, shape in tensors:
        shards[min(int(acc / per_shard), a.shards - 1)].append((name, shape))
        acc += nbytes(name, shape)
    weight_map = {}
    for i, items in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{a.shards:05d}.safetensors"
        write_shard(out / fname, items, a.dtype, a.seed, a.same_router, a.expert_dtype)
        weight_map.update({sname: fname for name, shape in items
                           for sname, *_ in stored(name, shape, a.dtype, a.expert_dtype)})
    (out / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=1))
    (out / "config.json").write_text(json.dumps(cfg, indent=1))
    write_tokenizer(out, a.vocab)
    return out


def parse(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--family", choices=["qwen3moe", "k3", "kimi_linear"], default="qwen3moe",
                    help="k3: Kimi K3's layout (7 layers, width 64, latent MoE; --layers/--dim are fixed); "
                         "kimi_linear: Kimi-Linear's (KDA + MLA)")
    ap.add_argument("--latent", type=int, default=64, help="k3: the latent width the experts run on")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--experts", type=int, default=16)
    ap.add_argument("--top-k", type=int, default=4)
    ap.add_argument("--dim", type=int, default=256)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--expert-ffn", type=int, default=256)
    ap.add_argument("--vocab", type=int, default=512)
    ap.add_argument("--shards", type=int, default=2)
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    ap.add_argument("--expert-dtype", choices=sorted(EXPERT_BYTES), default=None,
                    help="how the routed experts are stored (default: --dtype); mxfp4 as in Kimi K3")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--same-router", action="store_true",
                    help="one router for every layer (routing correlated across layers, as in real models)")
    ap.add_argument("--size-gb", type=float, default=None,
                    help="grow --experts until the checkpoint is about this large")
    a = ap.parse_args(argv)
    a.expert_dtype = a.expert_dtype or a.dtype
    if a.size_gb:
        per_expert = 3 * a.dim * a.expert_ffn * EXPERT_BYTES[a.expert_dtype] * a.layers
        a.experts = max(a.top_k, int(a.size_gb * 2**30 / per_expert))
    return a


if __name__ == "__main__":
    print(make(parse(sys.argv[1:])))
