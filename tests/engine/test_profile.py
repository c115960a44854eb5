"""The core's per-stage profile (ferry_session_set_profiling / _profile): off
by default, per session, never changing results, and its counters add up."""
from __future__ import annotations

import numpy as np
import pytest

from app.engine.binding import Engine

PROMPT = [1, 520, 3100, 42, 7, 900, 12, 4000, 33, 251]


def _run(path, threads: int, profile: bool):
    with Engine(path, threads=threads, n_ctx=256) as eng:
        s = eng.session(256)
        if profile:
            s.set_profiling(True)
        outs = [s.eval(PROMPT)]
        tok = int(np.argmax(outs[-1]))
        for _ in range(4):
            outs.append(s.eval([tok]))
            tok = int(np.argmax(outs[-1]))
        prof = s.profile()
        trunk = eng.info.trunk_bytes
        s.close()
    return np.stack(outs), prof, trunk


def test_profile_counts_and_never_changes_results(demo_container):
    plain, off, _ = _run(demo_container, 2, False)
    logits, prof, trunk = _run(demo_container, 2, True)
    assert np.array_equal(plain.view(np.uint32), logits.view(np.uint32))  # bit for bit
    assert off["decode"]["tokens"] == 0 and off["decode"]["total_seconds"] == 0.0  # off by default
    dec, pre = prof["decode"], prof["prompt"]
    assert (dec["evals"], dec["tokens"]) == (4, 4)
    assert (pre["evals"], pre["tokens"]) == (1, len(PROMPT))
    for part in (dec, pre):
        assert set(part["matmul"]) == {"q4_1", "q8_0"}  # the demo's trunk formats
        stages = sum(m["seconds"] for m in part["matmul"].values()) + part["attention_seconds"] + \
            part["norm_seconds"] + part["elementwise_seconds"]
        assert 0 < stages <= part["total_seconds"] * 1.0001
        assert 0 <= part["pool_wait_seconds"] < part["total_seconds"]
        assert part["pool_jobs"] > 0 and part["expert_seconds"] == 0.0  # a dense model
    # Every step reads every matrix once (the output matrix only for the last
    # token): bytes per decode step = the trunk's matrices, less the embedding
    # table when it is not the tied output.
    per_step = sum(m["bytes"] for m in dec["matmul"].values()) / 4
    assert 0.5 * trunk < per_step <= trunk


def test_threads_and_profiling_give_the_same_bits(demo_container):
    one, _, _ = _run(demo_container, 1, True)
    three, _, _ = _run(demo_container, 3, False)
    assert np.array_equal(one.view(np.uint32), three.view(np.uint32))


def test_profile_restarts_and_turns_off(demo_container):
    with Engine(demo_container, threads=2, n_ctx=64) as eng:
        s = eng.session(64)
        s.set_profiling(True)
        s.eval(PROMPT[:3])
        assert s.profile()["prompt"]["tokens"] == 3
        s.set_profiling(True)  # restart
        assert s.profile()["prompt"]["tokens"] == 0
        s.eval([5])
        assert s.profile()["decode"]["tokens"] == 1
        s.set_profiling(False)
        s.eval([6])
        p = s.profile()
        assert p["decode"]["tokens"] == 0 and p["decode"]["matmul"] == {}
        s.close()


def test_profile_of_a_moe_model(tiny_moe):
    with Engine(tiny_moe[1], threads=2) as eng:
        s = eng.session(64)
        s.set_profiling(True)
        s.eval([1, 2, 3])
        s.eval([4])
        p = s.profile()
        assert p["prompt"]["expert_seconds"] > 0 and p["decode"]["expert_seconds"] > 0
        for part in (p["prompt"], p["decode"]):
            _check_expert_parts(part, part["evals"] * eng.info.n_moe_layers)
        assert p["decode"]["matmul"]  # the trunk's and the experts' products
        s.close()


def _check_expert_parts(part, moe_layers):
    """expert_seconds = the router's products + the experts' feed-forward +
    read waits + the dispatch's own work, each counted."""
    assert part["moe_layers"] == moe_layers
    assert part["dispatch_seconds"] > 0 and part["expert_ffn_seconds"] > 0 and part["expert_wait_seconds"] >= 0
    parts = part["dispatch_seconds"] + part["expert_ffn_seconds"] + part["expert_wait_seconds"]
    assert parts <= part["expert_seconds"] * 1.0001
    assert part["expert_seconds"] <= part["total_seconds"]


def test_profile_splits_the_expert_dispatch_of_a_kimi_model(tmp_path):
    """The one MoE loop profiles every architecture (K3 here): the dispatch's
    own time, the experts' feed-forward and the read waits of a small
    synchronous cache; profiling never changes the logits."""
    from app.convert.convert import convert
    from tests.kimi import tiny_k3

    tiny_k3.build(tmp_path / "k3")
    path = convert(tmp_path / "k3", tmp_path / "k3.ferry", trunk_format="f32", expert_format="f32")
    out = {}
    for profile in (False, True):
        with Engine(path, threads=2, n_ctx=64, cache_slots=2 * tiny_k3.TOPK, overlap=False,
                    direct_io=False) as eng:
            s = eng.session(64)
            s.set_profiling(profile)
            logits = [s.eval([1, 50, 310, 42, 7, 90])] + [s.eval([t]) for t in (7, 9, 11)]
            out[profile] = (np.stack(logits), s.profile(), s.stats(), eng.info.n_moe_layers)
            s.close()
    assert np.array_equal(out[False][0].view(np.uint32), out[True][0].view(np.uint32))
    prof, stats = out[True][1], out[True][2]
    moe_per_pass = tiny_k3.LAYERS - 1  # layer 0 is dense
    assert out[True][3] == moe_per_pass
    _check_expert_parts(prof["prompt"], moe_per_pass)
    _check_expert_parts(prof["decode"], 3 * moe_per_pass)
    waited = prof["prompt"]["expert_wait_seconds"] + prof["decode"]["expert_wait_seconds"]
    assert stats.misses > 0 and 0 < waited <= stats.stall_seconds * 1.0001


def test_the_dispatch_benchmark_times_the_baseline_where_it_dispatches():
    """bench/stream.py --dispatch compares dispatch_seconds with the commit
    before core_c/src/moe.c, timed by bench/baseline_core.py's insertions:
    each one's anchor is in that revision exactly once."""
    import subprocess

    from bench import baseline_core

    for rel, anchor, replacement in baseline_core._TIMER:
        shown = subprocess.run(["git", "-C", str(baseline_core.ROOT), "show", f"{baseline_core.BASELINE}:{rel}"],
                               capture_output=True, text=True)
        if shown.returncode:
            pytest.skip(f"the baseline revision is not in this checkout ({shown.stderr.strip()})")
        assert shown.stdout.count(anchor) == 1, rel
        assert anchor in replacement  # an insertion: the old code itself stays as it was
