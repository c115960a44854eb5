"""Exact (f32) against the 8-bit activations (q8, the default's arithmetic on quantized weights): decode and prompt
tokens per second on the same containers, in one process, interleaved.

    python bench/q8_speed.py --json [--files demo 1b-q4_k_m 1b-q8_0] [--rounds 5] [--threads 2]

Both engines stay open side by side (one session each); every round runs a
fresh ``--prompt``-token prompt (chunks of 32, as the app evaluates prompts)
and then ``--tokens`` greedy decode steps on each engine, the engine that goes
first alternating by round. Prints the medians per file and engine, the ratios
q8 / f32 (above 1: q8 is faster), the share of greedy tokens on which the two
engines agreed, and the 1-minute load average before and after each round.
``--kernels`` instead times one matrix product per format and shape on one
thread (ferry_kernel_matmul against ferry_kernel_matmul_q8, the latter
including quantizing x; this thread's CPU time, best of ``--rounds`` x 5
calls, interleaved; ``--formats q3_nl`` for some formats only).
``--sets avx2 avx512vnni`` compares two q8 engines with those kernel sets
instead of f32 against q8 (with per-phase process CPU time: use --threads 1
on a shared machine). ``--kernels --sets avx2 avx512vnni`` compares two q8 kernel sets of this
build in one process instead: the same product with each set, alternating
call by call, per-thread CPU time (robust to other processes' load), best of
``--rounds`` x 5 calls per case, ratios first / second (above 1: the second
set is faster); it also checks the two sets' outputs are bit-identical.
``--kernels --base DIR`` compares the q8 kernels of two builds instead: DIR
a checkout with its core built in place, each round one child process per
build (alternating which goes first), best time per case, ratios base / new.
Files: ``demo`` is the converted demo model (SmolLM2-135M-Instruct Q4_1),
``1b-*`` the synthetic Llama-shaped containers bench/vs_llamacpp.py makes in
``--workdir`` (random weights: speed only), ``moe-q3_nl`` a synthetic
Qwen3-MoE-shaped one (hidden 2048, 4 layers x 32 experts of 768, top 8) with
q3_nl experts and a q8_0 trunk, made here on first use.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script from anywhere

FILES = ("demo", "1b-q4_k_m", "1b-q8_0", "3b-q4_k_m", "3b-q8_0", "moe-q3_nl")
MODES = ("f32", "q8")


def container(name: str, workdir: Path) -> Path:
    if name == "demo":
        from app import demo
        return _converted(demo.gguf_path(install=True), workdir)
    if name == "moe-q3_nl":  # Qwen3-30B-A3B's expert widths, 4 layers x 32 experts, top 8: q3_nl experts, q8_0 trunk
        out = workdir / "synthetic-moe-q3_nl.ferry"
        if not (out / "manifest.json").exists():
            from app.convert.convert import convert
            from bench.make_synthetic import make, parse
            ckpt = make(parse(["--out", str(workdir / "synthetic-moe-ckpt"), "--layers", "4", "--experts", "32",
                               "--top-k", "8", "--dim", "2048", "--heads", "16", "--expert-ffn", "768"]))
            convert(ckpt, out, trunk_format="q8_0", expert_format="q3_nl")
        return out
    path = workdir / f"synthetic-{name}.ferry"
    if not (path / "manifest.json").exists():
        raise SystemExit(f"{path} is missing: run bench/vs_llamacpp.py --files {name} once to make it")
    return path


def _converted(gguf: Path, workdir: Path) -> Path:
    out = workdir / (gguf.stem + ".ferry")
    if not (out / "manifest.json").exists():
        from app.convert.convert import convert
        convert(gguf, out)
    return out


def one_round(session, vocab: int, prompt_len: int, tokens: int, seed: int) -> dict:
    import numpy as np
    rng = np.random.default_rng(seed)
    prompt = [int(t) for t in rng.integers(100, vocab - 100, prompt_len)]
    session.reset()
    t0, c0 = time.perf_counter(), time.process_time()
    logits = session.eval(prompt)
    prompt_s, prompt_cpu = time.perf_counter() - t0, time.process_time() - c0
    tok, out = int(np.argmax(logits)), []
    t0, c0 = time.perf_counter(), time.process_time()
    for _ in range(tokens):
        out.append(tok)
        tok = int(np.argmax(session.eval([tok])))
    decode_s, decode_cpu = time.perf_counter() - t0, time.process_time() - c0
    return {"prompt_tok_s": prompt_len / prompt_s, "decode_tok_s": tokens / decode_s,
            "prompt_cpu_ms_per_tok": prompt_cpu * 1e3 / prompt_len, "decode_cpu_ms_per_tok": decode_cpu * 1e3 / tokens,
            "greedy": out}


def bench_file(path: Path, a) -> dict:
    """Two engines on one file, interleaved: f32 against q8, or (--sets) two q8 kernel sets."""
    from app.engine.binding import Engine
    if a.sets:
        modes = tuple(a.sets)
        opts = {m: {"kernels": m, "activations": "q8"} for m in modes}
    else:
        modes = MODES
        opts = {m: {"activations": m} for m in modes}
    engines = {m: Engine(path, threads=a.threads, n_ctx=a.prompt + a.tokens + 8, **opts[m]) for m in modes}
    sessions = {m: e.session(a.prompt + a.tokens + 8) for m, e in engines.items()}
    vocab, kernels = engines[modes[0]].info.vocab, {m: e.info.kernels for m, e in engines.items()}
    keys = ("prompt_tok_s", "decode_tok_s", "prompt_cpu_ms_per_tok", "decode_cpu_ms_per_tok")
    rounds = []
    for r in range(a.rounds):
        order = modes if r % 2 == 0 else modes[::-1]
        rnd = {"order": list(order), "load1_before": os.getloadavg()[0]}
        for m in order:
            rnd[m] = one_round(sessions[m], vocab, a.prompt, a.tokens, seed=r)
        rnd["load1_after"] = os.getloadavg()[0]
        rnd["greedy_agree"] = sum(x == y for x, y in zip(rnd[modes[0]].pop("greedy"),
                                                         rnd[modes[1]].pop("greedy"))) / a.tokens
        rounds.append(rnd)
        print(json.dumps({"file": path.name, "round": r + 1, **rnd}), file=sys.stderr, flush=True)
    med = {m: {k: statistics.median(r[m][k] for r in rounds) for k in keys} for m in modes}
    for s in sessions.values():
        s.close()
    for e in engines.values():
        e.close()
    ratio = {k: med[modes[1]][k] / med[modes[0]][k] for k in ("prompt_tok_s", "decode_tok_s")}
    ratio.update({k: med[modes[0]][k] / med[modes[1]][k] for k in ("prompt_cpu_ms_per_tok", "decode_cpu_ms_per_tok")})
    return {"kernels": kernels, "rounds": rounds, "median": med, f"{modes[1]}_over_{modes[0]}": ratio,
            "greedy_agree_median": statistics.median(r["greedy_agree"] for r in rounds)}


KERNEL_SHAPES = (("q4_1", 1536, 576), ("q4_1", 576, 1536), ("q4_1", 576, 576), ("q8_0", 49152, 576), ("q8_0", 2048, 2048),
                 ("q4_0", 2048, 2048), ("q4_k", 8192, 2048), ("q4_k", 2048, 8192), ("q5_k", 2048, 2048),
                 ("q6_k", 2048, 8192),
                 # q3_nl experts: Qwen3-30B-A3B's gate/up and down, a K3-sized one
                 ("q3_nl", 768, 2048), ("q3_nl", 2048, 768), ("q3_nl", 3072, 3584),
                 ("q4_0", 1536, 2048), ("q4_0", 2048, 768))  # a Qwen3-30B-A3B expert in q4_0: gate+up, down


def kernel_cases(lib, ffi, formats=()):
    """(format, rows, cols, tokens, code, weights, x) for every timed product, the same data each run."""
    import numpy as np
    rng = np.random.default_rng(0)
    for fmt, rows, cols in KERNEL_SHAPES:
        if formats and fmt not in formats:
            continue
        code = lib.ferry_format_code(fmt.encode())
        nbytes = lib.ferry_format_row_bytes(code, cols) * rows
        w = rng.integers(0, 256, nbytes, dtype=np.uint8)
        if fmt == "q3_nl":  # real blocks: Ferry's quantizer on Gaussian values
            src = rng.standard_normal(rows * cols).astype(np.float32)
            lib.ferry_q3_quantize_f32(ffi.from_buffer("float[]", src), rows, cols, ffi.NULL,
                                      ffi.from_buffer("uint8_t[]", w))
        elif fmt in ("q8_0", "q4_0", "q4_1"):  # real scales: quantize random values
            src = rng.standard_normal(rows * cols).astype(np.float32)
            lib.ferry_quantize_blocks(code, ffi.from_buffer("float[]", src), rows * cols, ffi.from_buffer("uint8_t[]", w))
        else:  # random blocks with small f16 scales in every 256-value block
            blocks = w.reshape(-1, nbytes // (rows * cols // 256))
            at = 208 if fmt == "q6_k" else 0
            blocks[:, at:at + 2] = np.frombuffer(np.float16(0.01).tobytes(), np.uint8)
            if fmt != "q6_k":
                blocks[:, 2:4] = np.frombuffer(np.float16(0.001).tobytes(), np.uint8)
        for n in (1, 4, 32):
            yield fmt, rows, cols, n, code, w, rng.standard_normal(n * cols).astype(np.float32)


def q8_set_ids(lib, ffi) -> dict[str, int]:
    """The q8 kernel sets of this build by name ("scalar", "avx2", "neon", "avx512vnni")."""
    return {ffi.string(lib.ferry_q8_kernels_name(i)).decode(): i for i in range(8)}


def q8_auto(lib, ffi, impl: int) -> int:
    """The q8 kernel set beside the exact set `impl` that kernels "auto" uses: AVX-512 VNNI when this
    CPU runs it (and impl is AVX2), else impl's own. (Before 2026-12-05 15:45 UTC this bench timed
    impl's own q8 set, AVX2, even where the engine used VNNI.)"""
    names = q8_set_ids(lib, ffi)
    vnni = names.get("avx512vnni")
    avx2 = names.get("avx2")
    return vnni if impl == avx2 and vnni is not None and lib.ferry_q8_kernels_available(vnni) else impl


