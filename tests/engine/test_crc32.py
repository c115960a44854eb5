"""The C core's CRC-32 (trunk on open, --verify-reads, ferry verify) against
its bytewise definition: the portable slicing-by-8 path natively, and the
ARMv8 CRC-instruction path (Apple Silicon's) under qemu."""
from __future__ import annotations

import subprocess
from pathlib import Path

from tests import cbuild
from tests.conftest import REPO
from tests.kernels.test_kernels_c import aarch64_toolchain

CORE = REPO / "core_c"
SOURCES = [str(CORE / "src" / "common.c"), str(CORE / "tests" / "test_crc32.c")]


def _run(cmd: list[str]) -> None:
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and "crc32 ok" in res.stdout, res.stdout + res.stderr


def test_crc32_native_under_sanitizers(tmp_path: Path, tmp_path_factory):
    exe = cbuild.program(tmp_path_factory, tmp_path / "test_crc32", cbuild.host_cc(), cbuild.SANITIZE, list(map(Path, SOURCES)))
    _run([str(exe)])


def test_crc32_arm_instructions_under_qemu(tmp_path: Path):
    cross, qemu = aarch64_toolchain("native aarch64: the native test already runs this path when the CPU has CRC")
    exe = tmp_path / "test_crc32_arm"
    subprocess.run([cross, "-std=c11", "-O2", "-march=armv8-a+crc", "-static", *SOURCES, "-o", str(exe)],
                   check=True, capture_output=True, text=True)
    _run([qemu, str(exe)])
