"""The 8-bit-activation kernels' test program (core_c/tests/test_kernels_q8.c):
every SIMD set bit-identical to the scalar reference, batch invariance, the
error bound against the exact f32 product; natively, under the sanitizers,
and for NEON under qemu-aarch64, both without and with the dot-product
extension (SDOT, as on Apple Silicon)."""
from __future__ import annotations

import platform
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.kernels.test_kernels_c import CORE, FLAGS, SOURCES, aarch64_toolchain, run_program

Q8_SOURCES = [*SOURCES, *(CORE / "src" / f for f in ("kernels_q8.c", "kernels_q8_avx2.c", "kernels_q8_neon.c",
                                                                   "kernels_q8_avx512.c"))]
PROGRAM = CORE / "tests" / "test_kernels_q8.c"


def build(cc: str, exe: Path, *extra: str) -> None:
    subprocess.run([cc, *FLAGS, *extra, *map(str, Q8_SOURCES), str(PROGRAM), "-o", str(exe), "-lm"],
                   check=True, capture_output=True, text=True)


def test_native_q8_kernels_bit_identical(tmp_path: Path):
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    build(cc, tmp_path / "t")
    out = run_program([str(tmp_path / "t")])
    machine = platform.machine().lower()
    if machine in ("x86_64", "amd64"):
        from app.engine._ferry_c import lib
        if lib.ferry_kernels_available(lib.FERRY_KERNELS_AVX2):
            assert "testing avx2 q8 against scalar" in out
    if machine in ("arm64", "aarch64"):
        assert "testing neon q8 against scalar" in out


@pytest.mark.slow
def test_q8_kernels_under_sanitizers(tmp_path: Path):
    cc = shutil.which("gcc") or shutil.which("clang") or shutil.which("cc")
    build(cc, tmp_path / "t", "-O1", "-g", "-fsanitize=address,undefined", "-fno-sanitize-recover=all")
    run_program([str(tmp_path / "t")])


@pytest.mark.slow
@pytest.mark.parametrize("march", ["armv8-a", "armv8.2-a+dotprod"])
def test_neon_q8_kernels_under_qemu(tmp_path: Path, march: str):
    cross, qemu = aarch64_toolchain("native aarch64: the native test already runs the NEON q8 kernels")
    build(cross, tmp_path / "t", "-static", f"-march={march}")
    out = run_program([qemu, str(tmp_path / "t")])
    assert "testing neon q8 against scalar" in out
