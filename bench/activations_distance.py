"""How far the default arithmetic (activations "auto": 8-bit activations on
quantized weights) moves next-token distributions from exact, next to how
far the weight format itself moves them: the table of docs/QUANTIZATION.md,
"8-bit activations".

Over the fixed prompt set bench/q8_prompts.txt (one a line), every prompt
token by token (app.engine.compare, as `ferry eval --compare` does):

- the real demo weights (SmolLM2-135M-Instruct, Q4_1 with a Q8_0 embedding),
  chat template: the default against exact; and the weights' own error as
  far as it can be measured without the bf16 original: the same values
  rounded once more, to q4_0 (a 4-bit format's rounding of these weights),
  against the Q4_1 file, both exact;
- the tiny random K3, Kimi-Linear and DeepSeek-V3 models of tests/kimi,
  converted with a q8_0 trunk and q4_0 experts (so the 8-bit products apply;
  rows a format cannot hold stay f32): the default against exact on that
  container, and the weights' own error, that container against the f32 one,
  both exact. Their random weights give near-flat distributions, so their
  figures say the arithmetic is right, not how a trained model fares.

    python bench/activations_distance.py [--models demo,k3,kimi_linear,deepseek] [--max-tokens 64] [--out FILE]

Prints one JSON document (and writes it to --out).
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# bench/ itself off the path (its kernels.py would shadow the `kernels` package transformers imports)
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != REPO / "bench"]
sys.path.insert(0, str(REPO))

from app.activations import DEFAULT_ACTIVATIONS, EXACT  # noqa: E402
from app.engine.compare import distance, read_prompts, run_mode  # noqa: E402

PROMPTS = REPO / "bench" / "q8_prompts.txt"


def token_prompts(container: Path, prompts: list[str], max_tokens: int, chat: bool) -> list[list[int]]:
    """The prompts as the model's tokens (its chat template, or the raw text), as `ferry eval` makes them."""
    from app.api import ChatFormat, TurnRequest
    from app.model import LoadedModel

    model = LoadedModel(container, threads=1, activations=EXACT)
    try:
        fmt = ChatFormat(model)
        return [fmt.prepare(TurnRequest(messages=[{"role": "user", "content": p}], raw=not chat),
                            n_ctx=4096).prompt[:max_tokens] for p in prompts]
    finally:
        model.close()


def measure(name: str, container: Path, source: Path | None, ids, threads: int, source_note: str) -> dict:
    t0 = time.perf_counter()
    exact = run_mode(container, ids, activations=EXACT, threads=threads)
    default = run_mode(container, ids, activations=DEFAULT_ACTIVATIONS, threads=threads)
    from app.engine.binding import Engine
    with Engine(container, threads=1) as e:
        running = e.info.activations
    row = {"model": name, "container": str(container), "default_runs": running,
           "default_vs_exact": distance(exact, default)}
    if source is not None:
        ref = run_mode(source, ids, activations=EXACT, threads=threads)
        row["weights_vs_source"] = {**distance(ref, exact), "what": source_note}
    row["seconds"] = round(time.perf_counter() - t0, 1)
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="demo,k3,kimi_linear,deepseek")
    ap.add_argument("--prompts", default=str(PROMPTS))
    ap.add_argument("--max-tokens", type=int, default=64, help="tokens of each prompt evaluated")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", help="also write the JSON here")
    a = ap.parse_args(argv)
    from app import demo
    from app.convert.convert import convert

    prompts = read_prompts(a.prompts)
    rows = []
    with tempfile.TemporaryDirectory(prefix="ferry-actdist-") as tmp:
        root = Path(tmp)
        for name in a.models.split(","):
            if name == "demo":
                gguf = demo.gguf_path(install=False)
                q41 = convert(gguf, root / "demo.ferry")
                q40 = convert(gguf, root / "demo-q4_0.ferry", trunk_format="q4_0")
                ids = token_prompts(q41, prompts, a.max_tokens, chat=True)
                rows.append(measure("SmolLM2-135M Q4_1 (real demo weights)", q41, None, ids, a.threads, ""))
                # The weights' own error: the file's values rounded again to a 4-bit format, both exact.
                ref, again = (run_mode(p, ids, activations=EXACT, threads=a.threads) for p in (q41, q40))
                rows[-1]["weights_vs_source"] = {**distance(ref, again),
                                                 "what": "the Q4_1 values rounded once more to q4_0, exact"}
                print(json.dumps(rows[-1]), file=sys.stderr)
                continue
            from tests.kimi import tiny_k3, tiny_kimi
            ckpt = root / name
            if name == "k3":
                tiny_k3.build(ckpt)
            else:
                tiny_kimi.build(name, ckpt)
            f32 = convert(ckpt, root / f"{name}-f32.ferry", trunk_format="f32", expert_format="f32")
            quant = convert(ckpt, root / f"{name}-q.ferry", trunk_format="q8_0", expert_format="q4_0")
            ids = token_prompts(quant, prompts, a.max_tokens, chat=False)
            label = {"k3": "tiny K3", "kimi_linear": "tiny Kimi-Linear", "deepseek": "tiny DeepSeek-V3"}[name]
            rows.append(measure(f"{label} (random; q8_0 trunk, q4_0 experts)", quant, f32, ids, a.threads,
                                "q8_0 trunk + q4_0 experts against the f32 weights, exact"))
            print(json.dumps(rows[-1]), file=sys.stderr)
    doc = {"bench": "activations_distance", "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           "machine": platform.machine(), "prompts": len(prompts), "prompt_file": str(Path(a.prompts).name),
           "max_tokens": a.max_tokens, "rows": rows}
    text = json.dumps(doc, indent=1)
    print(text)
    if a.out:
        Path(a.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
