"""q3_nl quantizer throughput against the disk, all in one run.

    python bench/quantize_speed.py --json [--rows 768] [--reference REV] [--disk-gb 2] [--workdir DIR]
    python bench/quantize_speed.py --json --q2-only [--q2-rows 64] [--q2-reference REV ...]

--q2-only times the q2_vq quantizer alone (one thread, CPU seconds from
time.process_time, so other load on the box does not count) on the same K3-shaped
matrices' f32 values: this tree's (app/convert/quant2.py, tables made once)
and, with --q2-reference REV (repeatable), core_c/src/quant2.c as it was at
REV built beside today's support files (its tables made once where it has
ferry_q2_quantizer_new), all interleaved round by round, with each one's
speedup and whether this tree writes its bytes; q3_nl's quantizer on the same
values for scale.

Matrices: K3's expert shapes (w1/w3 [rows of 3584], w2 [rows of 3072]), the
first --rows rows of each, weights as in bench/quant_quality.py (Student-t(5),
log-normal row/column scales, bf16, then MXFP4). Each source kind (f32, bf16
bits, MXFP4 blocks) is quantized by the extension in this tree (app/engine/
_ferry_c) with 1 and 2 threads of the Python wrapper (app/convert/quant3.py);
the best of --repeats timings is kept (the box is shared and noisy).

--reference REV also builds core_c/src/quant3.c as it was at git revision REV
(with today's formats.c / kernels*.c, cc -O3) into a temporary shared library
and times its f32/bf16/mxfp4 entry points on one thread in the same run, so
the before/after ratio is measured under the same load.

Disk: bench/convert.py's sequential() — a --disk-gb file written and read
back in 4 MiB O_DIRECT requests in --workdir.

Prints one JSON object; weights/s are in millions, "per_core" divides by the
thread count.
"""
from __future__ import annotations

import argparse
import ctypes
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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from app.convert import quant, quant3  # noqa: E402
from bench.quant_quality import k3_weights  # noqa: E402

SHAPES = {"w1": 3584, "w3": 3584, "w2": 3072}


def matrices(rows: int) -> list[dict]:
    out = []
    for i, (name, cols) in enumerate(SHAPES.items()):
        w = k3_weights((rows, cols), i)
        packed, scales = quant3.mxfp4_encode(w)
        values = quant3.mxfp4_decode(packed, scales)
        out.append({"name": name, "f32": values, "bf16": quant.f32_to_bf16_bits(values),
                    "packed": packed, "scales": scales})
    return out


def reference_lib(rev: str, folder: Path) -> ctypes.CDLL:
    """The quantizer of revision `rev`, built beside today's support files."""
    src = folder / "quant3_ref.c"
    src.write_text(subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:core_c/src/quant3.c"],
                                  check=True, capture_output=True, text=True).stdout)
    (folder / "include").mkdir(exist_ok=True)
    shutil.copy(ROOT / "core_c" / "include" / "ferry_kernels.h", folder / "include")
    for f in ("formats.h", "kernels.h", "common.h"):
        if (ROOT / "core_c" / "src" / f).exists():
            shutil.copy(ROOT / "core_c" / "src" / f, folder)
    support = [str(ROOT / "core_c" / "src" / f) for f in ("formats.c", "kernels.c", "kernels_avx2.c", "kernels_neon.c", "kernels_q2vq.c")]
    so = folder / "quant3_ref.so"
    cc = shutil.which("cc") or shutil.which("gcc") or "cc"
    subprocess.run([cc, "-std=c11", "-O3", "-ffp-contract=off", "-shared", "-fPIC", "-pthread",
                    "-I", str(folder / "include"), "-I", str(folder), str(src), *support, "-o", str(so), "-lm"],
                   check=True, capture_output=True, text=True)
    lib = ctypes.CDLL(str(so))
    vp = ctypes.c_void_p
    for fn, args in (("ferry_q3_quantize_f32", [vp, ctypes.c_int, ctypes.c_int, vp, vp]),
                     ("ferry_q3_quantize_bf16", [vp, ctypes.c_int, ctypes.c_int, vp, vp]),
                     ("ferry_q3_quantize_mxfp4", [vp, vp, ctypes.c_int, ctypes.c_int, vp, vp])):
        getattr(lib, fn).argtypes = args
        getattr(lib, fn).restype = ctypes.c_int
    return lib


