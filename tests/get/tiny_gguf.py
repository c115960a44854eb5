"""A tiny Llama GGUF written with gguf's own writer (the demo's layout, small)."""
from __future__ import annotations

from pathlib import Path

import numpy as np

LAYERS, DIM, FFN, HEADS, KV, VOCAB = 2, 64, 96, 4, 2, 64


def write_llama_metadata(w, *, layers: int, dim: int, ffn: int, heads: int, kv: int, head_dim: int,
                         vocab: int) -> None:
    """The metadata of a tiny Llama GGUF (shapes, RoPE, a toy gpt2 vocabulary) on a gguf.GGUFWriter."""
    w.add_block_count(layers)
    w.add_context_length(128)
    w.add_embedding_length(dim)
    w.add_feed_forward_length(ffn)
    w.add_head_count(heads)
    w.add_head_count_kv(kv)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(head_dim)
    w.add_tokenizer_model("gpt2")
    w.add_token_list([chr(ord("a") + i % 26) * (1 + i // 26) for i in range(vocab)])
    w.add_token_types([1] * vocab)
    w.add_token_merges(["a a"])
    w.add_eos_token_id(1)


def write_tiny_gguf(path: Path, type_name: str = "Q8_0", seed: int = 5) -> Path:
    import gguf

    from app.convert import quant

    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(path), "llama")
    write_llama_metadata(w, layers=LAYERS, dim=DIM, ffn=FFN, heads=HEADS, kv=KV, head_dim=DIM // HEADS, vocab=VOCAB)

    def matrix(name, rows, cols):
        v = (rng.standard_normal((rows, cols)) * 0.05).astype(np.float32)
        if type_name == "F32":
            w.add_tensor(name, v)
        else:
            raw = quant.quantize(v, type_name)
            w.add_tensor(name, raw.reshape(rows, -1), raw_dtype=getattr(gguf.GGMLQuantizationType, type_name))

    matrix("token_embd.weight", VOCAB, DIM)
    for i in range(LAYERS):
        b = f"blk.{i}."
        w.add_tensor(b + "attn_norm.weight", (1 + 0.1 * rng.standard_normal(DIM)).astype(np.float32))
        w.add_tensor(b + "ffn_norm.weight", (1 + 0.1 * rng.standard_normal(DIM)).astype(np.float32))
        matrix(b + "attn_q.weight", DIM, DIM)
        matrix(b + "attn_k.weight", KV * DIM // HEADS, DIM)
        matrix(b + "attn_v.weight", KV * DIM // HEADS, DIM)
        matrix(b + "attn_output.weight", DIM, DIM)
        matrix(b + "ffn_gate.weight", FFN, DIM)
        matrix(b + "ffn_up.weight", FFN, DIM)
        matrix(b + "ffn_down.weight", DIM, FFN)
    w.add_tensor("output_norm.weight", (1 + 0.1 * rng.standard_normal(DIM)).astype(np.float32))
    matrix("output.weight", VOCAB, DIM)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
