"""Kimi K3's vision tower in the C core at the release's widths: seconds per
image, and the projection to the release's 27 blocks.

    PYTHONPATH=. python bench/vision_tower.py [--layers 3] [--grids 16x16 32x32] [--threads 2] [--json]

Builds a random checkpoint (the tiny K3 text model with a vision tower of the
release's widths: hidden 1024, attention 1536 in 12 heads, MLP 4096, patch
14, 64 x 64 position table; ``--layers`` blocks, bf16 as released), converts
it (the tower stays bf16) and times ``ferry_vision_encode`` for each patch
grid, best of ``--rounds``. Blocks cost the same each, so the 27-block time
is the stem (patch embedding, final norm, merge, projector) plus 27 times a
block. The projector here writes the tiny text width (64) instead of 7168:
its second product is about 1 % of a 1,024-patch image (noted in the JSON).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
K3_SIZES = {"vt_hidden_size": 1024, "qkv_hidden_size": 1536, "vt_num_attention_heads": 12,
            "vt_intermediate_size": 4096, "patch_size": 14, "init_pos_emb_height": 64, "init_pos_emb_width": 64,
            "mm_hidden_size": 1024}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=3)
    ap.add_argument("--grids", nargs="+", default=["16x16", "32x32"])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    from app.convert.convert import convert
    from app.engine.binding import Vision
    from tests.kimi import tiny_k3

    results = []
    with tempfile.TemporaryDirectory(prefix="ferry-vision-bench-") as tmp:
        root = Path(tmp)
        t0 = time.monotonic()
        tiny_k3.build(root / "ckpt", vision={**K3_SIZES, "vt_num_hidden_layers": a.layers})
        out = convert(root / "ckpt", root / "k3.ferry")
        build_s = time.monotonic() - t0
        cfg = json.loads((out / "manifest.json").read_text())["model"]["vision"]
        for layers_seen in (a.layers,):
            with Vision(out, cfg, threads=a.threads) as v:
                for grid in a.grids:
                    gh, gw = (int(x) for x in grid.split("x"))
                    patches = np.random.default_rng(0).standard_normal((gh * gw, 3 * 14 * 14)).astype(np.float32)
                    best, stamps = None, None
                    for _ in range(a.rounds):
                        marks = []
                        t = time.perf_counter()
                        v.encode(patches, gh, gw, lambda s, rows: marks.append((s, time.perf_counter())))
                        total = time.perf_counter() - t
                        if best is None or total < best:
                            best, stamps = total, [(s, m - t) for s, m in marks]
                    block_times = [stamps[i + 1][1] - stamps[i][1] for i in range(layers_seen)]
                    per_block = float(np.median(block_times))
                    stem = best - sum(block_times)
                    results.append({"grid": grid, "patches": gh * gw, "positions": gh * gw // 4, "layers": layers_seen,
                                    "seconds": round(best, 4), "seconds_per_block": round(per_block, 4),
                                    "stem_seconds": round(stem, 4),
                                    "projected_27_blocks_seconds": round(stem + 27 * per_block, 3),
                                    "weight_bytes_this_tower": v.weight_bytes})
    doc = {"bench": "vision_tower", "threads": a.threads, "build_and_convert_seconds": round(build_s, 1),
           "cpu_count": os.cpu_count(), "load_1min": os.getloadavg()[0],
           "note": "projector to width 64 instead of 7168 (its second product ~1% of a 1,024-patch image)",
           "results": results}
    if a.json:
        print(json.dumps(doc, indent=1))
    else:
        for r in results:
            print(f"{r['grid']:>7} patches {r['patches']:5d} -> {r['positions']:4d} positions: "
                  f"{r['seconds_per_block']:.3f} s/block, stem {r['stem_seconds']:.3f} s, "
                  f"27 blocks ~{r['projected_27_blocks_seconds']:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
