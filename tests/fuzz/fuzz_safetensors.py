"""atheris harness: one untrusted safetensors file (app/convert/safetensors_file.py).

The input is the whole file. Opening it may only raise SourceError; when it
opens, every tensor must read back, as raw bytes and as float32, with the
size and shape its header promised."""
from __future__ import annotations

import numpy as np
from fuzzlib import allowed, atheris, main, scratch_dir

with atheris.instrument_imports(include=["app"]):
    from app.convert.errors import SourceError
    from app.convert.safetensors_file import SafetensorsFile

PATH = scratch_dir() / "model.safetensors"


def test_one(data: bytes) -> None:
    PATH.write_bytes(data)
    with allowed(SourceError):
        f = SafetensorsFile(PATH)
        for name, info in f.tensors.items():
            raw = f.read_raw(name)
            assert raw.nbytes == info.nbytes and info.offset + info.nbytes <= len(data), name
            values = f.read_f32(name)
            assert values.shape == info.shape and values.dtype == np.float32, name
        assert isinstance(f.metadata, dict)


if __name__ == "__main__":
    main(test_one)
