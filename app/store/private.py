"""Files and folders only their owner can read: every place Ferry creates data
(history, settings, documents, keys, the models folder, logs) goes through
this module, so nothing is ever world- or group-readable, not even for the
moment between creating a file and fixing its mode. No Qt here.

* :func:`private_dir` creates a folder (and any missing parents) as 0700.
* :func:`private_file` creates or truncates a file as 0600 and opens it;
  :func:`write_private` writes one atomically (temporary file + rename).
* :func:`private_umask` is for libraries that create files themselves
  (SQLite's journal and WAL files, for example): inside it the process umask
  is 077. The umask is per process, so keep the block short.

On Windows the modes are meaningless and these are plain creates.
"""
from __future__ import annotations

import contextlib
import os
import stat
import threading
from pathlib import Path
from typing import IO, Iterator

DIR_MODE = 0o700
FILE_MODE = 0o600
_UMASK = 0o077
_umask_lock = threading.RLock()


@contextlib.contextmanager
def private_umask() -> Iterator[None]:
    """Everything created inside this block is private to the user."""
    with _umask_lock:
        old = os.umask(_UMASK)
        try:
            yield
        finally:
            os.umask(old)


def private_dir(path: str | os.PathLike) -> Path:
    """Create ``path`` and missing parents as 0700. A folder that already
    existed is narrowed to 0700 only when it is Ferry's own (the data or
    config folder, or inside one): a folder of the user's keeps its mode."""
    path = Path(path)
    with private_umask():
        path.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
    if _ferrys_own(path):
        _narrow(path, DIR_MODE)
    return path


def _ferrys_own(path: Path) -> bool:
    from app import paths

    try:
        real = path.resolve()
        roots = {paths.data_dir().resolve(), paths.config_dir().resolve()}
    except OSError:
        return False
    return any(real == r or r in real.parents for r in roots)


def private_file(path: str | os.PathLike, mode: str = "w", *, encoding: str | None = "utf-8") -> IO:
    """Open ``path`` for writing, created as 0600 (an existing file is narrowed
    to 0600 before anything is written). ``mode`` is "w", "wb", "a" or "ab"."""
    if mode not in ("w", "wb", "a", "ab"):
        raise ValueError(f"private_file writes only; mode {mode!r} is not one of w, wb, a, ab")
    path = Path(path)
    flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if mode.startswith("a") else os.O_TRUNC)
    flags |= getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(path, flags, FILE_MODE)
    try:
        _narrow_fd(fd, FILE_MODE)
        return os.fdopen(fd, mode, encoding=None if "b" in mode else encoding)
    except BaseException:
        os.close(fd)
        raise


def touch_private(path: str | os.PathLike) -> Path:
    """Make sure ``path`` exists as a 0600 file (without changing its contents),
    e.g. before a library such as sqlite3 opens it."""
    path = Path(path)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), FILE_MODE)
    try:
        _narrow_fd(fd, FILE_MODE)
    finally:
        os.close(fd)
    return path


def write_private(path: str | os.PathLike, data: str | bytes) -> Path:
    """Replace ``path`` atomically with ``data`` (a crash leaves the old or the
    new file, never half of one); the file is 0600 from its first byte."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        with private_file(tmp, "wb") as f:
            f.write(data.encode("utf-8") if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    return path


def is_private(path: str | os.PathLike) -> bool:
    """Whether no one but the owner can read, write or enter ``path``."""
    if os.name == "nt":
        return True
    return stat.S_IMODE(os.stat(path).st_mode) & 0o077 == 0


def _narrow(path: Path, mode: int) -> None:
    if os.name == "nt":
        return
    try:
        st = os.stat(path)
        if st.st_uid == os.getuid() and stat.S_IMODE(st.st_mode) & 0o077:
            os.chmod(path, mode)
    except OSError:
        pass


def _narrow_fd(fd: int, mode: int) -> None:
    if os.name == "nt":
        return
    st = os.fstat(fd)
    if stat.S_IMODE(st.st_mode) & 0o077 and st.st_uid == os.getuid():
        os.fchmod(fd, mode)


def private_models_dir() -> Path:
    """The models folder, created 0700 (and the data folder too when new), or narrowed to 0700 when an
    older version left it 0755: it names the user's models (docs/SECURITY.md, "Private files")."""
    from app import paths

    if paths.data_dir().is_dir():
        private_dir(paths.data_dir())
    return private_dir(paths.models_dir())
