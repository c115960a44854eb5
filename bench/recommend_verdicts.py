"""The format recommendation and the verdict of `ferry get --catalogue`
before and after the speed rule (issue 31, item 2), for OLMoE-1B-7B,
Qwen3-30B-A3B, Mixtral 8x7B and Kimi-Linear on a 24 GB and a 64 GB machine
(usable RAM: app.memory.budget.DEFAULT_SHARE of it): the table of
docs/DOWNLOAD.md, "Which format".

- before: the most accurate expert format whose whole model fits (the rule
  until 2026-12-06), its speed estimated from this machine's kernels in the
  exact arithmetic (the old default);
- after: the fastest within a 4-bit format's error (app.convert.format_choices),
  estimated from the kernels in the default arithmetic (8-bit activations).

Kernels are measured here (app.engine.speed, all cores); the disk is taken as
``--disk-gbps`` (default 3 GB/s, an Apple SSD) so the rows do not depend on
this machine's disk. The plans come from the catalogue's configs, so nothing
is downloaded.

    python bench/recommend_verdicts.py [--disk-gbps 3] [--json FILE]
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app.convert import format_choices  # noqa: E402
from app.get.catalogue import ENTRIES, plan_entry  # noqa: E402
from app.engine.speed import kernel_bytes_per_s  # noqa: E402
from app.memory.budget import DEFAULT_SHARE, MachineMemory  # noqa: E402

MODELS = ("OLMoE 1B-7B", "Qwen3-30B-A3B", "Mixtral 8x7B", "Kimi-Linear 48B-A3B")
MACHINES = (24, 64)


def rows(disk_bps: float) -> list[dict]:
    out = []
    entries = [e for e in ENTRIES if e.name in MODELS]
    for gb in MACHINES:
        memory = MachineMemory(gb << 30, int((gb << 30) * DEFAULT_SHARE), f"a {gb} GB machine")
        for e in entries:
            bound = format_choices.QUALITY_BOUND
            try:
                format_choices.QUALITY_BOUND = -1.0    # no choice within the bound: the old rule
                before = plan_entry(e, memory, disk_bps, lambda f: kernel_bytes_per_s(f, activations="exact"))
            finally:
                format_choices.QUALITY_BOUND = bound
            after = plan_entry(e, memory, disk_bps, kernel_bytes_per_s)
            out.append({"machine_gb": gb, "model": e.name,
                        **{f"{k}_{f}": getattr(r, f) for k, r in (("before", before), ("after", after))
                           for f in ("expert_format", "trunk_format", "container_bytes", "tok_per_s", "verdict",
                                     "reason")}})
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--disk-gbps", type=float, default=3.0)
    ap.add_argument("--json", help="write the rows here too")
    a = ap.parse_args(argv)
    kernels = {f: {act: kernel_bytes_per_s(f, activations=act) for act in ("exact", "auto")}
               for f in ("bf16", "q8_0", "q4_0", "q3_nl")}
    doc = {"bench": "recommend_verdicts", "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           "disk_bytes_per_s": a.disk_gbps * 1e9, "kernel_bytes_per_s": kernels, "rows": rows(a.disk_gbps * 1e9)}
    text = json.dumps(doc, indent=1)
    if a.json:
        Path(a.json).write_text(text + "\n")
    print(text)
    print("\n| machine | model | before: experts, tok/s, verdict | after: experts, tok/s, verdict |", file=sys.stderr)
    print("|---|---|---|---|", file=sys.stderr)
    for r in doc["rows"]:
        def cell(k):
            tps = r[f"{k}_tok_per_s"]
            return (f"{r[f'{k}_expert_format']} ({r[f'{k}_container_bytes'] / 1e9:.1f} GB), "
                    f"{tps:.1f} tok/s, {r[f'{k}_verdict']}" if tps else f"{r[f'{k}_expert_format']}, "
                    f"{r[f'{k}_verdict']}")
        print(f"| {r['machine_gb']} GB | {r['model']} | {cell('before')} | {cell('after')} |", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
