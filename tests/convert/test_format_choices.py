"""How the trunk and the experts could be stored, and the ones recommended
(app/convert/format_choices.py): for experts, when the whole model fits in
the usable RAM, the fastest choice whose error is at most a 4-bit format's,
else the one reading the fewest bytes per token; for the trunk the most accurate that leaves half the RAM to the
expert cache, else the smallest; the same lists from `ferry check`, and
`ferry convert --trunk-format recommended --expert-format recommended`
converting with them. Also: expert `auto` keeps MXFP4 experts exactly, as
bf16."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest

import app.memory.plan
from app.memory.budget import MachineMemory
from app.cli import main as ferry
from app.convert.convert import convert
from app.convert.format_choices import expert_choices, recommended, trunk_choices
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


#: Kernel speeds for the tests (bytes per second by format): every format alike, so the fastest choice is the
#: one with the fewest bytes per token; and one where 8-bit weights go through twice as fast per byte.
UNIFORM = {"bf16": 1e9, "q8_0": 1e9, "q4_0": 1e9, "q3_nl": 1e9, "f32": 1e9}
FAST_Q8 = {**UNIFORM, "q8_0": 2e9}


def test_the_fastest_within_the_quality_bound_when_it_fits_else_the_fewest_bytes(moe):
    src = open_source(moe)
    every = _by_format(expert_choices(src, "auto", 4, WORKING, 1 << 40, UNIFORM.get))
    assert list(every) == ["auto", "q8_0", "q4_0", "q3_nl"]
    assert every["auto"].stored == "bf16" and every["auto"].exact and not every["auto"].recommended
    assert every["q4_0"].recommended and every["q4_0"].rule == "speed"   # fewest bytes within a 4-bit error
    assert every["q3_nl"].tok_per_s > every["q4_0"].tok_per_s            # faster, but beyond the quality bound
    assert every["auto"].tok_per_s < every["q8_0"].tok_per_s < every["q4_0"].tok_per_s
    sizes = [every[f].container_bytes for f in every]
    assert sizes == sorted(sizes, reverse=True)
    assert [round(every[f].bits_per_weight) for f in ("q8_0", "q4_0", "q3_nl")] == [9, 5, 3]
    assert 3.09 <= every["q3_nl"].bits_per_weight < 3.3     # 3.094 plus record headers and alignment
    trunk = every["auto"].container_bytes - every["auto"].nbytes

    def pick(usable, speed=UNIFORM):
        return recommended(expert_choices(open_source(moe), "auto", 4, WORKING, usable, speed.get))

    need = {f: c.container_bytes + WORKING for f, c in every.items()}
    assert pick(need["auto"] + (1 << 20)) == "q4_0"
    assert pick(need["auto"] + (1 << 20), FAST_Q8) == "q8_0"   # faster per token than q4_0 here: and more accurate
    assert pick(need["auto"] + (1 << 20), {**UNIFORM, "bf16": 3e9}) == "auto"  # within the margin: the exact one
    assert pick(need["auto"] - (1 << 20)) == "q4_0"
    assert pick(need["q8_0"] - (1 << 20)) == "q4_0"
    assert pick(need["q4_0"] - (1 << 20)) == "q3_nl"   # only 3 bits fit: the most accurate that fits
    assert pick(trunk) == "q3_nl"                            # nothing fits: the fewest bytes per token
    small = _by_format(expert_choices(open_source(moe), "auto", 4, WORKING, trunk, UNIFORM.get))
    assert not any(c.fits_in_ram for c in small.values()) and small["q3_nl"].recommended
    assert small["q3_nl"].rule == "smallest" and all(c.tok_per_s is None for c in small.values())
    # 2 bits are offered to a model that streams, never chosen for the user: fewer bytes, a larger error
    assert list(small)[-1] == "q2_vq" and not small["q2_vq"].recommended
    assert small["q2_vq"].cold_bytes_per_token < small["q3_nl"].cold_bytes_per_token
    assert small["q2_vq"].error > small["q3_nl"].error and 2.28 <= small["q2_vq"].bits_per_weight < 2.5
    assert small["q3_nl"].cold_bytes_per_token == min(c.cold_bytes_per_token for f, c in small.items() if f != "q2_vq")
    # A format without a measured kernel leaves the speed rule out: the most accurate that fits.
    assert pick(need["auto"] + (1 << 20), {}) == "auto"


def test_the_speed_rule_has_one_source_for_configs_and_sources():
    """`ferry plan --config` (the catalogue) recommends by the same rule: OLMoE-1B-7B from its bf16 release on a
    64 GB machine gets 4-bit experts with uniform kernels, 8-bit ones where 8-bit kernels go twice as fast."""
    from app.get.catalogue import ENTRIES
    from app.convert.plan_config import recommended_formats

    olmoe = next(e for e in ENTRIES if e.name.startswith("OLMoE")).config
    assert recommended_formats(olmoe, ram=64 << 30, speed=UNIFORM.get)[1] == "q4_0"
    assert recommended_formats(olmoe, ram=64 << 30, speed=FAST_Q8.get)[1] == "q8_0"
    assert recommended_formats(olmoe, ram=64 << 30, speed={}.get)[1] == "bf16"   # no speeds: the most accurate


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
    monkeypatch.setattr(app.memory.plan, "machine_memory", lambda: MachineMemory(8 << 20, 2 << 20, "test"))
    assert ferry(["check", str(moe), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["ok"] and [c["format"] for c in doc["expert_choices"] if c["recommended"]] == ["q3_nl"]
    assert doc["trunk_format"] == "iq4_xs" and doc["expert_format"] == "q3_nl"
    assert ferry(["check", str(moe)]) == 0
    text = capsys.readouterr().out
    assert "* q3_nl" in text and "recommended: --expert-format q3_nl" in text
    assert "q2_vq" in text and "* q2_vq" not in text          # offered (nothing fits), not recommended
    assert "* iq4_xs" in text and "recommended: --trunk-format iq4_xs" in text
    assert ferry(["convert", str(moe), str(tmp_path / "rec.ferry"), "--trunk-format", "recommended",
                  "--expert-format", "recommended", "--quiet"]) == 0
    manifest = json.loads((tmp_path / "rec.ferry" / "manifest.json").read_text())
    assert manifest["expert_banks"][0]["gate"]["dtype"] == "q3_nl"
    assert {t["dtype"] for t in manifest["tensors"] if len(t["shape"]) > 1} == {"iq4_xs"}
    assert ferry(["check", str(tmp_path / "missing")]) == 1
    assert "does not exist" in capsys.readouterr().out


def test_the_trunk_leaves_half_the_ram_to_the_expert_cache(moe):
    src = open_source(moe)
    every = {c.format: c for c in trunk_choices(src, "auto", WORKING, 1 << 40)}
    assert list(every) == ["auto", "iq4_xs", "q4_0"] and every["auto"].stored == "q8_0" and every["auto"].recommended
    assert every["iq4_xs"].nbytes < every["q4_0"].nbytes and every["iq4_xs"].error < every["q4_0"].error
    assert not every["auto"].exact and every["iq4_xs"].nbytes < every["auto"].nbytes
    assert every["iq4_xs"].stored == "iq4_xs" and every["iq4_xs"].label == "4-bit (iq4_xs)"
    assert round(every["auto"].bits_per_weight, 2) == 8.5 and round(every["iq4_xs"].bits_per_weight, 2) == 4.25

    def pick(usable):
        return recommended(trunk_choices(open_source(moe), "auto", WORKING, usable))

    assert pick(2 * (every["auto"].nbytes + WORKING)) == "auto"
    assert pick(2 * (every["auto"].nbytes + WORKING) - 2) == "iq4_xs"
    assert pick(WORKING) == "iq4_xs"                  # nothing leaves half: the smallest


def test_k3_on_a_64_gb_mac_gets_a_4_bit_trunk_and_3_bit_experts():
    """The arithmetic behind the recommendation for the real K3 (its config's
    trunk: 56.7 G weights, `ferry plan --config`): at q8_0 it would take 57 GiB
    of a 64 GB Mac's RAM, at 4 bits about 35-37 GB."""
    from app.convert.plan_config import plan_from_config

    config = json.loads(open(k3_config_path()).read())
    q8 = plan_from_config(config, expert_bits=3, trunk_bits=8, ctx=4096)
    q4 = plan_from_config(config, expert_bits=3, trunk_bits=4, ctx=4096)
    mac = 64 << 30
    assert q8["trunk_bytes"] + q8["state_bytes"] + q8["scratch_bytes"] > mac // 2
    assert mac - q8["floor_bytes"] < 8 << 30                                # it would barely run at all
    assert q4["trunk_bytes"] < q8["trunk_bytes"] * 0.6                # q4_0, as the converter writes it
    assert q4["experts_total_bytes"] > 10 * mac                             # nothing fits: 3-bit experts


