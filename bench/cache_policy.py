"""Expert-cache replacement policies on the real OLMoE routing trace, and
the C policy's cost per operation at a Kimi-K3-like size.

    python bench/cache_policy.py [--trace FILE] [--from-source] --json

Prints one JSON object:
  table        slots -> OPT and every policy's hit rate and ratio to OPT,
               cold, whole trace (299 tokens)
  warm         prior = hot list of tokens 0-149, replay of tokens 150-298,
               beside the cold replay of the same tokens
  first_pass   prior = hot list of the whole trace, replay of the whole
               trace (trained on the evaluated tokens: an upper reference)
  halves       small caches, no tuning on the test set: the trace split by
               token range into tokens 0-148 (where policy ideas are tried)
               and 149-298 (held out), each replayed cold on its own; OPT,
               the engine's policy, echo (the engine's before issue 17),
               reuse and the one-token oracle at
               SMALL slot counts (issue 17); engine_learned: the engine's
               policy starting (empty cache) from the learned state saved
               after the OTHER half (fe_cache_policy_save_state)
  horizon      NOT an online policy, an upper reference: the hit rate of a
               cache that knows the next h tokens' routing exactly (Belady
               inside that horizon, fewest requests so far beyond it), for
               h = 1, 2, 4, 8, at the headline sizes
  curve        the engine's policy, cold, whole trace, by the cache's size in
               token working sets (slots / 128): app.engine.speed.HIT_CURVE,
               the hit rate the speed model expects (ferry get --plan)
  timing       seconds per request / layer visit / token of each policy on a
               synthetic Zipf-routed trace: 92 MoE layers x 896 experts,
               top 16, 2000 slots (hit rates there mean nothing)
--from-source compiles ferry_cachesim.h privately (as the tests do) instead
of importing the installed app.engine._ferry_c.
"""
from __future__ import annotations

import argparse
import datetime
import json
import platform
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
TRACE = Path("/work/shared/data/traces/olmoe-1b-7b_299tok.jsonl")
EXPERTS = 64
HEADLINE = (61, 128, 256)
SMALL = (32, 61, 96, 128, 256)
SWEEP = (16, 32, 61, 96, 128, 192, 256, 384, 512, 768)
#: "curve": cache sizes in token working sets (app.engine.speed.HIT_CURVE's points).
CURVE = (0.0625, 0.125, 0.1875, 0.25, 0.375, 0.5, 0.625, 0.75, 0.875, 1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 3.5, 4.0)
K3 = {"tokens": 200, "layers": 92, "experts": 896, "top_k": 16, "slots": 2000, "zipf_s": 0.8}


def cpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return platform.processor()
    fields = dict(line.split(":", 1) for line in out.splitlines() if ":" in line)
    return f"{fields.get('Model name', '?').strip()}, {fields.get('CPU(s)', '?').strip()} CPUs"


def policy_table(cachesim, trace, lib) -> dict:
    names = [n for n in cachesim.policy_names(lib) if n != cachesim.ENGINE]
    table = {}
    for slots in SWEEP:
        row = {}
        for name in names:
            r = cachesim.simulate(trace, EXPERTS, slots, name, lib=lib)
            row[name] = {"hit_rate": round(r["hit_rate"], 4), "ratio_to_opt": round(r["ratio_to_opt"], 3)}
        table[str(slots)] = {"opt": round(r["opt_hit_rate"], 4), **row}
    return table


def warm_table(cachesim, evaluated, prior, lib) -> dict:
    names = [n for n in cachesim.policy_names(lib) if n != cachesim.ENGINE]
    out = {}
    for slots in HEADLINE:
        row = {}
        for name in names:
            cold = cachesim.simulate(evaluated, EXPERTS, slots, name, lib=lib)
            warm = cachesim.simulate(evaluated, EXPERTS, slots, name, prior=prior, lib=lib)
            row[name] = {"cold": round(cold["hit_rate"], 4), "warm": round(warm["hit_rate"], 4)}
        out[str(slots)] = {"opt": round(cold["opt_hit_rate"], 4), **row}
    return out


