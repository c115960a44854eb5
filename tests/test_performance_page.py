"""docs/PERFORMANCE.md is what bench/performance.py writes from bench/results/, and a recorded
bench run becomes rows with its command, machine, date and load."""
import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Loaded from its file, not by putting bench/ on sys.path for every test after this one (a bench
# script named like a package, as bench/kernels.py was, would shadow it: transformers imports `kernels`).
_spec = importlib.util.spec_from_file_location("ferry_bench_performance", ROOT / "bench" / "performance.py")
performance = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(performance)


def test_page_is_rendered_from_the_results():
    assert (ROOT / "docs" / "PERFORMANCE.md").read_text() == performance.render(), \
        "docs/PERFORMANCE.md is stale: run python bench/performance.py render"


def test_every_result_names_command_machine_date_and_load():
    files = sorted((ROOT / "bench" / "results").glob("*.json"))
    assert files
    for p in files:
        e = json.loads(p.read_text())
        assert e["bench"] == p.stem
        for key in ("command", "machine", "date", "load"):
            assert e.get(key), f"{p.name} has no {key}"
        assert performance.rows_of(e), f"{p.name} gives no rows"


def test_record_and_render_a_vs_llamacpp_run(tmp_path, monkeypatch):
    monkeypatch.setattr(performance, "RESULTS", tmp_path)
    speeds = {"decode_tok_s": 30.0, "prompt128_tok_s": 120.0, "prompt1024_tok_s": 110.0}
    # the shape bench/vs_llamacpp.py --json writes: each file's medians per engine and the ratios
    out = {"files": {"1b-q4_k_m": {"median": {"ferry": speeds},
                                   "ferry_over_llama_cpp": {"decode_tok_s": 1.25, "prompt128_tok_s": 1.04,
                                                            "prompt1024_tok_s": 0.981, "ttft_s": 1.1,
                                                            "peak_rss_bytes": 0.6}}}}
    path = performance.record("vs_llamacpp", "python bench/vs_llamacpp.py --json", out)
    entry = json.loads(path.read_text())
    assert entry["machine"] and entry["date"].endswith("UTC") and "min" in entry["load"]
    page = performance.render(tmp_path)
    assert "`python bench/vs_llamacpp.py --json`" in page
    assert "| 1b-q4_k_m: Ferry / llama.cpp, decode / prompt 128 / prompt 1,024 | " \
           "1.25x / 1.04x / 0.98x (Ferry 30.0 / 120.0 / 110.0 tok/s) |" in page


def test_a_bench_without_an_extractor_lists_its_numbers(tmp_path, monkeypatch):
    monkeypatch.setattr(performance, "RESULTS", tmp_path)
    performance.record("stream", "python bench/stream.py --json", {"tok_s": 11.5, "run": {"hit_rate": 0.4}})
    page = performance.render(tmp_path)
    assert "| tok_s | 11.5 |" in page and "| run.hit_rate | 0.4 |" in page


def test_the_decode_share_row_says_how_the_read_was_measured():
    bound = {"decode_share": {"ferry": 0.62, "llama_cpp": 0.4}, "weight_bytes_per_token": 700e6,
             "memory_read_gb_s": 24.0}
    old = {"files": {"1b": {"memory_bound": bound}}}
    new = {"files": {"1b": {"memory_bound": {**bound, "decode_share_rounds": {"ferry": [0.6, 0.62, 0.7]}}}},
           "memory_read_gb_s": {"min": 22.5, "max": 26.0}}
    (row_old,), (row_new,) = performance.rows_memory_bound(old), performance.rows_memory_bound(new)
    assert row_old["value"] == row_new["value"] == "1b 62% / 40% (700 MB a token, 24.0 GB/s)"
    assert "best of the reads before and after" in row_old["figure"]
    assert "probed beside it (probes 22.5-26.0 GB/s)" in row_new["figure"]
    assert performance.rows_memory_bound({"files": {"1b": {}}}) == []
