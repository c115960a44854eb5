"""bench/vs_llamacpp_moe.py's bookkeeping: where two engines' greedy tokens
first differ (and how close a call it was there), and the medians and
ratios it reports, failed runs (an OOM-killed llama.cpp) counted apart."""
from __future__ import annotations

import sys

import pytest

from tests.conftest import REPO

sys.path.insert(0, str(REPO))
from bench import vs_llamacpp_moe as moe  # noqa: E402


def test_crosscheck_finds_the_first_difference_and_its_gaps():
    ferry = {"tokens": [5, 6, 7, 8], "margins": [1.0, 0.5, 0.01, 2.0]}
    llama = {"tokens": [5, 6, 9, 9], "margins": [1.1, 0.4, 0.02, 0.3]}
    out = moe.crosscheck(ferry, llama)
    assert out["agree"] is False and out["first_difference"] == 2
    assert out["gap_there"] == {"ferry": 0.01, "llama_cpp": 0.02}
    same = moe.crosscheck(ferry, dict(llama, tokens=[5, 6, 7, 8]))
    assert same["agree"] is True and same["first_difference"] is None
    assert "error" in moe.crosscheck({"error": "killed"}, llama)


def _run(setting, engine, decode, prompt=10.0, error=False):
    if error:
        return {"setting": setting, "engine": engine, "error": "llama_cpp child killed by signal 9"}
    return {"setting": setting, "engine": engine, "decode_tok_s": decode, "prompt_tok_s": prompt,
            "decode_disk_bytes_per_token": 1000.0, "peak_rss_bytes": 5, "memory": {"peak_bytes": 7}}


def test_summary_medians_ratios_and_failures():
    runs = [_run("limit_0.5", "ferry", 10.0), _run("limit_0.5", "ferry", 12.0), _run("limit_0.5", "ferry", 11.0),
            _run("limit_0.5", "llama_cpp", 0, error=True), _run("limit_0.5", "llama_cpp_mmap", 2.0),
            _run("limit_0.5", "llama_cpp_mmap", 4.0, prompt=20.0)]
    out = moe.summarize(runs)["limit_0.5"]
    assert out["median"]["ferry"]["decode_tok_s"] == 11.0
    assert out["median"]["ferry"]["cgroup_peak_bytes"] == 7
    assert out["median"]["llama_cpp"] == {"runs": 1, "failed": 1}
    assert out["ratios"]["ferry_over_llama_cpp_mmap"]["decode_tok_s"] == pytest.approx(11.0 / 3.0)
    assert out["ratios"]["ferry_over_llama_cpp_mmap"]["prompt_tok_s"] == pytest.approx(10.0 / 15.0)
    assert "ferry_over_llama_cpp" not in out["ratios"]


def test_summary_ferry_beyond_ram_over_its_own_in_ram():
    runs = [dict(_run(setting, "ferry", decode), round=r)
            for r, setting, decode in ((1, "in_ram", 20.0), (1, "limit_0.5", 18.0), (2, "limit_0.5", 9.0),
                                       (2, "in_ram", 10.0), (3, "in_ram", 16.0))]
    out = moe.summarize(runs)
    assert out["limit_0.5"]["ratios"]["ferry_decode_over_in_ram"] == pytest.approx(13.5 / 16.0)
    assert out["limit_0.5"]["ratios"]["ferry_decode_over_in_ram_by_round"] == pytest.approx([0.9, 0.9])
    assert "ferry_decode_over_in_ram" not in out["in_ram"]["ratios"]


def test_the_llama_cpp_child_imports_nothing_of_ferry():
    """llama.cpp's child runs in the bench venv, which has none of Ferry's
    dependencies: importing the script must not pull in the app (it once did,
    through bench/convert.py, and every llama.cpp run failed on `tokenizers`)."""
    import subprocess

    code = ("import sys; sys.path.insert(0, %r); import bench.vs_llamacpp_moe; "
            "print(sorted(m for m in sys.modules if m == 'app' or m.startswith('app.')"
            " or m in ('tokenizers', 'numpy')))" % str(REPO))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_memory_bound_is_each_engines_decode_over_read_per_bytes():
    summary = moe.summarize([_run("in_ram", "ferry", 12.0), _run("in_ram", "llama_cpp", 8.0)])
    out = moe.memory_bound(summary["in_ram"]["median"], 24.0, {"total": 600_000_000})
    assert out["decode_tok_s_bound"] == pytest.approx(40.0)
    assert out["decode_share"] == {"ferry": pytest.approx(0.3), "llama_cpp": pytest.approx(0.2)}
