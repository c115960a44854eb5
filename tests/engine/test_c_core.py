"""The C core's own test program, built with AddressSanitizer and
UndefinedBehaviorSanitizer, run on a good container and on many damaged ones."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from tests import cbuild
from tests.conftest import REPO

CORE = REPO / "core_c"


def build(tmp_path_factory, tmp: Path) -> Path:
    """The test program with the sanitizers, from this run's sanitizer objects of the core (tests/cbuild.py:
    the kernel programs' sanitizer builds share them)."""
    sources = [*sorted((CORE / "src").glob("*.c")), CORE / "tests" / "test_core.c"]
    return cbuild.program(tmp_path_factory, tmp / "test_core", cbuild.host_cc(), cbuild.SANITIZE, sources)


def damaged_copies(good: Path, tmp: Path, n_random: int = 60) -> list[Path]:
    """Manifest mutations (field damage and random byte noise) and file damage."""
    doc = json.loads((good / "manifest.json").read_text())
    raw = (good / "manifest.json").read_bytes()
    out = []

    def copy(tag: str) -> Path:
        dst = tmp / f"bad_{tag}"
        shutil.copytree(good, dst)
        out.append(dst)
        return dst

    for key, value in [("n_layers", 100000), ("dim", 1 << 20), ("vocab", 0), ("head_dim", 1), ("rope_dim", 7),
                       ("n_kv_heads", 5), ("layer_ffn", ["moe"]), ("moe", {"n_experts": 8})]:
        d = json.loads(json.dumps(doc))
        d["model"][key] = value
        (copy(f"model_{key}") / "manifest.json").write_text(json.dumps(d))
    for i, change in enumerate([{"offset": 1 << 40}, {"nbytes": 3}, {"shape": [0]}, {"dtype": "q9"},
                                {"offset": 63}, {"file": "../trunk.bin"}]):
        d = json.loads(json.dumps(doc))
        d["tensors"][1].update(change)
        (copy(f"tensor_{i}") / "manifest.json").write_text(json.dumps(d))
    c = copy("bank_truncated")
    bank = c / doc["expert_banks"][0]["file"]
    bank.write_bytes(bank.read_bytes()[:5000])
    c = copy("bank_header")
    bank = c / doc["expert_banks"][0]["file"]
    data = bytearray(bank.read_bytes())
    data[20] ^= 0xFF
    bank.write_bytes(bytes(data))
    c = copy("bank_fifo")      # never waited on (opened non-blocking, refused after fstat)
    (c / doc["expert_banks"][0]["file"]).unlink()
    os.mkfifo(c / doc["expert_banks"][0]["file"])
    c = copy("trunk_folder")
    (c / "trunk.bin").unlink()
    (c / "trunk.bin").mkdir()
    rng = np.random.default_rng(3)
    for i in range(n_random):
        data = bytearray(raw)
        for _ in range(rng.integers(1, 6)):
            data[rng.integers(len(data))] = rng.integers(32, 127)
        (copy(f"noise_{i}") / "manifest.json").write_bytes(bytes(data[:rng.integers(len(data) // 2, len(data) + 1)]
                                                                if i % 3 == 0 else data))
    return out


@pytest.mark.slow   # the whole core compiled with the sanitizers: about a minute of CPU
def test_c_core_under_sanitizers(tiny_moe, tmp_path, tmp_path_factory):
    exe = build(tmp_path_factory, tmp_path)
    bad = damaged_copies(tiny_moe[1], tmp_path)
    res = subprocess.run([str(exe), str(tiny_moe[1]), *map(str, bad)], capture_output=True, text=True,
                         timeout=600, env={"ASAN_OPTIONS": "detect_leaks=1:abort_on_error=1",
                                           "UBSAN_OPTIONS": "print_stacktrace=1"})
    assert res.returncode == 0, res.stdout + res.stderr
    last = res.stdout.strip().splitlines()[-1]
    assert last.endswith(" 0 failed") and int(last.split()[0]) > 100, last
