"""The Source page's checks (app.convert.validate) and the Destination page's
disk probe (app.memory.disk_probe), without a window."""
from __future__ import annotations

import json
import os
import threading

import pytest

from app.convert.validate import validate_source
from app.engine.binding import DEFAULT_READERS
from app.memory import disk_probe
from app.memory.disk_probe import MIN_PIECES, ProbeCancelled, probe, tok_s_bound


def test_every_problem_is_reported_with_its_file(deepseek_ckpt, tmp_path):
    broken = tmp_path / "broken"
    broken.mkdir()
    for f in deepseek_ckpt.iterdir():
        if f.name not in ("model-00001-of-00003.safetensors", "tokenizer.json"):
            (broken / f.name).symlink_to(f)
    data = (deepseek_ckpt / "model-00002-of-00003.safetensors").read_bytes()
    (broken / "model-00002-of-00003.safetensors").unlink()
    (broken / "model-00002-of-00003.safetensors").write_bytes(data + b"\0" * 100)
    report = validate_source(broken)
    assert not report.ok
    msgs = [str(p) for p in report.problems]
    assert any(m.startswith("model-00001-of-00003.safetensors:") and "missing" in m for m in msgs)
    assert any(m.startswith("tokenizer") or "tokenizer" in m for m in msgs)
    # With the shard back, the one with bytes after its last tensor is named.
    (broken / "model-00001-of-00003.safetensors").symlink_to(deepseek_ckpt / "model-00001-of-00003.safetensors")
    (broken / "tokenizer.json").symlink_to(deepseek_ckpt / "tokenizer.json")
    msgs = [str(p) for p in validate_source(broken).problems]
    assert len(msgs) == 1 and msgs[0].startswith("model-00002-of-00003.safetensors:") and "100 bytes longer" in msgs[0]


def test_a_good_source_gets_sizes_and_the_plan(deepseek_ckpt):
    r = validate_source(deepseek_ckpt)
    assert r.ok and r.kind == "hf" and r.architecture == "DeepseekV3ForCausalLM"
    assert r.source_bytes == sum(f.stat().st_size for f in deepseek_ckpt.glob("*.safetensors"))
    assert r.container_bytes == r.layout.total_bytes() and r.n_moe_layers == 2 and r.top_k == 4
    assert r.cold_bytes_per_token == r.plan.token_set == 2 * 4 * r.record_bytes
    assert r.plan.floor <= r.plan.recommended


def test_an_unsupported_architecture_and_a_bad_config(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["GPTBigCodeForCausalLM"]}))
    assert "GPTBigCodeForCausalLM" in str(validate_source(tmp_path).problems[0])
    (tmp_path / "config.json").write_text("{not json")
    assert "config.json" in str(validate_source(tmp_path).problems[0])


def test_the_probe_measures_and_cleans_up(tmp_path):
    seen = []
    speed = probe(tmp_path, size=32 << 20, block=1 << 20, progress=seen.append)
    assert speed.readers == DEFAULT_READERS and speed.block == 1 << 20
    assert speed.read_bytes_per_s > 0 and speed.write_bytes_per_s > 0 and speed.bytes_read == 32 << 20
    assert seen[-1] == pytest.approx(1.0) and list(tmp_path.iterdir()) == []
    assert tok_s_bound(2e9, 10**9) == 2.0 and tok_s_bound(2e9, 0) is None


def test_the_probe_refuses_a_nearly_full_disk(small_tmpfs):
    with pytest.raises(OSError, match="too little to measure"):
        probe(small_tmpfs)
    assert list(small_tmpfs.iterdir()) == []


def _spy_reads(monkeypatch, on_read):
    """os.preadv as the probe's readers call it, with ``on_read(offset, length)`` first."""
    real = os.preadv

    def preadv(fd, buffers, offset):
        on_read(offset, sum(len(b) for b in buffers))
        return real(fd, buffers, offset)
    monkeypatch.setattr(disk_probe.os, "preadv", preadv)


def test_the_probe_reads_random_pieces_with_the_engines_readers_at_once(tmp_path, monkeypatch):
    """As many reads in flight together as the engine has readers (the barrier
    breaks if they came one at a time), each a 4 MiB piece of a larger record
    at an aligned offset, every piece once, each into its own buffer."""
    barrier = threading.Barrier(DEFAULT_READERS, timeout=10)
    first: set[int] = set()
    reads: list[tuple[int, int]] = []
    lock = threading.Lock()

    def on_read(offset, length):
        with lock:
            reads.append((offset, length))
            new = threading.get_ident() not in first
            first.add(threading.get_ident())
        if new:
            barrier.wait()
    _spy_reads(monkeypatch, on_read)
    speed = probe(tmp_path, size=32 << 20, block=8 << 20)
    piece = disk_probe.IO_PIECE
    assert speed.readers == DEFAULT_READERS and speed.block == piece and speed.bytes_read == 32 << 20
    assert len(first) == DEFAULT_READERS
    assert sorted(reads) == [(k * piece, piece) for k in range(32 << 20 >> 22)]
    assert reads != sorted(reads)           # random order
    assert list(tmp_path.iterdir()) == []


def test_the_probe_stops_at_its_time_limit_after_a_few_pieces(tmp_path):
    speed = probe(tmp_path, size=64 << 20, block=1 << 20, max_seconds=0, readers=2)
    assert MIN_PIECES << 20 <= speed.bytes_read < 64 << 20 and speed.readers == 2
    assert list(tmp_path.iterdir()) == []


def test_a_cancelled_probe_stops_its_readers_and_removes_its_file(tmp_path, monkeypatch):
    cancel = threading.Event()
    n = []
    _spy_reads(monkeypatch, lambda offset, length: (n.append(1), cancel.set()))
    with pytest.raises(ProbeCancelled):
        probe(tmp_path, size=64 << 20, block=1 << 20, cancel=cancel)
    assert len(n) <= DEFAULT_READERS          # each reader finished at most the read it had started
    assert list(tmp_path.iterdir()) == []
    assert not [t for t in threading.enumerate() if t.name.startswith("ferry-disk-probe")]


def test_a_failing_read_is_raised_and_the_file_removed(tmp_path, monkeypatch):
    def on_read(offset, length):
        if offset == 5 << 20:
            raise OSError(5, "Input/output error")
    _spy_reads(monkeypatch, on_read)
    with pytest.raises(OSError, match="Input/output error"):
        probe(tmp_path, size=32 << 20, block=1 << 20)
    assert list(tmp_path.iterdir()) == []
    assert not [t for t in threading.enumerate() if t.name.startswith("ferry-disk-probe")]
