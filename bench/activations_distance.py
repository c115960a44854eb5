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
                                         [--experts q4_0|q3_nl] [--exact-parts none,kda,only:mla,...] [--wide]
                                         [--mode q8|auto]

The tiny models are measured with 8-bit activations on every class of
product, asked for by name ("q8"; ``--mode auto``: what the default runs,
which on the models with KDA layers keeps some classes exact, the core's
KIMI_LINEAR_AUTO_Q8 / K3_AUTO_Q8); ``default_runs`` says what the default
runs. ``--exact-parts`` repeats each tiny model with one group of its trunk
matrices (PARTS) stored in f32, so that they run exactly in both modes and
the distance left is the rest's; ``only:GROUP`` stores every other group in
f32 (and the experts, unless GROUP is ``experts``), so that only GROUP's
products take 8-bit activations: the distance each class makes alone.
``--wide`` builds the tiny models with experts of 256 inputs and outputs
(hidden 256, expert FFN 256: the tiny sizes are below q3_nl's 256-value rows,
so its experts would stay f32) and also offers the other MoE families of
tests/tiny_models.py (qwen3moe, mixtral, olmoe) at those widths, every
matrix scaled by sqrt(64 / 256) so that each layer keeps the tiny model's
gain (``--sharp``: not scaled, sharper distributions). ``--trunk f32`` keeps
the trunk exact, so that only the experts' products differ between modes.

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
#: Groups of trunk matrices --exact-parts can keep exact (stored in f32).
PARTS = {
    "none": (),
    "kda": ("kda_q", "kda_k", "kda_v", "kda_f_a", "kda_f_b", "kda_beta", "kda_g_a", "kda_g_b", "kda_g", "kda_output"),
    "kda_qkv": ("kda_q", "kda_k", "kda_v"),
    "kda_gates": ("kda_f_a", "kda_f_b", "kda_beta", "kda_g_a", "kda_g_b", "kda_g"),
    "kda_output": ("kda_output",),
    "mla": ("attn_q", "attn_q_a", "attn_q_b", "attn_kv_a_mqa", "attn_kv_b", "attn_output", "attn_gate"),
    "ffn": ("ffn_gate", "ffn_up", "ffn_down", "ffn_gate_shexp", "ffn_up_shexp", "ffn_down_shexp"),
    "latent": ("ffn_latent_down", "ffn_latent_up"),
    "output": ("output",),
}
#: ``--exact-parts only:GROUP``: 8-bit activations on that one group alone (a group of PARTS, or ``experts``):
#: every other group of trunk matrices stored in f32 and, unless GROUP is ``experts``, the experts too.
ONLY = "only:"


def kept_exact(part: str) -> tuple[tuple[str, ...], bool]:
    """The trunk matrix suffixes ``part`` stores in f32, and whether the experts are stored in f32 too."""
    if not part.startswith(ONLY):
        return PARTS[part], False
    group = part[len(ONLY):]
    own = set(PARTS.get(group, ()))
    return tuple(sorted({s for names in PARTS.values() for s in names} - own)), group != "experts"


#: --wide: the experts' inputs and outputs (a multiple of q3_nl's 256-value rows).
WIDE = 256


def keep_gain(ckpt: Path, factor: float) -> None:
    """Every matrix of a checkpoint's safetensors times ``factor``: the tiny builders draw weights of a fixed
    spread for 64-wide rows, so at WIDE each product would grow sqrt(WIDE / 64) times more per layer and the
    random model's logits sharpen; scaled by sqrt(64 / WIDE) the wide model keeps the tiny one's gains."""
    from safetensors.torch import load_file, save_file
    for f in sorted(ckpt.glob("*.safetensors")):
        tensors = load_file(str(f))
        save_file({k: (v * factor).to(v.dtype) if v.ndim >= 2 else v for k, v in tensors.items()}, str(f),
                  metadata={"format": "pt"})


def expert_formats(container: Path) -> list[str]:
    """The formats the container's routed experts are stored in (f32 where the format cannot hold a row)."""
    from app.engine.container_files import read_manifest
    banks = read_manifest(container).get("expert_banks") or []
    return sorted({b[p]["dtype"] for b in banks for p in ("gate", "up", "down") if p in b})


def token_prompts(container: Path, prompts: list[str], max_tokens: int, chat: bool) -> list[list[int]]:
    """The prompts as the model's tokens (its chat template, or the raw text), as `ferry eval` makes them."""
    from app.api import ChatFormat, TurnRequest
    from app.model import LoadedModel

    model = LoadedModel(container, threads=1, activations=EXACT)
    try:
        fmt = ChatFormat(model)
        ids = [fmt.prepare(TurnRequest(messages=[{"role": "user", "content": p}], raw=not chat),
                           n_ctx=4096).prompt[:max_tokens] for p in prompts]
    finally:
        model.close()
    if len({t for p in ids for t in p}) <= 2:
        # The tiny models' word-level vocabularies ("w0".."w95") read English as one unknown id throughout
        # (before 2026-12-06 09:20 UTC every tiny DeepSeek-V3 / Kimi-Linear figure was over such constant
        # sequences): the prompts' UTF-8 bytes folded into the ids above the three specials instead.
        from app.engine.container_files import read_manifest
        vocab = int(read_manifest(container)["model"]["vocab"])
        ids = [[3 + b % (vocab - 3) for b in p.encode()][:max_tokens] for p in prompts]
    return ids


