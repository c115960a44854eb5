"""`ferry get` figures, against a hub on 127.0.0.1 (tests/get/hub_server.py):

* plan accuracy: what `ferry get --plan` said (container bytes, RAM floor and
  recommended budget, peak disk with and without --delete-source) against
  the finished container (`ferry plan` on it) and the disk use measured
  every 2 ms during the run;
* the cost of converting while downloading: wall time of `ferry get`
  (download and conversion overlapped) against downloading every file first
  and then converting from disk, at a throttled and an unthrottled hub, in
  interleaved rounds.

    python bench/get.py [--rounds 2] [--rate 20e6] --json
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path[0] = str(Path(__file__).resolve().parents[1])   # (not bench/: its kernels.py would shadow a package)

from app.library import folder_size  # noqa: E402
from app.memory.budget import MachineMemory  # noqa: E402

MEM = MachineMemory(64 << 30, 64 << 30, "bench")



def measured(fn, root: Path):
    peak, stop = [0], threading.Event()

    def sample():
        while not stop.is_set():
            peak[0] = max(peak[0], folder_size(root))
            time.sleep(0.002)

    t = threading.Thread(target=sample)
    t.start()
    t0 = time.perf_counter()
    try:
        out = fn()
    finally:
        stop.set()
        t.join()
    return out, time.perf_counter() - t0, peak[0]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--rate", type=float, default=20e6, help="throttled hub, bytes/s per response")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    os.environ.setdefault("FERRY_NO_DIRECT_IO", "1")
    work = Path(tempfile.mkdtemp(prefix="ferry-bench-get-"))
    os.environ["HF_HOME"] = str(work / "hf-home")
    os.environ["HF_HUB_DISABLE_TELEMETRY"] = "1"
    from app.convert.convert import convert
    from app.get import hub as hubmod
    from app.get.pipeline import Getter
    from app.get.plan import plan_repo
    from app.memory.plan import plan_container
    from tests.get.hub_server import Hub
    from tests.kimi import tiny_k3
    from tests.tiny_models import build

    src = {"k3": work / "Kimi-K3-tiny", "qwen3moe": work / "tiny-qwen3moe"}
    tiny_k3.build(src["k3"], moe_ffn=256, latent=256)
    build("qwen3moe", src["qwen3moe"], shard_size="200KB")
    out = {"machine": os.uname().machine, "rate": a.rate, "models": {}}
    with Hub() as h:
        os.environ["HF_ENDPOINT"] = h.url
        repos = {"k3": "moonshotai/Kimi-K3-tiny", "qwen3moe": "Qwen/tiny-qwen3moe"}
        for k, r in repos.items():
            h.add(r, src[k])
        for k, r in repos.items():
            rec = {"source_bytes": sum(p.stat().st_size for p in src[k].glob("*.safetensors"))}
            plan = plan_repo(r, into=work, memory=MEM, disk_bps=2e9, kernel_bps=5e9)
            rec["plan"] = {"formats": [plan.trunk_format, plan.expert_format], "container": plan.container_bytes,
                           "floor": plan.floor_bytes, "recommended": plan.recommended_budget,
                           "peak_keep": plan.peak_disk_bytes, "peak_delete": plan.peak_disk_delete_bytes}
            times = {"get (overlapped)": [], "download then convert": [], "get --delete-source": []}
            for rnd in range(a.rounds):
                for rate in (None, a.rate):
                    h.rate = rate
                    tag = "unthrottled" if rate is None else f"{rate / 1e6:g} MB/s"
                    into = work / f"{k}-{rnd}-{tag}"
                    res, dt, peak = measured(lambda: Getter(r, into / "g", memory=MEM).run(), into)
                    times["get (overlapped)"].append((tag, round(dt, 3)))
                    if rnd == 0:
                        real = plan_container(res, 4096)
                        got = sum(p.stat().st_size for p in res.rglob("*") if p.is_file())
                        rec.setdefault("actual", {})[tag] = {
                            "container_files": got, "floor": real.floor, "recommended_here": None,
                            "peak_keep_measured": peak}
                    res2, dt2, peak2 = measured(lambda: Getter(r, into / "d", memory=MEM, delete_source=True).run(),
                                                into / "d")
                    times["get --delete-source"].append((tag, round(dt2, 3)))
                    if rnd == 0:
                        rec["actual"][tag]["peak_delete_measured"] = peak2

                    def sequential():
                        repo = hubmod.open_repo(r)
                        folder = into / "s" / src[k].name
                        for f in repo.files:
                            hubmod.download(repo, f.name, folder)
                        return convert(folder, into / "s" / "x.ferry", trunk_format=plan.trunk_format,
                                       expert_format=plan.expert_format)
                    _, dt3, _ = measured(sequential, into / "s")
                    times["download then convert"].append((tag, round(dt3, 3)))
                    shutil.rmtree(into)
            rec["seconds"] = times
            out["models"][k] = rec
    shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
