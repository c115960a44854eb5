"""The expert-cache policy: its C unit tests under ASan/UBSan, the Python
wrapper on the real OLMoE routing trace, and a brute-force proof on tiny
traces that the C OPT is optimal under the pinning rule."""
from __future__ import annotations

import functools
import importlib.util
import itertools
import json
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest
from cffi import FFI

from app.engine import cachesim
from core_c import build_ferry
from tests import cbuild
from tests.conftest import REPO

CORE = REPO / "core_c"
TRACE = Path("/work/shared/data/traces/olmoe-1b-7b_299tok.jsonl")
EXPERTS = 64
# Engine-policy hit rate / OPT measured on the full trace, cold (docs/CACHE_POLICY.md),
# minus a 0.01 margin. The 0.90 target is not reached; these pin what is.
ENGINE_RATIO_FLOOR = {61: 0.761, 128: 0.775, 256: 0.815}
#: The simulator and the policies it replays: the engine's (cache_policy.c) and the others.
CACHE_SOURCES = [CORE / "src" / f for f in ("cachesim.c", "cache_policy.c", "cachesim_policies.c")]


def build_private_lib(tmpdir: Path):
    """(ffi, lib) of ferry_cachesim.h alone, compiled with cffi in API mode
    into tmpdir: the tests' stand-in for app.engine._ferry_c."""
    ffi = FFI()
    ffi.cdef(build_ferry.cdef_text(CORE / "include" / "ferry_cachesim.h"))
    ffi.set_source("_ferry_cachesim_private", '#include "ferry_cachesim.h"',
                   sources=[str(f) for f in CACHE_SOURCES],
                   include_dirs=[str(CORE / "include")],
                   extra_compile_args=build_ferry.compile_args())
    path = ffi.compile(tmpdir=str(tmpdir))
    spec = importlib.util.spec_from_file_location("_ferry_cachesim_private", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.ffi, module.lib


@pytest.fixture(scope="session")
def lib(tmp_path_factory):
    return build_private_lib(tmp_path_factory.mktemp("cachesim"))


@pytest.fixture(scope="session")
def trace():
    return cachesim.load_trace(TRACE)


def test_c_unit_tests_pass_under_sanitizers(tmp_path, tmp_path_factory):
    sources = [CORE / "tests" / "test_cache_policy.c", *CACHE_SOURCES]
    exe = cbuild.program(tmp_path_factory, tmp_path / "test_cache_policy", cbuild.host_cc(), cbuild.SANITIZE, sources)
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=60)
    last = run.stdout.strip().splitlines()[-1]
    assert run.returncode == 0, run.stdout + run.stderr
    assert re.fullmatch(r"\d+ passed, 0 failed", last), run.stdout


def test_real_trace_shape(trace):
    assert trace.shape == (299, 16, 8) and trace.dtype == np.int32
    assert trace.min() >= 0 and trace.max() < EXPERTS


@pytest.mark.parametrize("slots", sorted(ENGINE_RATIO_FLOOR))
def test_engine_policy_fraction_of_opt(trace, lib, slots):
    r = cachesim.simulate(trace, EXPERTS, slots, "engine", lib=lib)
    assert r["policy"] == "transit"
    assert r["ratio_to_opt"] >= ENGINE_RATIO_FLOOR[slots]
    assert r["hit_rate"] > r["lru_hit_rate"]


