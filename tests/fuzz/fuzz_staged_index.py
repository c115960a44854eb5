"""atheris harness: a repository's shard index and configs as `ferry get
--plan` stages them (app/get/staged.py StagedSource over the small files and
the shard headers fetched from the hub, app/convert/config_check.py).

The input is split at the first two NUL pairs into
model.safetensors.index.json, config.json and tokenizer_config.json. The
hub lists two shards (their headers are known); the folder holds only the
small files. StagedSource and the config checks may only raise SourceError;
an accepted source names only the listed shards, inside the folder."""
from __future__ import annotations

import json
import struct

from fuzzlib import allowed, atheris, main, scratch_dir

with atheris.instrument_imports(include=["app"]):
    from app.convert import tokenizer_files
    from app.convert.config_check import load_config
    from app.convert.errors import SourceError
    from app.get.staged import StagedSource

DIR = scratch_dir() / "repo"
DIR.mkdir()
(DIR / "tokenizer.json").write_text("{}")


def header(tensors: dict[str, tuple[str, list[int]]]) -> tuple[bytes, int]:
    h, off = {}, 0
    for name, (dtype, shape) in tensors.items():
        n = 4 * (shape[0] * shape[1] if len(shape) == 2 else shape[0])
        h[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + n]}
        off += n
    text = json.dumps(h).encode()
    return struct.pack("<Q", len(text)) + text, 8 + len(text) + off


SHARDS = {"model-00001-of-00002.safetensors": header({"a.weight": ("F32", [2, 2])}),
          "model-00002-of-00002.safetensors": header({"b.weight": ("F32", [4])})}
IDENTITY = {"kind": "hub", "repo": "fuzz/repo", "commit": "0" * 40, "files": []}


def test_one(data: bytes) -> None:
    parts = data.split(b"\x00\x00", 2)
    (DIR / "model.safetensors.index.json").write_bytes(parts[0])
    (DIR / "config.json").write_bytes(parts[1] if len(parts) > 1 else b'{"architectures": ["LlamaForCausalLM"]}')
    tok = DIR / "tokenizer_config.json"
    if len(parts) > 2:
        tok.write_bytes(parts[2])
    else:
        tok.unlink(missing_ok=True)
    with allowed(SourceError):
        config = load_config(DIR / "config.json")
        tokenizer_files.from_hf(DIR, config)
    with allowed(SourceError):
        src = StagedSource(DIR, SHARDS, IDENTITY)
        for name in src.ckpt.tensor_names():
            path = src.ckpt.info(name).path
            assert path.parent == DIR and path.name in SHARDS, path


if __name__ == "__main__":
    main(test_one)
