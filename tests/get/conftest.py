"""A hub on loopback (tests/get/hub_server.py) with tiny checkpoints in the
real release layouts, and the environment pointed at it."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.get.hub_server import Hub


@pytest.fixture(scope="session")
def repos(tmp_path_factory) -> dict[str, Path]:
    """name -> folder: a sharded tiny Llama, a tiny K3 (three shards, index, tiktoken), a tiny GGUF."""
    from tests.get.tiny_gguf import write_tiny_gguf
    from tests.kimi import tiny_k3
    from tests.tiny_models import build

    root = tmp_path_factory.mktemp("hub")
    out = {"llama": root / "tiny-llama", "k3": root / "Kimi-K3-tiny", "gguf": root / "tiny-gguf"}
    build("llama", out["llama"], shard_size="60KB")
    tiny_k3.build(out["k3"])
    out["gguf"].mkdir()
    write_tiny_gguf(out["gguf"] / "tiny-Q8_0.gguf", "Q8_0")
    write_tiny_gguf(out["gguf"] / "tiny-F32.gguf", "F32")
    (out["gguf"] / "README.md").write_text("tiny")
    return out


@pytest.fixture
def hub(repos, monkeypatch, tmp_path, memory_keyring):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))        # no user token, no user cache
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    monkeypatch.setenv("FERRY_NO_DIRECT_IO", "1")
    with Hub() as h:
        monkeypatch.setenv("HF_ENDPOINT", h.url)
        h.add("meta/tiny-llama", repos["llama"])
        h.add("moonshotai/Kimi-K3-tiny", repos["k3"])
        h.add("someone/tiny-gguf", repos["gguf"])
        yield h


def tree_bytes(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def local_convert(folder: Path, where: Path, name: str, **kw) -> Path:
    """The same files converted from disk, in a folder of the same name (the manifest names it)."""
    from app.convert.convert import convert

    src = where / name
    if folder.is_dir():
        shutil.copytree(folder, src)
    else:
        src.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(folder, src)
    return convert(src, where / f"{Path(name).stem}.ferry", **kw)
