"""Kimi K3's vision tower on a tiny random tower in the release's layout
(tests/kimi/tiny_k3.py, vision=True): the C core (ferry_vision.h) against the
float64 numpy reference written from the release's facts
(tests/kimi/vision_reference.py) stage by stage and end to end; the
reference's interpolation against torch's; the container keeping the tower
(bf16 as released by default, f32 asked for) without the language model
paying RAM for it; image rows entering the language model in place of
their placeholder tokens, against the K3 reference."""
from __future__ import annotations

import json

import numpy as np
import pytest

from app.convert.convert import convert
from app.engine.binding import Engine, FerryError, Vision, container_plan, verify
from tests.kimi import k3_reference as ref
from tests.kimi import tiny_k3
from tests.kimi.vision_reference import VisionReference, bilinear
from tests.tiny_models import rel_l2

EXACT = 1e-5


@pytest.fixture(scope="module")
def tower(tmp_path_factory):
    root = tmp_path_factory.mktemp("k3v")
    tiny_k3.build(root / "ckpt", vision=True)
    f32 = convert(root / "ckpt", root / "f32.ferry", trunk_format="f32", expert_format="f32")
    auto = convert(root / "ckpt", root / "auto.ferry")
    cfg, tensors = ref.load_release(root / "ckpt")
    top = json.loads((root / "ckpt" / "config.json").read_text())
    return root, f32, auto, cfg, tensors, top


def _vision_cfg(container):
    return json.loads((container / "manifest.json").read_text())["model"]["vision"]


@pytest.mark.parametrize("grid", [(6, 10), (8, 8), (2, 2), (12, 4)])
def test_tower_matches_reference_stage_by_stage(tower, grid):
    root, f32, auto, cfg, tensors, top = tower
    gh, gw = grid
    patches = np.random.default_rng(gh * 31 + gw).standard_normal((gh * gw, 48))
    stages_ref, out_ref = VisionReference(top["vision_config"], tensors).forward(patches, gh, gw)
    for container in (f32, auto):   # bf16 as released is exact: the reference reads the same bf16 values
        seen = {}
        with Vision(container, _vision_cfg(container), threads=2) as v:
            out = v.encode(patches, gh, gw, lambda s, rows: seen.__setitem__(s, rows.copy()))
        errors = {s: rel_l2(seen[s], stages_ref[s]) for s in range(len(stages_ref))}
        errors["out"] = rel_l2(out, out_ref)
        assert rel_l2(seen[len(stages_ref)], out_ref) < EXACT
        assert max(errors.values()) < EXACT, errors
        assert out.shape == (gh * gw // 4, tiny_k3.HIDDEN)


def test_reference_interpolation_is_torchs_bilinear():
    import torch
    import torch.nn.functional as F

    table = np.random.default_rng(0).standard_normal((8, 8, 5))
    for h, w in ((3, 11), (8, 8), (16, 5), (1, 1)):
        want = F.interpolate(torch.tensor(table).permute(2, 0, 1)[None], size=(h, w), mode="bilinear")
        assert np.allclose(bilinear(table, h, w), want[0].permute(1, 2, 0).numpy(), atol=1e-12)


def test_container_keeps_the_tower_and_checks_it(tower):
    root, f32, auto, *_ = tower
    manifest = json.loads((auto / "manifest.json").read_text())
    kinds = {t["name"]: t["dtype"] for t in manifest["tensors"] if t["name"].startswith(("v.", "mm."))}
    assert kinds["v.patch_embd"] == "bf16" and kinds["mm.proj2"] == "bf16" and kinds["v.blk.1.norm0"] == "f32"
    assert len(kinds) == 2 + 6 * 2 + 4
    verify(auto)
    # the language model leaves the tower on disk
    tower_bytes = sum(t["nbytes"] for t in manifest["tensors"] if t["name"].startswith(("v.", "mm."))
                      and len(t["shape"]) == 2)
    plain = root / "plain"
    tiny_k3.build(plain / "ckpt")
    no_tower = convert(plain / "ckpt", plain / "auto.ferry")
    assert container_plan(auto).trunk_bytes <= container_plan(no_tower).trunk_bytes + 4096
    assert tower_bytes > 4096
    # a damaged tower tensor is named by ferry verify
    entry = next(t for t in manifest["tensors"] if t["name"] == "mm.proj0")
    damaged = root / "damaged.ferry"
    import shutil

    shutil.copytree(auto, damaged)
    with open(damaged / "trunk.bin", "r+b") as f:
        f.seek(entry["offset"] + 10)
        byte = f.read(1)
        f.seek(entry["offset"] + 10)
        f.write(bytes([byte[0] ^ 0xFF]))
    with pytest.raises(FerryError, match="mm.proj0"):
        verify(damaged)


def test_tower_refuses_a_lying_config_and_a_model_without_one(tower):
    root, f32, *_ = tower
    cfg = dict(_vision_cfg(f32), hidden=64)
    with pytest.raises(FerryError, match="v.patch_embd"):
        Vision(f32, cfg)
    with pytest.raises(FerryError, match="out of range"):
        Vision(f32, dict(_vision_cfg(f32), heads=-1))
    with Vision(f32, _vision_cfg(f32)) as v:
        with pytest.raises(FerryError, match="cannot be encoded"):
            v.encode(np.zeros((3 * 4, 48)), 3, 4)   # 3 rows do not merge by 2
        with pytest.raises(FerryError, match="cancelled"):
            v.encode(np.zeros((16, 48)), 4, 4, lambda s, rows: s < 1)


def test_image_rows_enter_the_language_model(tower):
    root, f32, auto, cfg, tensors, top = tower
    rng = np.random.default_rng(7)
    pad = tiny_k3.MEDIA_PAD
    tokens = [int(t) for t in rng.integers(0, 200, 5)] + [pad] * 6 + [int(t) for t in rng.integers(0, 200, 4)]
    use = np.array([t == pad for t in tokens])
    with Vision(f32, _vision_cfg(f32)) as v:
        rows = v.encode(rng.standard_normal((24, 48)), 4, 6)
    embeds = np.zeros((len(tokens), tiny_k3.HIDDEN), np.float32)
    embeds[use] = rows
    _, logits_ref = ref.K3Reference(cfg, tensors).forward(np.array(tokens), embeds, use)
    with Engine(f32, threads=2, activations="exact") as engine:
        s = engine.session(64)
        logits = s.eval(tokens, all_logits=True, embeds=embeds, use=use)
        plain = engine.session(64).eval(tokens, all_logits=True)
    assert rel_l2(logits, logits_ref) < EXACT
    assert rel_l2(logits[:5], plain[:5]) < 1e-6 and rel_l2(logits[5:], plain[5:]) > 1e-3
