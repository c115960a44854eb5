"""A bounded fuzzing pass over every parser that reads untrusted bytes.

C targets (core_c/fuzz/, libFuzzer with AddressSanitizer, LeakSanitizer and
UndefinedBehaviorSanitizer): the JSON parser, a container's manifest through
the public API, and the expert bank and record headers. Python targets
(tests/fuzz/fuzz_*.py, atheris): safetensors files, checkpoint index and
config files, GGUF files, tiktoken files and text, chat templates over
hostile conversations, hostile chat template sources (the render sandbox's
bounds), the file names a manifest gives (container containment), K3
requests, a hub's file list (names kept inside --into) and a repository's
shard index and configs as `ferry get --plan` stages them.

Each target starts from its seed corpus in fuzz/corpus/<target>/ (copied, so
the repository is never written) and runs for FERRY_FUZZ_SECONDS seconds
(default 10: the suite's share of the 20-minute budget, 15 until session 19; longer runs by setting it), two targets at a time. A target passes when libFuzzer ends on
its time limit with no crash, sanitizer report, leak, hang (an input taking
over 10 s), out-of-memory, or, for Python, an exception other than the ones
its parser documents. A failing target leaves the offending input in the test's
temporary folder and names it; copy it into fuzz/corpus/<target>/ once fixed.
Set FERRY_FUZZ_REPORT=FILE to write the run's counts as JSON.
"""
from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.conftest import REPO

HERE = Path(__file__).resolve().parent
CORPUS = REPO / "fuzz" / "corpus"
CORE = REPO / "core_c"
C_TARGETS = ("json", "manifest", "bank")
PY_TARGETS = ("safetensors", "checkpoint", "gguf", "tiktoken", "template", "template_source", "manifest_paths",
              "k3", "hub_listing", "staged_index")
TARGETS = C_TARGETS + PY_TARGETS
#: Extra libFuzzer options per target.
OPTIONS = {"bank": ["-max_len=1024"], "template": ["-max_len=2048"], "template_source": ["-max_len=4096"],
           "manifest_paths": ["-max_len=512"], "k3": ["-max_len=4096"], "hub_listing": ["-max_len=4096"],
           "staged_index": ["-max_len=4096"]}
SANITIZE = ["-fsanitize=fuzzer,address,undefined", "-fno-sanitize-recover=all", "-fno-omit-frame-pointer"]
PARALLEL = 2


def fuzz_seconds() -> int:
    return max(0, int(os.environ.get("FERRY_FUZZ_SECONDS", "10")))


# ---- building the C fuzzers ----

def _libfuzzer_cc(tmp: Path) -> tuple[str | None, str]:
    """A clang that links libFuzzer with the sanitizers, or None and why not."""
    candidates = [os.environ.get("FERRY_FUZZ_CC"), "clang", "clang-14", "clang-15", "clang-16", "clang-17",
                  "clang-18", "clang-19"]
    probe = tmp / "probe.c"
    probe.write_text("#include <stdint.h>\n#include <stddef.h>\n"
                     "int LLVMFuzzerTestOneInput(const uint8_t *d, size_t n) { (void)d; (void)n; return 0; }\n")
    tried = []
    for cc in filter(None, candidates):
        if not shutil.which(cc):
            continue
        res = subprocess.run([cc, *SANITIZE, str(probe), "-o", str(tmp / "probe")], capture_output=True, text=True)
        if res.returncode == 0:
            return cc, ""
        tried.append(f"{cc}: {res.stderr.strip().splitlines()[-1] if res.stderr.strip() else res.returncode}")
    why = "; ".join(tried) or "no clang on PATH"
    return None, (f"no clang with libFuzzer ({why}). On Debian/Ubuntu: apt-get install clang libclang-rt-14-dev "
                  "(scripts/test.sh does this as root); on a Mac: brew install llvm and set "
                  "FERRY_FUZZ_CC=$(brew --prefix llvm)/bin/clang")


#: The SIMD kernel sets: built with AddressSanitizer but without UndefinedBehaviorSanitizer here. Its checks
#: on their intrinsics cost clang 14 about 20 s of CPU per file (half the build); tests/kernels runs every
#: kernel set under both sanitizers against the scalar reference, and out-of-bounds reads or writes that a
#: hostile container could cause are AddressSanitizer's, kept.
SIMD_KERNELS = re.compile(r"kernels(_q8)?_(avx|neon)")
#: Source files compiled at once (the fuzz file's worker is otherwise one compiler at a time).
BUILD_JOBS = 2


