"""Reader for untrusted GGUF (v2/v3) files.

Layout (all little-endian): magic ``GGUF``, u32 version, u64 tensor count,
u64 key/value count, the key/value pairs, the tensor infos, padding up to the
alignment, then the data section. Every count, length and range is checked
against fixed limits and the file size before anything is allocated.
"""

from __future__ import annotations

import math
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from app.convert import quant
from app.convert.errors import SourceError, TensorFile, read_file_range

MAX_TENSORS = 1_000_000
MAX_KV = 1_000_000
MAX_STRING_BYTES = 64 * 1024 * 1024
MAX_ARRAY_ELEMENTS = 2**28  # for each array and for all arrays together
MAX_ARRAY_NESTING = 8
MAX_DIMS = 8
MAX_DIM = 2**40
#: Most values one tensor may hold (Kimi K3's largest stacked expert tensor has ~2^34).
MAX_ELEMENTS = 2**48
MAX_ALIGNMENT = 2**30
DEFAULT_ALIGNMENT = 32
SUPPORTED_VERSIONS = (2, 3)

STRING_TYPE = 8
ARRAY_TYPE = 9
#: GGUF value type id -> numpy dtype of its fixed-size scalar.
SCALAR_TYPES: dict[int, np.dtype] = {
    0: np.dtype("u1"),
    1: np.dtype("i1"),
    2: np.dtype("<u2"),
    3: np.dtype("<i2"),
    4: np.dtype("<u4"),
    5: np.dtype("<i4"),
    6: np.dtype("<f4"),
    7: np.dtype("u1"),  # bool
    10: np.dtype("<u8"),
    11: np.dtype("<i8"),
    12: np.dtype("<f8"),
}
BOOL_TYPE = 7
#: The same scalars for struct (one number at a time: much faster than numpy).
_STRUCTS: dict[int, struct.Struct] = {t: struct.Struct("<" + c) for t, c in
                                      zip((0, 1, 2, 3, 4, 5, 6, 7, 10, 11, 12), "BbHhIifBQqd")}
_U64 = _STRUCTS[10]


@dataclass(frozen=True)
class GGUFTensorInfo:
    """One tensor of a GGUF file. ``dims`` is ggml order: ne0 (row length) first."""

    name: str
    ggml_type: int
    type_name: str
    dims: tuple[int, ...]
    n_elements: int
    offset: int
    nbytes: int

    @property
    def shape(self) -> tuple[int, ...]:
        """Row-major (numpy) shape: ``dims`` reversed."""
        return tuple(reversed(self.dims))


class _Cursor:
    """Sequential reads from the file header that never pass the end of the file."""

    def __init__(self, path: Path, f: BinaryIO, size: int) -> None:
        self.path = path
        self.f = f
        self.size = size
        self.pos = 0
        self.array_elements = 0

    def error(self, problem: str) -> SourceError:
        """A SourceError for this file."""
        return SourceError(self.path, problem)

    def take(self, n: int, what: str) -> bytes:
        """The next ``n`` bytes; SourceError if the file ends first."""
        if n > self.size - self.pos:
            raise self.error(
                f"file ends at byte {self.size} while reading {what} "
                f"({n} bytes needed at byte {self.pos})"
            )
        data = self.f.read(n)
        if len(data) != n:
            raise self.error(f"file shrank while reading {what} at byte {self.pos}")
        self.pos += n
        return data

    def scalar(self, value_type: int, what: str) -> Any:
        """One little-endian number of GGUF type ``value_type`` as a Python int or float."""
        st = _STRUCTS[value_type]
        return st.unpack(self.take(st.size, what))[0]

    def u32(self, what: str) -> int:
        return self.scalar(4, what)

    def u64(self, what: str) -> int:
        return self.scalar(10, what)

    def string(self, what: str) -> str:
        """A u64-length-prefixed UTF-8 string of at most MAX_STRING_BYTES."""
        return self.strings(1, what)[0]

    def strings(self, count: int, what: str) -> list[str]:
        """``count`` strings one after the other (a vocabulary: hundreds of
        thousands, so the loop does only what each string needs; the checks
        are string()'s)."""
        out = []
        read, unpack, size = self.f.read, _U64.unpack, self.size
        for _ in range(count):
            head = read(8) if size - self.pos >= 8 else self.take(8, f"length of {what}")  # (take raises)
            if len(head) != 8:
                raise self.error(f"file shrank while reading length of {what} at byte {self.pos}")
            self.pos += 8
            (length,) = unpack(head)
            if length > MAX_STRING_BYTES:
                raise self.error(f"{what} claims {length} bytes (max {MAX_STRING_BYTES})")
            data = read(length) if size - self.pos >= length else self.take(length, what)
            if len(data) != length:
                raise self.error(f"file shrank while reading {what} at byte {self.pos}")
            self.pos += length
            try:
                out.append(data.decode("utf-8"))
            except UnicodeDecodeError as exc:
                raise self.error(f"{what} is not valid UTF-8 (byte {exc.start})") from None
        return out


