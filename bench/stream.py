"""The streaming engine on a synthetic MoE model larger than its RAM budget.

    python bench/stream.py --json [--size-gb 2] [--budget-frac 0.25] [--tokens 24] [--rounds 3]
    python bench/stream.py --json --family k3 --routing [--margins 0,0.02,0.1] [--dispatch]
    python bench/stream.py --json --family kimi_linear --dim 256 --trunk-format q4_0 --expert-format q3_nl \
                           --activations exact,auto,q8 [--rounds 9] [--tokens 32]

Writes a deterministic Qwen3-MoE-shaped checkpoint (bench/make_synthetic.py;
--family k3 or kimi_linear: those releases' layouts, expert counts, top-k and
routing, narrow matrices: KIMI_SHAPES), converts it with `ferry convert`
(q4_1 experts), then measures in one run:

* streaming: decode with the cache, overlapped reads and the lookahead;
* synchronous: the same budget with overlap and lookahead off;
* overlap without the lookahead, and the lookahead with its gate off (every
  prediction read, however often its layer and rank miss);
* the compute floor: the same tokens with every expert already in RAM;
* with --routing, the opt-in modes: fewer experts per token (3k/4, k/2, k/4)
  and cache-aware margins (0 = exact, set explicitly), each with bytes/token,
  hit rate, s/token, stall, lookahead accuracy, prefetched records and the
  dispatch's own time per MoE layer (the session profile);
* with --dispatch, the expert dispatch's own CPU time per MoE layer and token
  (ferry_profile_part.dispatch_seconds), this build against the commit
  before the one MoE loop (bench/baseline_core.py builds it outside the
  repository with the same timer), for a prompt chunk and for single steps,
  every expert in RAM and at the bench's budget, in interleaved rounds of
  fresh processes (bench/dispatch_worker.py);
* the disk floor: the bytes each token must read (the fewest any mode read
  at this budget), over the best bandwidth the disk gave in any round to the
  engine's own pattern (random whole records, direct I/O, the same number of
  reader threads).

With --activations (a list of activation modes; --before-tree adds another
checkout at its defaults, "before") it measures those instead of the
placement modes, each round of each in fresh processes: decode at the budget (streaming), with every expert
in RAM (wall time, the engine's threads) and with every expert in RAM on one
thread (the process's CPU time per token, best of 5 passes, which a loaded
machine disturbs least), each mode in the same interleaved rounds, with each round's ratio to
the first mode. --dim, --trunk-format and --expert-format shape the Kimi
synthetic (--dim 256 lets q3_nl experts' 256-value rows fit).

The modes run in interleaved rounds (streaming, synchronous, overlap without
lookahead, the routing modes, compute floor, disk bandwidth; then again, each
round starting one mode later), and each figure is the median over the
rounds, so a noisy neighbour slows every mode alike. With
--workdir the converted model is kept there and reused by the next run with
the same flags.

Prints one JSON object. Ratios are what to compare: the machine is shared.
"""
from __future__ import annotations

import argparse
import json
import mmap
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere
if os.environ.get("FERRY_BENCH_TREE"):  # --before-tree's worker: that tree's app and core measured by this code
    sys.path.insert(0, os.environ["FERRY_BENCH_TREE"])

from app.convert.convert import convert
from app.activations import ACTIVATION_CHOICES
from app.engine.binding import Engine, container_plan
from app.engine.speed import run_threads
from bench.make_synthetic import make, parse

PROMPT = 16


def decode_run(container: Path, tokens: list[int], routing: tuple | None = None, prompt: int = PROMPT,
               **opts) -> dict:
    with Engine(container, n_ctx=256, **opts) as engine:
        s = engine.session(256)
        if routing:
            s.set_routing(*routing)
        s.eval(tokens[:prompt])
        s.set_profiling(True)  # the decode's dispatch time per MoE layer
        before = s.stats()
        disk0 = disk_sectors()
        t0 = time.perf_counter()
        for t in tokens[prompt:]:
            s.eval([t])
        seconds = time.perf_counter() - t0
        disk1 = disk_sectors()
        after = s.stats()
        prof = s.profile()["decode"]
        n = len(tokens) - prompt
        d = lambda k: getattr(after, k) - getattr(before, k)  # noqa: E731
        uses = d("decode_hits") + d("decode_misses")
        return {
            "tok_per_s": n / seconds, "s_per_token": seconds / n,
            "hit_rate": d("decode_hits") / uses if uses else None,
            "bytes_per_token": d("bytes_read") / n,
            "stall_s_per_token": d("stall_seconds") / n,
            "lookahead_accuracy": (d("lookahead_correct") / d("lookahead_predicted")
                                   if d("lookahead_predicted") else None),
            "prefetch_issued": d("prefetch_issued"), "prefetch_used": d("prefetch_used"),
            "prefetch_wasted": d("prefetch_wasted"), "prefetch_gated": d("prefetch_gated"),
            # the lookahead gate at the end: per layer, the ranks of its prediction it reads
            # (0 for dense layers and the first MoE layer, which it never predicts)
            "gate_open_ranks": [int((row >= 0.5).sum()) for row in engine.lookahead_gate()],
            "dispatch_us_per_layer": (1e6 * prof["dispatch_seconds"] / prof["moe_layers"]
                                      if prof["moe_layers"] else None),
            "swap_rate": d("routed_swaps") / d("routed_choices") if d("routed_choices") else None,
            "cache_slots": engine.info.cache_slots, "direct_io": engine.info.direct_io,
            "io_note": engine.info.io_note,
            # where the decode's time went (the session profile), per token
            "profile_s_per_token": {k: prof[k] / n for k in ("expert_ffn_seconds", "expert_wait_seconds",
                                                             "dispatch_seconds", "attention_seconds",
                                                             "pool_wait_seconds", "other_seconds")},
            "matmul_s_per_token": {f: m["seconds"] / n for f, m in prof["matmul"].items()},
            # every process's disk traffic less this decode's reads, while it ran (a shared machine)
            "disk_others_bytes_per_s": ({"read": max(0.0, disk1["read"] - disk0["read"] - d("bytes_read")) / seconds,
                                         "written": (disk1["written"] - disk0["written"]) / seconds}
                                        if disk0 and disk1 else None),
            # the disk's mean read request during the decode (its buffers' contiguity: record_slots)
            **disk_requests(disk0, disk1, seconds),
        }


def compute_floor(container: Path, tokens: list[int], passes: int = 1, **opts) -> dict:
    """Every expert in RAM: decode the same tokens, then time `passes` more passes (the best one)."""
    with Engine(container, n_ctx=256, **opts) as engine:
        s = engine.session(256)
        s.eval(tokens[:PROMPT])
        for t in tokens[PROMPT:]:
            s.eval([t])
        best = None
        for _ in range(passes):
            s.reset()  # (not truncate: a recurrent model such as Kimi-Linear or K3 cannot rewind)
            s.eval(tokens[:PROMPT])
            before = s.stats()
            t0, c0 = time.perf_counter(), time.process_time()
            for t in tokens[PROMPT:]:
                s.eval([t])
            n = len(tokens) - PROMPT
            after = s.stats()
            hits, misses = (after.decode_hits - before.decode_hits), (after.decode_misses - before.decode_misses)
            # (the process's CPU time: with one thread, the compute's own, whatever else the machine runs)
            run = {"s_per_token": (time.perf_counter() - t0) / n, "cpu_s_per_token": (time.process_time() - c0) / n,
                   "hit_rate": hits / (hits + misses) if hits + misses else None,
                   "bytes_per_token": (after.bytes_read - before.bytes_read) / n}
            best = run if best is None or run["cpu_s_per_token"] < best["cpu_s_per_token"] else best
        return best


#: The piece the engine's readers share a record in (FE_IO_CHUNK, core_c/src/io.h).
IO_PIECE = 4 << 20


#: Transparent huge pages: one 2 MiB page is physically contiguous.
HUGE_PAGE = 2 << 20


