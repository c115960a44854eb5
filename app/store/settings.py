"""User settings, kept as JSON under ``app.paths.config_dir()``. No Qt here."""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from app import paths

FILE_NAME = "settings.json"


@dataclass
class Settings:
    model_folders: list[str] = field(default_factory=list)  #: extra folders to look for containers in
    model_path: str = ""          #: the container opened last
    ram_budget: int = 0           #: bytes for the core; 0 = the recommended value
    threads: int = 0              #: compute threads; 0 = one per CPU
    temperature: float = 0.7
    top_p: float = 0.95
    top_k: int = 40
    min_p: float = 0.05
    thinking: bool = True         #: let thinking models think before answering
    system_prompt: str = ""
    context_length: int = 4096
    max_tokens: int = 1024        #: longest answer

    def validated(self) -> "Settings":
        """A copy with every value clamped into its legal range."""
        s = Settings(**asdict(self))
        s.ram_budget = max(0, int(s.ram_budget))
        s.threads = max(0, int(s.threads))
        s.temperature = min(max(0.0, float(s.temperature)), 5.0)
        s.top_p = min(max(0.01, float(s.top_p)), 1.0)
        s.top_k = max(0, int(s.top_k))
        s.min_p = min(max(0.0, float(s.min_p)), 0.99)
        s.context_length = min(max(256, int(s.context_length)), 1 << 20)
        s.max_tokens = min(max(1, int(s.max_tokens)), 1 << 20)
        s.model_folders = [str(f) for f in s.model_folders if str(f).strip()]
        return s


def settings_path() -> Path:
    return paths.config_dir() / FILE_NAME


def load(path: Path | None = None) -> Settings:
    """The saved settings; defaults for anything missing or unreadable."""
    path = path or settings_path()
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return Settings()
    if not isinstance(data, dict):
        return Settings()
    known = {f.name for f in fields(Settings)}
    try:
        return Settings(**{k: v for k, v in data.items() if k in known}).validated()
    except (TypeError, ValueError):
        return Settings()


def save(settings: Settings, path: Path | None = None) -> Path:
    """Write atomically (a crash never leaves half a file)."""
    path = path or settings_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(asdict(settings.validated()), indent=1), encoding="utf-8")
    os.replace(tmp, path)
    return path
