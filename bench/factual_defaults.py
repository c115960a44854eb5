"""Which sampling default answers short factual questions correctly on a small
model (issue 34: the window's temperature 0.7 made the demo say "La
Faméliaire" for the capital of France). Asks 20 questions with a known
one-word answer, greedy and with each candidate setting (several seeds), and
counts an answer correct when it contains the expected word.

    python bench/factual_defaults.py [--model PATH] [--seeds 5] [--json]

Results: docs/bench-log/2026-12-06.md, "H7: per-model sampling defaults"."""
from __future__ import annotations

import argparse
import dataclasses
import json
import time

from app.api import TurnRequest, open_model
from app.chat.turn import ChatFormat, collect, run_turn
from app.sampling import SamplingParams

QUESTIONS = [
    ("What is the capital of France?", ("paris",)), ("What is the capital of Germany?", ("berlin",)),
    ("What is the capital of Italy?", ("rome",)), ("What is the capital of Japan?", ("tokyo",)),
    ("What is the capital of Spain?", ("madrid",)), ("Which planet is the largest in the solar system?", ("jupiter",)),
    ("Which planet is known as the Red Planet?", ("mars",)), ("How many days are in a week?", ("7", "seven")),
    ("Who wrote Romeo and Juliet?", ("shakespeare",)), ("What is the chemical symbol for gold?", ("au",)),
    ("What colour is a clear daytime sky?", ("blue",)), ("What is the opposite of hot?", ("cold",)),
    ("How many legs does a spider have?", ("8", "eight")),
    ("Who was the first president of the United States?", ("washington",)),
    ("What is the tallest animal in the world?", ("giraffe",)), ("What is H2O commonly called?", ("water",)),
    ("In which direction does the sun rise?", ("east",)), ("What language is mainly spoken in Brazil?", ("portuguese",)),
    ("What is the largest ocean on Earth?", ("pacific",)), ("How many continents are there?", ("7", "seven")),
]

CANDIDATES = {
    "greedy": SamplingParams(temperature=0.0),
    "window 0.7 (old default)": SamplingParams(temperature=0.7, top_p=0.95, top_k=40, min_p=0.05),
    "0.3, min-p 0.1": SamplingParams(temperature=0.3, top_p=0.95, top_k=40, min_p=0.1),
    "0.3, min-p 0.1, presence 0.5": SamplingParams(temperature=0.3, top_p=0.95, top_k=40, min_p=0.1,
                                                   presence_penalty=0.5),
    "0.5, min-p 0.1": SamplingParams(temperature=0.5, top_p=0.95, top_k=40, min_p=0.1),
    "0.5, min-p 0.1, presence 0.3": SamplingParams(temperature=0.5, top_p=0.95, top_k=40, min_p=0.1,
                                                   presence_penalty=0.3),
    "greedy, presence 0.3": SamplingParams(temperature=0.0, presence_penalty=0.3),
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None, help="a container (default: the demo model)")
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--max-tokens", type=int, default=24)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--only", action="append", help="a candidate's name (repeatable; default: all)")
    args = ap.parse_args()
    if args.model is None:
        from app.demo import container_path
        args.model = container_path()
    model = open_model(args.model)
    fmt = ChatFormat(model)
    session = model.new_session(1024)
    out = {}
    t0 = time.monotonic()
    try:
        for name, params in CANDIDATES.items():
            if args.only and name not in args.only:
                continue
            seeds = [None] if params.temperature == 0 else list(range(1, args.seeds + 1))
            right = total = 0
            for q, keys in QUESTIONS:
                for seed in seeds:
                    p = dataclasses.replace(params, seed=seed) if seed is not None else params
                    req = TurnRequest([{"role": "user", "content": q}], sampling=p, max_tokens=args.max_tokens)
                    done = collect(run_turn(model, session, fmt.prepare(req, n_ctx=session.n_ctx)))
                    total += 1
                    right += any(k in done.content.lower().replace(".", " ").split() or
                                 (len(k) > 2 and k in done.content.lower()) for k in keys)
            out[name] = {"correct": right, "asked": total, "rate": right / total}
            if not args.json:
                print(f"{name:32s} {right:3d}/{total:3d}  {right / total:.0%}", flush=True)
    finally:
        session.close()
        model.close()
    if args.json:
        print(json.dumps({"model": str(args.model), "seconds": time.monotonic() - t0, "results": out}, indent=1))


if __name__ == "__main__":
    main()
