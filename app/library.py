"""The model library: the converted models (containers) in Ferry's data folder
and the user's model folders, with their size, RAM floor and when each was
last used; renaming and removing them; and turning what a user typed as a
model (a name, a path, a GGUF file by mistake) into a container or a clear
message saying what to do. No Qt here: the window's library dialog, the Model
menu and the CLI all use it.

"Last used" is kept in ``library.json`` in the data folder (path -> unix time).
"""
from __future__ import annotations

import difflib
import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from app import paths
from app.store.private import private_models_dir

MANIFEST = "manifest.json"
LAST_USED_FILE = "library.json"
SOURCE_SUFFIXES = (".gguf",)
FLOOR_CONTEXT = 4096          #: the context the RAM floor shown in the library is computed for
_BAD_NAME_CHARS = set('/\\:*?"<>|\0')


class LibraryError(ValueError):
    """A library operation that cannot be done; the message says why and what to do."""


@dataclass(frozen=True)
class ModelEntry:
    path: Path
    name: str              #: what the user sees (the folder name without a source suffix)
    size: int              #: bytes on disk
    ram_floor: int | None  #: the least RAM budget that runs it at FLOOR_CONTEXT tokens (None: unknown)
    last_used: float | None  #: unix time, None if never opened by Ferry

    @property
    def key(self) -> str:
        return str(self.path.resolve())


def display_name(name: str) -> str:
    """A model's name without the file extension it was converted from."""
    for ext in (".gguf", ".safetensors", ".ferry"):
        if name.lower().endswith(ext):
            return name[: -len(ext)]
    return name


def is_container(path: Path) -> bool:
    return (path / MANIFEST).is_file()


def is_source(path: Path) -> bool:
    """A GGUF file or a Hugging Face checkpoint folder: something to convert, not to open."""
    if path.is_file():
        return path.suffix.lower() in SOURCE_SUFFIXES
    return path.is_dir() and (path / "config.json").is_file() and not is_container(path)


def folder_size(path: Path) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(root, f)).st_size
            except OSError:
                pass
    return total


def ram_floor(path: Path, n_ctx: int = FLOOR_CONTEXT) -> int | None:
    try:
        from app.engine.binding import container_plan

        return int(container_plan(path, n_ctx).floor_bytes)
    except Exception:  # an unreadable or foreign container: the library still lists it
        return None


def roots(model_folders: list[str] | tuple[str, ...] = ()) -> list[Path]:
    return [paths.models_dir(), *map(Path, model_folders)]


def find_containers(model_folders: list[str] | tuple[str, ...] = ()) -> list[Path]:
    """Containers in the models folder and the user's model folders (a folder may itself be one)."""
    found: list[Path] = []
    seen: set[str] = set()
    for root in roots(model_folders):
        if is_container(root):
            kids = [root]
        else:
            try:
                kids = sorted(k for k in root.iterdir() if is_container(k))
            except OSError:
                continue
        for k in kids:
            key = str(k.resolve())
            if key not in seen:
                seen.add(key)
                found.append(k)
    return found


