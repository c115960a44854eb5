"""Damaged, truncated or hostile containers are refused with a message that
names the problem; nothing crashes and a session survives a failed eval."""
from __future__ import annotations

import json
import os
import shutil
import struct

import numpy as np
import pytest

from app.engine.binding import Engine, FerryError, verify


@pytest.fixture
def container(tiny_moe, tmp_path):
    """A fresh copy of the tiny MoE container that a test may damage."""
    dst = tmp_path / "c.ferry"
    shutil.copytree(tiny_moe[1], dst)
    return dst


def manifest(c):
    return json.loads((c / "manifest.json").read_text())


def write_manifest(c, doc):
    (c / "manifest.json").write_text(json.dumps(doc))


def refused(c, code, *words, **engine_kw):
    with pytest.raises(FerryError) as info:
        Engine(c, **engine_kw)
    assert info.value.code == code, info.value.message
    for w in words:
        assert w in info.value.message, info.value.message
    return info.value.message


def test_intact_container_opens_and_verifies(container):
    verify(container)
    with Engine(container) as e:
        assert e.info.n_moe_layers == 2 and e.info.n_experts == 8


def test_truncated_expert_bank(container):
    bank = container / "experts" / "layer_000.bin"
    with open(bank, "r+b") as f:
        f.truncate(bank.stat().st_size - 100)
    refused(container, "FERRY_E_FORMAT", "layer_000.bin", "truncated")


def test_flipped_byte_in_a_record_is_named_by_verify(container):
    doc = manifest(container)
    bank = doc["expert_banks"][1]
    at = 4096 + 5 * bank["record_size"] + bank["up"]["offset"] + 7  # expert 5, its up matrix
    path = container / bank["file"]
    data = bytearray(path.read_bytes())
    data[at] ^= 0x40
    path.write_bytes(bytes(data))
    with pytest.raises(FerryError) as info:
        verify(container)
    msg = info.value.message
    assert info.value.code == "FERRY_E_CHECKSUM"
    assert bank["file"] in msg and f"layer {bank['layer']} expert 5" in msg
    # With read checks on, an eval that needs that expert fails cleanly and the
    # session stays where it was.
    with Engine(container, verify_reads=True) as engine:
        s = engine.session(64)
        failures = 0
        for tok in range(3, 96):
            try:
                s.eval([tok])
            except FerryError as exc:
                assert exc.code == "FERRY_E_CHECKSUM"
                failures += 1
        assert failures > 0
        assert s.position == 93 - failures


def test_flipped_byte_in_the_trunk_is_named_by_verify(container):
    doc = manifest(container)
    t = next(t for t in doc["tensors"] if t["name"] == "blk.1.attn_k")
    path = container / "trunk.bin"
    data = bytearray(path.read_bytes())
    data[t["offset"] + 3] ^= 1
    path.write_bytes(bytes(data))
    with pytest.raises(FerryError) as info:
        verify(container)
    assert info.value.code == "FERRY_E_CHECKSUM" and "blk.1.attn_k" in info.value.message
    # ... and by the engine on open (issue 18): damaged weights are never used silently.
    refused(container, "FERRY_E_CHECKSUM", "trunk.bin", "blk.1.attn_k", "damaged")
    with Engine(container, trunk_check=False):   # the switch that measures the check's cost
        pass


def test_overlapping_tensors_are_refused(container):
    doc = manifest(container)
    a, b = doc["tensors"][0], next(t for t in doc["tensors"][1:] if t["nbytes"] >= 128)
    a_end = a["offset"] + a["nbytes"]
    b["offset"] = a["offset"] + 64 if a["nbytes"] > 64 else a["offset"]
    assert b["offset"] < a_end
    write_manifest(container, doc)
    refused(container, "FERRY_E_FORMAT", "overlap", a["name"], b["name"])


def test_wrong_format_version(container):
    doc = manifest(container)
    doc["version"] = 2
    write_manifest(container, doc)
    refused(container, "FERRY_E_VERSION", "version 2")


