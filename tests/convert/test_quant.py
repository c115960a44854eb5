"""Tests for app.convert.quant against the gguf package as an independent reference."""

from __future__ import annotations

import numpy as np
import pytest
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import dequantize as ref_dequantize
from gguf.quants import quantize as ref_quantize

from app.convert import quant

# Byte offsets of the f16 scale fields inside one block of each format.
F16_FIELDS = {
    "Q4_0": [0],
    "Q4_1": [0, 2],
    "Q5_0": [0],
    "Q5_1": [0, 2],
    "Q8_0": [0],
    "Q2_K": [80, 82],
    "Q3_K": [108],
    "Q4_K": [0, 2],
    "Q5_K": [0, 2],
    "Q6_K": [208],
}
REQUIRED = ["F32", "F16", "BF16", "Q4_0", "Q4_1", "Q8_0", "Q4_K", "Q6_K", "Q5_K", "Q8_K"]


def random_blocks(rng: np.random.Generator, name: str, n_blocks: int) -> np.ndarray:
    """Random raw blocks whose f16 scales are finite values of moderate size."""
    fmt = quant.FORMATS[name]
    blocks = rng.integers(0, 256, size=(n_blocks, fmt.block_bytes), dtype=np.uint8)
    for start in F16_FIELDS.get(name, []):
        scales = (rng.standard_normal(n_blocks) * 0.05).astype(np.float16)
        blocks[:, start : start + 2] = scales.view(np.uint8).reshape(n_blocks, 2)
    return blocks.reshape(-1)


def test_table_matches_ggml_sizes_and_ids() -> None:
    for fmt in quant.FORMATS.values():
        ref_type = GGMLQuantizationType[fmt.name]
        assert int(ref_type) == fmt.type_id
        assert GGML_QUANT_SIZES[ref_type] == (fmt.block_elems, fmt.block_bytes)
    for name in REQUIRED:
        assert quant.FORMATS[name].decodable
    assert quant.FORMATS_BY_ID[2].name == "Q4_0"


@pytest.mark.parametrize("name", list(F16_FIELDS) + ["F16", "BF16", "F32"])
def test_dequantize_equals_reference_on_random_blocks(name: str) -> None:
    rng = np.random.default_rng(sum(map(ord, name)))
    fmt = quant.FORMATS[name]
    raw = random_blocks(rng, name, 300)
    n = raw.size // fmt.block_bytes * fmt.block_elems
    ours = quant.dequantize(raw, name, n)
    ref = ref_dequantize(raw, GGMLQuantizationType[name]).reshape(-1)
    assert ours.dtype == np.float32 and ours.shape == (n,)
    np.testing.assert_array_equal(ours.view(np.uint32), ref.view(np.uint32))


@pytest.mark.parametrize("name", ["Q4_0", "Q8_0", "Q4_K", "Q6_K"])
def test_dequantize_equals_reference_on_fully_random_bytes(name: str) -> None:
    """Even inf/NaN scales decode bit-identically (and without warnings)."""
    rng = np.random.default_rng(7)
    fmt = quant.FORMATS[name]
    raw = rng.integers(0, 256, size=64 * fmt.block_bytes, dtype=np.uint8)
    ours = quant.dequantize(raw, name, 64 * fmt.block_elems)
    with np.errstate(all="ignore"):
        ref = ref_dequantize(raw, GGMLQuantizationType[name]).reshape(-1)
    np.testing.assert_array_equal(ours.view(np.uint32), ref.view(np.uint32))


def test_q8_k_layout() -> None:
    rng = np.random.default_rng(3)
    d = np.float32(0.125)
    qs = rng.integers(-128, 128, size=256, dtype=np.int8)
    bsums = np.zeros(16, dtype="<i2")
    raw = np.concatenate([np.array([d], "<f4").view(np.uint8), qs.view(np.uint8), bsums.view(np.uint8)])
    np.testing.assert_array_equal(quant.dequantize(raw, "Q8_K", 256), qs.astype(np.float32) * d)


