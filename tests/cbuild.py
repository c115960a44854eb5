"""Building the C test programs (the C core's, the kernels') from objects compiled once per test run.

Several test files build programs from the same core_c/src files with the same flags (the kernel
programs and the C core's program under AddressSanitizer + UndefinedBehaviorSanitizer, the two kernel
programs natively and for aarch64). Each (compiler, flags, source) is compiled once per pytest run into
a folder beside the run's temporary folders, shared by the pytest-xdist workers (a lock per object: a
worker that finds an object being compiled by the other compiles something else first, then waits for
it). Nothing is kept across runs: the folder is the run's, and an object's name is a hash of the
compiler, the flags, the source and every header of the core, so a changed file is compiled again.
"""
from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CORE = REPO / "core_c"
INCLUDE = ["-I", str(CORE / "include")]
#: The sanitizer build of every test program: ASan + UBSan, stop at the first report.
SANITIZE = ["-std=c11", "-O1", "-g", "-Wall", "-Wextra", "-Werror", "-pthread", "-ffp-contract=off",
            "-fsanitize=address,undefined", "-fno-sanitize-recover=all", "-fno-omit-frame-pointer", *INCLUDE]
#: Source files compiled at once by one worker.
JOBS = 2


def host_cc() -> str:
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        pytest.fail("no C compiler found: install gcc or clang (Xcode command line tools on a Mac)")
    return cc


def _run_root(tmp_path_factory) -> Path:
    """The folder of this pytest run (the parent of each xdist worker's own temporary folder)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def _headers_digest() -> bytes:
    h = hashlib.sha256()
    for p in sorted([*(CORE / "include").glob("*.h"), *(CORE / "src").glob("*.h")]):
        h.update(p.name.encode() + b"\0" + p.read_bytes())
    return h.digest()


def objects(tmp_path_factory, cc: str, flags: list[str], sources: list[Path]) -> list[Path]:
    """Each source compiled with ``cc`` and ``flags`` (``-c``), reusing this run's earlier objects."""
    cache = _run_root(tmp_path_factory) / "c-objects"
    cache.mkdir(exist_ok=True)
    common = hashlib.sha256(b"\0".join([cc.encode(), *(f.encode() for f in flags), _headers_digest()])).digest()
    objs = [cache / f"{src.stem}-{hashlib.sha256(common + src.read_bytes()).hexdigest()[:16]}.o" for src in sources]

    def compile_one(src: Path, obj: Path, wait: bool) -> bool:
        """Compile unless done; False if another worker holds it and ``wait`` is off."""
        if obj.exists():
            return True
        with open(obj.with_suffix(".lock"), "w") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
            except BlockingIOError:
                return False
            if not obj.exists():
                part = obj.with_suffix(f".{os.getpid()}.part")
                res = subprocess.run([cc, *flags, "-c", str(src), "-o", str(part)], capture_output=True, text=True)
                assert res.returncode == 0, f"cannot compile {src.name} ({' '.join(flags)}):\n{res.stderr}"
                os.replace(part, obj)
        return True

    pairs = list(zip(sources, objs))
    with ThreadPoolExecutor(JOBS) as pool:
        done = list(pool.map(lambda p: compile_one(*p, wait=False), pairs))
        list(pool.map(lambda p: compile_one(*p, wait=True), [p for p, ok in zip(pairs, done) if not ok]))
    return objs


def program(tmp_path_factory, exe: Path, cc: str, flags: list[str], sources: list[Path],
            link: tuple[str, ...] = ()) -> Path:
    """A test program linked from ``sources``' objects (compiled as :func:`objects` does)."""
    objs = objects(tmp_path_factory, cc, flags, sources)
    res = subprocess.run([cc, *flags, *link, *map(str, objs), "-o", str(exe), "-lm"], capture_output=True, text=True)
    assert res.returncode == 0, f"cannot link {exe.name}:\n{res.stderr}"
    return exe