def k3_config_path() -> str:
    from tests.kimi.test_source_formats import K3_CONFIG

    if not os.path.exists(K3_CONFIG):
        pytest.skip(f"{K3_CONFIG} (the shared spec) is not here")
    return K3_CONFIG


def test_plan_config_recommends_what_check_recommends(tmp_path):
    """`ferry plan --config` and `ferry check` make one choice: on a tiny K3
    checkpoint, for RAM sizes on both sides of each threshold, the formats
    planned from the bare config are the ones validate_source recommends."""
    from app.memory.budget import MachineMemory
    from app.convert.validate import validate_source
    from app.convert.plan_config import recommended_formats
    from tests.kimi import tiny_k3

    src = tmp_path / "k3"
    tiny_k3.build(src, moe_ffn=256, latent=256)
    config = json.loads((src / "config.json").read_text())
    probe = validate_source(src, "recommended", "recommended", memory=MachineMemory(1 << 40, 1 << 40, "test"))
    trunk = {c.format: c.nbytes for c in probe.trunk_choices}
    work = probe.plan.state + probe.plan.scratch
    seen = set()
    # (a bare config is costed, not laid out: the sizes agree within a few %, so the RAM sizes tried
    # are a fifth away from each threshold)
    half, whole = 2 * (trunk["auto"] + work), probe.container_bytes + work
    for usable in (1 << 40, int(whole * 1.2), int(whole * 0.8), int(half * 1.2), int(half * 0.8), 1 << 20):
        check = validate_source(src, "recommended", "recommended", memory=MachineMemory(usable, usable, "test"))
        t, e, _ = recommended_formats(config, ctx=4096, ram=usable)
        want_t = {"auto": "q8_0"}.get(check.trunk_format, check.trunk_format)
        want_e = {"auto": "bf16"}.get(check.expert_format, check.expert_format)
        assert (t, e) == (want_t, want_e), usable
        seen.add((t, e))
    assert len(seen) >= 3          # the sizes above do cross the thresholds