def test_q4_0_hand_built_block() -> None:
    """Element j < 16 is the low nibble of byte j, element j + 16 the high nibble."""
    qs = np.arange(16, dtype=np.uint8) | (np.uint8(15) - np.arange(16, dtype=np.uint8)) << 4
    raw = np.concatenate([np.array([2.0], "<f2").view(np.uint8), qs])
    expected = (np.concatenate([np.arange(16), 15 - np.arange(16)]) - 8) * 2.0
    np.testing.assert_array_equal(quant.dequantize(raw, "Q4_0", 32), expected)


@pytest.mark.parametrize("name", ["Q8_0", "Q4_0", "Q4_1"])
def test_quantize_byte_identical_to_reference(name: str) -> None:
    rng = np.random.default_rng(11)
    x = (rng.standard_normal(32 * 2000) * rng.uniform(0.01, 10)).astype(np.float32)
    x[:32] = 0.0  # an all-zero block (d == 0)
    x[32:64] = 1.5  # a constant block (max == min for Q4_1)
    x[64:96] = rng.integers(-4, 5, size=32)  # exact ties for the rounding
    ours = quant.quantize(x, name)
    ref = ref_quantize(x.reshape(-1, 32), GGMLQuantizationType[name]).reshape(-1)
    assert ours.dtype == np.uint8
    np.testing.assert_array_equal(ours, ref)


@pytest.mark.parametrize("name", ["Q8_0", "Q4_0", "Q4_1"])
def test_quantize_round_trip_error_is_bounded(name: str) -> None:
    rng = np.random.default_rng(5)
    x = rng.standard_normal(32 * 64).astype(np.float32)
    back = quant.dequantize(quant.quantize(x, name), name, x.size)
    steps = {"Q8_0": 127, "Q4_0": 7, "Q4_1": 15}[name]
    span = np.abs(x.reshape(-1, 32)).max(axis=1, keepdims=True) * 2
    assert (np.abs(back - x).reshape(-1, 32) <= span / steps).all()


def test_quantize_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="multiple of 32"):
        quant.quantize(np.zeros(33, np.float32), "Q8_0")
    with pytest.raises(ValueError, match="non-finite"):
        quant.quantize(np.full(32, np.nan, np.float32), "Q4_0")
    with pytest.raises(ValueError, match="cannot quantize"):
        quant.quantize(np.zeros(256, np.float32), "Q4_K")


def test_dequantize_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="need 36 bytes"):
        quant.dequantize(np.zeros(35, np.uint8), "Q4_0", 64)
    with pytest.raises(ValueError, match="multiple of 32"):
        quant.dequantize(np.zeros(18, np.uint8), "Q4_0", 31)
    with pytest.raises(ValueError, match="unknown tensor type"):
        quant.dequantize(np.zeros(4, np.uint8), "Q9_9", 1)
    with pytest.raises(ValueError, match="cannot decode"):
        quant.dequantize(np.zeros(66, np.uint8), "IQ2_XXS", 256)


def test_bf16_round_to_nearest_even_and_nan() -> None:
    values = np.array(
        [1.0, -2.5, 1.0 + 2**-8, 1.0 + 3 * 2**-8, 1.0 + 2**-8 + 2**-20, np.inf, -np.inf, 3.4e38],
        dtype=np.float32,
    )
    bits = quant.f32_to_bf16_bits(values)
    expected = [0x3F80, 0xC020, 0x3F80, 0x3F82, 0x3F81, 0x7F80, 0xFF80, 0x7F80]
    assert bits.tolist() == expected
    nan_bits = np.array([0x7F800001, 0xFFC00000, 0x7FFFFFFF], dtype=np.uint32).view(np.float32)
    assert np.isnan(quant.bf16_bits_to_f32(quant.f32_to_bf16_bits(nan_bits))).all()


