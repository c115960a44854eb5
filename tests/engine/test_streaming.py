"""The streaming engine: the expert cache, direct I/O, overlapped reads and
the lookahead router change speed, never output, in both arithmetic modes
(exact, and the default's 8-bit activations on quantized experts); faults
end an answer, not the session; the RAM budget is a ceiling."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from app.convert.convert import convert
from app.engine.binding import Engine, FerryError
from app.engine.cachesim import policy_bytes
from bench.make_synthetic import make, parse
from tests.conftest import REPO

TOKENS = [int(t) for t in np.random.default_rng(11).integers(3, 500, 40)]


@pytest.fixture(scope="module")
def moe_ckpt(tmp_path_factory):
    root = tmp_path_factory.mktemp("stream")
    return make(parse(["--out", str(root / "ckpt"), "--layers", "6", "--experts", "32", "--top-k", "4",
                       "--shards", "2"]))


@pytest.fixture(scope="module")
def moe_model(moe_ckpt):
    """A Qwen3-MoE-shaped container: 6 MoE layers x 32 experts, top 4, 388 KiB records."""
    return convert(moe_ckpt, moe_ckpt.parent / "moe.ferry")


@pytest.fixture(scope="module")
def moe_q4(moe_ckpt):
    """The same with q4_0 experts: the default's 8-bit activations reach the expert products too."""
    return convert(moe_ckpt, moe_ckpt.parent / "moe-q4.ferry", expert_format="q4_0")


#: The engine's path in each activation mode (ModelInfo.activations).
RUNS = {"exact": "f32", "auto": "q8"}


@pytest.fixture(params=list(RUNS))
def placed(request, moe_model, moe_q4):
    """(container, activations): placement must not change output in either arithmetic; the default's
    8-bit activations on q4_0 experts (and the q8_0 trunk), exact on the bf16 experts."""
    return (moe_model if request.param == "exact" else moe_q4), request.param


def run(container, prompt=TOKENS[:24], steps=TOKENS[24:], **options):
    """Logits of a prompt then single steps, and the session's stats."""
    with Engine(container, threads=2, n_ctx=64, **options) as engine:
        s = engine.session(64)
        out = [s.eval(prompt, all_logits=True)]
        out += [s.eval([t])[None] for t in steps]
        return np.concatenate(out), s.stats(), engine.info


def test_every_mechanism_on_or_off_gives_identical_logits(placed):
    moe_model, activations = placed
    reference, _, info = run(moe_model, cache=False, overlap=False, lookahead=False, direct_io=False,
                             activations=activations)
    assert info.cache_slots == 6 * 32  # no budget: every expert fits
    assert info.activations == RUNS[activations]
    variants = {
        "all on": {},
        "no fill": {"fill": False},
        "small cache (12.5%)": {"cache_slots": 24},
        "tiny cache (one layer's set)": {"cache_slots": 4},
        "no cache": {"cache": False},
        "no overlap": {"overlap": False},
        "no lookahead": {"lookahead": False},
        "lookahead gate off, small cache": {"lookahead_gate": False, "cache_slots": 24},
        "no direct I/O": {"direct_io": False},
        "prompt chunks of 5 tokens": {"prompt_chunk": 5},
        "one reader": {"readers": 1},
    }
    for name, opts in variants.items():
        logits, stats, _ = run(moe_model, activations=activations, **opts)
        assert np.array_equal(logits, reference), name
        assert stats.hits + stats.misses > 0


@pytest.fixture(scope="module")
def moe_q3(moe_ckpt):
    """The same with q3_nl experts (256-value rows: the synthetic's widths)."""
    return convert(moe_ckpt, moe_ckpt.parent / "moe-q3.ferry", expert_format="q3_nl")


@pytest.mark.parametrize("activations", ["exact", "q8"])
def test_q3_nl_experts_placement_never_changes_logits(moe_q3, activations):
    """q3_nl experts in both arithmetics (q8: their integer kernel, kernels_q8.h): the cache, overlap,
    lookahead and one-chunk or token-by-token prefill give the same bits."""
    reference, _, info = run(moe_q3, cache=False, overlap=False, lookahead=False, activations=activations)
    assert info.activations == ("f32" if activations == "exact" else "q8")
    for name, opts in {"all on": {}, "small cache": {"cache_slots": 24}, "no overlap": {"overlap": False},
                       "lookahead gate off, small cache": {"lookahead_gate": False, "cache_slots": 24}}.items():
        logits, _, _ = run(moe_q3, activations=activations, **opts)
        assert np.array_equal(logits, reference), name
    stepwise, _, _ = run(moe_q3, prompt=TOKENS[:1], steps=TOKENS[1:], activations=activations)
    assert np.array_equal(stepwise, reference), "prefill in one chunk against token by token"


