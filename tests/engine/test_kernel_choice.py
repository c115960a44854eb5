"""The kernel set is a per-engine choice (ferry_open_options.kernels): the
scalar reference and the SIMD set agree on the demo model's logits within the
SIMD tolerance, a set this CPU cannot run is refused at open with a message,
FERRY_KERNELS is only the Python layer's default, and two engines with
different sets run side by side in one process."""
from __future__ import annotations

import platform
import threading

import numpy as np
import pytest

from app.engine._ferry_c import ffi, lib
from app.engine.binding import Engine, FerryError
from tests.tiny_models import rel_l2

#: End-to-end agreement of SIMD and scalar logits (relative L2), as for the
#: q3_nl model in tests/kernels/test_q3_engine.py; the per-row bound is in
#: core_c/tests/test_kernels.c.
SIMD_TOLERANCE = 1e-5
TOKENS = [int(t) for t in np.random.default_rng(3).integers(100, 40000, 24)]


def best_simd() -> str:
    name = ffi.string(lib.ferry_kernels_name(lib.ferry_kernels_best())).decode()
    if name == "scalar":
        pytest.skip("this CPU runs no SIMD kernel set")
    return name


def foreign_set() -> str:
    """A set this build cannot run: the other architecture's."""
    return "avx2" if platform.machine().lower() in ("arm64", "aarch64") else "neon"


def logits(engine: Engine) -> np.ndarray:
    return engine.session(64).eval(TOKENS, all_logits=True)


def test_scalar_and_simd_engines_agree(demo_container):
    simd = best_simd()
    with Engine(demo_container, kernels="scalar", threads=2, activations="exact") as ref, \
            Engine(demo_container, kernels=simd, threads=2, activations="exact") as fast:
        assert (ref.info.kernels, fast.info.kernels) == ("scalar", simd)
        err = rel_l2(logits(fast), logits(ref))
    print(f"demo model, {simd} vs scalar kernels: logits rel L2 {err:.2e}")
    assert err < SIMD_TOLERANCE


def test_auto_is_the_best_set(tiny_moe):
    _, container, _ = tiny_moe
    best = ffi.string(lib.ferry_kernels_name(lib.ferry_kernels_best())).decode()
    with Engine(container, kernels="auto") as engine:
        assert engine.info.kernels == best


def test_unsupported_set_is_refused_at_open(tiny_moe):
    _, container, _ = tiny_moe
    other = foreign_set()
    with pytest.raises(FerryError) as exc:
        Engine(container, kernels=other)
    assert exc.value.code == "FERRY_E_UNSUPPORTED"
    assert other in exc.value.message and "scalar" in exc.value.message
    with pytest.raises(FerryError) as exc:
        Engine(container, kernels="sse9")
    assert exc.value.code == "FERRY_E_ARG" and '"sse9"' in exc.value.message


def test_environment_is_the_default_read_at_each_open(tiny_moe, monkeypatch):
    _, container, _ = tiny_moe
    monkeypatch.setenv("FERRY_KERNELS", "scalar")
    with Engine(container) as engine:
        assert engine.info.kernels == "scalar"
    monkeypatch.setenv("FERRY_KERNELS", "auto")
    with Engine(container) as engine:
        assert engine.info.kernels == ffi.string(lib.ferry_kernels_name(lib.ferry_kernels_best())).decode()
    with Engine(container, kernels="scalar") as engine:  # an explicit choice wins
        assert engine.info.kernels == "scalar"
    monkeypatch.setenv("FERRY_KERNELS", foreign_set())
    with pytest.raises(FerryError):
        Engine(container)


def test_two_engines_with_different_sets_side_by_side(demo_container):
    simd = best_simd()
    alone = {}
    for name in ("scalar", simd):
        with Engine(demo_container, kernels=name, threads=1, activations="exact") as engine:
            alone[name] = logits(engine)
    engines = {name: Engine(demo_container, kernels=name, threads=1, activations="exact") for name in ("scalar", simd)}
    together: dict[str, list[np.ndarray]] = {name: [] for name in engines}

    def run(name):
        for _ in range(2):
            together[name].append(logits(engines[name]))

    threads = [threading.Thread(target=run, args=(name,)) for name in engines]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for engine in engines.values():
        engine.close()
    for name in engines:  # each engine kept its own kernels while the other ran
        assert len(together[name]) == 2
        for out in together[name]:
            assert np.array_equal(out, alone[name]), name
    assert not np.array_equal(alone["scalar"], alone[simd])
    assert rel_l2(alone[simd], alone["scalar"]) < SIMD_TOLERANCE
