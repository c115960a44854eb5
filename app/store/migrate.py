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

import json
import os
import sqlite3
from pathlib import Path

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from app.store.crypto import KeyProvider, WrongKey
from app.store.database import (FILE_NAME, LEGACY_NAME, KeyFile, connect, is_legacy, provider_key,
                                sqlcipher_key)

_NONCE = 12
_META_KEYS = ("key_kind", "scrypt_salt", "check")


class _DictMeta:
    def __init__(self, values: dict[str, bytes]):
        self.values = values

    def get(self, key: str) -> bytes | None:
        return self.values.get(key)

    def set(self, key: str, value: bytes) -> None:
        self.values[key] = bytes(value)


def legacy_source(path: Path) -> Path | None:
    """The old-layout file to migrate into ``path``, or None."""
    path = Path(path)
    if path.exists():
        return path if is_legacy(path) else None
    old = path.parent / LEGACY_NAME
    if path.name == FILE_NAME and old.exists() and is_legacy(old):
        return old
    return None


def _read_meta(db: sqlite3.Connection) -> dict[str, bytes]:
    try:
        return {k: bytes(v) for k, v in db.execute("SELECT key, value FROM meta")}
    except sqlite3.DatabaseError:
        return {}


def legacy_meta(legacy: Path) -> _DictMeta:
    db = sqlite3.connect(legacy)
    try:
        return _DictMeta(_read_meta(db))
    finally:
        db.close()


def _remove(path: Path) -> None:
    for suffix in ("", "-wal", "-shm", "-journal"):
        Path(str(path) + suffix).unlink(missing_ok=True)


def _tables(db) -> set[str]:
    return {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}


def _subkey(key: bytes, info: bytes) -> bytes:
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=info).derive(key)


def migrate(legacy: Path, path: Path, keys: KeyProvider) -> bytes:
    """Migrate ``legacy`` into a new encrypted database at ``path``; returns the key."""
    old = sqlite3.connect(legacy)
    try:
        meta = _DictMeta(_read_meta(old))
        key = provider_key(meta, keys)
        tmp = path.with_name(path.name + ".migrating")
        _remove(tmp)
        new = connect(tmp, sqlcipher_key(key))
        try:
            counts = _copy(old, new, key)
            new.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        except BaseException:
            new.close()
            _remove(tmp)
            raise
        new.close()
    finally:
        old.close()
    keyfile = KeyFile(path)
    for k in _META_KEYS:
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


def _copy(old: sqlite3.Connection, new, key: bytes) -> dict[str, int]:
    from app.documents.store import DocumentStore
    from app.store.history import _SCHEMA

    new.executescript(_SCHEMA)
    have = _tables(old)
    counts = {}
    with new:
        for k, v in _read_meta(old).items():
            if k not in _META_KEYS:
                new.execute("INSERT OR REPLACE INTO meta(key, value) VALUES (?, ?)", (k, v))
        for table, cols in (("conversations", "id, created, updated, title, leaf_id, model"),
                            ("messages", "id, conversation_id, parent_id, role, body, thinking, thinking_seconds, "
                                         "status, created, stats")):
            rows = old.execute(f"SELECT {cols} FROM {table}").fetchall() if table in have else []
            new.executemany(f"INSERT INTO {table}({cols}) VALUES ({','.join('?' * len(cols.split(',')))})", rows)
            counts[table] = len(rows)
    DocumentStore.ensure_schema(new)
    if "docs_collections" in have:
        counts.update(_copy_documents(old, DocumentStore.on_connection(new), key))
    for table in ("conversations", "messages"):
        got, = new.execute(f"SELECT COUNT(*) FROM {table}").fetchone()
        if got != counts[table]:
            raise RuntimeError(f"migration lost rows of {table} ({got} of {counts[table]}); the old file is kept")
    return counts


def _copy_documents(old: sqlite3.Connection, store, key: bytes) -> dict[str, int]:
    from app.documents.index import terms_for

    aead = AESGCM(_subkey(key, b"ferry documents v1 aead"))

    def unseal(blob, aad: str):
        blob = bytes(blob)
        try:
            return json.loads(aead.decrypt(blob[:_NONCE], blob[_NONCE:], aad.encode()))
        except InvalidTag as exc:
            raise WrongKey(f"a stored document value ({aad.split(':')[1]}) does not decrypt; "
                           "the old file is kept") from exc

    files = chunks = 0
    db = store.db
    for cid_old, name_mac, name_blob, created, updated, budget in old.execute(
            "SELECT id, name_mac, name, created, updated, budget FROM docs_collections ORDER BY id").fetchall():
        name = unseal(name_blob, f"docs:collection:{bytes(name_mac).hex()}")
        coll = store.collection(name, create=True)
        with db:
            db.execute("UPDATE docs_collections SET created = ?, updated = ?, budget = ? WHERE id = ?",
                       (created, updated, budget or 0, coll.id))
        for fid_old, path_mac, info_blob in old.execute(
                "SELECT id, path_mac, info FROM docs_files WHERE collection_id = ? ORDER BY id", (cid_old,)).fetchall():
            info = unseal(info_blob, f"docs:file:{cid_old}:{bytes(path_mac).hex()}")
            pages = [unseal(b, f"docs:page:{fid_old}:{i}") for i, b in old.execute(
                "SELECT idx, body FROM docs_pages WHERE file_id = ? ORDER BY idx", (fid_old,))]
            rows = []
            for seq, body in old.execute("SELECT seq, body FROM docs_chunks WHERE file_id = ? ORDER BY seq",
                                         (fid_old,)):
                d = unseal(body, f"docs:chunk:{fid_old}:{seq}")
                rows.append((seq, d["page"], d["heading"], d["start"], d["end"], d["text"]))
            info = dict(info, mtime_ns=0)
            with db:
                store.insert_file(coll.id, info, [(p["number"], p["text"]) for p in pages], rows,
                                  [terms_for(r[2], r[5]) for r in rows])
            files += 1
            chunks += len(rows)
    got = db.execute("SELECT COUNT(*), COALESCE(SUM(chunks), 0) FROM docs_files").fetchone()
    if tuple(got) != (files, chunks):
        raise RuntimeError(f"migration lost documents ({got[0]} of {files} files); the old file is kept")
    return {"files": files, "chunks": chunks}
