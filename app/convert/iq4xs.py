"""iq4_xs (ggml's IQ4_XS, GGUF type 23) through the C core: Ferry's
quantizer (ferry_iq4xs_quantize_f32) and the decoder (ferry_dequantize), one
definition of the format in core_c/src/formats.h.

A block of 256 values takes 136 bytes (4.25 bits per value): an f16 scale d,
a 6-bit code ls per 32 values (sub-block scale d * (ls - 32)) and a 4-bit
index per value into the fixed non-linear levels -127 .. 113. GGUF files in
this format are kept byte for byte. See docs/FORMAT.md and
docs/QUANTIZATION.md (its error against q4_0).
"""
from __future__ import annotations

import numpy as np

from app.convert.quant3 import _lib, quantize_rows
from app.engine.binding import FORMATS

NAME = "iq4_xs"
#: Values and bytes per block, from the core's format table (256 and 136).
BLOCK, BLOCK_BYTES = FORMATS[NAME].block_elems, FORMATS[NAME].block_bytes


def quantize(values: np.ndarray, importance: np.ndarray | None = None, threads: int | None = None,
             out: np.ndarray | None = None) -> np.ndarray:
    """float32 [..., cols] -> iq4_xs bytes (uint8, flat; into ``out`` if given).
    ``importance``: None or ``cols`` non-negative weights per input column.
    The bytes do not depend on ``threads`` (blocks are quantized independently)."""
    _, lib = _lib()
    return quantize_rows(NAME, BLOCK, BLOCK_BYTES, lib.ferry_iq4xs_quantize_f32, values, importance, threads, out)
