"""Decoders for the quantized source formats of the Kimi / DeepSeek releases.

A quantized weight ``X.weight`` appears in a checkpoint as companions of
``X``; these functions find them and give back the float32 values the format
defines (all decoding is exact: every value is a small integer or e2m1 value
times a power of two or a stored float scale, computed in float32).

* compressed-tensors ``mxfp4-pack-quantized`` (Kimi K3 experts):
  ``X.weight_packed`` u8 [out, in/2], element 2j in the low nibble of byte j,
  2j+1 in the high nibble; each nibble is e2m1 (bit 3 the sign, bits 0..2 an
  index into {0, .5, 1, 1.5, 2, 3, 4, 6}); ``X.weight_scale`` u8 [out, in/32]
  is E8M0: the scale is 2^(s - 127) (s = 255 is NaN, as in the OCP MX spec).
* compressed-tensors ``pack-quantized`` int4 (Kimi-K2-Thinking experts):
  ``X.weight_packed`` int32 [out, in/8], element 8j+i in bits 4i..4i+3 of
  word j, stored offset by 8 (value = nibble - 8); ``X.weight_scale``
  (bf16/f16/f32) [out, in/group]; ``X.weight_shape`` [2] gives [out, in].
  Symmetric only (a ``weight_zero_point`` is refused).
* DeepSeek block-scaled fp8: ``X.weight`` F8_E4M3 [out, in] and
  ``X.weight_scale_inv`` f32 [ceil(out/B), ceil(in/B)] (B = 128 from
  ``quantization_config.weight_block_size``): w = fp8 * scale_inv[r//B, c//B].
"""
from __future__ import annotations

from typing import Any

import numpy as np

from app.convert import quant
from app.convert.errors import SourceError

E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0],
                dtype=np.float32)

#: Container-side names of these source formats (none is a core format: they are widened or re-encoded).
MXFP4, INT4_PACK, FP8_BLOCK = "mxfp4", "int4_pack", "fp8_e4m3_block"


def e8m0_to_f32(scale: np.ndarray) -> np.ndarray:
    s = np.asarray(scale).astype(np.int32)
    out = np.ldexp(np.float32(1.0), np.minimum(s, 254) - 127).astype(np.float32)
    out[s == 255] = np.nan
    return out


