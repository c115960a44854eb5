"""Per-token sampler time on real logits of the demo model, this tree's
sampler against an earlier revision's, in interleaved rounds.

    python bench/experiments/sampler_speed.py [--baseline REV] [--rounds 5] [--reps 20] [--json]

The logits are the demo model's (49152-token vocabulary) for a few decoded
tokens of a real answer. The baseline is app/sampling.py as it was at REV
(default: the revision before issue 21's sampler change), loaded from git.
Each round times every setting with both samplers, alternating which goes
first, and checks that both draw the same tokens; likewise the top-5 token
log-probabilities (the server's ``logprobs``) against a stable sort of the
vocabulary. The machine's 1-minute load is recorded per round.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # run as a script from anywhere

from app.model import LoadedModel, Token, _logprob, log_softmax  # noqa: E402
from app.sampling import Sampler, SamplingParams  # noqa: E402

SETTINGS = {
    "temperature 0.8, top_p 0.95": dict(temperature=0.8, top_p=0.95),
    "temperature 0.7, top_k 40, top_p 0.9": dict(temperature=0.7, top_k=40, top_p=0.9),
    "temperature 1.0, min_p 0.05": dict(temperature=1.0, min_p=0.05),
    "temperature 1.0 (no filter)": dict(temperature=1.0),
    "temperature 0.8, top_p 0.95, penalties, 300 tokens seen, 20 biases": dict(
        temperature=0.8, top_p=0.95, frequency_penalty=0.5, presence_penalty=0.3,
        logit_bias=tuple((i * 997 % 49152, 5.0) for i in range(20))),
    "greedy": dict(),
}


def baseline_module(rev: str):
    src = subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:app/sampling.py"], check=True,
                         capture_output=True, text=True).stdout
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(src)
    spec = importlib.util.spec_from_file_location("baseline_sampling", f.name)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod   # dataclasses look their module up
    spec.loader.exec_module(mod)
    os.unlink(f.name)
    return mod


def demo_logits(n_tokens: int) -> list[np.ndarray]:
    from app import demo
    model = LoadedModel(demo.ensure_demo(), threads=2)
    session = model.new_session(512)
    prompt = model.encode_chat([{"role": "user", "content": "Tell me about lighthouses."}])
    toks = [ev.id for ev in model.generate(session, prompt, max_tokens=n_tokens, stop_ids=[])
            if isinstance(ev, Token)]
    session.reset()
    out = [session.eval(prompt)]
    for t in toks[:-1]:
        out.append(session.eval([t]))
    session.close()
    model.close()
    return [np.array(x, dtype=np.float32) for x in out]


def make(cls, params_cls, setting: dict, seen: int):
    s = cls(params_cls(seed=1, **setting))
    if setting.get("frequency_penalty"):
        s.counts.update({i * 131 % 49152: 1 + i % 3 for i in range(seen)})
    return s


def time_one(cls, params_cls, setting, logits, reps) -> tuple[float, list[int]]:
    s = make(cls, params_cls, setting, 300)
    toks = []
    t0 = time.perf_counter()
    for _ in range(reps):
        for x in logits:
            toks.append(s(x))
    return 1000.0 * (time.perf_counter() - t0) / (reps * len(logits)), toks


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--baseline", default="39e2b97")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=8)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    old = baseline_module(a.baseline)
    logits = demo_logits(a.tokens)
    impls = {"before": (old.Sampler, old.SamplingParams), "after": (Sampler, SamplingParams)}
    rounds = []
    # Token log-probabilities with 5 alternatives (the server's logprobs):
    # before, a stable argsort of the vocabulary per token.
    logprob = {"before": lambda x: np.argsort(-log_softmax(x), kind="stable")[:5],
               "after": lambda x: [i for i, _ in _logprob(x, 0, 5).top]}
    for r in range(a.rounds):
        row = {"load_1min": round(os.getloadavg()[0], 2), "ms_per_token": {}, "same_tokens": True}
        for i, (name, setting) in enumerate(SETTINGS.items()):
            order = ["before", "after"] if (r + i) % 2 == 0 else ["after", "before"]
            ms, toks = {}, {}
            for which in order:
                ms[which], toks[which] = time_one(*impls[which], setting, logits, a.reps)
            row["same_tokens"] &= toks["before"] == toks["after"]
            row["ms_per_token"][name] = {k: round(v, 4) for k, v in ms.items()}
        ms, tops = {}, {}
        for which in (["before", "after"] if r % 2 == 0 else ["after", "before"]):
            t0 = time.perf_counter()
            tops[which] = [list(map(int, logprob[which](x))) for _ in range(a.reps) for x in logits]
            ms[which] = 1000.0 * (time.perf_counter() - t0) / (a.reps * len(logits))
        row["same_tokens"] &= tops["before"] == tops["after"]
        row["ms_per_token"]["top_logprobs 5"] = {k: round(v, 4) for k, v in ms.items()}
        rounds.append(row)
    summary = {}
    for name in [*SETTINGS, "top_logprobs 5"]:
        before = float(np.median([rd["ms_per_token"][name]["before"] for rd in rounds]))
        after = float(np.median([rd["ms_per_token"][name]["after"] for rd in rounds]))
        summary[name] = {"before_ms": round(before, 4), "after_ms": round(after, 4),
                         "speedup": round(before / after, 1) if after else None}
    out = {"vocabulary": int(logits[0].size), "logits": len(logits), "baseline": a.baseline,
           "median_of_rounds": summary, "all_same_tokens": all(rd["same_tokens"] for rd in rounds),
           "rounds": rounds}
    print(json.dumps(out, indent=None if a.json else 1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