def bench_kernels(a) -> list[dict]:
    import numpy as np
    from app.engine._ferry_c import ffi, lib
    impl = lib.ferry_kernels_best()
    q8_impl = q8_auto(lib, ffi, impl)   # the q8 set the engine's "auto" takes (AVX-512 VNNI where it runs)
    out = []
    for fmt, rows, cols, n, code, w, x in kernel_cases(lib, ffi, a.formats):
        y = np.zeros(n * rows, np.float32)
        args = (code, ffi.from_buffer("uint8_t[]", w), rows, cols, ffi.from_buffer("float[]", x), n,
                ffi.from_buffer("float[]", y))
        best = {"f32": float("inf"), "q8": float("inf")}
        for _ in range(a.rounds):
            for name, fn, i in (("f32", lib.ferry_kernel_matmul, impl), ("q8", lib.ferry_kernel_matmul_q8, q8_impl)):
                for _ in range(5):
                    t0 = time.thread_time_ns()   # this thread's CPU time: robust to other processes' load
                    fn(i, *args)
                    best[name] = min(best[name], (time.thread_time_ns() - t0) / 1e9)
        out.append({"format": fmt, "rows": rows, "cols": cols, "tokens": n, "f32_ms": best["f32"] * 1e3,
                    "q8_ms": best["q8"] * 1e3, "q8_speedup": best["f32"] / best["q8"], "clock": "thread_cpu",
                    "q8_set": ffi.string(lib.ferry_q8_kernels_name(q8_impl)).decode()})
        print(json.dumps(out[-1]), file=sys.stderr, flush=True)
    return out


