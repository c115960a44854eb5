"""Choosing the next token from logits: greedy, or temperature with top-k,
top-p and min-p filtering, from a seeded generator (reproducible runs)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0   #: 0 = greedy
    top_k: int = 0             #: 0 = off
    top_p: float = 1.0         #: 1 = off
    min_p: float = 0.0         #: 0 = off
    seed: int | None = None

    def __post_init__(self):
        if self.temperature < 0 or not 0 < self.top_p <= 1 or not 0 <= self.min_p < 1 or self.top_k < 0:
            raise ValueError("sampling parameters out of range: temperature >= 0, 0 < top_p <= 1, "
                             "0 <= min_p < 1, top_k >= 0")


class Sampler:
    def __init__(self, params: SamplingParams):
        self.params = params
        self.rng = np.random.default_rng(params.seed)

    def __call__(self, logits: np.ndarray) -> int:
        p = self.params
        if p.temperature == 0:
            return int(np.argmax(logits))
        z = logits.astype(np.float64)
        # Shift before dividing: a tiny temperature (down to subnormals) then
        # sends the others to -inf, never the best one to inf - inf = NaN.
        with np.errstate(over="ignore"):
            z = (z - z.max()) / p.temperature
        order = np.argsort(-z, kind="stable")
        if p.top_k:
            order = order[:p.top_k]
        zs = z[order]
        probs = np.exp(zs - zs[0])
        probs /= probs.sum()
        keep = len(probs)
        if p.top_p < 1:
            keep = min(keep, int(np.searchsorted(np.cumsum(probs), p.top_p)) + 1)
        if p.min_p:
            keep = min(keep, max(1, int(np.sum(probs >= p.min_p * probs[0]))))
        probs = probs[:keep] / probs[:keep].sum()
        return int(order[self.rng.choice(keep, p=probs)])
