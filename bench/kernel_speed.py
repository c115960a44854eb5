"""Matrix-vector and small-batch kernel speed against memory bandwidth.

    python bench/kernel_speed.py [--mb 96] [--batch 1 8 32] [--threads 1 2] [--impl scalar avx2] [--int8-experiment] --json
    python bench/kernel_speed.py --baseline <commit> [--formats q4_k q8_0] [--batch 1 4 64] [--rounds 3] [--q8 --cols 2048] --json

Measures, in one run: single-core and all-core memory read bandwidth
(ferry_memory_read over a 256 MB buffer per thread, far larger than the L3, as
1, 2, 4 and 8 interleaved sequential streams; before and after the kernels,
summarised per thread count as the single-stream and the best figure), then for every
kernel implementation, format, batch size n and thread count, weight bytes
consumed per second and GFLOP/s (2 * rows * cols * n / time) of
ferry_kernel_matmul on a [rows, 3584] matrix of random blocks. Decode (n = 1)
runs on `--mb` MB of weights (out of cache, like streaming experts); batches
run on a matrix of mb/8 MB. Threads split the rows (the C call releases the GIL).
"q3_nl_target" holds issue 6's target: one core's n = 1 q3_nl weight GB/s
against half of one core's single-stream and best read. --int8-experiment adds
bench/q3_int8.c's figures (an int8-activation q3_nl kernel that is not product
code: speed against the f32 AVX2 kernel in the same process, and accuracy;
and ns per 8 of FMA, vpermps, vpsrld, vpshufb alone and mixed).

--baseline <commit> compares kernels old against new instead: the kernel
sources of <commit> and of the working tree are each built (cc -O3, the core's
flags) into a shared library in a temporary folder, and every (format, n,
threads) runs on both in interleaved rounds (old, new, old, new, ...; the best
time of each), reporting weight GB/s and GFLOP/s of both and new/old, by the
wall clock and by each thread's CPU time (the slowest thread's; on a shared
machine the CPU time shows the kernel's own speed when other processes take
turns on the cores, the wall clock what a user would see). With --q8 the same compares the
8-bit-activation products (ferry_kernel_matmul_q8, including quantizing x;
the q8 set the default takes: AVX-512 VNNI where it runs, else AVX2's), and
reports whether old and new gave the same bits; --cols sets the matrix's
columns (prompt-shaped: --batch 32, a prompt chunk's tokens, and --cols 2048
or 8192, a 1B model's widths).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app.convert import quant  # noqa: E402
from app.engine._ferry_c import ffi, lib  # noqa: E402
from app.engine.binding import FORMATS as CORE_FORMATS  # noqa: E402
from app.engine.speed import run_threads  # noqa: E402

#: Every format of the core's table (app.engine.binding.FORMATS).
FORMATS = list(CORE_FORMATS)
COLS = 3584
#: Byte offsets of each block's f16 scale fields, set to sane scales (no inf/nan slowing anything).
SCALE_OFFSETS = {"q8_0": [0], "q4_0": [0], "q4_1": [0, 2], "q4_k": [0, 2], "q5_k": [0, 2], "q6_k": [208]}


def random_matrix(fmt: str, rows: int, rng, cols: int = COLS) -> np.ndarray:
    elems, nbytes = CORE_FORMATS[fmt].block_elems, CORE_FORMATS[fmt].block_bytes
    scales = SCALE_OFFSETS.get(fmt, [])
    nb = rows * cols // elems
    if fmt in ("f32", "f16", "bf16"):
        w = (rng.standard_normal(rows * cols) * 0.05).astype(np.float32)
        return {"f32": w.view(np.uint8), "f16": quant.f32_to_f16_bits(w).view(np.uint8),
                "bf16": quant.f32_to_bf16_bits(w).view(np.uint8)}[fmt]
    b = rng.integers(0, 256, size=(nb, nbytes), dtype=np.uint8)
    for off in scales:
        b[:, off:off + 2] = quant.f32_to_f16_bits(rng.uniform(0.001, 0.01, (nb, 1)).astype(np.float32)).view(np.uint8)
    if fmt == "q3_nl":
        b[:, 96] = rng.integers(120, 140, nb)
    return b.reshape(-1)




STREAMS = (1, 2, 4, 8)


def bandwidth(threads: int, mb: int, streams: int) -> float:
    """GB/s that `threads` threads read together, each its own `mb` MB buffer (far beyond the L3) as `streams`
    interleaved sequential streams (hardware-prefetch friendly); the best of 3 rounds of 4 passes."""
    bufs = [np.ones(mb * 2**20 // 8, dtype=np.uint64) for _ in range(threads)]
    reps = 4
    for b in bufs:
        lib.ferry_memory_read(ffi.from_buffer(b), b.nbytes, 1, streams)
    best = 0.0
    for _ in range(3):
        dt = run_threads(lambda i: lib.ferry_memory_read(ffi.from_buffer(bufs[i]), bufs[i].nbytes, reps, streams), threads)
        best = max(best, threads * reps * bufs[0].nbytes / dt / 1e9)
    return best


def memory_read(threads: list[int], out: dict, when: str) -> None:
    """Every (threads, streams) read figure into out["memory_read_gb_s"] (keys "T threads, S stream(s) each"
    plus `when`)."""
    for t in threads:
        for st in STREAMS:
            out["memory_read_gb_s"][f"{t} threads, {st} stream(s) each{when}"] = round(bandwidth(t, 256, st), 2)


def memory_summary(out: dict, threads: list[int]) -> dict:
    """Per thread count, over both brackets of the run: the single-stream read and the best read (any stream
    count), the figure a kernel is held against."""
    res = {}
    for t in threads:
        figs = {k: v for k, v in out["memory_read_gb_s"].items() if k.startswith(f"{t} threads, ")}
        one = max(v for k, v in figs.items() if ", 1 stream(s)" in k)
        best_key = max(figs, key=figs.get)
        res[f"{t} threads"] = {"single_stream_gb_s": one, "best_gb_s": figs[best_key], "best_is": best_key}
    return res


def target(out: dict) -> list[dict]:
    """Issue 6's target for every 1-thread n = 1 q3_nl result: weight bytes per second against half of one
    core's single-stream and best memory read."""
    mem = out["memory_summary"].get("1 threads")
    if not mem:
        return []
    res = []
    for r in out["kernels"]:
        if r["format"] == "q3_nl" and r["n"] == 1 and r["threads"] == 1:
            res.append({"impl": r["impl"], "weight_gb_s": r["weight_gb_s"],
                        "vs_half_single_stream": round(r["weight_gb_s"] / (mem["single_stream_gb_s"] / 2), 3),
                        "vs_half_best": round(r["weight_gb_s"] / (mem["best_gb_s"] / 2), 3),
                        "met_vs_best": r["weight_gb_s"] >= mem["best_gb_s"] / 2})
    return res


