"""`ferry convert`: resumable after SIGKILL (byte-identical result), refuses a
destination without room before writing, names a missing shard."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from app.convert.convert import ConvertError, Progress, convert, partial_dir
from app.convert.errors import SourceError
from bench.make_synthetic import make, parse
from tests.conftest import REPO, run_ferry


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory) -> Path:
    """About 80 MB of bf16 Qwen3-MoE checkpoint in 3 shards."""
    out = tmp_path_factory.mktemp("synth") / "ckpt"
    return make(parse(["--out", str(out), "--layers", "6", "--experts", "32", "--shards", "3"]))


def tree_bytes(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_killed_conversion_resumes_to_identical_bytes(synthetic, tmp_path):
    reference = convert(synthetic, tmp_path / "whole.ferry")
    out = tmp_path / "killed.ferry"
    journal = partial_dir(out) / "journal.json"
    cmd = [sys.executable, "-m", "app.cli", "convert", str(synthetic), str(out), "--quiet"]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    units = []
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            units = json.loads(journal.read_text())["done"]
        except (OSError, ValueError, KeyError):
            units = []
        if any(u.startswith("bank:") for u in units):
            break
        time.sleep(0.002)
    assert proc.poll() is None, "the conversion finished before it could be killed"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not out.exists() and partial_dir(out).exists()
    seen: list[Progress] = []
    convert(synthetic, out, progress=seen.append)
    assert tree_bytes(out) == tree_bytes(reference)
    assert not partial_dir(out).exists()
    # The resumed run did not redo the finished units: it started past them.
    assert seen[0].done_bytes > 0
    run_ferry("verify", str(out), "--quiet")


def test_progress_reaches_the_total(synthetic, tmp_path):
    seen: list[Progress] = []
    convert(synthetic, tmp_path / "p.ferry", progress=seen.append)
    done = [p.done_bytes for p in seen]
    assert done == sorted(done) and done[-1] == seen[-1].total_bytes
    assert any("layer" in p.stage for p in seen)


@pytest.fixture
def small_tmpfs(tmp_path):
    mnt = tmp_path / "small"
    mnt.mkdir()
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mnt)], capture_output=True)
    if res.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {res.stderr.decode().strip()}")
    yield mnt
    subprocess.run(["umount", str(mnt)], check=False)


def test_too_small_disk_is_refused_before_writing(synthetic, small_tmpfs):
    with pytest.raises(ConvertError, match="not enough free space"):
        convert(synthetic, small_tmpfs / "x.ferry")
    assert list(small_tmpfs.iterdir()) == []
    res = run_ferry("convert", str(synthetic), str(small_tmpfs / "y.ferry"), check=False)
    assert res.returncode == 1 and "not enough free space" in res.stderr


def test_missing_shard_is_named(synthetic, tmp_path):
    broken = tmp_path / "broken"
    broken.mkdir()
    for f in synthetic.iterdir():
        if not f.name.startswith("model-00002"):
            os.symlink(f, broken / f.name)
    with pytest.raises(SourceError, match="model-00002-of-00003.safetensors"):
        convert(broken, tmp_path / "b.ferry")
    assert not (tmp_path / "b.ferry").exists() and not partial_dir(tmp_path / "b.ferry").exists()


def test_existing_destination_is_refused(synthetic, tmp_path):
    (tmp_path / "taken").mkdir()
    with pytest.raises(ConvertError, match="already exists"):
        convert(synthetic, tmp_path / "taken")


def test_unsupported_architecture_is_named(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["GPTBigCodeForCausalLM"]}))
    with pytest.raises(SourceError, match="GPTBigCodeForCausalLM"):
        convert(tmp_path, tmp_path.parent / "z.ferry")