def compare_sets(a) -> dict:
    """The same q8 products with two kernel sets of this build, alternating call by call (thread CPU time)."""
    import numpy as np
    from app.engine._ferry_c import ffi, lib
    names = q8_set_ids(lib, ffi)
    impls = []
    for s in a.sets:
        if s not in names or not lib.ferry_q8_kernels_available(names[s]):
            raise SystemExit(f"q8 kernel set {s!r} is not available on this CPU/build")
        impls.append(names[s])
    out = []
    for fmt, rows, cols, n, code, w, x in kernel_cases(lib, ffi, a.formats):
        ys = [np.zeros(n * rows, np.float32) for _ in impls]
        best = [float("inf")] * len(impls)
        wb, xb = ffi.from_buffer("uint8_t[]", w), ffi.from_buffer("float[]", x)
        for r in range(a.rounds * 5):
            order = range(len(impls)) if r % 2 == 0 else reversed(range(len(impls)))
            for i in order:
                t0 = time.thread_time_ns()
                lib.ferry_kernel_matmul_q8(impls[i], code, wb, rows, cols, xb, n, ffi.from_buffer("float[]", ys[i]))
                best[i] = min(best[i], (time.thread_time_ns() - t0) / 1e6)
        rec = {"format": fmt, "rows": rows, "cols": cols, "tokens": n,
               **{f"{s}_cpu_ms": b for s, b in zip(a.sets, best)},
               "ratio": best[0] / best[1], "bit_identical": all(np.array_equal(ys[0], y) for y in ys[1:]),
               "gop_s": [2.0 * rows * cols * n / (b * 1e-3) / 1e9 for b in best]}
        out.append(rec)
        print(json.dumps(rec), file=sys.stderr, flush=True)
    return {"sets": a.sets, "compare_sets": out, "load1_after": os.getloadavg()[0]}


