"""A checkpoint folder whose shards are still on the hub: the config, the
index and the tokenizer files are on disk, each shard's safetensors header
was fetched on its own (a few kB to MB), and the shard itself may not be
there yet. The converter and the checks read it as an ordinary Hugging Face
source; reading a tensor waits until its shard is downloaded and verified.

Its identity (what a resumed conversion must match) is the repository's
commit and each file's size and hash, not the files' modification times: a
shard deleted after conversion (``--delete-source``) or downloaded again
keeps the identity, so a resumed run goes on where it stopped.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import numpy as np

from app.convert.errors import SourceError
from app.convert.safetensors_file import INDEX_NAME, Checkpoint, SafetensorsFile, _Scan
from app.convert.sources import HFSource

#: waits until a shard (by path) is on disk and verified; raises to stop
WaitFn = Callable[[Path], None]


def _no_wait(path: Path) -> None:
    if not path.is_file():
        raise SourceError(path, "is not downloaded")


class HeaderFile(SafetensorsFile):
    """A safetensors file known by its header bytes and its size on the hub."""

    def __init__(self, path: Path, head: bytes, size: int, wait: WaitFn = _no_wait):
        self._head, self._declared, self._wait = head, size, wait
        super().__init__(path)

    def _size(self) -> int:
        return self._declared

    def _range(self, offset: int, nbytes: int) -> np.ndarray:
        if offset + nbytes > len(self._head):
            raise SourceError(self.path, f"the header fetched has {len(self._head)} bytes, fewer than its "
                                         f"declared {offset + nbytes}")
        return np.frombuffer(self._head, np.uint8, nbytes, offset).copy()

    def read_raw(self, name: str) -> np.ndarray:
        self._wait(self.path)
        return super().read_raw(name)


class _StagedScan(_Scan):
    def __init__(self, directory: Path, shards: dict[str, tuple[bytes, int]], wait: WaitFn):
        self.directory = directory
        self.problems: list[SourceError] = []
        self.config: dict[str, Any] = {}
        self.files: dict[Path, SafetensorsFile] = {}
        self.where: dict[str, Path] = {}
        self._shards, self._wait = shards, wait
        self._load_config()
        if (directory / INDEX_NAME).exists():
            self._load_indexed()
        else:
            self._load_unindexed([directory / name for name in sorted(shards)])

    def _present(self, path: Path) -> bool:
        return path.name in self._shards

    def _open_shard(self, path: Path) -> SafetensorsFile | None:
        if path not in self.files:
            if path.name not in self._shards:
                self.problems.append(SourceError(path, "is not in the repository's file list"))
                return None
            head, size = self._shards[path.name]
            shard = self._record(HeaderFile, path, head, size, self._wait)
            if shard is None:
                return None
            self.files[path] = shard
        return self.files[path]


class StagedSource(HFSource):
    """An HF source made of the small files in ``folder`` and the shard
    headers in ``shards`` (name -> (header bytes, size on the hub))."""

    def __init__(self, folder: Path, shards: dict[str, tuple[bytes, int]], identity: dict[str, Any],
                 wait: WaitFn = _no_wait):
        scan = _StagedScan(Path(folder), shards, wait)
        if scan.problems:
            raise scan.problems[0]
        super().__init__(Path(folder), Checkpoint(folder, scan))
        self._identity = identity

    def identity(self) -> dict[str, Any]:
        return self._identity