def zipf_trace(rng) -> np.ndarray:
    """Per layer, experts drawn without replacement with Zipf weights over a
    random permutation of ids."""
    weights = 1.0 / np.arange(1, K3["experts"] + 1) ** K3["zipf_s"]
    weights /= weights.sum()
    trace = np.empty((K3["tokens"], K3["layers"], K3["top_k"]), dtype=np.int32)
    for layer in range(K3["layers"]):
        perm = rng.permutation(K3["experts"])
        for t in range(K3["tokens"]):
            trace[t, layer] = perm[rng.choice(K3["experts"], K3["top_k"], replace=False, p=weights)]
    return trace


def timing(cachesim, lib) -> dict:
    """Best of three wall times of one C replay per policy (the call alone)."""
    trace = zipf_trace(np.random.default_rng(3))
    ffi, c = lib
    ids = ffi.cast("const int32_t *", ffi.from_buffer(trace))
    out = ffi.new("ferry_cachesim_result *")
    err = ffi.new("char[]", 256)
    shape = (ids, K3["tokens"], K3["layers"], K3["top_k"], K3["experts"], K3["slots"])
    policies = {n: v for n, v in cachesim.policy_names(lib).items() if n != cachesim.ENGINE}
    runs = {}
    for name, value in [*policies.items(), ("opt", None)]:
        best = float("inf")
        for _ in range(3):
            t0 = time.perf_counter()
            status = (c.ferry_cache_simulate_opt(*shape, out, err, 256) if value is None else
                      c.ferry_cache_simulate(*shape, value, ffi.NULL, out, err, 256))
            best = min(best, time.perf_counter() - t0)
            if status != c.FERRY_CACHE_OK:
                raise RuntimeError(ffi.string(err).decode())
        runs[name] = {"ns_per_request": round(best / trace.size * 1e9, 1),
                      "us_per_layer_visit": round(best / (K3["tokens"] * K3["layers"]) * 1e6, 2),
                      "ms_per_token": round(best / K3["tokens"] * 1e3, 3)}
    return {"shape": K3, **runs}


def horizon_hit_rate(trace: np.ndarray, slots: int, horizon: int | None) -> float:
    """Hit rate of a cache that sees `horizon` tokens ahead (None: the whole
    future, which is Belady's OPT). Same cache model as the C simulator: one
    pool for all layers, a layer's set requested and pinned together, every
    miss inserted. A victim whose next request lies inside the horizon is
    chosen farthest-first; one beyond it (unknown to this cache) goes first,
    the one with the fewest requests so far. A reference, never a policy."""
    n_tok, n_layers, _ = trace.shape
    visits = [(l, [int(e) for e in trace[t, l]]) for t in range(n_tok) for l in range(n_layers)]
    never = len(visits) * 2
    next_use: list[dict[int, int]] = [{} for _ in visits]
    last: dict[tuple[int, int], int] = {}
    for i in range(len(visits) - 1, -1, -1):
        l, experts = visits[i]
        next_use[i] = {e: last.get((l, e), never) for e in experts}
        for e in experts:
            last[(l, e)] = i
    resident: dict[tuple[int, int], int] = {}  # key -> index of its next request
    counts: dict[tuple[int, int], int] = {}
    hits = requests = 0
    for i, (l, experts) in enumerate(visits):
        seen = never * 2 if horizon is None else i + horizon * n_layers
        pinned = {(l, e) for e in experts}
        for k in pinned:
            requests += 1
            counts[k] = counts.get(k, 0) + 1
            hits += k in resident
        for k in pinned:
            if k in resident:
                continue
            if len(resident) >= slots:
                victim = max((c for c in resident if c not in pinned),
                             key=lambda c: (0, resident[c]) if resident[c] <= seen else (1, -counts[c]))
                del resident[victim]
            resident[k] = never
        for e in experts:
            resident[(l, e)] = next_use[i][e]
    return hits / requests


def horizon_table(trace: np.ndarray) -> dict:
    out = {}
    for slots in HEADLINE:
        opt = horizon_hit_rate(trace, slots, None)
        row = {"opt": round(opt, 4)}
        for h in (1, 2, 4, 8):
            r = horizon_hit_rate(trace, slots, h)
            row[f"next_{h}"] = {"hit_rate": round(r, 4), "ratio_to_opt": round(r / opt, 3)}
        out[str(slots)] = row
    return out


