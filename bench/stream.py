"""The streaming engine on a synthetic MoE model larger than its RAM budget.

    python bench/stream.py --json [--size-gb 2] [--budget-frac 0.25] [--tokens 24] [--rounds 3]
    python bench/stream.py --json --family k3 --routing [--margins 0,0.02,0.1] [--dispatch]

Writes a deterministic Qwen3-MoE-shaped checkpoint (bench/make_synthetic.py;
--family k3 or kimi_linear: those releases' layouts, expert counts, top-k and
routing, narrow matrices: KIMI_SHAPES), converts it with `ferry convert`
(q4_1 experts), then measures in one run:

* streaming: decode with the cache, overlapped reads and the lookahead;
* synchronous: the same budget with overlap and lookahead off;
* overlap without the lookahead, and the lookahead with its gate off (every
  prediction read, however often its layer and rank miss);
* the compute floor: the same tokens with every expert already in RAM;
* with --routing, the opt-in modes: fewer experts per token (3k/4, k/2, k/4)
  and cache-aware margins (0 = exact, set explicitly), each with bytes/token,
  hit rate, s/token, stall, lookahead accuracy, prefetched records and the
  dispatch's own time per MoE layer (the session profile);
* with --dispatch, the expert dispatch's own CPU time per MoE layer and token
  (ferry_profile_part.dispatch_seconds), this build against the commit
  before the one MoE loop (bench/baseline_core.py builds it outside the
  repository with the same timer), for a prompt chunk and for single steps,
  every expert in RAM and at the bench's budget, in interleaved rounds of
  fresh processes (bench/dispatch_worker.py);
* the disk floor: the bytes each token must read (the fewest any mode read
  at this budget), over the best bandwidth the disk gave in any round to the
  engine's own pattern (random whole records, direct I/O, the same number of
  reader threads).

The modes run in interleaved rounds (streaming, synchronous, overlap without
lookahead, the routing modes, compute floor, disk bandwidth; then again, each
round starting one mode later), and each figure is the median over the
rounds, so a noisy neighbour slows every mode alike. With
--workdir the converted model is kept there and reused by the next run with
the same flags.

Prints one JSON object. Ratios are what to compare: the machine is shared.
"""
from __future__ import annotations

import argparse
import json
import mmap
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

from app.convert.convert import convert
from app.engine.binding import Engine, container_plan
from app.engine.speed import run_threads
from bench.make_synthetic import make, parse

PROMPT = 16


def decode_run(container: Path, tokens: list[int], routing: tuple | None = None, **opts) -> dict:
    with Engine(container, n_ctx=256, **opts) as engine:
        s = engine.session(256)
        if routing:
            s.set_routing(*routing)
        s.eval(tokens[:PROMPT])
        s.set_profiling(True)  # the decode's dispatch time per MoE layer
        before = s.stats()
        t0 = time.perf_counter()
        for t in tokens[PROMPT:]:
            s.eval([t])
        seconds = time.perf_counter() - t0
        after = s.stats()
        prof = s.profile()["decode"]
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
            "prefetch_issued": d("prefetch_issued"), "prefetch_used": d("prefetch_used"),
            "prefetch_wasted": d("prefetch_wasted"), "prefetch_gated": d("prefetch_gated"),
            # the lookahead gate at the end: per layer, the ranks of its prediction it reads
            # (0 for dense layers and the first MoE layer, which it never predicts)
            "gate_open_ranks": [int((row >= 0.5).sum()) for row in engine.lookahead_gate()],
            "dispatch_us_per_layer": (1e6 * prof["dispatch_seconds"] / prof["moe_layers"]
                                      if prof["moe_layers"] else None),
            "swap_rate": d("routed_swaps") / d("routed_choices") if d("routed_choices") else None,
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
        s.reset()  # (not truncate: a recurrent model such as Kimi-Linear or K3 cannot rewind)
        s.eval(tokens[:PROMPT])
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

    elapsed = run_threads(work, readers)
    for fd in fds:
        os.close(fd)
    return {"bytes_per_s": sum(done) / elapsed, "readers": readers, "direct": bool(getattr(os, "O_DIRECT", 0))}