@pytest.mark.parametrize("slots", (32, 61, 128, 256, 512))
def test_engine_policy_beats_echo_on_the_held_out_half(trace, lib, slots):
    """transit was chosen on tokens 0-148; on tokens 149-298, replayed cold,
    it must gain over echo (the previous engine policy) at the small sizes
    and not lose more than 0.1 point at 512 slots, where it measured 0.06
    points below (docs/CACHE_POLICY.md, issue 17)."""
    held_out = trace[trace.shape[0] // 2:]
    new = cachesim.simulate(held_out, EXPERTS, slots, "engine", lib=lib)["hit_rate"]
    old = cachesim.simulate(held_out, EXPERTS, slots, "echo", lib=lib)["hit_rate"]
    if slots <= 256:
        assert new >= old + 0.005
    else:
        assert new >= old - 0.001


def test_opt_bounds_every_policy_at_every_size(trace, lib):
    for slots in (8, 32, 61, 128, 256, 512, 1024):
        for name in cachesim.policy_names(lib):
            r = cachesim.simulate(trace, EXPERTS, slots, name, lib=lib)
            assert 0.0 <= r["hit_rate"] <= r["opt_hit_rate"] <= 1.0, (slots, name)
            assert r["hits"] + r["misses"] == r["requests"] == trace.size
    # The whole expert set fits: every policy misses exactly the cold misses.
    distinct = np.count_nonzero(cachesim.usage_counts(trace, EXPERTS))
    full = cachesim.simulate(trace, EXPERTS, 16 * EXPERTS, "engine", lib=lib)
    assert full["misses"] == distinct and full["hit_rate"] == full["opt_hit_rate"]


def test_horizon_reference_agrees_with_the_c_opt_and_bounds_the_target(trace, lib):
    """bench/cache_policy.py's horizon oracle (an independent Python Belady)
    gives the C OPT's hit rate with an unlimited horizon, and a cache that
    knows the next token's whole routing still stays below 0.90 of OPT at
    25 % of the expert set (0.83 measured; docs/CACHE_POLICY.md)."""
    from bench.cache_policy import horizon_hit_rate

    for slots in (61, 256):
        opt = cachesim.simulate(trace, EXPERTS, slots, "lru", lib=lib)["opt_hit_rate"]
        assert horizon_hit_rate(trace, slots, None) == pytest.approx(opt, abs=1e-12)
    opt = horizon_hit_rate(trace, 256, None)
    rates = [horizon_hit_rate(trace, 256, h) for h in (1, 2, 8)]
    assert rates == sorted(rates) and rates[-1] <= opt
    assert 0.80 <= rates[0] / opt <= 0.86


def test_warm_prior_from_first_half_evaluated_on_second_half(trace, lib):
    half = len(trace) // 2  # tokens 0-148 teach the hot list, 149-298 are replayed
    first, second = trace[:half], trace[half:]
    prior = cachesim.usage_counts(first, EXPERTS)
    assert prior.sum() == first.size
    for slots in (61, 128, 256):
        cold = cachesim.simulate(second, EXPERTS, slots, "engine", lib=lib)
        warm = cachesim.simulate(second, EXPERTS, slots, "engine", prior=prior, lib=lib)
        assert warm["opt_hit_rate"] == cold["opt_hit_rate"]
        assert warm["hit_rate"] >= cold["hit_rate"] - 0.01


@pytest.mark.parametrize("slots", (32, 61, 96, 128, 256))
def test_learned_state_from_the_other_half_beats_a_cold_start(trace, lib, slots):
    """A session that starts from the learned state an earlier session saved
    (fe_cache_policy_save_state: counts, reuse table, successor counts; not
    the cache's contents) gains on the engine policy at the small sizes, in
    both directions: learn on one token half, replay the other with an empty
    cache (docs/CACHE_POLICY.md, "Learned state across sessions"). Measured
    gains are 0.2-2.1 points; the floor is half a point below the smallest
    at each size."""
    half = len(trace) // 2
    for first, second in ((trace[:half], trace[half:]), (trace[half:], trace[:half])):
        both = np.concatenate([first, second])
        cold = cachesim.simulate(second, EXPERTS, slots, "engine", lib=lib)
        warm = cachesim.simulate(both, EXPERTS, slots, "engine", lib=lib, learn_tokens=len(first))
        assert warm["opt_hit_rate"] == cold["opt_hit_rate"]
        assert warm["requests"] == second.size
        assert warm["hit_rate"] >= cold["hit_rate"] - 0.003
        if slots >= 61:
            assert warm["hit_rate"] >= cold["hit_rate"] + 0.004


def test_bad_arguments_are_rejected_with_messages(trace, lib):
    bad = trace[:3].copy()
    bad[1, 2, 0] = 64
    with pytest.raises(ValueError, match=r"token 1 layer 2: expert id 64 out of range \[0, 64\)"):
        cachesim.simulate(bad, EXPERTS, 61, lib=lib)
    bad[1, 2, 0] = bad[1, 2, 1]
    with pytest.raises(ValueError, match="requested twice"):
        cachesim.simulate(bad, EXPERTS, 61, lib=lib)
    with pytest.raises(ValueError, match=r"n_slots \(7\) must be >= top_k \(8\)"):
        cachesim.simulate(trace, EXPERTS, 7, lib=lib)
    with pytest.raises(ValueError, match="unknown policy 'mru'"):
        cachesim.simulate(trace, EXPERTS, 61, "mru", lib=lib)
    with pytest.raises(ValueError, match="prior must hold 16 x 64 counts"):
        cachesim.simulate(trace, EXPERTS, 61, prior=np.zeros(5, np.uint32), lib=lib)
    with pytest.raises(ValueError, match="trace must be a non-empty"):
        cachesim.simulate(trace[0], EXPERTS, 61, lib=lib)
    with pytest.raises(ValueError, match=r"experts_per_layer \(4\) must be >= top_k \(8\)"):
        cachesim.simulate(trace, 4, 61, lib=lib)
    with pytest.raises(ValueError, match=r"learn_tokens must be in \[1, 299\), got 299"):
        cachesim.simulate(trace, EXPERTS, 61, learn_tokens=299, lib=lib)
    with pytest.raises(ValueError, match="either a prior hot list or learn_tokens"):
        cachesim.simulate(trace, EXPERTS, 61, prior=cachesim.usage_counts(trace, EXPERTS),
                          learn_tokens=10, lib=lib)


@pytest.mark.parametrize("text, message", [
    ('{"tok": 1, "layers": [[1, 2]]}\n{"tok": 2, "layers": [[1, 2]\n', r":2: not JSON"),
    ('{"tok": 1, "layers": [[1, 2]]}\n{"tok": 2, "layers": [[1, 2, 3]]}\n', r":2: shape 1x3 differs"),
    ('{"tok": 1, "layers": [[1, 2], [3]]}\n', r":1: every layer must list the same"),
    ('{"tok": 1, "layers": [[1, -2]]}\n', r":1: layer 0: expert ids must be non-negative"),
    ('{"tok": 1, "layers": [[1, 2.5]]}\n', r":1: layer 0: expert ids"),
    ('[1, 2]\n', r":1: 'layers' must be"),
    ('\n', r"no tokens"),
])
def test_load_trace_names_the_bad_line(tmp_path, text, message):
    path = tmp_path / "t.jsonl"
    path.write_text(text)
    with pytest.raises(ValueError, match=message):
        cachesim.load_trace(path)


def test_cli_prints_json_and_text(lib, capsys, tmp_path):
    args = ["--trace", str(TRACE), "--experts-per-layer", "64", "--slots", "128"]
    assert cachesim.main([*args, "--json"], lib=lib) == 0
    r = json.loads(capsys.readouterr().out)
    assert {"hit_rate", "lru_hit_rate", "opt_hit_rate", "hits", "misses", "requests", "policy",
            "slots", "ratio_to_opt", "prior_tokens"} <= r.keys()
    assert cachesim.main([*args, "--policy", "lru", "--prior-tokens", "150"], lib=lib) == 0
    assert "lru with 128 slots, warm (hot list) from the first 150 tokens: hit rate" in capsys.readouterr().out
    assert cachesim.main([*args, "--prior-tokens", "149", "--learned", "--json"], lib=lib) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["learned"] and r["requests"] == 150 * 16 * 8 and r["policy"] == "transit"
    assert r["hit_rate"] == cachesim.simulate(cachesim.load_trace(TRACE), EXPERTS, 128, lib=lib,
                                              learn_tokens=149)["hit_rate"]
    assert cachesim.main([*args, "--learned"], lib=lib) == 2
    assert "--learned needs --prior-tokens" in capsys.readouterr().err
    (tmp_path / "bad.jsonl").write_text("{")
    assert cachesim.main(["--trace", str(tmp_path / "bad.jsonl"), "--experts-per-layer", "64",
                          "--slots", "8"], lib=lib) == 2
    assert "bad.jsonl:1: not JSON" in capsys.readouterr().err


def brute_force_best_hits(trace: np.ndarray, n_slots: int) -> int:
    """Most hits any eviction schedule reaches when a layer's set is pinned
    and a miss must be inserted: exhaustive search over every choice of
    victims at every visit."""
    n_tokens, n_layers, _ = trace.shape
    visits = [frozenset((layer, int(e)) for e in trace[t, layer])
              for t in range(n_tokens) for layer in range(n_layers)]

    @functools.lru_cache(maxsize=None)
    def best(v: int, resident: frozenset) -> int:
        if v == len(visits):
            return 0
        want = visits[v]
        need = max(0, len(resident | want) - n_slots)
        evictable = sorted(resident - want)
        return len(want & resident) + max(best(v + 1, (resident - set(drop)) | want)
                                          for drop in itertools.combinations(evictable, need))

    return best(0, frozenset())


def test_opt_is_optimal_on_tiny_traces_by_exhaustive_search(lib):
    rng = np.random.default_rng(20240601)
    for _ in range(120):
        n_layers, n_experts = int(rng.integers(1, 4)), int(rng.integers(3, 7))
        top_k = int(rng.integers(1, min(3, n_experts) + 1))
        n_slots, n_tokens = top_k + int(rng.integers(0, 4)), int(rng.integers(2, 6))
        weights = rng.dirichlet(np.ones(n_experts) * 0.7)
        trace = np.array([[rng.choice(n_experts, top_k, replace=False, p=weights)
                           for _ in range(n_layers)] for _ in range(n_tokens)], dtype=np.int32)
        r = cachesim.simulate(trace, n_experts, n_slots, "lru", lib=lib)
        best = brute_force_best_hits(trace, n_slots)
        assert round(r["opt_hit_rate"] * r["requests"]) == best, (trace.tolist(), n_slots)
        for name in cachesim.policy_names(lib):
            online = cachesim.simulate(trace, n_experts, n_slots, name, lib=lib)
            assert online["hits"] <= best


@pytest.mark.parametrize("shape", [(3, 70, 9), (5, 64, 5), (2, 1, 1)])
def test_every_policy_counts_the_memory_it_allocates(shape):
    """ferry_cache_policy_bytes is what each policy's constructor allocates (the
    constructor refuses to run on a mismatch, so a replay succeeding proves it);
    every policy has state, and TRANSIT's successor table is most of its own."""
    layers, experts, slots = shape
    trace = np.random.default_rng(5).permuted(
        np.tile(np.arange(experts, dtype=np.int32), (40, layers, 1)), axis=2)[:, :, :1]
    names = cachesim.policy_names()
    sizes = {name: cachesim.policy_bytes(layers, experts, slots, name) for name in names}
    for name in names:
        assert sizes[name] > 0, name
        assert 0 <= cachesim.simulate(trace, experts, slots, name)["hit_rate"] <= 1
    assert sizes["engine"] == sizes["transit"]
    table = layers * experts * experts * 2
    assert sizes["transit"] - sizes["echo"] >= table
    assert sizes["echo"] > sizes["reuse"] > sizes["lru"]
    # more slots, more state; arguments the constructor refuses count nothing
    assert cachesim.policy_bytes(layers, experts, slots + 1, "lru") > sizes["lru"]
    assert cachesim.policy_bytes(layers, experts, 0) == 0


def test_bounds_noisy_predictor_reaches_the_one_token_oracle_at_full_accuracy(trace):
    """bench/cache_bounds.py: the p/d rule fed the next token's true sets
    (accuracy 1) is the one-token oracle of bench/cache_policy.py to within
    tie-breaking, stays under OPT, and loses hits as the predictor gets
    noisier; a first-order successor table fitted on the evaluated tokens
    (a cheating bound) beats the same table learned online."""
    from bench import cache_bounds
    from bench.cache_policy import horizon_hit_rate

    part = trace[:80]
    sets = cache_bounds.sets_of(part)
    rates = [cache_bounds.replay(part, 61, cache_bounds.noisy_prob(sets, a, np.random.default_rng(0)), EXPERTS)
             for a in (0.3, 0.7, 1.0)]
    assert rates == sorted(rates)
    assert rates[-1] == pytest.approx(horizon_hit_rate(part, 61, 1), abs=0.005)
    assert rates[-1] <= horizon_hit_rate(part, 61, None)
    online = cache_bounds.replay(part, 61, cache_bounds.markov_prob(sets, 16, online=True), EXPERTS)
    fitted = cache_bounds.replay(part, 61, cache_bounds.markov_prob(sets, 16, online=False), EXPERTS)
    assert online < fitted < rates[-1]


def test_the_speed_models_hit_curve_is_the_engine_policy_on_the_trace(trace):
    """app.engine.speed.HIT_CURVE (the hit rate `ferry get --plan` and the
    catalogue expect, by the cache's size in token working sets) is the
    engine's policy replayed cold on the real OLMoE trace, to 0.001."""
    from app.engine.speed import HIT_CURVE

    working_set = trace.shape[1] * trace.shape[2]
    for ratio, hit in HIT_CURVE:
        slots = round(ratio * working_set)
        got = cachesim.simulate(trace, EXPERTS, slots)["hit_rate"] if slots else 0.0
        assert got == pytest.approx(hit, abs=0.001), (ratio, got)

