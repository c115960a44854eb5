"""The exact (f32-activation) path's ceiling on this CPU, against llama.cpp.

    python bench/ceiling.py [--files demo 1b-q4_k_m 1b-q8_0] [--threads 2] [--vs VS.json] [--memory-gb-s 24.5] --json
    python bench/ceiling.py --probe-study 5 [--threads 2]   (the read probe against its variants)

Measures, in one run:
- this CPU's peak multiply-accumulate rates (bench/ceiling.c, built here with
  cc): f32 FMA (what an exact kernel needs at least once per weight and
  token) and int8 (vpmaddubsw/vpmaddwd on AVX2, vpdpbusd with AVX512-VNNI:
  what llama.cpp's kernels use), on one thread and on ``--threads`` at once;
- the memory read of ``--threads`` threads (``ReadProbe``: what a decode on that
  many threads could read from memory; the median of 3 probes);
- each exact kernel of the files' formats from cache (ferry_kernel_matmul on
  a [rows, 3584] matrix that fits in L2, one thread, by its CPU clock: n = 1
  as in decode, n = 64 as in a prompt), i.e. the kernel's own compute rate;
Peaks and kernel rates count each thread's own CPU time, so other processes
taking turns on the cores do not lower them; the memory read is wall-clock
and does drop on a busy machine (the load is recorded before and after).
and from each file's GGUF (its matrices' shapes and stored bytes; the token
embedding is a row read, not a product, unless the output shares it) the MACs
and weight bytes per token, then for every file:
- ``exact_ceiling``: the best tok/s any exact kernel could reach: prompt =
  f32 FMA peak / MACs per token (attention at the prompt's mean context
  included), decode = min(memory read / bytes, FMA peak / MACs). It assumes
  every other instruction free, so no real kernel reaches it;
- ``int8_ceiling``: the same with the int8 peak for the matrices (attention
  kept in f32);
- ``kernels_today``: tok/s if every product ran at its exact kernel's
  measured in-cache rate (decode also bounded by the memory read);
- llama.cpp's measured figures (``--vs``: a bench/vs_llamacpp.py --json
  output; by default the quiet-machine medians recorded in docs/bench-log/2026-12-03.md,
  section "Issue 21 (lead)", 22:06-22:13 UTC) and the ratio
  llama.cpp / exact ceiling: above 1.0 means exact-mode parity is impossible
  on this CPU whatever the kernel.
"""
from __future__ import annotations

import argparse
import json
import mmap
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import kernel_speed as kbench  # noqa: E402
from bench.vs_llamacpp import gguf_file  # noqa: E402

#: llama.cpp (llama-cpp-python 0.3.36, 2 threads) on this VM, quiet, medians of 2 rounds:
#: docs/bench-log/2026-12-03.md, "Issue 21 (2026-12-03, lead)", 22:06-22:13 UTC. Used when --vs is not given.
LLAMA_CPP_REFERENCE = {
    "demo": {"decode_tok_s": 98.1, "prompt128_tok_s": 247.0, "prompt1024_tok_s": 210.0},
    "1b-q4_k_m": {"decode_tok_s": 34.7, "prompt128_tok_s": 98.5, "prompt1024_tok_s": 90.1},
    "1b-q8_0": {"decode_tok_s": 19.8, "prompt128_tok_s": 92.5, "prompt1024_tok_s": 76.5},
}
KERNEL_FORMATS = {"Q4_0": "q4_0", "Q4_1": "q4_1", "Q8_0": "q8_0", "Q4_K": "q4_k", "Q5_K": "q5_k", "Q6_K": "q6_k",
                  "F16": "f16", "F32": "f32", "BF16": "bf16"}