def test_plan_config_counts_the_cache_policy_state(tmp_path):
    """The expert cache's policy state is in the plan from a bare config, as
    the engine counts it: K3's successor table (93 layers x 896^2 x 2 bytes,
    ~146 MiB) is in its floor, and a tiny K3 plans the very bytes its
    container's engine plan reports."""
    from app.engine.binding import container_plan
    from app.convert.plan_config import plan_from_config
    from tests.kimi import tiny_k3

    config = json.loads(open(k3_config_path()).read())
    plan = plan_from_config(config, expert_bits=3, trunk_bits=4, ctx=4096)
    table = 93 * 896 * 896 * 2
    assert table <= plan["policy_bytes"] < 1.05 * table
    assert plan["policy_all_bytes"] >= plan["policy_bytes"]
    assert plan["floor_bytes"] == (plan["trunk_bytes"] + plan["state_bytes"] + plan["scratch_bytes"]
                                   + plan["top_k"] * plan["expert_record_bytes"] + plan["policy_bytes"])
    src = tmp_path / "k3"
    tiny_k3.build(src)
    tiny = plan_from_config(json.loads((src / "config.json").read_text()), trunk_format="f32", expert_format="f32")
    real = container_plan(convert(src, tmp_path / "k3.ferry", trunk_format="f32", expert_format="f32"), 4096)
    assert tiny["policy_bytes"] == real.policy_floor_bytes > 0
    assert tiny["policy_all_bytes"] == real.policy_bytes


def test_plan_config_counts_the_q8_buffer_the_engine_takes(tmp_path):
    """`ferry plan --config` counts the default 8-bit activations' buffer by the
    engine's own rule (a region only for the layouts this CPU's kernels read
    for the stored formats): a tiny K3 with a quantized trunk and q3_nl
    experts plans the very bytes its container's engine plan reports, and a
    float model none."""
    from app.engine.binding import container_plan
    from app.convert.plan_config import plan_from_config
    from tests.kimi import tiny_k3

    src = tmp_path / "k3"
    tiny_k3.build(src, moe_ffn=256, latent=256)   # experts of 256-value rows: q3_nl holds them
    config = json.loads((src / "config.json").read_text())
    for trunk, experts in (("iq4_xs", "q3_nl"), ("f32", "f32")):
        planned = plan_from_config(config, trunk_format=trunk, expert_format=experts, ctx=4096)
        real = container_plan(convert(src, tmp_path / f"k3-{trunk}.ferry", trunk_format=trunk,
                                      expert_format=experts), 4096)
        assert planned["q8_bytes"] == real.q8_bytes, (trunk, experts)
        assert (real.q8_bytes > 0) == (trunk != "f32")