class Library:
    def __init__(self, model_folders: list[str] | tuple[str, ...] = (), state_file: Path | None = None):
        self.model_folders = list(model_folders)
        self.state_file = state_file or paths.data_dir() / LAST_USED_FILE
        self._floors: dict[tuple[str, float], int | None] = {}

    # ---- last used

    def _last_used(self) -> dict[str, float]:
        try:
            data = json.loads(self.state_file.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        return {str(k): float(v) for k, v in data.items() if isinstance(v, (int, float))} \
            if isinstance(data, dict) else {}

    def _write_last_used(self, data: dict[str, float]) -> None:
        """0600 in a 0700 folder, as docs/SECURITY.md promises (it names the user's models)."""
        from app.store.private import private_dir, write_private

        private_dir(self.state_file.parent)
        write_private(self.state_file, json.dumps(data, indent=1))

    def mark_used(self, path: str | Path, when: float | None = None) -> None:
        data = self._last_used()
        data[str(Path(path).resolve())] = time.time() if when is None else when
        self._write_last_used(data)

    # ---- listing

    def entries(self) -> list[ModelEntry]:
        """Every converted model, the most recently used first, then by name."""
        used = self._last_used()
        if paths.models_dir().is_dir():     # one an older version made 0755 is narrowed to 0700
            private_models_dir()
        out = []
        for p in find_containers(self.model_folders):
            key = str(p.resolve())
            try:
                stamp = (p / MANIFEST).stat().st_mtime
            except OSError:
                stamp = 0.0
            if (key, stamp) not in self._floors:
                self._floors[(key, stamp)] = ram_floor(p)
            out.append(ModelEntry(path=p, name=display_name(p.name), size=folder_size(p),
                                  ram_floor=self._floors[(key, stamp)], last_used=used.get(key)))
        out.sort(key=lambda e: (-(e.last_used or 0.0), e.name.lower()))
        return out

    def find(self, name: str) -> ModelEntry | None:
        lowered = name.strip().lower()
        for e in self.entries():
            if lowered in (e.name.lower(), e.path.name.lower()):
                return e
        return None

    # ---- changes

    def rename(self, entry: ModelEntry, new_name: str) -> ModelEntry:
        """Rename the container's folder (in place); returns the entry at its new path."""
        new_name = new_name.strip()
        if not new_name or new_name in (".", "..") or set(new_name) & _BAD_NAME_CHARS:
            raise LibraryError(f"{new_name!r} cannot be a model name: use letters, digits, spaces, - or _")
        if not is_container(entry.path):
            raise LibraryError(f"{entry.path} is not a converted model")
        target = entry.path.with_name(new_name)
        if target.exists():
            raise LibraryError(f"a model or file named {new_name!r} already exists in {target.parent}")
        entry.path.rename(target)
        used = self._last_used()
        stamp = used.pop(entry.key, None)
        if stamp is not None:
            used[str(target.resolve())] = stamp
            self._write_last_used(used)
        return ModelEntry(path=target, name=display_name(new_name), size=entry.size, ram_floor=entry.ram_floor,
                          last_used=entry.last_used)

    def remove(self, entry: ModelEntry) -> int:
        """Delete the container from disk; returns the bytes freed."""
        if not is_container(entry.path) or entry.path.is_symlink():
            raise LibraryError(f"{entry.path} is not a converted model; nothing was removed")
        freed = folder_size(entry.path)
        shutil.rmtree(entry.path)
        used = self._last_used()
        if used.pop(entry.key, None) is not None:
            self._write_last_used(used)
        return freed

    # ---- what the user typed

    def resolve(self, model: str) -> Path:
        """The container ``model`` names: a path to one, or the name of one in the library.

        Raises LibraryError saying what to do for a source file or folder (convert
        it), for a near miss (the close names), and for anything else."""
        p = Path(model).expanduser()
        if is_container(p):
            return p
        if p.exists() and is_source(p):
            out = paths.models_dir() / display_name(p.name if p.is_file() else p.resolve().name)
            raise LibraryError(
                f"{model} is a model to convert, not a converted model. Convert it once with\n"
                f"  ferry convert {_quote(str(p))} {_quote(str(out))}\n"
                f"then run it by name: {display_name(out.name)}")
        entries = self.entries()
        named = self.find(model)
        if named is not None:
            return named.path
        if p.is_dir():
            raise LibraryError(f"{model} is a folder but not a converted model (it has no {MANIFEST})")
        if p.exists():
            raise LibraryError(f"{model} is not a converted model: Ferry runs the folders `ferry convert` makes")
        names = [e.name for e in entries]
        close = difflib.get_close_matches(model.strip(), names, n=3, cutoff=0.5)
        if not close:  # also compare case-insensitively
            lowered = {n.lower(): n for n in names}
            close = [lowered[c] for c in difflib.get_close_matches(model.strip().lower(), list(lowered), n=3,
                                                                     cutoff=0.5)]
        if close:
            return_hint = ", ".join(close)
            raise LibraryError(f"no converted model named {model!r}. Did you mean: {return_hint}?")
        if names:
            raise LibraryError(f"no converted model named {model!r}. Converted models: {', '.join(names)}")
        raise LibraryError(f"no converted model named {model!r}, and none is converted yet: "
                           "convert one with `ferry convert SOURCE OUT`, or try `ferry run demo`")


def _quote(s: str) -> str:
    import shlex

    return shlex.quote(s)


def ago(when: float | None, now: float | None = None) -> str:
    """'never', 'just now', '5 min ago', '3 h ago', '2 days ago', or the date."""
    if not when:
        return "never"
    s = max(0.0, (now or time.time()) - when)
    if s < 60:
        return "just now"
    if s < 3600:
        return f"{int(s // 60)} min ago"
    if s < 86400:
        return f"{int(s // 3600)} h ago"
    if s < 14 * 86400:
        d = int(s // 86400)
        return "1 day ago" if d == 1 else f"{d} days ago"
    return time.strftime("%Y-%m-%d", time.localtime(when))
