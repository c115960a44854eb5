"""A tiny MoE converted with q3_nl experts runs in the engine and agrees with
transformers running the container's own (dequantized) values; the SIMD and
scalar kernel sets agree; batches stay bit-identical to single steps."""
from __future__ import annotations

import json

import numpy as np
import pytest

from app.convert.convert import convert
from app.engine.binding import Engine
from tests.conftest import run_ferry
from tests.tiny_models import dequantized_reference_model, reference, rel_l2, write_tokenizer

PROMPT, DECODE = 12, 4


def build_moe256(out):
    """A Qwen3-MoE small enough to test but with expert rows of 256 values (q3_nl blocks)."""
    import torch
    import transformers

    cfg = transformers.Qwen3MoeConfig(vocab_size=96, hidden_size=256, num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, head_dim=64, max_position_embeddings=128,
                                      rms_norm_eps=1e-5, bos_token_id=1, eos_token_id=2, pad_token_id=0,
                                      intermediate_size=512, moe_intermediate_size=256, num_experts=4,
                                      num_experts_per_tok=2, norm_topk_prob=True, mlp_only_layers=[],
                                      decoder_sparse_step=1)
    torch.manual_seed(5)
    model = transformers.Qwen3MoeForCausalLM(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 1:
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            else:
                p.copy_(0.05 * torch.randn_like(p))
    model.eval()
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    write_tokenizer(out)
    return model


def converted_moe256(root, expert_format: str, trunk_format: str | None = None):
    """(root, container, torch model): build_moe256 converted by `ferry convert --expert-format F`
    (and `--trunk-format T` when given)."""
    model = build_moe256(root / "ckpt")
    trunk = ["--trunk-format", trunk_format] if trunk_format else []
    res = run_ferry("convert", str(root / "ckpt"), str(root / "moe.ferry"), *trunk, "--expert-format", expert_format)
    assert res.returncode == 0, res.stderr
    return root, root / "moe.ferry", model


def assert_expert_banks(container, fmt: str, block_bytes: int) -> dict:
    """Every expert bank of build_moe256's container holds ``fmt`` (``block_bytes`` per 256 values); the manifest."""
    doc = json.loads((container / "manifest.json").read_text())
    for bank in doc["expert_banks"]:
        assert {bank[p]["dtype"] for p in ("gate", "up", "down")} == {fmt}
        assert bank["gate"]["nbytes"] == 256 * 256 // 256 * block_bytes
    return doc


@pytest.fixture(scope="module")
def q3_container(tmp_path_factory):
    return converted_moe256(tmp_path_factory.mktemp("q3moe"), "q3_nl")


@pytest.fixture(scope="module")
def tokens():
    rng = np.random.default_rng(11)
    return [int(t) for t in rng.integers(3, 96, PROMPT + DECODE)]


def run_engine(container, tokens):
    with Engine(container, threads=2, activations="exact") as engine:   # the reference checks run exact
        s = engine.session(64)
        stages: dict[int, list[np.ndarray]] = {}
        s.observe(lambda stage, pos, h: stages.setdefault(stage, []).append(h))
        logits = [s.eval(tokens[:PROMPT], all_logits=True)] + [s.eval([t])[None] for t in tokens[PROMPT:]]
        n_layers = engine.info.n_layers
    return {k: np.concatenate(v) for k, v in stages.items()}, np.concatenate(logits), n_layers


def engine_matches_stored_values(root, container, tokens, label: str):
    """The engine (exact activations) against transformers running the container's own dequantized values:
    every stage and the logits within 1e-5. (the engine's logits, the dequantized torch model)"""
    stages, logits, n_layers = run_engine(container, tokens)
    stored = dequantized_reference_model(container, root / "dequantized")
    hidden, ref_logits = reference(stored, tokens)
    errs = [rel_l2(stages[i], hidden[i]) for i in range(n_layers)]
    errs += [rel_l2(stages[n_layers + 1], hidden[n_layers]), rel_l2(logits, ref_logits)]
    print(f"{label} vs transformers on stored values:", ", ".join(f"{e:.2e}" for e in errs))
    assert max(errs) < 1e-5, errs
    return logits, stored


def prefill_equals_steps(container, tokens, kernels: str | None = None, activations: str = "exact",
                         threads: int = 2) -> np.ndarray:
    """One engine's logits for ``tokens`` as one prompt, asserted bit-identical to the same tokens one by one."""
    with Engine(container, threads=threads, kernels=kernels, activations=activations) as engine:
        batch = engine.session(64).eval(tokens, all_logits=True)
        s = engine.session(64)
        steps = np.stack([s.eval([t]) for t in tokens])
    assert np.array_equal(batch, steps), (kernels, activations)
    return batch


def test_manifest_uses_q3_nl(q3_container):
    assert_expert_banks(q3_container[1], "q3_nl", 99)


def test_engine_matches_transformers_on_stored_values(q3_container, tokens):
    root, container, model = q3_container
    logits, _ = engine_matches_stored_values(root, container, tokens, "q3_nl experts")
    # And against the original float model: what 3 bits cost here.
    _, src_logits = reference(model, tokens)
    print(f"q3_nl experts vs the f32 source: logits rel L2 {rel_l2(logits, src_logits):.3f}")
    assert rel_l2(logits, src_logits) < 0.5


def test_prefill_equals_single_steps(q3_container, tokens):
    _, container, _ = q3_container
    for activations in ("exact", "auto"):
        prefill_equals_steps(container, tokens, activations=activations)


@pytest.mark.parametrize("which", ["scalar", "auto"])
def test_kernel_sets_agree(q3_container, tokens, which):
    """An engine opened with the scalar kernels against one with `which`, in one process."""
    _, container, _ = q3_container
    outs = {}
    for mode in ("scalar", which):
        with Engine(container, threads=1, kernels=mode, activations="exact") as e:
            if mode == "scalar":
                assert e.info.kernels == "scalar"
            outs[mode] = e.session(64).eval(tokens, all_logits=True)
    err = rel_l2(outs[which], outs["scalar"])
    print(f"kernels {which} vs scalar: logits rel L2 {err:.2e}")
    assert err < 1e-5
