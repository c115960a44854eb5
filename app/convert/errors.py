"""Errors raised while reading untrusted model files, and checks both readers share.

Every problem found in a downloaded file is reported as a :class:`SourceError`
whose message starts with the file's name, so a GUI can show it as is.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Generic, Iterable, TypeVar

import numpy as np

from app import untrusted


class SourceError(ValueError):
    """A model source file or directory is malformed, truncated or unsupported.

    Attributes:
        path: the offending file or directory.
        problem: what is wrong, without the file name.
        message: ``"<file name>: <problem>"``, also the ``str()`` of the error.
    """

    def __init__(self, path: str | os.PathLike[str], problem: str) -> None:
        from app.untrusted import shown

        self.path = Path(path)
        self.problem = shown(problem)           # names and values from the file: escaped for the terminal
        self.message = f"{shown(self.path.name)}: {self.problem}"
        super().__init__(self.message)


def read_file_range(path: Path, offset: int, nbytes: int) -> np.ndarray:
    """Read exactly ``nbytes`` bytes at ``offset`` of ``path`` as a uint8 array.

    Raises SourceError if the file cannot be opened or is shorter than
    expected (for example, it was truncated after it was parsed).
    """
    out = np.empty(nbytes, dtype=np.uint8)
    view = memoryview(out)
    try:
        with open(path, "rb", buffering=0) as f:
            f.seek(offset)
            done = 0
            while done < nbytes:
                got = f.readinto(view[done:])
                if not got:
                    raise SourceError(
                        path,
                        f"expected {nbytes} bytes at offset {offset} but the file "
                        f"ended after {done} (was it truncated?)",
                    )
                done += got
    except OSError as exc:
        raise SourceError(path, f"cannot read file: {exc.strerror or exc}") from exc
    return out


def reject_overlaps(path: Path, ranges: Iterable[tuple[int, int, str]]) -> None:
    """Raise SourceError if two non-empty ``(offset, nbytes, name)`` ranges share a byte."""
    spans = sorted((offset, offset + nbytes, name) for offset, nbytes, name in ranges if nbytes)
    for (_, prev_end, prev_name), (begin, _, name) in zip(spans, spans[1:]):
        if begin < prev_end:
            raise SourceError(
                path, f"tensors {prev_name!r} and {name!r} overlap (byte {begin} is in both)"
            )


#: A reader's tensor info: anything with ``name``, ``offset`` and ``nbytes``.
InfoT = TypeVar("InfoT")


class TensorFile(Generic[InfoT]):
    """What both readers (GGUFFile, SafetensorsFile) share once a file is
    parsed: ``tensors`` maps names to infos, each a byte range of ``path``."""

    path: Path
    tensors: dict[str, InfoT]

    def _reject_overlaps(self) -> None:
        reject_overlaps(self.path, ((t.offset, t.nbytes, t.name) for t in self.tensors.values()))

    def info(self, name: str) -> InfoT:
        """The tensor info of ``name``; SourceError if there is no such tensor."""
        try:
            return self.tensors[name]
        except KeyError:
            raise SourceError(self.path, f"has no tensor named {name!r}") from None

    def read_raw(self, name: str) -> np.ndarray:
        """The tensor's stored bytes as a flat uint8 array."""
        info = self.info(name)
        return read_file_range(self.path, info.offset, info.nbytes)


#: Largest JSON file (config.json, a shard index) read from a source.
MAX_JSON_BYTES = 100_000_000


def parse_json(path: Path, data: bytes, what: str) -> Any:
    """Decode untrusted UTF-8 JSON ``data`` (``what`` names it in errors) with
    the limits of app.untrusted.parse_json (size, depth, no repeated key)."""
    try:
        return untrusted.parse_json(data, what, max_bytes=MAX_JSON_BYTES)
    except untrusted.BadData as exc:
        raise SourceError(path, str(exc)) from None


def load_json_file(path: Path) -> Any:
    """Read and decode a JSON file of at most MAX_JSON_BYTES."""
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise SourceError(path, f"cannot read file: {exc.strerror or exc}") from None
    if size > MAX_JSON_BYTES:
        raise SourceError(path, f"file is {size} bytes, over the {MAX_JSON_BYTES} byte limit")
    return parse_json(path, read_file_range(path, 0, size).tobytes(), "file")
