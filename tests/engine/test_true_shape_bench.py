"""bench/stream.py --true-shape (K3's real expert records against the disk's
ceiling) and the speed model it checks (app.engine.speed.token_seconds, used
by app.get.plan.estimate): option parsing and the disk refusal, the records
it writes, and the model's arithmetic. Tiny sizes only: nothing here writes
a real K3 bank."""
from __future__ import annotations

import importlib.util
import struct
import zlib
from collections import namedtuple
from pathlib import Path

import numpy as np
import pytest

from app.convert import quant2, quant3
from app.convert.layout import bank_layout
from app.engine.speed import token_seconds
from app.get.plan import GetPlan, estimate

ROOT = Path(__file__).resolve().parents[2]
# Loaded from its file: bench/ never goes on sys.path.
_spec = importlib.util.spec_from_file_location("ferry_bench_stream", ROOT / "bench" / "stream.py")
stream = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(stream)


@pytest.mark.parametrize("argv, message", [
    (["--true-shape"], "use it with --family k3"),
    (["--family", "k3", "--true-shape", "--readers-sweep", "0"], "--readers-sweep"),
    (["--family", "k3", "--true-shape", "--readers-sweep", "2,x"], "--readers-sweep"),
    (["--family", "k3", "--true-shape", "--moe-layers", "0"], "--moe-layers"),
    (["--family", "k3", "--true-shape", "--moe-layers", "93"], "--moe-layers"),
    (["--family", "k3", "--true-shape", "--cache-share", "1.5"], "--cache-share"),
    (["--family", "k3", "--true-shape", "--routing"], "exact routing alone"),
    (["--keep"], "--keep goes with --true-shape"),
    (["--moe-layers", "1"], "--moe-layers goes with --true-shape"),
])
def test_options_that_do_not_go_together_are_refused_in_one_line(argv, message, capsys):
    with pytest.raises(SystemExit) as exc:
        stream.main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_the_true_shape_is_k3s_record():
    """K3's expert at q3_nl: 12.18 MiB a record, 10.66 GiB a layer (the issue's figures)."""
    (bank,) = stream.true_shape_banks(1, "q3_nl")
    assert bank.n_experts == 896 and bank.layer == 1
    assert bank.parts["gate"]["shape"] == [3072, 3584] and bank.parts["down"]["shape"] == [3584, 3072]
    assert bank.record_size == 12775424 and bank.record_size % 4096 == 0
    assert abs(bank.file_size / 2**30 - 10.66) < 0.01
    two = stream.true_shape_banks(2, "q2_vq")
    assert [b.layer for b in two] == [1, 2] and two[0].record_size < bank.record_size


def test_too_little_disk_is_refused_before_anything_is_written(tmp_path, monkeypatch):
    Usage = namedtuple("Usage", "total used free")
    need = stream.true_shape_need(2, "q3_nl")
    monkeypatch.setattr(stream.shutil, "disk_usage", lambda p: Usage(1 << 40, 0, need + (5 << 30)))
    with pytest.raises(SystemExit) as exc:
        stream.check_true_shape_space(tmp_path / "not" / "yet", 2, "q3_nl")
    msg = str(exc.value.code)
    assert "\n" not in msg and "GiB is free" in msg and "--moe-layers" in msg
    monkeypatch.setattr(stream.shutil, "disk_usage", lambda p: Usage(1 << 40, 0, need + (6 << 30)))
    assert stream.check_true_shape_space(tmp_path, 2, "q3_nl") == need
    # the whole command refuses the same way, before writing anything
    monkeypatch.setattr(stream.shutil, "disk_usage", lambda p: Usage(1 << 40, 0, 1 << 30))
    with pytest.raises(SystemExit) as exc:
        stream.main(["--family", "k3", "--true-shape", "--workdir", str(tmp_path / "w")])
    assert "GiB is free" in str(exc.value.code)
    assert not (tmp_path / "w").exists()


