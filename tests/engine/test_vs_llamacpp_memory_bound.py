"""bench/vs_llamacpp.py's memory-bandwidth bound of decode (dense and --moe):
the weight bytes a decoded token reads (counted from the GGUF, checked
against what Ferry's decode products read and the embedding row it looks
up) and each engine's share of the bound, the KV cache counted apart."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from tests.conftest import REPO


def _bench():
    spec = importlib.util.spec_from_file_location("vs_llamacpp_under_test", REPO / "bench" / "vs_llamacpp.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _decode_matmul_bytes(container) -> float:
    from app.engine.binding import Engine
    with Engine(container, threads=1) as eng:
        s = eng.session(64)
        s.eval([1, 2, 3])
        s.set_profiling(True)
        for tok in (4, 5):
            s.eval([tok])
        dec = s.profile()["decode"]
        s.close()
    return sum(m["bytes"] for m in dec["matmul"].values()) / dec["tokens"]


def test_dense_weight_bytes_per_token_are_what_ferrys_decode_reads(tmp_path):
    """Every matrix once with the output head (what Ferry's products read a
    token), plus the token's embedding row and the norms; the KV values per
    position from the tiny shape (2 layers x K and V x 2 KV heads of 64)."""
    from app.convert.convert import convert
    from app.convert.gguf_file import GGUFFile

    vs = _bench()
    make = importlib.util.spec_from_file_location("make_gguf_llama_under_test", REPO / "bench" / "make_gguf_llama.py")
    mk = importlib.util.module_from_spec(make)
    make.loader.exec_module(mk)
    gguf = mk.write(tmp_path / "tiny.gguf", "tiny", "q4_k_m")
    got = vs.weight_bytes_per_token(gguf)
    g = GGUFFile(gguf)
    emb = g.tensors["token_embd.weight"]
    assert got["embedding_row"] == emb.nbytes // emb.dims[1] > 0
    assert got["vectors"] == (2 * 2 + 1) * 256 * 4          # attn_norm, ffn_norm a layer, output_norm: f32
    assert got["kv_values_per_position"] == 2 * 2 * 2 * 64
    assert got["total"] == got["matrices"] + got["embedding_row"] + got["vectors"]
    assert got["matrices"] == _decode_matmul_bytes(convert(gguf, tmp_path / "tiny.ferry"))


def test_moe_weight_bytes_count_top_k_of_each_expert_tensor(tmp_path):
    """Top-k of n experts of each stacked tensor, no token embedding matrix:
    what Ferry's decode products read a token."""
    from app.convert.convert import convert

    vs = _bench()
    spec = importlib.util.spec_from_file_location("make_gguf_moe_under_test", REPO / "bench" / "make_gguf_moe.py")
    mk = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mk)
    gguf = mk.write(tmp_path / "tiny.gguf", "q4_0", size="tiny")
    assert vs.weight_bytes_per_token(gguf)["matrices"] == _decode_matmul_bytes(convert(gguf, tmp_path / "tiny.ferry"))


def test_tied_output_counts_the_embedding_as_the_head_and_its_row(demo_gguf, demo_container):
    """The demo's output shares the token embedding: the head reads the whole
    matrix (in `matrices`, as Ferry's products do) and the lookup its row."""
    vs = _bench()
    got = vs.weight_bytes_per_token(demo_gguf)
    assert got["matrices"] == _decode_matmul_bytes(demo_container)
    assert got["embedding_row"] > 0 and got["total"] > got["matrices"]


def test_memory_bound_shares_with_and_without_the_kv_cache():
    vs = _bench()
    weights = {"total": 600_000_000, "kv_values_per_position": 1000}
    medians = {"ferry": {"decode_tok_s": 12.0}, "llama_cpp": {"decode_tok_s": 8.0}, "failed": {}}
    out = vs.memory_bound(medians, 24.0, weights, context=100)
    assert out["decode_tok_s_bound"] == pytest.approx(40.0)
    assert out["decode_share"] == {"ferry": pytest.approx(0.3), "llama_cpp": pytest.approx(0.2)}
    assert out["kv_bytes_per_token"] == {"ferry": 400_000, "llama_cpp": 200_000}   # f32 / f16 values
    assert out["decode_share_with_kv"]["ferry"] == pytest.approx(12.0 * 600_400_000 / 24e9)
    assert "kv_bytes_per_token" not in vs.memory_bound(medians, 24.0, weights)


def test_an_engine_childs_peak_rss_is_its_own_not_its_parents():
    """Each engine runs in a child process; its peak RSS must be what that child held. ru_maxrss
    survives exec, so a child of a parent holding 581 MB reported 581 MB for both engines on the
    demo (2026-12-06); VmHWM is the child's own (Linux)."""
    import subprocess
    import sys

    held = bytearray(256 << 20)
    held[::4096] = b"\x01" * len(range(0, len(held), 4096))   # make the pages resident
    code = ("import importlib.util, sys; spec = importlib.util.spec_from_file_location('b', sys.argv[1]); "
            "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m); print(m._peak_rss())")
    out = subprocess.run([sys.executable, "-c", code, str(REPO / "bench" / "vs_llamacpp.py")],
                         capture_output=True, text=True, timeout=60, check=True).stdout
    assert held[4096] == 1
    assert 0 < int(out) < 200 << 20


