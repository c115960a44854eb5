"""The streaming engine on a synthetic MoE model larger than its RAM budget.

    python bench/stream.py --json [--size-gb 2] [--budget-frac 0.25] [--tokens 24]

Writes a deterministic Qwen3-MoE-shaped checkpoint (bench/make_synthetic.py),
converts it with `ferry convert` (q4_1 experts), then measures in one run:

* streaming: decode with the cache, overlapped reads and the lookahead;
* synchronous: the same budget with overlap and lookahead off;
* the compute floor: the same tokens with every expert already in RAM;
* the disk floor: the bytes each token had to read, over the bandwidth the
  disk gives to the engine's own pattern (random whole records, direct I/O,
  the same number of reader threads).

Prints one JSON object. Ratios are what to compare: the machine is shared.
"""
from __future__ import annotations

import argparse
import json
import mmap
import os
import platform
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

from app.convert.convert import convert
from app.engine.binding import Engine, container_plan
from bench.make_synthetic import make, parse

PROMPT = 16


def decode_run(container: Path, tokens: list[int], **opts) -> dict:
    with Engine(container, n_ctx=256, **opts) as engine:
        s = engine.session(256)
        s.eval(tokens[:PROMPT])
        before = s.stats()
        t0 = time.perf_counter()
        for t in tokens[PROMPT:]:
            s.eval([t])
        seconds = time.perf_counter() - t0
        after = s.stats()
        n = len(tokens) - PROMPT
        d = lambda k: getattr(after, k) - getattr(before, k)  # noqa: E731
        uses = d("decode_hits") + d("decode_misses")
        return {
            "tok_per_s": n / seconds, "s_per_token": seconds / n,
            "hit_rate": d("decode_hits") / uses if uses else None,
            "bytes_per_token": d("bytes_read") / n,
            "stall_s_per_token": d("stall_seconds") / n,
            "lookahead_accuracy": (d("lookahead_correct") / d("lookahead_predicted")
                                   if d("lookahead_predicted") else None),
            "prefetch_used": d("prefetch_used"), "prefetch_wasted": d("prefetch_wasted"),
            "cache_slots": engine.info.cache_slots, "direct_io": engine.info.direct_io,
            "io_note": engine.info.io_note,
        }


def compute_floor(container: Path, tokens: list[int]) -> dict:
    """Every expert in RAM: decode the same tokens twice, time the second pass."""
    with Engine(container, n_ctx=256) as engine:
        s = engine.session(256)
        s.eval(tokens[:PROMPT])
        for t in tokens[PROMPT:]:
            s.eval([t])
        s.truncate(PROMPT)
        t0 = time.perf_counter()
        for t in tokens[PROMPT:]:
            s.eval([t])
        n = len(tokens) - PROMPT
        return {"s_per_token": (time.perf_counter() - t0) / n}


def disk_bandwidth(container: Path, record: int, readers: int, seconds: float = 3.0) -> dict:
    """Random whole-record direct reads with `readers` threads, like the engine's."""
    banks = sorted((container / "experts").glob("layer_*.bin"))
    flags = os.O_RDONLY | getattr(os, "O_DIRECT", 0)
    fds = [os.open(b, flags) for b in banks]
    n_records = (banks[0].stat().st_size - 4096) // record
    done = [0] * readers
    stop = time.perf_counter() + seconds

    def work(i: int) -> None:
        rng = np.random.default_rng(i)
        buf = mmap.mmap(-1, record)  # page-aligned, as direct I/O needs
        while time.perf_counter() < stop:
            fd = fds[rng.integers(len(fds))]
            off = 4096 + int(rng.integers(n_records)) * record
            done[i] += os.preadv(fd, [buf], off)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(readers)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - t0
    for fd in fds:
        os.close(fd)
    return {"bytes_per_s": sum(done) / elapsed, "readers": readers, "direct": bool(getattr(os, "O_DIRECT", 0))}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-gb", type=float, default=2.0, help="bf16 checkpoint size")
    ap.add_argument("--budget-frac", type=float, default=0.25, help="cache as a share of all experts")
    ap.add_argument("--tokens", type=int, default=24, help="decode steps")
    ap.add_argument("--readers", type=int, default=4)
    ap.add_argument("--workdir", default=None, help="where to write the model (default: a temp dir)")
    ap.add_argument("--correlated", action="store_true",
                    help="one router for all layers (routing predictable across layers, as in real models)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(dir=a.workdir) as tmp:
        t0 = time.perf_counter()
        ckpt = make(parse(["--out", f"{tmp}/ckpt", "--layers", "8", "--dim", "1024", "--expert-ffn", "512",
                           "--top-k", "8", "--heads", "8", "--vocab", "2048", "--size-gb", str(a.size_gb)]
                          + (["--same-router"] if a.correlated else [])))
        container = convert(ckpt, Path(tmp) / "synth.ferry", expert_format="q4_1")
        prep = time.perf_counter() - t0
        plan = container_plan(container, 256)
        all_experts = plan.expert_bytes
        budget = plan.floor_bytes + int(a.budget_frac * all_experts) + 8 * plan.record_bytes
        rng = np.random.default_rng(5)
        tokens = [int(t) for t in rng.integers(3, 2048, PROMPT + a.tokens)]
        streaming = decode_run(container, tokens, ram_budget=budget, readers=a.readers)
        sync = decode_run(container, tokens, ram_budget=budget, readers=a.readers, overlap=False, lookahead=False)
        no_lookahead = decode_run(container, tokens, ram_budget=budget, readers=a.readers, lookahead=False)
        compute = compute_floor(container, tokens)
        disk = disk_bandwidth(container, plan.record_bytes, a.readers)
        disk_floor = streaming["bytes_per_token"] / disk["bytes_per_s"]
        larger = max(disk_floor, compute["s_per_token"])
        model_bytes = sum(p.stat().st_size for p in container.rglob("*.bin"))
    result = {
        "machine": {"arch": platform.machine(), "cpus": os.cpu_count()},
        "routing": "correlated" if a.correlated else "random", "model_bytes": model_bytes, "budget_bytes": budget, "record_bytes": plan.record_bytes,
        "prepare_seconds": round(prep, 1),
        "streaming": streaming, "synchronous": sync, "no_lookahead": no_lookahead,
        "compute_floor_s_per_token": compute["s_per_token"],
        "disk": disk, "disk_floor_s_per_token": disk_floor,
        "ratio_to_larger_floor": streaming["s_per_token"] / larger,
        "speedup_vs_synchronous": sync["s_per_token"] / streaming["s_per_token"],
    }
    print(json.dumps(result, indent=None if a.json else 1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
