"""Numeric storage formats: ggml block formats, bf16/f16/f8 helpers.

The block layouts follow ggml's public definitions (see docs/SOURCE_FORMATS.md).
All multi-byte fields are little-endian. Decoders are vectorised with numpy and
compute in float32 in the same operation order as ggml's scalar reference code,
so results are bit-identical to it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

F16 = np.dtype("<f2")
F32 = np.dtype("<f4")


@dataclass(frozen=True)
class BlockFormat:
    """One ggml tensor storage type: ``block_elems`` values take ``block_bytes``."""

    name: str
    type_id: int
    block_elems: int
    block_bytes: int

    @property
    def decodable(self) -> bool:
        """Whether :func:`dequantize` supports this format."""
        return self.name in _DECODERS

    def nbytes(self, n_elements: int) -> int:
        """Bytes used by ``n_elements`` values (must be a multiple of the block)."""
        if n_elements % self.block_elems:
            raise ValueError(
                f"{self.name} needs a multiple of {self.block_elems} elements, "
                f"got {n_elements}"
            )
        return n_elements // self.block_elems * self.block_bytes


_FORMAT_LIST = [
    BlockFormat("F32", 0, 1, 4),
    BlockFormat("F16", 1, 1, 2),
    BlockFormat("Q4_0", 2, 32, 18),
    BlockFormat("Q4_1", 3, 32, 20),
    BlockFormat("Q5_0", 6, 32, 22),
    BlockFormat("Q5_1", 7, 32, 24),
    BlockFormat("Q8_0", 8, 32, 34),
    BlockFormat("Q2_K", 10, 256, 84),
    BlockFormat("Q3_K", 11, 256, 110),
    BlockFormat("Q4_K", 12, 256, 144),
    BlockFormat("Q5_K", 13, 256, 176),
    BlockFormat("Q6_K", 14, 256, 210),
    BlockFormat("Q8_K", 15, 256, 292),
    BlockFormat("IQ2_XXS", 16, 256, 66),
    BlockFormat("IQ2_XS", 17, 256, 74),
    BlockFormat("IQ3_XXS", 18, 256, 98),
    BlockFormat("IQ1_S", 19, 256, 50),
    BlockFormat("IQ4_NL", 20, 32, 18),
    BlockFormat("IQ3_S", 21, 256, 110),
    BlockFormat("IQ2_S", 22, 256, 82),
    BlockFormat("IQ4_XS", 23, 256, 136),
    BlockFormat("I8", 24, 1, 1),
    BlockFormat("I16", 25, 1, 2),
    BlockFormat("I32", 26, 1, 4),
    BlockFormat("I64", 27, 1, 8),
    BlockFormat("F64", 28, 1, 8),
    BlockFormat("IQ1_M", 29, 256, 56),
    BlockFormat("BF16", 30, 1, 2),
    BlockFormat("TQ1_0", 34, 256, 54),
    BlockFormat("TQ2_0", 35, 256, 66),
    BlockFormat("MXFP4", 39, 32, 17),
]

#: Every known ggml storage type by name; only some are decodable.
FORMATS: dict[str, BlockFormat] = {f.name: f for f in _FORMAT_LIST}
#: The same table keyed by ggml type id (as stored in GGUF tensor infos).
FORMATS_BY_ID: dict[int, BlockFormat] = {f.type_id: f for f in _FORMAT_LIST}

#: Types :func:`quantize` can produce (the container's own group formats).
QUANTIZABLE = ("Q8_0", "Q4_0", "Q4_1")


# --------------------------------------------------------------------------
# Scalar helpers


def f16_bits_to_f32(bits: np.ndarray) -> np.ndarray:
    """Widen IEEE half-precision bit patterns (uint16) to float32, exactly."""
    return np.ascontiguousarray(bits, dtype="<u2").view(F16).astype(np.float32)


def f32_to_f16_bits(x: np.ndarray) -> np.ndarray:
    """Round float32 to IEEE half (nearest-even, overflow to inf) as uint16 bits."""
    with np.errstate(over="ignore"):
        return np.asarray(x, dtype=np.float32).astype(F16).view("<u2")


def bf16_bits_to_f32(bits: np.ndarray) -> np.ndarray:
    """Widen bfloat16 bit patterns (uint16) to float32, exactly."""
    wide = np.asarray(bits, dtype=np.uint16).astype(np.uint32) << np.uint32(16)
    return wide.view(np.float32)


def f32_to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """Round float32 to bfloat16 bits: nearest-even; NaN stays NaN (made quiet)."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = (u + (np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1)))) >> np.uint32(16)
    is_nan = (u & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
    quiet_nan = (u >> np.uint32(16)) | np.uint32(0x0040)
    return np.where(is_nan, quiet_nan, rounded).astype(np.uint16)


def _e4m3fn_table() -> np.ndarray:
    """All 256 OCP float8 e4m3fn values: bias 7, no infinities, S.1111.111 NaN."""
    codes = np.arange(256, dtype=np.uint32)
    sign = np.where(codes & 0x80, -1.0, 1.0)
    exp = (codes >> 3) & 0xF
    man = (codes & 0x7).astype(np.float64)
    normal = (1.0 + man / 8.0) * np.exp2(exp.astype(np.float64) - 7.0)
    subnormal = man / 8.0 * 2.0**-6
    values = sign * np.where(exp == 0, subnormal, normal)
    values[(codes & 0x7F) == 0x7F] = np.nan
    return values.astype(np.float32)


_E4M3FN = _e4m3fn_table()


def f8_e4m3_to_f32(raw: np.ndarray) -> np.ndarray:
    """Decode float8 e4m3fn bytes to float32, exactly (0x7F/0xFF are NaN)."""
    return _E4M3FN[np.asarray(raw, dtype=np.uint8)]


def f8_e5m2_to_f32(raw: np.ndarray) -> np.ndarray:
    """Decode float8 e5m2 bytes (the top byte of an IEEE half) to float32."""
    bits = np.asarray(raw, dtype=np.uint8).astype(np.uint16) << np.uint16(8)
    return f16_bits_to_f32(bits)


def _round_half_away(v: np.ndarray) -> np.ndarray:
    """C ``roundf``: round to nearest, ties away from zero (exact in float32)."""
    t = np.trunc(v)
    return t + np.sign(v) * (np.abs(v - t) >= 0.5)


# --------------------------------------------------------------------------
# Block decoders: each takes an (n_blocks, block_bytes) uint8 array and
# returns (n_blocks, block_elems) float32.


def _f16_field(blocks: np.ndarray, start: int) -> np.ndarray:
    """The f16 at byte ``start`` of every block, as an (n, 1) float32 column."""
    return np.ascontiguousarray(blocks[:, start : start + 2]).view(F16).astype(np.float32)


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """Split (..., k) bytes into (..., 2k) values: k low nibbles, then k high."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=-1)


def _decode_q4_0(blocks: np.ndarray) -> np.ndarray:
    d = _f16_field(blocks, 0)
    q = _nibbles(blocks[:, 2:18]).astype(np.int8) - np.int8(8)
    return q * d


#: IQ4_XS's (and IQ4_NL's) fixed non-linear levels.
IQ4_LEVELS = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], dtype=np.int8)


def _decode_iq4_xs(blocks: np.ndarray) -> np.ndarray:
    """IQ4_XS: f16 d, u16 high scale bits, 4 bytes of low scale bits, 128
    bytes of indices; sub-block j of 32 has scale d * (ls_j - 32) with the
    6-bit ls_j, values 0-15 in its 16 bytes' low nibbles, 16-31 in the high
    ones. Each value d * (ls - 32) * level is exact in float32."""
    d = _f16_field(blocks, 0)
    hi = blocks[:, 2].astype(np.uint16) | (blocks[:, 3].astype(np.uint16) << np.uint16(8))
    j = np.arange(8)
    low = (blocks[:, 4 + j // 2] >> (4 * (j % 2)).astype(np.uint8)) & 15
    ls = low.astype(np.int32) | (((hi[:, None] >> (2 * j).astype(np.uint16)) & 3).astype(np.int32) << 4)
    scale = d * (ls - 32).astype(np.float32)                        # (n, 8)
    q = _nibbles(blocks[:, 8:].reshape(-1, 8, 16))                  # (n, 8, 32)
    return (scale[:, :, None] * IQ4_LEVELS[q].astype(np.float32)).reshape(-1, 256)


def _decode_q4_1(blocks: np.ndarray) -> np.ndarray:
    d, m = _f16_field(blocks, 0), _f16_field(blocks, 2)
    return _nibbles(blocks[:, 4:20]) * d + m


def _q5_values(qh_bytes: np.ndarray, qs: np.ndarray) -> np.ndarray:
    """5-bit values of a Q5_0/Q5_1 block: nibbles plus bit j of the u32 ``qh``."""
    qh = np.ascontiguousarray(qh_bytes).view("<u4")
    high = (qh >> np.arange(32, dtype=np.uint32)) & np.uint32(1)
    return _nibbles(qs) | (high.astype(np.uint8) << 4)


def _decode_q5_0(blocks: np.ndarray) -> np.ndarray:
    d = _f16_field(blocks, 0)
    q = _q5_values(blocks[:, 2:6], blocks[:, 6:22]).astype(np.int8) - np.int8(16)
    return q * d


def _decode_q5_1(blocks: np.ndarray) -> np.ndarray:
    d, m = _f16_field(blocks, 0), _f16_field(blocks, 2)
    return _q5_values(blocks[:, 4:8], blocks[:, 8:24]) * d + m


def _decode_q8_0(blocks: np.ndarray) -> np.ndarray:
    d = _f16_field(blocks, 0)
    return blocks[:, 2:34].view(np.int8) * d


def _decode_q2_k(blocks: np.ndarray) -> np.ndarray:
    n = blocks.shape[0]
    scales = blocks[:, 0:16]
    d, dmin = _f16_field(blocks, 80), _f16_field(blocks, 82)
    qs = blocks[:, 16:80].reshape(n, 2, 1, 32)
    shifts = np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 1, 4, 1)
    q = ((qs >> shifts) & 3).reshape(n, 16, 16)
    dl = (d * (scales & 0x0F))[:, :, None]
    ml = (dmin * (scales >> 4))[:, :, None]
    return (dl * q - ml).reshape(n, 256)


def _q3_k_scales(packed: np.ndarray) -> np.ndarray:
    """Sixteen signed 6-bit Q3_K scales from 12 packed bytes, as int (-32..31)."""
    n = packed.shape[0]
    low = _nibbles(packed[:, 0:8])
    shifts = np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 4, 1)
    high = ((packed[:, None, 8:12] >> shifts) & 3).reshape(n, 16)
    return (low | (high << 4)).astype(np.int8) - np.int8(32)


def _decode_q3_k(blocks: np.ndarray) -> np.ndarray:
    n = blocks.shape[0]
    hmask = blocks[:, 0:32].reshape(n, 1, 1, 32)
    qs = blocks[:, 32:96].reshape(n, 2, 1, 32)
    scales = _q3_k_scales(blocks[:, 96:108])
    d = _f16_field(blocks, 108)
    shifts = np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 1, 4, 1)
    low = ((qs >> shifts) & 3).astype(np.int8)
    bit = np.arange(8, dtype=np.uint8).reshape(1, 2, 4, 1)
    missing_high = (((hmask >> bit) & 1) ^ 1).astype(np.int8) * np.int8(4)
    q = (low - missing_high).reshape(n, 16, 16)
    dl = (d * scales)[:, :, None]
    return (dl * q).reshape(n, 256)


def _k_scales_mins(packed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Eight 6-bit scales and eight 6-bit mins of a Q4_K/Q5_K super-block."""
    s0, s1, s2 = packed[:, 0:4], packed[:, 4:8], packed[:, 8:12]
    scales = np.concatenate([s0 & 63, (s2 & 0x0F) | ((s0 >> 6) << 4)], axis=1)
    mins = np.concatenate([s1 & 63, (s2 >> 4) | ((s1 >> 6) << 4)], axis=1)
    return scales, mins


def _k_nibbles(qs: np.ndarray) -> np.ndarray:
    """Q4_K/Q5_K quants as (n, 8, 32): chunk c of 32 bytes gives sub-blocks 2c, 2c+1."""
    n = qs.shape[0]
    chunks = qs.reshape(n, 4, 1, 32)
    return np.concatenate([chunks & 0x0F, chunks >> 4], axis=2).reshape(n, 8, 32)


def _decode_q4_k(blocks: np.ndarray) -> np.ndarray:
    n = blocks.shape[0]
    d, dmin = _f16_field(blocks, 0), _f16_field(blocks, 2)
    scales, mins = _k_scales_mins(blocks[:, 4:16])
    q = _k_nibbles(blocks[:, 16:144])
    dl = (d * scales)[:, :, None]
    ml = (dmin * mins)[:, :, None]
    return (dl * q - ml).reshape(n, 256)


def _decode_q5_k(blocks: np.ndarray) -> np.ndarray:
    n = blocks.shape[0]
    d, dmin = _f16_field(blocks, 0), _f16_field(blocks, 2)
    scales, mins = _k_scales_mins(blocks[:, 4:16])
    qh = blocks[:, 16:48].reshape(n, 1, 32)
    high = (qh >> np.arange(8, dtype=np.uint8).reshape(1, 8, 1)) & 1
    q = _k_nibbles(blocks[:, 48:176]) | (high << 4)
    dl = (d * scales)[:, :, None]
    ml = (dmin * mins)[:, :, None]
    return (dl * q - ml).reshape(n, 256)


def _decode_q6_k(blocks: np.ndarray) -> np.ndarray:
    n = blocks.shape[0]
    ql = blocks[:, 0:128].reshape(n, 2, 1, 2, 32)
    qh = blocks[:, 128:192].reshape(n, 2, 1, 32)
    scales = blocks[:, 192:208].view(np.int8)
    d = _f16_field(blocks, 208)
    low = np.concatenate([ql & 0x0F, ql >> 4], axis=2).reshape(n, 2, 4, 32)
    shifts = np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 1, 4, 1)
    high = (qh >> shifts) & 3
    q = (low | (high << 4)).astype(np.int8) - np.int8(32)
    dl = (d * scales)[:, :, None]
    return (dl * q.reshape(n, 16, 16)).reshape(n, 256)


