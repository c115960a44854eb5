"""A second question about the same image on a recurrent model (Kimi K3): the prompt positions read
again and the time to the follow-up's first token, resuming from the state the first turn kept
(``Session.resume_point``, the default) against re-reading the whole prompt (the behaviour before:
the KDA state cannot rewind, so the session started over).

    PYTHONPATH=. python bench/image_followup.py [--size 400x300] [--budget 1024] [--rounds 3] [--json]

Builds the tiny K3 with its tiny tower (tests/kimi/tiny_k3.py: patch 4, so a budget of 1,024 patches
gives about 256 image positions, as the release's default budget does for a photo), asks about an
image, then asks a follow-up in both modes, interleaved, checking the answers are identical. The tower's
rows are cached in both modes (the tower is not part of what is measured). The tiny model's layers are
small, so its seconds say little about a real K3; the positions read are what carries over (each costs
the real model a prompt token's time).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="400x300", help="the image's width x height in pixels")
    ap.add_argument("--budget", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    import io

    from PIL import Image

    from app.api import EngineService, SamplingParams, TurnRequest
    from app.convert.convert import convert
    from app.model import LoadedModel
    from app.vision.image import data_url
    from tests.kimi import tiny_k3

    w, h = (int(x) for x in a.size.split("x"))
    buf = io.BytesIO()
    Image.new("RGB", (w, h), (200, 30, 10)).save(buf, "PNG")
    url = data_url(buf.getvalue())
    ask = [{"role": "user", "content": [{"type": "text", "text": "What is in this picture?"},
                                        {"type": "image_url", "image_url": {"url": url}}]}]

    def req(messages):
        return TurnRequest(messages, image_patch_budget=a.budget, max_tokens=8, top_logprobs=2,
                           sampling=SamplingParams(temperature=0.0))

    def run(service, messages):
        t = time.perf_counter()
        end = None
        for ev in service.submit(req(messages)):
            end = ev
        return end, time.perf_counter() - t

    rows = {"resume": [], "reread": []}
    with tempfile.TemporaryDirectory(prefix="ferry-followup-bench-") as tmp:
        tiny_k3.build(Path(tmp) / "ckpt", vision=True)
        model = LoadedModel(convert(Path(tmp) / "ckpt", Path(tmp) / "k3.ferry"), threads=a.threads)
        answers = {}
        try:
            for r in range(a.rounds):
                for mode in (("resume", "reread") if r % 2 == 0 else ("reread", "resume")):
                    service = EngineService(model, model.new_session(2048))
                    try:
                        one, _ = run(service, ask)
                        follow = [*ask, {"role": "assistant", "content": one.content,
                                         "reasoning_content": one.reasoning or None},
                                  {"role": "user", "content": "And what colour is it?"}]
                        if mode == "reread":
                            service.session.resume_point = None    # as before: nothing kept, the state restarts
                        two, seconds = run(service, follow)
                    finally:
                        service.close()
                    answers.setdefault(mode, (two.token_ids, two.logprobs))
                    rows[mode].append({"prompt": two.prompt_tokens, "read": two.prompt_tokens - two.reused_tokens,
                                       "reused": two.reused_tokens, "seconds": seconds, "ttft": two.ttft_s,
                                       "image_positions": one.prompt_ids.count(tiny_k3.MEDIA_PAD),
                                       "first_prompt": one.prompt_tokens})
        finally:
            model.close()
    identical = answers["resume"] == answers["reread"]
    summary = {m: {"prompt": v[0]["prompt"], "read": v[0]["read"], "reused": v[0]["reused"],
                   "image_positions": v[0]["image_positions"], "first_prompt": v[0]["first_prompt"],
                   "median_seconds": round(statistics.median(x["seconds"] for x in v), 4),
                   "median_ttft_s": round(statistics.median(x["ttft"] for x in v), 4)} for m, v in rows.items()}
    doc = {"bench": "image_followup", "size": a.size, "budget": a.budget, "rounds": a.rounds,
           "threads": a.threads, "cpu_count": os.cpu_count(), "load_1min": round(os.getloadavg()[0], 1),
           "identical_answers": identical, "modes": summary}
    if a.json:
        print(json.dumps(doc, indent=1))
    else:
        for m, s in summary.items():
            print(f"{m:>7}: follow-up prompt {s['prompt']} ({s['image_positions']} image positions), read "
                  f"{s['read']}, reused {s['reused']}; {s['median_seconds']:.3f} s, first token "
                  f"{s['median_ttft_s']:.3f} s")
        print(f"identical answers: {identical}; load {doc['load_1min']}")
    return 0 if identical else 1


if __name__ == "__main__":
    raise SystemExit(main())
