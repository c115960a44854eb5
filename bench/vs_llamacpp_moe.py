"""Ferry against llama.cpp on a mixture-of-experts GGUF, in RAM and beyond it.

    python bench/vs_llamacpp.py --moe --json [--layers 16] [--type q4_0] [--rounds 3] [--limits 0.5 0.25]
        [--prompt 128] [--tokens 64] [--threads 2] [--workdir DIR] [--venv DIR] [--skip-ram] [--ferry-only]

(the same as ``python bench/vs_llamacpp_moe.py ...``). The file is a qwen3moe
GGUF with random zero-mean weights at Qwen3-30B-A3B widths (hidden 2048, 128
experts of FFN 768 stacked in 3-D tensors, top-8, 32 query / 4 KV heads of
128) and ``--layers`` layers, written by bench/make_gguf_moe.py into
``--workdir``; Ferry runs it converted with its defaults (the blocks kept).
llama.cpp is llama-cpp-python (bench/vs_llamacpp.py installs it into the
benchmark venv). Every measurement is a fresh child process; rounds are
interleaved and the engines take turns going first.

1. Cross-check: both engines decode ``--check-tokens`` greedy tokens from
   the same prompt, Ferry with exact activations (``activations="f32"``).
   Reported: the two token sequences, where they first differ, and each
   engine's top-1 minus top-2 logit there (a small gap on both sides is a
   near-tie that rounding order decides, not a disagreement).
2. In RAM: a warm-up prompt (as llama-bench does; ``--no-warmup``: none),
   then a fresh ``--prompt``-token prompt, then ``--tokens`` greedy tokens one
   at a time, both engines at their defaults (Ferry: the default activations
   and every expert cached; llama.cpp: ``Llama()`` defaults, which repack
   Q4_0 weights into anonymous memory).
3. Beyond RAM, for each of ``--limits`` (shares of the GGUF's size): each
   engine in its own memory cgroup (v1 ``memory.limit_in_bytes`` or v2
   ``memory.max``; the page cache counts against it), the whole page cache
   dropped before each run (as root; otherwise the run says ``cache: kept``).
   Engines: ``llama_cpp`` at its defaults (``Llama(use_mmap=True)``: load
   mode mmap, weight repacking on); ``llama_cpp_mmap``: the same with
   repacking off (llama_model_params ``use_extra_bufts`` = false, which
   llama-cpp-python has no argument for: set through the default
   parameters it starts from), i.e. llama.cpp's ``--repack 0 -lm mmap``;
   each run reports the load_mode, lazy_mode and use_extra_bufts it ran with. ``ferry``: defaults, with ``ram_budget`` =
   the limit less the child's Python process (its RSS before opening) less
   ``--slack`` bytes.

Ferry's child waits for the fill before its warm-up (``--no-fill-wait``: it
does not): when the expert cache holds every expert, the records stream into
it in the background after open (docs/ARCHITECTURE.md, "The fill"), and a
prompt run meanwhile waits on the disk for the records not yet in. The wait
is reported apart (``fill``: wall seconds and bytes read), beside the load;
llama.cpp's load reads and repacks the whole file before it returns.

The memory-bandwidth bound of decode, measured beside each run as in the
dense mode (bench/vs_llamacpp.py's ``BesideProbes``: bench/ceiling.py's read
probe of ``--threads`` threads before every run and once after the last,
every probe in ``memory_read_gb_s.probes``, each run's ``read_gb_s`` the
mean of the probes on either side of it); the weight bytes a decoded token
reads (bench/vs_llamacpp.py's ``weight_bytes_per_token``, from the GGUF:
every 2-D matrix but a token embedding the output does not share, top-k /
n-experts of each stacked expert tensor, the embedding row and the norms;
beside it Ferry's own count of the bytes its decode products read); and, in
RAM, each run's decode tok/s x those bytes / its read, each engine's median
over the rounds being its share of the bound
(``summary.in_ram.memory_bound``; the KV cache a token reads is counted
apart, as in the dense mode).

Per run: load seconds, prompt and decode tok/s, bytes read from the disk per
decoded token (/proc/self/io ``read_bytes``: page faults, readahead and
direct reads alike), the cgroup's peak usage (``memory.max_usage_in_bytes``
or ``memory.peak``: RSS plus page cache) and whether it was OOM-killed, the
process's peak RSS, and where the time went: for each phase wall, user and
system CPU seconds, major page faults; for Ferry also its prompt chunk
(``prompt_chunk``: tokens a forward pass takes), its own counters
(expert bytes read, read and stall seconds, cache hits and misses) and its
per-stage decode profile. Prints one JSON object: every run, then medians
per setting and engine and the ratios Ferry / llama.cpp (decode and prompt),
with the 1-minute load average before and after each run; and Ferry's decode
beyond RAM over its own in RAM (``ferry_decode_over_in_ram``, median over
median). ``--ferry-only`` runs Ferry alone (no cross-check, no llama.cpp):
for iterating on Ferry's own in-RAM against in-cgroup speed.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script from anywhere

from bench.procio import io_read_bytes  # noqa: E402  (stdlib only: llama.cpp's child runs in the bench venv)
from bench.vs_llamacpp import (LLAMA_CPP_VERSION, _huge_page_bytes, _peak_rss, _prompt, _rss_now, ensure_llama_cpp, log,  # noqa: E402
                               memory_bound, weight_bytes_per_token)

CGROUP_V1 = Path("/sys/fs/cgroup/memory")
CGROUP_V2 = Path("/sys/fs/cgroup")
N_CTX = 512


# ---------------------------------------------------------------- measuring a phase


def _mark() -> dict:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return {"t": time.perf_counter(), "user": r.ru_utime, "sys": r.ru_stime, "majflt": r.ru_majflt,
            "read": io_read_bytes()}


def _phase(a: dict, b: dict) -> dict:
    """Where the time of one phase went: wall, CPU (user, system) over all threads, major faults, disk bytes."""
    return {"wall_s": b["t"] - a["t"], "user_s": b["user"] - a["user"], "sys_s": b["sys"] - a["sys"],
            "major_faults": b["majflt"] - a["majflt"],
            "disk_read_bytes": b["read"] - a["read"] if a["read"] >= 0 else None}


def _margin(logits) -> float:
    """Top-1 minus top-2 logit."""
    import numpy as np
    top = np.partition(np.asarray(logits, dtype=np.float64), -2)[-2:]
    return float(top[1] - top[0])


# ---------------------------------------------------------------- children


def _drive(eval_fn, reset_fn, vocab: int, a) -> dict:
    """The same protocol for both engines: eval_fn(tokens) -> last logits;
    reset_fn() empties the context. As llama-bench does, a warm-up prompt (a
    different one) is evaluated first and its time reported apart."""
    import numpy as np
    out = {}
    if a.mode == "speed" and a.warmup:
        m0 = _mark()
        eval_fn(_prompt(vocab, a.prompt, 4))
        out["warmup"] = _phase(m0, _mark())
        reset_fn()
    if a.mode == "check":
        logits = eval_fn(_prompt(vocab, 16, 3))
        toks, margins = [], []
        for _ in range(a.check_tokens):
            tok = int(np.argmax(logits))
            toks.append(tok)
            margins.append(_margin(logits))
            logits = eval_fn([tok])
        return {"tokens": toks, "margins": margins, "logit_std": float(np.std(logits))}
    p = _prompt(vocab, a.prompt, 1)
    m0 = _mark()
    tok = int(np.argmax(eval_fn(p)))
    m1 = _mark()
    for _ in range(a.tokens):
        tok = int(np.argmax(eval_fn([tok])))
    m2 = _mark()
    out["prompt"] = _phase(m0, m1)
    out["decode"] = _phase(m1, m2)
    out["prompt_tok_s"] = a.prompt / out["prompt"]["wall_s"]
    out["decode_tok_s"] = a.tokens / out["decode"]["wall_s"]
    read = out["decode"]["disk_read_bytes"]
    out["decode_disk_bytes_per_token"] = None if read is None else read / a.tokens
    return out


def _wait_fill(info) -> dict:
    """Until the fill (every expert streamed into a cache that holds them all) has read every record: the
    process's disk reads reach the records' bytes, or stop growing for 3 s; at most 600 s."""
    n_records = info.n_moe_layers * info.n_experts
    expected = info.expert_bytes * n_records if info.cache_slots >= n_records else 0
    m0 = _mark()
    start, last, still, t0 = m0["read"], m0["read"], time.perf_counter(), time.perf_counter()
    while expected and start >= 0 and time.perf_counter() - t0 < 600:
        time.sleep(0.05)
        now = io_read_bytes()
        if now - start >= 0.999 * expected:
            break
        if now != last:
            last, still = now, time.perf_counter()
        elif time.perf_counter() - still > 3.0:
            break
    out = _phase(m0, _mark())
    out["expected_bytes"] = expected
    return out


def child_ferry(a) -> dict:
    before = _rss_now()
    from app.engine.binding import Engine
    python_rss = _rss_now()
    kw = {}
    if a.mode == "check":
        kw["activations"] = "f32"   # exact
    budget = 0
    if a.limit:
        budget = a.limit - python_rss - a.slack
        kw["ram_budget"] = budget
    m0 = _mark()
    eng = Engine(a.model, threads=a.threads, n_ctx=N_CTX, **kw)
    m1 = _mark()
    out = {"rss_before_import_bytes": before, "rss_python_bytes": python_rss, "ram_budget": budget,
           "load": _phase(m0, m1), "rss_after_open_bytes": _rss_now(), "activations": eng.info.activations,
           "kernels": eng.info.kernels, "cache_slots": eng.info.cache_slots, "trunk_bytes": eng.info.trunk_bytes,
           "prompt_chunk": eng.info.prompt_chunk}
    if a.mode == "speed" and a.fill_wait:
        out["fill"] = _wait_fill(eng.info)
    s = eng.session(N_CTX)
    keys = ("bytes_read", "expert_reads", "read_seconds", "stall_seconds", "compute_seconds", "hits", "misses",
            "decode_hits", "decode_misses", "decode_tokens", "prefetch_issued", "prefetch_used", "prefetch_wasted")
    start = {}

    def reset():
        s.reset()
        s.set_profiling(True)              # (restarts the counters: the warm-up is not in the profile)
        start.update({k: getattr(s.stats(), k) for k in keys})

    if a.mode == "speed":
        s.set_profiling(True)
    out.update(_drive(lambda toks: s.eval(toks), reset, eng.info.vocab, a))
    if a.mode == "speed":
        out["profile_decode"] = s.profile()["decode"]
        prof = out["profile_decode"]
        out["decode_weight_bytes_per_token"] = (sum(m["bytes"] for m in prof["matmul"].values())
                                                / max(1, prof["tokens"]))
        st = s.stats()
        out["ferry_stats"] = {k: getattr(st, k) - start.get(k, 0) for k in keys}   # prompt and decode
    out["peak_rss_bytes"] = _peak_rss()
    out["huge_page_bytes"] = _huge_page_bytes()   # after the decode: the trunk and the slots, 2 MiB pages or not
    s.close()
    eng.close()
    return out


def child_llama(a) -> dict:
    import numpy as np
    import llama_cpp
    import llama_cpp.llama_cpp as lc   # (the module Llama() takes its default parameters from)
    from llama_cpp import Llama
    out = {"rss_before_open_bytes": _rss_now(), "variant": a.variant}
    fields = [f[0] for f in lc.llama_model_params._fields_]
    if a.variant == "mmap":
        if "use_extra_bufts" not in fields:
            out["not_set"] = ["use_extra_bufts (this binding has no such field: repacking stays on)"]
        else:
            default = lc.llama_model_default_params

            def no_repack():
                p = default()
                p.use_extra_bufts = False   # llama.cpp's --no-repack
                return p
            lc.llama_model_default_params = no_repack
    m0 = _mark()
    llm = Llama(model_path=str(a.model), n_ctx=N_CTX, n_threads=a.threads, n_threads_batch=a.threads,
                use_mmap=True, verbose=False)
    m1 = _mark()
    out["load"] = _phase(m0, m1)
    out["rss_after_open_bytes"] = _rss_now()
    out["params"] = {k: int(getattr(llm.model_params, k)) for k in ("load_mode", "lazy_mode", "use_extra_bufts")
                     if k in fields}   # load_mode 1 = mmap (llama.cpp's -lm mmap)
    vocab = llm.n_vocab()

    def run(tokens):
        llm.eval(tokens)
        ptr = llama_cpp.llama_get_logits_ith(llm._ctx.ctx, -1)
        return np.ctypeslib.as_array(ptr, shape=(vocab,)).copy()

    out.update(_drive(run, llm.reset, vocab, a))
    out["peak_rss_bytes"] = _peak_rss()
    return out


# ---------------------------------------------------------------- cgroups


#: memory.stat counters a run's memory report keeps (v1 has the faults, v2 also the reclaim scans).
RECLAIM_STATS = ("pgfault", "pgmajfault", "pgscan", "pgsteal", "total_pgfault", "total_pgmajfault")


class MemoryLimit:
    """A memory cgroup (v1 or v2) with a hard limit that a child joins before it starts."""

    def __init__(self, limit: int, name: str):
        self.limit = limit
        if (CGROUP_V1 / "memory.limit_in_bytes").exists():
            self.v, self.path = 1, CGROUP_V1 / name
        elif (CGROUP_V2 / "cgroup.controllers").exists():
            self.v, self.path = 2, CGROUP_V2 / name
        else:
            raise SystemExit("no memory cgroup (v1 /sys/fs/cgroup/memory or v2 /sys/fs/cgroup) to limit a run in")
        self.path.mkdir()
        if self.v == 1:
            (self.path / "memory.limit_in_bytes").write_text(str(limit))
            if (self.path / "memory.memsw.limit_in_bytes").exists():
                try:   # no swapping around the limit either (the memory limit must be set first)
                    (self.path / "memory.memsw.limit_in_bytes").write_text(str(limit))
                except OSError:
                    pass
        else:
            (self.path / "memory.max").write_text(str(limit))
            if (self.path / "memory.swap.max").exists():
                (self.path / "memory.swap.max").write_text("0")

    def join(self) -> None:  # preexec_fn: runs in the child before exec
        (self.path / "cgroup.procs").write_text(str(os.getpid()))

    def report(self) -> dict:
        def read(name):
            try:
                return (self.path / name).read_text()
            except OSError:
                return ""
        if self.v == 1:
            peak = int(read("memory.max_usage_in_bytes") or 0)
            oom = read("memory.oom_control")
            failcnt = int(read("memory.failcnt") or 0)
        else:
            peak = int(read("memory.peak") or 0)
            oom = read("memory.events")
            failcnt = None
        kills = next((int(line.split()[1]) for line in oom.splitlines() if line.startswith("oom_kill ")), None)
        # the kernel's work for the limit over the run: page faults and (v2) pages scanned and reclaimed
        stat = dict(line.split()[:2] for line in read("memory.stat").splitlines() if len(line.split()) >= 2)
        reclaim = {k: int(stat[k]) for k in RECLAIM_STATS if k in stat and stat[k].isdigit()}
        return {"cgroup": f"v{self.v}", "limit_bytes": self.limit, "peak_bytes": peak, "oom_kills": kills,
                "limit_hits": failcnt, "reclaim": reclaim}

    def remove(self) -> None:
        for _ in range(50):
            try:
                self.path.rmdir()
                return
            except OSError:
                time.sleep(0.1)


def drop_caches() -> str:
    os.sync()
    try:
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return "dropped"
    except OSError:
        return "kept"


# ---------------------------------------------------------------- driver


def run_child(python: Path, engine: str, model: Path, a, mode: str, limit: int = 0, variant: str = "default",
              tag: str = "") -> dict:
    cmd = [str(python), str(Path(__file__).resolve()), "--child", engine, "--model", str(model), "--mode", mode,
           "--threads", str(a.threads), "--tokens", str(a.tokens), "--prompt", str(a.prompt),
           "--check-tokens", str(a.check_tokens), "--limit", str(limit), "--slack", str(a.slack),
           "--variant", variant] + ([] if a.warmup else ["--no-warmup"]) + ([] if a.fill_wait else ["--no-fill-wait"])
    cg = MemoryLimit(limit, f"ferry-bench-{os.getpid()}-{tag}") if limit else None
    res = {"cache": drop_caches() if limit else "kept", "load1_before": os.getloadavg()[0]}
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, cwd=str(ROOT), timeout=a.timeout,
                              preexec_fn=cg.join if cg else None)
        if done.returncode != 0:
            how = f"killed by signal {-done.returncode}" if done.returncode < 0 else f"exit status {done.returncode}"
            res["error"] = f"{engine} child {how}: {done.stderr[-1500:]}"
        else:
            res.update(json.loads(done.stdout.strip().splitlines()[-1]))
    except subprocess.TimeoutExpired:
        res["error"] = f"{engine} child did not finish in {a.timeout} s"
    finally:
        if cg:
            res["memory"] = cg.report()
            cg.remove()
    res["load1_after"] = os.getloadavg()[0]
    return res


def crosscheck(ferry: dict, llama: dict) -> dict:
    """Where the greedy sequences first differ, and both engines' top-2 gaps there."""
    if "error" in ferry or "error" in llama:
        return {"error": ferry.get("error") or llama.get("error")}
    a, b = ferry["tokens"], llama["tokens"]
    first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
    out = {"ferry_tokens": a, "llama_cpp_tokens": b, "agree": first is None, "first_difference": first}
    if first is not None:
        out["gap_there"] = {"ferry": ferry["margins"][first], "llama_cpp": llama["margins"][first]}
        out["median_gap"] = {"ferry": statistics.median(ferry["margins"]),
                             "llama_cpp": statistics.median(llama["margins"])}
    return out