def _decode_q8_k(blocks: np.ndarray) -> np.ndarray:
    d = np.ascontiguousarray(blocks[:, 0:4]).view(F32)
    return blocks[:, 4:260].view(np.int8) * d


def _plain(dtype: str) -> Callable[[np.ndarray], np.ndarray]:
    """Decoder for a one-element-per-block type stored as numpy ``dtype``."""

    def decode(blocks: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(blocks).view(dtype).astype(np.float32)

    return decode


def _decode_bf16(blocks: np.ndarray) -> np.ndarray:
    return bf16_bits_to_f32(np.ascontiguousarray(blocks).view("<u2"))


_DECODERS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "F32": _plain("<f4"),
    "F16": _plain("<f2"),
    "BF16": _decode_bf16,
    "F64": _plain("<f8"),
    "I8": _plain("i1"),
    "I16": _plain("<i2"),
    "I32": _plain("<i4"),
    "I64": _plain("<i8"),
    "Q4_0": _decode_q4_0,
    "Q4_1": _decode_q4_1,
    "Q5_0": _decode_q5_0,
    "Q5_1": _decode_q5_1,
    "Q8_0": _decode_q8_0,
    "Q2_K": _decode_q2_k,
    "Q3_K": _decode_q3_k,
    "Q4_K": _decode_q4_k,
    "Q5_K": _decode_q5_k,
    "Q6_K": _decode_q6_k,
    "Q8_K": _decode_q8_k,
    "IQ4_XS": _decode_iq4_xs,
}


