"""Wizard test fixtures: offscreen Qt, checkpoints to convert (a tiny
DeepSeek-V3 in the release layout, sharded; an 80 MB Qwen3-MoE), a small
tmpfs, and a driver that goes through the pages as a user would."""
from __future__ import annotations

import json
import os

os.environ["QT_QPA_PLATFORM"] = "offscreen"

import subprocess
from pathlib import Path

import pytest

from bench.make_synthetic import make, parse
from tests.ui.conftest import make_window  # noqa: F401  (fixtures)


def tree_bytes(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def reshard(src: Path, out: Path, n: int) -> Path:
    """A single-file checkpoint rewritten as n shards with an index, as the
    Kimi and DeepSeek releases ship (model-0000i-of-0000n.safetensors)."""
    from safetensors.numpy import load_file, save_file

    out.mkdir(parents=True)
    tensors = load_file(str(src / "model.safetensors"))
    names = sorted(tensors)
    weight_map = {}
    for i in range(n):
        part = names[i::n]
        fname = f"model-{i + 1:05d}-of-{n:05d}.safetensors"
        save_file({k: tensors[k] for k in part}, str(out / fname))
        weight_map.update({k: fname for k in part})
    total = sum(t.nbytes for t in tensors.values())
    (out / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}))
    for f in src.iterdir():
        if f.name != "model.safetensors":
            (out / f.name).write_bytes(f.read_bytes())
    return out


@pytest.fixture(scope="session")
def deepseek_ckpt(tmp_path_factory) -> Path:
    """A tiny random DeepSeek-V3 (MLA, 16 routed experts + a shared one, a dense
    first layer) in the release naming, in 3 shards with an index."""
    from tests.kimi.tiny_kimi import build

    root = tmp_path_factory.mktemp("deepseek")
    build("deepseek", root / "single")
    return reshard(root / "single", root / "DeepSeek-V3-tiny", 3)


@pytest.fixture(scope="session")
def synthetic(tmp_path_factory) -> Path:
    """About 80 MB of bf16 Qwen3-MoE checkpoint in 3 shards."""
    out = tmp_path_factory.mktemp("synth_wiz") / "Qwen3-MoE-synthetic"
    return make(parse(["--out", str(out), "--layers", "6", "--experts", "32", "--shards", "3"]))


@pytest.fixture
def small_tmpfs(tmp_path):
    mnt = tmp_path / "small"
    mnt.mkdir()
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mnt)], capture_output=True)
    if res.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {res.stderr.decode().strip()}")
    yield mnt
    subprocess.run(["umount", str(mnt)], check=False)


@pytest.fixture
def wizard(qtbot):
    """wizard() -> a shown ConvertWizard; closed (its jobs stopped) afterwards."""
    from app.ui.wizard import ConvertWizard

    made = []

    def new(**kw):
        w = ConvertWizard(**kw)
        qtbot.addWidget(w)
        w.show()
        made.append(w)
        return w

    yield new
    for w in made:
        w.shutdown()


T = 60000


def to_source(qtbot, wiz, kind: str, path=None) -> None:
    """Welcome -> Source, choose, wait for the check."""
    assert wiz.currentPage() is wiz.welcome_page
    wiz.next()
    assert wiz.currentPage() is wiz.source_page
    wiz.source_page.choose(kind, path)
    page = wiz.source_page
    qtbot.waitUntil(lambda: page.shown is not None and page.shown == page._asked, timeout=T)


def to_memory(qtbot, wiz, kind: str, path, folder: Path) -> None:
    """Through Source and Destination (space checked, disk measured) to Memory."""
    to_source(qtbot, wiz, kind, path)
    qtbot.waitUntil(wiz.source_page.isComplete, timeout=T)
    wiz.next()
    assert wiz.currentPage() is wiz.destination_page
    wiz.destination_page.set_folder(folder)
    qtbot.waitUntil(wiz.destination_page.isComplete, timeout=T)
    wiz.next()
    assert wiz.currentPage() is wiz.memory_page
    assert wiz.memory_page.isComplete()


def convert_to_end(qtbot, wiz) -> Path:
    """Memory -> Convert (waits for it) -> Verify (waits); returns the container."""
    wiz.next()
    qtbot.waitUntil(lambda: wiz.currentPage() is wiz.finish_page, timeout=T)
    qtbot.waitUntil(wiz.finish_page.isComplete, timeout=T)
    return wiz.state.result
