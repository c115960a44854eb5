"""`ferry get` against a hub on loopback: plan from small files only, download
and convert into the same bytes as converting from disk, hashes, errors."""
from __future__ import annotations

import pytest

from app.memory.budget import MachineMemory
from app.get.hub import GetError, open_repo
from app.get.pipeline import Getter
from app.get.plan import plan_repo
from tests.get.conftest import local_convert, tree_bytes

BIG = MachineMemory(64 << 30, 64 << 30, "test")


def test_plan_fetches_no_shard_and_matches_check(hub, repos, tmp_path):
    from app.convert.validate import validate_source

    plan = plan_repo("moonshotai/Kimi-K3-tiny", into=tmp_path, memory=BIG, disk_bps=2e9, kernel_bps=5e9)
    assert hub.shard_gets() == []                      # headers only (small ranged reads)
    assert any(rng for _, path, rng in hub.log if path.endswith(".safetensors"))
    check = validate_source(repos["k3"], "recommended", "recommended", memory=BIG)
    assert (plan.trunk_format, plan.expert_format) == (check.trunk_format, check.expert_format)
    assert plan.container_bytes == check.container_bytes
    assert plan.floor_bytes == check.plan.floor and plan.recommended_budget == check.plan.recommended
    assert plan.download_bytes >= sum(p.stat().st_size for p in repos["k3"].glob("*.safetensors"))
    assert plan.verdict == "runs well" and plan.tok_per_s > 0
    assert plan.peak_disk_delete_bytes < plan.peak_disk_bytes


def test_get_equals_converting_the_same_files_from_disk(hub, repos, tmp_path):
    seen = []
    g = Getter("meta/tiny-llama", tmp_path / "into", memory=BIG, progress=seen.append)
    out = g.run()
    assert (g.plan.trunk_format, g.plan.expert_format) == ("auto", "auto")     # a small dense model: q8_0 trunk
    ref = local_convert(repos["llama"], tmp_path / "ref", "tiny-llama")
    assert tree_bytes(out) == tree_bytes(ref)
    assert seen[-1].stage == "done" and seen[-1].downloaded == seen[-1].download_total > 0
    assert (tmp_path / "into" / "tiny-llama" / "model.safetensors.index.json").exists()   # kept


def test_k3_delete_source_same_bytes_and_shards_gone(hub, repos, tmp_path):
    plan = plan_repo("moonshotai/Kimi-K3-tiny", into=tmp_path, memory=BIG, disk_bps=1e9, kernel_bps=1e9)
    out = Getter("moonshotai/Kimi-K3-tiny", tmp_path / "into", memory=BIG, delete_source=True).run()
    ref = local_convert(repos["k3"], tmp_path / "ref", "Kimi-K3-tiny", trunk_format=plan.trunk_format,
                        expert_format=plan.expert_format)
    assert tree_bytes(out) == tree_bytes(ref)
    assert not (tmp_path / "into" / "Kimi-K3-tiny").exists() and not (tmp_path / "into" / "Kimi-K3-tiny.get").exists()


def test_a_damaged_shard_is_caught_by_its_hash_and_fetched_again(hub, repos, tmp_path):
    shard = sorted(p.name for p in repos["llama"].glob("*.safetensors"))[1]
    hub.repos["meta/tiny-llama"].damage[shard] = ["flip"]
    notes = []
    out = Getter("meta/tiny-llama", tmp_path / "into", memory=BIG,
                 progress=lambda p: p.note and notes.append(p.note)).run()
    ref = local_convert(repos["llama"], tmp_path / "ref", "tiny-llama", trunk_format="auto")
    assert tree_bytes(out) == tree_bytes(ref)
    assert sum(1 for _, path, rng in hub.log if path.endswith(shard) and not rng) >= 2
    assert any("hash" in n for n in notes)


def test_a_truncated_shard_on_disk_is_fetched_again(hub, repos, tmp_path):
    into = tmp_path / "into"
    Getter("meta/tiny-llama", into, memory=BIG).run()
    shard = sorted(p.name for p in repos["llama"].glob("*.safetensors"))[0]
    for p in (into / "tiny-llama.ferry",):
        import shutil
        shutil.rmtree(p)
    # the state is gone with the finished download: a new run checks the hash of what is there
    path = into / "tiny-llama" / shard
    path.write_bytes(path.read_bytes()[:-100])
    out = Getter("meta/tiny-llama", into, memory=BIG).run()
    ref = local_convert(repos["llama"], tmp_path / "ref", "tiny-llama", trunk_format="auto")
    assert tree_bytes(out) == tree_bytes(ref)
    assert (into / "tiny-llama" / shard).read_bytes() == (repos["llama"] / shard).read_bytes()


