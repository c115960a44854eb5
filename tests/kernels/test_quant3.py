"""q3_nl: the numpy decoder against the C one, the C quantizer's quality and
its MXFP4 / bf16 entry points, the converter hook."""
from __future__ import annotations

import numpy as np
import pytest

from app.convert import quant, quant3


def c_dequant(raw: np.ndarray, rows: int, cols: int) -> np.ndarray:
    from app.engine._ferry_c import ffi, lib
    out = np.zeros(rows * cols, dtype=np.float32)
    assert lib.ferry_dequantize(8, ffi.from_buffer(raw), rows, cols, ffi.from_buffer("float[]", out)) == 0
    return out.reshape(rows, cols)


def test_numpy_decoder_equals_c_decoder_on_random_blocks():
    rng = np.random.default_rng(1)
    blocks = rng.integers(0, 256, size=(40, quant3.BLOCK_BYTES), dtype=np.uint8)
    blocks[::5, 96] = 0  # scale 0
    raw = blocks.reshape(-1)
    got = quant3.dequantize(raw, 40 * 256)
    assert np.array_equal(got, c_dequant(raw, 4, 2560).reshape(-1))
    assert np.all(got.reshape(40, 256)[::5] == 0)
    assert np.array_equal(quant.dequantize(raw, "Q3_NL", 40 * 256), got)


def test_quantizer_quality_and_layout():
    rng = np.random.default_rng(2)
    w = (rng.standard_t(6, size=(48, 512)) * 0.03).astype(np.float32)
    w[5] = 0
    q = quant3.quantize(w, threads=2)
    assert q.size == 48 * 2 * 99
    back = quant3.dequantize(q, w.size).reshape(w.shape)
    assert np.array_equal(back, c_dequant(q, 48, 512))
    err = np.linalg.norm(w - back) / np.linalg.norm(w)
    assert err < 0.21, err
    assert np.all(back[5] == 0)
    # Deterministic, and independent of the thread split.
    assert np.array_equal(q, quant3.quantize(w, threads=1))


def test_importance_lowers_weighted_error():
    rng = np.random.default_rng(3)
    w = (rng.standard_normal((64, 256)) * 0.02).astype(np.float32)
    imp = np.exp(rng.normal(0, 1.5, 256)).astype(np.float32)
    plain = quant3.dequantize(quant3.quantize(w), w.size).reshape(w.shape)
    weighted = quant3.dequantize(quant3.quantize(w, importance=imp), w.size).reshape(w.shape)
    def werr(x):
        return float(((w - x) ** 2 * imp).sum())
    assert werr(weighted) < werr(plain)


def test_bf16_and_mxfp4_sources_match_their_float_values():
    rng = np.random.default_rng(4)
    w = (rng.standard_normal((16, 512)) * 0.05).astype(np.float32)
    bits = quant.f32_to_bf16_bits(w)
    assert np.array_equal(quant3.quantize(bits), quant3.quantize(quant.bf16_bits_to_f32(bits)))
    packed, scales = quant3.mxfp4_encode(w)
    values = quant3.mxfp4_decode(packed, scales)
    from app.convert.compressed import decode_mxfp4
    assert np.array_equal(values, decode_mxfp4(packed, scales))
    assert np.array_equal(quant3.quantize_mxfp4(packed, scales), quant3.quantize(values))


def test_bad_input_is_refused():
    with pytest.raises(ValueError):
        quant3.quantize(np.ones((2, 100), np.float32))
    bad = np.ones((2, 256), np.float32)
    bad[1, 3] = np.inf
    with pytest.raises(ValueError):
        quant3.quantize(bad)
    with pytest.raises(ValueError):
        quant3.dequantize(np.zeros(98, np.uint8), 256)
