"""Migration from the previous layout to the one encrypted database.

Before, the history and the documents lived in ``history.sqlite3``: a plain
SQLite file whose titles, messages and document texts were AES-GCM blobs
(documents under HKDF subkeys of the same key), with no full-text index on
disk. On the first open of ``ferry.db`` (or of that file itself, when a
caller names it) this module:

1. reads the old ``meta`` (key kind, scrypt salt, check) and asks the key
   provider for the key, refusing a wrong one before anything is written;
2. writes a new encrypted database beside it (``<name>.migrating``): the
   conversations and messages row for row (their blobs stay as they were),
   and every document decrypted, then stored and indexed as new ones are;
3. checks that every conversation, message, file and passage arrived, then
   writes the key side file, moves the new database into place and deletes
   the old file (with its -wal and -shm).

An interruption at any point leaves the old file as it was, and the next
open starts again.
"""
from __future__ import annotations

import os
import sqlite3
from pathlib import Path
from typing import Any, Callable

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from app.store.crypto import KeyProvider
from app.store.database import KeyFile, _DictMeta, connect, provider_key, read_meta, sqlcipher_key

#: ``(old connection, new connection, key) -> counts``: one half of the migration
Part = Callable[[sqlite3.Connection, Any, bytes], dict[str, int]]
#: the key's rows of the old ``meta`` (they go to the key side file, not the database)
META_KEYS = ("key_kind", "scrypt_salt", "check")
#: the old tables that mark data a part must copy, and what they hold
LEGACY_DATA = {"conversations": "conversations", "docs_collections": "documents"}


class MigrationRefused(RuntimeError):
    """The old file holds data that no part given can copy; it is left as it was."""


def _remove(path: Path) -> None:
    for suffix in ("", "-wal", "-shm", "-journal"):
        Path(str(path) + suffix).unlink(missing_ok=True)


def legacy_tables(db) -> set[str]:
    """The tables of an old file."""
    return {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}


def migrate(legacy: Path, path: Path, keys: KeyProvider, *, parts: dict[str, Part]) -> bytes:
    """Migrate ``legacy`` into a new encrypted database at ``path``; returns the key. ``parts``: by the
    old table that marks their data, the halves that copy it (each beside its own schema: the history's
    in ``app.store.history``, the documents' in ``app.documents.store``), run in order. An old file
    holding data no part given copies is refused before anything is written (``MigrationRefused``)."""
    old = sqlite3.connect(legacy)
    try:
        meta = _DictMeta(read_meta(old))
        key = provider_key(meta, keys)      # a wrong key is refused first
        have = legacy_tables(old)
        missing = [what for table, what in LEGACY_DATA.items() if table in have and table not in parts]
        if missing:
            raise MigrationRefused(f"{Path(legacy).name} (an older Ferry's history) holds {', '.join(missing)}, "
                                   "which only the app's window or `ferry docs` move; nothing was changed")
        tmp = path.with_name(path.name + ".migrating")
        _remove(tmp)
        new = connect(tmp, sqlcipher_key(key))
        try:
            counts = _copy(old, new, key, parts)
            new.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        except BaseException:
            new.close()
            _remove(tmp)
            raise
        new.close()
    finally:
        old.close()
    keyfile = KeyFile(path)
    for k in META_KEYS:
        if meta.get(k) is not None:
            keyfile._values[k] = meta.get(k)
    keyfile.save()
    for suffix in ("-wal", "-shm", "-journal"):
        Path(str(path) + suffix).unlink(missing_ok=True)
    os.replace(tmp, path)
    Path(str(tmp) + "-wal").unlink(missing_ok=True)
    Path(str(tmp) + "-shm").unlink(missing_ok=True)
    if Path(legacy) != Path(path):
        _remove(legacy)
    migrate.last_counts = counts          # for tests and the log
    return key


def _copy(old: sqlite3.Connection, new, key: bytes, parts: dict[str, Part]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for part in parts.values():
        counts.update(part(old, new, key))
    return counts


def subkey(key: bytes, info: bytes) -> bytes:
    """The HKDF subkey of the old file's ``key`` named ``info`` (its document values were sealed with one)."""
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=info).derive(key)