def _format(type_name: str) -> BlockFormat:
    """Look up a format by name, with a clear error for unknown names."""
    try:
        return FORMATS[type_name]
    except KeyError:
        raise ValueError(f"unknown tensor type {type_name!r}") from None


def dequantize(raw: np.ndarray, type_name: str, n_elements: int) -> np.ndarray:
    """Decode ``n_elements`` values stored as ``type_name`` into flat float32.

    ``raw`` must hold exactly the bytes of those elements (uint8). Raises
    ValueError for an unknown or undecodable type or a length mismatch.
    """
    if type_name == "Q3_NL":  # Ferry's own 3-bit expert format (app/convert/quant3.py)
        from app.convert import quant3

        return quant3.dequantize(np.asarray(raw), n_elements)
    if type_name == "Q2_VQ":  # Ferry's own 2-bit expert format (app/convert/quant2.py)
        from app.convert import quant2

        return quant2.dequantize(np.asarray(raw), n_elements)
    fmt = _format(type_name)
    decoder = _DECODERS.get(type_name)
    if decoder is None:
        raise ValueError(f"cannot decode tensor type {type_name}")
    data = np.asarray(raw)
    if data.dtype != np.uint8 or data.ndim != 1:
        raise ValueError("raw tensor data must be a 1-D uint8 array")
    expected = fmt.nbytes(n_elements)
    if data.size != expected:
        raise ValueError(
            f"{n_elements} {type_name} elements need {expected} bytes, got {data.size}"
        )
    blocks = data.reshape(-1, fmt.block_bytes)
    with np.errstate(invalid="ignore", over="ignore"):  # inf/NaN scales in hostile files
        values = decoder(blocks)
    return values.astype(np.float32, copy=False).reshape(n_elements)


