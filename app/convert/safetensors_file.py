"""Reader for untrusted safetensors files and Hugging Face checkpoint folders.

A safetensors file is an 8-byte little-endian header length N, N bytes of
UTF-8 JSON describing each tensor (dtype, shape, data_offsets relative to the
end of the header), then the tensor bytes. Everything in the header is checked
before any tensor is read; tensors are read one at a time from disk.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from app import untrusted
from app.convert import quant
from app.convert.errors import SourceError, TensorFile, load_json_file, parse_json, read_file_range

MAX_HEADER_BYTES = 100_000_000
MAX_TENSORS = 1_000_000
MAX_DIMS = 8
MAX_DIM = 2**40

#: safetensors dtype name -> (bytes per element, numpy dtype or None if decoded).
DTYPES: dict[str, tuple[int, str | None]] = {
    "BOOL": (1, None),
    "U8": (1, "u1"),
    "I8": (1, "i1"),
    "F8_E4M3": (1, None),
    "F8_E5M2": (1, None),
    "I16": (2, "<i2"),
    "U16": (2, "<u2"),
    "F16": (2, "<f2"),
    "BF16": (2, None),
    "I32": (4, "<i4"),
    "U32": (4, "<u4"),
    "F32": (4, "<f4"),
    "I64": (8, "<i8"),
    "U64": (8, "<u8"),
    "F64": (8, "<f8"),
}

INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "tiktoken.model",
    "special_tokens_map.json",
    "chat_template.jinja",
    "generation_config.json",
)


@dataclass(frozen=True)
class TensorInfo:
    """Where one tensor lives: ``offset`` is absolute within ``path``."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    offset: int
    nbytes: int
    path: Path

    @property
    def n_elements(self) -> int:
        """Number of values (1 for a scalar)."""
        return math.prod(self.shape)


def _is_int(value: Any) -> bool:
    """True for JSON integers (not booleans)."""
    return isinstance(value, int) and not isinstance(value, bool)


def _check_shape(path: Path, name: str, shape: Any) -> tuple[int, ...]:
    """Validate a tensor's JSON shape list."""
    if not isinstance(shape, list):
        raise SourceError(path, f"tensor {name!r} has a shape that is not a list")
    if len(shape) > MAX_DIMS:
        raise SourceError(path, f"tensor {name!r} has {len(shape)} dimensions (max {MAX_DIMS})")
    for dim in shape:
        if not _is_int(dim) or not 0 <= dim <= MAX_DIM:
            raise SourceError(
                path, f"tensor {name!r} has invalid dimension {dim!r} (must be 0..2^40)"
            )
    return tuple(shape)


def _check_offsets(path: Path, name: str, offsets: Any) -> tuple[int, int]:
    """Validate a tensor's ``data_offsets`` pair."""
    if (
        not isinstance(offsets, list)
        or len(offsets) != 2
        or not all(_is_int(v) for v in offsets)
        or not 0 <= offsets[0] <= offsets[1]
    ):
        raise SourceError(
            path, f"tensor {name!r} has invalid data_offsets {offsets!r} (need [begin, end])"
        )
    return offsets[0], offsets[1]


def _parse_entry(path: Path, name: str, entry: Any, data_start: int, size: int) -> TensorInfo:
    """Validate one header entry and locate its bytes in the file."""
    if not isinstance(entry, dict):
        raise SourceError(path, f"tensor {name!r} entry is not a JSON object")
    for key in ("dtype", "shape", "data_offsets"):
        if key not in entry:
            raise SourceError(path, f"tensor {name!r} has no {key!r}")
    dtype = entry["dtype"]
    if not isinstance(dtype, str) or dtype not in DTYPES:
        raise SourceError(path, f"tensor {name!r} has unknown dtype {dtype!r}")
    shape = _check_shape(path, name, entry["shape"])
    begin, end = _check_offsets(path, name, entry["data_offsets"])
    nbytes = math.prod(shape) * DTYPES[dtype][0]
    if end - begin != nbytes:
        raise SourceError(
            path,
            f"tensor {name!r} of shape {list(shape)} {dtype} needs {nbytes} bytes "
            f"but its data_offsets span {end - begin}",
        )
    if data_start + end > size:
        raise SourceError(
            path, f"tensor {name!r} ends at byte {data_start + end} but the file has {size} bytes"
        )
    return TensorInfo(name, dtype, shape, data_start + begin, nbytes, path)


