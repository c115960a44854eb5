"""The conversion in progress, remembered on disk so that the wizard offers to
resume it after Ferry was closed or killed (the converter's journal holds the
work itself)."""
from __future__ import annotations

import json
from pathlib import Path

from app import paths
from app.convert.convert import JOURNAL, partial_dir
from app.store.private import private_dir, write_private

FILE = "pending-conversion.json"


def _path() -> Path:
    return paths.data_dir() / FILE


def save(kind: str, source: Path, out: Path, budget: int, trunk_format: str = "auto",
         expert_format: str = "auto") -> None:
    p = _path()
    private_dir(p.parent)
    write_private(p, json.dumps({"kind": kind, "source": str(source), "out": str(out), "budget": int(budget),
                                 "trunk_format": trunk_format, "expert_format": expert_format}))


def load() -> dict | None:
    """The unfinished conversion, if its partial output is still there."""
    try:
        d = json.loads(_path().read_text())
        out = Path(d["out"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if out.exists() or not (partial_dir(out) / JOURNAL).exists():
        return None
    return d


def clear() -> None:
    try:
        _path().unlink()
    except OSError:
        pass
