"""bench/attention.py builds against the core's kernel sources and reports every kernel set this CPU runs."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_attention_bench_reports_every_set():
    if not (shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")):
        pytest.skip("needs a C compiler")
    res = subprocess.run([sys.executable, str(ROOT / "bench" / "attention.py"), "--positions", "40",
                          "--head-dim", "24", "--queries", "3", "--reps", "2", "--json"],
                         capture_output=True, text=True, timeout=600, check=True)
    out = json.loads(res.stdout)
    (run,) = out["runs"]
    assert (run["positions"], run["head_dim"], run["queries"]) == (40, 24, 3)
    assert "scalar" in run["sets"]
    for name, states in run["sets"].items():
        for state in ("cached", "cold"):
            r = states[state]
            assert r["scores_gmacs"] > 0 and r["wsum_gmacs"] > 0 and r["softmax_ns_per_value"] > 0, (name, state)
