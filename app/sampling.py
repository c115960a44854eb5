"""Choosing the next token from logits: greedy, or temperature with top-k,
top-p and min-p filtering, from a seeded generator (reproducible runs).

Before choosing, the logits are adjusted as OpenAI documents it: a bias per
token id (``logit_bias``, -100..100), and for every token already generated
in this answer ``frequency_penalty * count + presence_penalty * (count > 0)``
is subtracted."""
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
    frequency_penalty: float = 0.0   #: -2..2, times how often a token was generated
    presence_penalty: float = 0.0    #: -2..2, once a token was generated
    logit_bias: tuple[tuple[int, float], ...] = ()   #: (token id, -100..100) pairs

    def __post_init__(self):
        if self.temperature < 0 or not 0 < self.top_p <= 1 or not 0 <= self.min_p < 1 or self.top_k < 0:
            raise ValueError("sampling parameters out of range: temperature >= 0, 0 < top_p <= 1, "
                             "0 <= min_p < 1, top_k >= 0")
        if not (-2 <= self.frequency_penalty <= 2 and -2 <= self.presence_penalty <= 2):
            raise ValueError("frequency_penalty and presence_penalty must be between -2 and 2")
        object.__setattr__(self, "logit_bias", tuple((int(k), float(v)) for k, v in dict(self.logit_bias).items()))
        if any(not -100 <= v <= 100 or k < 0 for k, v in self.logit_bias):
            raise ValueError("logit_bias maps token ids (>= 0) to values between -100 and 100")


class Sampler:
    def __init__(self, params: SamplingParams):
        self.params = params
        self.rng = np.random.default_rng(params.seed)
        self.counts: dict[int, int] = {}

    def adjust(self, logits: np.ndarray) -> np.ndarray:
        """The logits after logit_bias and the penalties (the same array when none apply)."""
        p = self.params
        if not (p.logit_bias or (self.counts and (p.frequency_penalty or p.presence_penalty))):
            return logits
        z = logits.astype(np.float32, copy=True)
        for tok, bias in p.logit_bias:
            if tok < z.size:
                z[tok] += bias
        if p.frequency_penalty or p.presence_penalty:
            for tok, n in self.counts.items():
                z[tok] -= n * p.frequency_penalty + p.presence_penalty
        return z

    def __call__(self, logits: np.ndarray) -> int:
        tok = self._choose(self.adjust(logits))
        self.counts[tok] = self.counts.get(tok, 0) + 1
        return tok

    def _choose(self, logits: np.ndarray) -> int:
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