@pytest.mark.parametrize("fmt, decode", [("q3_nl", quant3.dequantize), ("q2_vq", quant2.dequantize)])
def test_records_written_directly_are_valid(tmp_path, fmt, decode):
    """The bank writer's records: the converter's header and record layout,
    a payload CRC that checks, and blocks that decode to finite values of a
    real weight's size (drawn from encoded Gaussian rows)."""
    from app.convert.convert import bank_header

    bank = bank_layout(3, 5, {"gate": (fmt, (8, 512)), "up": (fmt, (8, 512)), "down": (fmt, (512, 256))})
    path = tmp_path / "layer_003.bin"
    stream.write_true_bank(path, bank, seed=1)
    data = path.read_bytes()
    assert len(data) == bank.file_size and data[:4096] == bank_header(bank)
    for e in range(bank.n_experts):
        rec = data[4096 + e * bank.record_size: 4096 + (e + 1) * bank.record_size]
        assert rec[:4] == b"FXPR" and struct.unpack_from("<II", rec, 8) == (3, e)
        assert struct.unpack_from("<I", rec, 56)[0] == zlib.crc32(rec[64:64 + bank.payload_size])
        for part in ("gate", "up", "down"):
            info = bank.parts[part]
            raw = np.frombuffer(rec, np.uint8, info["nbytes"], info["offset"])
            w = decode(raw, info["shape"][0] * info["shape"][1])
            assert np.isfinite(w).all() and 0.005 < float(np.abs(w).mean()) < 0.05
    # experts differ (rows drawn at random), and the same seed writes the same bytes
    assert data[4096:4096 + bank.record_size][64:] != data[4096 + bank.record_size:4096 + 2 * bank.record_size][64:]
    again = tmp_path / "again.bin"
    stream.write_true_bank(again, bank, seed=1)
    assert again.read_bytes() == data


def test_speed_model_arithmetic():
    # trunk 100 B at 10 B/s = 10 s; experts 50 B at 10 B/s = 5 s beside a read of 200 B at 20 B/s = 10 s
    assert token_seconds(100, 50, 200, 10, 20) == pytest.approx(20.0)
    # compute-bound layers: the read hides behind the experts' compute
    assert token_seconds(100, 300, 200, 10, 20) == pytest.approx(40.0)
    # the trunk's own kernels, and the lookahead's bound max(trunk + experts, read)
    assert token_seconds(100, 50, 200, 10, 20, trunk_kernel_bps=50) == pytest.approx(12.0)
    assert token_seconds(100, 50, 400, 10, 20, lookahead=True) == pytest.approx(20.0)
    assert token_seconds(100, 50, 200, 10, 20, lookahead=True) == pytest.approx(15.0)
    # nothing read: compute alone; an unknown rate that is needed: unknown
    assert token_seconds(100, 50, 0, 10, None) == pytest.approx(15.0)
    assert token_seconds(100, 50, 200, 10, None) is None
    assert token_seconds(100, 50, 0, None, 20) is None


def test_speed_model_record_pipeline():
    """With the record size and the layers, each layer is a pipeline of
    records: the last miss's compute follows its read (disk-bound), the
    first miss's read comes before the misses' compute when the hits are
    computed sooner (compute-bound); never less than the aggregate form,
    which it approaches as records get small."""
    # 2 layers, each 8 B of experts at 1 B/s, of which 6 B missed, read at 1 B/s; records of 2 B:
    # per layer max(max(hits 2 s, one record's read 2 s) + misses 6 s, read 6 s + one record 2 s) = 8 s
    assert token_seconds(0, 16, 12, 1, 1, record_bytes=2, layers=2) == pytest.approx(16.0)
    # disk-bound: read at 0.5 B/s: 12 s a layer + the last record's compute 2 s
    assert token_seconds(0, 16, 12, 1, 0.5, record_bytes=2, layers=2) == pytest.approx(28.0)
    assert token_seconds(0, 16, 12, 1, 0.5) == pytest.approx(24.0)
    # compute-bound, nothing cached: the first record's read (1 s) before the misses' compute (8 s)
    assert token_seconds(0, 16, 16, 1, 4, record_bytes=4, layers=2) == pytest.approx(2 * (1 + 8))
    assert token_seconds(0, 16, 16, 1, 4) == pytest.approx(16.0)
    assert token_seconds(0, 160, 100, 10, 5, record_bytes=1e-6, layers=4) == \
        pytest.approx(token_seconds(0, 160, 100, 10, 5), rel=1e-6)
    # reads beyond the experts (wrong guesses) are read, not computed; the trunk adds
    assert token_seconds(10, 16, 20, 1, 1, record_bytes=2, layers=2) == pytest.approx(10 + 2 * (10 + 2))