def q2_reference_lib(rev: str, folder: Path) -> ctypes.CDLL:
    """The q2_vq quantizer of revision `rev` (ferry_q2_quantize_f32), built beside today's support files
    (and that revision's quant2_search.h where it has one)."""
    folder.mkdir(parents=True, exist_ok=True)
    src = folder / "quant2_ref.c"
    for name in ("quant2.c", "quant2_search.h"):
        shown = subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:core_c/src/{name}"], capture_output=True,
                               text=True)
        if shown.returncode == 0:
            (src if name == "quant2.c" else folder / name).write_text(shown.stdout)
    so = folder / "quant2_ref.so"
    support = [str(ROOT / "core_c" / "src" / f) for f in ("formats.c", "kernels.c", "kernels_avx2.c", "kernels_neon.c",
                                                         "kernels_q2vq.c")]
    cc = shutil.which("cc") or shutil.which("gcc") or "cc"
    subprocess.run([cc, "-std=c11", "-O3", "-ffp-contract=off", "-shared", "-fPIC", "-pthread", "-I", str(folder),
                    "-I", str(ROOT / "core_c" / "include"), "-I", str(ROOT / "core_c" / "src"), str(src), *support,
                    "-o", str(so), "-lm"], check=True, capture_output=True, text=True)
    lib = ctypes.CDLL(str(so))
    vp = ctypes.c_void_p
    lib.ferry_q2_quantize_f32.argtypes = [vp, ctypes.c_int, ctypes.c_int, vp, vp]
    lib.ferry_q2_quantize_f32.restype = ctypes.c_int
    if hasattr(lib, "ferry_q2_quantizer_new"):  # tables made once, as this tree's wrapper does
        lib.ferry_q2_quantizer_new.restype = vp
        lib.ferry_q2_quantize_with.argtypes = [vp, vp, ctypes.c_int, ctypes.c_int, vp, vp]
        lib.ferry_q2_quantize_with.restype = ctypes.c_int
    return lib