def record_slots(n: int, record: int, contiguous: bool = False) -> list[tuple[mmap.mmap, memoryview]]:
    """``n`` page-aligned buffers of one record each, private anonymous
    memory zeroed in order when made, as the engine makes its expert-cache
    slots (core_c/src/common.c: fe_alloc_pages, posix_memalign + memset);
    ``contiguous``: backed by transparent huge pages where the system gives
    them (Linux, MADV_HUGEPAGE; elsewhere the same as not). Why it matters
    (docs/KIMI.md, "Speed model"): on a virtio disk the block layer makes
    one request of at most 128 physically separate pieces of memory, so a
    direct read into scattered 4 KiB pages goes to the disk as ~0.5 MiB
    requests and into huge pages as 4 MiB ones, and the disk's rate follows
    the request's size (this VM: 0.9-1.1 against 1.3-1.9 GB/s). (Python's
    own mmap(-1, n) is shared memory, never huge pages: not used.)"""
    flags = getattr(mmap, "MAP_PRIVATE", 0) | getattr(mmap, "MAP_ANONYMOUS", 0)
    advice = getattr(mmap, "MADV_HUGEPAGE", None) if contiguous else None
    out = []
    for _ in range(n):
        m = mmap.mmap(-1, record + (HUGE_PAGE if advice else 0), flags=flags)
        start = 0
        if advice is not None:
            a = np.frombuffer(m, dtype=np.uint8)
            start = -a.ctypes.data % HUGE_PAGE
            del a
            m.madvise(advice, start, record)
        np.frombuffer(m, dtype=np.uint8)[start:start + record].fill(0)
        out.append((m, memoryview(m)[start:start + record]))
    return out


def ceiling_at_request(size: float | None, probes: list[tuple[float | None, float]]) -> float:
    """The disk's rate for reads that reach it as requests of ``size`` bytes,
    from probes [(mean request bytes, bytes/s)] at different sizes: each
    request costs a fixed time plus its bytes at a rate (seconds a byte =
    t0 / size + 1 / rate), the line through the smallest and largest
    requests probed, ``size`` held within them (so the result is between
    their rates). Without sizes: the best probe's rate."""
    known = sorted((q, r) for q, r in probes if q)
    if size is None or len(known) < 2 or known[-1][0] - known[0][0] < 1:
        return max(r for _, r in probes)
    (s1, r1), (s2, r2) = known[0], known[-1]
    x = 1.0 / min(max(size, s1), s2)
    t0 = (1.0 / r1 - 1.0 / r2) / (1.0 / s1 - 1.0 / s2)
    return 1.0 / (1.0 / r2 + t0 * (x - 1.0 / s2))