def test_chunked_prefill_reads_each_distinct_expert_once(placed):
    moe_model, activations = placed
    _, chunked, _ = run(moe_model, prompt=TOKENS[:32], steps=[], cache=False, activations=activations)
    _, stepwise, _ = run(moe_model, prompt=TOKENS[:1], steps=TOKENS[1:32], cache=False, activations=activations)
    # 32 tokens x 6 layers x 4 experts = 768 uses; a chunk reads at most 32 per layer.
    assert chunked.expert_reads <= 6 * 32 < stepwise.expert_reads == 32 * 6 * 4


def test_a_prompt_chunk_reads_each_distinct_expert_once(moe_model, demo_container):
    """A model with experts takes prompts in chunks of 128 (a dense one, 32) (each expert a chunk routes to is read
    once and multiplied with all its tokens together); smaller chunks read more; the app evaluates a
    prompt a chunk per call (Session.prompt_step); chunks are clamped to 512."""
    _, big, info = run(moe_model, prompt=TOKENS[:40], steps=[], cache=False)
    _, small, small_info = run(moe_model, prompt=TOKENS[:40], steps=[], cache=False, prompt_chunk=8)
    assert (info.prompt_chunk, small_info.prompt_chunk) == (128, 8)
    from app.convert.plan_config import CHUNK, MOE_CHUNK    # `ferry plan --config` plans the same chunks
    assert info.prompt_chunk == MOE_CHUNK
    assert big.expert_reads <= 6 * 32 < small.expert_reads
    with Engine(moe_model, threads=1, n_ctx=64, prompt_chunk=100_000) as engine:
        assert engine.info.prompt_chunk == 512 and engine.session(64).prompt_step == 512
    with Engine(demo_container, threads=1, n_ctx=64) as engine:
        assert engine.info.prompt_chunk == 32 == CHUNK


@pytest.fixture(scope="module")
def correlated_model(tmp_path_factory):
    """The same shape with one router shared by every layer, so routing is
    predictable across layers (as the lookahead needs; random routers are not)."""
    root = tmp_path_factory.mktemp("correlated")
    ckpt = make(parse(["--out", str(root / "ckpt"), "--layers", "6", "--experts", "32", "--top-k", "4",
                       "--same-router"]))
    return convert(ckpt, root / "moe.ferry")


def test_lookahead_reads_only_while_its_guesses_pay(moe_model, correlated_model):
    """Random routers: the lookahead keeps scoring its predictions but stops
    reading them. Correlated routing: it reads them and they are used."""
    _, random_st, _ = run(moe_model, cache_slots=48)
    assert random_st.prefetch_issued < 0.25 * random_st.lookahead_predicted
    reference, _, _ = run(correlated_model, cache=False, lookahead=False)
    logits, st, _ = run(correlated_model, cache_slots=24)
    assert np.array_equal(logits, reference)
    assert st.lookahead_correct / st.lookahead_predicted > 0.5
    assert st.prefetch_used > 0 and st.prefetch_used >= st.prefetch_wasted


def test_lookahead_gate_changes_reads_never_logits(placed):
    """Random routers: the per-(layer, rank) gate leaves most wrong guesses
    unread; reading every guess (the gate off) gives the same logits."""
    moe_model, activations = placed
    reference, _, _ = run(moe_model, cache=False, lookahead=False, activations=activations)
    with Engine(moe_model, threads=2, n_ctx=64, cache_slots=48, activations=activations) as engine:
        s = engine.session(64)
        gated = np.concatenate([s.eval(TOKENS[:24], all_logits=True)] + [s.eval([t])[None] for t in TOKENS[24:]])
        st, gate = s.stats(), engine.lookahead_gate()
    ungated, ust, _ = run(moe_model, cache_slots=48, lookahead_gate=False, activations=activations)
    assert np.array_equal(gated, reference) and np.array_equal(ungated, reference)
    if activations != "exact":
        return   # the gate's figures below are checked once, on the exact run's container (bf16 records)
    # each decode step's lookahead of every MoE layer but the first ran or was skipped as idle (predicting
    # (layer, rank)s whose gate is closed and in-RAM experts only); ungated, each had cold guesses to read
    assert st.lookahead_predicted + 4 * st.lookahead_skipped == ust.lookahead_predicted == 16 * 5 * 4
    assert st.prefetch_gated > 0 and ust.prefetch_gated == 0
    assert ust.prefetch_issued > st.prefetch_issued
    assert st.prefetch_used / st.prefetch_issued > ust.prefetch_used / ust.prefetch_issued  # what it reads pays more often
    assert gate.shape == (6, 4)
    assert np.all(gate[0] == np.float32(0.4))  # the first MoE layer is never predicted: its prior
    assert gate[1:].min() < 0.5  # some layer and rank closed


