"""Two builds' 8-bit-activation K-quant kernels in one process, alternating call by call.

    python bench/experiments/q8_kernels_ab.py BASE_DIR [NEW_DIR] [--tokens 8 32] [--formats q4_k q5_k q6_k]
                                              [--reps 21] [--kernels 3]

Each DIR is a checkout with its core built in place
(``app/engine/_ferry_c.abi3.so``). Both libraries are loaded with ctypes
(each its own copy: RTLD_LOCAL), the same random K-quant blocks (small f16
scales, as ``bench/q8_speed.py --kernels``) and activations go to
``ferry_kernel_matmul_q8`` of each in turn, the order alternating by
repetition, and the best per-thread CPU time of ``--reps`` calls is kept
(robust to other processes' load, unlike wall time). Prints one JSON line
per product: base and new milliseconds, base / new (above 1: the new build
is faster), the new build's G multiply-adds per second, whether both gave
the same floats, and the load average. ``--kernels`` is the q8 set id
(3: AVX-512 VNNI, 1: AVX2, 0: scalar).
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
SHAPES = (("q4_k", 8192, 2048), ("q4_k", 2048, 8192), ("q4_k", 2048, 2048), ("q5_k", 2048, 2048),
          ("q6_k", 2048, 8192))


def load(tree: Path) -> ctypes.CDLL:
    lib = ctypes.CDLL(str(next((tree / "app" / "engine").glob("_ferry_c*.so"))))
    lib.ferry_format_code.restype = ctypes.c_int
    lib.ferry_format_code.argtypes = [ctypes.c_char_p]
    lib.ferry_format_row_bytes.restype = ctypes.c_uint64
    lib.ferry_format_row_bytes.argtypes = [ctypes.c_int, ctypes.c_uint64]
    lib.ferry_kernel_matmul_q8.restype = ctypes.c_int
    lib.ferry_kernel_matmul_q8.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_int,
                                           ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p]
    return lib


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("base", type=Path)
    ap.add_argument("new", type=Path, nargs="?", default=ROOT)
    ap.add_argument("--tokens", type=int, nargs="+", default=[8, 32])
    ap.add_argument("--formats", nargs="+", default=["q4_k", "q5_k", "q6_k"])
    ap.add_argument("--reps", type=int, default=21)
    ap.add_argument("--kernels", type=int, default=3, help="q8 kernel set id (3: avx512vnni)")
    a = ap.parse_args(argv)
    libs = [load(a.base), load(a.new)]
    rng = np.random.default_rng(0)
    for fmt, rows, cols in SHAPES:
        if fmt not in a.formats:
            continue
        code = libs[0].ferry_format_code(fmt.encode())
        nbytes = libs[0].ferry_format_row_bytes(code, cols) * rows
        w = rng.integers(0, 256, nbytes, dtype=np.uint8)
        blocks = w.reshape(-1, nbytes // (rows * cols // 256))
        at = 208 if fmt == "q6_k" else 0
        blocks[:, at:at + 2] = np.frombuffer(np.float16(0.01).tobytes(), np.uint8)
        if fmt != "q6_k":
            blocks[:, 2:4] = np.frombuffer(np.float16(0.001).tobytes(), np.uint8)
        for n in a.tokens:
            x = rng.standard_normal(n * cols).astype(np.float32)
            ys = [np.zeros(n * rows, np.float32) for _ in libs]
            best = [float("inf")] * 2
            for r in range(a.reps):
                for i in ((0, 1) if r % 2 == 0 else (1, 0)):
                    t0 = time.thread_time_ns()
                    if libs[i].ferry_kernel_matmul_q8(a.kernels, code, w.ctypes.data, rows, cols, x.ctypes.data, n,
                                                      ys[i].ctypes.data):
                        raise SystemExit(f"{fmt}: kernel set {a.kernels} refused the product")
                    best[i] = min(best[i], time.thread_time_ns() - t0)
            print(json.dumps({"format": fmt, "rows": rows, "cols": cols, "tokens": n, "base_ms": best[0] / 1e6,
                              "new_ms": best[1] / 1e6, "base_over_new": round(best[0] / best[1], 3),
                              "same": bool(np.array_equal(ys[0], ys[1])),
                              "new_gmac_s": round(rows * cols * n / best[1], 1), "load1": os.getloadavg()[0]}),
                  flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
