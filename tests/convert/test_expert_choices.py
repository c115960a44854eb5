"""How the experts could be stored, and the one recommended
(app/convert/expert_choices.py): the most accurate choice whose whole model
fits in the usable RAM, else the one reading the fewest bytes per token; the
same list from `ferry check`, and `ferry convert --expert-format recommended`
converting with it. Also: expert `auto` keeps MXFP4 experts exactly, as bf16."""
from __future__ import annotations

import json

import numpy as np
import pytest

import app.plan
from app.budget import MachineMemory
from app.cli import main as ferry
from app.convert.convert import convert
from app.convert.expert_choices import expert_choices, recommended
from app.convert.sources import open_source
from bench.make_synthetic import make, parse
from tests.kimi import k3_reference as ref
from tests.kimi import tiny_k3

WORKING = 1 << 20


@pytest.fixture(scope="module")
def moe(tmp_path_factory):
    out = tmp_path_factory.mktemp("choices") / "Qwen3-MoE-tiny"
    return make(parse(["--out", str(out), "--layers", "2", "--experts", "8", "--shards", "1"]))


def _by_format(choices):
    return {c.format: c for c in choices}


def test_the_most_accurate_choice_that_fits_else_the_fewest_bytes(moe):
    src = open_source(moe)
    every = _by_format(expert_choices(src, "auto", 4, WORKING, 1 << 40))
    assert list(every) == ["auto", "q8_0", "q4_0", "q3_nl"]
    assert every["auto"].stored == "bf16" and every["auto"].exact and every["auto"].recommended
    sizes = [every[f].container_bytes for f in every]
    assert sizes == sorted(sizes, reverse=True)
    assert [round(every[f].bits_per_weight) for f in ("q8_0", "q4_0", "q3_nl")] == [9, 5, 3]
    assert 3.09 <= every["q3_nl"].bits_per_weight < 3.3     # 3.094 plus record headers and alignment
    trunk = every["auto"].container_bytes - every["auto"].expert_bytes

    def pick(usable):
        return recommended(expert_choices(open_source(moe), "auto", 4, WORKING, usable))

    need = {f: c.container_bytes + WORKING for f, c in every.items()}
    assert pick(need["auto"] + (1 << 20)) == "auto"
    assert pick(need["auto"] - (1 << 20)) == "q8_0"
    assert pick(need["q8_0"] - (1 << 20)) == "q4_0"
    assert pick(need["q4_0"] - (1 << 20)) == "q3_nl"
    assert pick(trunk) == "q3_nl"                            # nothing fits: the fewest bytes per token
    small = _by_format(expert_choices(open_source(moe), "auto", 4, WORKING, trunk))
    assert not any(c.fits_in_ram for c in small.values()) and small["q3_nl"].recommended
    assert small["q3_nl"].cold_bytes_per_token == min(c.cold_bytes_per_token for c in small.values())


def test_a_format_that_cannot_hold_the_rows_is_not_offered(tmp_path):
    tiny_k3.build(tmp_path / "k3")                            # experts of 32 values per row: no 256-value blocks
    choices = _by_format(expert_choices(open_source(tmp_path / "k3"), "auto", tiny_k3.TOPK, WORKING, 1 << 40))
    assert list(choices) == ["auto", "q8_0", "q4_0"]
    assert choices["auto"].stored == "bf16"                   # MXFP4 is kept exactly, as bf16


def test_mxfp4_experts_convert_exactly_by_default(tmp_path):
    tiny_k3.build(tmp_path / "k3")
    out = convert(tmp_path / "k3", tmp_path / "k3.ferry")
    manifest = json.loads((out / "manifest.json").read_text())
    bank = manifest["expert_banks"][0]
    assert {p["dtype"] for p in (bank["gate"], bank["up"], bank["down"])} == {"bf16"}
    _, tensors = ref.load_release(tmp_path / "k3")
    data = np.fromfile(out / bank["file"], dtype=np.uint8)
    last = bank["n_experts"] - 1
    rec = data[4096 + last * bank["record_size"]:]
    p = bank["down"]
    raw = rec[p["offset"]:p["offset"] + p["nbytes"]]
    got = (raw.view("<u2").astype(np.uint32) << 16).view("<f4").reshape(p["shape"])
    want = tensors[f"language_model.model.layers.{bank['layer']}.block_sparse_moe.experts.{last}.w2.weight"]
    assert np.array_equal(got.astype(np.float64), want)


def test_ferry_check_and_convert_recommended(moe, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(app.plan, "machine_memory", lambda: MachineMemory(8 << 20, 2 << 20, "test"))
    assert ferry(["check", str(moe), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["ok"] and [c["format"] for c in doc["expert_choices"] if c["recommended"]] == ["q3_nl"]
    assert ferry(["check", str(moe)]) == 0
    text = capsys.readouterr().out
    assert "* q3_nl" in text and "recommended (*): --expert-format q3_nl" in text and "does not fit" in text
    assert ferry(["convert", str(moe), str(tmp_path / "rec.ferry"), "--expert-format", "recommended",
                  "--quiet"]) == 0
    manifest = json.loads((tmp_path / "rec.ferry" / "manifest.json").read_text())
    assert manifest["expert_banks"][0]["gate"]["dtype"] == "q3_nl"
    assert ferry(["check", str(tmp_path / "missing")]) == 1
    assert "does not exist" in capsys.readouterr().out