def _check_metadata(path: Path, metadata: Any) -> dict[str, str]:
    """``__metadata__`` must map strings to strings."""
    if not isinstance(metadata, dict) or not all(
        isinstance(v, str) for v in metadata.values()
    ):
        raise SourceError(path, "__metadata__ must be an object of string values")
    return metadata


class SafetensorsFile(TensorFile[TensorInfo]):
    """A validated safetensors file; tensors are read lazily, one at a time."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.metadata: dict[str, str] = {}
        self.tensors: dict[str, TensorInfo] = {}
        self._parse()

    def _read_header(self, size: int) -> tuple[dict[str, Any], int]:
        """Read and decode the JSON header, checking its declared length."""
        if size < 8:
            raise SourceError(self.path, f"file is only {size} bytes, too short for safetensors")
        length = int(self._range(0, 8).view("<u8")[0])
        if length > MAX_HEADER_BYTES:
            raise SourceError(
                self.path, f"header length {length} exceeds the {MAX_HEADER_BYTES} byte limit"
            )
        if 8 + length > size:
            raise SourceError(
                self.path, f"header length {length} is larger than the file ({size} bytes)"
            )
        header = parse_json(self.path, self._range(8, length).tobytes(), "header")
        if not isinstance(header, dict):
            raise SourceError(self.path, "header is not a JSON object")
        if len(header) > MAX_TENSORS + 1:
            raise SourceError(self.path, f"header lists {len(header)} tensors (max {MAX_TENSORS})")
        return header, 8 + length

    def _size(self) -> int:
        """The file's size (app.get reads a header before the rest is downloaded)."""
        try:
            return self.path.stat().st_size
        except OSError as exc:
            raise SourceError(self.path, f"cannot read file: {exc.strerror or exc}") from None

    def _range(self, offset: int, nbytes: int) -> np.ndarray:
        """Bytes of the header."""
        return read_file_range(self.path, offset, nbytes)

    def _parse(self) -> None:
        """Validate the whole header and fill ``tensors`` and ``metadata``."""
        size = self._size()
        header, data_start = self._read_header(size)
        for name, entry in header.items():
            if name == "__metadata__":
                self.metadata = _check_metadata(self.path, entry)
            else:
                self.tensors[name] = _parse_entry(self.path, name, entry, data_start, size)
        self._reject_overlaps()

    def read_array(self, name: str) -> np.ndarray:
        """The tensor with its shape, in its own dtype.

        BF16, F8_E4M3 and F8_E5M2 are decoded exactly to float32; BOOL gives
        numpy bool (any non-zero byte is True).
        """
        info = self.info(name)
        raw = self.read_raw(name)
        numpy_dtype = DTYPES[info.dtype][1]
        if numpy_dtype is not None:
            values = raw.view(numpy_dtype)
        elif info.dtype == "BF16":
            values = quant.bf16_bits_to_f32(raw.view("<u2"))
        elif info.dtype == "F8_E4M3":
            values = quant.f8_e4m3_to_f32(raw)
        elif info.dtype == "F8_E5M2":
            values = quant.f8_e5m2_to_f32(raw)
        else:
            values = raw != 0
        return values.reshape(info.shape)

    def read_f32(self, name: str) -> np.ndarray:
        """The tensor with its shape, converted to float32 (F64 beyond range -> inf)."""
        values = self.read_array(name)
        with np.errstate(over="ignore"):
            return values.astype(np.float32, copy=False)


def _shard_name_ok(name: Any) -> bool:
    """An index may only name plain files inside the checkpoint folder: a
    name app.untrusted.check_name accepts, of one component."""
    try:
        untrusted.check_name(name, INDEX_NAME)
    except untrusted.UnsafeName:
        return False
    return "/" not in name and name != "."