def _read_value(cur: _Cursor, value_type: int, what: str, depth: int = 0) -> Any:
    """One metadata value of ``value_type``; arrays become (nested) lists."""
    if value_type == STRING_TYPE:
        return cur.string(what)
    if value_type == ARRAY_TYPE:
        return _read_array(cur, what, depth + 1)
    if value_type not in SCALAR_TYPES:
        raise cur.error(f"{what} has unknown value type {value_type}")
    value = cur.scalar(value_type, what)
    return bool(value) if value_type == BOOL_TYPE else value


def _read_array(cur: _Cursor, what: str, depth: int) -> list[Any]:
    """An array value: u32 element type, u64 count, the elements."""
    if depth > MAX_ARRAY_NESTING:
        raise cur.error(f"{what} nests arrays more than {MAX_ARRAY_NESTING} deep")
    elem_type = cur.u32(f"element type of {what}")
    count = cur.u64(f"element count of {what}")
    cur.array_elements += count
    if cur.array_elements > MAX_ARRAY_ELEMENTS:
        raise cur.error(
            f"{what} claims {count} elements; all arrays together may hold "
            f"at most {MAX_ARRAY_ELEMENTS}"
        )
    dtype = SCALAR_TYPES.get(elem_type)
    if dtype is not None:
        values = np.frombuffer(cur.take(count * dtype.itemsize, what), dtype)
        return (values != 0).tolist() if elem_type == BOOL_TYPE else values.tolist()
    if elem_type not in (STRING_TYPE, ARRAY_TYPE):
        raise cur.error(f"{what} has unknown element type {elem_type}")
    min_bytes = 8 if elem_type == STRING_TYPE else 12
    if count * min_bytes > cur.size - cur.pos:
        raise cur.error(f"{what} claims {count} elements but the file is too short for them")
    if elem_type == STRING_TYPE:
        return cur.strings(count, what)
    return [_read_value(cur, elem_type, what, depth) for _ in range(count)]


def _read_tensor_info(cur: _Cursor, index: int) -> tuple[str, int, tuple[int, ...], int]:
    """Name, ggml type id, dims and relative offset of tensor ``index``."""
    name = cur.string(f"name of tensor #{index}")
    n_dims = cur.u32(f"dimension count of tensor {name!r}")
    if n_dims > MAX_DIMS:
        raise cur.error(f"tensor {name!r} has {n_dims} dimensions (max {MAX_DIMS})")
    dims = tuple(cur.u64(f"dimensions of tensor {name!r}") for _ in range(n_dims))
    for dim in dims:
        if dim > MAX_DIM:
            raise cur.error(f"tensor {name!r} has dimension {dim} (max 2^40)")
    # An empty tensor (a dimension of 0) is allowed, but its other dimensions must still make a
    # shape numpy can hold: their product is bounded like a real tensor's (a tensor with no 0 is
    # bounded by its bytes in the file instead).
    if 0 in dims and math.prod(d for d in dims if d) > MAX_ELEMENTS:
        raise cur.error(f"tensor {name!r} has dimensions {list(dims)}: more than 2^48 values")
    ggml_type = cur.u32(f"type of tensor {name!r}")
    offset = cur.u64(f"offset of tensor {name!r}")
    return name, ggml_type, dims, offset


def _alignment(path: Path, metadata: dict[str, Any]) -> int:
    """``general.alignment`` (a power of two), or 32 if absent."""
    value = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
    if (
        not isinstance(value, int)
        or isinstance(value, bool)
        or not 0 < value <= MAX_ALIGNMENT
        or value & (value - 1)
    ):
        raise SourceError(path, f"general.alignment {value!r} is not a power of two")
    return value


