"""Conversion throughput against the disk it runs on.

    python bench/convert.py --json [--size-gb 4] [--workdir DIR] [--expert-format auto]
    python bench/convert.py --json --source-experts mxfp4 --expert-format q3_nl [--threads N]

Writes a deterministic Qwen3-MoE-shaped bf16 checkpoint of about --size-gb
(bench/make_synthetic.py; `--source-experts mxfp4` stores the routed experts
as Kimi K3 does, compressed-tensors MXFP4) in --workdir, then measures in the
same run, on the same disk:

* sequential write: 1 GiB in 4 MiB direct writes, then fsync;
* sequential read: that file read back in 4 MiB direct reads;
* conversion: `convert()` of the checkpoint with the source evicted from the
  page cache first (posix_fadvise DONTNEED), so it is read from the disk.

* the q3_nl quantizer alone (--expert-format q3_nl): the first layer's
  expert matrices, from the source's own bytes, in memory, on 1 thread
  (weights/s per core) and on --threads threads.

Prints one JSON object; `ratio_to_target` >= 1 means the conversion ran at
least at half the slower of the two bandwidths (the target: it reads the
source and writes the container on the same disk); `ratio_to_disk_read` is
the source bytes read per second against the disk's direct sequential read
(1 = as fast as the disk reads); `disk_seconds` is what reading the source
and writing the container take at those bandwidths one after the other
(--out-dir elsewhere, e.g. /dev/shm: the reading alone). `cpu_busy` is the process's CPU time over
wall time times the cores (1 = every core busy all the time), and
`disk_read_bytes` what the kernel read from the disk for it (/proc/self/io).
`--f32-path` converts as before the fast path (float32 arrays in numpy), for
comparison; `--row-threads` splits each tensor's rows over threads inside
each encoder (with `--threads 1`: one record at a time, rows in parallel).

GGUF mode (`--gguf-moe`): a stacked-expert GGUF against a plain copy of it.

    python bench/convert.py --json --gguf-moe [--layers 2] [--gguf-type q4_0] [--keep-source F.gguf] [--runs 2]

writes a Qwen3-30B-A3B-shaped qwen3moe GGUF of --layers layers with random
weights (bench/make_gguf_moe.py; 128 experts stacked in 3-D tensors, about
340 MB a layer in Q4_0), then, rounds interleaved, page cache dropped before
each step (/proc/sys/vm/drop_caches as root, else posix_fadvise on the files):
`cp` of the file to the same disk plus fsync of the copy (the disk's
sequential copy rate for this very file), and `convert()` of it (its experts
kept as they are). Prints one JSON object: per round the copy and the
conversion seconds, bytes per second, CPU (user, system) seconds and bytes
read from the disk, and `ratio_to_copy` (median copy seconds / median
conversion seconds; the target is >= 0.5: converting at half the disk's copy
rate or better).
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

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

from app.convert import convert as convert_mod
from app.convert import layout, quant3
from app.convert.convert import convert, default_threads
from app.convert.sources import open_source
from bench.make_synthetic import make, parse
from bench.procio import io_read_bytes

BLOCK = 4 << 20


def _direct(flags: int) -> int:
    return flags | getattr(os, "O_DIRECT", 0)


def sequential(folder: Path, nbytes: int = 1 << 30) -> dict:
    """Direct sequential write then read of one file, in BLOCK-sized requests."""
    path = folder / "seq.bin"
    buf = mmap.mmap(-1, BLOCK)
    buf.write(os.urandom(BLOCK))
    n = nbytes // BLOCK
    fd = os.open(path, _direct(os.O_WRONLY | os.O_CREAT | os.O_TRUNC), 0o600)
    t0 = time.perf_counter()
    for i in range(n):
        os.pwrite(fd, buf, i * BLOCK)
    os.fsync(fd)
    write_s = time.perf_counter() - t0
    os.close(fd)
    fd = os.open(path, _direct(os.O_RDONLY))
    if hasattr(os, "posix_fadvise"):
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    t0 = time.perf_counter()
    for i in range(n):
        os.preadv(fd, [buf], i * BLOCK)
    read_s = time.perf_counter() - t0
    os.close(fd)
    path.unlink()
    return {"write_bytes_per_s": n * BLOCK / write_s, "read_bytes_per_s": n * BLOCK / read_s,
            "bytes": n * BLOCK, "block": BLOCK, "direct": bool(getattr(os, "O_DIRECT", 0))}


def evict(folder: Path) -> None:
    """Drop a folder's files from the page cache (they are clean once synced)."""
    for p in folder.rglob("*"):
        if p.is_file():
            fd = os.open(p, os.O_RDONLY)
            os.fsync(fd)
            if hasattr(os, "posix_fadvise"):
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            os.close(fd)


