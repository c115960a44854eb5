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


def _heavy_tailed() -> np.ndarray:
    rng = np.random.default_rng(7)
    w = (rng.standard_t(4, size=(96, 1024)) * 0.02).astype(np.float32)
    w *= np.exp(rng.normal(0, 0.3, (96, 1))).astype(np.float32)
    w[7, :64] = 0
    return w


#: The relative weight error of the quantizer before 2026-12-03 (5 codes, 7 compares per value) on
#: _heavy_tailed(): 0.22966 (measured with core_c/src/quant3.c of revision 5ae6b8f).
OLD_ERROR = 0.22966


def test_faster_quantizer_is_no_worse_than_the_old_one():
    w = _heavy_tailed()
    back = quant3.dequantize(quant3.quantize(w, threads=1), w.size).reshape(w.shape)
    assert np.linalg.norm(w - back) / np.linalg.norm(w) <= OLD_ERROR + 1e-5


def test_portable_and_avx2_paths_give_the_same_bytes(tmp_path):
    """FERRY_KERNELS=scalar makes the quantizer take its portable path (run in a child, as a user
    would set it); on a CPU without AVX2 both runs take it."""
    import os
    import subprocess
    import sys

    from tests.conftest import REPO
    w = _heavy_tailed()
    packed, scales = quant3.mxfp4_encode(w)
    imp = np.linspace(0.1, 3.0, w.shape[1], dtype=np.float32)
    np.save(tmp_path / "w.npy", w)
    np.save(tmp_path / "imp.npy", imp)
    code = ("import sys, numpy as np; from app.convert import quant, quant3; d = sys.argv[1]\n"
            "w = np.load(d + '/w.npy'); imp = np.load(d + '/imp.npy'); p, s = quant3.mxfp4_encode(w)\n"
            "np.save(d + '/' + sys.argv[2], np.concatenate([quant3.quantize(w), quant3.quantize(w, imp),\n"
            "    quant3.quantize(quant.f32_to_bf16_bits(w)), quant3.quantize_mxfp4(p, s, imp)]))\n")
    for name, kernels in (("auto.npy", "auto"), ("scalar.npy", "scalar")):
        env = dict(os.environ, FERRY_KERNELS=kernels, PYTHONPATH=str(REPO))
        subprocess.run([sys.executable, "-c", code, str(tmp_path), name], check=True, env=env, cwd=REPO)
    auto, scalar = np.load(tmp_path / "auto.npy"), np.load(tmp_path / "scalar.npy")
    assert np.array_equal(auto, scalar)
    assert np.array_equal(auto[:w.size // 256 * 99], quant3.quantize(w))
    assert np.array_equal(auto[-w.size // 256 * 99:], quant3.quantize_mxfp4(packed, scales, imp))


@pytest.mark.parametrize("scale_range", [(118, 123), (97, 168), (0, 253)])
def test_mxfp4_tables_give_the_bytes_of_the_float_values(scale_range):
    """MXFP4 blocks take lookup tables when their scales keep every product normal (quant3.c, "MXFP4
    by tables"), floats otherwise: both must give the bytes of the decoded values, on every path."""
    from app.engine._ferry_c import ffi, lib
    rng = np.random.default_rng(scale_range[0])
    rows, cols = 32, 1536
    packed = rng.integers(0, 256, (rows, cols // 2), dtype=np.uint8)
    packed[::4, ::3] = 0x88
    packed[1::4] &= 0x77
    packed[2, :16] = 0
    scales = rng.integers(*scale_range, (rows, cols // 32)).astype(np.uint8)
    values = quant3.mxfp4_decode(packed, scales)
    imp = np.exp(rng.normal(0, 1, cols)).astype(np.float32)
    nq = rows * cols // 256 * 99
    for impl in (lib.FERRY_KERNELS_SCALAR, lib.FERRY_KERNELS_AVX2, lib.FERRY_KERNELS_NEON):
        if not lib.ferry_kernels_available(impl):
            continue
        for w in (None, imp):
            h = ffi.NULL if w is None else ffi.from_buffer("float[]", w)
            a, b = np.zeros(nq, np.uint8), np.ones(nq, np.uint8)
            assert lib.ferry_q3_quantize(impl, lib.FERRY_Q3_SOURCE_MXFP4, ffi.from_buffer(packed),
                                         ffi.from_buffer(scales), rows, cols, h, ffi.from_buffer(a)) == 0
            assert lib.ferry_q3_quantize(impl, lib.FERRY_Q3_SOURCE_F32, ffi.from_buffer("float[]", values),
                                         ffi.NULL, rows, cols, h, ffi.from_buffer(b)) == 0
            assert np.array_equal(a, b), (impl, w is None)