def _compile(cc: str, src: Path, obj: Path) -> None:
    base = ["-std=c11", "-O1", "-g", "-pthread", "-I", str(CORE / "include"), "-c", str(src), "-o", str(obj)]
    flags = SANITIZE
    if SIMD_KERNELS.match(src.stem):
        flags = ["-fsanitize=fuzzer-no-link,address", *SANITIZE[1:]]
    res = subprocess.run([cc, *flags, *base], capture_output=True, text=True)
    if res.returncode != 0:
        # kernels_avx2.c uses __builtin_cpu_supports("f16c"), which some
        # clang 14 builds do not know; it is arithmetic, not a parser, so build
        # it without instrumentation by the ordinary compiler instead.
        other = shutil.which("gcc") or shutil.which("cc")
        res2 = subprocess.run([other, "-O1", *base], capture_output=True, text=True) if other else res
        if res2.returncode != 0:
            raise AssertionError(f"cannot compile {src.name} for fuzzing:\n{res.stderr}\n{res2.stderr}")


def build_c_fuzzers(tmp: Path) -> tuple[dict[str, Path], str]:
    """Compile the core once with the sanitizers (two files at a time) and link each fuzz target."""
    cc, why = _libfuzzer_cc(tmp)
    if cc is None:
        return {}, why
    sources = sorted((CORE / "src").glob("*.c"))
    objs = [str(tmp / (src.stem + ".o")) for src in sources]
    with ThreadPoolExecutor(BUILD_JOBS) as pool:
        list(pool.map(lambda src: _compile(cc, src, tmp / (src.stem + ".o")), sources))
    exes = {}
    for target in C_TARGETS:
        exe = tmp / f"fuzz_{target}"
        res = subprocess.run([cc, *SANITIZE, "-std=c11", "-O1", "-g", "-pthread", "-Wall", "-Wextra", "-Werror",
                              "-I", str(CORE / "include"), str(CORE / "fuzz" / f"fuzz_{target}.c"), *objs,
                              "-o", str(exe), "-lm"], capture_output=True, text=True)
        assert res.returncode == 0, f"cannot build fuzz_{target}:\n{res.stderr}"
        exes[target] = exe
    return exes, ""


def build_k3_container(tmp: Path) -> Path:
    from app.convert.convert import convert
    from tests.kimi import tiny_k3

    tiny_k3.build(tmp / "k3_ckpt")
    return convert(tmp / "k3_ckpt", tmp / "k3.ferry")


# ---- running ----

DONE = re.compile(r"#(\d+)\s+DONE\s+cov: (\d+) ft: (\d+) corp: (\d+)/(\S+)")
RUNS = re.compile(r"Done (\d+) runs in (\d+) second")
INITED = re.compile(r"#(\d+)\s+INITED\s+cov: (\d+) ft: (\d+) corp: (\d+)/(\S+)")


def run_target(target: str, command: list[str], env: dict, work: Path, seconds: int,
               extra_seeds: tuple[Path, ...] = ()) -> dict:
    """Fuzz one target from a copy of its seeds; its counts and any failing inputs."""
    corpus = work / "corpus"
    shutil.copytree(CORPUS / target, corpus)
    for i, seed in enumerate(extra_seeds):
        shutil.copy(seed, corpus / f"extra_{i}_{seed.name}")
    n_seeds = sum(1 for _ in corpus.iterdir())
    limits = [f"-max_total_time={seconds}"] if seconds else ["-runs=0"]
    cmd = [*command, *limits, "-timeout=10", "-rss_limit_mb=3072", "-print_final_stats=1",
           f"-artifact_prefix={work}/", *OPTIONS.get(target, []), str(corpus)]
    start = time.monotonic()
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=seconds + 300, cwd=work)
    log = res.stdout + res.stderr
    (work / "fuzz.log").write_text(log)
    artifacts = sorted(str(p) for p in work.iterdir()
                       if p.name.startswith(("crash-", "leak-", "timeout-", "oom-", "slow-unit-")))
    out = {"target": target, "rc": res.returncode, "wall_seconds": round(time.monotonic() - start, 1),
           "seeds": n_seeds, "artifacts": artifacts, "log": str(work / "fuzz.log"),
           "log_tail": "\n".join(log.strip().splitlines()[-40:])}
    if m := RUNS.search(log):
        out["executions"] = int(m.group(1))
    for key, pattern in (("start", INITED), ("end", DONE)):
        if m := list(pattern.finditer(log)):
            g = m[-1].groups()
            out[key] = {"cov": int(g[1]), "features": int(g[2]), "inputs": int(g[3]), "bytes": g[4]}
    return out


