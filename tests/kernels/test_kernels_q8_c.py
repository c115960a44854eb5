"""The 8-bit-activation kernels' test program (core_c/tests/test_kernels_q8.c):
every SIMD set (AVX2, AVX-512 VNNI where the CPU has it, NEON) bit-identical
to the scalar reference, batch invariance, the
error bound against the exact f32 product; natively, under the sanitizers,
and for NEON under qemu-aarch64, both without and with the dot-product
extension (SDOT, as on Apple Silicon)."""
from __future__ import annotations

import platform
from pathlib import Path

import pytest

from tests import cbuild
from tests.kernels.test_kernels_c import CORE, FLAGS, SOURCES, aarch64_toolchain, run_program

Q8_SOURCES = [*SOURCES, *(CORE / "src" / f for f in ("kernels_q8.c", "kernels_q8_avx2.c", "kernels_q8_neon.c",
                                                                   "kernels_q8_avx512.c", "kernels_q8_iq4xs.c"))]
PROGRAM = CORE / "tests" / "test_kernels_q8.c"


def build(tmp_path_factory, cc: str, exe: Path, flags: list[str], link: tuple[str, ...] = ()) -> None:
    cbuild.program(tmp_path_factory, exe, cc, flags, [*Q8_SOURCES, PROGRAM], link=link)


@pytest.fixture(scope="module")
def native_output(tmp_path_factory) -> str:
    """The test program built for this machine and run (it fails on any mismatch)."""
    exe = tmp_path_factory.mktemp("q8") / "t"
    build(tmp_path_factory, cbuild.host_cc(), exe, FLAGS)
    return run_program([str(exe)])


def test_native_q8_kernels_bit_identical(native_output: str):
    out = native_output
    machine = platform.machine().lower()
    if machine in ("x86_64", "amd64"):
        from app.engine._ferry_c import lib
        if lib.ferry_kernels_available(lib.FERRY_KERNELS_AVX2):
            assert "testing avx2 q8 against scalar" in out
    if machine in ("arm64", "aarch64"):
        assert "testing neon q8 against scalar" in out


def test_avx512vnni_q8_set_bit_identical(native_output: str):
    """The AVX-512 VNNI q8 set (kernels_q8_avx512.c) ran against the scalar reference in the program above."""
    from app.engine._ferry_c import lib
    if not lib.ferry_q8_kernels_available(lib.FERRY_KERNELS_AVX512VNNI):
        assert "testing avx512vnni" not in native_output
        pytest.skip("this CPU (or its OS) has no AVX-512 F/BW/VL/VNNI: the avx512vnni q8 set cannot run here")
    assert "testing avx512vnni q8 against scalar" in native_output


@pytest.mark.slow
def test_q8_kernels_under_sanitizers(tmp_path: Path, tmp_path_factory):
    build(tmp_path_factory, cbuild.host_cc(), tmp_path / "t", cbuild.SANITIZE)
    run_program([str(tmp_path / "t")])


@pytest.mark.slow
@pytest.mark.parametrize("march", ["armv8-a", "armv8.2-a+dotprod"])
def test_neon_q8_kernels_under_qemu(tmp_path: Path, tmp_path_factory, march: str):
    cross, qemu = aarch64_toolchain("native aarch64: the native test already runs the NEON q8 kernels")
    build(tmp_path_factory, cross, tmp_path / "t", [*FLAGS, f"-march={march}"], link=("-static",))
    out = run_program([qemu, str(tmp_path / "t")])
    assert "testing neon q8 against scalar" in out