def _route_every_token_alike(container_dir):
    """Zero every router of a synthetic checkpoint in place: equal logits, so
    every token of every layer chooses experts 0..k-1 and the next layer's
    lookahead is always right."""
    import glob
    import struct
    for path in glob.glob(str(container_dir / "*.safetensors")):
        with open(path, "r+b") as f:
            size = struct.unpack("<Q", f.read(8))[0]
            header = json.loads(f.read(size))
            for name, meta in header.items():
                if name.endswith("mlp.gate.weight"):
                    begin, end = meta["data_offsets"]
                    f.seek(8 + size + begin)
                    f.write(bytes(end - begin))


@pytest.fixture(scope="module")
def alike(tmp_path_factory):
    """A model whose every token routes alike (4 layers x 8 experts, top 2), 24 tokens,
    and the logits of 8 prompt tokens then 16 steps with no cache and no lookahead."""
    root = tmp_path_factory.mktemp("alike")
    ckpt = make(parse(["--out", str(root / "ckpt"), "--layers", "4", "--experts", "8", "--top-k", "2",
                       "--dim", "64", "--expert-ffn", "64", "--vocab", "64", "--shards", "1"]))
    _route_every_token_alike(ckpt)
    model = convert(ckpt, root / "fixed.ferry")
    tokens = [int(t) for t in np.random.default_rng(5).integers(3, 64, 24)]
    return model, tokens, run(model, tokens[:8], tokens[8:], cache=False, lookahead=False)[0]


def test_a_perfectly_predicting_lookahead_keeps_reading(alike):
    """When the lookahead is always right, the gate opens after two steps and
    stays open: its reads are issued and used, and the logits are unchanged."""
    model, tokens, reference = alike
    # 4 cache slots against a working set of 4 layers x 2 experts: every prediction is cold
    with Engine(model, threads=2, n_ctx=64, cache_slots=4) as engine:
        s = engine.session(64)
        logits = np.concatenate([s.eval(tokens[:8], all_logits=True)] + [s.eval([t])[None] for t in tokens[8:]])
        st, gate = s.stats(), engine.lookahead_gate()
    assert np.array_equal(logits, reference)
    assert st.lookahead_correct == st.lookahead_predicted == 16 * 3 * 2
    assert st.prefetch_gated <= 2 * 3 * 2  # held back only until right twice (the first two steps)
    assert st.prefetch_issued > 0 and st.prefetch_used > 0
    assert np.all(gate[1:] > 0.5)  # from the prior towards 1


def test_an_idle_lookahead_runs_only_as_a_probe(alike):
    """Every token routes alike and the cache (smaller than the model, so not
    filled) holds the routed set: each layer's lookahead finds its predictions
    in RAM, so after four such steps it runs only every eighth step (a probe),
    and the logits stay those of no lookahead at all."""
    model, tokens, reference = alike
    logits, st, info = run(model, tokens[:8], tokens[8:], cache_slots=12)
    assert info.cache_slots == 12 and np.array_equal(logits, reference)
    assert st.decode_misses == 0 and st.prefetch_issued == 0
    # 16 steps x 3 predicted layers: each runs at steps 1-4 and the probe at step 12, skips the other 11
    assert st.lookahead_predicted == 5 * 3 * 2 and st.lookahead_skipped == 11 * 3
    # all cold (4 slots for a working set of 8): it never idles
    _, cold, _ = run(model, tokens[:8], tokens[8:], cache_slots=4)
    assert cold.lookahead_skipped == 0 and cold.lookahead_predicted == 16 * 3 * 2