def compare_builds(a) -> dict:
    """The q8 products of the build at a.base against this checkout's, interleaved child processes."""
    import subprocess
    trees = {"base": a.base.resolve(), "new": ROOT}
    best: dict = {}
    for r in range(a.rounds):
        for build in (("base", "new") if r % 2 == 0 else ("new", "base")):
            cmd = [sys.executable, str(Path(__file__).resolve()), "--kernels", "--rounds", "1", "--json",
                   "--child", str(trees[build])] + (["--formats", *a.formats] if a.formats else [])
            res = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)
            for k in res["kernels"]:
                key = (k["format"], k["rows"], k["cols"], k["tokens"])
                best.setdefault(key, {}).setdefault(build, float("inf"))
                best[key][build] = min(best[key][build], k["q8_ms"])
    out = [{"format": f, "rows": rows, "cols": cols, "tokens": n, "base_q8_ms": v["base"], "new_q8_ms": v["new"],
            "base_over_new": v["base"] / v["new"]} for (f, rows, cols, n), v in best.items()]
    for o in out:
        print(json.dumps(o), file=sys.stderr)
    return {"compare": out, "base": str(trees["base"]), "load1_after": os.getloadavg()[0]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="one line of JSON (default: indented)")
    ap.add_argument("--files", nargs="+", choices=FILES, default=["demo", "1b-q4_k_m", "1b-q8_0"])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt", type=int, default=128, help="prompt tokens per round")
    ap.add_argument("--tokens", type=int, default=16, help="decoded tokens per round")
    ap.add_argument("--workdir", type=Path, default=Path.home() / ".cache" / "ferry-bench")
    ap.add_argument("--kernels", action="store_true", help="time single products per format instead")
    ap.add_argument("--base", type=Path, help="with --kernels: compare the q8 kernels of the build in this checkout")
    ap.add_argument("--sets", nargs=2, metavar=("OLD", "NEW"),
                    help="compare two q8 kernel sets of this build (e.g. avx2 avx512vnni): with --kernels single "
                         "products, else engines on --files (ratios NEW over OLD: above 1 NEW is faster)")
    ap.add_argument("--formats", nargs="+", default=(), metavar="FMT",
                    help="with --kernels: only these weight formats (e.g. q3_nl)")
    ap.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    load_before = os.getloadavg()[0]
    if a.child:  # import app (and its built core) from that checkout
        sys.path.insert(0, str(a.child))
    if a.kernels and a.sets:
        results = compare_sets(a)
    elif a.kernels and a.base:
        results = compare_builds(a)
    elif a.kernels:
        results = {"kernels": bench_kernels(a)}
    else:
        results = {"files": {name: bench_file(container(name, a.workdir), a) for name in a.files}}
    cpu = ""
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    print(json.dumps({"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "machine": platform.machine(),
                      "cpu": cpu, "cores": os.cpu_count(), "threads": a.threads, "prompt": a.prompt,
                      "tokens": a.tokens, "rounds": a.rounds, "load1_before": load_before, **results}, indent=None if a.json else 1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