# --------------------------------------------------------------------------
# Quantizers (ggml reference rounding, block 32)


def _inverse(d: np.ndarray) -> np.ndarray:
    """``1/d`` in float32 where ``d != 0``, else 0 (ggml's ``id``)."""
    return np.divide(np.float32(1), d, out=np.zeros_like(d), where=d != 0)


def _f16_bytes(values: np.ndarray) -> np.ndarray:
    """An (n, 1) float32 column as (n, 2) uint8: little-endian f16 bytes."""
    return np.ascontiguousarray(f32_to_f16_bits(values)).view(np.uint8)


def _pack_nibbles(q: np.ndarray) -> np.ndarray:
    """(n, 32) values 0..15 to (n, 16) bytes: element j low, element j+16 high."""
    return (q[:, :16] | (q[:, 16:] << 4)).astype(np.uint8)


def _quantize_q8_0(blocks: np.ndarray) -> np.ndarray:
    d = np.abs(blocks).max(axis=1, keepdims=True) / np.float32(127)
    q = _round_half_away(blocks * _inverse(d)).astype(np.int8)
    return np.concatenate([_f16_bytes(d), q.view(np.uint8)], axis=1)


def _first(blocks: np.ndarray, index: np.ndarray) -> np.ndarray:
    return np.take_along_axis(blocks, index[:, None], axis=1)