class GGUFFile(TensorFile[GGUFTensorInfo]):
    """A validated GGUF file; tensor data is read lazily, one tensor at a time."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.version = 0
        self.metadata: dict[str, Any] = {}
        self.tensors: dict[str, GGUFTensorInfo] = {}
        self.data_offset = 0
        try:
            size = self.path.stat().st_size
            with open(self.path, "rb", buffering=1 << 20) as f:
                self._parse(_Cursor(self.path, f, size))
        except OSError as exc:
            raise SourceError(self.path, f"cannot read file: {exc.strerror or exc}") from None

    def _parse(self, cur: _Cursor) -> None:
        """Read the header, metadata and tensor infos, then place the tensors."""
        if cur.size < 4 or cur.take(4, "magic") != b"GGUF":
            raise cur.error("not a GGUF file (missing 'GGUF' magic)")
        self.version = cur.u32("version")
        if self.version not in SUPPORTED_VERSIONS:
            raise cur.error(f"GGUF version {self.version} is not supported (only 2 and 3)")
        n_tensors = cur.u64("tensor count")
        n_kv = cur.u64("metadata count")
        if n_tensors > MAX_TENSORS:
            raise cur.error(f"header claims {n_tensors} tensors (max {MAX_TENSORS})")
        if n_kv > MAX_KV:
            raise cur.error(f"header claims {n_kv} metadata entries (max {MAX_KV})")
        for index in range(n_kv):
            self._read_kv(cur, index)
        raw_infos = [_read_tensor_info(cur, i) for i in range(n_tensors)]
        alignment = _alignment(self.path, self.metadata)
        self.data_offset = -(-cur.pos // alignment) * alignment
        for name, ggml_type, dims, offset in raw_infos:
            self._add_tensor(cur.size, alignment, name, ggml_type, dims, offset)
        self._reject_overlaps()

    def _read_kv(self, cur: _Cursor, index: int) -> None:
        """One metadata key and its typed value."""
        key = cur.string(f"key of metadata entry #{index}")
        if not key:
            raise cur.error(f"key of metadata entry #{index} is empty")
        if key in self.metadata:
            raise cur.error(f"metadata key {key!r} appears twice")
        value_type = cur.u32(f"value type of {key!r}")
        self.metadata[key] = _read_value(cur, value_type, f"metadata value {key!r}")

    def _add_tensor(
        self,
        size: int,
        alignment: int,
        name: str,
        ggml_type: int,
        dims: tuple[int, ...],
        offset: int,
    ) -> None:
        """Check one tensor's type, size and byte range, and record it."""
        if name in self.tensors:
            raise SourceError(self.path, f"tensor {name!r} appears twice")
        fmt = quant.FORMATS_BY_ID.get(ggml_type)
        if fmt is None:
            raise SourceError(self.path, f"tensor {name!r} has unknown ggml type {ggml_type}")
        n_elements = math.prod(dims)
        row_length = dims[0] if dims else 1
        if row_length % fmt.block_elems:
            raise SourceError(
                self.path,
                f"tensor {name!r} row length {row_length} is not a multiple of the "
                f"{fmt.name} block size {fmt.block_elems}",
            )
        if offset % alignment:
            raise SourceError(
                self.path, f"tensor {name!r} offset {offset} is not a multiple of {alignment}"
            )
        nbytes = fmt.nbytes(n_elements)
        start = self.data_offset + offset
        if start + nbytes > size:
            raise SourceError(
                self.path,
                f"tensor {name!r} ends at byte {start + nbytes} but the file has {size} bytes",
            )
        info = GGUFTensorInfo(name, ggml_type, fmt.name, dims, n_elements, start, nbytes)
        self.tensors[name] = info

    def read_slice(self, name: str, index: int) -> np.ndarray:
        """The stored bytes of slice ``index`` along the outermost dimension (the
        last of ``dims``), e.g. one expert of a stacked ``[experts, rows, cols]``
        tensor, as a flat uint8 array: only that slice is read from the file."""
        info = self.info(name)
        count = int(info.dims[-1]) if info.dims else 1
        if not 0 <= index < count:
            raise SourceError(self.path, f"tensor {name!r} has {count} slices, no slice {index}")
        per = info.nbytes // count
        return read_file_range(self.path, info.offset + index * per, per)

    def read_f32(self, name: str) -> np.ndarray:
        """The tensor dequantized to float32, shaped row-major (..., ne1, ne0)."""
        info = self.info(name)
        if not quant.FORMATS[info.type_name].decodable:
            raise SourceError(
                self.path, f"tensor {name!r} has type {info.type_name}, which cannot be decoded"
            )
        values = quant.dequantize(self.read_raw(name), info.type_name, info.n_elements)
        return values.reshape(info.shape)
