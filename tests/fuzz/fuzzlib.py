"""Shared by the atheris harnesses in this folder (run as scripts, not collected).

Each harness is ``python tests/fuzz/fuzz_NAME.py [libFuzzer options] CORPUS...``;
tests/fuzz/test_fuzz.py runs them for a bounded time. A harness imports the
parser under ``atheris.instrument_imports(include=["app"])`` so that Ferry's
own modules report coverage, and lets only the exception types that parser
documents be swallowed (``allowed``); anything else propagates to atheris,
which reports it as a crash and writes the input out.
"""
from __future__ import annotations

import contextlib
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import atheris  # noqa: E402,F401  (re-exported for the harnesses)

_KEEP: list[tempfile.TemporaryDirectory] = []


def scratch_dir() -> Path:
    """A private temporary folder for the files a harness writes, removed at exit."""
    holder = tempfile.TemporaryDirectory(prefix="ferry-fuzz-")
    _KEEP.append(holder)
    return Path(holder.name)


@contextlib.contextmanager
def allowed(*types: type[BaseException]):
    """Swallow the documented refusals; let everything else through."""
    try:
        yield
    except types:
        pass


def main(test_one) -> None:
    atheris.Setup(sys.argv, test_one)
    atheris.Fuzz()