@pytest.fixture(scope="module")
def fuzz_results(request, tmp_path_factory) -> dict[str, dict]:
    """Run every selected target (two at a time) and collect the outcomes."""
    selected = {item.callspec.params["target"] for item in request.session.items
                if item.module is request.module and hasattr(item, "callspec")}
    tmp = tmp_path_factory.mktemp("fuzz")
    seconds = fuzz_seconds()
    results: dict[str, dict] = {}
    jobs = []  # (target, command, env, extra seeds)
    c_selected = sorted(selected & set(C_TARGETS))
    if c_selected:
        (tmp / "build").mkdir()
        exes, why = build_c_fuzzers(tmp / "build")
        containers: list[Path] = []
        if exes and {"manifest", "bank"} & set(c_selected):
            containers = [request.getfixturevalue("tiny_moe")[1], build_k3_container(tmp / "k3")]
        for target in c_selected:
            if not exes:
                results[target] = {"skip": why}
                continue
            env = {**os.environ, "ASAN_OPTIONS": "detect_leaks=1:symbolize=1",
                   "UBSAN_OPTIONS": "print_stacktrace=1:halt_on_error=1", "TMPDIR": str(tmp)}
            extra: tuple[Path, ...] = ()
            if target == "manifest":
                env["FERRY_FUZZ_CONTAINERS"] = ":".join(map(str, containers))
                # The live containers' own manifests join the seeds (which may predate them).
                extra = tuple(c / "manifest.json" for c in containers)
            elif target == "bank":
                env["FERRY_FUZZ_CONTAINERS"] = str(containers[0])
            jobs.append((target, [str(exes[target])], env, extra))
    py_selected = sorted(selected & set(PY_TARGETS))
    if py_selected:
        if importlib.util.find_spec("atheris") is None:
            for target in py_selected:
                results[target] = {"skip": "atheris is not installed (the test extra has it on Linux x86-64; "
                                           "pip install atheris elsewhere)"}
        else:
            for target in py_selected:
                env = {**os.environ, "TMPDIR": str(tmp)}
                jobs.append((target, [sys.executable, str(HERE / f"fuzz_{target}.py")], env, ()))

    def one(job):
        target, command, env, extra = job
        work = tmp / f"run_{target}"
        work.mkdir()
        return target, run_target(target, command, env, work, seconds, extra)

    with ThreadPoolExecutor(PARALLEL) as pool:
        for target, result in pool.map(one, jobs):
            results[target] = result
    if report := os.environ.get("FERRY_FUZZ_REPORT"):
        Path(report).write_text(json.dumps({"seconds": seconds, "results": results}, indent=2))
    return results


@pytest.mark.slow   # the targets share one fixture: the sanitizer build and FERRY_FUZZ_SECONDS each, two at a time
@pytest.mark.parametrize("target", TARGETS)
def test_fuzz_target(target, fuzz_results):
    result = fuzz_results[target]
    if "skip" in result:
        pytest.skip(result["skip"])
    problems = []
    if result["rc"] != 0:
        problems.append(f"the fuzzer exited with {result['rc']}")
    if result["artifacts"]:
        problems.append(f"it saved failing inputs: {', '.join(result['artifacts'])}")
    if "executions" not in result:
        problems.append("it printed no final statistics")
    assert not problems, f"fuzz target {target}: {'; '.join(problems)}\n{result['log_tail']}"
    assert result["executions"] >= result["seeds"], result


def test_seed_corpora_are_small_and_present():
    for target in TARGETS:
        files = [p for p in (CORPUS / target).iterdir() if p.is_file()]
        assert files, f"fuzz/corpus/{target} has no seeds"
        assert all(p.stat().st_size <= 64 * 1024 for p in files), target
