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
from pathlib import Path

from app.untrusted import UnsafeName, check_name

#: Largest tokenizer file read (tokenizer.json of a 200k vocabulary is ~10 MiB).
MAX_TOKENIZER_BYTES = 64 << 20
#: Largest chat template read (real ones are a few KiB to ~30 KiB).
MAX_TEMPLATE_BYTES = 1 << 20
#: Largest manifest read (the C core's limit too).
MAX_MANIFEST_BYTES = 64 << 20
#: No size limit (the trunk and the expert banks are checked against the manifest by the core).
ANY_SIZE = 1 << 62


class ContainerFileError(ValueError):
    """A file the manifest names is outside the container, not a regular file, or too large."""


def contained_file(container: str | os.PathLike, name: object, field: str, max_bytes: int) -> Path:
    """The real path of the file ``name`` (the manifest's ``field``, or a file every container has
    when ``field`` is its name) inside ``container``, checked as the module says."""
    try:
        return _contained_file(container, name, field, max_bytes)
    except ContainerFileError as exc:
        raise _own_name(exc, name, field) from None


def _contained_file(container: str | os.PathLike, name: object, field: str, max_bytes: int) -> Path:
    try:
        check_name(name, f"manifest.json: {field}")
    except UnsafeName as exc:
        raise ContainerFileError(str(exc)) from None
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
        kind = ("a FIFO" if stat.S_ISFIFO(st.st_mode) else "a folder" if stat.S_ISDIR(st.st_mode)
                else "a device" if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode) else "a special file")
        raise ContainerFileError(f"manifest.json: {field} ({name!r}) is not a regular file ({kind})")
    if st.st_size > max_bytes:
        raise ContainerFileError(f"manifest.json: {field} ({name!r}) has {st.st_size} bytes; "
                                 f"the most Ferry reads for it is {max_bytes}")
    return real


def check_weight_files(container: str | os.PathLike, manifest: dict) -> None:
    """The trunk and every expert bank the manifest lists are regular files inside the container
    (the C core checks the same when it opens them; this names the manifest's field)."""
    contained_file(container, "trunk.bin", "trunk.bin", ANY_SIZE)
    banks = manifest.get("expert_banks") if isinstance(manifest, dict) else None
    for i, bank in enumerate(banks if isinstance(banks, list) else []):
        contained_file(container, bank.get("file") if isinstance(bank, dict) else None,
                       f"expert_banks[{i}].file", ANY_SIZE)


def read_manifest(container: str | os.PathLike) -> dict:
    """A container's manifest.json: a regular file inside it (never a FIFO or a link out), at most
    MAX_MANIFEST_BYTES, holding a JSON object."""
    import json

    try:
        doc = json.loads(read_contained_text(container, "manifest.json", "manifest.json", MAX_MANIFEST_BYTES))
    except (ValueError, RecursionError) as exc:
        if isinstance(exc, ContainerFileError):
            raise
        raise ContainerFileError(f"manifest.json is not valid JSON ({exc})") from None
    if not isinstance(doc, dict):
        raise ContainerFileError("manifest.json is not a JSON object")
    return doc


def read_contained_text(container: str | os.PathLike, name: object, field: str, max_bytes: int) -> str:
    """The UTF-8 text of a contained file (see :func:`contained_file`); at most
    ``max_bytes`` are read even if the file grows after the check."""
    try:
        return _read_contained_text(container, name, field, max_bytes)
    except ContainerFileError as exc:
        raise _own_name(exc, name, field) from None


def _own_name(exc: ContainerFileError, name: object, field: str) -> ContainerFileError:
    """A file every container has (trunk.bin, manifest.json; ``field == name``) is named as itself,
    not as a manifest field."""
    if field != name:
        return exc
    text = str(exc).replace(f"manifest.json: {field} names {name!r}, which is", f"{field} is")
    return ContainerFileError(text.replace(f"manifest.json: {field} ({name!r})", field))


def _read_contained_text(container: str | os.PathLike, name: object, field: str, max_bytes: int) -> str:
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
