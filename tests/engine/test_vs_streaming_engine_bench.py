"""bench/vs_streaming_engine.py (Ferry against the public streaming engine on the same
synthetic Kimi-Linear): the one-line refusals when the peer is absent or an option is
wrong, the safetensors index it writes for the peer's converter, and the reading of the
peer's summary line. Nothing here runs either engine."""
from __future__ import annotations

import importlib.util
import json
import struct
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# Loaded from its file: bench/ never goes on sys.path.
_spec = importlib.util.spec_from_file_location("ferry_bench_vs_streaming_engine",
                                               ROOT / "bench" / "vs_streaming_engine.py")
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)


def _refused(argv, capsys) -> str:
    with pytest.raises(SystemExit) as exc:
        bench.main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err.strip().splitlines()[-1]


def test_no_peer_is_refused_in_one_line(monkeypatch, capsys):
    monkeypatch.delenv(bench.PEER_ENV, raising=False)
    with pytest.raises(SystemExit) as exc:
        bench.main([])
    assert exc.value.code == 2
    (line,) = capsys.readouterr().err.strip().splitlines()  # one line, no usage, no traceback
    assert line.startswith("vs_streaming_engine: the public streaming engine is not here")


def test_a_peer_checkout_without_its_binary_is_refused(tmp_path, monkeypatch, capsys):
    (tmp_path / "tools").mkdir()
    (tmp_path / "tools" / "convert.py").write_text("")
    monkeypatch.setenv(bench.PEER_ENV, str(tmp_path))  # not built: no waste binary
    assert "not here" in _refused([], capsys)
    waste = tmp_path / "waste"
    waste.write_text("#!/bin/sh\n")
    waste.chmod(0o755)
    assert bench.parse_args(["--peer", str(tmp_path)]).peer_path == tmp_path


@pytest.mark.parametrize("argv, message", [
    (["--dim", "128"], "--dim"),
    (["--cache-share", "1.5"], "--cache-share"),
    (["--tokens", "0"], "--tokens"),
    (["--tokens", "400"], "--tokens"),
    (["--modes", "tight,fast"], "--modes"),
])
def test_options_out_of_range_are_refused_before_the_peer_is_looked_for(argv, message, monkeypatch, capsys):
    monkeypatch.delenv(bench.PEER_ENV, raising=False)
    assert message in _refused(argv, capsys)


def test_the_index_maps_every_tensor_to_the_single_file(tmp_path):
    header = {"__metadata__": {"format": "pt"},
              "a.weight": {"dtype": "BF16", "shape": [2, 2], "data_offsets": [0, 8]},
              "b.weight": {"dtype": "BF16", "shape": [2], "data_offsets": [8, 12]}}
    raw = json.dumps(header).encode()
    (tmp_path / "model.safetensors").write_bytes(struct.pack("<Q", len(raw)) + raw + bytes(12))
    bench.write_index(tmp_path)
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    assert index["weight_map"] == {"a.weight": "model.safetensors", "b.weight": "model.safetensors"}
    assert index["metadata"]["total_size"] == (tmp_path / "model.safetensors").stat().st_size


def test_the_peers_summary_line_is_read():
    # the line its `run` prints after a generation (the peer's README shows one)
    m = bench.PEER_STATS.search("...\n[16 tokens, 26.87 s, 0.60 tok/s | experts 9000 hit / 14552 miss = 38%]\n")
    assert m and (int(m[1]), float(m[3]), int(m[4]), int(m[5])) == (16, 0.60, 9000, 14552)


def test_the_ratio_is_the_median_of_the_rounds():
    f = [{"s_per_token": s, "tok_per_s": 1 / s, "bytes_per_token": 100.0, "hit_rate": 0.5, "budget_bytes": 1}
         for s in (0.1, 0.2, 0.1)]
    p = [{"s_per_token": s, "tok_per_s": 1 / s, "bytes_per_token": 300.0, "hit_rate": 0.4, "budget_bytes": 1}
         for s in (0.3, 0.2, 0.15)]
    out = bench.summarize({"ferry": f, "peer": p})
    assert out["rounds_ferry_over_peer"] == pytest.approx([3.0, 1.0, 1.5])
    assert out["ferry_over_peer"] == pytest.approx(1.5)
    assert out["bytes_per_token_peer_over_ferry"] == pytest.approx(3.0)
