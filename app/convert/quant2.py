"""q2_vq, Ferry's 2-bit expert format, through the C core: the quantizer
(ferry_q2_quantize_f32) and the decoder (ferry_dequantize), one definition
of the format in core_c/src/formats.h.

A block of 256 values takes 73 bytes (2.28125 bits per value): per 8 values
a u16 word (a 9-bit index into the frozen 512-entry codebook of magnitudes,
7 sign bits, the eighth sign by even parity), then a u8 exponent code and
sixteen 4-bit log scale codes, one per 16 values. See docs/FORMAT.md and
docs/QUANTIZATION.md ("Two-bit experts": why this format, its error).
"""
from __future__ import annotations

import numpy as np

from app.convert.quant3 import _lib, quantize_rows
from app.engine.binding import FORMATS

NAME = "q2_vq"
#: Values and bytes per block, from the core's format table (256 and 73).
BLOCK, BLOCK_BYTES = FORMATS[NAME].block_elems, FORMATS[NAME].block_bytes


_QUANTIZER: list = []  # the core's search tables, made once per process (read only, shared by threads)


def _quantizer():
    """The core's q2_vq search tables (ferry_q2_quantizer_new: ~1.2 MB, a few ms),
    made on first use and kept: every call after the first skips making them."""
    if not _QUANTIZER:
        ffi, lib = _lib()
        q = lib.ferry_q2_quantizer_new()
        if q == ffi.NULL:
            raise MemoryError("not enough memory for the q2_vq quantizer's tables")
        _QUANTIZER.append(ffi.gc(q, lib.ferry_q2_quantizer_free))
    return _QUANTIZER[0]


def quantize(values: np.ndarray, importance: np.ndarray | None = None, threads: int | None = None,
             out: np.ndarray | None = None) -> np.ndarray:
    """float32 [..., cols] -> q2_vq bytes (uint8, flat; into ``out`` if given).
    ``importance``: None or ``cols`` non-negative weights per input column.
    The bytes do not depend on ``threads`` (blocks are quantized independently)."""
    _, lib = _lib()
    tables = _quantizer()
    return quantize_rows(NAME, BLOCK, BLOCK_BYTES, lambda *a: lib.ferry_q2_quantize_with(tables, *a), values,
                         importance, threads, out)


def dequantize(raw: np.ndarray, n_elements: int) -> np.ndarray:
    """q2_vq bytes of ``n_elements`` values -> flat float32 (the core's decoder)."""
    ffi, lib = _lib()
    data = np.ascontiguousarray(raw, dtype=np.uint8).reshape(-1)
    if n_elements % BLOCK or data.size != n_elements // BLOCK * BLOCK_BYTES:
        raise ValueError(f"{n_elements} q2_vq values need {n_elements // BLOCK * BLOCK_BYTES} bytes, got {data.size}")
    out = np.empty(n_elements, dtype=np.float32)
    if n_elements:
        rc = lib.ferry_dequantize(lib.ferry_format_code(NAME.encode()), ffi.from_buffer(data), n_elements // BLOCK,
                                  BLOCK, ffi.from_buffer("float[]", out))
        if rc != 0:
            raise ValueError("cannot decode q2_vq")
    return out
