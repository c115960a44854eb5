"""Saved session states of document prefixes, encrypted, one file each.

A collection's passages are read by the model once; the session's state
(``Session.export_state``: the attention caches of those tokens) is saved
and restored for every later question with the same prefix. The attention
caches are derived from the documents, so they are secret like the text:

    file  = <states dir>/<HMAC(model fingerprint, prefix hash)>.fxds
    bytes = "FXDS" | version (1) | model fingerprint (32: SHA-256 of the
            container's manifest) | prefix hash (32: SHA-256 of the token ids)
            | nonce (12) | AES-256-GCM(SessionState.to_bytes(), aad = the header)

A file from another model, for another prefix, damaged, or made with
another key is refused with a message that says which; the C core checks
its own fingerprint and CRC again on import.

A question whose passages differ from every saved prefix can still start
from the saved state that shares the longest beginning with it (the
template, the instructions and the passages they have in common, in
document order): ``prefixes.fxdi`` lists each saved state's model and token
ids, encrypted (AES-256-GCM with the states key), so :meth:`StateCache.longest`
finds it without opening every state.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from app import paths
from app.engine.binding import FerryError, Session, SessionState
from app.store.private import private_dir, write_private

MAGIC = b"FXDS"
VERSION = 1
HEADER = 4 + 1 + 32 + 32
NONCE = 12
#: total size of saved states kept; the least recently used go first
DEFAULT_CAP = 2 * 2**30
#: the list of saved prefixes (see the module's docstring)
INDEX_NAME = "prefixes.fxdi"
#: a saved state shorter than this in common with the prompt is not worth restoring
MIN_SHARED = 16


class StateError(ValueError):
    """A saved state that cannot be used; the message says why."""


def model_fingerprint(model_path: str | os.PathLike) -> bytes:
    from app.engine.container_files import MAX_MANIFEST_BYTES, read_contained_text

    # the manifest as the model reads it (a regular file inside the folder); its UTF-8 bytes
    text = read_contained_text(model_path, "manifest.json", "manifest.json", MAX_MANIFEST_BYTES)
    return hashlib.sha256(text.encode("utf-8")).digest()


def prefix_hash(tokens: Sequence[int]) -> bytes:
    return hashlib.sha256(np.asarray(list(tokens), dtype="<i4").tobytes()).digest()


def shared_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many tokens ``a`` and ``b`` have in common at their start."""
    n, limit = 0, min(len(a), len(b))
    while n < limit and a[n] == b[n]:
        n += 1
    return n


def states_dir() -> Path:
    return paths.data_dir() / "documents" / "states"


