"""The fast sampler draws exactly the tokens the full-sort sampler drew, for
every setting, seed and logits (ties, -inf, huge and tiny values included).

``ReferenceSampler`` is a copy of app/sampling.py's algorithm before issue 21's
follow-up: it sorts the whole vocabulary in float64 per token."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.sampling import Sampler, SamplingParams, position_id, top_order


class ReferenceSampler:
    def __init__(self, params: SamplingParams):
        self.params = params
        self.rng = np.random.default_rng(params.seed)
        self.counts: dict[int, int] = {}

    def adjust(self, logits):
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

    def __call__(self, logits):
        tok = self._choose(self.adjust(logits))
        self.counts[tok] = self.counts.get(tok, 0) + 1
        return tok

    def _choose(self, logits):
        if self.params.temperature == 0:
            return int(np.argmax(logits))
        order, probs = self.nucleus(logits)
        return int(order[self.rng.choice(len(probs), p=probs)])

    def nucleus(self, logits):
        p = self.params
        z = logits.astype(np.float64)
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
        return order[:keep], probs[:keep] / probs[:keep].sum()


def draws(sampler, logits_seq):
    """The tokens drawn, or the exception type where a draw fails."""
    out = []
    for logits in logits_seq:
        try:
            with np.errstate(invalid="ignore"):
                out.append(sampler(logits))
        except ValueError:
            out.append(ValueError)
            break
    return out


def assert_same(params: SamplingParams, logits_seq) -> list:
    """The same tokens drawn and, before each draw, bit for bit the same
    candidates and probabilities (so a rounding difference too rare to change
    a token in a test still fails it)."""
    ref, new = ReferenceSampler(params), Sampler(params)
    if params.temperature:
        for logits in logits_seq:
            with np.errstate(invalid="ignore"):
                try:
                    want = ref.nucleus(ref.adjust(logits))
                except ValueError:   # empty logits
                    want = None
            if want is None or np.isnan(want[1]).any():   # the reference fails to draw
                with pytest.raises(ValueError):
                    new.nucleus(new.adjust(logits))
                break
            ids, q = new.nucleus(new.adjust(logits))
            assert ids.tolist() == want[0].tolist()
            assert q.tobytes() == want[1].tobytes()
            ref.counts[int(ids[0])] = new.counts[int(ids[0])] = 1 + ref.counts.get(int(ids[0]), 0)
    want = draws(ReferenceSampler(params), logits_seq)
    got = draws(Sampler(params), logits_seq)
    assert got == want
    return got


# Logit values: a few shared ones (ties), -inf, huge, tiny and ordinary.
VALUES = st.one_of(
    st.sampled_from([0.0, -0.0, 1.0, 1.5, -2.0, 7.25, -np.inf, 3.4e38, -3.4e38, 1e-45, -1e-45, 1e-38, 30.0]),
    st.floats(min_value=-60, max_value=60, width=32),
    st.floats(width=32, allow_nan=False, allow_infinity=False),
)
TEMPERATURES = st.one_of(st.sampled_from([0.0, 5e-324, 1e-300, 1e-6, 0.1, 0.5, 0.8, 1.0, 2.0, 1e6, 1e300]),
                         st.floats(min_value=0.01, max_value=5))
PARAMS = st.builds(
    SamplingParams,
    temperature=TEMPERATURES,
    top_k=st.one_of(st.just(0), st.integers(1, 8), st.integers(1, 400)),
    top_p=st.one_of(st.just(1.0), st.sampled_from([5e-324, 0.1, 0.5, 0.9, 0.95, 0.999999]),
                    st.floats(min_value=1e-9, max_value=1.0, exclude_min=True)),
    min_p=st.one_of(st.just(0.0), st.sampled_from([0.01, 0.05, 0.5, 0.999]), st.floats(0, 0.999)),
    seed=st.integers(0, 2**32),
    frequency_penalty=st.one_of(st.just(0.0), st.floats(-2, 2)),
    presence_penalty=st.one_of(st.just(0.0), st.floats(-2, 2)),
    logit_bias=st.lists(st.tuples(st.integers(0, 300), st.floats(-100, 100)), max_size=6).map(tuple),
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(params=PARAMS, n=st.integers(1, 300), data=st.data())
def test_same_tokens_as_the_full_sort(params, n, data):
    steps = data.draw(st.integers(1, 6))
    base = np.array(data.draw(st.lists(VALUES, min_size=n, max_size=n)), dtype=np.float32)
    # Later steps: the same logits, or a few entries changed (as the next token's would).
    seq = [base]
    for _ in range(steps - 1):
        nxt = seq[-1].copy()
        for i, v in data.draw(st.lists(st.tuples(st.integers(0, n - 1), VALUES), max_size=5)):
            nxt[i] = v
        seq.append(nxt)
    assert_same(params, seq)


def demo_like_logits(rng, n=49152, spread=3.0, peak=0.0):
    x = (rng.standard_normal(n) * spread).astype(np.float32)
    x[rng.integers(0, n, 20)] += np.float32(peak)
    return x


@pytest.mark.parametrize("params", [
    SamplingParams(temperature=0.8, top_p=0.95, seed=1),
    SamplingParams(temperature=1.0, top_p=0.999, seed=2),          # a nucleus past the first 1024
    SamplingParams(temperature=3.0, top_p=0.99, seed=3),
    SamplingParams(temperature=0.7, top_k=40, top_p=0.9, seed=4),
    SamplingParams(temperature=1.0, min_p=0.05, seed=5),
    SamplingParams(temperature=1.2, top_k=5000, min_p=0.001, seed=6),
    SamplingParams(temperature=0.8, top_p=0.95, frequency_penalty=1.5, presence_penalty=0.5, seed=7,
                   logit_bias=((5, 100.0), (17, -100.0), (49151, 3.5), (60000, 9.0))),
])
def test_same_tokens_on_a_demo_sized_vocabulary(params):
    rng = np.random.default_rng(11)
    seq = [demo_like_logits(rng, spread=s, peak=pk) for s, pk in [(3, 0), (1, 8), (0.3, 0), (2, 15)] * 3]
    seq.append(np.round(seq[0]))                    # thousands of ties
    seq.append(np.zeros(49152, dtype=np.float32))   # all tied
    got = assert_same(params, seq)
    assert ValueError not in got


def test_bad_logits_are_a_clear_error():
    for bad in ([np.nan, 1.0], [np.inf, 1.0], [-np.inf, -np.inf], []):
        with pytest.raises(ValueError):
            Sampler(SamplingParams(temperature=1.0, seed=1))(np.array(bad, dtype=np.float32))


@settings(max_examples=200, deadline=None)
@given(v=st.lists(st.one_of(st.sampled_from([0.0, 1.0, -np.inf, 2.5]), st.floats(-1e6, 1e6)), min_size=0,
                  max_size=200),
       k=st.integers(0, 220))
def test_top_order_is_the_head_of_a_stable_sort(v, k):
    v = np.array(v, dtype=np.float64)
    assert top_order(v, k).tolist() == np.argsort(-v, kind="stable")[:k].tolist()


@settings(max_examples=200, deadline=None)
@given(v=st.lists(st.one_of(st.sampled_from([0.0, -0.0, 1.0, -np.inf, 2.5]), st.floats(-1e6, 1e6)), min_size=1,
                  max_size=200), data=st.data())
def test_position_id_is_a_stable_sort_position(v, data):
    z = np.array(v, dtype=np.float64)
    j = data.draw(st.integers(0, z.size - 1))
    assert position_id(z, np.sort(z)[::-1], j) == int(np.argsort(-z, kind="stable")[j])
