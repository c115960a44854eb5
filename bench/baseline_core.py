"""An earlier revision's C core and Python binding, built outside the
repository, with its Kimi-family expert dispatch timed the way this tree's
profile times it (ferry_profile_part.dispatch_seconds), for before/after
figures (bench/stream.py --dispatch).

A revision whose profile already has dispatch_seconds is built as it is.
The default baseline is the commit before core_c/src/moe.c (`git log -- core_c/src/moe.c`):
the Kimi path's own MoE loop, which scanned all E experts against every
token's choices and fetched each chosen expert on its own. The timer added
to it counts what the new loop's timer counts: the MoE layer from its
router product to the rank-order sum, less the router's and the experts'
products (and K3's latent down-projection, which the new loop leaves to the
architecture) and less the time spent waiting for reads. Nothing else in the
old source changes.

    python bench/baseline_core.py [--rev b663f61] [--where ~/.cache/ferry-bench/s17]
"""
from __future__ import annotations

import argparse
import io
import subprocess
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: The commit before the one MoE loop (core_c/src/moe.c) was introduced.
BASELINE = "b663f61"
DEFAULT_WHERE = Path.home() / ".cache" / "ferry-bench" / "s17"

# (file, anchor, replacement): each anchor must occur exactly once.
_TIMER = [
    ("core_c/src/model.h", "    ferry_stats stats;          /* counters */\n",
     "    ferry_stats stats;          /* counters */\n"
     "    double bench_dispatch[2];   /* bench timer: prompt chunks, single steps */\n"
     "    uint64_t bench_layers[2];\n"),
    ("core_c/include/ferry.h", "void ferry_session_stats(const ferry_session *session, ferry_stats *stats);\n",
     "void ferry_session_stats(const ferry_session *session, ferry_stats *stats);\n"
     "void ferry_session_bench_dispatch(const ferry_session *session, double *seconds, uint64_t *layers);\n"),
    ("core_c/src/engine.c", "void ferry_session_stats(const ferry_session *s, ferry_stats *out) { *out = s->stats; }\n",
     "void ferry_session_stats(const ferry_session *s, ferry_stats *out) { *out = s->stats; }\n"
     "void ferry_session_bench_dispatch(const ferry_session *s, double *seconds, uint64_t *layers) {\n"
     "    for (int i = 0; i < 2; i++) { seconds[i] = s->bench_dispatch[i]; layers[i] = s->bench_layers[i]; }\n"
     "}\n"),
    ("core_c/src/arch_kimi.c", "    matmul(s, b, &L->router, b->xb, n, b->router);\n",
     "    double bench_t0 = fe_now(), bench_stall0 = s->stats.stall_seconds, bench_off = 0.0, bench_t;\n"
     "    bench_t = fe_now();\n"
     "    matmul(s, b, &L->router, b->xb, n, b->router);\n"
     "    bench_off += fe_now() - bench_t;\n"),
    ("core_c/src/arch_kimi.c",
     "    if (k->latent_dim) matmul(s, b, &L->lat_down, b->xb, n, b->z);\n"
     "    else memcpy(b->z, b->xb, (size_t)n * ed * sizeof(float));\n",
     "    bench_t = fe_now();\n"
     "    if (k->latent_dim) matmul(s, b, &L->lat_down, b->xb, n, b->z);\n"
     "    else memcpy(b->z, b->xb, (size_t)n * ed * sizeof(float));\n"
     "    bench_off += fe_now() - bench_t;\n"),
    ("core_c/src/arch_kimi.c", "        mlp(s, b, &g, &u, &dn, b->ex_in, m, b->u);\n",
     "        bench_t = fe_now();\n"
     "        mlp(s, b, &g, &u, &dn, b->ex_in, m, b->u);\n"
     "        bench_off += fe_now() - bench_t;\n"),
    ("core_c/src/arch_kimi.c",
     "    if (k->latent_dim) {\n        for (int t = 0; t < n; t++) fe_rmsnorm(b->u",
     "    s->bench_dispatch[n == 1] += fe_now() - bench_t0 - bench_off - (s->stats.stall_seconds - bench_stall0);\n"
     "    s->bench_layers[n == 1]++;\n"
     "    if (k->latent_dim) {\n        for (int t = 0; t < n; t++) fe_rmsnorm(b->u"),
]


def instrument(root: Path) -> None:
    for rel, anchor, replacement in _TIMER:
        path = root / rel
        text = path.read_text()
        if text.count(anchor) != 1:
            raise SystemExit(f"{rel}: the anchor for the dispatch timer is not there once (wrong revision?)")
        path.write_text(text.replace(anchor, replacement))


def build(rev: str = BASELINE, where: Path = DEFAULT_WHERE) -> Path:
    """The tree of `rev` (app/ and core_c/) with its core compiled and timed,
    under `where`; built once and reused. Put it first on sys.path to import
    its `app`."""
    root = where / f"core-{rev}"
    if (root / ".built").exists():
        return root
    root.mkdir(parents=True, exist_ok=True)
    blob = subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", rev, "app", "core_c"],
                          check=True, capture_output=True).stdout
    with tarfile.open(fileobj=io.BytesIO(blob)) as tar:
        tar.extractall(root, filter="data")
    if "dispatch_seconds" not in (root / "core_c" / "include" / "ferry.h").read_text():
        instrument(root)  # (a revision with the profile's dispatch timer needs none)
    done = subprocess.run([sys.executable, "-c", "from core_c.build_ferry import ffibuilder; "
                           "ffibuilder.compile(tmpdir='.')"], cwd=root, capture_output=True, text=True)
    if done.returncode or not list((root / "app" / "engine").glob("_ferry_c*.so")):
        raise SystemExit(f"the core of {rev} did not build in {root}:\n{done.stderr[-2000:]}")
    (root / ".built").write_text(rev + "\n")
    return root


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rev", default=BASELINE)
    ap.add_argument("--where", type=Path, default=DEFAULT_WHERE)
    a = ap.parse_args(argv)
    print(build(a.rev, a.where))
    return 0


if __name__ == "__main__":
    sys.exit(main())
