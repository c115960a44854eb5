"""The Llama-family attention kernels' rates on this CPU, one thread.

    python bench/attention.py [--head-dim 64] [--positions 256 1024 4096] [--queries 4] [--json]

Builds bench/attention.c with the core's kernel sources (cc, -O3, the build's
flags) and runs it for each number of cached positions: for every kernel set
this CPU runs, G MACs/s of ``att_scores`` and ``att_wsum`` and ns per value of
``att_softmax``. There are two states, measured by the thread's CPU clock:
"cached" (K and V again, in L2 while they fit) and "cold" (a 64 MB buffer
walked before each call). The "ATTENTION IN TILES" section of
docs/bench-log/2026-12-05.md has the figures. The ymm FMA peak of a core is what
bench/ceiling.py calls ``f32_fma``.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCES = [ROOT / "core_c" / "src" / f for f in ("formats.c", "kernels.c", "kernels_avx2.c", "kernels_neon.c", "kernels_q2vq.c",
                                                  "quant3.c", "quant_blocks.c", "kernels_iq4xs.c")]


def build(tmp: Path) -> Path:
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        raise SystemExit("attention.py needs a C compiler (cc)")
    exe = tmp / "attention"
    subprocess.run([cc, "-std=c11", "-O3", "-ffp-contract=off", "-I", str(ROOT / "core_c" / "include"),
                    *map(str, SOURCES), str(ROOT / "bench" / "attention.c"), "-lm", "-o", str(exe)], check=True)
    return exe


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--positions", type=int, nargs="+", default=[256, 1024, 4096])
    ap.add_argument("--queries", type=int, default=4, help="queries in one call (1-16): the heads sharing a KV head, times the tokens of a prompt block")
    ap.add_argument("--reps", type=int, default=None, help="calls per measurement (default: ~4 M MACs' worth)")
    ap.add_argument("--json", action="store_true", help="one line of JSON (default: indented)")
    a = ap.parse_args()
    out = {"date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "cpus": os.cpu_count(),
           "load_before": os.getloadavg()[0], "runs": []}
    with tempfile.TemporaryDirectory() as tmp:
        exe = build(Path(tmp))
        for n in a.positions:
            reps = a.reps or max(20, 4_000_000 // (n * a.head_dim))
            res = subprocess.run([str(exe), str(a.head_dim), str(n), str(a.queries), str(reps)],
                                 check=True, capture_output=True, text=True)
            out["runs"].append(json.loads(res.stdout))
    out["load_after"] = os.getloadavg()[0]
    json.dump(out, sys.stdout, indent=None if a.json else 2)
    print()


if __name__ == "__main__":
    main()