def test_gguf_repository_lists_its_files_and_gets_the_chosen_one(hub, repos, tmp_path):
    plan = plan_repo("someone/tiny-gguf", into=tmp_path, memory=BIG, disk_bps=1e9, kernel_bps=1e9)
    assert plan.verdict == "does not fit" and "--file" in plan.reason
    assert {n for n, _ in plan.ggufs} == {"tiny-Q8_0.gguf", "tiny-F32.gguf"}
    plan = plan_repo("someone/tiny-gguf", into=tmp_path, file="tiny-Q8_0.gguf", memory=BIG, disk_bps=1e9,
                     kernel_bps=1e9)
    assert plan.verdict == "runs well" and plan.container_bytes > 0
    assert hub.shard_gets() == []
    out = Getter("someone/tiny-gguf", tmp_path / "into", file="tiny-Q8_0.gguf", memory=BIG).run()
    ref = local_convert(repos["gguf"] / "tiny-Q8_0.gguf", tmp_path / "ref", "tiny-Q8_0.gguf")
    assert tree_bytes(out) == tree_bytes(ref)


@pytest.mark.parametrize("setup, words", [
    (dict(token="secret"), "not found"),                        # private, no token: the hub says "not found"
    (dict(gated=True), "gated"),
    (dict(forbidden=True), "403"),
])
def test_refusals_are_explained(hub, repos, setup, words):
    for k, v in setup.items():
        setattr(hub.repos["meta/tiny-llama"], k, v)
    with pytest.raises(GetError, match=words):
        open_repo("meta/tiny-llama")


def test_wrong_token_missing_repo_and_revision(hub, memory_keyring):
    from app.get.hub import store_token

    hub.repos["meta/tiny-llama"].token = "right"
    store_token("wrong")
    with pytest.raises(GetError, match="401"):
        open_repo("meta/tiny-llama")
    store_token("right")
    assert open_repo("meta/tiny-llama").shards
    with pytest.raises(GetError, match="not found"):
        open_repo("nobody/nothing")
    with pytest.raises(GetError, match="revision"):
        open_repo("meta/tiny-llama", "no-such-branch")
    with pytest.raises(GetError, match="owner/name"):
        open_repo("../etc")


@pytest.mark.slow
def test_cli_plan_and_refusal(hub, tmp_path):
    import json
    import os

    from tests.conftest import run_ferry

    env = {k: os.environ[k] for k in ("HF_ENDPOINT", "HF_HOME", "NO_PROXY")}
    res = run_ferry("get", "moonshotai/Kimi-K3-tiny", "--plan", "--into", str(tmp_path), "--json", env=env)
    plan = json.loads(res.stdout)
    assert plan["verdict"] in ("runs well", "runs slowly") and plan["container_bytes"] > 0
    assert hub.shard_gets() == []
    res = run_ferry("get", "nobody/nothing", "--plan", "--into", str(tmp_path), env=env, check=False)
    assert res.returncode == 1 and "was not found" in res.stderr and "Traceback" not in res.stderr
    res = run_ferry("get", "--catalogue", "--json", env=env)
    assert len(json.loads(res.stdout)) == 8


def test_a_kept_download_is_the_whole_repository(hub, repos, tmp_path):
    """Without --delete-source the folder is a full copy, with the shard no unit reads (K3's vision tower)."""
    Getter("moonshotai/Kimi-K3-tiny", tmp_path, memory=BIG).run()
    for p in repos["k3"].iterdir():
        assert (tmp_path / "Kimi-K3-tiny" / p.name).read_bytes() == p.read_bytes()


def test_a_resume_with_other_formats_is_refused_clearly(hub, tmp_path):
    from app.convert.convert import ConvertCancelled, ConvertControl

    ctl = ConvertControl()
    ctl.cancel()
    with pytest.raises(ConvertCancelled):
        Getter("meta/tiny-llama", tmp_path, memory=BIG, control=ctl, trunk_format="q8_0").run()
    with pytest.raises(GetError, match="started with trunk q8_0"):
        Getter("meta/tiny-llama", tmp_path, memory=BIG, trunk_format="q4_0").run()
    assert Getter("meta/tiny-llama", tmp_path, memory=BIG).run().is_dir()     # "recommended": the stored ones
