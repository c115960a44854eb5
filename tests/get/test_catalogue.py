"""The catalogue: every entry planned live, with no network."""
from __future__ import annotations

import socket
import subprocess
import sys

from app.memory.budget import MachineMemory
from app.get.catalogue import ENTRIES, catalogue, describe_catalogue

MAC64 = MachineMemory(64 << 30, 64 << 30, "test")


def test_every_entry_is_planned_on_a_64_gb_mac_without_the_network(monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("the catalogue must not use the network")

    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket.socket, "connect", refuse)
    rows = catalogue(MAC64, disk_bps=5e9, kernel_bps_of=lambda fmt: 50e9)
    assert [r.name for r in rows] == [e.name for e in ENTRIES]
    by = {r.name: r for r in rows}
    k3 = by["Kimi K3"]
    assert (k3.trunk_format, k3.expert_format) == ("iq4_xs", "q3_nl")  # what `ferry check` recommends there
    assert 1.3e12 < k3.download_bytes < 1.6e12 and k3.verdict == "runs slowly"
    assert 28 < k3.floor_bytes / 2**30 < 36
    assert by["OLMoE 1B-7B"].verdict == "runs well"
    assert all(r.verdict in ("runs well", "runs slowly", "does not fit", "unknown") and r.reason for r in rows)
    assert "Kimi-Linear" in describe_catalogue(rows)


def test_k3_does_not_fit_a_16_gb_machine():
    rows = catalogue(MachineMemory(16 << 30, 12 << 30, "test"), disk_bps=3e9, kernel_bps_of=lambda fmt: 20e9)
    k3 = next(r for r in rows if r.name == "Kimi K3")
    assert k3.verdict == "does not fit" and "RAM" in k3.reason


def test_importing_ferry_get_opens_no_connection():
    code = ("import socket\n"
            "def no(*a, **k): raise SystemExit('connected')\n"
            "socket.socket.connect = no\nsocket.create_connection = no\n"
            "import app.get.catalogue, app.get.plan, app.get.pipeline, app.get.cli, app.get.hub\n")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True).returncode == 0


def test_models_that_fit_get_the_fastest_format_within_a_4_bit_error():
    """The speed rule (app.convert.format_choices.pick) in the catalogue: on a 64 GB machine OLMoE-1B-7B,
    Qwen3-30B-A3B and Mixtral 8x7B fit, and with kernels as fast per byte in every format the fewest bytes
    within a 4-bit error win (q4_0, not 3-bit); without measured kernels, the most accurate that fits."""
    rows = {r.name: r for r in catalogue(MAC64, disk_bps=5e9, kernel_bps_of=lambda fmt: 50e9)}
    for name in ("OLMoE 1B-7B", "Qwen3-30B-A3B", "Mixtral 8x7B"):
        assert rows[name].expert_format == "q4_0", name
    unknown = {r.name: r for r in catalogue(MAC64, disk_bps=5e9, kernel_bps_of=lambda fmt: None)}
    assert unknown["OLMoE 1B-7B"].expert_format == "bf16"
    assert rows["OLMoE 1B-7B"].container_bytes < unknown["OLMoE 1B-7B"].container_bytes / 3


def test_k3_on_a_64_gb_mac_gets_an_expert_cache():
    """The budget rule once stepped the cache down to whole token working sets (17.5 GiB for
    K3): 16 GiB of room above the floor became no cache at all, and the catalogue showed
    K3 reading every expert from the disk."""
    rows = catalogue(MAC64, disk_bps=6.3e9, kernel_bps_of=lambda fmt: 50e9)
    k3 = next(r for r in rows if r.name == "Kimi K3")
    cache = k3.recommended_budget - k3.floor_bytes
    assert cache > 10 << 30, cache                          # most of the room, not 0
    assert k3.expected_read_per_token < k3.cold_bytes_per_token


def test_k3_on_a_64_gb_mac_expects_the_hits_of_real_routing():
    """The catalogue's K3 row reads what the engine's policy hits on real
    routing at that cache (app.engine.speed.expected_hit_rate: 47.6 % at 1.0
    token working sets; the public engine measures 38 % there), not a
    uniform spread over 82,432 records (1.7 %); its tok/s is the one
    estimator's (tests/engine/test_true_shape_bench.py checks the same row
    against bench/stream.py's 64 GB Mac table; docs/KIMI.md, "Speed model")."""
    from app.engine.speed import expected_hit_rate

    rows = catalogue(MAC64, disk_bps=6.3e9, kernel_bps_of=lambda fmt: 307e9)
    k3 = next(r for r in rows if r.name == "Kimi K3")
    record = k3.cold_bytes_per_token // (16 * 92)
    slots = (k3.recommended_budget - k3.floor_bytes) // record + 16
    hit = expected_hit_rate(slots, 16, 92, 896 * 92)
    assert 0.46 < hit < 0.49    # the iq4_xs trunk leaves 1.6 GiB more to the cache than q4_0 did (45 %)
    assert k3.expected_read_per_token == int(k3.cold_bytes_per_token * (1 - hit))
    assert 0.5 < k3.tok_per_s < 0.65     # the public engine measures 0.45-0.62 tok/s on that Mac