def measure(name: str, container: Path, source: Path | None, ids, threads: int, source_note: str,
            mode: str = DEFAULT_ACTIVATIONS) -> dict:
    """``mode`` against exact on ``container`` (the default's arithmetic: ``auto``, or ``q8`` where ``auto``
    stays exact), and ``source`` against ``container`` both exact (the weights' own error)."""
    t0 = time.perf_counter()
    exact = run_mode(container, ids, activations=EXACT, threads=threads)
    default = run_mode(container, ids, activations=mode, threads=threads)
    from app.engine.binding import Engine
    with Engine(container, threads=1) as e:
        running = e.info.activations
    row = {"model": name, "container": str(container), "default_runs": running, "measured": mode,
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
    ap.add_argument("--experts", default="q4_0", choices=("q4_0", "q3_nl"), help="the tiny models' expert format")
    ap.add_argument("--trunk", default="q8_0", choices=("q8_0", "f32"),
                    help="the tiny models' trunk format (f32: only the experts' products differ between modes)")
    ap.add_argument("--wide", action="store_true",
                    help="experts of 256 inputs and outputs (q3_nl rows); also models qwen3moe, mixtral, olmoe")
    ap.add_argument("--sharp", action="store_true",
                    help="with --wide: keep the tiny builders' weight spread (each layer's gain grows with the width)")
    ap.add_argument("--mode", default="q8", choices=("q8", DEFAULT_ACTIVATIONS),
                    help="the tiny models' arithmetic measured against exact (auto: what the default runs on them)")
    ap.add_argument("--exact-parts", default="none",
                    help="comma-separated groups of trunk matrices kept exact (f32), one run each: " + ", ".join(PARTS)
                    + "; only:GROUP (a group or experts): everything but GROUP kept exact")
    a = ap.parse_args(argv)
    from app import demo
    from app.convert import layout
    from app.convert.convert import convert

    parts = a.exact_parts.split(",")
    unknown = [p for p in parts if p not in PARTS and not (p.startswith(ONLY) and p[len(ONLY):] in (*PARTS, "experts"))]
    if unknown:
        ap.error(f"unknown --exact-parts {', '.join(unknown)} (choose from {', '.join(PARTS)})")

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
            from tests import tiny_models
            from tests.kimi import tiny_k3, tiny_kimi
            ckpt = root / name
            if name == "k3":
                tiny_k3.build(ckpt, **(dict(moe_ffn=WIDE, latent=WIDE) if a.wide else {}))
            elif name in tiny_models.ARCHS:
                if not a.wide:
                    ap.error(f"model {name} needs --wide")
                extra = {"mixtral": {"intermediate_size": WIDE},   # their expert width
                         "olmoe": {"intermediate_size": WIDE, "num_attention_heads": WIDE // 16}}.get(name, {})
                tiny_models.build(name, ckpt, hidden_size=WIDE, moe_intermediate_size=WIDE, **extra)
            else:
                tiny_kimi.build(name, ckpt, **(dict(hidden_size=WIDE, moe_intermediate_size=WIDE) if a.wide else {}))
            if a.wide and not a.sharp:
                keep_gain(ckpt, (64 / WIDE) ** 0.5)
            f32 = convert(ckpt, root / f"{name}-f32.ferry", trunk_format="f32", expert_format="f32")
            label = {"k3": "tiny K3", "kimi_linear": "tiny Kimi-Linear", "deepseek": "tiny DeepSeek-V3",
                     "qwen3moe": "tiny Qwen3-MoE", "mixtral": "tiny Mixtral", "olmoe": "tiny OLMoE"}[name]
            label += ", experts 256 wide" if a.wide else ""
            ids = None
            for part in parts:
                vectors = layout.VECTOR_SUFFIXES
                suffixes, experts_f32 = kept_exact(part)
                layout.VECTOR_SUFFIXES = vectors + suffixes  # the group stays f32: exact in both modes
                try:
                    quant = convert(ckpt, root / f"{name}-{part.replace(':', '-')}-q.ferry", trunk_format=a.trunk,
                                    expert_format="f32" if experts_f32 else a.experts)
                finally:
                    layout.VECTOR_SUFFIXES = vectors
                if ids is None:
                    ids = token_prompts(quant, prompts, a.max_tokens, chat=False)
                kept = ("" if part == "none" else f", 8-bit on {part[len(ONLY):]} only" if part.startswith(ONLY)
                        else f", {part} exact")
                rows.append(measure(f"{label} (random; {a.trunk} trunk, {a.experts} experts{kept})", quant,
                                    f32 if part == "none" else None, ids, a.threads,
                                    f"{a.trunk} trunk + {a.experts} experts against the f32 weights, exact",
                                    mode=a.mode))
                rows[-1]["exact_part"] = part
                rows[-1]["expert_formats"] = expert_formats(quant)
                print(json.dumps(rows[-1]), file=sys.stderr)
    doc = {"bench": "activations_distance", "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           "machine": platform.machine(), "prompts": len(prompts), "prompt_file": str(Path(a.prompts).name),
           "max_tokens": a.max_tokens, "experts": a.experts, "trunk": a.trunk, "wide": a.wide, "sharp": a.sharp, "rows": rows}
    text = json.dumps(doc, indent=1)
    print(text)
    if a.out:
        Path(a.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