@dataclass
class StateCache:
    key: bytes                       #: the states subkey (DocumentStore.keys.states)
    root: Path | None = None
    cap_bytes: int = DEFAULT_CAP

    def __post_init__(self):
        self.root = Path(self.root) if self.root is not None else states_dir()
        self._aead = AESGCM(self.key)

    def path_for(self, fingerprint: bytes, tokens: Sequence[int]) -> Path:
        name = hmac.new(self.key, b"state-name" + fingerprint + prefix_hash(tokens), hashlib.sha256).hexdigest()
        return self.root / f"{name[:40]}.fxds"

    # ---- saving

    def save(self, fingerprint: bytes, state: SessionState) -> Path:
        header = MAGIC + bytes([VERSION]) + fingerprint + prefix_hash(state.tokens)
        nonce = os.urandom(NONCE)
        data = header + nonce + self._aead.encrypt(nonce, state.to_bytes(), header)
        path = self.path_for(fingerprint, state.tokens)
        private_dir(self.root)
        write_private(path, data)
        self._evict(keep=path)
        index = self._index()
        index[path.name] = (fingerprint.hex(), list(state.tokens))
        self._write_index(index)
        return path

    def _index(self) -> dict[str, tuple[str, list[int]]]:
        """name -> (model fingerprint, tokens) of the saved states that still exist; empty when
        the list is missing or cannot be read (it is a cache: the states themselves are checked)."""
        try:
            data = (self.root / INDEX_NAME).read_bytes()
            plain = self._aead.decrypt(data[:NONCE], data[NONCE:], b"FXDI")
            raw = json.loads(plain)
        except (OSError, InvalidTag, ValueError):
            return {}
        return {name: (fp, toks) for name, (fp, toks) in raw.items() if (self.root / name).exists()}

    def _write_index(self, index: dict[str, tuple[str, list[int]]]) -> None:
        nonce = os.urandom(NONCE)
        plain = json.dumps(index, separators=(",", ":")).encode()
        write_private(self.root / INDEX_NAME, nonce + self._aead.encrypt(nonce, plain, b"FXDI"))

    def longest(self, fingerprint: bytes, tokens: Sequence[int]) -> tuple[Path, int] | None:
        """The saved state of this model sharing the longest beginning with ``tokens`` (at least
        MIN_SHARED tokens), and how many tokens it shares; None when there is none."""
        best: tuple[Path, int] | None = None
        want = fingerprint.hex()
        for name, (fp, saved) in self._index().items():
            if fp != want:
                continue
            n = shared_prefix(saved, tokens)
            if n >= MIN_SHARED and (best is None or n > best[1]):
                best = (self.root / name, n)
        return best

    def _evict(self, keep: Path) -> None:
        files = sorted(self.root.glob("*.fxds"), key=lambda p: p.stat().st_mtime)
        total = sum(p.stat().st_size for p in files)
        for p in files:
            if total <= self.cap_bytes:
                break
            if p != keep:
                total -= p.stat().st_size
                p.unlink(missing_ok=True)

    # ---- loading

    def read(self, path: Path, fingerprint: bytes, tokens: Sequence[int] | None = None) -> SessionState:
        """The state in ``path``, checked against the model and (if given) the prefix."""
        try:
            data = Path(path).read_bytes()
        except OSError as exc:
            raise StateError(f"cannot read the saved state {Path(path).name}: {exc.strerror or exc}") from exc
        if len(data) < HEADER + NONCE + 16 or data[:4] != MAGIC:
            raise StateError(f"{Path(path).name} is not a saved Ferry document state (or it is truncated)")
        if data[4] != VERSION:
            raise StateError(f"{Path(path).name} is a saved state of an unknown version ({data[4]})")
        if data[5:37] != fingerprint:
            raise StateError(f"{Path(path).name} was saved with another model; it cannot be used with this one")
        if tokens is not None and data[37:69] != prefix_hash(tokens):
            raise StateError(f"{Path(path).name} holds another prefix than the one asked for")
        header = data[:HEADER]
        try:
            plain = self._aead.decrypt(data[HEADER:HEADER + NONCE], data[HEADER + NONCE:], header)
        except InvalidTag as exc:
            raise StateError(f"{Path(path).name} is damaged (or was saved with another key): "
                             "its authentication tag does not match") from exc
        try:
            state = SessionState.from_bytes(plain)
        except FerryError as exc:
            raise StateError(f"{Path(path).name} is damaged: {exc}") from exc
        if tokens is not None and list(state.tokens) != list(tokens):
            raise StateError(f"{Path(path).name} holds another prefix than the one asked for")
        return state

    def restore(self, session: Session, fingerprint: bytes, tokens: Sequence[int],
                path: Path | None = None) -> bool:
        """Restore the saved state of ``tokens`` into ``session``; False when
        none is saved; StateError when one is saved but cannot be used (the
        session is then left as it was)."""
        path = Path(path) if path is not None else self.path_for(fingerprint, tokens)
        if not path.exists():
            return False
        state = self.read(path, fingerprint, tokens)
        try:
            session.import_state(state)
        except FerryError as exc:
            raise StateError(f"the engine refused the saved state {path.name}: {exc}") from exc
        os.utime(path)
        return True
