"""atheris harness: a Hugging Face checkpoint folder's JSON files
(app/convert/safetensors_file.py: model.safetensors.index.json and config.json).

The input is split at the first two NUL pairs into the index, config.json and
an optional second shard; the folder always also holds one good shard.
Checkpoint.validate must return SourceErrors only, Checkpoint() may only raise
SourceError, and an accepted checkpoint must read every tensor it lists."""
from __future__ import annotations

import json
import struct

from fuzzlib import allowed, atheris, main, scratch_dir

with atheris.instrument_imports(include=["app"]):
    from app.convert.errors import SourceError
    from app.convert.safetensors_file import Checkpoint

DIR = scratch_dir()


def shard_bytes(tensors: dict[str, tuple[str, list[int], bytes]]) -> bytes:
    header, blob = {}, b""
    for name, (dtype, shape, data) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(blob), len(blob) + len(data)]}
        blob += data
    text = json.dumps(header).encode()
    return struct.pack("<Q", len(text)) + text + blob


(DIR / "model-00001-of-00002.safetensors").write_bytes(
    shard_bytes({"a.weight": ("F32", [2, 2], struct.pack("<4f", 1, 2, 3, 4)),
                 "b.bias": ("BF16", [2], b"\x80\x3f\x00\x40")}))
(DIR / "tokenizer.json").write_text("{}")
SECOND = DIR / "model-00002-of-00002.safetensors"


def test_one(data: bytes) -> None:
    parts = data.split(b"\x00\x00", 2)
    (DIR / "model.safetensors.index.json").write_bytes(parts[0])
    (DIR / "config.json").write_bytes(parts[1] if len(parts) > 1 else b'{"architectures": ["LlamaForCausalLM"]}')
    if len(parts) > 2:
        SECOND.write_bytes(parts[2])
    else:
        SECOND.unlink(missing_ok=True)
    problems = Checkpoint.validate(DIR)
    assert all(isinstance(p, SourceError) for p in problems), problems
    with allowed(SourceError):
        ckpt = Checkpoint(DIR)
        assert not problems
        for name in ckpt.tensor_names():
            ckpt.read_f32(name)
        assert ckpt.total_bytes >= 0
        ckpt.tokenizer_files()
        assert isinstance(ckpt.config, dict)


if __name__ == "__main__":
    main(test_one)