def test_speed_model_reads_beside_busy_cores():
    """busy_disk_bps: the disk's rate while the kernels hold every core;
    reads overlapping the experts' compute go at it, the rest at disk_bps."""
    # experts 10 s; 10 B read at 0.5 B/s during those 10 s gives 5 B, the other 5 B at 2 B/s: 12.5 s
    assert token_seconds(0, 10, 10, 1, 2, busy_disk_bps=0.5) == pytest.approx(12.5)
    # fast enough beside the compute: hidden (10 B at 1 B/s within the 10 s)
    assert token_seconds(0, 10, 10, 1, 2, busy_disk_bps=1) == pytest.approx(10.0)
    # the default is the same rate busy or not, and a busy rate above it changes nothing
    assert token_seconds(0, 10, 30, 1, 2) == token_seconds(0, 10, 30, 1, 2, busy_disk_bps=5) == pytest.approx(15.0)
    # per layer, the same rule beside each layer's compute (2 layers, records of 1 B)
    assert token_seconds(0, 10, 10, 1, 2, busy_disk_bps=0.5, record_bytes=1, layers=2) == \
        pytest.approx(2 * (5 + 1.25 + 1))


def test_the_disk_ceiling_at_the_decodes_request_size():
    """The disk's rate read at the decode's mean request: a fixed cost per
    request plus its bytes at a rate, through the probes at the smallest and
    largest requests, held within them; without sizes, the best probe."""
    small, large = (512e3, 1.0e9), (3e6, 1.8e9)
    assert stream.ceiling_at_request(3e6, [small, large]) == pytest.approx(1.8e9)
    assert stream.ceiling_at_request(512e3, [large, small]) == pytest.approx(1.0e9)
    assert stream.ceiling_at_request(8e6, [small, large]) == pytest.approx(1.8e9)     # held within the probes
    t0 = (1 / 1.0e9 - 1 / 1.8e9) / (1 / 512e3 - 1 / 3e6)                            # seconds a request
    assert stream.ceiling_at_request(1.5e6, [small, large]) == pytest.approx(1 / (t0 / 1.5e6 + 1 / 1.8e9 - t0 / 3e6))
    assert 1.0e9 < stream.ceiling_at_request(1.5e6, [small, large]) < 1.8e9
    # noise (the larger requests slower): still between the two
    assert 1.0e9 < stream.ceiling_at_request(1.5e6, [(512e3, 1.8e9), (3e6, 1.0e9)]) < 1.8e9
    assert stream.ceiling_at_request(None, [small, large]) == 1.8e9
    assert stream.ceiling_at_request(1e6, [(None, 1.2e9), large]) == 1.8e9


def test_the_probe_reads_into_buffers_made_as_the_engines_slots(tmp_path):
    """record_slots: page-aligned private buffers of one record, zeroed (huge
    pages asked for: 2 MiB-aligned); disk_bandwidth reads random records of
    a bank into them in the engine's pieces and reports the disk's requests."""
    for contiguous in (False, True):
        slots = stream.record_slots(2, 3 * 4096, contiguous)
        for m, view in slots:
            addr = np.frombuffer(view, dtype=np.uint8).ctypes.data
            assert len(view) == 3 * 4096 and not any(view) and addr % 4096 == 0
            if contiguous and hasattr(stream.mmap, "MADV_HUGEPAGE"):
                assert addr % stream.HUGE_PAGE == 0
    record = 64 << 10
    bank = tmp_path / "experts" / "layer_001.bin"
    bank.parent.mkdir()
    bank.write_bytes(bytes(4096 + 8 * record))
    for contiguous in (False, True):
        out = stream.disk_bandwidth(tmp_path, record, 2, seconds=0.05, pieces=True, contiguous=contiguous)
        assert out["bytes_per_s"] > 0 and out["piece"] == record and out["contiguous"] is contiguous
        assert {"disk_request_bytes", "disk_busy_share"} <= set(out)