def peaks(threads: int) -> dict:
    """bench/ceiling.c's JSON: MACs per second per loop, one thread and `threads` at once."""
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        raise SystemExit("ceiling.py needs a C compiler (cc)")
    with tempfile.TemporaryDirectory() as tmp:
        exe = Path(tmp) / "ceiling"
        subprocess.run([cc, "-std=c11", "-O2", "-pthread", str(ROOT / "bench" / "ceiling.c"), "-o", str(exe)],
                       check=True)
        out = subprocess.run([str(exe), str(threads)], check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def shape(path: Path) -> dict:
    """MACs and weight bytes per token of a GGUF's matrices, by stored format, and its attention shape."""
    import gguf
    r = gguf.GGUFReader(str(path))
    arch = str(r.fields["general.architecture"].contents())

    def meta(key: str) -> int:
        return int(r.fields[f"{arch}.{key}"].contents())

    layers, dim, heads = meta("block_count"), meta("embedding_length"), meta("attention.head_count")
    by_fmt: dict[str, dict] = {}
    names = {t.name for t in r.tensors}
    for t in r.tensors:
        if len(t.shape) != 2:
            continue
        if t.name == "token_embd.weight" and "output.weight" in names:
            continue  # a row lookup, not a product
        f = by_fmt.setdefault(t.tensor_type.name, {"macs": 0, "bytes": 0})
        f["macs"] += int(t.shape[0]) * int(t.shape[1])
        f["bytes"] += int(t.n_bytes)
    return {"layers": layers, "dim": dim, "heads": heads, "head_dim": dim // heads, "by_format": by_fmt,
            "macs": sum(f["macs"] for f in by_fmt.values()), "bytes": sum(f["bytes"] for f in by_fmt.values())}


GIB = 2**30


def llc_bytes() -> int:
    """The largest CPU cache the OS reports (Linux sysfs, macOS sysctl), 0 if none is reported."""
    sizes = []
    for f in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
        txt = f.read_text().strip()
        mult = {"K": 2**10, "M": 2**20, "G": 2**30}.get(txt[-1:], 1)
        sizes.append(int(txt.rstrip("KMG")) * mult)
    if not sizes and sys.platform == "darwin":
        for key in ("hw.l3cachesize", "hw.l2cachesize"):
            out = subprocess.run(["sysctl", "-n", key], capture_output=True, text=True).stdout.strip()
            if out.isdigit():
                sizes.append(int(out))
    return max(sizes, default=0)


def probe_bytes() -> int:
    """The read probe's buffer: at least twice the last-level cache and at least 1 GiB, as a decode's weights
    (the 1B files read 0.7-1.2 GB a token), so that it reads memory, not a cache."""
    return max(GIB, 2 * llc_bytes()) // (2 * 2**20) * (2 * 2**20)


def _anonymous(nbytes: int, huge: bool) -> tuple[mmap.mmap, np.ndarray]:
    """`nbytes` of anonymous memory, 2 MiB pages requested (as the engine's trunk: fe_alloc_huge) or refused,
    every byte written (resident: a never-written page reads the shared zero page, from cache)."""
    private = getattr(mmap, "MAP_PRIVATE", 0) | getattr(mmap, "MAP_ANONYMOUS", 0)
    m = mmap.mmap(-1, nbytes, flags=private) if private else mmap.mmap(-1, nbytes)   # (shared: shmem pages)
    advice = getattr(mmap, "MADV_HUGEPAGE" if huge else "MADV_NOHUGEPAGE", None)
    if advice is not None:
        m.madvise(advice)
    a = np.frombuffer(m, dtype=np.uint64)
    a[:] = 1
    return m, a


def huge_page_share(a: np.ndarray) -> float | None:
    """The share of `a`'s bytes in transparent huge pages (Linux /proc/self/smaps; None elsewhere)."""
    lo, hi = a.ctypes.data, a.ctypes.data + a.nbytes
    try:
        text = Path("/proc/self/smaps").read_text()
    except OSError:
        return None
    huge, inside = 0, False
    for line in text.splitlines():
        head = line.split(" ", 1)[0]
        if "-" in head and not head.endswith(":"):
            start, end = (int(x, 16) for x in head.split("-"))
            inside = start < hi and end > lo
        elif inside and line.startswith("AnonHugePages:"):
            huge += int(line.split()[1]) * 1024
    return min(1.0, huge / a.nbytes)


def timed_threads(works: list) -> tuple[float, list[float]]:
    """Each of `works` (callables, the core's calls releasing the GIL) on its own thread at once
    (app.engine.speed.run_threads): the wall seconds from the start to the last one's end, and each
    thread's CPU seconds."""
    cpu = [0.0] * len(works)

    def run(i: int) -> None:
        c0 = time.thread_time()
        works[i]()
        cpu[i] = time.thread_time() - c0

    return kbench.run_threads(run, len(works)), cpu


def rates(wall: float, cpu: list[float], per_thread_bytes: int) -> dict:
    """A probe's figures: GB/s of all threads by the wall clock and summed over each thread's CPU time."""
    return {"gb_s": round(len(cpu) * per_thread_bytes / wall / 1e9, 2),
            "cpu_gb_s": round(sum(per_thread_bytes / c for c in cpu) / 1e9, 2), "seconds": round(wall, 3),
            "load1": os.getloadavg()[0], "at": time.strftime("%H:%M:%S", time.gmtime())}


class ReadProbe:
    """What a decode on `threads` threads could read from memory now, measured the way a decode reads its
    weights: `threads` threads at once, each streaming its own contiguous part (as each of the pool's threads
    streams its rows of a matrix-vector product) of a buffer larger than the last-level cache (probe_bytes)
    held in 2 MiB pages (as the engine's trunk), written before the first probe (no first-touch faults, no
    zero page). The buffer is allocated once, so probes taken between an engine's runs cost ~0.3-1 s each.

    ``measure()``: one probe of ``passes`` passes over the buffer; ``gb_s`` is bytes / wall seconds from the
    threads' common start to the last one's end (wall-clock, as decode tok/s: other processes taking the cores
    lower both), ``cpu_gb_s`` the sum over threads of bytes / the thread's CPU seconds (what the threads read
    while running: the memory system's rate, unaffected by time slicing)."""

    def __init__(self, threads: int, nbytes: int | None = None, passes: int = 8, huge: bool = True):
        self.threads, self.passes = threads, passes
        self.nbytes = (nbytes or probe_bytes()) // (threads * 4096) * (threads * 4096)
        self._maps = [_anonymous(self.nbytes // threads, huge) for _ in range(threads)]
        self.huge_page_share = huge_page_share(self._maps[0][1])
        self._read(1)  # first pass: TLB and caches settle

    def _read(self, passes: int, streams: int = 1, threads: int | None = None) -> tuple[float, list[float]]:
        lib, ffi = kbench.lib, kbench.ffi

        def read(i: int):
            buf = self._maps[i][1]
            return lambda: lib.ferry_memory_read(ffi.from_buffer(buf), buf.nbytes, passes, streams)

        return timed_threads([read(i) for i in range(threads or self.threads)])

    def measure(self, streams: int = 1, threads: int | None = None) -> dict:
        return rates(*self._read(self.passes, streams, threads), self.passes * self._maps[0][1].nbytes)

    def describe(self) -> dict:
        return {"threads": self.threads, "buffer_bytes": self.nbytes, "llc_bytes": llc_bytes(),
                "passes": self.passes, "streams_per_thread": 1, "huge_page_share": self.huge_page_share}


#: How the bound's denominator is measured (bench/vs_llamacpp.py and --moe record it in their JSON).
READ_METHOD = ("ReadProbe (bench/ceiling.py): THREADS threads (the engines' thread count) at once, each "
               "streaming its own contiguous part of a resident buffer of at least 1 GiB and twice the "
               "last-level cache, 2 MiB pages (as Ferry's trunk), 1 stream a thread (as a thread streams its "
               "rows of a matrix-vector product); bytes / wall seconds. One probe before each engine child "
               "and one after the last; a child's bound uses the mean of the probes on either side of it")


def memory_read_gb_s(threads: int, probes: int = 3) -> float:
    """The memory read of `threads` threads: the median of `probes` ReadProbe measurements. Wall-clock: a
    busy machine lowers it (as it lowers a decode)."""
    probe = ReadProbe(threads)
    return statistics.median(probe.measure()["gb_s"] for _ in range(probes))


def probe_study(threads: int, rounds: int = 5) -> dict:
    """The evidence for ReadProbe's choices: the probe and its variants (a buffer inside the last-level
    cache, twice the size, 4 streams a thread, 4 KiB pages, one thread) and the engine's Q8_0 and Q4_K
    decode products over as many bytes (KernelProduct), `rounds` times each in a shuffled order, every
    figure (wall and CPU-time GB/s) and their medians."""
    import random
    big = probe_bytes()
    variants = {"probe": (ReadProbe(threads, big), 1, threads),
                "64 MiB buffer (inside the LLC)": (ReadProbe(threads, 64 * 2**20, passes=128), 1, threads),
                "twice the buffer": (ReadProbe(threads, 2 * big, passes=4), 1, threads),
                "4 KiB pages": (ReadProbe(threads, big, huge=False), 1, threads)}
    variants["4 streams a thread"] = (variants["probe"][0], 4, threads)
    if threads > 1:
        variants["1 thread"] = (variants["probe"][0], 1, 1)
    products = {fmt: KernelProduct(threads, fmt, big) for fmt in ("q8_0", "q4_k")}
    for fmt, prod in products.items():
        variants[f"{fmt} matrix-vector product (8-bit activations)"] = (prod, 1, threads)
    figs: dict[str, list[dict]] = {k: [] for k in variants}
    order = list(variants)
    for _ in range(rounds):
        random.shuffle(order)
        for k in order:
            probe, streams, n = variants[k]
            figs[k].append(probe.measure(streams, n))
    out = {}
    for k, rs in figs.items():
        probe = variants[k][0]
        out[k] = {"gb_s_median": statistics.median(r["gb_s"] for r in rs),
                  "cpu_gb_s_median": statistics.median(r["cpu_gb_s"] for r in rs),
                  "buffer_bytes": probe.nbytes, "huge_page_share": probe.huge_page_share, "probes": rs}
    return out


class KernelProduct:
    """The engine's own decode product as a reader, to check the probe against: `threads` threads at once,
    each running the engine's 8-bit-activation kernels (ferry_kernel_matmul_q8 with the set its "auto"
    takes, AVX-512 VNNI where it runs; n = 1) over its contiguous half of the
    rows of a random `fmt` matrix of about `nbytes` ([rows, 3584]); weight bytes / wall seconds, as
    ReadProbe.measure gives them. A kernel that reads near the probe's rate means the probe is a bound
    decode can approach; one far below it is limited by its own compute."""

    def __init__(self, threads: int, fmt: str, nbytes: int, passes: int = 2):
        lib = kbench.lib
        self.threads, self.passes, self.fmt = threads, passes, fmt
        self.code = lib.ferry_format_code(fmt.encode())
        self.row_bytes = lib.ferry_format_row_bytes(self.code, kbench.COLS)
        self.rows = nbytes // self.row_bytes // threads
        rng = np.random.default_rng(1)
        self.w = [kbench.random_matrix(fmt, self.rows, rng) for _ in range(threads)]
        self.nbytes = threads * self.rows * self.row_bytes
        self.huge_page_share = huge_page_share(self.w[0])
        self.x = rng.standard_normal(kbench.COLS).astype(np.float32)
        self.y = [np.zeros(self.rows, dtype=np.float32) for _ in range(threads)]

    def measure(self, streams: int = 1, threads: int | None = None) -> dict:
        from bench.q8_speed import q8_auto
        lib, ffi = kbench.lib, kbench.ffi
        impl = q8_auto(lib, ffi, lib.ferry_kernels_best())   # the engine's q8 set

        def product(i: int):
            args = (impl, self.code, ffi.from_buffer(self.w[i]), self.rows, kbench.COLS,
                    ffi.from_buffer("float[]", self.x), 1, ffi.from_buffer("float[]", self.y[i]))
            return lambda: [lib.ferry_kernel_matmul_q8(*args) for _ in range(self.passes)]

        wall, cpu = timed_threads([product(i) for i in range(threads or self.threads)])
        return rates(wall, cpu, self.passes * self.rows * self.row_bytes)


def attention_macs(s: dict, context: float) -> float:
    """Scores and weighted sum of one token over `context` positions, every layer and head."""
    return 2.0 * s["layers"] * s["heads"] * s["head_dim"] * context


def kernel_rates(formats: set[str], rng) -> dict:
    """MACs per second of each exact kernel on one thread (this one, by its CPU clock, so other processes
    taking turns on the core do not count): n = 1 (decode) and n = 64 (a prompt) on a [rows, 3584] matrix
    of random blocks of about 0.5 MB (in L2), and n = 1 on 32 MB (from memory); the best of 7 batches."""
    lib, ffi = kbench.lib, kbench.ffi
    impl = lib.ferry_kernels_best()
    out = {}
    for fmt in sorted(formats):
        code = lib.ferry_format_code(fmt.encode())
        row_bytes = lib.ferry_format_row_bytes(code, kbench.COLS)
        res = {}
        for n, mb in ((1, 0.5), (64, 0.5), ("1 from DRAM", 32)):
            rows = max(8, int(mb * 2**20 // row_bytes) // 8 * 8)
            w = kbench.random_matrix(fmt, rows, rng)
            n_key, n = n, (1 if isinstance(n, str) else n)
            x = rng.standard_normal((n, kbench.COLS)).astype(np.float32)
            y = np.zeros((n, rows), dtype=np.float32)
            args = (impl, code, ffi.from_buffer(w), rows, kbench.COLS, ffi.from_buffer("float[]", x), n,
                    ffi.from_buffer("float[]", y))
            calls = max(1, int(2e8 // (rows * kbench.COLS * n)))  # ~0.02-0.1 s a batch
            best = float("inf")
            for _ in range(7):
                t0 = time.thread_time()
                for _ in range(calls):
                    lib.ferry_kernel_matmul(*args)
                best = min(best, (time.thread_time() - t0) / calls)
            res[n_key] = rows * kbench.COLS * n / best
        # the better of the two decode figures (from L2 it was lower for some formats: a short call's overheads)
        dec = max(res[1], res["1 from DRAM"])
        out[fmt] = {"decode_macs_per_s": dec, "prompt64_macs_per_s": res[64],
                    "decode_weight_gb_s": dec * row_bytes / kbench.COLS / 1e9,
                    "decode_in_l2_macs_per_s": res[1], "decode_from_dram_macs_per_s": res["1 from DRAM"]}
    return out


def ceilings(name: str, s: dict, pk: dict, mem_gb_s: float, krates: dict, llama: dict | None, threads: int) -> dict:
    # the peak of `threads` threads at once, each by its own CPU time (bench/ceiling.c)
    fma = pk["f32_fma_avx2"]["macs_per_s_all"] if pk.get("f32_fma_avx2") else None
    i8 = max((pk[k]["macs_per_s_all"] for k in ("i8_vnni_avx512", "i8_maddubs_avx2") if pk.get(k)), default=None)
    res = {"macs_per_token": s["macs"], "weight_bytes_per_token": s["bytes"],
           "formats": {k: v["macs"] for k, v in s["by_format"].items()}}
    bw = mem_gb_s * 1e9 / s["bytes"]
    ex, q = {}, {}
    if fma:
        ex["decode_tok_s"] = min(bw, fma / s["macs"])
        for L in (128, 1024):
            ex[f"prompt{L}_tok_s"] = fma / (s["macs"] + attention_macs(s, L / 2))
    if i8 and fma:
        q["decode_tok_s"] = min(bw, i8 / s["macs"])
        for L in (128, 1024):
            q[f"prompt{L}_tok_s"] = 1.0 / (s["macs"] / i8 + attention_macs(s, L / 2) / fma)
    res["memory_bound_decode_tok_s"] = bw
    res["exact_ceiling"] = ex
    res["int8_ceiling"] = q
    # every product at its exact kernel's in-cache rate, `threads` threads each at the one-thread rate
    if all(KERNEL_FORMATS.get(f) in krates for f in s["by_format"]):
        dec = sum(v["macs"] / (threads * krates[KERNEL_FORMATS[f]]["decode_macs_per_s"])
                  for f, v in s["by_format"].items())
        pre = sum(v["macs"] / (threads * krates[KERNEL_FORMATS[f]]["prompt64_macs_per_s"])
                  for f, v in s["by_format"].items())
        res["kernels_today"] = {"decode_tok_s": min(bw, 1.0 / dec), "prompt_tok_s": 1.0 / pre}
    if llama:
        res["llama_cpp"] = llama
        res["llama_cpp_over_exact_ceiling"] = {k: llama[k] / ex[k] for k in ex if k in llama}
        res["llama_cpp_share_of_f32_peak"] = {k: llama[k] * s["macs"] / fma for k in llama if fma}
    return {k: (round(v, 3) if isinstance(v, float) else v) for k, v in res.items()}


def rounded(x):
    if isinstance(x, float):
        return float(f"{x:.4g}")
    if isinstance(x, dict):
        return {k: rounded(v) for k, v in x.items()}
    return x


def llama_figures(vs: Path | None) -> dict:
    if vs is None:
        return {"source": "docs/bench-log/2026-12-03.md, Issue 21 (lead), quiet, 22:06-22:13 UTC", **LLAMA_CPP_REFERENCE}
    d = json.loads(vs.read_text())
    out = {"source": str(vs)}
    for name, res in d.get("files", {}).items():
        med = res.get("median", {}).get("llama_cpp") or {}
        figs = {k: med[k] for k in ("decode_tok_s", "prompt128_tok_s", "prompt1024_tok_s") if med.get(k)}
        if figs:
            out[name] = figs
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--files", nargs="+", default=["demo", "1b-q4_k_m", "1b-q8_0"])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--vs", type=Path, help="a bench/vs_llamacpp.py --json output for llama.cpp's figures")
    ap.add_argument("--workdir", type=Path, default=Path.home() / ".cache" / "ferry-bench")
    ap.add_argument("--memory-gb-s", type=float,
                    help="the memory read to bound decode with (e.g. one measured on a quiet machine) instead of "
                         "this run's, which a busy machine lowers; both are printed")
    ap.add_argument("--json", action="store_true", help="one line of JSON (default: indented)")
    ap.add_argument("--probe-study", type=int, metavar="ROUNDS",
                    help="only the evidence for the read probe's method: it and its variants, ROUNDS times each")
    a = ap.parse_args()
    if a.probe_study:
        out = {"date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "load_before": os.getloadavg()[0],
               "threads": a.threads, "method": READ_METHOD.replace("THREADS", str(a.threads)),
               "variants": probe_study(a.threads, a.probe_study), "load_after": os.getloadavg()[0]}
        print(json.dumps(out) if a.json else json.dumps(out, indent=1))
        return
    out = {"date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "machine": platform.processor() or
           platform.machine(), "cpus": os.cpu_count(), "load_before": os.getloadavg()[0], "threads": a.threads}
    try:
        out["lscpu_model"] = next(ln.split(":", 1)[1].strip() for ln in
                                  subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines()
                                  if ln.startswith("Model name"))
    except (OSError, StopIteration):
        pass
    out["peaks_macs_per_s"] = peaks(a.threads)
    out["memory_read_gb_s_measured"] = memory_read_gb_s(a.threads)
    out["memory_read_gb_s"] = a.memory_gb_s or out["memory_read_gb_s_measured"]
    shapes = {n: shape(gguf_file(n, a.workdir)) for n in a.files}
    fmts = {KERNEL_FORMATS[f] for s in shapes.values() for f in s["by_format"] if f in KERNEL_FORMATS}
    out["kernels_in_cache_1_thread"] = kernel_rates(fmts, np.random.default_rng(0))
    llama = llama_figures(a.vs)
    out["llama_cpp_source"] = llama.get("source")
    out["files"] = {n: ceilings(n, s, out["peaks_macs_per_s"], out["memory_read_gb_s"],
                                out["kernels_in_cache_1_thread"], llama.get(n), a.threads) for n, s in shapes.items()}
    out["load_after"] = os.getloadavg()[0]
    out = rounded(out)
    print(json.dumps(out) if a.json else json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