def test_cache_hits_and_lookahead_are_reported(moe_model):
    _, st, info = run(moe_model, cache_slots=48)
    assert info.cache_slots == 48
    assert st.hits > 0 and st.misses > 0 and st.decode_hits + st.decode_misses == 16 * 6 * 4
    # every decode step, every MoE layer but the first: run (4 predictions) or skipped as idle
    assert st.lookahead_predicted + 4 * st.lookahead_skipped == 16 * 5 * 4
    assert 0 < st.lookahead_correct <= st.lookahead_predicted
    assert st.prefetch_issued >= st.prefetch_used + st.prefetch_wasted
    assert st.bytes_read == st.expert_reads * info.expert_bytes


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="getrusage's block reads count direct reads on Linux")
def test_bytes_read_counts_the_unused_lookaheads_reads_too(moe_model):
    """expert_reads / bytes_read are every record read from the disk: a lookahead read that the
    next layer did not use is counted too (they were left out, and bytes per token came out
    below what the process read). Checked against the process's own block reads (direct I/O)."""
    import resource
    tokens = TOKENS[:24] + TOKENS[24:] * 3
    with Engine(moe_model, threads=2, n_ctx=128, cache_slots=24, lookahead_gate=False, direct_io=True,
                embedding_reads=False) as engine:
        if not engine.info.direct_io:
            pytest.skip(f"no direct reads here ({engine.info.io_note})")
        s = engine.session(128)
        s.eval(tokens[:24])
        before, blocks0 = s.stats(), resource.getrusage(resource.RUSAGE_SELF).ru_inblock
        for t in tokens[24:]:
            s.eval([t])
        after, blocks1 = s.stats(), resource.getrusage(resource.RUSAGE_SELF).ru_inblock
        record = engine.info.expert_bytes
    read = after.bytes_read - before.bytes_read
    assert after.prefetch_wasted - before.prefetch_wasted > 20  # unused lookaheads, most of them read
    assert read == (after.expert_reads - before.expert_reads) * record
    # what the process read from the disk meanwhile: these reads, and lookahead reads not yet
    # counted (their records are still in the cache's 24 slots, unused; blocks are 512 bytes).
    # The old accounting left out about 320 records here.
    assert read <= 512 * (blocks1 - blocks0) <= read + 24 * record


def test_a_cache_that_holds_every_expert_is_filled_at_open(moe_model):
    """With no budget every expert fits: the engine streams them all into the cache
    right after opening, so no visit misses; without the fill each first use misses."""
    _, filled, info = run(moe_model)
    assert info.cache_slots == 6 * 32
    assert filled.misses == 0 and filled.hits > 0
    assert filled.lookahead_predicted == 0  # nothing to read ahead: the next layer's router is not run
    _, lazy, _ = run(moe_model, fill=False)
    assert lazy.misses > 0 and lazy.hits + lazy.misses == filled.hits
    assert lazy.lookahead_predicted > 0
    # a cache smaller than the model is not filled: what to keep is the policy's call
    assert run(moe_model, cache_slots=48)[1].misses > 0
    # closing while the fill is still queued takes the queued reads back
    with Engine(moe_model, threads=2, n_ctx=64):
        pass


def test_direct_io_is_detected_and_reported(moe_model, tmp_path):
    info = run(moe_model, steps=[])[2]
    on_tmpfs = subprocess.run(["stat", "-f", "-c", "%T", str(moe_model)], capture_output=True, text=True).stdout
    if "tmpfs" in on_tmpfs:
        assert info.direct_io == 0 and "O_DIRECT" in info.io_note
    else:
        assert info.direct_io == 1, info.io_note
    assert run(moe_model, steps=[], direct_io=False)[2].io_note == "direct I/O was switched off"


