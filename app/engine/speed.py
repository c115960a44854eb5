"""How fast this machine's matrix kernels go through weights of a format:
one short measurement (a few tenths of a second) of the C core's
matrix-vector product, the operation each generated token is made of, on a
matrix far larger than the caches, split over the cores as the engine does,
in the arithmetic the engine runs by default (8-bit activations with integer
products for the formats that have them, app.activations)."""
from __future__ import annotations

import functools
import os
import threading
import time

import numpy as np

from app.activations import is_exact

COLS = 4096
MATRIX_BYTES = 96 << 20     # far beyond the last-level cache, like weights streamed per token


def run_threads(fn, n: int) -> float:
    """Seconds for ``fn(i)`` run on ``n`` threads at once (i = 0..n-1), start to last join."""
    ts = [threading.Thread(target=fn, args=(i,)) for i in range(n)]
    t0 = time.perf_counter()
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return time.perf_counter() - t0


@functools.lru_cache(maxsize=None)
def kernel_bytes_per_s(fmt: str, threads: int | None = None, activations: str | None = None) -> float | None:
    """Weight bytes per second of one decode step in ``fmt`` with these
    ``activations`` (None: the default) (None when the format has no kernel
    or the core is not built). Measured once per process and format: every
    plan and recommendation of a process then sees the same figure."""
    try:
        from app.engine.binding import ffi, lib   # the compiled core only through its binding
    except ImportError:
        return None
    code = lib.ferry_format_code(fmt.encode())
    if code < 0:
        return None
    row = lib.ferry_format_row_bytes(code, COLS)
    if row <= 0:
        return None
    threads = max(1, threads or os.cpu_count() or 1)
    rows = max(threads * 8, MATRIX_BYTES // row // 8 * 8)
    per = rows // threads
    rng = np.random.default_rng(0)
    w = rng.integers(0, 256, size=rows * row, dtype=np.uint8)
    if fmt in ("q8_0", "q4_0", "q4_1"):   # sane f16 scales: no inf/nan slowing anything
        w.reshape(-1, 2)[:, 1] &= 0x1F
    x = rng.standard_normal(COLS).astype(np.float32)
    y = np.zeros((threads, per), dtype=np.float32)
    impl = lib.ferry_kernels_best()
    matmul = lib.ferry_kernel_matmul
    if not is_exact(activations) and lib.ferry_q8_activations_supported(code):
        matmul = lib.ferry_kernel_matmul_q8   # the integer products the default runs, on the set "auto" takes
        if impl == lib.FERRY_KERNELS_AVX2 and lib.ferry_q8_kernels_available(lib.FERRY_KERNELS_AVX512VNNI):
            impl = lib.FERRY_KERNELS_AVX512VNNI

    def work(i: int) -> None:
        matmul(impl, code, ffi.from_buffer(w[i * per * row:(i + 1) * per * row]), per, COLS,
                                ffi.from_buffer("float[]", x), 1, ffi.from_buffer("float[]", y[i]))

    run_threads(work, threads)   # warm up
    best = min(run_threads(work, threads) for _ in range(3))
    return per * threads * row / best


def token_seconds(trunk_bytes: float, expert_bytes: float, read_bytes: float, kernel_bps: float | None,
                  disk_bps: float | None, trunk_kernel_bps: float | None = None,
                  lookahead: bool = False) -> float | None:
    """Seconds per decoded token of a streamed mixture-of-experts model: THE
    speed model (`ferry get --plan`, the catalogue, `ferry check`'s choices
    through app.get.plan.estimate; checked against the engine on K3's real
    expert shape by bench/stream.py --true-shape, docs/KIMI.md "Speed model").

    ``trunk_bytes`` go through the kernels with the disk idle (the router of
    a layer must run before its misses are known); the layers'
    ``expert_bytes`` go through the kernels while their ``read_bytes`` (the
    misses) come from the disk, each record computed as it arrives, so the
    larger of the two counts: trunk / kernel + max(experts / kernel, read /
    disk). ``lookahead``: every miss read while the layers before it compute
    (a perfect prediction): max(trunk + experts, read), the bound of that
    lever. ``kernel_bps``: weight bytes per second of the experts' kernels
    (``trunk_kernel_bps`` the trunk's, default the same); ``disk_bps``: the
    disk's direct-read bandwidth at the engine's record size and reader
    count. None when a rate that is needed is unknown."""
    trunk_kernel_bps = trunk_kernel_bps or kernel_bps
    if (trunk_bytes and not trunk_kernel_bps) or (expert_bytes and not kernel_bps) or (read_bytes and not disk_bps):
        return None
    trunk = trunk_bytes / trunk_kernel_bps if trunk_bytes else 0.0
    experts = expert_bytes / kernel_bps if expert_bytes else 0.0
    read = read_bytes / disk_bps if read_bytes else 0.0
    return max(trunk + experts, read) if lookahead else trunk + max(experts, read)
