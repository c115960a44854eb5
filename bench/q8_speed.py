"""Exact (f32) against the opt-in 8-bit activations (q8): decode and prompt
tokens per second on the same containers, in one process, interleaved.

    python bench/q8_speed.py --json [--files demo 1b-q4_k_m 1b-q8_0] [--rounds 5] [--threads 2]

Both engines stay open side by side (one session each); every round runs a
fresh ``--prompt``-token prompt (chunks of 32, as the app evaluates prompts)
and then ``--tokens`` greedy decode steps on each engine, the engine that goes
first alternating by round. Prints the medians per file and engine, the ratios
q8 / f32 (above 1: q8 is faster), the share of greedy tokens on which the two
engines agreed, and the 1-minute load average before and after each round.
Files: ``demo`` is the converted demo model (SmolLM2-135M-Instruct Q4_1),
``1b-*`` the synthetic Llama-shaped containers bench/vs_llamacpp.py makes in
``--workdir`` (random weights: speed only).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script from anywhere

FILES = ("demo", "1b-q4_k_m", "1b-q8_0", "3b-q4_k_m", "3b-q8_0")
MODES = ("f32", "q8")


def container(name: str, workdir: Path) -> Path:
    if name == "demo":
        from app import demo
        return _converted(demo.gguf_path(install=True), workdir)
    path = workdir / f"synthetic-{name}.ferry"
    if not (path / "manifest.json").exists():
        raise SystemExit(f"{path} is missing: run bench/vs_llamacpp.py --files {name} once to make it")
    return path


def _converted(gguf: Path, workdir: Path) -> Path:
    out = workdir / (gguf.stem + ".ferry")
    if not (out / "manifest.json").exists():
        from app.convert.convert import convert
        convert(gguf, out)
    return out


def one_round(session, vocab: int, prompt_len: int, tokens: int, seed: int) -> dict:
    import numpy as np
    rng = np.random.default_rng(seed)
    prompt = [int(t) for t in rng.integers(100, vocab - 100, prompt_len)]
    session.reset()
    t0 = time.perf_counter()
    logits = session.eval(prompt)
    prompt_s = time.perf_counter() - t0
    tok, out = int(np.argmax(logits)), []
    t0 = time.perf_counter()
    for _ in range(tokens):
        out.append(tok)
        tok = int(np.argmax(session.eval([tok])))
    decode_s = time.perf_counter() - t0
    return {"prompt_tok_s": prompt_len / prompt_s, "decode_tok_s": tokens / decode_s, "greedy": out}


def bench_file(path: Path, a) -> dict:
    from app.engine.binding import Engine
    engines = {m: Engine(path, threads=a.threads, n_ctx=a.prompt + a.tokens + 8, activations=m) for m in MODES}
    sessions = {m: e.session(a.prompt + a.tokens + 8) for m, e in engines.items()}
    vocab, kernels = engines["f32"].info.vocab, engines["f32"].info.kernels
    rounds = []
    for r in range(a.rounds):
        order = MODES if r % 2 == 0 else MODES[::-1]
        rnd = {"order": list(order), "load1_before": os.getloadavg()[0]}
        for m in order:
            rnd[m] = one_round(sessions[m], vocab, a.prompt, a.tokens, seed=r)
        rnd["load1_after"] = os.getloadavg()[0]
        rnd["greedy_agree"] = sum(x == y for x, y in zip(rnd["f32"].pop("greedy"), rnd["q8"].pop("greedy"))) / a.tokens
        rounds.append(rnd)
        print(json.dumps({"file": path.name, "round": r + 1, **rnd}), file=sys.stderr, flush=True)
    med = {m: {k: statistics.median(r[m][k] for r in rounds) for k in ("prompt_tok_s", "decode_tok_s")} for m in MODES}
    for s in sessions.values():
        s.close()
    for e in engines.values():
        e.close()
    return {"kernels": kernels, "rounds": rounds, "median": med,
            "q8_over_f32": {k: med["q8"][k] / med["f32"][k] for k in ("prompt_tok_s", "decode_tok_s")},
            "greedy_agree_median": statistics.median(r["greedy_agree"] for r in rounds)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="one line of JSON (default: indented)")
    ap.add_argument("--files", nargs="+", choices=FILES, default=["demo", "1b-q4_k_m", "1b-q8_0"])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt", type=int, default=128, help="prompt tokens per round")
    ap.add_argument("--tokens", type=int, default=16, help="decoded tokens per round")
    ap.add_argument("--workdir", type=Path, default=Path.home() / ".cache" / "ferry-bench")
    a = ap.parse_args(argv)
    results = {name: bench_file(container(name, a.workdir), a) for name in a.files}
    cpu = ""
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    print(json.dumps({"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "machine": platform.machine(),
                      "cpu": cpu, "cores": os.cpu_count(), "threads": a.threads, "prompt": a.prompt,
                      "tokens": a.tokens, "rounds": a.rounds, "files": results}, indent=None if a.json else 1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