def test_read_error_mid_generation_ends_the_answer_and_keeps_the_session(moe_model, tmp_path):
    damaged = tmp_path / "m.ferry"
    shutil.copytree(moe_model, damaged)
    bank = damaged / "experts" / "layer_003.bin"
    whole = bank.read_bytes()
    with Engine(damaged, threads=2, n_ctx=64, cache=False) as engine:
        s = engine.session(64)
        s.eval(TOKENS[:8])
        with open(bank, "r+b") as f:   # the disk loses the bank's tail: reads come back short
            f.truncate(4096 + 3 * (len(whole) - 4096) // 32)
        with pytest.raises(FerryError) as info:
            for t in TOKENS[8:20]:
                s.eval([t])
        assert info.value.code == "FERRY_E_IO" and "layer_003.bin" in info.value.message
        held = s.position
        bank.write_bytes(whole)         # the disk is back
        rest = [s.eval([t]) for t in TOKENS[held:20]]
    reference, _, _ = run(moe_model, prompt=TOKENS[:8], steps=TOKENS[8:20])
    assert np.array_equal(np.stack(rest), reference[held:20])


def test_usage_counts_round_trip(moe_model):
    with Engine(moe_model, n_ctx=64) as engine:
        engine.session(64).eval(TOKENS[:16])
        counts = engine.usage()
    assert counts.shape == (6, 32) and counts.sum() > 0
    with Engine(moe_model, n_ctx=64, usage_counts=counts) as engine:
        assert np.array_equal(engine.usage(), counts)
    with pytest.raises(FerryError, match="usage counts"):
        Engine(moe_model, usage_counts=counts[:3])


def test_policy_state_round_trip_keeps_logits_identical(placed):
    """The cache policy's learned state comes back exactly on the next open
    (with another cache size), changes placement only (identical logits),
    and a damaged one is refused with a clear error."""
    moe_model, activations = placed
    with Engine(moe_model, n_ctx=64, cache_slots=24) as engine:
        engine.session(64).eval(TOKENS[:16])
        state, counts = engine.policy_state(), engine.usage()
    assert len(state) > 6 * 32 * 32 * 2  # TRANSIT's successor counts are in it
    with Engine(moe_model, n_ctx=64, cache_slots=12, policy_state=state) as engine:
        assert engine.policy_state() == state and np.array_equal(engine.usage(), counts)
    cold, _, _ = run(moe_model, cache_slots=12, activations=activations)
    warm, _, _ = run(moe_model, cache_slots=12, policy_state=state, activations=activations)
    assert np.array_equal(cold, warm)
    for damaged in (state[:-1], b"X" + state[1:]):
        with pytest.raises(FerryError, match="cache policy state"):
            Engine(moe_model, policy_state=damaged)


def test_budget_floor_and_refusal(moe_model):
    with Engine(moe_model, n_ctx=64) as engine:
        plan, info = engine.plan(64), engine.info
    # the cache policy's state is a part of the floor, over the minimum cache (top 4)
    assert plan.policy_floor_bytes == policy_bytes(info.n_layers, 32, 4) > 0
    assert plan.floor_bytes == (plan.trunk_bytes + plan.state_bytes + plan.scratch_bytes + 4 * plan.record_bytes
                                + plan.policy_floor_bytes)
    with pytest.raises(FerryError) as refused:
        Engine(moe_model, n_ctx=64, ram_budget=plan.floor_bytes - 1)
    assert refused.value.code == "FERRY_E_BUDGET" and f"({plan.floor_bytes} bytes)" in refused.value.message
    floor_mib = f"{plan.floor_bytes / 2**20:.1f} MiB"   # a small model's floor reads in MiB, not "0.01 GiB"
    assert f"below the floor of {floor_mib}" in refused.value.message
    assert f"cache policy {plan.policy_floor_bytes} bytes" in refused.value.message
    with Engine(moe_model, n_ctx=64, ram_budget=plan.floor_bytes) as engine:
        assert engine.info.cache_slots == 4 and engine.plan(64).total_bytes == plan.floor_bytes
    # 20 records above the minimum need room for the policy's state over them too
    grown = policy_bytes(info.n_layers, 32, 24) - plan.policy_floor_bytes
    assert grown > 0
    budget = plan.floor_bytes + 20 * plan.record_bytes + grown
    for give, slots in ((budget, 24), (budget - 1, 23)):
        with Engine(moe_model, n_ctx=64, ram_budget=give) as engine:
            assert engine.info.cache_slots == slots
            used = engine.plan(64)
            # what the engine allocated for its policy (its constructor checks it against
            # the same count) is what the plan reports, and every part fits the budget
            assert used.policy_bytes == policy_bytes(info.n_layers, 32, slots)
            assert used.expert_bytes == slots * used.record_bytes
            assert used.total_bytes == (used.trunk_bytes + used.state_bytes + used.scratch_bytes
                                        + used.expert_bytes + used.policy_bytes) <= give


RSS_PROBE = """
import json, sys
from pathlib import Path
from app.engine.binding import Engine

def status(key):
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024

budget = int(sys.argv[2])
Path("/proc/self/clear_refs").write_text("5")   # reset the peak (VmHWM) to the current RSS
before = status("VmRSS")
with Engine(sys.argv[1], ram_budget=budget, n_ctx=64, threads=2) as engine:
    s = engine.session(64)
    s.eval(list(range(3, 35)))
    for t in range(40, 72):
        s.eval([t])
    st = s.stats()
peak = status("VmHWM")
print(json.dumps({"before": before, "peak": peak, "reads": st.expert_reads}))
"""


@pytest.mark.skipif(not os.path.exists("/proc/self/clear_refs"), reason="needs Linux /proc to measure peak RSS")
def test_peak_rss_stays_within_the_budget(moe_model):
    model_bytes = sum(p.stat().st_size for p in moe_model.rglob("*.bin"))
    with Engine(moe_model, n_ctx=64) as engine:
        plan = engine.plan(64)
    budget = plan.floor_bytes + 12 * plan.record_bytes      # far below the model's size
    assert budget < model_bytes / 3
    res = subprocess.run([sys.executable, "-c", RSS_PROBE, str(moe_model), str(budget)], capture_output=True,
                         text=True, cwd=REPO, check=True)
    out = json.loads(res.stdout)
    grown = out["peak"] - out["before"]
    print(f"budget {budget / 2**20:.1f} MiB, model {model_bytes / 2**20:.1f} MiB, RSS grew {grown / 2**20:.1f} MiB")
    assert out["reads"] > 0
    assert grown >= budget // 2   # the measurement sees the cache being filled
    assert grown <= budget + (16 << 20)  # the budget plus a small fixed overhead (thread stacks, allocator)


def test_hot_list_is_saved_beside_the_container_and_loaded_next_time(moe_model, tmp_path):
    from app.model import USAGE_FILE, LoadedModel

    copy = tmp_path / "warm.ferry"
    shutil.copytree(moe_model, copy)
    model = LoadedModel(copy, n_ctx=64)
    model.new_session(64).eval(TOKENS[:16])
    used = model.engine.usage()
    model.close()
    saved = np.fromfile(copy / USAGE_FILE, dtype="<u4").reshape(used.shape)
    assert np.array_equal(saved, used) and saved.sum() > 0
    again = LoadedModel(copy, n_ctx=64)
    assert np.array_equal(again.engine.usage(), used)  # warm: the counts came back
    again.close()
    (copy / USAGE_FILE).write_bytes(b"\0" * 12)          # a stale file of the wrong size is ignored
    LoadedModel(copy, n_ctx=64).close()


def test_policy_state_is_saved_beside_the_container_and_a_damaged_one_starts_cold(moe_model, tmp_path):
    from app.model import POLICY_STATE_FILE, LoadedModel

    copy = tmp_path / "learned.ferry"
    shutil.copytree(moe_model, copy, ignore=shutil.ignore_patterns("usage.u32*", POLICY_STATE_FILE))
    model = LoadedModel(copy, n_ctx=64)
    model.new_session(64).eval(TOKENS[:16])
    learned = model.engine.policy_state()
    model.close()
    assert (copy / POLICY_STATE_FILE).read_bytes() == learned
    again = LoadedModel(copy, n_ctx=64)
    assert again.engine.policy_state() == learned  # the next session starts from it
    again.close()
    (copy / POLICY_STATE_FILE).write_bytes(b"damaged")  # refused by the core: the model opens cold
    cold = LoadedModel(copy, n_ctx=64)
    assert cold.engine.usage().sum() > 0  # the hot list still came back
    cold.close()


def test_saved_state_continues_exactly_like_an_uninterrupted_session(moe_model, demo_container):
    from app.engine.binding import SessionState

    states = {}
    for container in (moe_model, demo_container):
        with Engine(container, threads=2, n_ctx=64) as engine:
            whole = engine.session(64)
            want = [whole.eval(TOKENS[:20])] + [whole.eval([t]) for t in TOKENS[20:30]]
            first = engine.session(64)
            first.eval(TOKENS[:20])
            saved = states[container] = SessionState.from_bytes(first.export_state().to_bytes())
            first.close()
            later = engine.session(48)          # another session, another context size
            later.import_state(saved)
            assert later.position == 20 and later.tokens == TOKENS[:20]
            got = [want[0]] + [later.eval([t]) for t in TOKENS[20:30]]
            assert all(np.array_equal(a, b) for a, b in zip(got, want))
            damaged = bytearray(saved.blob)
            damaged[100] ^= 1
            with pytest.raises(FerryError, match="damaged"):
                later.import_state(SessionState(saved.tokens, bytes(damaged)))
            assert later.position == 30            # unchanged by the refusal
    # A state from another model is refused.
    with Engine(demo_container, n_ctx=64) as engine:
        with pytest.raises(FerryError, match="another model"):
            engine.session(64).import_state(states[moe_model])
