"""atheris harness: one untrusted GGUF file (app/convert/gguf_file.py).

The input is the whole file. Opening it may only raise SourceError; when it
opens, every tensor must read back raw, and the decodable ones as float32 of
the promised shape."""
from __future__ import annotations

import numpy as np
from fuzzlib import allowed, atheris, main, scratch_dir

with atheris.instrument_imports(include=["app"]):
    from app.convert import quant
    from app.convert.errors import SourceError
    from app.convert.gguf_file import GGUFFile

PATH = scratch_dir() / "model.gguf"


def test_one(data: bytes) -> None:
    PATH.write_bytes(data)
    with allowed(SourceError):
        f = GGUFFile(PATH)
        for name, info in f.tensors.items():
            assert f.read_raw(name).nbytes == info.nbytes
            assert info.offset + info.nbytes <= len(data)
            if quant.FORMATS[info.type_name].decodable:
                values = f.read_f32(name)
                assert values.shape == info.shape and values.dtype == np.float32, name


if __name__ == "__main__":
    main(test_one)
