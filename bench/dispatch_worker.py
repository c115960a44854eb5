"""One measurement of the expert dispatch's own CPU time, in a fresh process
for each build: this tree's (ferry_profile_part.dispatch_seconds) or an
earlier revision built by bench/baseline_core.py (its bench timer). Run by
`bench/stream.py --dispatch`; imports only the `app` of TREE, so it must not
import anything of this repository itself.

    python bench/dispatch_worker.py TREE CONTAINER '{"budget": 0, "tokens": [...], ...}'

Prints one JSON object: for the prompt chunk and for the single-token steps,
the dispatch's seconds, the MoE layer passes and tokens they covered.
"""
from __future__ import annotations

import json
import sys


def main(argv: list[str]) -> int:
    tree, container, spec = argv[0], argv[1], json.loads(argv[2])
    sys.path.insert(0, tree)
    from app.engine._ferry_c import ffi, lib
    from app.engine.binding import Engine

    prompt, steps = spec["tokens"][:spec["prompt"]], spec["tokens"][spec["prompt"]:]
    profiled = hasattr(lib, "ferry_session_profile")  # this tree; the baseline has its bench timer

    def counters(s) -> dict:
        if profiled:
            p = s.profile()
            return {k: {"seconds": p[k]["dispatch_seconds"], "layers": p[k]["moe_layers"],
                        "tokens": p[k]["tokens"], "wait": p[k]["expert_wait_seconds"]}
                    for k in ("prompt", "decode")}
        sec, lay = ffi.new("double[2]"), ffi.new("uint64_t[2]")
        lib.ferry_session_bench_dispatch(s._live(), sec, lay)
        return {k: {"seconds": sec[i], "layers": int(lay[i])} for i, k in enumerate(("prompt", "decode"))}

    with Engine(container, n_ctx=256, ram_budget=spec["budget"], lookahead=spec["lookahead"]) as engine:
        s = engine.session(256)
        if spec.get("routing"):  # (experts per token, cache-aware margin): builds that have set_routing
            s.set_routing(*spec["routing"])
        if spec["warm"]:  # every expert these tokens choose is then in RAM
            s.eval(prompt)
            for t in steps:
                s.eval([t])
            s.reset()
        if profiled:
            s.set_profiling(True)
        before, stats0 = counters(s), s.stats()
        s.eval(prompt)
        for t in steps:
            s.eval([t])
        after, stats1 = counters(s), s.stats()
    out = {"build": "profile" if profiled else "baseline timer",
           "misses": stats1.misses - stats0.misses, "hits": stats1.hits - stats0.hits,
           "stall_seconds": stats1.stall_seconds - stats0.stall_seconds}
    for k, n_tokens in (("prompt", len(prompt)), ("decode", len(steps))):
        seconds = after[k]["seconds"] - before[k]["seconds"]
        layers = after[k]["layers"] - before[k]["layers"]
        passes = 1 if k == "prompt" else len(steps)
        out[k] = {"dispatch_seconds": seconds, "moe_layer_passes": layers, "tokens": n_tokens,
                  # per MoE layer and token: a pass covers all the chunk's tokens
                  "us_per_layer_token": 1e6 * seconds / (layers / passes * n_tokens) if layers else None}
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