def test_wrong_bank_version(container):
    path = container / "experts" / "layer_000.bin"
    data = bytearray(path.read_bytes())
    data[8:12] = struct.pack("<I", 9)
    path.write_bytes(bytes(data))
    refused(container, "FERRY_E_VERSION", "layer_000.bin", "version 9")


@pytest.mark.parametrize("field,value,words", [
    ("n_layers", 10**9, ["model.n_layers"]),
    ("dim", 0, ["model.dim"]),
    ("n_heads", -3, ["model.n_heads"]),
    ("vocab", 2.5, ["model.vocab"]),
    ("head_dim", "64", ["model.head_dim"]),
    ("n_kv_heads", 3, ["n_kv_heads", "divide"]),
])
def test_absurd_dimensions(container, field, value, words):
    doc = manifest(container)
    doc["model"][field] = value
    write_manifest(container, doc)
    refused(container, "FERRY_E_FORMAT", *words)


def test_tensor_outside_its_file(container):
    doc = manifest(container)
    t = doc["tensors"][3]
    t["offset"] = (container / "trunk.bin").stat().st_size - 64
    write_manifest(container, doc)
    refused(container, "FERRY_E_FORMAT", t["name"], "trunk.bin has")


def test_tensor_shape_that_does_not_match_its_bytes(container):
    doc = manifest(container)
    doc["tensors"][2]["shape"] = [1 << 24, 1 << 24]
    write_manifest(container, doc)
    refused(container, "FERRY_E_FORMAT", "nbytes")


def test_bank_record_size_that_does_not_hold_the_record(container):
    doc = manifest(container)
    doc["expert_banks"][0]["record_size"] = 4096 * 1000
    write_manifest(container, doc)
    refused(container, "FERRY_E_FORMAT")


@pytest.mark.parametrize("victim,words", [
    ("trunk.bin", ["trunk.bin"]),
    ("manifest.json", ["manifest.json"]),
    ("experts/layer_002.bin", ["layer_002.bin"]),
])
def test_missing_file(container, victim, words):
    os.remove(container / victim)
    refused(container, "FERRY_E_IO", *words)


def test_manifest_that_is_not_json(container):
    (container / "manifest.json").write_text('{"format": "ferry", "version": 1, ')
    refused(container, "FERRY_E_FORMAT", "not valid JSON")


def test_path_escaping_the_container_is_refused(container):
    doc = manifest(container)
    doc["expert_banks"][0]["file"] = "../../etc/passwd"
    write_manifest(container, doc)
    refused(container, "FERRY_E_FORMAT", "plain relative name")


def test_token_outside_vocabulary(container):
    with Engine(container) as e:
        s = e.session(16)
        with pytest.raises(FerryError) as info:
            s.eval([5, 96])
        assert info.value.code == "FERRY_E_ARG" and "vocabulary" in info.value.message
        assert s.position == 0


def test_random_manifest_damage_never_crashes(container):
    """Byte flips, truncations and splices of the manifest: each open either
    succeeds or raises FerryError (a crash would take the test process down)."""
    original = (container / "manifest.json").read_bytes()
    rng = np.random.default_rng(1)
    outcomes = {"ok": 0, "refused": 0}
    for _ in range(400):
        data = bytearray(original)
        kind = rng.integers(3)
        if kind == 0:
            for _ in range(rng.integers(1, 8)):
                data[rng.integers(len(data))] = rng.integers(256)
        elif kind == 1:
            data = data[:rng.integers(len(data))]
        else:
            a, b = sorted(rng.integers(len(data), size=2))
            data = data[:a] + data[b:]
        (container / "manifest.json").write_bytes(bytes(data))
        try:
            Engine(container).close()
            outcomes["ok"] += 1
        except FerryError:
            outcomes["refused"] += 1
    assert outcomes["refused"] > 300
