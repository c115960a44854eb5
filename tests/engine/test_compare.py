"""`ferry eval MODEL --compare FILE`: a routing mode against exact routing on
a real (synthetic, random-weight) MoE container, through the CLI."""
from __future__ import annotations

import json

import pytest

from app.cli import main as ferry
from app.convert.convert import convert
from app.engine.compare import CompareError, read_prompts
from bench.make_synthetic import make, parse


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    root = tmp_path_factory.mktemp("compare")
    ckpt = make(parse(["--out", str(root / "ckpt"), "--layers", "4", "--experts", "16", "--top-k", "4"]))
    return convert(ckpt, root / "moe.ferry")


@pytest.fixture()
def prompts(tmp_path):
    path = tmp_path / "prompts.jsonl"
    path.write_text('"The quick brown fox"\n{"prompt": "Once upon a time there was"}\n\n')
    return path


def compare(capsys, model, prompts, *extra):
    """A routing mode against exact routing: exact activations in both (by default the mode compared also
    has the default's 8-bit activations)."""
    assert ferry(["eval", str(model), "--compare", str(prompts), "--json", "--threads", "2",
                  "--activations", "exact", *extra]) == 0
    return json.loads(capsys.readouterr().out)


def test_compare_reports_kl_agreement_and_bytes_per_mode(capsys, model, prompts):
    same = compare(capsys, model, prompts, "--experts-per-token", "4")
    assert same["prompts"] == 2 and same["positions"] > 4
    assert same["kl_max"] == 0.0 and same["top1_agreement"] == 1.0  # N = k is exact routing
    assert same["exact"]["bytes_read"] == same["compared"]["bytes_read"]
    fewer = compare(capsys, model, prompts, "--experts-per-token", "2")
    assert fewer["kl_mean"] > 0 and fewer["kl_max"] >= fewer["kl_mean"]
    assert 0.0 <= fewer["top1_agreement"] <= 1.0
    assert fewer["compared"]["routed_choices"] * 2 == fewer["exact"]["routed_choices"]
    assert fewer["compared"]["bytes_per_token"] < fewer["exact"]["bytes_per_token"]
    for mode in (fewer["exact"], fewer["compared"]):
        assert set(mode) >= {"bytes_per_token", "hit_rate", "lookahead_accuracy", "stall_seconds"}


def test_compare_with_cache_aware_routing_under_a_small_budget(capsys, model, prompts, monkeypatch):
    # This tiny random model routes almost the same experts every token, so
    # the only experts in RAM that exact routing did not choose are the ones
    # the lookahead read; its gate (closed until a layer's predictions prove
    # right) would keep those out, so this test opens the engine reading
    # every prediction, as the gate does once a real model's lookahead pays.
    from app.engine.binding import Engine
    opened = Engine.__init__

    def reading_every_prediction(self, *args, **kwargs):
        kwargs.setdefault("lookahead_gate", False)
        opened(self, *args, **kwargs)

    monkeypatch.setattr(Engine, "__init__", reading_every_prediction)
    out = compare(capsys, model, prompts, "--cache-aware", "1.0", "--budget", "13.5M")
    assert out["mode"]["cache_aware_margin"] == 1.0
    assert out["compared"]["routed_swaps"] > 0
    assert out["compared"]["hit_rate"] >= out["exact"]["hit_rate"]


def test_bad_prompt_files_and_settings_are_clear_errors(capsys, model, tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n")
    with pytest.raises(CompareError):
        read_prompts(empty)
    assert ferry(["eval", str(model), "--compare", str(empty), "--json"]) == 1
    assert "no prompts" in capsys.readouterr().err
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": 3}\n')
    assert ferry(["eval", str(model), "--compare", str(bad), "--json"]) == 1
    good = tmp_path / "good.txt"
    good.write_text("hello there\n")
    assert ferry(["eval", str(model), "--compare", str(good), "--experts-per-token", "9", "--json"]) == 1
    assert "experts per token" in capsys.readouterr().err
    assert ferry(["eval", str(model), "--json"]) == 2  # neither a prompt nor --compare
