"""Ferry against the public streaming engine (WARP, formerly WASTE: github.com/sqliteai/warp, forked as
Penguinjanator/warp) on the same synthetic Kimi-Linear, each engine converting the same bf16 files.

    python bench/vs_streaming_engine.py --json --peer /path/to/warp [--workdir DIR] [--rounds 3]
        [--tokens 48] [--cache-share 0.25]
    FERRY_PEER_ENGINE=/path/to/warp python bench/vs_streaming_engine.py --json

--peer (or FERRY_PEER_ENGINE) names a built checkout of the peer (``make`` there): its ``waste``
binary and its ``tools/convert.py``, which runs under this Python (it needs torch: ``--peer-python``
names another interpreter). Without one the script refuses in one line; nothing of the peer is in
this repository.

The checkpoint: bench/make_synthetic.py --family kimi_linear in bench/stream.py's Kimi-Linear shape
(KIMI_SHAPES: 8 layers, 3 KDA : 1 MLA, 7 MoE layers of 256 experts, top 8, expert FFN 512, one shared
expert) at width ``--dim`` (256, so that q3_nl's 256-value blocks fit), with the safetensors index a
release ships (the peer's converter reads the tensor map from it) and a tiktoken.model beside the
tokenizer.json (the peer's engine reads only the former): token i is the byte 0x20 + i, so both engines
see the same vocabulary. Ferry converts it with a q4_0 trunk
and q3_nl experts; the peer with its converter's defaults (VQ3R experts at 3 bits/weight, a Q4G trunk).
Both containers and the checkpoint stay in ``--workdir`` and are reused by the next run.

Decode, both engines at their defaults (threads, readers, activations), each run a fresh process:

* tight: each engine's cache holds ``--cache-share`` of its own expert set (budget = its floor plus
  that), from cold (the peer's learned hotlist, ``usage.waste``, removed first);
* cached: every expert in RAM. Ferry: its default budget, the tokens decoded once and then timed a
  second time (bench/stream.py's compute_floor); the peer: budget = its floor plus its whole expert
  set, a first ``run --learn`` writing its hotlist, then the timed run of the same prompt, which opens
  warm from it (greedy both times, so it routes the same).

Both decode ``--tokens`` greedy tokens after the same 16-token prompt (random ids; the peer gets them as
text, one character a token, and may stop early at its end-of-text token). Ferry's greedy continuation
is computed once (every expert in RAM), and each timed run replays prompt and continuation
(bench/stream.py's decode_run): the same tokens, and the same expert choices, as its greedy decode. The peer's decode speed is what its
``run`` prints (tokens over the sum of its per-token step times: the prompt excluded, as in Ferry's),
its hit rate its own counts, and its bytes per token what its process read from the disk (getrusage)
less what a one-token run of the same prompt read, over the tokens between (its lookahead's reads are
not misses: its misses times its record size is reported beside, ``misses_bytes_per_token``). Rounds are
interleaved, the engine that goes first alternating; each figure is the median round, and the ratio
is the median of the rounds' ratios (a shared machine slows both alike within a round).

Prints one JSON object (``--json``: on one line, for bench/performance.py record).
"""
from __future__ import annotations

import argparse
import base64
import json
import os
import platform
import re
import resource
import shutil
import struct
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

from bench.stream import KIMI_SHAPES, PROMPT, compute_floor, decode_run, median_run  # noqa: E402

#: The environment variable naming the peer's checkout when --peer is not given.
PEER_ENV = "FERRY_PEER_ENGINE"
#: Ferry's formats for the comparison (the issue's: q4_0 trunk, q3_nl experts).
FERRY_FORMATS = {"trunk_format": "q4_0", "expert_format": "q3_nl"}
#: The context both engines open with.
N_CTX = 256
#: The peer's `run` summary line (cli/main.c): decode tokens, seconds, tok/s, expert hits and misses.
PEER_STATS = re.compile(r"\[(\d+) tokens, ([\d.]+) s, ([\d.]+) tok/s \| experts (\d+) hit / (\d+) miss")


