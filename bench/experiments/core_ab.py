"""Two builds of the C core on the same containers, in interleaved rounds.

    python bench/experiments/core_ab.py --base DIR [--new DIR] [--files demo 1b-q4_k_m] [--rounds 3]
                            [--tokens 32] [--long 1024] [--threads 2] [--load N] [--activations q8] [--json]

``DIR`` is a checkout with its core built in place (``app/engine/_ferry_c*.so``),
e.g. ``git archive OLD | tar -x -C /tmp/old`` plus a copy of that commit's
built extension. Each measurement is one fresh child process that imports
``app`` from that checkout (the same driver code for both builds): a
128-token prompt, ``--tokens`` greedy decode steps, then after a reset a
``--long``-token prompt, with the core's profile on, and the peak RSS;
the two builds alternating which goes first, rounds interleaved; also the
process's CPU time per decoded and per long-prompt token (robust to other
load with ``--threads 1``; with more threads it includes the pool's spinning). ``--load N``
starts N busy-looping processes for the whole run (an oversubscribed
machine) and stops them at the end. Prints the rounds, the medians and the
ratios new / base (for time to first token and RSS: base / new, so > 1
always means the new build is better).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BENCH = Path.home() / ".cache" / "ferry-bench"
FILES = {"demo": BENCH / "SmolLM2-135M-Instruct.Q4_1.ferry",
         "1b-q4_k_m": BENCH / "synthetic-1b-q4_k_m.ferry",
         "1b-q8_0": BENCH / "synthetic-1b-q8_0.ferry",
         "3b-q4_k_m": BENCH / "synthetic-3b-q4_k_m.ferry",
         "3b-q8_0": BENCH / "synthetic-3b-q8_0.ferry",
         # the in-RAM mixture-of-experts file of bench/vs_llamacpp_moe.py (--layers 16 / 4)
         "moe-16l-q4_0": BENCH / "synthetic-qwen3moe-16l-q4_0.ferry",
         "moe-4l-q4_0": BENCH / "synthetic-qwen3moe-4l-q4_0.ferry"}
METRICS = ("decode_tok_s", "prompt128_tok_s", "prompt_long_tok_s", "ttft_s", "peak_rss_bytes",
           "decode_cpu_ms_per_token", "prompt_long_cpu_ms_per_token")
LOWER_IS_BETTER = ("ttft_s", "peak_rss_bytes", "decode_cpu_ms_per_token", "prompt_long_cpu_ms_per_token")
PROFILE = ("total_seconds", "attention_seconds", "pool_wait_seconds", "pool_jobs", "tokens")


def child(a) -> dict:
    """One measurement with the core of the checkout a.tree (sys.path[0])."""
    import resource

    import numpy as np
    from app.engine.binding import Engine
    eng = Engine(a.model, threads=a.threads, n_ctx=2048, activations=a.activations)
    vocab = eng.info.vocab
    s = eng.session(2048)
    s.set_profiling(True)
    rng = np.random.default_rng(1)
    out = {}
    t0 = time.perf_counter()
    logits = s.eval([int(t) for t in rng.integers(100, vocab - 100, 128)])
    tok = int(np.argmax(logits))
    out["ttft_s"] = time.perf_counter() - t0
    out["prompt128_tok_s"] = 128 / out["ttft_s"]
    t0, c0 = time.perf_counter(), time.process_time()
    for _ in range(a.tokens):
        tok = int(np.argmax(s.eval([tok])))
    out["decode_tok_s"] = a.tokens / (time.perf_counter() - t0)
    out["decode_cpu_ms_per_token"] = 1000 * (time.process_time() - c0) / a.tokens
    prof = s.profile()
    out["profile_decode"] = prof["decode"]
    out["profile_prompt"] = prof["prompt"]
    if a.long:
        s.reset()
        s.set_profiling(True)
        t0, c0 = time.perf_counter(), time.process_time()
        s.eval([int(t) for t in rng.integers(100, vocab - 100, a.long)])
        out["prompt_long_tok_s"] = a.long / (time.perf_counter() - t0)
        out["prompt_long_cpu_ms_per_token"] = 1000 * (time.process_time() - c0) / a.long
        out["profile_prompt"] = s.profile()["prompt"]
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    out["peak_rss_bytes"] = peak if sys.platform == "darwin" else peak * 1024
    s.close()
    eng.close()
    return out


def run_child(tree: Path, model: Path, a) -> dict:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", str(tree), "--model", str(model),
           "--threads", str(a.threads), "--tokens", str(a.tokens), "--long", str(a.long),
           "--activations", a.activations]
    load0 = os.getloadavg()[0]
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=str(tree), timeout=3600)
    load1 = os.getloadavg()[0]
    if done.returncode != 0:
        return {"error": done.stderr[-2000:], "load1": [load0, load1]}
    res = json.loads(done.stdout.strip().splitlines()[-1])
    out = {k: res[k] for k in METRICS if k in res}
    for part in ("decode", "prompt"):
        p = res[f"profile_{part}"]
        n = max(1, p["tokens"])
        out[f"{part}_ms_per_token"] = {k.replace("_seconds", ""): round(1000 * p[k] / n, 3)
                                       for k in PROFILE if k.endswith("_seconds")}
        out[f"{part}_ms_per_token"]["jobs"] = round(p["pool_jobs"] / n, 1)
        if "pool_spin_jobs" in p:  # a build whose pool reports its adaptation
            out[f"{part}_ms_per_token"]["spin_job_share"] = round(p["pool_spin_jobs"] / max(1, p["pool_jobs"]), 3)
            out[f"{part}_ms_per_token"]["backoffs"] = p["pool_backoffs"]
    out["load1"] = [load0, load1]
    return out


def busy_loops(n: int) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", "while 1: pass"]) for _ in range(n)]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", type=Path, required="--child" not in (argv or sys.argv))
    ap.add_argument("--new", type=Path, default=ROOT)
    ap.add_argument("--files", nargs="+", default=["demo", "1b-q4_k_m"], choices=sorted(FILES))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--load", type=int, default=0, help="busy-looping processes to run beside")
    ap.add_argument("--long", type=int, default=1024, help="a long prompt's tokens after the decode (0: none)")
    ap.add_argument("--activations", default="f32", choices=("f32", "q8"), help="both builds' matrix-product mode")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--model", type=Path, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        sys.path.insert(0, str(a.child.resolve()))
        print(json.dumps(child(a)))
        return 0
    trees = {"base": a.base.resolve(), "new": a.new.resolve()}
    loops = busy_loops(a.load)
    results: dict = {f: {"base": [], "new": []} for f in a.files}
    try:
        time.sleep(1.0 if loops else 0.0)
        for r in range(a.rounds):
            for f in a.files:
                order = ("base", "new") if r % 2 == 0 else ("new", "base")
                for build in order:
                    res = run_child(trees[build], FILES[f], a)
                    results[f][build].append(res)
                    print(f"round {r + 1} {f} {build}: " + json.dumps({k: res.get(k) for k in METRICS + ("load1",)}),
                          file=sys.stderr, flush=True)
    finally:
        for p in loops:
            p.kill()
            p.wait()
    summary = {}
    for f, by in results.items():
        med = {b: {k: statistics.median([x[k] for x in rs if k in x]) for k in METRICS
                   if any(k in x for x in rs)} for b, rs in by.items()}
        ratio = {}
        for k in METRICS:
            if k in med["base"] and k in med["new"] and med["base"][k] and med["new"][k]:
                better_low = k in LOWER_IS_BETTER
                ratio[k] = round(med["base"][k] / med["new"][k] if better_low else med["new"][k] / med["base"][k], 3)
        summary[f] = {"median": med, "new_over_base": ratio}
    out = {"date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "load_processes": a.load,
           "threads": a.threads, "tokens": a.tokens, "activations": a.activations, "rounds": results, "summary": summary}
    print(json.dumps(out, indent=None if a.json else 1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
