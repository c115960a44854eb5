"""Trunk format `auto`: a trunk converted from floats (f32/f16/bf16) is stored
as q8_0 (docs/bench-log/2026-12-03.md, "Default trunk format"), vectors stay f32 and
experts keep their format; a quantized GGUF trunk (the demo's Q4_1) keeps its
own formats."""
from __future__ import annotations

import json

import numpy as np
import pytest

from app.convert.gguf_file import GGUFFile
from app.convert.layout import AUTO_FLOAT_TRUNK, trunk_auto_format
from app.engine.binding import Engine
from tests.conftest import run_ferry
from tests.tiny_models import build, rel_l2


def dtypes(container) -> dict[str, str]:
    doc = json.loads((container / "manifest.json").read_text())
    return {t["name"]: t["dtype"] for t in doc["tensors"]}


def test_auto_rule():
    assert AUTO_FLOAT_TRUNK == "q8_0"
    for fmts in (["f32", "f32"], ["bf16"], ["f16", "bf16"], ["bf16-slice", "bf16"]):
        assert trunk_auto_format(fmts) == "q8_0", fmts
    for fmts in (["q4_1", "q8_0"], ["q4_1", "f16"], ["f32", "q6_k"], ["f32", "mxfp4"], []):
        assert trunk_auto_format(fmts) == "auto", fmts


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_float_trunk_defaults_to_q8_0(tmp_path, dtype):
    import torch

    build("qwen3moe", tmp_path / "ckpt", dtype=getattr(torch, dtype))
    run_ferry("convert", str(tmp_path / "ckpt"), str(tmp_path / "auto.ferry"), "--quiet")
    run_ferry("convert", str(tmp_path / "ckpt"), str(tmp_path / "f32.ferry"), "--trunk-format", "f32", "--quiet")
    doc = json.loads((tmp_path / "auto.ferry" / "manifest.json").read_text())
    assert doc["conversion"]["trunk_format"] == "auto"
    got = dtypes(tmp_path / "auto.ferry")
    matrices = {n: f for n, f in got.items() if f != "f32"}
    vectors = {n for n, f in got.items() if f == "f32"}
    assert set(matrices.values()) == {"q8_0"}
    assert {"token_embd", "blk.0.attn_q", "blk.0.attn_output"} <= set(matrices)
    assert vectors and all("norm" in n or "bias" in n for n in vectors), vectors
    source_expert = "f32" if dtype == "float32" else "bf16"
    for bank in doc["expert_banks"]:  # experts keep the source's format under expert format auto
        assert {bank[p]["dtype"] for p in ("gate", "up", "down")} == {source_expert}
    toks = list(range(3, 19))
    with Engine(tmp_path / "auto.ferry") as q8, Engine(tmp_path / "f32.ferry") as f32:
        err = rel_l2(q8.session(32).eval(toks, all_logits=True), f32.session(32).eval(toks, all_logits=True))
    print(f"{dtype} source, q8_0 trunk vs f32 trunk: logits rel L2 {err:.2e}")
    assert 0 < err < 5e-2


def test_quantized_gguf_trunk_keeps_its_formats(demo_gguf, demo_container):
    gguf = GGUFFile(demo_gguf)
    got = dtypes(demo_container)
    assert got["blk.0.attn_q"] == "q4_1" and got["token_embd"] == "q8_0"
    for name, fmt in got.items():
        if fmt != "f32":  # every matrix is stored as the GGUF holds it
            source = "token_embd.weight" if name == "token_embd" else f"{name}.weight"
            assert gguf.info(source).type_name.lower() == fmt, name
