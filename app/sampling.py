"""Choosing the next token from logits: greedy, or temperature with top-k,
top-p and min-p filtering, from a seeded generator (reproducible runs).

Before choosing, the logits are adjusted as OpenAI documents it: a bias per
token id (``logit_bias``, -100..100), and for every token already generated
in this answer ``frequency_penalty * count + presence_penalty * (count > 0)``
is subtracted."""
from __future__ import annotations

import math
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
        if not all(math.isfinite(v) for v in (self.temperature, self.top_p, self.min_p, self.frequency_penalty,
                                               self.presence_penalty)):
            raise ValueError("sampling parameters must be finite numbers")
        if self.seed is not None and not 0 <= self.seed < 2**64:
            raise ValueError("the seed must be a whole number from 0 to 2^64 - 1")
        if self.temperature < 0 or not 0 < self.top_p <= 1 or not 0 <= self.min_p < 1 or self.top_k < 0:
            raise ValueError("sampling parameters out of range: temperature >= 0, 0 < top_p <= 1, "
                             "0 <= min_p < 1, top_k >= 0")
        if not (-2 <= self.frequency_penalty <= 2 and -2 <= self.presence_penalty <= 2):
            raise ValueError("frequency_penalty and presence_penalty must be between -2 and 2")
        object.__setattr__(self, "logit_bias", tuple((int(k), float(v)) for k, v in dict(self.logit_bias).items()))
        if any(not -100 <= v <= 100 or k < 0 for k, v in self.logit_bias):
            raise ValueError("logit_bias maps token ids (>= 0) to values between -100 and 100")


def top_order(v: np.ndarray, k: int, kth=None) -> np.ndarray:
    """``np.argsort(-v, kind="stable")[:k]`` (the ``k`` largest of ``v``, best
    first, ties by lower index) without sorting all of ``v``: only the values
    at least the k-th largest (``kth``, found by a partition unless the caller
    knows it) are sorted."""
    n = v.size
    k = min(k, n)
    if k <= 0:
        return np.empty(0, dtype=np.intp)
    if kth is None:
        kth = np.partition(v, n - k)[n - k] if k < n else None
    if kth is None or np.isnan(kth):
        return np.argsort(-v, kind="stable")[:k]
    cand = np.flatnonzero(v >= kth)   # ascending ids: a stable sort keeps ties by index
    return cand[np.argsort(-v[cand], kind="stable")[:k]]


class Sampler:
    """Draws are a function of the seed and the logits alone, and the same as a
    full stable sort of the vocabulary would give: the probabilities are
    normalised by the sum of every candidate's exp in descending order (which
    fixes the rounding), so the candidates' *values* are sorted (a cheap sort of
    the float32 logits: z is monotone in them), but only the drawn token's id is
    found (``position_id``), never the order of the vocabulary's ids. tests/chat/test_sampling_exact.py
    checks this token for token against the full-sort algorithm."""

    def __init__(self, params: SamplingParams):
        self.params = params
        self.rng = np.random.default_rng(params.seed)
        self.counts: dict[int, int] = {}
        ids = np.array([t for t, _ in params.logit_bias], dtype=np.intp)
        self._bias = (ids, np.array([b for _, b in params.logit_bias], dtype=np.float32))

    def adjust(self, logits: np.ndarray) -> np.ndarray:
        """The logits after logit_bias and the penalties (the same array when none apply).
        Only the affected entries are touched, each as ``z[t] = float32(z[t] + float32(d))``."""
        p = self.params
        if not (p.logit_bias or (self.counts and (p.frequency_penalty or p.presence_penalty))):
            return logits
        z = logits.astype(np.float32, copy=True)
        ids, bias = self._bias
        if ids.size:
            inside = ids < z.size
            z[ids[inside]] += bias[inside]
        if self.counts and (p.frequency_penalty or p.presence_penalty):
            toks = np.fromiter(self.counts.keys(), dtype=np.intp, count=len(self.counts))
            n = np.fromiter(self.counts.values(), dtype=np.float64, count=len(self.counts))
            z[toks] -= (n * p.frequency_penalty + p.presence_penalty).astype(np.float32)
        return z

    def __call__(self, logits: np.ndarray) -> int:
        tok = self._choose(self.adjust(logits))
        self.counts[tok] = self.counts.get(tok, 0) + 1
        return tok

    def _choose(self, logits: np.ndarray) -> int:
        if self.params.temperature == 0:
            return int(np.argmax(logits))
        z, zs, q = self._weights(logits)
        return position_id(z, zs, self.rng.choice(q.size, p=q))

    def nucleus(self, logits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The tokens a draw at temperature > 0 chooses from (best first, after
        top-k, top-p and min-p) and their probabilities, from adjusted logits."""
        z, zs, q = self._weights(logits)
        return top_order(z, q.size, kth=zs[q.size - 1]), q

    def _weights(self, logits: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``z = (logit - max) / T`` per token, the candidates' z best first,
        and the kept candidates' probabilities."""
        p = self.params
        x = np.asarray(logits).ravel()
        if x.dtype not in (np.float32, np.float64):
            x = x.astype(np.float64)
        n = x.size
        k = p.top_k if 0 < p.top_k < n else n
        # The k largest values, best first (equal values need no order).
        best = np.sort(x) if k == n else np.sort(np.partition(x, n - k)[n - k:])
        if not n or not np.isfinite(best[-1]):
            raise ValueError("cannot sample: the logits are empty, NaN, +inf or all -inf")
        top = np.float64(best[-1])
        # In float64, per element as a full sort would see it. Shift before
        # dividing: a tiny temperature (down to subnormals) then sends the
        # others to -inf, never the best one to inf - inf = NaN.
        with np.errstate(over="ignore"):
            zs = (best[::-1].astype(np.float64, order="C") - top) / p.temperature
            z = (x.astype(np.float64) - top) / p.temperature
        probs = np.exp(zs)        # zs[0] == 0: the best token's weight is 1
        probs /= probs.sum()      # the sum in descending order, over all k
        keep = k
        if p.top_p < 1:
            # The first i whose running sum reaches top_p; a running sum's
            # prefix is the same numbers, so it grows only until one does.
            m = min(k, 1024)
            while True:
                i = int(np.searchsorted(np.cumsum(probs[:m]), p.top_p))
                if i < m or m == k:
                    break
                m = min(k, 8 * m)
            keep = min(keep, i + 1)
        if p.min_p:
            keep = min(keep, max(1, int(np.sum(probs >= p.min_p * probs[0]))))
        return z, zs, probs[:keep] / probs[:keep].sum()


def position_id(z: np.ndarray, zs: np.ndarray, j: int) -> int:
    """``np.argsort(-z, kind="stable")[j]`` given ``zs``, z's values in
    descending order (at least its first j + 1): the (j - a)-th lowest id of
    the tokens whose z equals ``zs[j]``, a being how many rank above them."""
    v = zs[j]
    above = int(np.count_nonzero(zs[:j + 1] > v))
    return int(np.flatnonzero(z == v)[j - above])