def decode_mxfp4(packed: np.ndarray, scale: np.ndarray, group: int = 32) -> np.ndarray:
    """[out, in/2] u8 nibbles and [out, in/group] E8M0 scales -> [out, in] float32."""
    packed = np.asarray(packed, dtype=np.uint8)
    rows, half = packed.shape
    cols = half * 2
    if scale.shape != (rows, cols // group) or cols % group:
        raise SourceError("mxfp4", f"scales of shape {tuple(scale.shape)} do not fit weights [{rows}, {cols}]")
    vals = np.empty((rows, cols), dtype=np.float32)
    vals[:, 0::2] = E2M1[packed & 0x0F]
    vals[:, 1::2] = E2M1[packed >> 4]
    return (vals.reshape(rows, cols // group, group) * e8m0_to_f32(scale)[:, :, None]).reshape(rows, cols)


def decode_int4_pack(packed: np.ndarray, scale: np.ndarray, shape: tuple[int, int]) -> np.ndarray:
    """[out, in/8] int32 words and [out, in/group] float scales -> [out, in] float32."""
    words = np.asarray(packed).astype(np.int64) & 0xFFFFFFFF
    rows, n_words = words.shape
    out_rows, cols = int(shape[0]), int(shape[1])
    if out_rows != rows or n_words * 8 < cols:
        raise SourceError("pack-quantized", f"packed [{rows}, {n_words}] does not hold weights {tuple(shape)}")
    q = np.empty((rows, n_words * 8), dtype=np.float32)
    for i in range(8):
        q[:, i::8] = ((words >> (4 * i)) & 0xF).astype(np.float32) - 8.0
    q = q[:, :cols]
    scale = np.asarray(scale, dtype=np.float32)
    if scale.ndim != 2 or scale.shape[0] != rows or cols % scale.shape[1]:
        raise SourceError("pack-quantized", f"scales of shape {tuple(scale.shape)} do not fit weights {tuple(shape)}")
    group = cols // scale.shape[1]
    return (q.reshape(rows, -1, group) * scale[:, :, None]).reshape(rows, cols)


def decode_fp8_block(values: np.ndarray, scale_inv: np.ndarray, block: tuple[int, int] = (128, 128)) -> np.ndarray:
    """fp8 values already widened to float32 [out, in] times per-block scale_inv."""
    rows, cols = values.shape
    br, bc = block
    need = (-(-rows // br), -(-cols // bc))
    if tuple(scale_inv.shape) != need:
        raise SourceError("fp8", f"weight_scale_inv of shape {tuple(scale_inv.shape)} should be {need}")
    s = np.repeat(np.repeat(np.asarray(scale_inv, dtype=np.float32), br, axis=0), bc, axis=1)[:rows, :cols]
    return (values.astype(np.float32) * s).astype(np.float32)


def _array(ckpt, name: str) -> np.ndarray:
    info = ckpt.info(name)
    raw = ckpt.read_raw(name)
    dt = {"U8": "u1", "I8": "i1", "I32": "<i4", "U32": "<u4", "I64": "<i8", "F32": "<f4", "F16": "<f2"}.get(info.dtype)
    if dt:
        return raw.view(dt).reshape(info.shape)
    if info.dtype == "BF16":
        return quant.bf16_bits_to_f32(raw.view("<u2")).reshape(info.shape)
    raise SourceError(name, f"unexpected dtype {info.dtype} for a quantization companion")


class CompressedTensors:
    """Which weights of a checkpoint are stored quantized, and their values."""

    def __init__(self, ckpt, config: dict[str, Any]):
        self.ckpt = ckpt
        self.names = set(ckpt.tensor_names())
        text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
        q = (text or {}).get("quantization_config") or config.get("quantization_config") or {}
        self.block = tuple(q.get("weight_block_size") or (128, 128))
        self.group = 32
        for g in (q.get("config_groups") or {}).values():
            w = (g or {}).get("weights") or {}
            if w.get("group_size"):
                self.group = int(w["group_size"])

    def _base(self, name: str) -> str | None:
        return name[:-len(".weight")] if name.endswith(".weight") else None

    def kind(self, name: str) -> str | None:
        base = self._base(name)
        if base is None:
            return None
        if name not in self.names and base + ".weight_packed" in self.names:
            dtype = self.ckpt.info(base + ".weight_packed").dtype
            if base + ".weight_zero_point" in self.names:
                raise SourceError(name, "asymmetric pack-quantized weights (with a zero point) are not supported")
            if dtype == "U8":
                return MXFP4
            if dtype in ("I32", "U32"):
                return INT4_PACK
            raise SourceError(name, f"weight_packed of dtype {dtype} is not a known packing")
        if name in self.names and base + ".weight_scale_inv" in self.names:
            if self.ckpt.info(name).dtype != "F8_E4M3":
                raise SourceError(name, "weight_scale_inv next to a weight that is not F8_E4M3")
            return FP8_BLOCK
        return None

    def present(self, name: str) -> bool:
        return self.kind(name) is not None

    def shape(self, name: str) -> tuple[int, ...]:
        kind, base = self.kind(name), self._base(name)
        if kind == MXFP4:
            r, h = self.ckpt.info(base + ".weight_packed").shape
            return (int(r), int(h) * 2)
        if kind == INT4_PACK:
            if base + ".weight_shape" in self.names:
                return tuple(int(v) for v in _array(self.ckpt, base + ".weight_shape").reshape(-1))
            r, w = self.ckpt.info(base + ".weight_packed").shape
            return (int(r), int(w) * 8)
        return tuple(self.ckpt.info(name).shape)

    def mxfp4_parts(self, name: str) -> tuple[np.ndarray, np.ndarray] | None:
        """An MXFP4 weight's stored nibbles [out, in/2] and E8M0 scales [out, in/32]
        as they are (the layout the C q3_nl quantizer reads: element 2j in the low
        nibble of byte j, one u8 scale per 32 values), or None for another kind or
        another group size."""
        if self.kind(name) != MXFP4:
            return None
        base = self._base(name)
        if self.ckpt.info(base + ".weight_scale").dtype != "U8":
            return None
        scale = _array(self.ckpt, base + ".weight_scale")
        rows, cols = self.shape(name)
        if scale.ndim != 2 or scale.shape != (rows, cols // 32) or cols % 32:
            return None
        return _array(self.ckpt, base + ".weight_packed"), scale

    def read_f32(self, name: str) -> np.ndarray:
        kind, base = self.kind(name), self._base(name)
        if kind == MXFP4:
            scale = _array(self.ckpt, base + ".weight_scale")
            group = self.shape(name)[1] // scale.shape[1]
            return decode_mxfp4(_array(self.ckpt, base + ".weight_packed"), scale, group)
        if kind == INT4_PACK:
            return decode_int4_pack(_array(self.ckpt, base + ".weight_packed"),
                                    _array(self.ckpt, base + ".weight_scale"), self.shape(name))
        if kind == FP8_BLOCK:
            return decode_fp8_block(self.ckpt.read_f32(name), _array(self.ckpt, base + ".weight_scale_inv"),
                                    self.block)
        raise SourceError(name, "is not a quantized weight")