def test_expected_hit_rate_is_the_trace_curve_never_below_uniform():
    """app.engine.speed.expected_hit_rate: HIT_CURVE at the cache's size in
    token working sets, at least the share cached, 1.0 when all is cached."""
    from app.engine.speed import HIT_CURVE, expected_hit_rate

    # OLMoE's own shape (16 layers, top 8 of 64): the curve's points
    assert expected_hit_rate(128, 8, 16, 1024) == pytest.approx(dict(HIT_CURVE)[1.0])
    assert expected_hit_rate(64, 8, 16, 1024) == pytest.approx(dict(HIT_CURVE)[0.5])
    assert expected_hit_rate(1024, 8, 16, 1024) == 1.0 and expected_hit_rate(0, 8, 16, 1024) == 0.0
    # K3 on a 64 GB Mac: 1,384 slots of 82,432 records, 0.94 of a token's 1,472: 45 %
    # (the public engine measures 38 % there; a uniform spread would give 1.7 %)
    k3 = expected_hit_rate(1384, 16, 92, 896 * 92)
    assert 0.44 < k3 < 0.46
    # monotone in the cache, never below uniform, up to 1.0 at every record (Mixtral: 8 experts, top 2)
    rates = [expected_hit_rate(s, 2, 32, 256) for s in range(0, 257, 8)]
    assert rates == sorted(rates) and rates[-1] == 1.0
    assert all(r >= s / 256 for r, s in zip(rates, range(0, 257, 8)))
    rates = [expected_hit_rate(s, 16, 92, 82432) for s in range(0, 82433, 2048)]
    assert rates == sorted(rates)


def test_the_estimator_uses_the_model():
    """app.get.plan.estimate (ferry get --plan, the catalogue): the hit rate
    real routing gives the cache (expected_hit_rate), then token_seconds on
    trunk, experts and misses with the layers' record pipeline."""
    from app.engine.speed import expected_hit_rate

    plan = GetPlan("r", "c", "hf", floor_bytes=1000, cold_bytes_per_token=800, compute_bytes_per_token=1800)
    # 2 layers of top 4, records of 100 B: the cache holds (1600 - 1000) // 100 + 4 = 10 of 80 records,
    # 1.25 token working sets
    estimate(plan, budget=1600, everything=9000, record=100, top_k=4, n_records=80, disk_bps=30.0,
             kernel_bps=100.0)
    hit = expected_hit_rate(10, 4, 2, 80)
    assert hit == pytest.approx(0.522) and plan.expected_read_per_token == int(800 * (1 - hit))
    assert plan.tok_per_s == pytest.approx(1 / token_seconds(1000, 800, plan.expected_read_per_token, 100.0, 30.0,
                                                             record_bytes=100, layers=2))
    # the trunk through its own format's kernels when they differ
    estimate(plan, budget=1600, everything=9000, record=100, top_k=4, n_records=80, disk_bps=30.0,
             kernel_bps=100.0, trunk_kernel_bps=200.0)
    assert plan.tok_per_s == pytest.approx(1 / token_seconds(1000, 800, plan.expected_read_per_token, 100.0, 30.0,
                                                             trunk_kernel_bps=200.0, record_bytes=100, layers=2))
    everything = GetPlan("r", "c", "hf", floor_bytes=1000, cold_bytes_per_token=800, compute_bytes_per_token=1800)
    estimate(everything, budget=9000, everything=9000, record=100, top_k=4, n_records=80, disk_bps=None,
             kernel_bps=100.0)
    assert everything.expected_read_per_token == 0 and everything.tok_per_s == pytest.approx(1 / 18.0)


def test_k3_cache_share_is_what_64_gb_leaves():
    """About 1.8 % of K3's experts: recommended minus floor of its 64 GB plan."""
    assert 0.015 < stream.k3_cache_share() < 0.021