def bench_kernel(impl: int, fmt: str, n: int, threads: int, mb: float, rng, cache) -> dict:
    code = lib.ferry_format_code(fmt.encode())
    row_bytes = lib.ferry_format_row_bytes(code, COLS)
    rows = max(threads * 8, int(mb * 2**20 // row_bytes) // 8 * 8)
    key = (fmt, rows)
    if key not in cache:
        cache.clear()
        cache[key] = random_matrix(fmt, rows, rng)
    w = cache[key]
    x = (rng.standard_normal((n, COLS))).astype(np.float32)
    y = np.zeros((threads, n, rows // threads), dtype=np.float32)
    per = rows // threads

    def work(i: int) -> None:
        lib.ferry_kernel_matmul(impl, code, ffi.from_buffer(w[i * per * row_bytes:(i + 1) * per * row_bytes]), per,
                                COLS, ffi.from_buffer("float[]", x), n, ffi.from_buffer("float[]", y[i]))

    run_threads(work, threads)  # warm up
    dt = run_threads(work, threads)
    reps = max(1, min(20, int(0.4 / max(dt, 1e-6))))
    best = dt
    for _ in range(reps):
        best = min(best, run_threads(work, threads))
    wbytes = per * threads * row_bytes
    return {"impl": ffi.string(lib.ferry_kernels_name(impl)).decode(), "format": fmt, "n": n, "threads": threads,
            "rows": per * threads, "cols": COLS, "weight_mb": round(wbytes / 2**20, 1),
            "weight_gb_s": round(wbytes / best / 1e9, 2),
            "gflop_s": round(2 * per * threads * COLS * n / best / 1e9, 2),
            "bits_per_weight": round(8 * row_bytes / COLS, 4)}


KERNEL_FILES = ("include/ferry_kernels.h", "src/formats.h", "src/formats.c", "src/kernels.h", "src/kernels.c",
                "src/kernels_avx2.c", "src/kernels_avx2_util.h", "src/kernels_neon.c", "src/kernels_q2vq.c", "src/quant3.c", "src/quant_blocks.c",
                "src/common.h", "src/kernels_iq4xs.c", "src/kernels_iq4xs.h")
#: With --q8: the 8-bit-activation kernels as well (ferry_kernel_matmul_q8).
Q8_FILES = ("include/ferry.h", "src/kernels_q8.h", "src/kernels_q8.c", "src/kernels_q8_avx2.c", "src/kernels_q8_avx512.c",
            "src/kernels_q8_neon.c", "src/kernels_q8_neon_util.h", "src/kernels_q8_iq4xs.c")


def build_kernels(rev: str | None, folder: Path, q8: bool = False):
    """ferry_kernel_matmul (and with q8 ferry_kernel_matmul_q8) of revision `rev` (None: the working tree),
    built alone into a shared library."""
    import ctypes
    root = Path(__file__).resolve().parents[1]
    (folder / "include").mkdir(parents=True, exist_ok=True)
    (folder / "src").mkdir(exist_ok=True)
    srcs = []
    for f in KERNEL_FILES + (Q8_FILES if q8 else ()):
        if rev is None:
            if not (root / "core_c" / f).exists():
                continue
            text = (root / "core_c" / f).read_text()
        else:
            r = subprocess.run(["git", "-C", str(root), "show", f"{rev}:core_c/{f}"], capture_output=True, text=True)
            if r.returncode != 0:
                continue
            text = r.stdout
        (folder / f).write_text(text)
        if f.endswith(".c"):
            srcs.append(str(folder / f))
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang") or "cc"
    so = folder / "kernels.so"
    subprocess.run([cc, "-std=c11", "-O3", "-pthread", "-ffp-contract=off", "-shared", "-fPIC", "-I",
                    str(folder / "include"), *srcs, "-o", str(so), "-lm"], check=True, capture_output=True, text=True)
    lib_ = ctypes.CDLL(str(so))
    vp, ci = ctypes.c_void_p, ctypes.c_int
    lib_.ferry_kernel_matmul.argtypes = [ci, ci, vp, ci, ci, vp, ci, vp]
    lib_.ferry_kernel_matmul.restype = ci
    if q8:
        lib_.ferry_kernel_matmul_q8.argtypes = [ci, ci, vp, ci, ci, vp, ci, vp]
        lib_.ferry_kernel_matmul_q8.restype = ci
    return lib_


def compare(a, rng) -> list[dict]:
    """Old (a.baseline) against new (the working tree) kernels, interleaved rounds, best time of each."""
    res = []
    impl = lib.FERRY_KERNELS_AVX2 if lib.ferry_kernels_available(lib.FERRY_KERNELS_AVX2) else lib.ferry_kernels_best()
    if a.q8:  # the q8 set the engine's default takes (q8_speed.q8_auto: AVX-512 VNNI where it runs)
        impl = next((i for i in range(8) if ffi.string(lib.ferry_q8_kernels_name(i)) == b"avx512vnni"
                     and lib.ferry_q8_kernels_available(i)), impl)
    cols = a.cols
    with tempfile.TemporaryDirectory() as tmp:
        libs = {"old": build_kernels(a.baseline, Path(tmp) / "old", a.q8),
                "new": build_kernels(None, Path(tmp) / "new", a.q8)}
        for fmt in a.formats:
            code = lib.ferry_format_code(fmt.encode())
            row_bytes = lib.ferry_format_row_bytes(code, cols)
            for n in a.batch:
                mb = a.mb if n == 1 else a.mb / 8
                rows_all = int(mb * 2**20 // row_bytes) // 16 * 16
                w = random_matrix(fmt, rows_all, rng, cols)
                x = rng.standard_normal((n, cols)).astype(np.float32)
                for t in a.threads:
                    per = rows_all // t
                    y = np.zeros((t, n, per), dtype=np.float32)
                    outs = {}
                    cpu = [0.0] * t

                    def work(i: int, L=None) -> None:
                        c0 = time.thread_time()
                        fn = L.ferry_kernel_matmul_q8 if a.q8 else L.ferry_kernel_matmul
                        fn(impl, code, w[i * per * row_bytes:].ctypes.data, per, cols, x.ctypes.data, n,
                           y[i].ctypes.data)
                        cpu[i] = time.thread_time() - c0
                    best = {"old": float("inf"), "new": float("inf")}
                    best_cpu = dict(best)
                    for k in best:
                        run_threads(lambda i, L=libs[k]: work(i, L), t)  # warm up
                        outs[k] = y.copy()
                    for _ in range(a.rounds):
                        for k in best:
                            best[k] = min(best[k], run_threads(lambda i, L=libs[k]: work(i, L), t))
                            best_cpu[k] = min(best_cpu[k], max(cpu))
                    wbytes = per * t * row_bytes
                    r = {"format": fmt, "n": n, "threads": t, "rows": per * t, "cols": cols,
                         "weight_mb": round(wbytes / 2**20, 1), "activations": "q8" if a.q8 else "f32"}
                    for k in best:
                        r[f"{k}_weight_gb_s"] = round(wbytes / best[k] / 1e9, 2)
                        r[f"{k}_gflop_s"] = round(2 * per * t * cols * n / best[k] / 1e9, 2)
                        r[f"{k}_weight_gb_s_cpu"] = round(wbytes / best_cpu[k] / 1e9, 2)
                        r[f"{k}_gflop_s_cpu"] = round(2 * per * t * cols * n / best_cpu[k] / 1e9, 2)
                    r["new_over_old_cpu"] = round(best_cpu["old"] / best_cpu["new"], 3)
                    r["new_over_old"] = round(best["old"] / best["new"], 3)
                    d = np.abs(outs["new"] - outs["old"]).max()
                    r["max_abs_diff_new_old"] = float(d)
                    r["bit_identical"] = bool(np.array_equal(outs["new"].view(np.uint32), outs["old"].view(np.uint32)))
                    res.append(r)
                    if not a.json:
                        print(r, flush=True)
    return res


def int8_experiment(mb: float) -> list[dict]:
    """bench/q3_int8.c (an experiment, not product code): an int8-activation q3_nl kernel against the f32
    AVX2 kernel, for activation scales per 32 and per 64 values, and the instruction-mix timings that bound
    the f32 kernel; built here with the system C compiler."""
    root = Path(__file__).resolve().parents[1]
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        return [{"error": "no C compiler"}]
    core = root / "core_c"
    srcs = [root / "bench" / "q3_int8.c"] + [core / "src" / f for f in
                                             ("formats.c", "kernels.c", "kernels_avx2.c", "kernels_neon.c", "kernels_q2vq.c", "quant3.c",
                                              "kernels_iq4xs.c", "quant_blocks.c")]
    res = []
    with tempfile.TemporaryDirectory() as tmp:
        for ablk in (32, 64):
            exe = Path(tmp) / f"q3_int8_{ablk}"
            subprocess.run([cc, f"-DABLK={ablk}", "-std=c11", "-O3", "-ffp-contract=off", "-I", str(core / "include"),
                            *map(str, srcs), "-o", str(exe), "-lm"], check=True, capture_output=True, text=True)
            out = subprocess.run([str(exe), str(mb), "7"], check=True, capture_output=True, text=True).stdout
            res.append(json.loads(out))
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=float, default=96)
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--threads", type=int, nargs="+", default=sorted({1, os.cpu_count() or 1}))
    ap.add_argument("--impl", nargs="+", default=None, help="scalar avx2 neon (default: all available)")
    ap.add_argument("--formats", nargs="+", default=FORMATS)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--int8-experiment", action="store_true",
                    help="also build and run bench/q3_int8.c (int8-activation q3_nl kernel, x86-64 AVX2 only)")
    ap.add_argument("--baseline", default=None, help="compare the kernels of this commit (old) with the working tree")
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds per case with --baseline")
    ap.add_argument("--q8", action="store_true",
                    help="with --baseline: compare the 8-bit-activation kernels (the default's q8 set) instead")
    ap.add_argument("--cols", type=int, default=COLS, help="with --baseline: the matrix's columns")
    a = ap.parse_args(argv)
    names = {ffi.string(lib.ferry_kernels_name(i)).decode(): i for i in range(3)}
    impls = [names[i] for i in a.impl] if a.impl else [i for i in range(3) if lib.ferry_kernels_available(i)]
    rng = np.random.default_rng(0)
    try:
        cpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines()[:16]
    except OSError:
        cpu = [platform.processor()]
    out = {"machine": cpu, "python": platform.python_version(),
           "date": time.strftime("%Y-%m-%d"),
           "best_kernels": ffi.string(lib.ferry_kernels_name(lib.ferry_kernels_best())).decode(),
           "memory_read_gb_s": {}, "kernels": []}
    memory_read(a.threads, out, "")
    if a.baseline:
        out["load_before"] = os.getloadavg()
        out["baseline"] = a.baseline
        out["compare"] = compare(a, rng)
        out["load_after"] = os.getloadavg()
        a.formats = []
    cache: dict = {}
    for fmt in a.formats:
        for impl in impls:
            if not lib.ferry_kernels_available(impl):
                continue
            for n in a.batch:
                for t in a.threads:
                    mb = a.mb if n == 1 else a.mb / 8
                    if impl == 0 and n > 1:
                        mb = min(mb, 4)
                    r = bench_kernel(impl, fmt, n, t, mb, rng, cache)
                    out["kernels"].append(r)
                    if not a.json:
                        print(r, flush=True)
    if a.int8_experiment:
        out["q3_nl_int8_experiment"] = int8_experiment(a.mb)
        if not a.json:
            print(out["q3_nl_int8_experiment"], flush=True)
    memory_read(a.threads, out, ", after")  # again at the end: the box is shared, so bracket the run
    out["memory_summary"] = memory_summary(out, a.threads)
    out["q3_nl_target"] = target(out)
    if a.json:
        print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
