"""The kernel test program (core_c/tests/test_kernels.c): every SIMD kernel
against the scalar reference, natively and, for NEON, built with Debian's
aarch64 cross compiler and run under qemu-aarch64."""
from __future__ import annotations

import platform
import shutil
import subprocess
from pathlib import Path

import pytest

from tests import cbuild
from tests.conftest import REPO

CORE = REPO / "core_c"
SOURCES = [CORE / "src" / f for f in ("formats.c", "kernels.c", "kernels_avx2.c", "kernels_neon.c", "kernels_q2vq.c", "quant3.c",
                                              "quant_blocks.c", "quant2.c", "kernels_iq4xs.c", "quant_iq4xs.c")]
FLAGS = ["-std=c11", "-O2", "-Wall", "-Wextra", "-Werror", "-ffp-contract=off", "-I", str(CORE / "include")]
#: The aarch64 builds name the base architecture (the cross compiler's default), as the q8 program's do.
NEON_FLAGS = [*FLAGS, "-march=armv8-a"]


def run_program(cmd: list[str]) -> str:
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]
    last = res.stdout.strip().splitlines()[-1]
    assert last.endswith(" 0 failed") and int(last.split()[0]) > 1000, last
    return res.stdout


def test_native_kernels_match_scalar(tmp_path: Path, tmp_path_factory):
    exe = cbuild.program(tmp_path_factory, tmp_path / "test_kernels", cbuild.host_cc(), FLAGS,
                         [*SOURCES, CORE / "tests" / "test_kernels.c"])
    out = run_program([str(exe)])
    machine = platform.machine().lower()
    if machine in ("x86_64", "amd64"):
        from app.engine._ferry_c import lib
        if lib.ferry_kernels_available(lib.FERRY_KERNELS_AVX2):
            assert "testing avx2 against scalar" in out
    if machine in ("arm64", "aarch64"):
        assert "testing neon against scalar" in out


@pytest.mark.slow
def test_native_kernels_under_sanitizers(tmp_path: Path, tmp_path_factory):
    exe = cbuild.program(tmp_path_factory, tmp_path / "test_kernels_asan", cbuild.host_cc(), cbuild.SANITIZE,
                         [*SOURCES, CORE / "tests" / "test_kernels.c"])
    run_program([str(exe)])


def aarch64_toolchain(native_note: str) -> tuple[str, str]:
    """(cross compiler, qemu) for running aarch64 test programs here; skips
    natively on aarch64 (``native_note`` says what covers it) or without them."""
    if platform.machine().lower() in ("arm64", "aarch64"):
        pytest.skip(native_note)
    cross = shutil.which("aarch64-linux-gnu-gcc")
    qemu = shutil.which("qemu-aarch64-static") or shutil.which("qemu-aarch64")
    if cross is None or qemu is None:
        pytest.skip("needs Debian's aarch64 cross compiler and qemu user mode: "
                    "apt-get install gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user-static")
    return cross, qemu


@pytest.mark.slow
def test_neon_kernels_under_qemu(tmp_path: Path, tmp_path_factory):
    cross, qemu = aarch64_toolchain("native aarch64: the native test already runs the NEON kernels")
    exe = cbuild.program(tmp_path_factory, tmp_path / "test_kernels_aarch64", cross, NEON_FLAGS,
                         [*SOURCES, CORE / "tests" / "test_kernels.c"], link=("-static",))
    out = run_program([qemu, str(exe)])
    assert "testing neon against scalar" in out
