"""Model sources the converter reads: a Hugging Face checkpoint directory or a
GGUF file, behind one small interface so the writer does not care which.

Each source exposes its tensors by the names the :class:`~app.convert.arch.ModelSpec`
uses, reports each tensor's stored format in the container's spelling, and
reads one tensor at a time (never the whole model).
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from app.convert import quant
from app.convert.arch import ModelSpec, spec_from_gguf, spec_from_hf
from app.convert.compressed import CompressedTensors
from app.convert.config_check import load_config
from app.convert.errors import SourceError
from app.convert.gguf_file import GGUFFile
from app.convert.safetensors_file import Checkpoint
from app.engine.binding import FORMATS

#: The source formats a container keeps byte for byte, in its spelling: the C
#: core's formats (binding.FORMATS) that are ggml types of the same name and
#: block layout (f32, f16, bf16, q8_0, q4_0, q4_1, q4_k, q6_k, q5_k).
CORE_FORMATS = tuple(name for name, f in FORMATS.items()
                     if (g := quant.FORMATS.get(name.upper())) is not None
                     and (g.block_elems, g.block_bytes) == (f.block_elems, f.block_bytes))
_SAFETENSORS_DTYPES = {"F32": "f32", "F16": "f16", "BF16": "bf16"}


class Source:
    """Interface of a model source (see HFSource and GGUFSource)."""

    kind: str
    path: Path
    spec: ModelSpec
    config: dict[str, Any]

    def shape(self, name: str) -> tuple[int, ...]:
        """Row-major shape ([rows, cols] for matrices)."""
        raise NotImplementedError

    def stored_format(self, name: str) -> str:
        """The tensor's format in container spelling, or its own name if the core lacks it."""
        raise NotImplementedError

    def read_raw(self, name: str) -> np.ndarray:
        """Stored bytes, row-major, as uint8."""
        raise NotImplementedError

    def read_f32(self, name: str) -> np.ndarray:
        """Values as float32 in their row-major shape."""
        raise NotImplementedError

    def identity(self) -> dict[str, Any]:
        """What identifies these exact source bytes (for resuming safely)."""
        raise NotImplementedError

    def q3_input(self, name: str) -> tuple | None:
        """The tensor's stored bytes in a form the C q3_nl quantizer reads as they
        are: ("bf16", uint16 bits) or ("mxfp4", packed nibbles, E8M0 scales); None
        when it must go through read_f32. Either way the quantizer writes the same
        bytes (it decodes exactly what read_f32 decodes)."""
        if self.stored_format(name) == "bf16":
            return ("bf16", self.read_raw(name).view("<u2"))
        return None

    def total_bytes(self) -> int:
        raise NotImplementedError


def _stat_identity(paths: list[Path]) -> list[list]:
    out = []
    for p in paths:
        st = p.stat()
        out.append([p.name, st.st_size, int(st.st_mtime_ns)])
    return out


class HFSource(Source):
    """A Hugging Face checkpoint folder. Names may carry a view suffix
    (``@flat``, ``@2d``, ``@first:N``, see arch.py), and quantized weights of
    the Kimi / DeepSeek releases (compressed.py) read as their float values."""

    kind = "hf"

    def __init__(self, path: Path, ckpt: Checkpoint | None = None):
        self.path = path
        # The architecture first: "unsupported" is the more useful message.
        self.spec = spec_from_hf(load_config(path / "config.json"))
        self.ckpt = ckpt or Checkpoint(path)
        self.config = self.ckpt.config
        self.compressed = CompressedTensors(self.ckpt, self.config)
        self._check_present()

    def _check_present(self) -> None:
        names = set(self.ckpt.tensor_names())
        wanted = list(self.spec.trunk.values())
        for experts in self.spec.experts.values():
            for parts in experts:
                wanted.extend(parts.values())
        missing = [n for n in wanted if _view(n)[0] not in names and not self.compressed.present(_view(n)[0])]
        if missing:
            more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
            raise SourceError(self.path, f"the checkpoint has no tensor '{_view(missing[0])[0]}'{more}")

    def shape(self, name: str) -> tuple[int, ...]:
        base, view = _view(name)
        if self.compressed.kind(base):
            shape = self.compressed.shape(base)
        else:
            shape = tuple(self.ckpt.info(base).shape)
        return _view_shape(shape, view, name)

    def stored_format(self, name: str) -> str:
        base, view = _view(name)
        kind = self.compressed.kind(base)
        if kind:
            return kind
        dtype = self.ckpt.info(base).dtype
        fmt = _SAFETENSORS_DTYPES.get(dtype, dtype)
        if view.startswith("first:") and int(view[6:]) != int(np.prod(self.ckpt.info(base).shape)):
            return fmt + "-slice"  # not byte-identical: read through read_f32
        return fmt

    def read_raw(self, name: str) -> np.ndarray:
        return self.ckpt.read_raw(_view(name)[0])

    def read_f32(self, name: str) -> np.ndarray:
        base, view = _view(name)
        if self.compressed.kind(base):
            values = self.compressed.read_f32(base)
        else:
            values = self.ckpt.read_f32(base)
        if view.startswith("first:"):
            values = values.reshape(-1)[:int(view[6:])]
        return values.reshape(self.shape(name))

    def q3_input(self, name: str) -> tuple | None:
        base, _ = _view(name)
        if self.compressed.kind(base):
            parts = self.compressed.mxfp4_parts(base)
            return None if parts is None else ("mxfp4", *parts)
        return super().q3_input(name)

    def identity(self) -> dict[str, Any]:
        return {"kind": "hf", "files": _stat_identity([self.path / "config.json", *self.ckpt.shards])}

    def total_bytes(self) -> int:
        return int(self.ckpt.total_bytes)


