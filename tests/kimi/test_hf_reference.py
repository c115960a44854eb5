"""DeepSeek-V3 (MLA + RoPE/YaRN, group-limited sigmoid routing, shared experts,
first-k dense) and Kimi-Linear (KDA + NoPE MLA) against `transformers`, layer
by layer: tiny random checkpoints saved in the releases' tensor naming,
converted by `ferry convert` to f32 containers, run on a 16-token prompt plus
8 decode steps. Every stage of the residual stream and the logits within
1e-5 relative L2."""
from __future__ import annotations

import numpy as np
import pytest

from app.convert.convert import convert
from tests.kimi.tiny_kimi import build
from tests.tiny_models import assert_prefill_equals_single_steps, compare, reference, run_engine

PROMPT, DECODE = 16, 8
EXACT = 1e-5


@pytest.fixture(scope="module")
def tokens():
    rng = np.random.default_rng(11)
    return [int(t) for t in rng.integers(3, 96, PROMPT + DECODE)]


@pytest.mark.parametrize("kind", ["deepseek", "kimi_linear"])
def test_layers_match_transformers(kind, tokens, tmp_path):
    model = build(kind, tmp_path / kind)
    out = convert(tmp_path / kind, tmp_path / f"{kind}.ferry", trunk_format="f32", expert_format="f32")
    stages, logits, n_layers = run_engine(out, tokens, PROMPT)
    errors = compare(stages, logits, n_layers, *reference(model, tokens))
    print(f"{kind} f32 vs transformers: " + ", ".join(f"{k} {v:.2e}" for k, v in errors.items()))
    assert max(errors.values()) < EXACT, errors
    assert errors["stage 0"] == 0.0


@pytest.mark.parametrize("kind", ["deepseek", "kimi_linear"])
def test_prefill_equals_single_steps(kind, tokens, tmp_path):
    """The absorbed MLA and the sequential KDA recurrence give bit-identical
    logits whether a prompt is evaluated at once, token by token, or in
    chunks that do not line up with the core's."""
    build(kind, tmp_path / kind)
    out = convert(tmp_path / kind, tmp_path / f"{kind}.ferry", trunk_format="q8_0", expert_format="q8_0")
    assert_prefill_equals_single_steps(out, tokens, threads=3, modes=("exact", "q8", "auto"))
