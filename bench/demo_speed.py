"""Conversion and decode speed of the built-in demo model (real weights).

    python bench/demo_speed.py [--tokens 64] [--threads 1 2] --json

Prints one JSON object: conversion seconds and MB/s, then per thread count
the prompt and decode rates of a greedy chat answer.
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from pathlib import Path

from app import demo
from app.convert.convert import convert
from app.model import LoadedModel, run_to_end


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    gguf = demo.gguf_path(install=True)
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        out = convert(gguf, Path(tmp) / "demo.ferry")
        conv_s = time.perf_counter() - t0
        size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
        runs = []
        for threads in a.threads:
            model = LoadedModel(out, threads=threads)
            session = model.new_session(2048)
            prompt = model.encode_chat([{"role": "user", "content": "Write a short story about a lighthouse."}])
            end = run_to_end(model.generate(session, prompt, max_tokens=a.tokens, stop_ids=[]))
            s = end.stats
            runs.append({"threads": threads, "prompt_tokens": s.prompt_tokens,
                         "prompt_tok_per_s": round(s.prompt_tokens / s.prompt_seconds, 2),
                         "decode_tokens": s.decode_tokens,
                         "decode_tok_per_s": round(s.decode_tokens / s.decode_seconds, 2)})
            model.close()
    result = {"machine": platform.machine(), "python": platform.python_version(),
              "convert_seconds": round(conv_s, 3), "container_mb": round(size / 2**20, 1),
              "convert_mb_per_s": round(size / 2**20 / conv_s, 1), "runs": runs}
    print(json.dumps(result, indent=None if a.json else 1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