def halves_table(cachesim, trace, lib) -> dict:
    """Cold replays of each token half on its own at the SMALL sizes."""
    half = trace.shape[0] // 2
    out = {}
    for label, part in (("tune", trace[:half]), ("held_out", trace[half:])):
        rows = {}
        for slots in SMALL:
            engine = cachesim.simulate(part, EXPERTS, slots, lib=lib)
            opt = engine["opt_hit_rate"]
            row = {"opt": round(opt, 4)}
            for r in (engine, *(cachesim.simulate(part, EXPERTS, slots, name, lib=lib)
                                for name in ("echo", "reuse"))):
                row[r["policy"]] = {"hit_rate": round(r["hit_rate"], 4),
                                    "ratio_to_opt": round(r["ratio_to_opt"], 3)}
            other = trace[half:] if label == "tune" else trace[:half]
            learned = cachesim.simulate(np.concatenate([other, part]), EXPERTS, slots,
                                        lib=lib, learn_tokens=len(other))
            row["engine_learned"] = {"hit_rate": round(learned["hit_rate"], 4),
                                     "ratio_to_opt": round(learned["ratio_to_opt"], 3)}
            oracle = horizon_hit_rate(part, slots, 1)
            row["next_1"] = {"hit_rate": round(oracle, 4), "ratio_to_opt": round(oracle / opt, 3)}
            rows[str(slots)] = row
        first = 0 if label == "tune" else half
        out[label] = {"tokens": [first, first + part.shape[0] - 1], "slots": rows}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trace", type=Path, default=TRACE)
    ap.add_argument("--from-source", action="store_true")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    sys.path.insert(0, str(REPO))
    from app.engine import cachesim

    if a.from_source:
        import tempfile

        from tests.engine.test_cache_policy import build_private_lib

        lib = build_private_lib(Path(tempfile.mkdtemp(prefix="ferry-cachesim-")))
    else:
        from app.engine import _ferry_c

        lib = (_ferry_c.ffi, _ferry_c.lib)
    trace = cachesim.load_trace(a.trace)
    half = trace.shape[0] // 2
    first_half_counts = cachesim.usage_counts(trace[:half], EXPERTS)
    all_counts = cachesim.usage_counts(trace, EXPERTS)
    result = {
        "machine": f"{platform.machine()} {cpu_model()}",
        "date": datetime.date.today().isoformat(),
        "command": "python bench/cache_policy.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "trace": {"file": str(a.trace), "tokens": trace.shape[0], "layers": trace.shape[1],
                  "top_k": trace.shape[2], "experts_per_layer": EXPERTS},
        "engine": {str(s): cachesim.simulate(trace, EXPERTS, s, lib=lib) for s in HEADLINE},
        "table": policy_table(cachesim, trace, lib),
        "warm": {"prior_tokens": [0, half - 1], "evaluated_tokens": [half, trace.shape[0] - 1],
                 "slots": warm_table(cachesim, trace[half:], first_half_counts, lib)},
        "first_pass": {str(s): round(cachesim.simulate(trace, EXPERTS, s, prior=all_counts,
                                                       lib=lib)["hit_rate"], 4) for s in HEADLINE},
        "halves": halves_table(cachesim, trace, lib),
        "horizon": horizon_table(trace),
        "timing": timing(cachesim, lib),
        # the engine's policy, cold, by the cache's size in token working sets (slots / (16 layers x top 8)):
        # app.engine.speed.HIT_CURVE, the hit rate the speed model expects
        "curve": {str(r): round(cachesim.simulate(trace, EXPERTS, round(r * 128), lib=lib)["hit_rate"], 3)
                  for r in CURVE},
    }
    if a.json:
        print(json.dumps(result, indent=1))
    else:
        for slots, row in result["table"].items():
            cells = " ".join(f"{n}={v['hit_rate']:.3f}" for n, v in row.items() if n != "opt")
            print(f"{slots:>4} slots  opt={row['opt']:.3f}  {cells}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
