"""Write the seed corpora of the Python fuzz targets into fuzz/corpus/<target>/.

    python fuzz/make_seeds.py

Seeds are small, hand-made, valid (or nearly valid) inputs that give the
fuzzer a structure to mutate; they are checked in, and this script only
rewrites them. The C targets' seeds (json, manifest, bank) are described in
fuzz/README.md. Needs the `test` extra (gguf) for the GGUF seeds.
"""
from __future__ import annotations

import base64
import json
import struct
from pathlib import Path

import numpy as np

CORPUS = Path(__file__).resolve().parent / "corpus"


def put(target: str, name: str, data: bytes | str) -> None:
    d = CORPUS / target
    d.mkdir(parents=True, exist_ok=True)
    (d / name).write_bytes(data.encode() if isinstance(data, str) else data)


def safetensors(tensors: dict, metadata: dict | None = None) -> bytes:
    header, blob = {}, b""
    if metadata is not None:
        header["__metadata__"] = metadata
    for name, (dtype, shape, data) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(blob), len(blob) + len(data)]}
        blob += data
    text = json.dumps(header, separators=(",", ":")).encode()
    return struct.pack("<Q", len(text)) + text + blob


def main() -> None:
    f32 = struct.pack("<6f", 1, -2, 3.5, 0, 1e30, -1e-30)
    put("safetensors", "mixed.safetensors", safetensors({
        "w": ("F32", [2, 3], f32), "h": ("F16", [2], b"\x00\x3c\x00\xc0"), "b": ("BF16", [2], b"\x80\x3f\x00\x40"),
        "e4": ("F8_E4M3", [4], b"\x38\x7f\xff\x01"), "e5": ("F8_E5M2", [2], b"\x3c\x7c"),
        "i": ("I64", [1], struct.pack("<q", -5)), "f": ("BOOL", [3], b"\x00\x01\x02"),
        "d": ("F64", [1], struct.pack("<d", 1e300)), "s": ("U8", [], b"\x07")}, {"format": "pt"}))
    put("safetensors", "empty.safetensors", safetensors({}))
    put("safetensors", "zero_dim.safetensors", safetensors({"z": ("F32", [0, 4], b""), "u": ("U16", [1], b"\x01\x00")}))

    shard1 = "model-00001-of-00002.safetensors"
    shard2 = "model-00002-of-00002.safetensors"
    config = json.dumps({"architectures": ["LlamaForCausalLM"], "hidden_size": 2}).encode()
    index = {"metadata": {"total_size": 20}, "weight_map": {"a.weight": shard1, "b.bias": shard1}}
    put("checkpoint", "index_only.bin", json.dumps(index))
    put("checkpoint", "index_config.bin", json.dumps(index).encode() + b"\x00\x00" + config)
    index2 = {"weight_map": {"a.weight": shard1, "b.bias": shard1, "c": shard2}}
    put("checkpoint", "two_shards.bin", json.dumps(index2).encode() + b"\x00\x00" + config + b"\x00\x00"
        + safetensors({"c": ("F32", [1], struct.pack("<f", 2))}))

    try:
        import gguf
    except ImportError:
        print("gguf is not installed: GGUF seeds not rewritten")
    else:
        import tempfile
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "seed.gguf"
            w = gguf.GGUFWriter(str(path), "llama")
            w.add_uint32("llama.block_count", 1)
            w.add_float32("llama.rope.freq_base", 10000.0)
            w.add_bool("general.flag", True)
            w.add_string("general.name", "seed")
            w.add_array("tokenizer.ggml.tokens", ["a", "b", "<s>"])
            w.add_array("tokenizer.ggml.scores", [0.0, -1.0, -2.0])
            w.add_int64("general.big", -(1 << 40))
            w.add_float64("general.f64", 0.5)
            w.add_tensor("f32", np.arange(8, dtype=np.float32).reshape(2, 4))
            w.add_tensor("f16", np.ones(32, dtype=np.float16))
            q = np.zeros(34, dtype=np.uint8)
            q[1] = 0x38
            w.add_tensor("q8", q, raw_shape=(1, 34), raw_dtype=gguf.GGMLQuantizationType.Q8_0)
            w.write_header_to_file()
            w.write_kv_data_to_file()
            w.write_tensors_to_file()
            w.close()
            put("gguf", "small.gguf", path.read_bytes())

    ranks = {bytes([b]): b for b in range(256)}
    for word in (b"th", b"he", b"the", b" the", "你好".encode(), b"<|", b"|>"):
        ranks.setdefault(word, len(ranks))
    put("tiktoken", "tiny.tiktoken", b"".join(base64.b64encode(t) + b" " + str(r).encode() + b"\n"
                                               for t, r in ranks.items()))
    put("tiktoken", "text.bin", "#text\n\x40The quick <|open|> 你好 world's 123\r\n  x".encode())
    put("tiktoken", "short.tiktoken", b"YQ== 0\nYg== 1\n")

    put("template", "a.bin", bytes(range(64)))
    put("template", "b.bin", b"\x01\x02\x00\xffhello\x05<|im_end|>\x03\x02\x01\x00" * 4)
    put("template", "c.bin", b"\xff" * 48 + b"\x00" * 48)

    user = {"role": "user", "content": "What is the weather in <|open|> Paris?"}
    call = {"role": "assistant", "content": "", "reasoning_content": "need the tool",
            "tool_calls": [{"id": "c1", "type": "function",
                            "function": {"name": "weather", "arguments": "{\"city\": \"Paris\"}"}}]}
    tool = {"role": "tool", "tool_call_id": "c1", "content": "18C"}
    tools = [{"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}]
    put("k3", "tools.json", json.dumps({"messages": [{"role": "system", "content": "Be brief."}, user, call, tool],
                                        "tools": tools, "tool_choice": "auto", "thinking_effort": "high"}))
    put("k3", "images.json", json.dumps({"messages": [{"role": "user", "content": [
        {"type": "text", "text": "look"}, {"type": "image_url", "image_url": {"url": "x"}},
        {"type": "text", "text": "and <|kimi_image_placeholder|>"}]}], "image_prompts": ["<IMG1>", "<IMG2>"]}))
    put("k3", "schema.json", json.dumps({"messages": [user], "thinking": False, "add_generation_prompt": False,
                                         "response_format": {"type": "json_schema", "json_schema": {
                                             "name": "w", "schema": {"type": "object"}}}}))
    put("k3", "system_tools.json", json.dumps({"messages": [user, {"role": "system", "tools": tools}, user],
                                               "tool_choice": "required"}))

    hub_seeds()


def hub_seeds() -> None:
    """A hub's file list (hub_listing) and a staged repository's index and configs (staged_index)."""
    sha = "0123456789abcdef0123456789abcdef01234567"
    lfs = {"sha256": "ab" * 32, "size": 1000, "pointerSize": 134}
    put("hub_listing", "llama.json", json.dumps({"id": "o/r", "sha": sha, "gated": False, "siblings": [
        {"rfilename": "config.json", "size": 600}, {"rfilename": "model-00001-of-00002.safetensors", "size": 1000,
                                                    "lfs": lfs},
        {"rfilename": "model.safetensors.index.json", "size": 300}, {"rfilename": "tokenizer.json", "size": 9000}]}))
    put("hub_listing", "gguf_subfolder.json", json.dumps({"sha": sha, "siblings": [
        {"rfilename": "Q4_K_M/model-Q4_K_M.gguf", "size": 10, "lfs": lfs}, {"rfilename": "README.md", "size": 5}]}))
    put("hub_listing", "hostile.json", json.dumps({"sha": sha, "siblings": [
        {"rfilename": "../../x.gguf", "size": 1}, {"rfilename": "/abs.gguf", "size": 1},
        {"rfilename": "out/escape.json", "size": 1}, {"rfilename": "\u001b[2J.gguf", "size": -1}]}))
    index = json.dumps({"metadata": {"total_size": 32}, "weight_map": {
        "a.weight": "model-00001-of-00002.safetensors", "b.weight": "model-00002-of-00002.safetensors"}})
    config = json.dumps({"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "num_hidden_layers": 2,
                         "eos_token_id": [1, 2], "rope_scaling": {"type": "linear", "factor": 2.0}})
    tok = json.dumps({"chat_template": [{"name": "default", "template": "{{ x }}"}], "bos_token": {"content": "<s>"}})
    put("staged_index", "indexed.bin", index.encode() + b"\0\0" + config.encode() + b"\0\0" + tok.encode())
    put("staged_index", "escaping.bin", json.dumps({"weight_map": {"a.weight": "../x.safetensors"}}).encode()
        + b"\0\0" + json.dumps({"num_hidden_layers": 1e9, "eos_token_id": [[1]]}).encode())


if __name__ == "__main__":
    main()