def drop_caches(*folders: Path) -> str:
    """Empty the page cache: all of it as root (what a cold start sees), else the
    files of ``folders``. Returns which was done."""
    os.sync()
    try:
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return "drop_caches"
    except OSError:
        for folder in folders:
            evict(folder) if folder.is_dir() else evict_file(folder)
        return "fadvise"


def evict_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        if hasattr(os, "posix_fadvise"):
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def _cpu() -> tuple[float, float]:
    """User and system seconds of this process and its finished children."""
    t = os.times()
    return t.user + t.children_user, t.system + t.children_system


def timed_convert(source: Path, out: Path, expert_format: str, threads: int) -> dict:
    """One conversion: wall, CPU (user, system) seconds, bytes written and read from the disk."""
    io0, (u0, s0) = io_read_bytes(), _cpu()
    t0 = time.perf_counter()
    convert(source, out, expert_format=expert_format, threads=threads)
    seconds = time.perf_counter() - t0
    (u1, s1), io1 = _cpu(), io_read_bytes()
    written = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    cpu = (u1 - u0) + (s1 - s0)
    return {"seconds": round(seconds, 2), "written_bytes": written, "bytes_per_s": written / seconds,
            "cpu_seconds": round(cpu, 2), "user_seconds": round(u1 - u0, 2), "system_seconds": round(s1 - s0, 2),
            "cpu_busy": round(cpu / (seconds * (os.cpu_count() or 1)), 3),
            "disk_read_bytes": io1 - io0 if io0 >= 0 else None}


def timed_copy(source: Path, dest: Path) -> dict:
    """`cp` of ``source`` to ``dest``, then fsync of the copy: the disk's sequential copy of this file."""
    (u0, s0) = _cpu()
    t0 = time.perf_counter()
    subprocess.run(["cp", str(source), str(dest)], check=True)
    fd = os.open(dest, os.O_RDONLY)
    os.fsync(fd)
    os.close(fd)
    seconds = time.perf_counter() - t0
    (u1, s1) = _cpu()
    nbytes = source.stat().st_size
    dest.unlink()
    return {"seconds": round(seconds, 2), "bytes_per_s": nbytes / seconds, "user_seconds": round(u1 - u0, 2),
            "system_seconds": round(s1 - s0, 2)}