def disk_bandwidth(container: Path, record: int, readers: int, seconds: float = 3.0, pieces: bool = False,
                   contiguous: bool = False) -> dict:
    """Random whole-record direct reads with `readers` threads, like the
    engine's, each record into the next of a few record-sized buffers made
    as the engine makes its cache's slots (record_slots; ``contiguous``: in
    huge pages). ``pieces``: the engine's own pattern (core_c/src/io.c):
    the readers share the record at the head of the queue in IO_PIECE
    pieces, records one after another (one reader reads whole records).
    With the disk's mean read request and its busy share meanwhile
    (/proc/diskstats, every process's)."""
    import threading

    banks = sorted((container / "experts").glob("layer_*.bin"))
    flags = os.O_RDONLY | getattr(os, "O_DIRECT", 0)
    fds = [os.open(b, flags) for b in banks]
    n_records = (banks[0].stat().st_size - 4096) // record
    piece = min(IO_PIECE, record) if pieces and readers > 1 else record
    # more buffers than records in flight (each reader on its own record, or the readers on the head's pieces)
    slots = record_slots((readers if piece == record else -(-readers * piece // record)) + 2, record, contiguous)
    done = [0] * readers
    rng = np.random.default_rng(readers)
    lock = threading.Lock()
    head = {"fd": 0, "off": 0, "left": 0, "slot": 0, "at": 0, "n": 0}

    def take() -> tuple[int, int, memoryview]:
        with lock:
            if not head["left"]:
                head.update(fd=fds[rng.integers(len(fds))], off=4096 + int(rng.integers(n_records)) * record,
                            left=record, slot=head["n"] % len(slots), at=0, n=head["n"] + 1)
            n = min(piece, head["left"])
            out = (head["fd"], head["off"], slots[head["slot"]][1][head["at"]:head["at"] + n])
            head["off"] += n
            head["at"] += n
            head["left"] -= n
            return out

    disk0 = disk_sectors()
    stop = time.perf_counter() + seconds

    def work(i: int) -> None:
        while time.perf_counter() < stop:
            fd, off, into = take()
            done[i] += os.preadv(fd, [into], off)

    elapsed = run_threads(work, readers)
    disk1 = disk_sectors()
    for fd in fds:
        os.close(fd)
    for m, view in slots:
        view.release()
        m.close()
    return {"bytes_per_s": sum(done) / elapsed, "readers": readers, "direct": bool(getattr(os, "O_DIRECT", 0)),
            "piece": piece, "contiguous": contiguous, **disk_requests(disk0, disk1, elapsed)}


def median_run(runs: list[dict]) -> dict:
    """The round with the median seconds per token (so its other figures belong to it)."""
    ordered = sorted(runs, key=lambda r: r["s_per_token"])
    out = dict(ordered[len(ordered) // 2])
    out["rounds_s_per_token"] = [r["s_per_token"] for r in runs]
    return out


def prepare(a, where: Path) -> Path:
    """Write and convert the synthetic model, or reuse the one a run with the same flags left."""
    if a.family != "qwen3moe":
        return prepare_kimi(a, where)
    f = synth_formats(a)
    tag = (f"synth-{a.size_gb:g}gb-{'corr' if a.correlated else 'rand'}"
           + ("" if f == {"expert_format": "q4_1"} else "-" + "-".join(f.values())))
    container = where / f"{tag}.ferry"
    if (container / "manifest.json").exists() and (where / f"{tag}.done").exists():
        return container
    ckpt = make(parse(["--out", str(where / f"{tag}-ckpt"), "--layers", "8", "--dim", "1024", "--expert-ffn", "512",
                       "--top-k", "8", "--heads", "8", "--vocab", "2048", "--size-gb", str(a.size_gb)]
                      + (["--same-router"] if a.correlated else [])))
    convert(ckpt, container, **f)
    shutil.rmtree(ckpt, ignore_errors=True)
    (where / f"{tag}.done").write_text("converted\n")
    return container


#: The Kimi-family shapes: the releases' expert counts, top-k and routing
#: (/work/shared/spec: K3 896 experts, top 16, one group, sigmoid + bias,
#: renormalised, 2 shared experts, the latent MoE; Kimi-Linear 256 experts,
#: top 8, one group, routed scale 2.446, 1 shared expert), with few layers and
#: narrow matrices so that they fit this box: K3's 7-layer tiny layout (6 MoE
#: layers, width 64, experts 512 x 128 on a 128-wide latent), Kimi-Linear's
#: 8 layers (3 KDA : 1 MLA, 7 MoE), width 128, experts 512 x 128. With q4_1
#: experts every record is 126,976 bytes (the release's: ~11.8 MB at 3 bits).
KIMI_SHAPES = {
    "k3": ["--experts", "896", "--top-k", "16", "--expert-ffn", "512", "--latent", "128"],
    "kimi_linear": ["--experts", "256", "--top-k", "8", "--expert-ffn", "512", "--dim", "128", "--layers", "8"],
}


def kimi_shape(a) -> list[str]:
    """KIMI_SHAPES[family], its width replaced by --dim when given."""
    shape = list(KIMI_SHAPES[a.family])
    if a.dim:
        if "--dim" in shape:
            shape[shape.index("--dim") + 1] = str(a.dim)
        else:
            shape += ["--dim", str(a.dim)]
    return shape


def synth_formats(a) -> dict:
    """The converter's formats for the synthetic families: q4_1 experts and its default trunk unless asked."""
    return {"expert_format": a.expert_format or "q4_1", **({"trunk_format": a.trunk_format} if a.trunk_format else {})}


def prepare_kimi(a, where: Path) -> Path:
    f = synth_formats(a)
    tag = (f"synth-{a.family}-" + "-".join(kimi_shape(a)[1::2])
           + ("" if f == {"expert_format": "q4_1"} else "-" + "-".join(f.values())))
    container = where / f"{tag}.ferry"
    if (container / "manifest.json").exists() and (where / f"{tag}.done").exists():
        return container
    ckpt = make(parse(["--out", str(where / f"{tag}-ckpt"), "--family", a.family, *kimi_shape(a)]))
    convert(ckpt, container, **f)
    shutil.rmtree(ckpt, ignore_errors=True)
    (where / f"{tag}.done").write_text("converted\n")
    return container


#: K3's routed experts as released (/work/shared/spec/k3-config.json:
#: routed_expert_hidden_size 3584, moe_intermediate_size 3072, num_experts
#: 896, num_experts_per_token 16; sigmoid router with its correction bias,
#: 2 shared experts: tests/kimi/tiny_k3 writes those from the same config).
K3_LATENT, K3_FFN, K3_EXPERTS, K3_TOP_K = 3584, 3072, 896, 16
#: --true-shape: free space left on the disk beyond the container (other users of it).
TRUE_SHAPE_MARGIN = 6 << 30
#: --true-shape: rows of real encoded values each record's rows are drawn from.
POOL_ROWS = 64


def true_shape_banks(moe_layers: int, fmt: str):
    """The expert banks of --true-shape: layers 1..moe_layers (layer 0 is K3's
    dense layer), 896 records each of K3's gate/up [3072, 3584] and down
    [3584, 3072] in ``fmt``, laid out as the converter lays them out."""
    from app.convert.layout import bank_layout

    shapes = {"gate": (K3_FFN, K3_LATENT), "up": (K3_FFN, K3_LATENT), "down": (K3_LATENT, K3_FFN)}
    return [bank_layout(layer, K3_EXPERTS, {p: (fmt, sh) for p, sh in shapes.items()})
            for layer in range(1, moe_layers + 1)]


def true_shape_need(moe_layers: int, fmt: str) -> int:
    """Bytes --true-shape writes: its banks, the tiny trunk and the small banks
    the converter writes first (rewritten, one layer at a time)."""
    banks = true_shape_banks(moe_layers, fmt)
    return sum(b.file_size for b in banks) + (64 << 20) + 2 * K3_EXPERTS * 3 * 32 * K3_LATENT


def check_true_shape_space(where: Path, moe_layers: int, fmt: str) -> int:
    """The bytes --true-shape needs, or SystemExit with one line when the disk
    holding ``where`` has less free than that plus TRUE_SHAPE_MARGIN."""
    need = true_shape_need(moe_layers, fmt)
    probe = where
    while not probe.exists():
        probe = probe.parent
    free = shutil.disk_usage(probe).free
    if free < need + TRUE_SHAPE_MARGIN:
        raise SystemExit(f"stream.py --true-shape: {moe_layers} K3 layers at {fmt} need {need / 2**30:.1f} GiB "
                         f"+ {TRUE_SHAPE_MARGIN >> 30} GiB margin on {probe}, only {free / 2**30:.1f} GiB is free "
                         f"(use fewer --moe-layers or another --workdir)")
    return need


def _pool(fmt: str, cols: int, rng) -> np.ndarray:
    """POOL_ROWS rows of ``cols`` Gaussian values encoded in ``fmt`` (valid
    blocks with realistic scales), as [POOL_ROWS, row bytes]."""
    from app.convert import quant2, quant3

    enc = {"q3_nl": quant3.quantize, "q2_vq": quant2.quantize}[fmt]
    w = (0.02 * rng.standard_normal((POOL_ROWS, cols))).astype(np.float32)
    return enc(w).reshape(POOL_ROWS, -1)


def write_true_bank(path: Path, bank, seed: int) -> None:
    """One bank of --true-shape: its header, then every record with rows drawn
    at random from a pool of encoded rows (written directly, not quantized
    from floats: a K3 bank is ~29 G values), whole records with direct I/O."""
    from app.convert.convert import _part_view, _Prefetch, _record_into, _RecordWriter, bank_header

    rng = np.random.default_rng(seed)
    pools = {p: _pool(info["dtype"], info["shape"][1], rng) for p, info in bank.parts.items()}
    rs = bank.record_size

    def make(e: int, buf) -> None:
        r = np.random.default_rng([seed, e])
        payloads = {}
        for p, info in bank.parts.items():
            view = _part_view(buf, info).reshape(info["shape"][0], -1)
            np.take(pools[p], r.integers(0, POOL_ROWS, info["shape"][0]), axis=0, out=view)
            payloads[p] = _part_view(buf, info)
        _record_into(buf, bank, e, payloads)

    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    out = _RecordWriter(fd, path)
    ahead = _Prefetch(make, range(bank.n_experts), rs, threads=2)
    try:
        os.ftruncate(fd, bank.file_size)
        head = mmap.mmap(-1, 4096)
        head[:] = bank_header(bank)
        out.write(head, 0)
        for e in range(bank.n_experts):
            buf = ahead.next(e)
            out.write(buf, 4096 + e * rs)
            ahead.give_back(buf)
        os.fsync(fd)
    finally:
        ahead.close()
        out.close()
        os.close(fd)


def prepare_true_shape(a, where: Path) -> Path:
    """A K3 container whose MoE layers have K3's real experts: the trunk of a
    tiny K3 (tests/kimi/tiny_k3: width 64, sigmoid router with correction
    bias over 896 experts, top 16, 2 shared experts, the latent path on
    K3's 3584-wide latent) converted by `ferry convert` with throwaway 32-wide
    experts, then each bank replaced by K3's real records (bank_layout) and
    the manifest updated to them."""
    from app.convert.convert import _write_file

    tag = f"k3-true-{a.moe_layers}x{K3_EXPERTS}-{a.expert_format}"
    container = where / f"{tag}.ferry"
    if (container / "manifest.json").exists() and (where / f"{tag}.done").exists():
        return container
    check_true_shape_space(where, a.moe_layers, a.expert_format)
    shutil.rmtree(container, ignore_errors=True)
    ckpt = where / f"{tag}-ckpt"
    from tests.kimi import tiny_k3
    tiny_k3.build(ckpt, moe_ffn=32, latent=K3_LATENT, experts=K3_EXPERTS, top_k=K3_TOP_K, layers=a.moe_layers + 1)
    convert(ckpt, container, expert_format="q8_0")
    shutil.rmtree(ckpt, ignore_errors=True)
    doc = json.loads((container / "manifest.json").read_text())
    banks = {b.layer: b for b in true_shape_banks(a.moe_layers, a.expert_format)}
    assert sorted(banks) == [e["layer"] for e in doc["expert_banks"]], "the tiny K3's MoE layers changed"
    for b in banks.values():
        (container / b.file).unlink()            # the small bank first: the disk holds one layer at a time
        write_true_bank(container / b.file, b, seed=b.layer)
    doc["model"]["moe"]["expert_ffn_dim"] = K3_FFN
    doc["expert_banks"] = [{"layer": b.layer, "file": b.file, "n_experts": b.n_experts, "record_size": b.record_size,
                            "payload_size": b.payload_size, **b.parts} for b in banks.values()]
    sizes = {b.file: b.file_size for b in banks.values()}
    doc["files"] = [{**f, "size": sizes.get(f["name"], f["size"])} for f in doc["files"]]
    doc["conversion"]["expert_format"] = a.expert_format
    _write_file(container / "manifest.json", json.dumps(doc, indent=1).encode())
    (where / f"{tag}.done").write_text("written\n")
    return container


def routing_modes(top_k: int, margins: list[float]) -> dict:
    """Opt-in routing: top-k, 3k/4, k/2, k/4 experts per token (16/12/8/4 on
    K3), and cache-aware margins at the model's k (margin 0 is exact routing
    set explicitly: it must read what "streaming" reads)."""
    modes = {}
    for n in sorted({top_k, max(1, 3 * top_k // 4), max(1, top_k // 2), max(1, top_k // 4)}, reverse=True):
        if n != top_k:
            modes[f"top{n}"] = {"routing": (n, 0.0)}
    for m in margins:
        modes[f"cache_aware_{m:g}"] = {"routing": (None, m)}
    return modes


def stream_modes(a, container: Path, plan, tokens: list[int], budget: int, top_k: int) -> dict:
    """Every decode mode in interleaved rounds, with the compute and disk floors."""
    modes = {
        "streaming": {},
        "synchronous": {"overlap": False, "lookahead": False},
        "no_lookahead": {"lookahead": False},
        "always_prefetch": {"lookahead_gate": False},
    }
    if a.routing:
        modes.update(routing_modes(top_k, [float(m) for m in a.margins.split(",") if m]))
    runs: dict[str, list[dict]] = {m: [] for m in modes}
    compute, disk, load = [], [], []
    names = list(modes)
    for r in range(max(1, a.rounds)):
        load.append(os.getloadavg()[0])
        # each round starts one mode later, so that no mode always runs first
        # (after the disk test, whose burst a virtual disk may throttle)
        for m in names[r % len(names):] + names[:r % len(names)]:
            runs[m].append(decode_run(container, tokens, ram_budget=budget, readers=a.readers, **modes[m]))
        compute.append(compute_floor(container, tokens)["s_per_token"])
        disk.append(disk_bandwidth(container, plan.record_bytes, a.readers)["bytes_per_s"])
    res = {m: median_run(r) for m, r in runs.items()}
    streaming, sync = res["streaming"], res["synchronous"]
    # The best bandwidth any round saw: the disk gives at least that, so the
    # floor stays a lower bound when a neighbour slows one measurement.
    bandwidth = float(max(disk))
    compute_s = float(np.median(compute))
    # The bytes that must be read: the fewest any mode read at this budget
    # (the lookahead's wrong guesses are extra reads, not a lower floor).
    must_read = min(r["bytes_per_token"] for m, r in res.items() if m in ("streaming", "synchronous", "no_lookahead"))
    disk_floor = must_read / bandwidth
    larger = max(disk_floor, compute_s)
    return {
        "rounds_load_1min": load,
        **res,
        "compute_floor_s_per_token": compute_s, "compute_floor_rounds": compute,
        "disk": {"bytes_per_s": bandwidth, "median_bytes_per_s": float(np.median(disk)), "rounds_bytes_per_s": disk,
                 "readers": a.readers, "direct": bool(getattr(os, "O_DIRECT", 0))},
        "must_read_bytes_per_token": must_read,
        "disk_floor_s_per_token": disk_floor,
        "larger_floor": "disk" if disk_floor >= compute_s else "compute",
        "ratio_to_larger_floor": streaming["s_per_token"] / larger,
        "speedup_vs_synchronous": sync["s_per_token"] / streaming["s_per_token"],
        "speedup_vs_overlap_only": res["no_lookahead"]["s_per_token"] / streaming["s_per_token"],
        "speedup_vs_always_prefetch": res["always_prefetch"]["s_per_token"] / streaming["s_per_token"],
        "rounds_speedup_vs_always_prefetch": [y["s_per_token"] / x["s_per_token"]
                                              for x, y in zip(runs["streaming"], runs["always_prefetch"])],
        "rounds_speedup_vs_synchronous": [y["s_per_token"] / x["s_per_token"]
                                          for x, y in zip(runs["streaming"], runs["synchronous"])],
        "rounds_speedup_vs_overlap_only": [y["s_per_token"] / x["s_per_token"]
                                           for x, y in zip(runs["streaming"], runs["no_lookahead"])],
    }


def activation_modes(a, container: Path, tokens: list[int], budget: int) -> dict:
    """--activations: decode at the bench's budget (streaming) and with every
    expert in RAM (the compute floor's second pass) under each activation
    mode, in interleaved rounds (each round starting one mode later); medians
    and each round's ratio of every mode to the first."""
    acts = [m for m in a.activations.split(",") if m] + (["before"] if a.before_tree else [])
    runs: dict[str, dict[str, list]] = {m: {"streaming": [], "cached": [], "cached_cpu_1thread": []} for m in acts}
    load, running = [], {}
    for r in range(max(1, a.rounds)):
        load.append(os.getloadavg()[0])
        for m in acts[r % len(acts):] + acts[:r % len(acts)]:
            job = {"container": str(container), "tokens": tokens, "budget": budget, "readers": a.readers,
                   "activations": None if m == "before" else m}
            env = {**os.environ, "FERRY_BENCH_TREE": str(Path(a.before_tree).resolve())} if m == "before" else None
            done = subprocess.run([sys.executable, __file__, "--worker", json.dumps(job)], env=env, check=True,
                                  capture_output=True, text=True)
            out = json.loads(done.stdout)
            for k in runs[m]:
                runs[m][k].append(out[k])
            running[m] = out["engine_reports"]
    out: dict = {"rounds_load_1min": load, "activations": {}}
    first = acts[0]
    for m in acts:
        st = median_run(runs[m]["streaming"])
        cached = runs[m]["cached"]
        out["activations"][m] = {
            "engine_reports": running[m],
            "streaming": {k: st[k] for k in ("tok_per_s", "s_per_token", "rounds_s_per_token", "hit_rate",
                                             "bytes_per_token", "stall_s_per_token", "profile_s_per_token",
                                             "matmul_s_per_token")},
            "cached": {"tok_per_s": 1.0 / float(np.median(cached)), "s_per_token": float(np.median(cached)),
                       "rounds_s_per_token": cached},
            "cached_cpu_1thread": {"cpu_s_per_token": float(np.median(runs[m]["cached_cpu_1thread"])),
                                   "rounds_cpu_s_per_token": runs[m]["cached_cpu_1thread"]},
        }
        if m != first:
            for where in ("streaming", "cached", "cached_cpu_1thread"):
                mine = [x["s_per_token"] if where == "streaming" else x for x in runs[m][where]]
                base = [x["s_per_token"] if where == "streaming" else x for x in runs[first][where]]
                ratios = [b / x for b, x in zip(base, mine)]
                out["activations"][m][where]["speedup_vs_" + first] = float(np.median(ratios))
                out["activations"][m][where]["rounds_speedup_vs_" + first] = ratios
    return out


def activation_worker(job: dict) -> dict:
    """One round of one mode of --activations, in a fresh process (with --before-tree's mode, another tree's
    app and core): decode at the budget, in RAM, and in RAM on one thread (CPU time)."""
    opts = {"activations": job["activations"]} if job["activations"] else {}
    container, tokens = Path(job["container"]), job["tokens"]
    with Engine(container, n_ctx=256, threads=1, **opts) as probe:
        reports = probe.info.activations
    return {"engine_reports": reports,
            "streaming": decode_run(container, tokens, ram_budget=job["budget"], readers=job["readers"], **opts),
            "cached": compute_floor(container, tokens, **opts)["s_per_token"],
            # one compute thread's CPU time per token, the best of 5 passes: the compute alone, what a loaded
            # machine disturbs least
            "cached_cpu_1thread": compute_floor(container, tokens, passes=5, threads=1, **opts)["cpu_s_per_token"]}


#: --true-shape: prompt tokens before the timed decode (each prompt token of K3
#: reads up to 16 records of 12 MiB a layer: a short prompt keeps the run short).
TRUE_PROMPT = 2


def k3_cache_share(ram: int = 64 << 30) -> float:
    """The share of K3's experts its recommended budget caches on a machine
    with ``ram`` (what `ferry plan --config k3-config.json --ram 64G` plans:
    recommended minus floor over every expert record; about 1.8 %)."""
    from app.convert.plan_config import plan_from_config
    from app.get.catalogue import ENTRIES

    c = plan_from_config(next(e.config for e in ENTRIES if e.name == "Kimi K3"), ram=ram)
    return (c["recommended_bytes"] - c["floor_bytes"]) / c["experts_total_bytes"]


class BusyKernels:
    """The exact kernels of ``fmt`` in a loop on every core while the block
    runs (a 96 MiB matrix of random blocks, as app.engine.speed measures
    them): the CPU as a decode keeps it, for the disk's ceiling beside busy
    cores (the readers then wait for a core to issue each next read)."""

    def __init__(self, fmt: str, threads: int | None = None):
        import threading

        from app.engine.binding import ffi, lib
        from app.engine.speed import COLS, MATRIX_BYTES

        self.threads = max(1, threads or os.cpu_count() or 1)
        code = lib.ferry_format_code(fmt.encode())
        row = lib.ferry_format_row_bytes(code, COLS)
        per = max(8, MATRIX_BYTES // row // self.threads)
        w = np.random.default_rng(0).integers(0, 256, size=per * self.threads * row, dtype=np.uint8)
        x = np.random.default_rng(1).standard_normal(COLS).astype(np.float32)
        self.stop = threading.Event()

        def work(i: int) -> None:
            y = np.zeros(per, dtype=np.float32)
            part = ffi.from_buffer(w[i * per * row:(i + 1) * per * row])
            while not self.stop.is_set():
                lib.ferry_kernel_matmul(lib.ferry_kernels_best(), code, part, per, COLS,
                                        ffi.from_buffer("float[]", x), 1, ffi.from_buffer("float[]", y))

        self.workers = [threading.Thread(target=work, args=(i,)) for i in range(self.threads)]

    def __enter__(self):
        for t in self.workers:
            t.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        for t in self.workers:
            t.join()


def disk_sectors() -> dict[str, int] | None:
    """Bytes read and written so far by every process on the machine's whole
    disks (/proc/diskstats, the devices of /sys/block but loop and RAM ones;
    None elsewhere), with the read requests completed and the milliseconds
    the disks had requests in flight: what others did to the disk while a
    decode ran (the machine may be shared), and the requests' size."""
    try:
        disks = {d for d in os.listdir("/sys/block") if not d.startswith(("loop", "ram", "zram"))}
        lines = Path("/proc/diskstats").read_text().splitlines()
    except OSError:
        return None
    out = {"read": 0, "written": 0, "read_requests": 0, "busy_ms": 0}
    for f in (line.split() for line in lines):
        if len(f) > 12 and f[2] in disks:
            out["read"] += int(f[5]) * 512
            out["written"] += int(f[9]) * 512
            out["read_requests"] += int(f[3])
            out["busy_ms"] = max(out["busy_ms"], int(f[12]))
    return out


def disk_requests(disk0: dict | None, disk1: dict | None, seconds: float) -> dict:
    """Between two disk_sectors(): the mean read request's size in bytes and
    the share of the time the disk had requests in flight (None without
    /proc/diskstats)."""
    if not (disk0 and disk1) or seconds <= 0:
        return {"disk_request_bytes": None, "disk_busy_share": None}
    n = disk1["read_requests"] - disk0["read_requests"]
    return {"disk_request_bytes": (disk1["read"] - disk0["read"]) / n if n > 0 else None,
            "disk_busy_share": min(1.0, (disk1["busy_ms"] - disk0["busy_ms"]) / 1000 / seconds)}


def _model_round(run: dict, ceiling: float, kernel_bps: float, experts_per_token: int, record: int,
                 layers: int, busy: float | None) -> dict:
    """The speed model (app.engine.speed.token_seconds, per-layer record
    pipeline) for one decode from the rates measured beside it: the disk's
    ceiling in the engine's pattern, idle and beside busy cores, and the
    kernels' speed, with the bytes the decode read (its hit rate) and the
    trunk's own time (the decode less its experts' products and waits).
    Beside it, the model without the busy rate and the aggregate form (the
    model before 2026-12-06's session 16) with the same inputs."""
    from app.engine.speed import token_seconds

    bpt, spt = run["bytes_per_token"], run["s_per_token"]
    prof = run["profile_s_per_token"]
    trunk_s = max(0.0, spt - prof["expert_ffn_seconds"] - prof["expert_wait_seconds"])
    args = (trunk_s, experts_per_token, bpt, kernel_bps, ceiling)
    predicted = token_seconds(*args, trunk_kernel_bps=1.0, record_bytes=record, layers=layers, busy_disk_bps=busy)
    idle = token_seconds(*args, trunk_kernel_bps=1.0, record_bytes=record, layers=layers)
    aggregate = token_seconds(*args, trunk_kernel_bps=1.0)
    return {"trunk_s": trunk_s, "experts_s": experts_per_token / kernel_bps, "read_s": bpt / ceiling,
            "s_per_token": predicted, "error": predicted / spt - 1.0, "idle_disk_error": idle / spt - 1.0,
            "aggregate_error": aggregate / spt - 1.0}


#: --true-shape: a decode during which other processes moved more than this
#: share of the ceiling on the disk ran on a shared disk (its error is reported apart).
SHARED_DISK = 0.10


def _disk_shared(run: dict) -> bool:
    o = run.get("disk_others_bytes_per_s")
    return bool(o) and o["read"] + o["written"] > SHARED_DISK * run["ceiling_bytes_per_s"]


def _median_or_none(xs: list[float]) -> float | None:
    return float(np.median(xs)) if xs else None


def true_shape_modes(a, container: Path, plan, tokens: list[int], budget: int, info) -> dict:
    """K3's real expert records streamed at the 64 GB Mac's cache share, for
    each reader count (the engine's queue depth), in interleaved rounds. Each
    decode is measured beside its own inputs, since on a shared machine the
    rates move between measurements: just before it the kernels' speed (the
    exact products K3 runs, every core) and the disk's ceiling in the
    engine's own pattern (direct reads of random whole records shared by the
    readers in 4 MiB pieces, core_c/src/io.c) into buffers made as the
    engine's slots, once in 4 KiB pages and once in huge pages, the latter
    again with the kernels busy on every core (BusyKernels: the readers then
    wait for a core to issue each next read); just after it both idle
    ceilings again (each the mean of before and after). The disk's rate
    follows its requests' size, which the buffers' physical contiguity
    sets (record_slots), so the model takes the ceiling at the decode's own
    mean request (ceiling_at_request, between the two probes) and the busy
    one scaled alike; with the load and the bytes other processes moved on
    the disk during the decode. Per reader count: tok/s, bytes read per
    token, the achieved read bandwidth and its share of the ceiling, the
    compute's wait for reads, the share of the read time hidden behind
    compute, the session profile, and the speed model's prediction for each
    round (app.engine.speed.token_seconds with the per-layer record
    pipeline) and its error, the median over rounds beside it."""
    from app.engine.speed import kernel_bytes_per_s

    sweep = [int(r) for r in a.readers_sweep.split(",") if r]
    rounds: dict[int, list[dict]] = {r: [] for r in sweep}
    fmt = a.expert_format
    experts_per_token = info.top_k * info.n_moe_layers * plan.record_bytes
    record, layers = plan.record_bytes, info.n_moe_layers
    measure_kernel = kernel_bytes_per_s.__wrapped__   # measured again each time, not the process's cached figure
    for rnd in range(max(1, a.rounds)):
        order = sweep[rnd % len(sweep):] + sweep[:rnd % len(sweep)]
        for r in order:
            load = os.getloadavg()[0]
            kernel = measure_kernel(fmt, None, "exact")   # K3 runs exact (KDA layers: app.activations)
            probe = lambda **kw: disk_bandwidth(container, record, r, seconds=a.ceiling_seconds / 2,  # noqa: E731
                                                pieces=True, **kw)
            pages0, huge0 = probe(), probe(contiguous=True)
            with BusyKernels(fmt):
                busy_huge = probe(contiguous=True)["bytes_per_s"]
            run = decode_run(container, tokens, prompt=TRUE_PROMPT, ram_budget=budget, readers=r)
            huge1, pages1 = probe(contiguous=True), probe()
            # the disk's rate at the requests this decode made (its slots' pages decide their size: record_slots),
            # between the probes into scattered pages and into huge pages, each the mean of before and after
            mean = lambda p, q, k: (p[k] + q[k]) / 2 if p[k] and q[k] else None  # noqa: E731
            pages = (mean(pages0, pages1, "disk_request_bytes"), mean(pages0, pages1, "bytes_per_s"))
            huge = (mean(huge0, huge1, "disk_request_bytes"), mean(huge0, huge1, "bytes_per_s"))
            ceiling = ceiling_at_request(run["disk_request_bytes"], [pages, huge])
            busy = busy_huge * ceiling / huge[1]
            rounds[r].append({**run, "round": rnd, "load_1min": load, "kernel_bytes_per_s": kernel,
                              "ceiling_bytes_per_s": ceiling,
                              "ceiling_pages_bytes_per_s": pages[1], "ceiling_contiguous_bytes_per_s": huge[1],
                              "ceiling_before_after": {"pages": [pages0["bytes_per_s"], pages1["bytes_per_s"]],
                                                       "contiguous": [huge0["bytes_per_s"], huge1["bytes_per_s"]]},
                              "ceiling_request_bytes": {"pages": pages[0], "contiguous": huge[0]},
                              "ceiling_busy_bytes_per_s": busy, "ceiling_busy_contiguous_bytes_per_s": busy_huge,
                              "model": _model_round(run, ceiling, kernel, experts_per_token, record, layers, busy),
                              # the model with either probe alone (what the request size changes)
                              "model_error_at": {k: _model_round(run, c, kernel, experts_per_token, record, layers,
                                                                 busy_huge * c / huge[1])["error"]
                                                 for k, c in (("pages", pages[1]), ("contiguous", huge[1]))}})
    out = {}
    for r in sweep:
        rs = rounds[r]
        m = median_run(rs)
        spt = float(np.median([x["s_per_token"] for x in rs]))
        pred = float(np.median([x["model"]["s_per_token"] for x in rs]))
        ceiling = float(np.median([x["ceiling_bytes_per_s"] for x in rs]))
        bpt = m["bytes_per_token"]
        read_at_ceiling = bpt / ceiling
        ffn_s = m["profile_s_per_token"]["expert_ffn_seconds"]
        out[str(r)] = {
            **{k: v for k, v in m.items() if k not in ("model", "model_error_at")},
            "s_per_token": spt, "tok_per_s": 1.0 / spt,
            "disk_ceiling_bytes_per_s": ceiling, "disk_ceiling_rounds": [x["ceiling_bytes_per_s"] for x in rs],
            "disk_ceiling_busy_rounds": [x["ceiling_busy_bytes_per_s"] for x in rs],
            # the probes into scattered pages and into huge pages, and the mean read request of each and the decode's
            "disk_ceiling_pages_rounds": [x["ceiling_pages_bytes_per_s"] for x in rs],
            "disk_ceiling_contiguous_rounds": [x["ceiling_contiguous_bytes_per_s"] for x in rs],
            "disk_request_bytes_rounds": [{**x["ceiling_request_bytes"], "decode": x["disk_request_bytes"]}
                                          for x in rs],
            "kernel_bytes_per_s_rounds": [x["kernel_bytes_per_s"] for x in rs],
            "load_rounds": [x["load_1min"] for x in rs],
            "disk_others_rounds": [x["disk_others_bytes_per_s"] for x in rs],
            "achieved_read_bytes_per_s": bpt / spt,
            "share_of_ceiling": bpt / spt / ceiling,
            "read_s_per_token_at_ceiling": read_at_ceiling,
            "hidden_read_fraction": (max(0.0, min(1.0, 1.0 - m["stall_s_per_token"] / read_at_ceiling))
                                     if read_at_ceiling else None),
            "compute_s_per_token": m["s_per_token"] - m["stall_s_per_token"],
            # error: the median of the rounds' errors (each round's prediction from its own inputs)
            "model": {"s_per_token": pred, "tok_per_s": 1.0 / pred,
                      "error": float(np.median([x["model"]["error"] for x in rs])),
                      "rounds_error": [x["model"]["error"] for x in rs],
                      # the rounds in which other processes moved less than SHARED_DISK of the ceiling
                      # on the disk during the decode (the model is for a disk of one's own)
                      "error_unshared_rounds": _median_or_none([x["model"]["error"] for x in rs
                                                                if not _disk_shared(x)]),
                      "unshared_rounds": sum(not _disk_shared(x) for x in rs),
                      "rounds_idle_disk_error": [x["model"]["idle_disk_error"] for x in rs],
                      "rounds_aggregate_error": [x["model"]["aggregate_error"] for x in rs],
                      "rounds_error_at_pages": [x["model_error_at"]["pages"] for x in rs],
                      "rounds_error_at_contiguous": [x["model_error_at"]["contiguous"] for x in rs],
                      "trunk_s": m["model"]["trunk_s"], "experts_s": m["model"]["experts_s"],
                      "read_s": m["model"]["read_s"]},
            # the experts' compute as this decode's own profile measured it (a diagnostic: under load
            # the kernels' speed moves even between the measurement beside the decode and the decode)
            "model_in_run": {"experts_s": ffn_s, "error": (_model_round(
                m, m["ceiling_bytes_per_s"], experts_per_token / ffn_s, experts_per_token, record, layers,
                m["ceiling_busy_bytes_per_s"])["error"] if ffn_s else None)},
        }
    best = max(out, key=lambda k: out[k]["tok_per_s"])
    return {"readers": out, "best_readers": int(best), "kernel_format": fmt, "kernel_activations": "exact",
            "expert_bytes_computed_per_token": experts_per_token,
            "model_error_by_readers": {k: round(v["model"]["error"], 4) for k, v in out.items()},
            "model_error_unshared_by_readers": {k: (round(v["model"]["error_unshared_rounds"], 4)
                                                    if v["model"]["error_unshared_rounds"] is not None else None)
                                                for k, v in out.items()},
            "model_within_15pct": all(abs(v["model"]["error"]) <= 0.15 for v in out.values()),
            # the model with the experts' compute of the decode's own profile (the median round):
            # what is left when the kernels' speed measured beside the decode is taken out
            "model_in_run_error_by_readers": {k: (round(v["model_in_run"]["error"], 4)
                                                  if v["model_in_run"]["error"] is not None else None)
                                              for k, v in out.items()}}


#: The reference machine of issue 36, a 64 GB MacBook Pro M5 Pro, by published
#: figures: 18 CPU cores (6 "super" + 12 performance cores) and 307 GB/s of
#: memory bandwidth (Apple's M5 Pro announcement, as reported e.g. at
#: mikeshouts.com/apple-m5-pro-m5-max and allyoucantech.com); SSD reads from
#: 6.3 GB/s (M5 MacBook Pro, Blackmagic Disk Speed Test by Max Tech, reported
#: by 9to5Mac / worldnl.com) to 13.6 GB/s (sustained, 16-inch M5 Max with 4 TB,
#: The Verge): Apple states "up to 2x" the M4 Pro's for the M5 Pro, no figure.
#: The high figure is the one that machine measures in Ferry's read pattern:
#: the public streaming engine's diskbench on the 64 GB M5 Pro itself, random
#: 12 MiB direct reads from 8 threads, 12.78 GiB/s = 13.7 GB/s (its docs/GATES.md,
#: Gate H; docs/KIMI.md); the low one is a base M5's sequential test.
MAC = {"name": "MacBook Pro M5 Pro, 64 GB", "ram": 64 << 30, "cores": 18, "memory_bytes_per_s": 307e9,
       "ssd_bytes_per_s": {"low": 6.3e9, "high": 13.6e9}}
#: The public streaming engine on that Mac (issue 36): 0.45-0.62 tok/s with a
#: 17.6 GB cache at a 38 % hit rate, 0.89 tok/s with 8 experts per token.
PUBLIC_ENGINE = {"tok_per_s": [0.45, 0.62], "cache_bytes": 17.6e9, "hit_rate": 0.38, "tok_per_s_top8": 0.89}


#: K3's trunk format on a 64 GB Mac: what `ferry check` / the catalogue recommend there (format_choices'
#: rule; tests/get/test_catalogue.py checks the catalogue row says the same).
K3_TRUNK = "iq4_xs"


def mac_prediction(one_core_bps) -> dict:
    """K3 on MAC by the one estimator (app.engine.speed.token_seconds with
    the per-layer record pipeline, as app.get.plan.estimate runs it for
    `ferry get --plan` and the catalogue): the floor, bytes and recommended
    budget the catalogue plans for 64 GB (K3_TRUNK trunk; q3_nl or q2_vq
    experts), the SSD at both published figures, exact routing (16 experts)
    and 8 experts per token, three hit rates for the cache that budget
    leaves: "ferry" (app.engine.speed.expected_hit_rate: the engine's policy
    on the real OLMoE trace at the cache's size in token working sets, what
    the catalogue uses), the public engine's measured 38 % and a uniform
    spread; two compute assumptions: "memory" (the kernels at MAC's memory
    bandwidth: what an engine whose compute keeps up with memory gets) and
    "cores_as_here" (one core of this machine at ``one_core_bps(fmt)``,
    exact activations as K3 runs, times MAC's cores, at most its memory
    bandwidth: Ferry's CPU kernels if an M5 core were as fast as this one);
    with the lookahead's bound beside each (every read behind compute). Also
    the catalogue's rows for K3 on that Mac (app.get.catalogue.plan_entry)
    at the low SSD figure with both compute assumptions: the "memory" one is
    the "memory/top16/ferry/ssd_low" row of its format."""
    from app.convert.plan_config import plan_from_config
    from app.engine.speed import expected_hit_rate, token_seconds
    from app.get.catalogue import ENTRIES, plan_entry
    from app.memory.budget import MachineMemory, auto_budget

    k3 = next(e for e in ENTRIES if e.name == "Kimi K3")
    mem = MachineMemory(MAC["ram"], MAC["ram"], "a 64 GB Mac")
    one = {}

    def cores(fmt: str) -> float:
        if fmt not in one:
            one[fmt] = one_core_bps(fmt)
        return min(MAC["memory_bytes_per_s"], MAC["cores"] * one[fmt])

    def memory(fmt: str) -> float:
        return MAC["memory_bytes_per_s"]

    kernels = {"memory": memory, "cores_as_here": cores}
    out = {"machine": MAC, "public_engine": PUBLIC_ENGINE, "formats": {}}
    for fmt in ("q3_nl", "q2_vq"):
        c = plan_from_config(k3.config, ram=MAC["ram"], trunk_format=K3_TRUNK, expert_format=fmt)
        everything = (c["trunk_bytes"] + c["state_bytes"] + c["scratch_bytes"] + c["experts_total_bytes"]
                      + c["policy_all_bytes"])
        budget = auto_budget(c["floor_bytes"], c["cold_bytes_per_token"], everything, mem).budget
        record, layers, top_k = c["expert_record_bytes"], c["moe_layers"], c["top_k"]
        n_records = c["experts_per_layer"] * layers
        slots = min(n_records, max(0, (budget - c["floor_bytes"]) // record + top_k))
        trunk = c["trunk_bytes"]      # resident, computed per token (the embedding row is read, not computed)
        rows, hit_rates = {}, {}
        for compute, kernel in kernels.items():
            for k in (top_k, top_k // 2):
                experts = c["cold_bytes_per_token"] * k // top_k
                hit_rates[f"top{k}"] = hits_by = {"ferry": expected_hit_rate(slots, k, layers, n_records),
                                                   "published_38pct": PUBLIC_ENGINE["hit_rate"],
                                                   "uniform": slots / n_records}
                for hits, h in hits_by.items():
                    for ssd, bps in MAC["ssd_bytes_per_s"].items():
                        read = int(experts * (1 - h))
                        args = (trunk, experts, read, kernel(fmt), bps)
                        t = token_seconds(*args, trunk_kernel_bps=kernel(K3_TRUNK), record_bytes=record, layers=layers)
                        la = token_seconds(*args, trunk_kernel_bps=kernel(K3_TRUNK), lookahead=True)
                        rows[f"{compute}/top{k}/{hits}/ssd_{ssd}"] = {
                            "hit_rate": h, "read_bytes_per_token": read, "trunk_s": trunk / kernel(K3_TRUNK),
                            "experts_s": experts / kernel(fmt), "read_s": read / bps,
                            "tok_per_s": 1 / t, "tok_per_s_lookahead_bound": 1 / la}
        out["formats"][fmt] = {"floor_bytes": c["floor_bytes"], "budget_bytes": budget,
                               "cache_bytes": budget - c["floor_bytes"], "cache_slots": slots,
                               "cache_working_sets": slots / (top_k * layers), "cache_share": slots / n_records,
                               "trunk_compute_bytes": trunk, "cold_bytes_per_token": c["cold_bytes_per_token"],
                               "hit_rates": hit_rates, "predictions": rows}
    for name, kernel in kernels.items():
        row = plan_entry(k3, mem, MAC["ssd_bytes_per_s"]["low"], kernel)
        out["catalogue_row" if name == "memory" else f"catalogue_row_{name}"] = {
            "verdict": row.verdict, "reason": row.reason, "tok_per_s": row.tok_per_s,
            "expert_format": row.expert_format, "trunk_format": row.trunk_format,
            "recommended_budget": row.recommended_budget, "floor_bytes": row.floor_bytes,
            "expected_read_per_token": row.expected_read_per_token}
    out["one_core_kernel_bytes_per_s"] = dict(one)
    out["load_1min"] = os.getloadavg()[0]
    return out


#: Tokens of the prompt chunk the dispatch is timed on (one chunk: FE_CHUNK).
DISPATCH_PROMPT = 32


def dispatch_compare(a, container: Path, plan, vocab: int, budget: int) -> dict:
    """The expert dispatch's own CPU time per MoE layer and token
    (ferry_profile_part.dispatch_seconds: routing, collecting the distinct
    experts, the cache visit, the lookahead's routing, moving rows, the
    weighted sum; not the router's or the experts' products, not read waits),
    this build against the baseline's (bench/baseline_core.py: before the
    O(E n K) scan was removed), each run in a fresh process, in interleaved
    rounds whose order alternates. "in RAM": every expert the tokens choose is
    already cached (the tokens run twice); "streaming": the bench's budget."""
    from bench import baseline_core

    old = baseline_core.build(a.baseline or baseline_core.BASELINE)
    new = Path(__file__).resolve().parents[1]
    everything = plan.floor_bytes + plan.expert_bytes + 8 * plan.record_bytes
    rng = np.random.default_rng(9)
    tokens = [int(t) for t in rng.integers(3, vocab, DISPATCH_PROMPT + a.tokens)]
    base = {"tokens": tokens, "prompt": DISPATCH_PROMPT}
    variants = {
        "before, in RAM": (old, {"budget": everything, "warm": True, "lookahead": True}),
        "after, in RAM": (new, {"budget": everything, "warm": True, "lookahead": True}),
        "after, in RAM, no lookahead": (new, {"budget": everything, "warm": True, "lookahead": False}),
        "before, streaming": (old, {"budget": budget, "warm": False, "lookahead": True}),
        "after, streaming": (new, {"budget": budget, "warm": False, "lookahead": True}),
    }
    worker = Path(__file__).resolve().parent / "dispatch_worker.py"
    rounds = []
    for r in range(max(1, a.rounds)):
        row = {"load_1min": os.getloadavg()[0]}
        for name in (list(variants) if r % 2 == 0 else list(reversed(variants))):
            tree, spec = variants[name]
            done = subprocess.run([sys.executable, str(worker), str(tree), str(container),
                                   json.dumps({**base, **spec})], capture_output=True, text=True, cwd=tree)
            if done.returncode:
                raise SystemExit(f"dispatch run {name!r} failed:\n{done.stderr[-3000:]}")
            row[name] = json.loads(done.stdout.splitlines()[-1])
        rounds.append(row)
    summary = {}
    for name in variants:
        summary[name] = {k: float(np.median([rd[name][k]["us_per_layer_token"] for rd in rounds]))
                         for k in ("prompt", "decode")}
    for where in ("in RAM", "streaming"):
        b, f = summary[f"before, {where}"], summary[f"after, {where}"]
        summary[f"before/after, {where}"] = {k: b[k] / f[k] for k in ("prompt", "decode")}
    return {"baseline": a.baseline or baseline_core.BASELINE, "prompt_tokens": DISPATCH_PROMPT,
            "decode_tokens": a.tokens, "us_per_layer_token_median": summary, "rounds": rounds}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-gb", type=float, default=2.0, help="bf16 checkpoint size")
    ap.add_argument("--budget-frac", type=float, default=0.25, help="cache as a share of all experts")
    ap.add_argument("--tokens", type=int, default=24, help="decode steps")
    ap.add_argument("--readers", type=int, default=4)
    ap.add_argument("--workdir", default=None, help="where to write the model (default: a temp dir)")
    ap.add_argument("--correlated", action="store_true",
                    help="one router for all layers (routing predictable across layers, as in real models)")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved repetitions of every mode")
    ap.add_argument("--family", choices=["qwen3moe", "k3", "kimi_linear"], default="qwen3moe",
                    help="the synthetic model's shape (k3 and kimi_linear: see KIMI_SHAPES)")
    ap.add_argument("--routing", action="store_true",
                    help="also measure the opt-in routing modes (fewer experts per token, cache-aware margins)")
    ap.add_argument("--margins", default="0,0.02,0.1", help="cache-aware margins to measure with --routing")
    ap.add_argument("--dispatch", action="store_true",
                    help="also time the expert dispatch's own CPU work per MoE layer, this build against "
                         "--baseline (Kimi families), in interleaved rounds")
    ap.add_argument("--baseline", default=None,
                    help="the revision to compare the dispatch with (default: the commit before core_c/src/moe.c)")
    ap.add_argument("--no-stream", action="store_true", help="with --dispatch: skip the streaming modes")
    ap.add_argument("--true-shape", action="store_true",
                    help="with --family k3: K3's real experts (896 of 3584 -> 3072 -> 3584, top 16) on --moe-layers "
                         "layers at the cache share a 64 GB Mac leaves K3, against the disk's ceiling, for each "
                         "--readers-sweep; the container (10.7 GiB a layer at q3_nl) is deleted unless --keep")
    ap.add_argument("--moe-layers", type=int, default=2, help="--true-shape: MoE layers written (default 2)")
    ap.add_argument("--expert-format", choices=["q3_nl", "q2_vq", "q4_0", "q4_1", "q8_0"], default=None,
                    help="the experts' format (--true-shape: q3_nl, the default, or q2_vq; the synthetic models: "
                         "q4_1 unless given)")
    ap.add_argument("--trunk-format", choices=["q4_0", "q4_1", "q8_0", "f32"], default=None,
                    help="the synthetic models' trunk format (default: the converter's)")
    ap.add_argument("--dim", type=int, default=None,
                    help="k3 / kimi_linear: the model's width instead of KIMI_SHAPES' (e.g. 256, so that q3_nl "
                         "experts' 256-value rows fit)")
    ap.add_argument("--activations", default=None,
                    help="compare activation modes instead of the placement modes, e.g. exact,auto: decode at the "
                         "budget and with every expert in RAM under each, in interleaved rounds")
    ap.add_argument("--readers-sweep", default="1,2,4,8", help="--true-shape: reader threads to measure")
    ap.add_argument("--cache-share", type=float, default=None,
                    help="--true-shape: the share of the experts cached (default: what K3's plan on 64 GB leaves)")
    ap.add_argument("--ceiling-seconds", type=float, default=4.0,
                    help="--true-shape: seconds of each disk-ceiling measurement")
    ap.add_argument("--keep", action="store_true", help="--true-shape: keep the written container (in --workdir)")
    ap.add_argument("--before-tree", default=None,
                    help="with --activations: also measure another checkout (its app and built core, at its default "
                         "activations) as mode 'before', in the same rounds, each round in fresh processes")
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    if a.worker:
        print(json.dumps(activation_worker(json.loads(a.worker))))
        return 0
    check_args(ap, a)
    if a.true_shape:
        return true_shape_main(a)
    if a.workdir:
        Path(a.workdir).mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=a.workdir) as tmp:
        t0 = time.perf_counter()
        container = prepare(a, Path(a.workdir) if a.workdir else Path(tmp))
        prep = time.perf_counter() - t0
        plan = container_plan(container, 256)
        all_experts = plan.expert_bytes
        # (plus the default 8-bit activations' scratch, which the engine's floor counts)
        budget = plan.floor_bytes + plan.q8_bytes + int(a.budget_frac * all_experts) + 8 * plan.record_bytes
        with Engine(container, n_ctx=256, threads=1) as probe:
            info = probe.info
        rng = np.random.default_rng(5)
        tokens = [int(t) for t in rng.integers(3, info.vocab, PROMPT + a.tokens)]
        result = {
            "machine": {"arch": platform.machine(), "cpus": os.cpu_count()}, "load_1min_at_start": os.getloadavg()[0],
            "family": a.family, "experts": info.n_experts, "top_k": info.top_k, "moe_layers": info.n_moe_layers,
            "routing": "correlated" if a.correlated else "random",
            "model_bytes": sum(p.stat().st_size for p in container.rglob("*.bin")), "budget_bytes": budget,
            "budget_frac": a.budget_frac, "record_bytes": plan.record_bytes, "rounds": max(1, a.rounds),
            "tokens": a.tokens, "prepare_seconds": round(prep, 1),
        }
        if a.activations:
            result["formats"] = synth_formats(a)
            result["dim"] = info.dim
            result.update(activation_modes(a, container, tokens, budget))
        elif not a.no_stream:
            result.update(stream_modes(a, container, plan, tokens, budget, info.top_k))
        if a.dispatch:
            result["dispatch"] = dispatch_compare(a, container, plan, info.vocab, budget)
        result["load_1min_at_end"] = os.getloadavg()[0]
    print(json.dumps(result, indent=None if a.json else 1))
    return 0


def check_args(ap, a) -> None:
    """Refuse options that do not go together (ap.error: one line, exit 2)."""
    if a.activations and any(m not in ACTIVATION_CHOICES for m in a.activations.split(",") if m):
        ap.error(f"--activations takes modes from {', '.join(ACTIVATION_CHOICES)}, separated by commas")
    if a.before_tree and not (a.activations and (Path(a.before_tree) / "app" / "engine").is_dir()):
        ap.error("--before-tree goes with --activations and names a checkout with a built core (app/engine)")
    if a.dim is not None and (a.family == "qwen3moe" or a.dim < 64 or a.dim % 64):
        ap.error("--dim goes with --family k3 or kimi_linear and must be a multiple of 64")
    if not a.true_shape:
        for opt, bad in (("--keep", a.keep), ("--cache-share", a.cache_share is not None),
                         ("--moe-layers", a.moe_layers != 2)):
            if bad:
                ap.error(f"{opt} goes with --true-shape")
        return
    if a.expert_format is None:
        a.expert_format = "q3_nl"
    if a.expert_format not in ("q3_nl", "q2_vq") or a.trunk_format or a.dim or a.activations:
        ap.error("--true-shape takes --expert-format q3_nl or q2_vq, and no --trunk-format, --dim or --activations")
    if a.family != "k3":
        ap.error("--true-shape is K3's expert shape: use it with --family k3")
    if a.routing or a.dispatch or a.no_stream:
        ap.error("--true-shape measures exact routing alone: leave out --routing, --dispatch and --no-stream")
    if not 1 <= a.moe_layers <= 92:
        ap.error("--moe-layers must be 1 to 92 (K3 has 92 MoE layers)")
    try:
        sweep = [int(r) for r in a.readers_sweep.split(",") if r]
    except ValueError:
        sweep = []
    if not sweep or any(not 1 <= r <= 64 for r in sweep):
        ap.error("--readers-sweep must be reader counts from 1 to 64, separated by commas (e.g. 1,2,4,8)")
    if a.cache_share is not None and not 0.0 <= a.cache_share < 1.0:
        ap.error("--cache-share must be a fraction from 0 to 1 (e.g. 0.018)")
    if a.tokens < 1 or a.rounds < 1:
        ap.error("--tokens and --rounds must be at least 1")


def true_shape_main(a) -> int:
    """bench/stream.py --true-shape: write, measure, delete (unless --keep), print JSON."""
    where_root = Path(a.workdir) if a.workdir else Path(tempfile.gettempdir())
    if not a.keep or not a.workdir:
        # refuse before any work (prepare_true_shape checks again when it writes)
        check_true_shape_space(where_root, a.moe_layers, a.expert_format)
    where_root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="ferry-true-shape-", dir=where_root)) if not a.keep else where_root
    try:
        t0 = time.perf_counter()
        container = prepare_true_shape(a, tmp)
        prep = time.perf_counter() - t0
        plan = container_plan(container, 256)
        share = k3_cache_share() if a.cache_share is None else a.cache_share
        budget = plan.floor_bytes + plan.q8_bytes + int(share * plan.expert_bytes)   # q8: the default's scratch
        # (at the bench's budget: the default one would cache ~75 % of RAM of K3's records)
        with Engine(container, n_ctx=256, threads=1, ram_budget=budget) as probe:
            info = probe.info
        rng = np.random.default_rng(5)
        tokens = [int(t) for t in rng.integers(3, info.vocab, TRUE_PROMPT + a.tokens)]
        result = {
            "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
            "machine": {"arch": platform.machine(), "cpus": os.cpu_count()}, "load_1min_at_start": os.getloadavg()[0],
            "family": "k3", "true_shape": True, "expert_format": a.expert_format,
            "expert_shape": {"latent": K3_LATENT, "ffn": K3_FFN}, "experts": info.n_experts, "top_k": info.top_k,
            "moe_layers": info.n_moe_layers, "record_bytes": plan.record_bytes,
            "model_bytes": sum(p.stat().st_size for p in container.rglob("*.bin")),
            "cache_share": share, "budget_bytes": budget, "floor_bytes": plan.floor_bytes,
            "cache_records_beyond_floor": int(share * plan.expert_bytes) // plan.record_bytes,
            "cold_bytes_per_token": info.top_k * info.n_moe_layers * plan.record_bytes,
            "tokens": a.tokens, "prompt_tokens": TRUE_PROMPT, "rounds": a.rounds, "prepare_seconds": round(prep, 1),
        }
        result.update(true_shape_modes(a, container, plan, tokens, budget, info))
        from app.engine.speed import kernel_bytes_per_s
        result["mac_64gb"] = mac_prediction(lambda f: kernel_bytes_per_s(f, 1, "exact"))
        result["load_1min_at_end"] = os.getloadavg()[0]
    finally:
        if not a.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    result["kept"] = str(container) if a.keep else None
    print(json.dumps(result, indent=None if a.json else 1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