def test_mac_prediction_is_the_model_on_published_figures():
    one_core = {"q3_nl": 2e9, "q2_vq": 1e9, stream.K3_TRUNK: 2.5e9}
    out = stream.mac_prediction(one_core.__getitem__)
    q3 = out["formats"]["q3_nl"]
    row = q3["predictions"]["memory/top16/published_38pct/ssd_low"]
    expect = token_seconds(q3["trunk_compute_bytes"], q3["cold_bytes_per_token"],
                           int(q3["cold_bytes_per_token"] * 0.62), 307e9, 6.3e9,
                           record_bytes=q3["cold_bytes_per_token"] // (16 * 92), layers=92)
    assert row["tok_per_s"] == pytest.approx(1 / expect)
    # the catalogue shows the "ferry" hit rate's row: the same estimator, not a second one
    ferry = q3["predictions"]["memory/top16/ferry/ssd_low"]
    assert out["catalogue_row"]["expert_format"] == "q3_nl"
    assert out["catalogue_row"]["tok_per_s"] == pytest.approx(ferry["tok_per_s"], rel=1e-3)
    assert 0.46 < q3["hit_rates"]["top16"]["ferry"] < 0.49 and q3["hit_rates"]["top16"]["uniform"] < 0.02
    # fewer experts or fewer bits per weight read less: never slower
    p = out["formats"]["q2_vq"]["predictions"]
    assert p["memory/top8/published_38pct/ssd_low"]["tok_per_s"] > row["tok_per_s"]
    assert p["memory/top16/published_38pct/ssd_low"]["tok_per_s"] > row["tok_per_s"]
    cores = q3["predictions"]["cores_as_here/top16/uniform/ssd_low"]
    assert cores["trunk_s"] == pytest.approx(q3["trunk_compute_bytes"] / (18 * 2.5e9))
    assert out["catalogue_row_cores_as_here"]["tok_per_s"] < out["catalogue_row"]["tok_per_s"]
    # with kernels that differ by format the catalogue runs the trunk at its own format's (iq4_xs) speed, as the table
    assert out["catalogue_row_cores_as_here"]["tok_per_s"] == \
        pytest.approx(q3["predictions"]["cores_as_here/top16/ferry/ssd_low"]["tok_per_s"], rel=1e-3)


@pytest.mark.slow
def test_true_shape_measurement_runs_on_a_tiny_k3(tmp_path):
    """The bench's measurement loop end to end at a tiny size (a tiny K3 with
    q3_nl experts, 1 round, 1 and 2 readers, short ceilings): each decode
    beside its kernels' speed, its idle, busy-cores and whole-record
    ceilings and the others' disk traffic, a prediction and an error per
    reader count."""
    from argparse import Namespace

    from app.convert import quant3
    from app.convert.convert import convert
    from app.engine.binding import Engine, container_plan
    from tests.kimi import tiny_k3

    tiny_k3.build(tmp_path / "ckpt", moe_ffn=256, latent=256, layers=2)   # q3_nl blocks: 256 values
    container = tmp_path / "k3.ferry"
    convert(tmp_path / "ckpt", container, trunk_format="f32", expert_format=quant3.NAME)
    plan = container_plan(container, 256)
    assert {p["dtype"] for p in plan_parts(container)} == {"q3_nl"}
    budget = plan.floor_bytes + plan.q8_bytes + 2 * plan.record_bytes   # the default's 8-bit activations
    with Engine(container, n_ctx=256, threads=1, ram_budget=budget) as probe:
        info = probe.info
    tokens = [5 + i for i in range(stream.TRUE_PROMPT + 3)]
    a = Namespace(readers_sweep="1,2", rounds=1, expert_format="q3_nl", ceiling_seconds=0.2, tokens=3)
    out = stream.true_shape_modes(a, container, plan, tokens, budget, info)
    assert set(out["readers"]) == {"1", "2"} and set(out["model_error_by_readers"]) == {"1", "2"}
    for r in out["readers"].values():
        assert r["bytes_per_token"] > 0 and r["disk_ceiling_rounds"][0] > 0 and r["disk_ceiling_busy_rounds"][0] > 0
        assert r["kernel_bytes_per_s_rounds"][0] > 0 and np.isfinite(r["model"]["error"])
        assert len(r["model"]["rounds_error"]) == 1 and r["load_rounds"]
        # the ceiling at the decode's request size lies between the probes into scattered and huge pages
        lo, hi = sorted((r["disk_ceiling_pages_rounds"][0], r["disk_ceiling_contiguous_rounds"][0]))
        assert lo - 1 <= r["disk_ceiling_rounds"][0] <= hi + 1
        assert np.isfinite(r["model"]["rounds_error_at_pages"][0]) and len(r["disk_request_bytes_rounds"]) == 1
    assert isinstance(out["model_within_15pct"], bool)


def plan_parts(container: Path) -> list[dict]:
    import json

    doc = json.loads((container / "manifest.json").read_text())
    return [bank[p] for bank in doc["expert_banks"] for p in ("gate", "up", "down")]