def gguf_main(a, threads: int) -> dict:
    """--gguf-moe: conversion of a stacked-expert GGUF against `cp` of the same file."""
    from bench.make_gguf_moe import write as write_gguf_moe

    with tempfile.TemporaryDirectory(dir=a.workdir, prefix="ferry-bench-convert-") as tmp:
        root = Path(tmp)
        t0 = time.perf_counter()
        source = Path(a.keep_source) if a.keep_source else root / "moe.gguf"
        if not source.exists():
            part = source.with_name(source.name + ".part")
            write_gguf_moe(part, a.gguf_type, a.layers)
            part.rename(source)
        prepare = time.perf_counter() - t0
        nbytes = source.stat().st_size  # (the temporary directory and the source in it go at the block's end)
        out_dir = Path(a.out_dir) if a.out_dir else root
        rounds = []
        for i in range(a.runs):
            rnd = {"load1_before": os.getloadavg()[0]}
            for step in (("copy", "convert") if i % 2 == 0 else ("convert", "copy")):
                rnd[step + "_cache"] = drop_caches(source)
                if step == "copy":
                    rnd["copy"] = timed_copy(source, out_dir / "copy.gguf")
                else:
                    out = out_dir / f"out{i}.ferry"
                    rnd["convert"] = timed_convert(source, out, a.expert_format, threads)
                    shutil.rmtree(out)
            rnd["load1_after"] = os.getloadavg()[0]
            rounds.append(rnd)
            print(json.dumps({"round": i + 1, **rnd}), file=sys.stderr, flush=True)
    copy_s = statistics.median(r["copy"]["seconds"] for r in rounds)
    conv_s = statistics.median(r["convert"]["seconds"] for r in rounds)
    return {"mode": "gguf-moe", "gguf_type": a.gguf_type, "layers": a.layers, "source_bytes": nbytes,
            "expert_format": a.expert_format, "threads": threads, "prepare_seconds": round(prepare, 1),
            "rounds": rounds, "copy_seconds": copy_s, "convert_seconds": conv_s,
            "copy_bytes_per_s": nbytes / copy_s, "convert_source_bytes_per_s": nbytes / conv_s,
            "ratio_to_copy": copy_s / conv_s, "target_ratio": 0.5}


def quantizer_speed(ckpt: Path, threads: int, repeats: int = 3) -> dict:
    """M weights/s of the q3_nl quantizer on the first layer's experts (their own bytes, in memory)."""
    src = open_source(ckpt)
    names = [n for parts in src.spec.experts[0][:8] for n in parts.values()]
    inputs = [(src.q3_input(n), src.shape(n)[-1]) for n in names]
    weights = sum(int(np_size(src.shape(n))) for n in names)
    out = {}
    for t in sorted({1, threads}):
        best = float("inf")
        for _ in range(repeats):
            t0 = time.perf_counter()
            for native, cols in inputs:
                layout._q3_native("bench", cols, native, t)
            best = min(best, time.perf_counter() - t0)
        out[f"threads_{t}_weights_per_s"] = weights / best
        out[f"threads_{t}_weights_per_s_per_core"] = weights / best / t
    out["weights"] = weights
    out["source"] = inputs[0][0][0]
    return out