def q2_reference_run(lib: ctypes.CDLL, mats: list):
    """A function quantizing `mats` with a reference build (its tables made once when it has them)."""
    tables = lib.ferry_q2_quantizer_new() if hasattr(lib, "ferry_q2_quantizer_new") else None

    def run() -> list:
        outs = []
        for m in mats:
            out = np.zeros(m.size // 256 * 73, np.uint8)
            if tables:
                rc = lib.ferry_q2_quantize_with(tables, m.ctypes.data, m.shape[0], m.shape[1], None, out.ctypes.data)
            else:
                rc = lib.ferry_q2_quantize_f32(m.ctypes.data, m.shape[0], m.shape[1], None, out.ctypes.data)
            assert rc == 0
            outs.append(out)
        return outs
    return run


def cpu_seconds(fn) -> float:
    t = time.process_time()
    fn()
    return time.process_time() - t


def q2_speed(rows: int, repeats: int, references: list[str]) -> dict:
    """q2_vq's quantizer, one thread, in weights per CPU second (millions); each
    reference revision's build timed in the same rounds, interleaved."""
    from app.convert import quant2
    mats = [np.ascontiguousarray(m["f32"]) for m in matrices(rows)]
    n = sum(m.size for m in mats)
    runs = {"this_tree": lambda: [quant2.quantize(m, threads=1) for m in mats],
            "q3_nl": lambda: [quant3.quantize(m, threads=1) for m in mats]}
    with tempfile.TemporaryDirectory() as d:
        for i, rev in enumerate(references):
            runs[f"ref:{rev}"] = q2_reference_run(q2_reference_lib(rev, Path(d) / str(i)), mats)
        for fn in runs.values():
            fn()  # warm up (tables are made here, once per process)
        best = {k: float("inf") for k in runs}
        for _ in range(repeats):  # interleaved: every build sees the same load
            for k, fn in runs.items():
                best[k] = min(best[k], cpu_seconds(fn))
        mine = runs["this_tree"]()
        same = {rev: all(np.array_equal(a, b) for a, b in zip(mine, runs[f"ref:{rev}"]())) for rev in references}
    res = {"weights": n, "unit": "millions of weights per CPU second, one thread",
           "this_tree": round(n / best["this_tree"] / 1e6, 2), "q3_nl": round(n / best["q3_nl"] / 1e6, 2)}
    if references:
        res["references"] = {rev: {"speed": round(n / best[f"ref:{rev}"] / 1e6, 2),
                                   "speedup": round(best[f"ref:{rev}"] / best["this_tree"], 2),
                                   "same_bytes": same[rev]} for rev in references}
    res["q3_nl_over_q2_vq"] = round(best["this_tree"] / best["q3_nl"], 1)
    return res


def best_time(fn, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def run_new(mats: list[dict], src: str, threads: int) -> None:
    for m in mats:
        if src == "mxfp4":
            quant3.quantize_mxfp4(m["packed"], m["scales"], threads=threads)
        else:
            quant3.quantize(m[src], threads=threads)


def run_ref(lib: ctypes.CDLL, mats: list[dict], src: str) -> None:
    for m in mats:
        rows, cols = m["f32"].shape
        out = np.zeros(rows * cols // 256 * 99, np.uint8)
        p = lambda a: a.ctypes.data_as(ctypes.c_void_p)  # noqa: E731
        if src == "mxfp4":
            rc = lib.ferry_q3_quantize_mxfp4(p(m["packed"]), p(m["scales"]), rows, cols, None, p(out))
        else:
            rc = getattr(lib, f"ferry_q3_quantize_{src}")(p(m[src]), rows, cols, None, p(out))
        assert rc == 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=768, help="rows of each K3-shaped matrix")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--reference", default="", help="git revision whose quant3.c to time alongside")
    ap.add_argument("--disk-gb", type=float, default=2.0, help="0 skips the disk measurement")
    ap.add_argument("--workdir", default="", help="folder on the disk to measure (default: a temp dir under /tmp)")
    ap.add_argument("--q2-only", action="store_true", help="only the q2_vq quantizer (CPU time, one thread)")
    ap.add_argument("--q2-rows", type=int, default=64, help="rows of each K3-shaped matrix for --q2-only")
    ap.add_argument("--q2-reference", action="append", default=[],
                    help="git revision whose quant2.c to time alongside (repeatable)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    if a.q2_only:
        res = {"date": time.strftime("%Y-%m-%d"), "machine": platform.machine(), "cpus": os.cpu_count(),
               "load_average": os.getloadavg()[0], "q2_vq": q2_speed(a.q2_rows, a.repeats, a.q2_reference)}
        print(json.dumps(res, indent=1) if a.json else res)
        return 0
    mats = matrices(a.rows)
    n = sum(m["f32"].size for m in mats)
    src_bytes = {"f32": 4, "bf16": 2, "mxfp4": 17 / 32}
    res: dict = {"date": time.strftime("%Y-%m-%d"), "machine": platform.machine(), "cpus": os.cpu_count(),
                 "weights_per_pass": n, "unit": "millions of weights per second", "this_tree": {}}
    for src in ("f32", "bf16", "mxfp4"):
        run_new(mats, src, 1)  # warm up
        for threads in (1, 2):
            dt = best_time(lambda: run_new(mats, src, threads), a.repeats)
            res["this_tree"][f"{src}/{threads}t"] = {
                "weights_per_s": round(n / dt / 1e6, 1), "weights_per_s_per_core": round(n / dt / 1e6 / threads, 1),
                "source_mb_per_s": round(n * src_bytes[src] / dt / 1e6, 1)}
    # The trunk formats (ferry_quantize_blocks against the numpy reference it
    # replaced in the converter), on the same matrices' f32 values.
    from app.convert import quant
    flat = np.concatenate([m["f32"].reshape(-1) for m in mats])
    res["trunk"] = {}
    for name in ("Q8_0", "Q4_0", "Q4_1"):
        quant.quantize(flat[:1 << 16], name)  # warm up
        row = {"numpy_reference_1t": round(n / best_time(lambda: quant.quantize_reference(flat, name), a.repeats)
                                           / 1e6, 1)}
        for threads in (1, 2):
            row[f"c_{threads}t"] = round(n / best_time(lambda: quant.quantize(flat, name, threads=threads),
                                                       a.repeats) / 1e6, 1)
        row["speedup_1t"] = round(row["c_1t"] / row["numpy_reference_1t"], 2)
        res["trunk"][name.lower()] = row
    if a.reference:
        with tempfile.TemporaryDirectory() as d:
            lib = reference_lib(a.reference, Path(d))
            res["reference"] = {"revision": a.reference}
            for src in ("f32", "bf16", "mxfp4"):
                dt = best_time(lambda: run_ref(lib, mats, src), a.repeats)
                res["reference"][f"{src}/1t"] = {"weights_per_s_per_core": round(n / dt / 1e6, 1)}
                res["reference"][f"{src}/1t"]["speedup_now"] = round(
                    res["this_tree"][f"{src}/1t"]["weights_per_s_per_core"] / (n / dt / 1e6), 2)
    if a.disk_gb > 0:
        from bench.convert import sequential
        with tempfile.TemporaryDirectory(dir=a.workdir or None) as d:
            seq = sequential(Path(d), int(a.disk_gb * (1 << 30)) // (4 << 20) * (4 << 20))
        res["disk"] = {"read_mb_per_s": round(seq["read_bytes_per_s"] / 1e6), "direct": seq["direct"],
                       "bytes": seq["bytes"], "folder": a.workdir or tempfile.gettempdir()}
        # Reading MXFP4 at that rate feeds 32/17 weights per byte.
        res["disk"]["mxfp4_weights_per_s"] = round(seq["read_bytes_per_s"] * 32 / 17 / 1e6, 1)
        res["disk"]["cores_to_keep_up_mxfp4"] = round(
            res["disk"]["mxfp4_weights_per_s"] / res["this_tree"]["mxfp4/1t"]["weights_per_s_per_core"], 2)
    print(json.dumps(res, indent=1) if a.json else res)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
