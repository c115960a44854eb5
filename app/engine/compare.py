"""How far a mode (fewer experts per token, cache-aware routing, the
default's 8-bit activations) moves a model's next-token distributions from the exact
engine, and what it saves (expert reads, decode time): the figures ``ferry
eval MODEL --compare FILE`` prints, for a user with real weights choosing a
mode.

Each prompt is evaluated token by token (as decoding runs, so bytes per token
are decode figures, not chunked-prefill ones) in a fresh session, once with
exact routing and once in the mode, each on a freshly opened engine (a cold
cache, the same budget), and the distributions compared at every position:
the mean and max KL(exact || mode), top-1 agreement, and per mode bytes read
per token, hit rate, lookahead accuracy, stall seconds and decode tokens per
second (the two runs are sequential, so on a busy machine the speed is a
rough guide; bench/vs_llamacpp.py measures it in interleaved rounds). No Qt
here."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from app.activations import DEFAULT_ACTIVATIONS, EXACT
from app.engine.binding import Engine, Stats


class CompareError(ValueError):
    """A prompt file that cannot be used."""


def read_prompts(path: str | Path) -> list[str]:
    """Prompts from FILE: JSON Lines (a string or an object with "prompt" per
    line), a JSON list of those, or plain text with one prompt per non-empty
    line."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise CompareError(f"cannot read the prompts in {p}: {e}") from None
    stripped = text.strip()

    def one(item, where: str) -> str:
        if isinstance(item, dict):
            item = item.get("prompt")
        if not isinstance(item, str) or not item:
            raise CompareError(f"{p}: {where} is not a prompt (a string or an object with \"prompt\")")
        return item

    if stripped.startswith("["):
        try:
            items = json.loads(stripped)
        except json.JSONDecodeError as e:
            raise CompareError(f"{p}: not valid JSON ({e})") from None
        prompts = [one(item, f"item {i + 1}") for i, item in enumerate(items)]
    elif p.suffix in (".jsonl", ".json") or stripped.startswith(("{", '"')):
        prompts = []
        for n, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    prompts.append(one(json.loads(line), f"line {n}"))
                except json.JSONDecodeError as e:
                    raise CompareError(f"{p}: line {n} is not JSON ({e})") from None
    else:
        prompts = [line.strip() for line in text.splitlines() if line.strip()]
    if not prompts:
        raise CompareError(f"{p} holds no prompts")
    return prompts


@dataclass(frozen=True)
class ModeRun:
    logits: list[np.ndarray]   # per prompt: [positions, vocab]
    stats: Stats               # summed over the prompts


def _sum_stats(all_stats: Sequence[Stats]) -> Stats:
    fields = Stats.__dataclass_fields__
    return Stats(**{f: sum(getattr(s, f) for s in all_stats) for f in fields})


def run_mode(path: str | Path, prompts: Sequence[Sequence[int]], *, experts_per_token: int | None = None,
             cache_aware_margin: float = 0.0, **engine_options) -> ModeRun:
    """Every prompt token by token on a fresh engine in one routing mode."""
    logits, stats = [], []
    n_ctx = max(len(p) for p in prompts)
    with Engine(path, n_ctx=n_ctx, **engine_options) as engine:
        for ids in prompts:
            s = engine.session(n_ctx)
            try:
                s.set_routing(experts_per_token, cache_aware_margin)
                logits.append(np.stack([s.eval([t]) for t in ids]).astype(np.float64))
                stats.append(s.stats())
            finally:
                s.close()
    return ModeRun(logits, _sum_stats(stats))


def _log_softmax(x: np.ndarray) -> np.ndarray:
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


def mode_figures(st: Stats) -> dict:
    out = st.per_mode()
    out.update(expert_reads=st.expert_reads, bytes_read=st.bytes_read, routed_choices=st.routed_choices,
               routed_swaps=st.routed_swaps,
               decode_tok_per_s=st.decode_tokens / st.decode_seconds if st.decode_seconds > 0 else None)
    return out


def compare(path: str | Path, prompts: Sequence[Sequence[int]], *, experts_per_token: int | None = None,
            cache_aware_margin: float = 0.0, activations: str = DEFAULT_ACTIVATIONS, **engine_options) -> dict:
    """The report of ``ferry eval --compare`` for token-id prompts: the exact
    engine (exact routing, exact f32 activations) against the mode asked for
    (by default the default's own 8-bit activations)."""
    prompts = [list(p) for p in prompts if len(p)]
    if not prompts:
        raise CompareError("no prompt has any tokens")
    exact = run_mode(path, prompts, activations=EXACT, **engine_options)
    mode = run_mode(path, prompts, experts_per_token=experts_per_token, cache_aware_margin=cache_aware_margin,
                    activations=activations, **engine_options)
    return {
        "mode": {"experts_per_token": experts_per_token, "cache_aware_margin": cache_aware_margin,
                 "activations": activations},
        "prompts": len(prompts), **distance(exact, mode),
        "exact": mode_figures(exact.stats), "compared": mode_figures(mode.stats),
    }


def distance(ref: ModeRun, other: ModeRun) -> dict:
    """How far ``other``'s next-token distributions are from ``ref``'s at
    every position of the same prompts: positions, the mean and max
    KL(ref || other) in nats, and top-1 agreement."""
    kls, agree = [], []
    for a, b in zip(ref.logits, other.logits):
        lp, lq = _log_softmax(a), _log_softmax(b)
        kls.append(np.maximum((np.exp(lp) * (lp - lq)).sum(axis=-1), 0.0))
        agree.append(a.argmax(axis=-1) == b.argmax(axis=-1))
    kl, top1 = np.concatenate(kls), np.concatenate(agree)
    return {"positions": int(kl.size), "kl_mean": float(kl.mean()), "kl_max": float(kl.max()),
            "top1_agreement": float(top1.mean())}
