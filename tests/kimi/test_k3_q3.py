"""Kimi K3 with 3-bit experts: the tiny release-layout K3 (tests/kimi/tiny_k3.py)
with experts wide enough for 256-value blocks, its MXFP4 experts converted
by `ferry convert --expert-format q3_nl`, run by the engine and compared
stage by stage with the numpy reference (tests/kimi/k3_reference.py) in two
ways:

* on the container's own expert values (q3_nl dequantized): the engine's
  3-bit kernels inside K3's latent MoE must be as exact as f32 (1e-5);
* the expert weights themselves against the release's MXFP4 values: a real
  3-bit code, not a copy and not noise.

How far the 3-bit experts move this model's logits from the MXFP4 ones is
not a quality figure: the random tiny K3 is chaotic (routing flips), so even
q8_0 experts (0.7 % weight error) move its logits by 0.29 relative L2, q4_0
by 0.86 and q3_nl by 1.02 (2026-12-03). Quality is measured on real and
K3-shaped matrices instead (bench/quant_quality.py, docs/QUANTIZATION.md).
"""
from __future__ import annotations

import json

import numpy as np
import pytest

from app.convert import quant3
from app.convert.convert import convert
from tests.kimi import k3_reference as ref
from tests.kimi import tiny_k3
from tests.tiny_models import rel_l2, run_engine

PROMPT, DECODE = 10, 4
EXACT = 1e-5
WIDE = 256                      # q3_nl blocks are 256 values: rows of 256 both ways
PARTS = {"gate": "w1", "up": "w3", "down": "w2"}


@pytest.fixture(scope="module")
def k3q3(tmp_path_factory):
    root = tmp_path_factory.mktemp("k3q3")
    tiny_k3.build(root / "ckpt", moe_ffn=WIDE, latent=WIDE)
    out = convert(root / "ckpt", root / "k3q3.ferry", trunk_format="f32", expert_format=quant3.NAME)
    cfg, tensors = ref.load_release(root / "ckpt")
    return out, cfg, tensors


def container_experts(out, fmt=quant3) -> dict[str, np.ndarray]:
    """Every expert matrix as the container stores it in ``fmt`` (the module
    of a Ferry format: quant3, quant2), dequantized, under its release name."""
    manifest = json.loads((out / "manifest.json").read_text())
    values = {}
    for bank in manifest["expert_banks"]:
        data = np.fromfile(out / bank["file"], dtype=np.uint8)
        for e in range(bank["n_experts"]):
            rec = data[4096 + e * bank["record_size"]:]
            for part, w in PARTS.items():
                p = bank[part]
                assert p["dtype"] == fmt.NAME, p
                raw = rec[p["offset"]:p["offset"] + p["nbytes"]]
                name = f"language_model.model.layers.{bank['layer']}.block_sparse_moe.experts.{e}.{w}.weight"
                values[name] = fmt.dequantize(raw, int(np.prod(p["shape"]))).reshape(p["shape"])
    return values


def test_engine_runs_q3_experts_exactly(k3q3):
    out, cfg, tensors = k3q3
    stored = container_experts(out)
    assert len(stored) == (tiny_k3.LAYERS - 1) * tiny_k3.EXPERTS * 3
    weight_err = np.mean([rel_l2(stored[n], tensors[n]) for n in stored])
    print(f"k3 q3_nl experts: mean relative weight error vs MXFP4 {weight_err:.4f}")
    assert 0.05 < weight_err < 0.30   # a real 3-bit code of MXFP4 values (docs/QUANTIZATION.md: ~0.22)

    rng = np.random.default_rng(7)
    tokens = [int(t) for t in rng.integers(0, tiny_k3.VOCAB, PROMPT + DECODE)]
    stages, logits, n_layers = run_engine(out, tokens, PROMPT)

    own = dict(tensors, **{n: v.astype(np.float64) for n, v in stored.items()})
    stages_own, logits_own = ref.K3Reference(cfg, own).forward(np.array(tokens))
    exact = {f"stage {s}": rel_l2(stages[s], stages_own[s]) for s in range(n_layers + 2)}
    exact["logits"] = rel_l2(logits, logits_own)
    print("k3 q3_nl vs reference on the container's values: "
          + ", ".join(f"{k} {v:.2e}" for k, v in exact.items()))
    assert max(exact.values()) < EXACT, exact

