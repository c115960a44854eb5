"""Where a token's time goes: the C core's per-stage profile of decode and of
prompt chunks, plus the Python work around each token of a real answer.

    python bench/profile_decode.py [--model demo|CONTAINER] [--tokens 64] [--threads 2] [--json]

Runs one greedy answer through LoadedModel.generate (the path every front end
uses) with the session's profiling on, then prints per-token milliseconds:
the core's stages (matrix products by format, attention, norms,
element-wise work, thread-pool waits, the rest), and the Python side: the
wall time between Token events minus the core's eval time (events, the
sampler, detokenising, stop checks), with the sampler (greedy and a
temperature/top-p one) and the stream decoder also timed alone on the same
logits and tokens.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

from app.model import LoadedModel, StreamDecoder, Token  # noqa: E402
from app.sampling import Sampler, SamplingParams  # noqa: E402


def per_token_ms(part: dict) -> dict:
    n = max(1, part["tokens"])
    ms = lambda sec: round(1000.0 * sec / n, 4)  # noqa: E731
    out = {"tokens": part["tokens"], "total": ms(part["total_seconds"])}
    for fmt, m in part["matmul"].items():
        out[f"matmul_{fmt}"] = ms(m["seconds"])
        out[f"matmul_{fmt}_GBps"] = round(m["bytes"] / m["seconds"] / 1e9, 2) if m["seconds"] else None
    for k in ("attention_seconds", "norm_seconds", "elementwise_seconds", "expert_seconds", "expert_ffn_seconds",
              "expert_wait_seconds", "dispatch_seconds", "pool_wait_seconds", "other_seconds"):
        out[k.replace("_seconds", "")] = ms(part[k])
    out["pool_jobs"] = round(part["pool_jobs"] / n, 1)
    if part["moe_layers"]:  # the expert dispatch per MoE layer pass
        out["dispatch_us_per_moe_layer"] = round(1e6 * part["dispatch_seconds"] / part["moe_layers"], 2)
    matmul = sum(m["seconds"] for m in part["matmul"].values())
    out["non_matmul_share"] = round(1 - matmul / part["total_seconds"], 4) if part["total_seconds"] else None
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="demo")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    if a.model == "demo":
        from app import demo
        path = demo.ensure_demo()
    else:
        path = Path(a.model)
    model = LoadedModel(path, threads=a.threads)
    session = model.new_session(2048)
    session.set_profiling(True)
    prompt = model.encode_chat([{"role": "user", "content": "Write a long story about a lighthouse keeper."}])
    stamps, toks = [], []
    for ev in model.generate(session, prompt, max_tokens=a.tokens, stop_ids=[]):
        if isinstance(ev, Token):
            stamps.append(time.perf_counter())
            toks.append(ev.id)
    prof = session.profile()
    dec = prof["decode"]
    gaps = np.diff(stamps) if len(stamps) > 1 else np.array([0.0])
    wall_ms = 1000.0 * float(gaps.mean())
    core_ms = 1000.0 * dec["total_seconds"] / max(1, dec["tokens"])
    # The Python pieces alone, on the same logits and tokens.
    logits = session.eval([toks[-1]])
    greedy = Sampler(SamplingParams())
    warm = Sampler(SamplingParams(temperature=0.8, top_p=0.95, seed=1))
    reps = 50
    t0 = time.perf_counter()
    for _ in range(reps):
        greedy(logits)
    greedy_ms = 1000.0 * (time.perf_counter() - t0) / reps
    t0 = time.perf_counter()
    for _ in range(reps):
        warm(logits)
    warm_ms = 1000.0 * (time.perf_counter() - t0) / reps
    dec_stream = StreamDecoder(model.tokenizer)
    t0 = time.perf_counter()
    for t in toks:
        dec_stream.push(t)
    detok_ms = 1000.0 * (time.perf_counter() - t0) / max(1, len(toks))
    out = {"model": str(path), "threads": a.threads, "decode": per_token_ms(dec),
           "prompt_chunk": per_token_ms(prof["prompt"]),
           "python": {"wall_ms_per_token": round(wall_ms, 4), "core_eval_ms_per_token": round(core_ms, 4),
                      "python_ms_per_token": round(wall_ms - core_ms, 4),
                      "python_share": round((wall_ms - core_ms) / wall_ms, 4) if wall_ms else None,
                      "sampler_greedy_ms": round(greedy_ms, 4), "sampler_temp_top_p_ms": round(warm_ms, 4),
                      "detokenise_ms": round(detok_ms, 4)}}
    session.close()
    model.close()
    print(json.dumps(out, indent=None if a.json else 1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
