"""The compute thread pool (core_c/src/pool.c) alone under ThreadSanitizer:
every item of every job computed exactly once, with the threads spinning,
asleep, and beside busy threads that make it back off (core_c/tests/test_pool.c)."""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests import cbuild
from tests.conftest import REPO

CORE = REPO / "core_c"


def test_pool_under_thread_sanitizer(tmp_path: Path):
    cc = cbuild.host_cc()
    exe = tmp_path / "test_pool"
    cmd = [cc, "-std=c11", "-O1", "-g", "-Wall", "-Wextra", "-Werror", "-pthread", "-fsanitize=thread",
           str(CORE / "src" / "pool.c"), str(CORE / "tests" / "test_pool.c"), "-o", str(exe)]
    built = subprocess.run(cmd, capture_output=True, text=True)
    if built.returncode != 0 and "tsan" in built.stderr.lower():
        pytest.skip(f"this compiler cannot build with ThreadSanitizer: {built.stderr[-300:]}")
    assert built.returncode == 0, built.stderr
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120,
                         env={"TSAN_OPTIONS": "halt_on_error=1"})
    assert run.returncode == 0 and run.stdout.strip().endswith("ok"), run.stdout + run.stderr
