"""Write a Qwen3-MoE-shaped GGUF file with random weights, for speed benchmarks.

    python bench/make_gguf_moe.py OUT.gguf [--layers 16] [--type q4_0|q4_k_m] [--size 30b-a3b|tiny]

Architecture ``qwen3moe`` (both Ferry and llama.cpp load it) at Qwen3-30B-A3B
widths: hidden 2048, 32 query / 4 KV heads of 128, 128 experts of FFN width
768 stacked in 3-D tensors (``blk.N.ffn_{gate,up,down}_exps.weight``), top-8
routing, with ``--layers`` layers instead of 48 (16 layers: about 5.6 GB in
Q4_0; each layer adds about 340 MB). The tokenizer is the demo model's
(SmolLM2's 49152-token BPE). ``tiny`` is a small shape for tests.

Tensor types are the ones llama.cpp's quantizer picks for the file type:
``q4_0``: Q4_0 everywhere but the output matrix (Q6_K); ``q4_k_m``: Q4_K,
with Q6_K for the output and for attn_v and ffn_down_exps in the layers
llama.cpp gives more bits. Norms and the router (ffn_gate_inp) stay F32, as
llama.cpp keeps them. Weights are random blocks whose values have mean about
zero and a standard deviation of about 0.02 (zero-mean, so tokens route to
different experts); the router is normal with standard deviation 0.02.
Tensors are generated and written one at a time (memory stays at one
tensor). The same arguments always write the same bytes.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

from bench.make_gguf_llama import add_tokenizer, demo_tokenizer, random_blocks, use_more_bits  # noqa: E402

#: dim, heads, kv heads, head dim, experts, top-k, expert FFN, default layers
SHAPES = {
    "30b-a3b": (2048, 32, 4, 128, 128, 8, 768, 16),
    "tiny": (256, 4, 2, 64, 16, 4, 256, 2),  # for tests (rows of 256: whole K-quant blocks)
}
TYPES = ("q4_0", "q4_k_m")
FILE_TYPE = {"q4_0": 2, "q4_k_m": 15}  # llama.cpp's LLAMA_FTYPE_MOSTLY_Q4_0 / Q4_K_M


def tensor_plan(size: str, qtype: str, layers: int, vocab: int) -> list[tuple[str, tuple[int, ...], str]]:
    """(name, numpy shape, ggml type) of every tensor in file order; F32 ones are vectors or the router."""
    dim, heads, kv, head, experts, _, ffn, _ = SHAPES[size]

    def q(kind: str, layer: int = 0) -> str:
        if kind == "output":
            return "Q6_K"
        if qtype == "q4_0":
            return "Q4_0"
        if kind in ("attn_v", "ffn_down_exps") and use_more_bits(layer, layers):
            return "Q6_K"
        return "Q4_K"

    plan = [("token_embd.weight", (vocab, dim), q("token_embd"))]
    for i in range(layers):
        b = f"blk.{i}."
        plan += [(b + "attn_norm.weight", (dim,), "F32"),
                 (b + "attn_q.weight", (heads * head, dim), q("attn_q", i)),
                 (b + "attn_k.weight", (kv * head, dim), q("attn_k", i)),
                 (b + "attn_v.weight", (kv * head, dim), q("attn_v", i)),
                 (b + "attn_output.weight", (dim, heads * head), q("attn_output", i)),
                 (b + "attn_q_norm.weight", (head,), "F32"),
                 (b + "attn_k_norm.weight", (head,), "F32"),
                 (b + "ffn_norm.weight", (dim,), "F32"),
                 (b + "ffn_gate_inp.weight", (experts, dim), "F32"),
                 (b + "ffn_gate_exps.weight", (experts, ffn, dim), q("ffn_gate_exps", i)),
                 (b + "ffn_up_exps.weight", (experts, ffn, dim), q("ffn_up_exps", i)),
                 (b + "ffn_down_exps.weight", (experts, dim, ffn), q("ffn_down_exps", i))]
    plan += [("output_norm.weight", (dim,), "F32"), ("output.weight", (vocab, dim), q("output"))]
    return plan


def _data(rng: np.random.Generator, name: str, shape: tuple[int, ...], kind: str) -> np.ndarray:
    if kind != "F32":
        rows = int(np.prod(shape[:-1]))
        return random_blocks(rng, rows, shape[-1], kind).reshape(shape[:-1] + (-1,))
    if name.endswith("ffn_gate_inp.weight"):
        return (0.02 * rng.standard_normal(shape)).astype(np.float32)
    return (1 + 0.05 * rng.standard_normal(shape)).astype(np.float32)


def write(out: Path, qtype: str = "q4_0", layers: int | None = None, size: str = "30b-a3b", seed: int = 0) -> Path:
    import gguf

    dim, heads, kv, head, experts, top_k, ffn, default_layers = SHAPES[size]
    layers = layers or default_layers
    tok = demo_tokenizer()
    vocab = len(tok["tokenizer.ggml.tokens"])
    w = gguf.GGUFWriter(str(out), "qwen3moe")
    w.add_name(f"synthetic-qwen3moe-{size}-{layers}l-{qtype}")
    w.add_block_count(layers)
    w.add_context_length(4096)
    w.add_embedding_length(dim)
    w.add_feed_forward_length(6144 if size == "30b-a3b" else 4 * dim)  # the release's dense width (unused)
    w.add_head_count(heads)
    w.add_head_count_kv(kv)
    w.add_key_length(head)
    w.add_value_length(head)
    w.add_rope_freq_base(1000000.0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_expert_count(experts)
    w.add_expert_used_count(top_k)
    w.add_expert_feed_forward_length(ffn)
    w.add_file_type(FILE_TYPE[qtype])
    add_tokenizer(w, tok)
    plan = tensor_plan(size, qtype, layers, vocab)
    for name, shape, kind in plan:   # the infos first, then the data one tensor at a time
        if kind == "F32":
            w.add_tensor_info(name, shape, np.dtype(np.float32), int(np.prod(shape)) * 4)
        else:
            qt = getattr(gguf.GGMLQuantizationType, kind)
            block, type_bytes = gguf.GGML_QUANT_SIZES[qt]
            nbytes = int(np.prod(shape)) // block * type_bytes
            w.add_tensor_info(name, shape, np.dtype(np.float16), nbytes, raw_dtype=qt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    rng = np.random.default_rng(seed)
    for name, shape, kind in plan:
        w.write_tensor_data(_data(rng, name, shape, kind))
    w.close()
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--size", choices=sorted(SHAPES), default="30b-a3b")
    ap.add_argument("--type", choices=TYPES, default="q4_0")
    ap.add_argument("--layers", type=int, default=None, help="layers (default: 16, tiny: 2)")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    write(a.out, a.type, a.layers, a.size, a.seed)
    print(a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
