"""q2_vq, the 2-bit expert format, end to end: the quantizer through Python,
a tiny Qwen3-MoE (rows of 256 values) converted by `ferry convert
--expert-format q2_vq` and the tiny release-layout K3 with 256-wide experts
(MXFP4 source), each run by the engine:

* against a reference running the container's own (dequantized) values:
  the 2-bit kernels must be as exact as f32 (1e-5);
* the stored expert weights against the source's: a real 2-bit code whose
  error is the format's measured one (docs/QUANTIZATION.md, "Two-bit
  experts": about 0.29-0.30 relative on real and K3-shaped matrices);
* scalar and SIMD kernel sets agree; a prompt equals single steps.
"""
from __future__ import annotations


import numpy as np
import pytest

from app.convert import quant2
from app.convert.convert import convert
from tests.kernels.test_q3_engine import (assert_expert_banks, converted_moe256, engine_matches_stored_values,
                                         prefill_equals_steps, tokens)  # noqa: F401 (a fixture)
from tests.kimi import k3_reference as ref
from tests.kimi import tiny_k3
from tests.kimi.test_k3_q3 import container_experts
from tests.tiny_models import reference, rel_l2
from tests.tiny_models import run_engine as run_engine_k3

#: The format's relative weight error on Gaussian-like and heavy-tailed matrices lies in this range
#: (measured: 0.28-0.30, docs/QUANTIZATION.md); a copy or noise would fall outside.
ERROR_RANGE = (0.22, 0.34)


def _heavy_tailed(rows=64, cols=768, seed=3):
    rng = np.random.default_rng(seed)
    w = rng.standard_t(5, (rows, cols)) * np.exp(0.5 * rng.standard_normal((rows, 1)))
    return (0.02 * w).astype(np.float32)


def test_quantizer_round_trip_threads_and_bad_input():
    w = _heavy_tailed()
    q = quant2.quantize(w, threads=1)
    assert q.size == w.size // 256 * 73
    assert np.array_equal(q, quant2.quantize(w, threads=3))       # rows split over threads: the same bytes
    back = quant2.dequantize(q, w.size).reshape(w.shape)
    err = rel_l2(back, w)
    print(f"q2_vq round trip on a heavy-tailed matrix: {err:.4f}")
    assert ERROR_RANGE[0] < err < ERROR_RANGE[1]
    h = np.where(np.arange(768) % 3 == 0, 10.0, 1.0).astype(np.float32)
    qi = quant2.quantize(w, importance=h)
    weighted = lambda b: np.sqrt((h * (b - w) ** 2).sum() / (h * w * w).sum())   # noqa: E731
    assert weighted(quant2.dequantize(qi, w.size).reshape(w.shape)) < weighted(back)
    bad = w.copy()
    bad[1, 5] = np.inf
    with pytest.raises(ValueError, match="non-finite"):
        quant2.quantize(bad)
    with pytest.raises(ValueError, match="multiple of 256"):
        quant2.quantize(w[:, :100])
    with pytest.raises(ValueError, match="bytes"):
        quant2.dequantize(q[:-1], w.size)


@pytest.fixture(scope="module")
def q2_container(tmp_path_factory):
    return converted_moe256(tmp_path_factory.mktemp("q2moe"), "q2_vq")


def test_qwen3_moe_with_q2_vq_experts(q2_container, tokens):
    root, container, model = q2_container
    assert_expert_banks(container, "q2_vq", 73)
    logits, stored = engine_matches_stored_values(root, container, tokens, "q2_vq experts")
    # The stored experts against the source's: the format's own error.
    src = dict(model.named_parameters())
    got = dict(stored.named_parameters())
    names = [n for n in src if ".experts." in n]
    werr = np.mean([rel_l2(got[n].detach().numpy(), src[n].detach().numpy()) for n in names])
    _, src_logits = reference(model, tokens)
    print(f"q2_vq experts: weight error {werr:.4f}, logits vs the f32 source {rel_l2(logits, src_logits):.3f}")
    assert ERROR_RANGE[0] < werr < ERROR_RANGE[1]
    assert rel_l2(logits, src_logits) < 0.6


def test_q2_vq_prefill_equals_single_steps_and_kernel_sets_agree(q2_container, tokens):
    _, container, _ = q2_container
    outs = {mode: prefill_equals_steps(container, tokens, kernels=mode) for mode in ("scalar", "auto")}
    err = rel_l2(outs["auto"], outs["scalar"])
    print(f"q2_vq kernels auto vs scalar: logits rel L2 {err:.2e}")
    assert err < 1e-5


@pytest.mark.slow   # the 2-bit quantizer is slow (docs/QUANTIZATION.md): ~20 M expert weights, 30-80 s
def test_k3_with_q2_vq_experts(tmp_path):
    tiny_k3.build(tmp_path / "ckpt", moe_ffn=256, latent=256)
    out = convert(tmp_path / "ckpt", tmp_path / "k3q2.ferry", trunk_format="f32", expert_format=quant2.NAME)
    cfg, tensors = ref.load_release(tmp_path / "ckpt")
    stored = container_experts(out, quant2)
    werr = np.mean([rel_l2(stored[n], tensors[n]) for n in stored])
    print(f"k3 q2_vq experts: mean relative weight error vs MXFP4 {werr:.4f}")
    assert ERROR_RANGE[0] < werr < ERROR_RANGE[1]
    rng = np.random.default_rng(7)
    toks = [int(t) for t in rng.integers(0, tiny_k3.VOCAB, 10 + 4)]
    stages, logits, n_layers = run_engine_k3(out, toks, 10)
    own = dict(tensors, **{n: v.astype(np.float64) for n, v in stored.items()})
    stages_own, logits_own = ref.K3Reference(cfg, own).forward(np.array(toks))
    exact = {f"stage {s}": rel_l2(stages[s], stages_own[s]) for s in range(n_layers + 2)}
    exact["logits"] = rel_l2(logits, logits_own)
    print("k3 q2_vq vs reference on the container's values: " + ", ".join(f"{k} {v:.2e}" for k, v in exact.items()))
    assert max(exact.values()) < 1e-5, exact