METRICS = ("prompt_tok_s", "decode_tok_s", "decode_disk_bytes_per_token", "peak_rss_bytes")


def summarize(runs: list[dict]) -> dict:
    """Medians per setting and engine, and Ferry over each llama.cpp variant."""
    out = {}
    for setting in dict.fromkeys(r["setting"] for r in runs):
        med = {}
        for eng in dict.fromkeys(r["engine"] for r in runs if r["setting"] == setting):
            rs = [r for r in runs if r["setting"] == setting and r["engine"] == eng]
            ok = [r for r in rs if "error" not in r]
            m = {k: (None if any(r[k] is None for r in ok) else statistics.median(r[k] for r in ok))
                 for k in METRICS} if ok else {}
            if ok and ok[0].get("memory"):
                m["cgroup_peak_bytes"] = statistics.median(r["memory"]["peak_bytes"] for r in ok)
            m["runs"], m["failed"] = len(rs), len(rs) - len(ok)
            med[eng] = m
        ratios = {}
        for eng, m in med.items():
            if eng.startswith("llama") and "decode_tok_s" in m and "decode_tok_s" in med.get("ferry", {}):
                ratios[f"ferry_over_{eng}"] = {k: med["ferry"][k] / m[k] for k in ("decode_tok_s", "prompt_tok_s")}
        ram = [r for r in runs if r["setting"] == "in_ram" and r["engine"] == "ferry" and "error" not in r]
        mine = [r for r in runs if r["setting"] == setting and r["engine"] == "ferry" and "error" not in r]
        if setting != "in_ram" and ram and mine:   # Ferry against itself in RAM: median over median, and per round
            ratios["ferry_decode_over_in_ram"] = (statistics.median(r["decode_tok_s"] for r in mine)
                                                  / statistics.median(r["decode_tok_s"] for r in ram))
            by_round = {r["round"]: r["decode_tok_s"] for r in ram}
            ratios["ferry_decode_over_in_ram_by_round"] = [r["decode_tok_s"] / by_round[r["round"]] for r in mine
                                                           if r["round"] in by_round]
        out[setting] = {"median": med, "ratios": ratios}
    return out