def peer_dir(a) -> Path | None:
    """The peer's checkout from --peer or $FERRY_PEER_ENGINE, if it has a built binary and its converter."""
    where = a.peer or os.environ.get(PEER_ENV)
    if not where:
        return None
    p = Path(where).expanduser()
    return p if (p / "waste").is_file() and os.access(p / "waste", os.X_OK) and (p / "tools" / "convert.py").is_file() \
        else None


def write_index(ckpt: Path) -> None:
    """model.safetensors.index.json for a single-file checkpoint: every tensor in model.safetensors (a
    release's layout; the peer's converter reads its tensor map from the index, Ferry's reads either)."""
    st = ckpt / "model.safetensors"
    with open(st, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    weight_map = {k: st.name for k in header if k != "__metadata__"}
    (ckpt / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": st.stat().st_size}, "weight_map": weight_map}))


#: The synthetic vocabulary as bytes for the peer's tokenizer (tiktoken's rank file, which its converter copies
#: and its engine reads; Ferry reads tokenizer.json): token i is the one byte 0x20 + i, so the synthetic's
#: 96 tokens are the printable ASCII characters and a prompt of token ids is a string of as many characters.
BYTE0 = 0x20


def write_byte_tokenizer(ckpt: Path, vocab: int) -> None:
    """tiktoken.model for the synthetic: one single-byte token per id (no merges), as the release ships one."""
    if vocab > 256 - BYTE0:
        raise SystemExit(f"vs_streaming_engine: a vocabulary of {vocab} has no one-byte spelling")
    (ckpt / "tiktoken.model").write_text("".join(f"{base64.b64encode(bytes([BYTE0 + i])).decode()} {i}\n"
                                                 for i in range(vocab)))


def as_text(ids) -> str:
    return "".join(chr(BYTE0 + int(i)) for i in ids)


def shape_args(dim: int) -> list[str]:
    shape = list(KIMI_SHAPES["kimi_linear"])
    shape[shape.index("--dim") + 1] = str(dim)
    return shape


def prepare(a, work: Path, peer: Path) -> dict:
    """Write the checkpoint and convert it with both engines (each step skipped when a previous run did it)."""
    from app.convert.convert import convert
    from bench.make_synthetic import make, parse

    tag = "kimi_linear-" + "-".join(shape_args(a.dim)[1::2])
    ckpt, ferry, theirs = work / f"{tag}-ckpt", work / f"{tag}.ferry", work / f"{tag}.waste"
    seconds = {}
    if not (ckpt / "model.safetensors.index.json").exists():
        shutil.rmtree(ckpt, ignore_errors=True)
        make(parse(["--out", str(ckpt), "--family", "kimi_linear", *shape_args(a.dim)]))
        write_byte_tokenizer(ckpt, json.loads((ckpt / "config.json").read_text())["vocab_size"])
        write_index(ckpt)
    if not (work / f"{tag}.ferry.done").exists():
        shutil.rmtree(ferry, ignore_errors=True)
        t0 = time.perf_counter()
        convert(ckpt, ferry, **FERRY_FORMATS)
        seconds["ferry"] = round(time.perf_counter() - t0, 1)
        (work / f"{tag}.ferry.done").write_text("converted\n")
    if not (work / f"{tag}.waste.done").exists():
        t0 = time.perf_counter()
        # its defaults; resumable, so a run stopped half-way continues where it was
        done = subprocess.run([a.peer_python or sys.executable, str(peer / "tools" / "convert.py"),
                               "--src", str(ckpt), "--out", str(theirs)], capture_output=True, text=True)
        if done.returncode:
            raise SystemExit("vs_streaming_engine: the peer's converter failed: "
                             + (done.stderr.strip().splitlines() or ["(no message)"])[-1])
        seconds["peer"] = round(time.perf_counter() - t0, 1)
        (work / f"{tag}.waste.done").write_text("converted\n")
    return {"checkpoint": ckpt, "ferry": ferry, "peer": theirs, "convert_seconds": seconds}


def peer_cmd(peer: Path, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    """One `waste` command; ``read_bytes`` on the result: what it read from the block device (direct reads
    included: getrusage's ru_inblock of the finished child, 512-byte units)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_inblock
    done = subprocess.run([str(peer / "waste"), *args], capture_output=True, text=True, input=stdin)
    done.read_bytes = 512 * (resource.getrusage(resource.RUSAGE_CHILDREN).ru_inblock - before)
    return done


def peer_facts(peer: Path, container: Path) -> dict:
    """The peer's plan at N_CTX (its JSON) and its expert set: bytes, experts per layer, record size."""
    plan = json.loads(peer_cmd(peer, "plan", str(container), "--ctx", str(N_CTX), "--json").stdout)
    info = json.loads(peer_cmd(peer, "info", str(container), "--json").stdout)
    banks = sorted(container.glob("experts-L*.bin"))
    expert_bytes = sum(b.stat().st_size for b in banks)
    n_experts = int(info.get("n_experts") or info.get("experts"))
    # (its bench prints a banner, then the JSON line)
    bench = json.loads(peer_cmd(peer, "bench", str(container), "-n", "1", "--ctx", str(N_CTX),
                                "--json").stdout.strip().splitlines()[-1])
    return {"version": peer_cmd(peer, "version").stdout.strip(), "direct_io": bench["direct_io"],
            "floor_bytes": plan["floor_bytes"],
            "min_expert_cache": plan["min_expert_cache"], "expert_bytes": expert_bytes,
            "record_bytes": expert_bytes / (len(banks) * n_experts), "moe_layers": len(banks),
            "experts": n_experts, "info": info}


def peer_run(peer: Path, container: Path, prompt: str, tokens: int, budget: int, learn: bool = False) -> dict:
    """One `waste run` (greedy, raw: the synthetic has no chat markup), its decode figures from the summary
    line it prints."""
    # the prompt on standard input ("-": it may start with a dash)
    args = ["run", str(container), "-", "--raw", "-n", str(tokens), "--temp", "0", "--ctx", str(N_CTX),
            "--budget", str(budget)] + (["--learn"] if learn else [])
    done = peer_cmd(peer, *args, stdin=prompt)
    m = PEER_STATS.search(done.stderr)
    if done.returncode or not m:
        raise SystemExit("vs_streaming_engine: the peer's run failed: "
                         + (done.stderr.strip().splitlines() or ["(no message)"])[-1])
    n, _, tps, hits, misses = int(m[1]), float(m[2]), float(m[3]), int(m[4]), int(m[5])
    return {"tokens": n, "tok_per_s": tps, "s_per_token": 1.0 / tps,
            "hit_rate": hits / (hits + misses) if hits + misses else None, "misses": misses,
            "read_bytes": done.read_bytes}


def peer_mode(peer: Path, facts: dict, container: Path, prompt: str, tokens: int, mode: str, share: float) -> dict:
    """The peer's decode at the tight budget or every expert cached. Bytes per token: what the run read
    less what the same run stopped after its first token read (opening, the prompt), over the tokens
    between; its lookahead's reads count (its miss count leaves them out: `misses_bytes_per_token`)."""
    usage = container / "usage.waste"
    usage.unlink(missing_ok=True)
    if mode == "tight":
        cache = int(share * facts["expert_bytes"])
        budget = max(facts["floor_bytes"], facts["floor_bytes"] - facts["min_expert_cache"] + cache)
    else:
        budget = facts["floor_bytes"] + facts["expert_bytes"]
        peer_run(peer, container, prompt, tokens, budget, learn=True)  # writes usage.waste: the next open is warm
    base = peer_run(peer, container, prompt, 1, budget)
    run = peer_run(peer, container, prompt, tokens, budget)
    usage.unlink(missing_ok=True)
    steps = max(1, run["tokens"] - base["tokens"])
    run["bytes_per_token"] = max(0, run.pop("read_bytes") - base["read_bytes"]) / steps
    run["misses_bytes_per_token"] = run.pop("misses") * facts["record_bytes"] / run["tokens"]
    run["budget_bytes"] = budget
    return run


def ferry_worker(job: dict) -> dict:
    """One Ferry run in a fresh process: decode at the tight budget, or every expert cached."""
    container, tokens = Path(job["container"]), job["tokens"]
    if job["mode"] == "tight":
        r = decode_run(container, tokens, ram_budget=job["budget"])
        return {k: r[k] for k in ("tok_per_s", "s_per_token", "hit_rate", "bytes_per_token", "stall_s_per_token",
                                  "profile_s_per_token", "cache_slots", "direct_io")} | {"budget_bytes": job["budget"]}
    r = compute_floor(container, tokens, passes=1)
    return {"tok_per_s": 1.0 / r["s_per_token"], "s_per_token": r["s_per_token"], "hit_rate": r["hit_rate"],
            "bytes_per_token": r["bytes_per_token"], "budget_bytes": 0}


def ferry_greedy(container: Path, prompt: list[int], n: int) -> list[int]:
    """The prompt and Ferry's greedy continuation of it (its default activations, every expert in RAM): what
    its decode then replays is exactly what a greedy decode computes (placement never changes output)."""
    from app.engine.binding import Engine

    with Engine(container, n_ctx=N_CTX) as engine:
        s = engine.session(N_CTX)
        out = list(prompt)
        logits = s.eval(out)
        for _ in range(n):
            out.append(int(np.argmax(logits)))
            logits = s.eval(out[-1:])
    return out


def ferry_run(container: Path, tokens: list[int], mode: str, budget: int) -> dict:
    job = {"container": str(container), "tokens": tokens, "mode": mode, "budget": budget}
    done = subprocess.run([sys.executable, __file__, "--worker", json.dumps(job)], capture_output=True, text=True)
    if done.returncode:
        raise SystemExit("vs_streaming_engine: Ferry's run failed: "
                         + (done.stderr.strip().splitlines() or ["(no message)"])[-1])
    return json.loads(done.stdout)


def summarize(runs: dict[str, list[dict]]) -> dict:
    out = {}
    for eng in ("ferry", "peer"):
        med = median_run(runs[eng])
        out[eng] = {k: med[k] for k in ("tok_per_s", "s_per_token", "rounds_s_per_token", "hit_rate",
                                        "bytes_per_token", "budget_bytes") if k in med}
        for k in ("profile_s_per_token", "cache_slots", "direct_io", "tokens", "misses_bytes_per_token"):
            if k in med:
                out[eng][k] = med[k]
    ratios = [p["s_per_token"] / f["s_per_token"] for f, p in zip(runs["ferry"], runs["peer"])]
    out["ferry_over_peer"] = float(np.median(ratios))
    out["rounds_ferry_over_peer"] = ratios
    out["bytes_per_token_peer_over_ferry"] = (out["peer"]["bytes_per_token"] / out["ferry"]["bytes_per_token"]
                                              if out["ferry"]["bytes_per_token"] else None)
    return out


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--peer", default=None, help=f"the peer's built checkout (default: ${PEER_ENV})")
    ap.add_argument("--peer-python", default=None, help="the Python (with torch) its converter runs under")
    ap.add_argument("--workdir", default=None, help="where the checkpoint and both containers are kept "
                                                    "(default: ~/.cache/ferry-bench/vs_streaming_engine)")
    ap.add_argument("--dim", type=int, default=256, help="the model's width (a multiple of 256 for q3_nl)")
    ap.add_argument("--cache-share", type=float, default=0.25, help="tight: the share of the experts cached")
    ap.add_argument("--tokens", type=int, default=48, help="decode steps per run")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds of every mode")
    ap.add_argument("--modes", default="tight,cached", help="tight, cached or both")
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    if a.worker:
        return a
    if a.dim < 256 or a.dim % 256:
        ap.error("--dim must be a multiple of 256 (q3_nl experts store rows in blocks of 256)")
    if not 0.0 < a.cache_share < 1.0:
        ap.error("--cache-share must be a fraction between 0 and 1 (e.g. 0.25)")
    if a.tokens < 1 or a.rounds < 1 or a.tokens + PROMPT > N_CTX:
        ap.error(f"--tokens must be 1 to {N_CTX - PROMPT} and --rounds at least 1")
    modes = [m for m in a.modes.split(",") if m]
    if not modes or any(m not in ("tight", "cached") for m in modes):
        ap.error("--modes takes tight, cached or both, separated by commas")
    a.modes = modes
    a.peer_path = peer_dir(a)
    if a.peer_path is None:
        ap.exit(2, f"vs_streaming_engine: the public streaming engine is not here: give --peer (or ${PEER_ENV}) "
                   "a built checkout of github.com/sqliteai/warp (its waste binary from make, and tools/convert.py)\n")
    return a


def main(argv=None) -> int:
    a = parse_args(argv)
    if a.worker:
        print(json.dumps(ferry_worker(json.loads(a.worker))))
        return 0
    from app.engine.binding import Engine, container_plan

    peer = a.peer_path
    work = Path(a.workdir or Path.home() / ".cache" / "ferry-bench" / "vs_streaming_engine")
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    made = prepare(a, work, peer)
    plan = container_plan(made["ferry"], N_CTX)
    facts = peer_facts(peer, made["peer"])
    with Engine(made["ferry"], n_ctx=N_CTX, threads=1) as probe:
        vocab = probe.info.vocab
    ids = [int(t) for t in np.random.default_rng(5).integers(3, min(vocab, 95), PROMPT)]  # (not 0x7f, DEL)
    prompt = as_text(ids)
    tokens = ferry_greedy(made["ferry"], ids, a.tokens)
    ferry_tight = plan.floor_bytes + plan.q8_bytes + int(a.cache_share * plan.expert_bytes)  # q8: the default's scratch
    runs = {m: {"ferry": [], "peer": []} for m in a.modes}
    load = []
    for r in range(a.rounds):
        load.append(os.getloadavg()[0])
        for m in a.modes:
            order = ("ferry", "peer") if (r + a.modes.index(m)) % 2 == 0 else ("peer", "ferry")
            for eng in order:
                runs[m][eng].append(ferry_run(made["ferry"], tokens, m, ferry_tight) if eng == "ferry" else
                                    peer_mode(peer, facts, made["peer"], prompt, a.tokens, m, a.cache_share))
    result = {
        "machine": {"arch": platform.machine(), "cpus": os.cpu_count()},
        "peer": {"path": str(peer), "version": facts["version"], "model": facts["info"]},
        "model": {"family": "kimi_linear", "shape": shape_args(a.dim), "vocab": vocab, "ferry_formats": FERRY_FORMATS,
                  "peer_formats": "its converter's defaults"},
        "containers": {
            "ferry": {"floor_bytes": plan.floor_bytes, "expert_bytes": plan.expert_bytes,
                      "record_bytes": plan.record_bytes},
            "peer": {k: facts[k] for k in ("floor_bytes", "min_expert_cache", "expert_bytes", "record_bytes",
                                           "direct_io")}},
        "record_bytes_peer_over_ferry": facts["record_bytes"] / plan.record_bytes,
        "convert_seconds": made["convert_seconds"], "prepare_seconds": round(time.perf_counter() - t0, 1),
        "cache_share": a.cache_share, "tokens": a.tokens, "rounds": a.rounds,
        "rounds_load_1min": load, "load_1min_at_end": os.getloadavg()[0],
    }
    result.update({m: summarize(runs[m]) for m in a.modes})
    print(json.dumps(result, indent=None if a.json else 1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
