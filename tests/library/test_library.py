"""The model library (app/library.py): listing converted models with size,
RAM floor and last use; rename; remove; and what `ferry run NAME` says for a
source file, a mistyped name or an empty library."""
from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from app import paths
from app.convert.convert import convert
from app.library import Library, LibraryError, ago, folder_size
from tests.conftest import REPO
from tests.tiny_models import build


@pytest.fixture(scope="module")
def tiny_container(tmp_path_factory):
    root = tmp_path_factory.mktemp("lib")
    build("llama", root / "ckpt", seed=5)
    return root / "ckpt", convert(root / "ckpt", root / "tiny.ferry")


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("FERRY_HOME", str(tmp_path / "home"))
    paths.models_dir().mkdir(parents=True)
    return tmp_path / "home"


def _install(container, name: str):
    dest = paths.models_dir() / name
    shutil.copytree(container, dest)
    return dest


def test_lists_every_converted_model_with_size_floor_and_last_use(home, tiny_container, tmp_path):
    _, c = tiny_container
    a = _install(c, "alpha.ferry")
    b = _install(c, "Bravo")
    (paths.models_dir() / "not-a-model").mkdir()
    extra = tmp_path / "elsewhere"
    shutil.copytree(c, extra / "charlie")
    lib = Library([str(extra)])
    names = [e.name for e in lib.entries()]
    assert names == ["alpha", "Bravo", "charlie"]
    e = lib.entries()[0]
    assert e.size == folder_size(a) > 0 and e.ram_floor and e.ram_floor > 0 and e.last_used is None
    lib.mark_used(b, when=1000.0)
    lib.mark_used(a, when=2000.0)
    assert [e.name for e in Library([str(extra)]).entries()] == ["alpha", "Bravo", "charlie"]
    lib.mark_used(b, when=3000.0)
    top = Library([str(extra)]).entries()[0]
    assert top.name == "Bravo" and top.last_used == 3000.0
    # it names the user's models: 0600, as docs/SECURITY.md promises (issue 34)
    assert lib.state_file.stat().st_mode & 0o777 == 0o600
    assert lib.state_file.parent.stat().st_mode & 0o777 == 0o700


def test_rename_and_remove(home, tiny_container):
    _, c = tiny_container
    a = _install(c, "alpha.ferry")
    _install(c, "bravo")
    lib = Library()
    lib.mark_used(a, when=50.0)
    entry = lib.find("alpha")
    with pytest.raises(LibraryError, match="already exists"):
        lib.rename(entry, "bravo")
    for bad in ("", "a/b", "..", "x:y"):
        with pytest.raises(LibraryError):
            lib.rename(entry, bad)
    renamed = lib.rename(entry, "My model")
    assert renamed.path.name == "My model" and not a.exists()
    assert lib.find("my model").last_used == 50.0     # last use follows the rename
    size = renamed.size
    freed = lib.remove(lib.find("My model"))
    assert freed == size and not renamed.path.exists()
    assert [e.name for e in lib.entries()] == ["bravo"]
    with pytest.raises(LibraryError):
        lib.remove(renamed)          # already gone: nothing else is touched


def test_resolve_says_what_to_do(home, tiny_container, tmp_path):
    ckpt, c = tiny_container
    _install(c, "smollm2-135m-instruct.ferry")
    lib = Library()
    assert lib.resolve(str(c)) == c
    assert lib.resolve("smollm2-135m-instruct").name == "smollm2-135m-instruct.ferry"   # by name
    gguf = tmp_path / "x.gguf"
    gguf.write_bytes(b"GGUF")
    with pytest.raises(LibraryError) as err:
        lib.resolve(str(gguf))
    msg = str(err.value)
    assert "ferry convert" in msg and str(gguf) in msg and "not a converted model" in msg
    with pytest.raises(LibraryError, match="ferry convert"):
        lib.resolve(str(ckpt))        # a checkpoint folder
    with pytest.raises(LibraryError, match="Did you mean: smollm2-135m-instruct"):
        lib.resolve("smollm2-135m-instrcut")
    with pytest.raises(LibraryError, match="Converted models: smollm2"):
        lib.resolve("qwen")
    with pytest.raises(LibraryError, match="no manifest.json"):
        lib.resolve(str(tmp_path))


def test_cli_run_on_a_gguf_offers_the_convert_command(home, tmp_path):
    gguf = tmp_path / "x.gguf"
    gguf.write_bytes(b"GGUF")
    env = {"FERRY_HOME": str(home), "PATH": "/usr/bin:/bin"}
    res = subprocess.run([sys.executable, "-m", "app.cli", "run", str(gguf), "hello"], capture_output=True,
                         text=True, cwd=REPO, env=env, timeout=120)
    assert res.returncode == 1
    assert "ferry convert" in res.stderr and "Not a directory" not in res.stderr and "Traceback" not in res.stderr
    res = subprocess.run([sys.executable, "-m", "app.cli", "run", "nosuchmodel", "hello"], capture_output=True,
                         text=True, cwd=REPO, env=env, timeout=120)
    assert res.returncode == 1 and "no converted model named 'nosuchmodel'" in res.stderr


def test_ago():
    assert ago(None) == "never"
    assert ago(1000.0, now=1030.0) == "just now"
    assert ago(1000.0, now=1000.0 + 300) == "5 min ago"
    assert ago(1000.0, now=1000.0 + 86400 * 2) == "2 days ago"