class _Scan:
    """Everything learned about a checkpoint folder, with all problems found."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.problems: list[SourceError] = []
        self.config: dict[str, Any] = {}
        self.files: dict[Path, SafetensorsFile] = {}
        self.where: dict[str, Path] = {}
        if not directory.is_dir():
            self.problems.append(SourceError(directory, "is not a folder"))
            return
        self._load_config()
        if (directory / INDEX_NAME).exists():
            self._load_indexed()
        elif (directory / SINGLE_NAME).exists():
            self._load_unindexed([directory / SINGLE_NAME])
        else:
            self._load_unindexed(sorted(p for p in directory.glob("*.safetensors") if p.is_file()))

    def _record(self, action: Any, *args: Any) -> Any:
        """Run ``action``; on SourceError remember it and return None."""
        try:
            return action(*args)
        except SourceError as exc:
            self.problems.append(exc)
            return None

    def _load_config(self) -> None:
        from app.convert.config_check import load_config   # config_check reads through app.convert.errors

        path = self.directory / "config.json"
        if not path.is_file():
            self.problems.append(SourceError(path, "is missing (every checkpoint needs one)"))
            return
        config = self._record(load_config, path)
        if config is not None:
            self.config = config

    def _present(self, path: Path) -> bool:
        """Whether a shard named by the index can be opened."""
        return path.is_file()

    def _open_shard(self, path: Path) -> SafetensorsFile | None:
        if path not in self.files:
            shard = self._record(SafetensorsFile, path)
            if shard is None:
                return None
            self.files[path] = shard
        return self.files[path]

    def _weight_map(self, index_path: Path) -> dict[str, str]:
        index = load_json_file(index_path)
        weight_map = index.get("weight_map") if isinstance(index, dict) else None
        if not isinstance(weight_map, dict) or not weight_map:
            raise SourceError(index_path, "has no non-empty 'weight_map' object")
        for tensor, shard in weight_map.items():
            if not _shard_name_ok(shard):
                raise SourceError(
                    index_path, f"tensor {untrusted.shown(repr(tensor))[:200]} names an invalid shard file "
                                f"{untrusted.shown(repr(shard))[:200]}"
                )
        return weight_map

    def _load_indexed(self) -> None:
        index_path = self.directory / INDEX_NAME
        weight_map = self._record(self._weight_map, index_path)
        if weight_map is None:
            return
        for shard_name in dict.fromkeys(weight_map.values()):
            path = self.directory / shard_name
            if not self._present(path):
                self.problems.append(SourceError(path, f"shard listed in {INDEX_NAME} is missing"))
            else:
                self._open_shard(path)
        for tensor, shard_name in weight_map.items():
            shard = self.files.get(self.directory / shard_name)
            if shard is None:
                continue
            if tensor not in shard.tensors:
                problem = f"{INDEX_NAME} says it holds tensor {tensor!r} but it does not"
                self.problems.append(SourceError(shard.path, problem))
            else:
                self.where[tensor] = shard.path

    def _load_unindexed(self, paths: list[Path]) -> None:
        if not paths:
            self.problems.append(SourceError(self.directory, "contains no .safetensors files"))
            return
        for path in paths:
            shard = self._open_shard(path)
            for tensor in shard.tensors if shard else ():
                if tensor in self.where:
                    self.problems.append(
                        SourceError(path, f"tensor {tensor!r} is also in {self.where[tensor].name}")
                    )
                else:
                    self.where[tensor] = path


class Checkpoint:
    """A Hugging Face checkpoint folder: config.json plus safetensors shards.

    Accepts ``model.safetensors.index.json`` with its shards, a single
    ``model.safetensors``, or several ``*.safetensors`` with no index. The
    constructor raises the first problem found; :meth:`validate` lists all.
    """

    def __init__(self, directory: str | os.PathLike[str], scan: _Scan | None = None) -> None:
        scan = scan or _Scan(Path(directory))
        if scan.problems:
            raise scan.problems[0]
        self.directory = scan.directory
        self.config: dict[str, Any] = scan.config
        self.shards: list[Path] = list(scan.files)
        self._files = scan.files
        self._where = scan.where

    @staticmethod
    def validate(directory: str | os.PathLike[str]) -> list[SourceError]:
        """Every problem found in the folder (empty if it can be converted)."""
        return _Scan(Path(directory)).problems

    def tensor_names(self) -> list[str]:
        """All tensor names, in index (or shard) order."""
        return list(self._where)

    def _file_of(self, name: str) -> SafetensorsFile:
        try:
            return self._files[self._where[name]]
        except KeyError:
            raise SourceError(self.directory, f"checkpoint has no tensor named {name!r}") from None

    def info(self, name: str) -> TensorInfo:
        """Where tensor ``name`` is stored."""
        return self._file_of(name).info(name)

    def read_raw(self, name: str) -> np.ndarray:
        """Tensor ``name``'s exact bytes (uint8)."""
        return self._file_of(name).read_raw(name)

    def read_f32(self, name: str) -> np.ndarray:
        """Tensor ``name`` as float32 with its shape."""
        return self._file_of(name).read_f32(name)

    @property
    def total_bytes(self) -> int:
        """Sum of the stored sizes of all tensors."""
        return sum(self.info(name).nbytes for name in self._where)

    def tokenizer_files(self) -> dict[str, Path]:
        """The tokenizer/chat-template files present, by file name."""
        return {
            name: self.directory / name
            for name in TOKENIZER_FILES
            if (self.directory / name).is_file()
        }
