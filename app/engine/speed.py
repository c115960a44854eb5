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
    if fmt == "iq4_xs":                   # its f16 d leads each 136-byte block
        w.reshape(-1, 136)[:, 1] &= 0x1F
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


#: The expert cache's hit rate against its size in token working sets
#: (slots / (top_k x MoE layers): 1.0 holds one token's experts of every
#: layer), replayed through the engine's own policy (app.engine.cachesim,
#: "engine", cold, the whole trace) on a real routing trace: OLMoE-1B-7B, 299
#: tokens x 16 layers x top-8 of 64 (/work/shared/data/traces/
#: olmoe-1b-7b_299tok.jsonl; `python bench/cache_policy.py --json`, "curve";
#: tests/engine/test_cache_policy.py replays it again). At 0.94 working sets
#: (what a 64 GB Mac caches of Kimi K3) it gives 45 %; the public streaming
#: engine measures 38 % on K3 itself with its 17.6 GB cache (0.94 working
#: sets): docs/KIMI.md, "Speed model".
HIT_CURVE = ((0.0, 0.0), (0.0625, 0.0), (0.125, 0.051), (0.1875, 0.1), (0.25, 0.148), (0.375, 0.232),
             (0.5, 0.302), (0.625, 0.357), (0.75, 0.401), (0.875, 0.436), (1.0, 0.469), (1.25, 0.522),
             (1.5, 0.564), (1.75, 0.599), (2.0, 0.631), (2.5, 0.688), (3.0, 0.738), (3.5, 0.784), (4.0, 0.826))


def expected_hit_rate(slots: float, top_k: int, moe_layers: int, n_records: int) -> float:
    """The decode's expected expert-cache hit rate with ``slots`` records
    cached of ``n_records`` (top_k per token in each of ``moe_layers``
    layers): HIT_CURVE at slots / (top_k x moe_layers), the reuse of real
    routing from token to token, never below the share cached (hits spread
    uniformly, the floor of any routing); beyond the curve's last point, a
    straight line to 1.0 at every record cached. Assumes the model's routing
    reuses experts from token to token as OLMoE's does."""
    if n_records <= 0 or slots >= n_records:
        return 1.0
    share = max(0.0, slots) / n_records
    ws = top_k * moe_layers
    if ws <= 0:
        return share
    r = max(0.0, slots) / ws
    last_r, last_h = HIT_CURVE[-1]
    if r >= last_r:
        full = n_records / ws
        curve = last_h + (1.0 - last_h) * (r - last_r) / (full - last_r) if full > last_r else 1.0
    else:
        curve = float(np.interp(r, [x for x, _ in HIT_CURVE], [h for _, h in HIT_CURVE]))
    return min(1.0, max(share, curve))


def token_seconds(trunk_bytes: float, expert_bytes: float, read_bytes: float, kernel_bps: float | None,
                  disk_bps: float | None, trunk_kernel_bps: float | None = None,
                  lookahead: bool = False, record_bytes: float = 0, layers: int = 0,
                  busy_disk_bps: float | None = None) -> float | None:
    """Seconds per decoded token of a streamed mixture-of-experts model: THE
    speed model (`ferry get --plan`, the catalogue, `ferry check`'s choices
    through app.get.plan.estimate; checked against the engine on K3's real
    expert shape by bench/stream.py --true-shape, docs/KIMI.md "Speed model").

    ``trunk_bytes`` go through the kernels with the disk idle (the router of
    a layer must run before its misses are known); the layers'
    ``expert_bytes`` go through the kernels while their ``read_bytes`` (the
    misses) come from the disk, each record computed as it arrives, so the
    larger of the two counts: trunk / kernel + max(experts / kernel, read /
    disk). ``disk_bps``: the disk's direct-read bandwidth at the engine's
    record size, pieces and reader count, and at the size of the requests
    its reads make (on a virtio disk the buffers' physical contiguity sets
    it: bench/stream.py record_slots); ``busy_disk_bps``: the same while
    the kernels run on every core (default: the same figure; on a machine
    with few cores the readers wait for a core to issue each next read, and
    at one or two readers the disk then gives far less): reads that overlap
    the experts' compute go at that rate, the rest at ``disk_bps``. With
    ``record_bytes`` and ``layers`` (the MoE layers a token visits) each
    layer is a pipeline of whole records: its cached experts are computed
    while the first miss is read, each miss is computed once it has landed,
    so a layer takes the larger of max(hits' compute, one record's read) +
    the misses' compute and the misses' read + the last record's compute
    (the fill and drain the aggregate form leaves out). ``lookahead``: every
    miss read while the layers before it compute (a perfect prediction):
    max(trunk + experts, read), the bound of that lever. ``kernel_bps``:
    weight bytes per second of the experts' kernels (``trunk_kernel_bps``
    the trunk's, default the same). None when a rate that is needed is
    unknown."""
    trunk_kernel_bps = trunk_kernel_bps or kernel_bps
    if (trunk_bytes and not trunk_kernel_bps) or (expert_bytes and not kernel_bps) or (read_bytes and not disk_bps):
        return None
    busy = min(busy_disk_bps or disk_bps or 0.0, disk_bps or 0.0)

    def read_time(nbytes: float, overlapped_s: float) -> float:
        """Reading ``nbytes`` beside ``overlapped_s`` of compute: at the busy rate while it lasts."""
        if not nbytes:
            return 0.0
        during = min(nbytes, busy * overlapped_s)
        return during / busy + (nbytes - during) / disk_bps

    trunk = trunk_bytes / trunk_kernel_bps if trunk_bytes else 0.0
    experts = expert_bytes / kernel_bps if expert_bytes else 0.0
    if lookahead:
        return max(trunk + experts, read_time(read_bytes, trunk + experts))
    if not (record_bytes and layers and read_bytes):
        return trunk + max(experts, read_time(read_bytes, experts))
    c_rec, d_rec = record_bytes / kernel_bps, record_bytes / disk_bps
    missed = min(read_bytes, expert_bytes)   # (reads beyond the experts computed: wrong guesses, not computed)
    hits = (expert_bytes - missed) / kernel_bps / layers
    misses = missed / kernel_bps / layers
    reads = read_time(read_bytes / layers, hits + misses)
    return trunk + layers * max(max(hits, d_rec) + misses, reads + c_rec)
