"""Per-class trunk formats (`ferry convert --trunk-class CLASS=F`, `ferry plan
--config --trunk-class`): the tiny release-layout K3 with its FFN-like
matrices, attention projections and output head each stored in another
format runs exactly (1e-5) against the numpy reference on the container's
own values; the plan from the bare config costs the very trunk the
converter lays out; without classes nothing changes; K3's floor by class."""
from __future__ import annotations

import json

import numpy as np
import pytest

from app.convert import quant
from app.convert.convert import convert
from app.convert.errors import SourceError
from app.convert.layout import plan_layout, trunk_class
from app.convert.sources import open_source
from app.convert.plan_config import plan_from_config
from tests.convert.test_format_choices import k3_config_path
from tests.kimi import k3_reference as ref
from tests.kimi import tiny_k3
from tests.tiny_models import rel_l2, run_engine

CLASSES = {"ffn": "q8_0", "attention": "q4_0", "head": "q8_0"}


@pytest.fixture(scope="module")
def k3(tmp_path_factory):
    root = tmp_path_factory.mktemp("k3classes")
    tiny_k3.build(root / "ckpt")
    return root


def test_k3_with_per_class_trunk_formats_runs_exactly(k3):
    out = convert(k3 / "ckpt", k3 / "k3c.ferry", trunk_format="f32", expert_format="f32", trunk_classes=CLASSES)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["conversion"]["trunk_classes"] == dict(sorted(CLASSES.items()))
    spec = open_source(k3 / "ckpt").spec
    trunk = np.fromfile(out / "trunk.bin", dtype=np.uint8)
    cfg, tensors = ref.load_release(k3 / "ckpt")
    own = dict(tensors)
    seen = set()
    for t in manifest["tensors"]:
        cls = trunk_class(t["name"])
        if len(t["shape"]) < 2 or t["name"].endswith("ffn_router") or t["name"] == "token_embd":
            continue
        if cls and t["shape"][-1] % 32 == 0:
            assert t["dtype"] == CLASSES[cls], t
        else:               # no class, or rows the class's blocks cannot hold: the trunk's rule (its source's floats)
            assert t["dtype"] in ("f32", "bf16"), t
        seen.add(t["dtype"])
        if t["dtype"] in ("f32", "bf16"):
            continue        # the release's values exactly
        raw = trunk[t["offset"]:t["offset"] + t["nbytes"]]
        values = quant.dequantize(raw, t["dtype"].upper(), int(np.prod(t["shape"]))).reshape(t["shape"])
        source = spec.trunk[t["name"]]
        own[source] = values.astype(np.float64).reshape(np.shape(tensors[source]))
    assert {"q8_0", "q4_0"} <= seen
    rng = np.random.default_rng(5)
    tokens = [int(t) for t in rng.integers(0, tiny_k3.VOCAB, 8 + 3)]
    stages, logits, n_layers = run_engine(out, tokens, 8)
    stages_own, logits_own = ref.K3Reference(cfg, own).forward(np.array(tokens))
    errs = {f"stage {s}": rel_l2(stages[s], stages_own[s]) for s in range(n_layers + 2)}
    errs["logits"] = rel_l2(logits, logits_own)
    print("per-class trunk vs reference on the container's values: " + ", ".join(f"{k} {v:.1e}" for k, v in errs.items()))
    assert max(errs.values()) < 1e-5, errs
    # the plan from the bare config costs the same trunk
    config = json.loads((k3 / "ckpt" / "config.json").read_text())
    plan = plan_from_config(config, trunk_format="f32", expert_format="f32", trunk_classes=CLASSES)
    layout = plan_layout(open_source(k3 / "ckpt"), "f32", "f32", CLASSES)
    assert plan["trunk_bytes"] + plan["embedding_bytes"] == layout.trunk_size


def test_without_classes_the_layout_is_unchanged_and_bad_classes_are_refused(k3):
    src = open_source(k3 / "ckpt")
    plain = plan_layout(src, "q8_0", "q4_0")
    assert plain.options == {"trunk_format": "q8_0", "expert_format": "q4_0"}
    empty = plan_layout(src, "q8_0", "q4_0", {})
    assert empty.options == plain.options and empty.trunk == plain.trunk
    with pytest.raises(SourceError, match="trunk class 'mlp'"):
        plan_layout(src, "q8_0", "q4_0", {"mlp": "q4_0"})
    with pytest.raises(SourceError, match="trunk class format 'q9'"):
        plan_layout(src, "q8_0", "q4_0", {"ffn": "q9"})