def test_bf16_matches_reference_conversion() -> None:
    rng = np.random.default_rng(2)
    x = rng.integers(0, 2**32, size=100_000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    ref = ref_quantize(x, GGMLQuantizationType.BF16).view(np.uint16)
    np.testing.assert_array_equal(quant.f32_to_bf16_bits(x), ref)
    widened = quant.bf16_bits_to_f32(np.arange(2**16, dtype=np.uint16))
    finite = np.isfinite(widened)
    np.testing.assert_array_equal(quant.f32_to_bf16_bits(widened[finite]), np.arange(2**16)[finite])


def test_f16_helpers_round_trip() -> None:
    bits = np.arange(2**16, dtype=np.uint16)
    values = quant.f16_bits_to_f32(bits)
    assert values.dtype == np.float32
    finite = np.isfinite(values)
    np.testing.assert_array_equal(quant.f32_to_f16_bits(values[finite]), bits[finite])
    assert quant.f32_to_f16_bits(np.float32(1e6)).item() == 0x7C00


def test_f8_e4m3fn_decoding() -> None:
    codes = np.arange(256, dtype=np.uint8)
    values = quant.f8_e4m3_to_f32(codes)
    assert values[0x00] == 0.0 and values[0x08] == 2.0**-6 and values[0x01] == 2.0**-9
    assert values[0x38] == 1.0 and values[0x7E] == 448.0 and values[0xFE] == -448.0
    assert np.isnan(values[[0x7F, 0xFF]]).all()
    assert np.isfinite(np.delete(values, [0x7F, 0xFF])).all()
    torch = pytest.importorskip("torch")
    ref = torch.from_numpy(codes).view(torch.float8_e4m3fn).float().numpy()
    np.testing.assert_array_equal(values, ref)


def test_f8_e5m2_decoding() -> None:
    torch = pytest.importorskip("torch")
    codes = np.arange(256, dtype=np.uint8)
    ref = torch.from_numpy(codes).view(torch.float8_e5m2).float().numpy()
    np.testing.assert_array_equal(quant.f8_e5m2_to_f32(codes), ref)


def _edge_values(rng) -> list[np.ndarray]:
    """Scales from subnormal scales to f16 overflow, exact ties, signed zeros in
    every order, and random bit patterns (every finite float32 kind)."""
    cases = [(rng.standard_normal(32 * 512) * s).astype(np.float32) for s in (1e-9, 1e-6, 1e-2, 1, 1e4, 3e5, 1e7)]
    cases.append(np.round(rng.standard_normal(32 * 512) * 8).astype(np.float32) / 4)
    cases.append(rng.integers(-3, 4, 32 * 256).astype(np.float32) * np.float32(2 ** -20))
    for pattern in ([0.0, -0.0], [-0.0, 0.0], [0.0, 0.0, 0.0, -0.0], [-0.0], [0.0]):
        cases.append(np.array((pattern * 32)[:32] * 4, np.float32))
    bits = rng.integers(0, 2 ** 32, 32 * 8192, dtype=np.uint64).astype(np.uint32).view(np.float32)
    cases.append(np.where(np.isfinite(bits), bits, np.float32(0)).astype(np.float32))
    return cases


@pytest.mark.parametrize("name", ["Q8_0", "Q4_0", "Q4_1"])
def test_the_c_quantizer_writes_the_reference_bytes(name: str) -> None:
    """`quantize` (C, ferry_quantize_blocks, several threads) against the numpy
    `quantize_reference`, which follows ggml's loops (the sign of a zero scale
    included, where gguf's numpy port differs)."""
    for x in _edge_values(np.random.default_rng(3)):
        with np.errstate(all="ignore"):
            want = quant.quantize_reference(x, name)
        np.testing.assert_array_equal(quant.quantize(x, name, threads=3), want)
        np.testing.assert_array_equal(quant.quantize(x, name, threads=1), want)
    bad = np.ones(32 * 5000, np.float32)
    bad[32 * 4000 + 7] = np.inf
    with pytest.raises(ValueError, match="non-finite"):
        quant.quantize(bad, name, threads=2)