def median_run(runs: list[dict]) -> dict:
    """The round with the median seconds per token (so its other figures belong to it)."""
    ordered = sorted(runs, key=lambda r: r["s_per_token"])
    out = dict(ordered[len(ordered) // 2])
    out["rounds_s_per_token"] = [r["s_per_token"] for r in runs]
    return out


def prepare(a, where: Path) -> Path:
    """Write and convert the synthetic model, or reuse the one a run with the same flags left."""
    if a.family != "qwen3moe":
        return prepare_kimi(a, where)
    tag = f"synth-{a.size_gb:g}gb-{'corr' if a.correlated else 'rand'}"
    container = where / f"{tag}.ferry"
    if (container / "manifest.json").exists() and (where / f"{tag}.done").exists():
        return container
    ckpt = make(parse(["--out", str(where / f"{tag}-ckpt"), "--layers", "8", "--dim", "1024", "--expert-ffn", "512",
                       "--top-k", "8", "--heads", "8", "--vocab", "2048", "--size-gb", str(a.size_gb)]
                      + (["--same-router"] if a.correlated else [])))
    convert(ckpt, container, expert_format="q4_1")
    shutil.rmtree(ckpt, ignore_errors=True)
    (where / f"{tag}.done").write_text("converted\n")
    return container


#: The Kimi-family shapes: the releases' expert counts, top-k and routing
#: (/work/shared/spec: K3 896 experts, top 16, one group, sigmoid + bias,
#: renormalised, 2 shared experts, the latent MoE; Kimi-Linear 256 experts,
#: top 8, one group, routed scale 2.446, 1 shared expert), with few layers and
#: narrow matrices so that they fit this box: K3's 7-layer tiny layout (6 MoE
#: layers, width 64, experts 512 x 128 on a 128-wide latent), Kimi-Linear's
#: 8 layers (3 KDA : 1 MLA, 7 MoE), width 128, experts 512 x 128. With q4_1
#: experts every record is 126,976 bytes (the release's: ~11.8 MB at 3 bits).
KIMI_SHAPES = {
    "k3": ["--experts", "896", "--top-k", "16", "--expert-ffn", "512", "--latent", "128"],
    "kimi_linear": ["--experts", "256", "--top-k", "8", "--expert-ffn", "512", "--dim", "128", "--layers", "8"],
}


def prepare_kimi(a, where: Path) -> Path:
    tag = f"synth-{a.family}-" + "-".join(KIMI_SHAPES[a.family][1::2])
    container = where / f"{tag}.ferry"
    if (container / "manifest.json").exists() and (where / f"{tag}.done").exists():
        return container
    ckpt = make(parse(["--out", str(where / f"{tag}-ckpt"), "--family", a.family, *KIMI_SHAPES[a.family]]))
    convert(ckpt, container, expert_format="q4_1")
    shutil.rmtree(ckpt, ignore_errors=True)
    (where / f"{tag}.done").write_text("converted\n")
    return container


def routing_modes(top_k: int, margins: list[float]) -> dict:
    """Opt-in routing: top-k, 3k/4, k/2, k/4 experts per token (16/12/8/4 on
    K3), and cache-aware margins at the model's k (margin 0 is exact routing
    set explicitly: it must read what "streaming" reads)."""
    modes = {}
    for n in sorted({top_k, max(1, 3 * top_k // 4), max(1, top_k // 2), max(1, top_k // 4)}, reverse=True):
        if n != top_k:
            modes[f"top{n}"] = {"routing": (n, 0.0)}
    for m in margins:
        modes[f"cache_aware_{m:g}"] = {"routing": (None, m)}
    return modes


def stream_modes(a, container: Path, plan, tokens: list[int], budget: int, top_k: int) -> dict:
    """Every decode mode in interleaved rounds, with the compute and disk floors."""
    modes = {
        "streaming": {},
        "synchronous": {"overlap": False, "lookahead": False},
        "no_lookahead": {"lookahead": False},
        "always_prefetch": {"lookahead_gate": False},
    }
    if a.routing:
        modes.update(routing_modes(top_k, [float(m) for m in a.margins.split(",") if m]))
    runs: dict[str, list[dict]] = {m: [] for m in modes}
    compute, disk, load = [], [], []
    names = list(modes)
    for r in range(max(1, a.rounds)):
        load.append(os.getloadavg()[0])
        # each round starts one mode later, so that no mode always runs first
        # (after the disk test, whose burst a virtual disk may throttle)
        for m in names[r % len(names):] + names[:r % len(names)]:
            runs[m].append(decode_run(container, tokens, ram_budget=budget, readers=a.readers, **modes[m]))
        compute.append(compute_floor(container, tokens)["s_per_token"])
        disk.append(disk_bandwidth(container, plan.record_bytes, a.readers)["bytes_per_s"])
    res = {m: median_run(r) for m, r in runs.items()}
    streaming, sync = res["streaming"], res["synchronous"]
    # The best bandwidth any round saw: the disk gives at least that, so the
    # floor stays a lower bound when a neighbour slows one measurement.
    bandwidth = float(max(disk))
    compute_s = float(np.median(compute))
    # The bytes that must be read: the fewest any mode read at this budget
    # (the lookahead's wrong guesses are extra reads, not a lower floor).
    must_read = min(r["bytes_per_token"] for m, r in res.items() if m in ("streaming", "synchronous", "no_lookahead"))
    disk_floor = must_read / bandwidth
    larger = max(disk_floor, compute_s)
    return {
        "rounds_load_1min": load,
        **res,
        "compute_floor_s_per_token": compute_s, "compute_floor_rounds": compute,
        "disk": {"bytes_per_s": bandwidth, "median_bytes_per_s": float(np.median(disk)), "rounds_bytes_per_s": disk,
                 "readers": a.readers, "direct": bool(getattr(os, "O_DIRECT", 0))},
        "must_read_bytes_per_token": must_read,
        "disk_floor_s_per_token": disk_floor,
        "larger_floor": "disk" if disk_floor >= compute_s else "compute",
        "ratio_to_larger_floor": streaming["s_per_token"] / larger,
        "speedup_vs_synchronous": sync["s_per_token"] / streaming["s_per_token"],
        "speedup_vs_overlap_only": res["no_lookahead"]["s_per_token"] / streaming["s_per_token"],
        "speedup_vs_always_prefetch": res["always_prefetch"]["s_per_token"] / streaming["s_per_token"],
        "rounds_speedup_vs_always_prefetch": [y["s_per_token"] / x["s_per_token"]
                                              for x, y in zip(runs["streaming"], runs["always_prefetch"])],
        "rounds_speedup_vs_synchronous": [y["s_per_token"] / x["s_per_token"]
                                          for x, y in zip(runs["streaming"], runs["synchronous"])],
        "rounds_speedup_vs_overlap_only": [y["s_per_token"] / x["s_per_token"]
                                           for x, y in zip(runs["streaming"], runs["no_lookahead"])],
    }


#: Tokens of the prompt chunk the dispatch is timed on (one chunk: FE_CHUNK).
DISPATCH_PROMPT = 32


def dispatch_compare(a, container: Path, plan, vocab: int, budget: int) -> dict:
    """The expert dispatch's own CPU time per MoE layer and token
    (ferry_profile_part.dispatch_seconds: routing, collecting the distinct
    experts, the cache visit, the lookahead's routing, moving rows, the
    weighted sum; not the router's or the experts' products, not read waits),
    this build against the baseline's (bench/baseline_core.py: before the
    O(E n K) scan was removed), each run in a fresh process, in interleaved
    rounds whose order alternates. "in RAM": every expert the tokens choose is
    already cached (the tokens run twice); "streaming": the bench's budget."""
    from bench import baseline_core

    old = baseline_core.build(a.baseline or baseline_core.BASELINE)
    new = Path(__file__).resolve().parents[1]
    everything = plan.floor_bytes + plan.expert_bytes + 8 * plan.record_bytes
    rng = np.random.default_rng(9)
    tokens = [int(t) for t in rng.integers(3, vocab, DISPATCH_PROMPT + a.tokens)]
    base = {"tokens": tokens, "prompt": DISPATCH_PROMPT}
    variants = {
        "before, in RAM": (old, {"budget": everything, "warm": True, "lookahead": True}),
        "after, in RAM": (new, {"budget": everything, "warm": True, "lookahead": True}),
        "after, in RAM, no lookahead": (new, {"budget": everything, "warm": True, "lookahead": False}),
        "before, streaming": (old, {"budget": budget, "warm": False, "lookahead": True}),
        "after, streaming": (new, {"budget": budget, "warm": False, "lookahead": True}),
    }
    worker = Path(__file__).resolve().parent / "dispatch_worker.py"
    rounds = []
    for r in range(max(1, a.rounds)):
        row = {"load_1min": os.getloadavg()[0]}
        for name in (list(variants) if r % 2 == 0 else list(reversed(variants))):
            tree, spec = variants[name]
            done = subprocess.run([sys.executable, str(worker), str(tree), str(container),
                                   json.dumps({**base, **spec})], capture_output=True, text=True, cwd=tree)
            if done.returncode:
                raise SystemExit(f"dispatch run {name!r} failed:\n{done.stderr[-3000:]}")
            row[name] = json.loads(done.stdout.splitlines()[-1])
        rounds.append(row)
    summary = {}
    for name in variants:
        summary[name] = {k: float(np.median([rd[name][k]["us_per_layer_token"] for rd in rounds]))
                         for k in ("prompt", "decode")}
    for where in ("in RAM", "streaming"):
        b, f = summary[f"before, {where}"], summary[f"after, {where}"]
        summary[f"before/after, {where}"] = {k: b[k] / f[k] for k in ("prompt", "decode")}
    return {"baseline": a.baseline or baseline_core.BASELINE, "prompt_tokens": DISPATCH_PROMPT,
            "decode_tokens": a.tokens, "us_per_layer_token_median": summary, "rounds": rounds}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-gb", type=float, default=2.0, help="bf16 checkpoint size")
    ap.add_argument("--budget-frac", type=float, default=0.25, help="cache as a share of all experts")
    ap.add_argument("--tokens", type=int, default=24, help="decode steps")
    ap.add_argument("--readers", type=int, default=4)
    ap.add_argument("--workdir", default=None, help="where to write the model (default: a temp dir)")
    ap.add_argument("--correlated", action="store_true",
                    help="one router for all layers (routing predictable across layers, as in real models)")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved repetitions of every mode")
    ap.add_argument("--family", choices=["qwen3moe", "k3", "kimi_linear"], default="qwen3moe",
                    help="the synthetic model's shape (k3 and kimi_linear: see KIMI_SHAPES)")
    ap.add_argument("--routing", action="store_true",
                    help="also measure the opt-in routing modes (fewer experts per token, cache-aware margins)")
    ap.add_argument("--margins", default="0,0.02,0.1", help="cache-aware margins to measure with --routing")
    ap.add_argument("--dispatch", action="store_true",
                    help="also time the expert dispatch's own CPU work per MoE layer, this build against "
                         "--baseline (Kimi families), in interleaved rounds")
    ap.add_argument("--baseline", default=None,
                    help="the revision to compare the dispatch with (default: the commit before core_c/src/moe.c)")
    ap.add_argument("--no-stream", action="store_true", help="with --dispatch: skip the streaming modes")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    if a.workdir:
        Path(a.workdir).mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=a.workdir) as tmp:
        t0 = time.perf_counter()
        container = prepare(a, Path(a.workdir) if a.workdir else Path(tmp))
        prep = time.perf_counter() - t0
        plan = container_plan(container, 256)
        all_experts = plan.expert_bytes
        budget = plan.floor_bytes + int(a.budget_frac * all_experts) + 8 * plan.record_bytes
        with Engine(container, n_ctx=256, threads=1) as probe:
            info = probe.info
        rng = np.random.default_rng(5)
        tokens = [int(t) for t in rng.integers(3, info.vocab, PROMPT + a.tokens)]
        result = {
            "machine": {"arch": platform.machine(), "cpus": os.cpu_count()}, "load_1min_at_start": os.getloadavg()[0],
            "family": a.family, "experts": info.n_experts, "top_k": info.top_k, "moe_layers": info.n_moe_layers,
            "routing": "correlated" if a.correlated else "random",
            "model_bytes": sum(p.stat().st_size for p in container.rglob("*.bin")), "budget_bytes": budget,
            "budget_frac": a.budget_frac, "record_bytes": plan.record_bytes, "rounds": max(1, a.rounds),
            "tokens": a.tokens, "prepare_seconds": round(prep, 1),
        }
        if not a.no_stream:
            result.update(stream_modes(a, container, plan, tokens, budget, info.top_k))
        if a.dispatch:
            result["dispatch"] = dispatch_compare(a, container, plan, info.vocab, budget)
        result["load_1min_at_end"] = os.getloadavg()[0]
    print(json.dumps(result, indent=None if a.json else 1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
