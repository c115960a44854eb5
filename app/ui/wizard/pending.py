"""The conversion in progress, remembered on disk so that the wizard offers to
resume it after Ferry was closed or killed (the converter's journal holds the
work itself)."""
from __future__ import annotations

import json
import os
from pathlib import Path

from app import paths
from app.convert.convert import JOURNAL, partial_dir

FILE = "pending-conversion.json"


def _path() -> Path:
    return paths.data_dir() / FILE


def save(kind: str, source: Path, out: Path, budget: int, trunk_format: str = "auto",
         expert_format: str = "auto") -> None:
    p = _path()
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_suffix(".tmp")
    tmp.write_text(json.dumps({"kind": kind, "source": str(source), "out": str(out), "budget": int(budget),
                               "trunk_format": trunk_format, "expert_format": expert_format}))
    os.replace(tmp, p)


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