def test_each_round_is_held_against_the_read_probed_beside_it():
    """With rounds, every run's share is its decode against the read probed beside it, and the
    figure is each engine's median over the rounds (not the median decode over one read)."""
    vs = _bench()
    weights = {"total": 1_000_000_000, "kv_values_per_position": 1000}
    rounds = [{"order": ["ferry", "llama_cpp"], "ferry": {"decode_tok_s": 10.0, "read_gb_s": 20.0},
               "llama_cpp": {"decode_tok_s": 8.0, "read_gb_s": 20.0}},
              {"order": ["llama_cpp", "ferry"], "ferry": {"decode_tok_s": 12.0, "read_gb_s": 30.0},
               "llama_cpp": {"decode_tok_s": 6.0, "read_gb_s": 24.0}},
              {"order": ["ferry", "llama_cpp"], "ferry": {"decode_tok_s": 9.0, "read_gb_s": 15.0},
               "llama_cpp": {"error": "killed"}}]
    medians = {"ferry": {"decode_tok_s": 10.0}, "llama_cpp": {"decode_tok_s": 7.0}}
    out = vs.memory_bound(medians, 24.0, weights, context=100, rounds=rounds)
    assert out["decode_share_rounds"] == {"ferry": pytest.approx([0.5, 0.4, 0.6]),
                                          "llama_cpp": pytest.approx([0.4, 0.25])}
    assert out["decode_share"] == {"ferry": pytest.approx(0.5), "llama_cpp": pytest.approx(0.325)}
    assert out["read_gb_s_rounds"]["ferry"] == [20.0, 30.0, 15.0]
    assert out["decode_tok_s_bound"] == pytest.approx(24.0)   # at the figure given (the median probe)
    assert out["decode_share_with_kv"]["ferry"] == pytest.approx(10.0 * 1_000_400_000 / 20e9)


def test_the_probes_beside_a_run_are_the_ones_just_before_and_after_it(monkeypatch, capsys):
    """BesideProbes gives each run the mean of the probe taken before it and the next one (before the
    next run, or the last), and records every probe with what came next."""
    vs = _bench()
    spec = importlib.util.spec_from_file_location("ceiling_under_test", REPO / "bench" / "ceiling.py")
    ceiling = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ceiling)
    figures = iter([20.0, 22.0, 30.0, 33.0, 10.0, 11.0])   # each probe, then its 4-stream comparison

    class Probe:
        def __init__(self, threads):
            self.threads = threads

        def measure(self, streams=1):
            return {"gb_s": next(figures), "cpu_gb_s": 40.0, "seconds": 0.5, "load1": 0.1, "at": "00:00:00"}

        def describe(self):
            return {"threads": self.threads}

    monkeypatch.setattr(ceiling, "ReadProbe", Probe)
    monkeypatch.setitem(__import__("sys").modules, "bench.ceiling", ceiling)
    probes = vs.BesideProbes(2)
    a, b = {}, {}
    probes.take("a")
    probes.beside(a)
    probes.take("b")
    probes.beside(b)
    probes.finish()
    assert a["read_gb_s"] == 25.0 and a["read_gb_s_before_after"] == [20.0, 30.0]
    assert b["read_gb_s"] == 20.0
    rec = probes.record()
    assert [p["before"] for p in rec["probes"]] == ["a", "b", "end"]
    assert rec["median"] == 20.0 and rec["min"] == 10.0 and "2 threads" in rec["method"]
    assert rec["ran_share"] == 0.5   # 20 GB/s by the wall clock against 40 by the threads' CPU time
    assert rec["median_4_streams"] == 22.0 and rec["probes"][0]["gb_s_4_streams"] == 22.0
    assert "ran 50% of the time: a busy machine" in capsys.readouterr().err


def test_the_read_probe_reads_memory_the_way_a_decode_does():
    """bench/ceiling.py's ReadProbe: its default buffer is beyond the last-level cache, a probe
    gives wall and per-thread CPU rates, and its pages are what was asked (2 MiB where the OS gives
    them, as the trunk's fe_alloc_huge; never when refused)."""
    import sys
    spec = importlib.util.spec_from_file_location("ceiling_under_test", REPO / "bench" / "ceiling.py")
    ceiling = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ceiling)
    assert ceiling.probe_bytes() >= max(2**30, 2 * ceiling.llc_bytes())
    probe = ceiling.ReadProbe(2, nbytes=16 << 20, passes=2)
    got = probe.measure()
    assert got["gb_s"] > 0 and got["cpu_gb_s"] > 0 and got["seconds"] > 0
    assert probe.describe()["buffer_bytes"] == 16 << 20 and probe.describe()["streams_per_thread"] == 1
    if sys.platform.startswith("linux"):
        assert ceiling.ReadProbe(1, nbytes=8 << 20, huge=False).huge_page_share == 0.0
        thp = Path("/sys/kernel/mm/transparent_hugepage/enabled")
        if thp.exists() and "[never]" not in thp.read_text():
            assert probe.huge_page_share > 0.5
