"""Files a container's manifest names, opened only inside the container.

A model folder may come from anywhere, so every path its manifest names is
treated as hostile: it must be a plain relative name (no absolute path, no
``..``, no drive letter, no NUL), it must resolve -- symlinks followed --
to a regular file inside the container folder, and it must be no larger
than a limit for its kind. Anything else is a :class:`ContainerFileError`
naming the field and the reason; nothing outside the folder is ever read,
and a FIFO or ``/dev/zero`` is never opened. No Qt here.
"""
from __future__ import annotations

import os
import stat
from pathlib import Path, PurePosixPath, PureWindowsPath

#: Largest tokenizer file read (tokenizer.json of a 200k vocabulary is ~10 MiB).
MAX_TOKENIZER_BYTES = 64 << 20
#: Largest chat template read (real ones are a few KiB to ~30 KiB).
MAX_TEMPLATE_BYTES = 1 << 20


class ContainerFileError(ValueError):
    """A file the manifest names is outside the container, not a regular file, or too large."""


def contained_file(container: str | os.PathLike, name: object, field: str, max_bytes: int) -> Path:
    """The real path of the file ``name`` (the manifest's ``field``) inside
    ``container``, checked as the module says."""
    if not isinstance(name, str) or not name:
        raise ContainerFileError(f"manifest.json: {field} must be a file name inside the model folder")
    if "\x00" in name or any(0xD800 <= ord(c) <= 0xDFFF for c in name):
        raise ContainerFileError(f"manifest.json: {field} is not a valid file name")
    posix, win = PurePosixPath(name), PureWindowsPath(name)
    if posix.is_absolute() or win.is_absolute() or win.drive or name.startswith(("/", "\\")):
        raise ContainerFileError(f"manifest.json: {field} is an absolute path ({name!r}); "
                                 "a model folder may only name files inside itself")
    if ".." in posix.parts or ".." in win.parts:
        raise ContainerFileError(f"manifest.json: {field} ({name!r}) climbs out of the model folder with '..'")
    root = Path(container).resolve()
    try:
        real = (root / name).resolve(strict=True)
    except FileNotFoundError:
        raise ContainerFileError(f"manifest.json: {field} names {name!r}, which is not in the model folder") from None
    except (OSError, RuntimeError) as exc:   # a symlink loop, a name too long...
        raise ContainerFileError(f"manifest.json: {field} ({name!r}) cannot be resolved: {exc}") from None
    if real != root and root not in real.parents:
        raise ContainerFileError(f"manifest.json: {field} ({name!r}) is a link to a file outside the model folder")
    st = real.stat()
    if not stat.S_ISREG(st.st_mode):
        raise ContainerFileError(f"manifest.json: {field} ({name!r}) is not a regular file")
    if st.st_size > max_bytes:
        raise ContainerFileError(f"manifest.json: {field} ({name!r}) has {st.st_size} bytes; "
                                 f"the most Ferry reads for it is {max_bytes}")
    return real


def read_contained_text(container: str | os.PathLike, name: object, field: str, max_bytes: int) -> str:
    """The UTF-8 text of a contained file (see :func:`contained_file`); at most
    ``max_bytes`` are read even if the file grows after the check."""
    path = contained_file(container, name, field, max_bytes)
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise ContainerFileError(f"manifest.json: {field} ({name!r}) is not a regular file")
        data = f.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise ContainerFileError(f"manifest.json: {field} ({name!r}) is larger than {max_bytes} bytes")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ContainerFileError(f"manifest.json: {field} ({name!r}) is not UTF-8 text ({exc.reason} at byte "
                                 f"{exc.start})") from None