def test_cli_refuses_a_bad_trunk_class_in_one_line(k3, tmp_path):
    from tests.conftest import run_ferry
    res = run_ferry("convert", str(k3 / "ckpt"), str(tmp_path / "x.ferry"), "--trunk-class", "ffn", check=False)
    assert res.returncode == 2 and "expected CLASS=F" in res.stderr and "Traceback" not in res.stderr
    assert not (tmp_path / "x.ferry").exists()


def test_k3_floor_by_trunk_class():
    config = json.load(open(k3_config_path()))
    base = plan_from_config(config, expert_format="q3_nl", trunk_format="q4_0", ctx=4096)
    ffn3 = plan_from_config(config, expert_format="q3_nl", trunk_format="q4_0", ctx=4096,
                            trunk_classes={"ffn": "q3_nl"})
    both = plan_from_config(config, expert_format="q3_nl", trunk_format="q4_0", ctx=4096,
                            trunk_classes={"ffn": "q3_nl", "attention": "q3_nl"})
    for p in (base, ffn3, both):
        assert sum(c["bytes"] for c in p["trunk_classes"].values()) == p["trunk_bytes"] + p["embedding_bytes"]
    assert ffn3["trunk_classes"]["shared experts"]["format"] == "q3_nl"
    assert ffn3["trunk_classes"]["shared experts"]["bytes"] == ffn3["trunk_classes"]["shared experts"]["bytes_at"]["q3_nl"]
    assert base["floor_gib"] > 30.9 and 27.5 < ffn3["floor_gib"] < 28.5 and both["floor_gib"] < 27.0


def test_k3_with_an_iq4_xs_trunk_runs_exactly_and_the_plan_costs_its_layout(tmp_path):
    """The 4-bit trunk `ferry check` recommends for K3 (iq4_xs): rows of 256 values (the latent
    projections' 256 columns here) are iq4_xs, shorter ones its q4_0 fallback; the engine runs the
    container's own values exactly, and `ferry plan --config` costs the very bytes laid out."""
    tiny_k3.build(tmp_path / "ckpt", latent=256)
    out = convert(tmp_path / "ckpt", tmp_path / "k3iq4.ferry", trunk_format="iq4_xs", expert_format="f32")
    manifest = json.loads((out / "manifest.json").read_text())
    spec = open_source(tmp_path / "ckpt").spec
    trunk = np.fromfile(out / "trunk.bin", dtype=np.uint8)
    cfg, tensors = ref.load_release(tmp_path / "ckpt")
    own, seen = dict(tensors), set()
    for t in manifest["tensors"]:
        if len(t["shape"]) < 2 or t["dtype"] in ("f32", "bf16"):
            continue
        seen.add(t["dtype"])
        assert t["dtype"] == ("iq4_xs" if t["shape"][-1] % 256 == 0 else "q4_0"), t
        raw = trunk[t["offset"]:t["offset"] + t["nbytes"]]
        values = quant.dequantize(raw, t["dtype"].upper(), int(np.prod(t["shape"]))).reshape(t["shape"])
        source = spec.trunk[t["name"]]
        own[source] = values.astype(np.float64).reshape(np.shape(tensors[source]))
    assert seen == {"iq4_xs", "q4_0"}
    rng = np.random.default_rng(5)
    tokens = [int(t) for t in rng.integers(0, tiny_k3.VOCAB, 8 + 3)]
    stages, logits, n_layers = run_engine(out, tokens, 8)
    stages_own, logits_own = ref.K3Reference(cfg, own).forward(np.array(tokens))
    errs = [rel_l2(stages[s], stages_own[s]) for s in range(n_layers + 2)] + [rel_l2(logits, logits_own)]
    assert max(errs) < 1e-5, errs
    config = json.loads((tmp_path / "ckpt" / "config.json").read_text())
    plan = plan_from_config(config, trunk_format="iq4_xs", expert_format="f32")
    layout = plan_layout(open_source(tmp_path / "ckpt"), "iq4_xs", "f32")
    assert plan["trunk_bytes"] + plan["embedding_bytes"] == layout.trunk_size