def np_size(shape) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-gb", type=float, default=4.0, help="bf16 checkpoint size")
    ap.add_argument("--workdir", default=None, help="where to write (default: a temp dir on the default disk)")
    ap.add_argument("--expert-format", default="auto")
    ap.add_argument("--source-experts", choices=("bf16", "mxfp4"), default="bf16",
                    help="how the synthetic source stores its routed experts")
    ap.add_argument("--dim", type=int, default=1024)
    ap.add_argument("--expert-ffn", type=int, default=512)
    ap.add_argument("--layers", type=int, default=None, help="layers (default 8; with --gguf-moe 2)")
    ap.add_argument("--threads", type=int, default=None, help="encoder threads (default: one per core)")
    ap.add_argument("--row-threads", type=int, default=1, help="threads each encoder splits a tensor's rows over")
    ap.add_argument("--f32-path", action="store_true", help="convert through float32 arrays (the old path)")
    ap.add_argument("--out-dir", default=None,
                    help="write the containers here instead of --workdir (e.g. /dev/shm: the source's disk then "
                         "only reads)")
    ap.add_argument("--keep-source", default=None,
                    help="write the checkpoint here and keep it (reused if it exists) instead of a temp dir")
    ap.add_argument("--runs", type=int, default=2, help="conversions (the best is reported, all are listed)")
    ap.add_argument("--gguf-moe", action="store_true",
                    help="convert a qwen3moe GGUF (bench/make_gguf_moe.py, --layers layers) against `cp` of it")
    ap.add_argument("--gguf-type", choices=("q4_0", "q4_k_m"), default="q4_0", help="with --gguf-moe")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    threads = a.threads or default_threads()
    convert_mod.ROW_THREADS = a.row_threads
    layout.NATIVE_Q3 = not a.f32_path
    a.layers = a.layers or (2 if a.gguf_moe else 8)
    if a.gguf_moe:
        result = {"machine": {"arch": platform.machine(), "cpus": os.cpu_count(), "system": platform.system(),
                              "python": platform.python_version()},
                  "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **gguf_main(a, threads)}
        print(json.dumps(result, indent=None if a.json else 1))
        return 0
    with tempfile.TemporaryDirectory(dir=a.workdir, prefix="ferry-bench-convert-") as tmp:
        root = Path(tmp)
        t0 = time.perf_counter()
        where = Path(a.keep_source) if a.keep_source else root / "ckpt"
        args = parse(["--out", str(where), "--layers", str(a.layers), "--dim", str(a.dim),
                      "--expert-ffn", str(a.expert_ffn), "--top-k", "8", "--heads", "8", "--vocab", "2048",
                      "--shards", "4", "--size-gb", str(a.size_gb), "--expert-dtype", a.source_experts])
        ckpt = where if (where / "config.json").exists() else make(args)
        prepare = time.perf_counter() - t0
        source_bytes = sum(p.stat().st_size for p in ckpt.glob("*.safetensors"))
        src = open_source(ckpt)
        weights = sum(np_size(src.shape(n)) for n in src.spec.trunk.values())
        weights += sum(np_size(src.shape(n)) for experts in src.spec.experts.values() for parts in experts
                       for n in parts.values())
        quantizer = quantizer_speed(ckpt, threads) if a.expert_format == quant3.NAME else None
        disk = sequential(root)
        runs = []
        for i in range(a.runs):
            out = (Path(a.out_dir) if a.out_dir else root) / f"out{i}.ferry"
            evict(ckpt)
            run = timed_convert(ckpt, out, a.expert_format, threads)
            run.update(source_bytes_per_s=source_bytes / run["seconds"], weights_per_s=weights / run["seconds"])
            runs.append(run)
            shutil.rmtree(out)
        disk_after = sequential(root)
    best = max(runs, key=lambda r: r["bytes_per_s"])
    slower = min(disk["read_bytes_per_s"], disk["write_bytes_per_s"], disk_after["read_bytes_per_s"],
                 disk_after["write_bytes_per_s"])
    disk_read = min(disk["read_bytes_per_s"], disk_after["read_bytes_per_s"])
    result = {
        "machine": {"arch": platform.machine(), "cpus": os.cpu_count(), "system": platform.system(),
                    "python": platform.python_version()},
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "expert_format": a.expert_format, "source_experts": a.source_experts, "threads": threads,
        "row_threads": a.row_threads, "path": "f32" if a.f32_path else "native",
        "source_bytes": source_bytes, "weights": weights, "prepare_seconds": round(prepare, 1),
        "quantizer": quantizer,
        "disk_before": disk, "disk_after": disk_after, "runs": runs,
        "convert_bytes_per_s": best["bytes_per_s"],
        "source_bytes_per_s": best["source_bytes_per_s"],
        "weights_per_s": best["weights_per_s"],
        "ratio_to_disk_read": best["source_bytes_per_s"] / disk_read,
        # the disk's own time for this conversion: reading the source, plus writing the container
        # unless it goes elsewhere (--out-dir), at the sequential bandwidths measured above
        "disk_seconds": round(source_bytes / disk_read + (0 if a.out_dir else best["written_bytes"] / min(
            disk["write_bytes_per_s"], disk_after["write_bytes_per_s"])), 2),
        "out_dir": a.out_dir,
        "target_bytes_per_s": slower / 2,
        "ratio_to_target": best["bytes_per_s"] / (slower / 2),
    }
    print(json.dumps(result, indent=None if a.json else 1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
