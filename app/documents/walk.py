"""Which files a document add reads: the one policy for `ferry docs add`, the
window's documents page and any background indexer. No Qt here.

Folders are walked recursively (hidden entries skipped, links to folders not
followed). A file is read only when it is -- or is a link to -- a regular
file of a supported type, no larger than the limit, with a name that is
valid text. Everything else is reported as a :class:`Skip` with its reason:
FIFOs (which would block a reader forever), devices (``/dev/zero`` never
ends), sockets, broken links, links to any of those, files over the size
limit, names that are not valid UTF-8 (they cannot be shown or stored
faithfully) and unsupported types. Nothing is opened while walking.
"""
from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

#: suffix -> kind (the extractor of each kind: app.documents.extract)
SUFFIXES = {".txt": "text", ".text": "text", ".md": "markdown", ".markdown": "markdown",
            ".pdf": "pdf", ".html": "html", ".htm": "html", ".xhtml": "html", ".docx": "docx"}
#: Largest file read (bytes); bigger ones are reported, not read.
MAX_FILE_BYTES = 200 * 2**20


class ExtractError(ValueError):
    """A file that cannot be read; the message says why (the caller adds the name)."""


def kind_of(path: Path) -> str | None:
    return SUFFIXES.get(path.suffix.lower())


@dataclass(frozen=True)
class Skip:
    path: Path
    reason: str

    @property
    def name(self) -> str:
        return display_name(self.path)


def display_name(path: str | os.PathLike) -> str:
    """``path`` as printable text: bytes of a name that are not UTF-8 become U+FFFD."""
    text = os.fspath(path)
    return text.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def _undecodable(name: str) -> bool:
    return any(0xD800 <= ord(c) <= 0xDFFF for c in name)


def _kind_reason(mode: int) -> str | None:
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe), not a file"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device, not a file"
    if stat.S_ISSOCK(mode):
        return "a socket, not a file"
    if stat.S_ISDIR(mode):
        return "a folder"
    return "not a regular file"


def check_file(path: Path, max_bytes: int = MAX_FILE_BYTES) -> str | None:
    """Why the file at ``path`` is not read, or None when it may be."""
    if _undecodable(path.name):
        return "its name is not valid UTF-8 text"
    try:
        lst = path.lstat()
    except OSError as exc:
        return f"cannot be examined ({exc.strerror or exc})"
    if stat.S_ISLNK(lst.st_mode):
        try:
            st = path.stat()
        except OSError:
            return "a broken link"
        why = _kind_reason(st.st_mode)
        if why:
            return f"a link to {why.replace(', not a file', '')}" if why != "a folder" else "a link to a folder"
    else:
        st = lst
        why = _kind_reason(st.st_mode)
        if why:
            return why
    if kind_of(path) is None:
        return f"unsupported file type '{path.suffix or '(none)'}'"
    if st.st_size > max_bytes:
        return f"larger than the limit of {max_bytes // 2**20} MiB ({st.st_size // 2**20} MiB)"
    return None


def iter_document_files(paths: Iterable[str | os.PathLike], max_bytes: int = MAX_FILE_BYTES
                        ) -> Iterator[Path | Skip]:
    """Each file to read (a Path) or a :class:`Skip`, in a stable order."""
    for raw in paths:
        p = Path(raw).expanduser()
        if not os.path.lexists(p):
            yield Skip(p, "no such file or folder")
        elif p.is_dir():   # a folder named on purpose is walked even through a link
            yield from _walk(p, max_bytes)
        else:
            why = check_file(p, max_bytes)
            yield Skip(p, why) if why else p


def _walk(top: Path, max_bytes: int) -> Iterator[Path | Skip]:
    errors: list[OSError] = []
    for root, dirs, names in os.walk(top, onerror=errors.append):
        here = Path(root)
        kept = []
        for d in sorted(dirs):
            if d.startswith("."):
                continue
            sub = here / d
            if _undecodable(d):
                yield Skip(sub, "its name is not valid UTF-8 text")
            elif sub.is_symlink():
                yield Skip(sub, "a link to a folder (not followed)")
            else:
                kept.append(d)
        dirs[:] = kept
        for name in sorted(names):
            if name.startswith("."):
                continue
            f = here / name
            why = check_file(f, max_bytes)
            yield Skip(f, why) if why else f
        while errors:
            exc = errors.pop()
            yield Skip(Path(exc.filename or root), f"cannot be listed ({exc.strerror or exc})")


def read_document_bytes(path: str | os.PathLike, max_bytes: int = MAX_FILE_BYTES) -> bytes:
    """The bytes of a document file, refusing (with :class:`ExtractError`)
    anything that is not a regular file or grew past ``max_bytes`` since it
    was walked; never blocks on a FIFO swapped in after the walk."""
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        raise ExtractError(f"cannot be read ({exc.strerror or exc})") from exc
    with os.fdopen(fd, "rb") as f:
        why = _kind_reason(os.fstat(fd).st_mode)
        if why:
            raise ExtractError(why)
        try:
            data = f.read(max_bytes + 1)
        except OSError as exc:
            raise ExtractError(f"cannot be read ({exc.strerror or exc})") from exc
    if len(data) > max_bytes:
        raise ExtractError(f"larger than the limit of {max_bytes // 2**20} MiB")
    return data


def expand(paths: Iterable[str | os.PathLike]) -> tuple[list[Path], list[tuple[Path, str]]]:
    """Files to read from files and folders, and [(path, why it is skipped)]:
    the policy of :func:`iter_document_files`, collected."""
    files: list[Path] = []
    skipped: list[tuple[Path, str]] = []
    for item in iter_document_files(paths):
        if isinstance(item, Skip):
            skipped.append((item.path, item.reason))
        else:
            files.append(item)
    return files, skipped