def _view(name: str) -> tuple[str, str]:
    base, _, view = name.partition("@")
    return base, view


def _view_shape(shape: tuple[int, ...], view: str, name: str) -> tuple[int, ...]:
    if not view:
        return shape
    n = int(np.prod(shape)) if shape else 1
    if view == "flat":
        return (n,)
    if view == "2d":
        return (int(shape[0]), n // int(shape[0])) if shape else (1, 1)
    if view == "rows":   # every dimension but the last as rows (a [H, W, D] table as [H * W, D])
        return (n // int(shape[-1]), int(shape[-1])) if shape else (1, 1)
    if view.startswith("first:"):
        k = int(view[6:])
        if k > n:
            raise SourceError(name, f"has {n} values, fewer than the {k} needed")
        return (k,)
    raise SourceError(name, f"unknown tensor view '{view}'")


class GGUFSource(Source):
    """A GGUF file. Stacked expert tensors are addressed as ``name#expert``."""

    kind = "gguf"

    def __init__(self, path: Path):
        self.path = path
        self.gguf = GGUFFile(path)
        self.config = {k: v for k, v in self.gguf.metadata.items() if not k.startswith("tokenizer.ggml.")}
        self.spec = spec_from_gguf(self.gguf.metadata, set(self.gguf.tensors), path.name)
        self._check_present()

    def _check_present(self) -> None:
        wanted = list(self.spec.trunk.values())
        for experts in self.spec.experts.values():
            wanted.extend(parts[p].split("#")[0] for parts in experts[:1] for p in parts)
        for name in wanted:
            if name not in self.gguf.tensors:
                raise SourceError(self.path, f"the GGUF file has no tensor '{name}'")

    def _split(self, name: str) -> tuple[Any, int | None]:
        base, _, expert = name.partition("#")
        return self.gguf.tensors[base], (int(expert) if expert else None)

    def shape(self, name: str) -> tuple[int, ...]:
        info, expert = self._split(name)
        dims = tuple(int(d) for d in reversed(info.dims))
        return dims[1:] if expert is not None else dims

    def stored_format(self, name: str) -> str:
        info, _ = self._split(name)
        lower = info.type_name.lower()
        return lower if lower in CORE_FORMATS else info.type_name

    def read_raw(self, name: str) -> np.ndarray:
        info, expert = self._split(name)
        if expert is None:
            return self.gguf.read_raw(info.name)
        return self.gguf.read_slice(info.name, expert)  # that expert's bytes only, not the whole stack

    def read_f32(self, name: str) -> np.ndarray:
        info, expert = self._split(name)
        shape = self.shape(name)
        n = int(np.prod(shape))
        return quant.dequantize(self.read_raw(name), info.type_name, n).reshape(shape)

    def identity(self) -> dict[str, Any]:
        return {"kind": "gguf", "files": _stat_identity([self.path])}

    def total_bytes(self) -> int:
        return self.path.stat().st_size


def open_source(path: str | os.PathLike) -> Source:
    """A Hugging Face checkpoint directory or a GGUF file; refuses anything else clearly."""
    p = Path(path)
    if not p.exists():
        raise SourceError(p, "does not exist")
    if p.is_dir():
        if not (p / "config.json").exists():
            raise SourceError(p, "is a folder without config.json: not a Hugging Face checkpoint")
        return HFSource(p)
    with open(p, "rb") as f:
        magic = f.read(4)
    if magic == b"GGUF":
        return GGUFSource(p)
    raise SourceError(p, "is neither a checkpoint folder nor a GGUF file")