def _quantize_q4_0(blocks: np.ndarray) -> np.ndarray:
    # ggml's loop: the first value of the largest magnitude, +0 for an all-zero block
    mags = np.abs(blocks)
    first_max = np.where(mags.max(axis=1, keepdims=True) > 0, _first(blocks, mags.argmax(axis=1)), np.float32(0))
    d = first_max / np.float32(-8)
    scaled = blocks * _inverse(d) + np.float32(8.5)
    q = np.minimum(np.trunc(scaled), 15).astype(np.uint8)
    return np.concatenate([_f16_bytes(d), _pack_nibbles(q)], axis=1)


def _quantize_q4_1(blocks: np.ndarray) -> np.ndarray:
    # ggml's loop keeps the first of equal extremes (so the sign of a zero is the first zero's)
    lo = _first(blocks, blocks.argmin(axis=1))
    hi = _first(blocks, blocks.argmax(axis=1))
    d = (hi - lo) / np.float32(15)
    scaled = (blocks - lo) * _inverse(d) + np.float32(0.5)
    q = np.minimum(np.trunc(scaled), 15).astype(np.uint8)
    return np.concatenate([_f16_bytes(d), _f16_bytes(lo), _pack_nibbles(q)], axis=1)


_QUANTIZERS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "Q8_0": _quantize_q8_0,
    "Q4_0": _quantize_q4_0,
    "Q4_1": _quantize_q4_1,
}


def _checked_values(x: np.ndarray, type_name: str) -> np.ndarray:
    if type_name not in _QUANTIZERS:
        raise ValueError(f"cannot quantize to {type_name!r}; supported: {QUANTIZABLE}")
    values = np.ascontiguousarray(x, dtype=np.float32).reshape(-1)
    if values.size % 32:
        raise ValueError(f"{type_name} needs a multiple of 32 values, got {values.size}")
    return values


def quantize_reference(x: np.ndarray, type_name: str) -> np.ndarray:
    """`quantize` in numpy: the reference the C quantizer is tested against."""
    values = _checked_values(x, type_name)
    if not np.isfinite(values).all():
        raise ValueError(f"cannot quantize non-finite values to {type_name}")
    return _QUANTIZERS[type_name](values.reshape(-1, 32)).reshape(-1)


def quantize(x: np.ndarray, type_name: str, threads: int | None = None) -> np.ndarray:
    """Quantize float32 values to ``type_name`` (Q8_0, Q4_0 or Q4_1) blocks.

    The values are taken in C order; their count must be a multiple of 32 and
    all must be finite. Returns the flat uint8 block bytes, byte-identical to
    ggml's reference quantizer. Runs in C (`ferry_quantize_blocks`), the
    blocks split over ``threads`` (default one per core); `quantize_reference`
    is the same in numpy.
    """
    from app.convert.quant3 import _lib, _run_rows, default_threads

    values = _checked_values(x, type_name)
    ffi, lib = _lib()
    fmt = lib.ferry_format_code(type_name.lower().encode())
    nb = FORMATS[type_name].block_bytes
    blocks = values.size // 32
    out = np.empty(blocks * nb, dtype=np.uint8)

    def part(b0: int, b1: int) -> None:
        rc = lib.ferry_quantize_blocks(fmt, ffi.from_buffer("float[]", values[b0 * 32:b1 * 32]), (b1 - b0) * 32,
                                       ffi.from_buffer(out[b0 * nb:b1 * nb]))
        if rc != 0:
            raise ValueError(f"cannot quantize non-finite values to {type_name}")

    # at least 64 K values per thread: below that a thread costs more than it saves
    _run_rows(blocks, part, min(threads or default_threads(), max(1, blocks // 2048)))
    return out
