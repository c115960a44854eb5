"""Tests for the safetensors reader and checkpoint folders, including hostile input."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from safetensors.numpy import save_file

from app.convert.errors import SourceError
from app.convert.safetensors_file import Checkpoint, SafetensorsFile


def write_raw(path: Path, header: Any, data: bytes = b"", length: int | None = None) -> Path:
    """Write a safetensors-shaped file from a header (dict, str or bytes) and data."""
    if isinstance(header, dict):
        header = json.dumps(header)
    if isinstance(header, str):
        header = header.encode()
    size = len(header) if length is None else length
    path.write_bytes(struct.pack("<Q", size) + header + data)
    return path


def entry(dtype: str, shape: list[Any], begin: int, end: int) -> dict[str, Any]:
    return {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}


def sample_tensors() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {
        "a.f32": rng.standard_normal((3, 5)).astype(np.float32),
        "b.f16": rng.standard_normal((4,)).astype(np.float16),
        "c.i8": rng.integers(-128, 127, size=(2, 3, 2), dtype=np.int8),
        "d.u8": rng.integers(0, 255, size=(7,), dtype=np.uint8),
        "e.i32": rng.integers(-(2**31), 2**31 - 1, size=(2, 2), dtype=np.int32),
        "f.i64": rng.integers(-(2**62), 2**62, size=(3,), dtype=np.int64),
        "g.bool": rng.integers(0, 2, size=(5,)).astype(bool),
        "h.scalar": np.array(2.5, dtype=np.float64),
        "i.empty": np.zeros((0, 4), dtype=np.float32),
    }


def expect_error(path: Path, match: str) -> SourceError:
    with pytest.raises(SourceError, match=match) as info:
        SafetensorsFile(path)
    assert info.value.path == path
    assert str(info.value).startswith(path.name + ": ")
    return info.value


# ---------------------------------------------------------------- valid files


def test_reads_every_numpy_dtype(tmp_path: Path) -> None:
    tensors = sample_tensors()
    path = tmp_path / "m.safetensors"
    save_file(tensors, str(path), metadata={"format": "np"})
    st = SafetensorsFile(path)
    assert st.metadata == {"format": "np"}
    assert set(st.tensors) == set(tensors)
    for name, value in tensors.items():
        info = st.tensors[name]
        assert info.shape == value.shape and info.path == path
        assert info.nbytes == value.nbytes
        got = st.read_array(name)
        assert got.dtype == value.dtype and got.shape == value.shape
        np.testing.assert_array_equal(got, value)
        assert st.read_raw(name).tobytes() == value.tobytes()
        np.testing.assert_array_equal(st.read_f32(name), value.astype(np.float32))
        assert st.read_f32(name).dtype == np.float32


def test_offsets_are_absolute(tmp_path: Path) -> None:
    path = tmp_path / "m.safetensors"
    save_file({"x": np.arange(6, dtype=np.float32)}, str(path))
    info = SafetensorsFile(path).tensors["x"]
    blob = path.read_bytes()
    assert blob[info.offset : info.offset + info.nbytes] == np.arange(6, dtype=np.float32).tobytes()


def test_bf16_and_f8_decode_like_torch(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    from safetensors.torch import save_file as torch_save

    base = torch.randn(4, 64) * 100
    tensors = {
        "bf16": base.to(torch.bfloat16),
        "e4m3": base.clamp(-448, 448).to(torch.float8_e4m3fn),
        "e5m2": base.to(torch.float8_e5m2),
    }
    path = tmp_path / "t.safetensors"
    torch_save(tensors, str(path))
    st = SafetensorsFile(path)
    for name, value in tensors.items():
        got = st.read_array(name)
        assert got.dtype == np.float32 and got.shape == (4, 64)
        np.testing.assert_array_equal(got, value.float().numpy())
    assert st.tensors["e4m3"].dtype == "F8_E4M3" and st.tensors["bf16"].dtype == "BF16"


def test_f8_e4m3_nan_codes(tmp_path: Path) -> None:
    data = bytes([0x7F, 0xFF, 0x7E, 0x00])
    path = write_raw(tmp_path / "f8.safetensors", {"x": entry("F8_E4M3", [4], 0, 4)}, data)
    got = SafetensorsFile(path).read_array("x")
    assert np.isnan(got[:2]).all() and got[2] == 448.0 and got[3] == 0.0


def test_header_padding_and_holes_are_accepted(tmp_path: Path) -> None:
    header = json.dumps({"x": entry("U8", [2], 4, 6)}) + "    "
    path = write_raw(tmp_path / "p.safetensors", header, b"\0\0\0\0\x07\x08")
    assert SafetensorsFile(path).read_array("x").tolist() == [7, 8]


# ------------------------------------------------------------- hostile files


def test_file_too_short(tmp_path: Path) -> None:
    path = tmp_path / "s.safetensors"
    path.write_bytes(b"\x01\x02")
    expect_error(path, "only 2 bytes")


def test_header_length_larger_than_file(tmp_path: Path) -> None:
    path = write_raw(tmp_path / "h.safetensors", b"{}", length=1000)
    expect_error(path, "header length 1000 is larger than the file \\(10 bytes\\)")


def test_header_length_over_limit(tmp_path: Path) -> None:
    path = write_raw(tmp_path / "h.safetensors", b"{}", length=2**63)
    expect_error(path, "exceeds the 100000000 byte limit")


@pytest.mark.parametrize(
    ("header", "match"),
    [
        (b"\xff\xfe{}", "header is not valid UTF-8"),
        (b'{"x": ', "header is not valid JSON"),
        (b"[1, 2]", "header is not a JSON object"),
        (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
        (b'{"x": 1, "x": 2}', "duplicate key 'x'"),
        (b'{"x": 12345678901234567890' + b"1" * 5000 + b"}", "not valid JSON"),
    ],
)
def test_bad_header_bytes(tmp_path: Path, header: bytes, match: str) -> None:
    expect_error(write_raw(tmp_path / "bad.safetensors", header), match)


@pytest.mark.parametrize(
    ("tensor", "match"),
    [
        ("not an object", "'w' entry is not a JSON object"),
        ({"shape": [1], "data_offsets": [0, 4]}, "'w' has no 'dtype'"),
        ({"dtype": "F32", "data_offsets": [0, 4]}, "'w' has no 'shape'"),
        ({"dtype": "F32", "shape": [1]}, "'w' has no 'data_offsets'"),
        (entry("F33", [1], 0, 4), "unknown dtype 'F33'"),
        (entry("f32", [1], 0, 4), "unknown dtype 'f32'"),
        ({"dtype": 5, "shape": [1], "data_offsets": [0, 4]}, "unknown dtype 5"),
        ({"dtype": "F32", "shape": 4, "data_offsets": [0, 4]}, "shape that is not a list"),
        (entry("F32", [-1], 0, 4), "invalid dimension -1"),
        (entry("F32", [2**41], 0, 4), "invalid dimension 2199023255552"),
        (entry("F32", [1.0], 0, 4), "invalid dimension 1.0"),
        (entry("F32", [True], 0, 4), "invalid dimension True"),
        (entry("F32", [1] * 9, 0, 4), "9 dimensions \\(max 8\\)"),
        ({"dtype": "F32", "shape": [1], "data_offsets": [0]}, "invalid data_offsets"),
        (entry("F32", [1], 4, 0), "invalid data_offsets"),
        (entry("F32", [1], -4, 0), "invalid data_offsets"),
        ({"dtype": "F32", "shape": [1], "data_offsets": [0, "4"]}, "invalid data_offsets"),
        (entry("F32", [2], 0, 4), "needs 8 bytes but its data_offsets span 4"),
        (entry("F32", [2**20, 2**20, 2**20], 0, 4), "needs 4611686018427387904 bytes"),
        (entry("F32", [4], 0, 16), "'w' ends at byte \\d+ but the file has \\d+ bytes"),
    ],
)
def test_bad_tensor_entries(tmp_path: Path, tensor: Any, match: str) -> None:
    path = write_raw(tmp_path / "bad.safetensors", {"w": tensor}, b"\0" * 4)
    expect_error(path, match)


def test_end_beyond_file_message_is_specific(tmp_path: Path) -> None:
    header = json.dumps({"model.layers.3.mlp.up_proj.weight": entry("F32", [4], 0, 16)}).encode()
    path = write_raw(tmp_path / "model-00002-of-00003.safetensors", header, b"\0" * 8)
    error = expect_error(path, "ends at byte")
    start = 8 + len(header)
    assert str(error) == (
        "model-00002-of-00003.safetensors: tensor 'model.layers.3.mlp.up_proj.weight' "
        f"ends at byte {start + 16} but the file has {start + 8} bytes"
    )


def test_overlapping_tensors(tmp_path: Path) -> None:
    header = {"a": entry("F32", [2], 0, 8), "b": entry("F32", [2], 4, 12)}
    expect_error(write_raw(tmp_path / "o.safetensors", header, b"\0" * 12), "'a' and 'b' overlap")


def test_empty_tensors_may_share_offsets(tmp_path: Path) -> None:
    header = {"a": entry("F32", [0], 4, 4), "b": entry("F32", [2], 0, 8), "c": entry("I8", [0, 3], 4, 4)}
    st = SafetensorsFile(write_raw(tmp_path / "z.safetensors", header, b"\0" * 8))
    assert st.read_array("a").shape == (0,) and st.read_array("c").shape == (0, 3)


@pytest.mark.parametrize("metadata", [["x"], {"k": 1}, {"k": None}])
def test_bad_metadata(tmp_path: Path, metadata: Any) -> None:
    header = {"__metadata__": metadata, "x": entry("U8", [1], 0, 1)}
    expect_error(write_raw(tmp_path / "m.safetensors", header, b"\0"), "__metadata__ must be")


def test_unknown_tensor_name_is_source_error(tmp_path: Path) -> None:
    path = write_raw(tmp_path / "u.safetensors", {"x": entry("U8", [1], 0, 1)}, b"\0")
    with pytest.raises(SourceError, match="no tensor named 'y'"):
        SafetensorsFile(path).read_raw("y")


def test_file_truncated_after_parsing(tmp_path: Path) -> None:
    path = tmp_path / "t.safetensors"
    save_file({"x": np.zeros(100, np.float32)}, str(path))
    st = SafetensorsFile(path)
    path.write_bytes(path.read_bytes()[:-10])
    with pytest.raises(SourceError, match="was it truncated"):
        st.read_raw("x")


def test_every_truncation_is_rejected(tmp_path: Path) -> None:
    source = tmp_path / "full.safetensors"
    save_file(sample_tensors(), str(source))
    blob = source.read_bytes()
    cut = tmp_path / "cut.safetensors"
    for size in range(len(blob)):
        cut.write_bytes(blob[:size])
        with pytest.raises(SourceError):
            SafetensorsFile(cut)


def test_fuzz_random_corruption(tmp_path: Path) -> None:
    """Random byte flips and truncations give SourceError or a readable file."""
    source = tmp_path / "full.safetensors"
    save_file(sample_tensors(), str(source))
    blob = source.read_bytes()
    header_end = 8 + struct.unpack("<Q", blob[:8])[0]
    rng = np.random.default_rng(1234)
    path = tmp_path / "fuzz.safetensors"
    outcomes = {"ok": 0, "error": 0}
    for _ in range(3000):
        data = bytearray(blob)
        for _ in range(int(rng.integers(1, 4))):
            # Most flips land in the header, where parsing decisions are made.
            limit = header_end if rng.random() < 0.9 else len(data)
            data[int(rng.integers(0, limit))] = int(rng.integers(0, 256))
        if rng.random() < 0.2:
            data = data[: int(rng.integers(0, len(data) + 1))]
        path.write_bytes(bytes(data))
        try:
            st = SafetensorsFile(path)
            for name in st.tensors:
                st.read_f32(name)
            outcomes["ok"] += 1
        except SourceError:
            outcomes["error"] += 1
    assert outcomes["ok"] > 0 and outcomes["error"] > 0


# --------------------------------------------------------------- checkpoints


def make_checkpoint(folder: Path, shards: dict[str, dict[str, np.ndarray]], index: bool) -> Path:
    """A checkpoint folder with config.json, the given shards and maybe an index."""
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 8}))
    for name, tensors in shards.items():
        save_file(tensors, str(folder / name))
    if index:
        weight_map = {t: name for name, tensors in shards.items() for t in tensors}
        (folder / "model.safetensors.index.json").write_text(
            json.dumps({"metadata": {"total_size": 0}, "weight_map": weight_map})
        )
    return folder


def two_shards() -> dict[str, dict[str, np.ndarray]]:
    return {
        "model-00001-of-00002.safetensors": {
            "embed.weight": np.ones((4, 8), np.float32),
            "layer.0.weight": np.full((8, 8), 2, np.float16),
        },
        "model-00002-of-00002.safetensors": {"lm_head.weight": np.full((4, 8), 3, np.float32)},
    }


def test_indexed_checkpoint(tmp_path: Path) -> None:
    folder = make_checkpoint(tmp_path / "ck", two_shards(), index=True)
    (folder / "tokenizer.json").write_text("{}")
    (folder / "generation_config.json").write_text("{}")
    ck = Checkpoint(folder)
    assert ck.config["model_type"] == "llama"
    assert ck.tensor_names() == ["embed.weight", "layer.0.weight", "lm_head.weight"]
    assert [p.name for p in ck.shards] == list(two_shards())
    assert ck.info("lm_head.weight").path.name == "model-00002-of-00002.safetensors"
    np.testing.assert_array_equal(ck.read_f32("layer.0.weight"), np.full((8, 8), 2, np.float32))
    assert ck.read_raw("embed.weight").size == 128
    assert ck.total_bytes == 128 + 128 + 128
    assert set(ck.tokenizer_files()) == {"tokenizer.json", "generation_config.json"}
    assert Checkpoint.validate(folder) == []
    with pytest.raises(SourceError, match="no tensor named 'nope'"):
        ck.info("nope")


def test_single_file_checkpoint(tmp_path: Path) -> None:
    folder = make_checkpoint(tmp_path / "ck", {"model.safetensors": {"w": np.zeros(3, np.float32)}}, False)
    save_file({"junk": np.zeros(1, np.float32)}, str(folder / "other.safetensors"))
    ck = Checkpoint(folder)
    assert ck.tensor_names() == ["w"] and ck.tokenizer_files() == {}


def test_unindexed_shards(tmp_path: Path) -> None:
    folder = make_checkpoint(tmp_path / "ck", two_shards(), index=False)
    assert len(Checkpoint(folder).tensor_names()) == 3


def test_unindexed_duplicate_tensor(tmp_path: Path) -> None:
    shards = {"a.safetensors": {"w": np.zeros(1, np.float32)}, "b.safetensors": {"w": np.zeros(1, np.float32)}}
    folder = make_checkpoint(tmp_path / "ck", shards, index=False)
    with pytest.raises(SourceError, match="b.safetensors: tensor 'w' is also in a.safetensors"):
        Checkpoint(folder)


def test_index_names_missing_shard(tmp_path: Path) -> None:
    folder = make_checkpoint(tmp_path / "ck", two_shards(), index=True)
    (folder / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(SourceError) as info:
        Checkpoint(folder)
    assert str(info.value) == (
        "model-00002-of-00002.safetensors: shard listed in model.safetensors.index.json is missing"
    )
    assert info.value.path == folder / "model-00002-of-00002.safetensors"


def test_shard_lacks_tensor_named_by_index(tmp_path: Path) -> None:
    folder = make_checkpoint(tmp_path / "ck", two_shards(), index=True)
    save_file({"other": np.zeros(1, np.float32)}, str(folder / "model-00002-of-00002.safetensors"))
    with pytest.raises(SourceError, match="index.json says it holds tensor 'lm_head.weight' but it does not"):
        Checkpoint(folder)


@pytest.mark.parametrize(
    ("index", "match"),
    [
        ("{", "not valid JSON"),
        ("[]", "no non-empty 'weight_map'"),
        ('{"weight_map": {}}', "no non-empty 'weight_map'"),
        ('{"weight_map": {"w": "../../etc/passwd"}}', "invalid shard file '../../etc/passwd'"),
        ('{"weight_map": {"w": "/abs.safetensors"}}', "invalid shard file"),
        ('{"weight_map": {"w": 3}}', "invalid shard file 3"),
        ('{"weight_map": {"w": ".."}}', "invalid shard file"),
    ],
)
def test_bad_index(tmp_path: Path, index: str, match: str) -> None:
    folder = make_checkpoint(tmp_path / "ck", two_shards(), index=True)
    (folder / "model.safetensors.index.json").write_text(index)
    with pytest.raises(SourceError, match=match):
        Checkpoint(folder)


@pytest.mark.parametrize(
    ("config", "match"),
    [(None, "config.json: is missing"), ("[1]", "config.json: is not a JSON object"), ("{,}", "not valid JSON")],
)
def test_bad_config(tmp_path: Path, config: str | None, match: str) -> None:
    folder = make_checkpoint(tmp_path / "ck", two_shards(), index=False)
    if config is None:
        (folder / "config.json").unlink()
    else:
        (folder / "config.json").write_text(config)
    with pytest.raises(SourceError, match=match):
        Checkpoint(folder)


def test_folder_without_weights_or_missing(tmp_path: Path) -> None:
    folder = make_checkpoint(tmp_path / "ck", {}, index=False)
    with pytest.raises(SourceError, match="contains no .safetensors files"):
        Checkpoint(folder)
    with pytest.raises(SourceError, match="is not a folder"):
        Checkpoint(tmp_path / "absent")


def test_validate_lists_every_problem(tmp_path: Path) -> None:
    shards = two_shards()
    shards["model-00003-of-00003.safetensors"] = {"extra": np.zeros(1, np.float32)}
    folder = make_checkpoint(tmp_path / "ck", shards, index=True)
    (folder / "config.json").write_text("[]")
    (folder / "model-00002-of-00002.safetensors").unlink()
    write_raw(folder / "model-00003-of-00003.safetensors", b"{bad")
    problems = Checkpoint.validate(folder)
    assert [str(p) for p in problems] == [
        "config.json: is not a JSON object",
        "model-00002-of-00002.safetensors: shard listed in model.safetensors.index.json is missing",
        "model-00003-of-00003.safetensors: header is not valid JSON: "
        "Expecting property name enclosed in double quotes: line 1 column 2 (char 1)",
    ]
    assert all(isinstance(p, SourceError) for p in problems)
