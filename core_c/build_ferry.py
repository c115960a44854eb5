"""cffi builder (API mode, out of line) for Ferry's C core.

`pip install .` runs this through setuptools' ``cffi_modules``; it compiles
every ``core_c/src/*.c`` into the extension ``app.engine._ferry_c`` whose
interface is exactly the public headers in ``core_c/include``.
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

from cffi import FFI

CORE = Path(__file__).resolve().parent
#: Public headers, each with the source file that implements it.
HEADERS = {"ferry.h": "engine.c", "ferry_cachesim.h": "cachesim.c", "ferry_kernels.h": "kernels.c",
           "ferry_vision.h": "vision.c"}

# Callbacks the Python binding implements (see app/engine/binding.py).
PYTHON_CALLBACKS = """
extern "Python" void _ferry_stage_cb(void *, int, int, int, int, const float *);
extern "Python" int _ferry_progress_cb(void *, uint64_t, uint64_t);
extern "Python" int _ferry_vision_cb(void *, int, int, int, const float *);
"""


def cdef_text(header: Path) -> str:
    """A header reduced to what cffi's cdef accepts: declarations and integer #defines."""
    out = []
    skip_depth = 0
    for line in header.read_text().splitlines():
        stripped = line.strip()
        if stripped.startswith("#ifdef __cplusplus"):
            skip_depth = 1
            continue
        if skip_depth:
            if stripped.startswith("#endif"):
                skip_depth = 0
            continue
        if re.match(r"#define\s+\w+\s+-?\d+\s*(/\*.*\*/)?$", stripped):
            out.append(re.sub(r"/\*.*\*/", "", stripped))
        elif not stripped.startswith("#"):
            out.append(line)
    return "\n".join(out)


def compile_args() -> list[str]:
    args = ["-std=c11", "-O3", "-pthread", "-ffp-contract=off", "-Wall", "-Wextra"]
    if sys.platform == "darwin":
        args.append("-Wno-unused-command-line-argument")
    return args


def make_ffibuilder() -> FFI:
    builder = FFI()
    headers = [CORE / "include" / h for h, impl in HEADERS.items()
               if (CORE / "include" / h).exists() and (CORE / "src" / impl).exists()]
    builder.cdef("\n".join(cdef_text(h) for h in headers) + PYTHON_CALLBACKS)
    sources = sorted(str(p.relative_to(CORE.parent)) for p in (CORE / "src").glob("*.c"))
    builder.set_source(
        "app.engine._ferry_c",
        "\n".join(f'#include "{h.name}"' for h in headers),
        sources=sources,
        include_dirs=[str(CORE / "include")],
        extra_compile_args=compile_args(),
        extra_link_args=["-pthread", "-lm"],
    )
    return builder


ffibuilder = make_ffibuilder()

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
