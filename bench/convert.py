"""Conversion throughput against the disk it runs on.

    python bench/convert.py --json [--size-gb 4] [--workdir DIR] [--expert-format auto]

Writes a deterministic Qwen3-MoE-shaped bf16 checkpoint of about --size-gb
(bench/make_synthetic.py) in --workdir, then measures in the same run, on the
same disk:

* sequential write: 1 GiB in 4 MiB direct writes, then fsync;
* sequential read: that file read back in 4 MiB direct reads;
* conversion: `convert()` of the checkpoint with the source evicted from the
  page cache first (posix_fadvise DONTNEED), so it is read from the disk.

Prints one JSON object; `ratio_to_target` >= 1 means the conversion ran at
least at half the slower of the two bandwidths (the target: it reads the
source and writes the container on the same disk).
"""
from __future__ import annotations

import argparse
import json
import mmap
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

from app.convert.convert import convert
from bench.make_synthetic import make, parse

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


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-gb", type=float, default=4.0, help="bf16 checkpoint size")
    ap.add_argument("--workdir", default=None, help="where to write (default: a temp dir on the default disk)")
    ap.add_argument("--expert-format", default="auto")
    ap.add_argument("--runs", type=int, default=2, help="conversions (the best is reported, all are listed)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(dir=a.workdir, prefix="ferry-bench-convert-") as tmp:
        root = Path(tmp)
        t0 = time.perf_counter()
        ckpt = make(parse(["--out", str(root / "ckpt"), "--layers", "8", "--dim", "1024", "--expert-ffn", "512",
                           "--top-k", "8", "--heads", "8", "--vocab", "2048", "--shards", "4",
                           "--size-gb", str(a.size_gb)]))
        prepare = time.perf_counter() - t0
        source_bytes = sum(p.stat().st_size for p in ckpt.glob("*.safetensors"))
        disk = sequential(root)
        runs = []
        for i in range(a.runs):
            out = root / f"out{i}.ferry"
            evict(ckpt)
            t0 = time.perf_counter()
            convert(ckpt, out, expert_format=a.expert_format)
            seconds = time.perf_counter() - t0
            written = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
            runs.append({"seconds": round(seconds, 2), "written_bytes": written,
                         "bytes_per_s": written / seconds, "source_bytes_per_s": source_bytes / seconds})
            shutil.rmtree(out)
        disk_after = sequential(root)
    best = max(runs, key=lambda r: r["bytes_per_s"])
    slower = min(disk["read_bytes_per_s"], disk["write_bytes_per_s"], disk_after["read_bytes_per_s"],
                 disk_after["write_bytes_per_s"])
    result = {
        "machine": {"arch": platform.machine(), "cpus": os.cpu_count(), "system": platform.system(),
                    "python": platform.python_version()},
        "expert_format": a.expert_format, "source_bytes": source_bytes, "prepare_seconds": round(prepare, 1),
        "disk_before": disk, "disk_after": disk_after, "runs": runs,
        "convert_bytes_per_s": best["bytes_per_s"],
        "target_bytes_per_s": slower / 2,
        "ratio_to_target": best["bytes_per_s"] / (slower / 2),
    }
    print(json.dumps(result, indent=None if a.json else 1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