def gguf_file(a) -> Path:
    path = a.workdir / f"synthetic-qwen3moe-{a.layers}l-{a.type}.gguf"
    if not path.exists():
        from bench import make_gguf_moe
        log(f"writing {path}")
        tmp = path.with_suffix(".part")
        make_gguf_moe.write(tmp, a.type, a.layers)
        tmp.rename(path)
    return path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="one line of JSON (default: indented)")
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--type", choices=("q4_0", "q4_k_m"), default="q4_0")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--tokens", type=int, default=64, help="decoded tokens per run")
    ap.add_argument("--check-tokens", type=int, default=16, help="greedy tokens compared between the engines")
    ap.add_argument("--limits", type=float, nargs="*", default=[0.5, 0.25],
                    help="memory limits as shares of the GGUF's size (none: in RAM only)")
    ap.add_argument("--slack", type=int, default=16 << 20,
                    help="bytes of the limit Ferry's budget leaves free besides its Python process")
    ap.add_argument("--skip-ram", action="store_true", help="only the runs beyond RAM")
    ap.add_argument("--ferry-only", action="store_true",
                    help="only Ferry's runs: no llama.cpp, no cross-check (to iterate on Ferry's own ratios)")
    ap.add_argument("--no-warmup", dest="warmup", action="store_false",
                    help="measure the first prompt after loading (default: a warm-up prompt first, as llama-bench)")
    ap.add_argument("--no-fill-wait", dest="fill_wait", action="store_false",
                    help="Ferry's child starts its warm-up right after open, while the fill may still be reading "
                         "(default: it waits for the fill and reports the wait apart)")
    ap.add_argument("--timeout", type=float, default=3600, help="seconds a child may take")
    ap.add_argument("--venv", type=Path, default=ROOT / ".bench-venv")
    ap.add_argument("--workdir", type=Path, default=Path.home() / ".cache" / "ferry-bench")
    ap.add_argument("--child", choices=("ferry", "llama_cpp"), help=argparse.SUPPRESS)
    ap.add_argument("--model", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--mode", choices=("check", "speed"), default="speed", help=argparse.SUPPRESS)
    ap.add_argument("--limit", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--variant", default="default", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        print(json.dumps(child_ferry(a) if a.child == "ferry" else child_llama(a)))
        return 0
    a.workdir.mkdir(parents=True, exist_ok=True)
    llama_py = None if a.ferry_only else ensure_llama_cpp(a.venv)
    gguf = gguf_file(a)
    from bench.vs_llamacpp import container
    ferry_model = container(gguf, a.workdir)
    size = gguf.stat().st_size
    me = Path(sys.executable)
    from bench.vs_llamacpp import BesideProbes
    probes = BesideProbes(a.threads)
    check = None
    if not a.ferry_only:
        log("cross-check: greedy tokens, Ferry exact")
        check = {"ferry": run_child(me, "ferry", ferry_model, a, "check"),
                 "llama_cpp": run_child(llama_py, "llama_cpp", gguf, a, "check")}
    settings = ([] if a.skip_ram else [("in_ram", 0)]) + [(f"limit_{share:g}", int(size * share))
                                                          for share in a.limits]
    runs = []
    n = 0
    for r in range(a.rounds):
        for setting, limit in (settings if r % 2 == 0 else settings[::-1]):   # in RAM first, then last
            engines = [("ferry", me, ferry_model, "default"), ("llama_cpp", llama_py, gguf, "default")]
            if limit:
                engines.append(("llama_cpp_mmap", llama_py, gguf, "mmap"))
            if a.ferry_only:
                engines = engines[:1]
            k = r % len(engines)
            for name, py, model, variant in engines[k:] + engines[:k]:   # each engine leads in turn
                n += 1
                log(f"round {r + 1}/{a.rounds} {setting} {name}")
                probes.take(f"round {r + 1} {setting} {name}")
                res = run_child(py, "ferry" if name == "ferry" else "llama_cpp", model, a, "speed", limit,
                                variant, tag=str(n))
                probes.beside(res)
                res.update(round=r + 1, setting=setting, engine=name)
                runs.append(res)
                log(json.dumps({k: v for k, v in res.items() if k not in ("profile_decode",)}))
    probes.finish()
    summary = summarize(runs)
    if not a.skip_ram:
        ram = [r for r in runs if r.get("setting") == "in_ram"]
        rounds = [{r["engine"]: r for r in ram if r["round"] == k} for k in sorted({r["round"] for r in ram})]
        reads = [r["read_gb_s"] for r in ram if "read_gb_s" in r]
        read = statistics.median(reads) if reads else probes.record()["median"]   # (no run decoded)
        summary["in_ram"]["memory_bound"] = memory_bound(summary["in_ram"]["median"], read,
                                                         weight_bytes_per_token(gguf),
                                                         context=a.prompt + (a.tokens - 1) / 2, rounds=rounds)
    cpu = ""
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    out = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "machine": platform.machine(), "cpu": cpu,
           "cores": os.cpu_count(), "ram_bytes": os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"),
           "threads": a.threads, "llama_cpp_python": LLAMA_CPP_VERSION,
           "gguf": {"path": str(gguf), "bytes": size, "layers": a.layers, "type": a.type},
           "container_bytes": sum(p.stat().st_size for p in ferry_model.rglob("*") if p.is_file()),
           "prompt": a.prompt, "tokens": a.tokens, "rounds": a.rounds,
           "crosscheck": crosscheck(check["ferry"], check["llama_cpp"]) if check else None, "crosscheck_runs": check,
           "memory_read_gb_s": {"before": probes.probes[0]["gb_s"], "after": probes.probes[-1]["gb_s"],
                                **probes.record()},
           "runs": runs, "summary": summary}
    print(json.dumps(out, indent=None if a.json else 1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
