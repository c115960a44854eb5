"""Collections of documents in the history's encrypted SQLite store.

The tables live in the same database file as the conversation history
(``history.sqlite3``), opened with the same key provider: a new key is never
made here, and the history's ``check`` value must open. From that key two
subkeys are derived with HKDF (one for AES-GCM, one for HMAC), so the
documents' ciphertexts can never be confused with the history's.

On disk, in the clear: row ids, times, counts, and HMACs of collection names
and file paths (to find them again without decrypting everything; an HMAC
without the key says nothing about the name). Everything else — names,
paths, each page's text, each chunk's text, page, heading and offsets — is
an AES-256-GCM blob bound to its row (associated data). There is no
plaintext full-text index: the BM25 index is built in memory from the
decrypted chunks (app/documents/index.py). ``secure_delete`` zeroes removed
rows and ``temp_store=MEMORY`` keeps SQLite's temporary tables in RAM.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import os
import sqlite3
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from app.documents.chunk import chunk_document
from app.documents.extract import ExtractError, expand, extract
from app.documents.index import IndexedChunk, MemoryIndex
from app.documents.walk import display_name, read_document_bytes
from app.store.crypto import Cipher, KeyProvider, WrongKey
from app.store.history import CHECK_TEXT, HistoryStore, _MetaTable, default_path
from app.store.private import private_dir, private_umask, touch_private

NONCE = 12
#: the token budget for passages in a prompt, unless the user sets one
DEFAULT_BUDGET = 1024

_SCHEMA = """
CREATE TABLE IF NOT EXISTS docs_collections (
    id INTEGER PRIMARY KEY,
    name_mac BLOB NOT NULL UNIQUE,
    name BLOB NOT NULL,
    created REAL NOT NULL,
    updated REAL NOT NULL,
    generation INTEGER NOT NULL DEFAULT 0,
    budget INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS docs_files (
    id INTEGER PRIMARY KEY,
    collection_id INTEGER NOT NULL REFERENCES docs_collections(id) ON DELETE CASCADE,
    path_mac BLOB NOT NULL,
    info BLOB NOT NULL,
    added REAL NOT NULL,
    UNIQUE (collection_id, path_mac)
);
CREATE TABLE IF NOT EXISTS docs_pages (
    file_id INTEGER NOT NULL REFERENCES docs_files(id) ON DELETE CASCADE,
    idx INTEGER NOT NULL,
    body BLOB NOT NULL,
    PRIMARY KEY (file_id, idx)
);
CREATE TABLE IF NOT EXISTS docs_chunks (
    id INTEGER PRIMARY KEY,
    file_id INTEGER NOT NULL REFERENCES docs_files(id) ON DELETE CASCADE,
    collection_id INTEGER NOT NULL,
    seq INTEGER NOT NULL,
    body BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS docs_chunks_by_collection ON docs_chunks(collection_id);
"""


class DocumentError(ValueError):
    """A request the document store cannot satisfy (no such collection...)."""


@dataclass
class Keys:
    """The subkeys derived from the history key."""

    aead: bytes
    mac: bytes
    states: bytes

    @classmethod
    def derive(cls, key: bytes) -> "Keys":
        def sub(info: bytes) -> bytes:
            return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=info).derive(key)

        return cls(sub(b"ferry documents v1 aead"), sub(b"ferry documents v1 mac"), sub(b"ferry documents v1 states"))


def history_key(path: Path, keys: KeyProvider) -> bytes:
    """The history's key (creating the history if there is none yet);
    raises WrongKey / KeyUnavailable as HistoryStore does."""
    HistoryStore(path, keys).close()
    db = sqlite3.connect(path)
    try:
        meta = _MetaTable(db)
        key = keys.key(meta)
        check = meta.get("check")
        if check is None or Cipher(key).decrypt(check, "meta:check") != CHECK_TEXT:
            raise WrongKey("this key or passphrase does not open the history")
    finally:
        db.close()
    return key


@dataclass
class Collection:
    id: int
    name: str
    created: float
    updated: float
    generation: int
    budget: int
    files: int = 0
    chunks: int = 0


@dataclass
class FileInfo:
    id: int
    path: str
    name: str
    kind: str
    pages: int
    chunks: int
    chars: int
    size: int
    sha256: str
    added: float


@dataclass
class AddProgress:
    done: int             #: files finished
    total: int
    path: Path            #: the file being read now (or just finished)
    stage: str            #: "reading", "indexed", "unchanged", "failed", "done"
    message: str = ""


@dataclass
class AddReport:
    added: list[Path] = field(default_factory=list)
    unchanged: list[Path] = field(default_factory=list)
    failed: list[tuple[Path, str]] = field(default_factory=list)
    chunks: int = 0
    seconds: float = 0.0
    cancelled: bool = False

    def as_dict(self) -> dict:
        return {"added": [str(p) for p in self.added], "unchanged": [str(p) for p in self.unchanged],
                "failed": [{"path": display_name(p), "name": display_name(p.name), "error": why}
                           for p, why in self.failed],
                "chunks": self.chunks, "seconds": round(self.seconds, 3), "cancelled": self.cancelled}


_INDEX_CACHE: dict[tuple[str, int, int], MemoryIndex] = {}
_INDEX_LOCK = threading.Lock()


class DocumentStore:
    """Use from one thread; :meth:`clone` opens another connection for a worker thread."""

    def __init__(self, path: str | Path | None = None, keys: KeyProvider | None = None, *,
                 _derived: Keys | None = None):
        self.path = Path(path) if path is not None else default_path()
        if _derived is None:
            if keys is None:
                raise ValueError("a key provider is required: documents are never stored in plaintext")
            private_dir(self.path.parent)
            _derived = Keys.derive(history_key(self.path, keys))
        self.keys = _derived
        self._aead = AESGCM(self.keys.aead)
        touch_private(self.path)
        with private_umask():
            self._db = sqlite3.connect(self.path, timeout=30)
        try:
            for pragma in ("journal_mode=WAL", "synchronous=NORMAL", "foreign_keys=ON", "secure_delete=ON",
                           "temp_store=MEMORY", "busy_timeout=30000"):
                self._db.execute(f"PRAGMA {pragma}")
            self._db.executescript(_SCHEMA)
        except BaseException:
            self._db.close()
            raise

    def clone(self) -> "DocumentStore":
        return DocumentStore(self.path, _derived=self.keys)

    def close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ---- crypto helpers

    def mac(self, *parts: str | bytes) -> bytes:
        h = hmac.new(self.keys.mac, digestmod=hashlib.sha256)
        for p in parts:
            b = p.encode("utf-8") if isinstance(p, str) else p
            h.update(len(b).to_bytes(4, "little") + b)
        return h.digest()

    def seal(self, value, aad: str) -> bytes:
        nonce = os.urandom(NONCE)
        data = json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
        return nonce + self._aead.encrypt(nonce, data, aad.encode())

    def open_(self, blob: bytes, aad: str):
        blob = bytes(blob)
        try:
            return json.loads(self._aead.decrypt(blob[:NONCE], blob[NONCE:], aad.encode()))
        except InvalidTag as exc:
            raise WrongKey(f"a stored document value ({aad.split(':')[1]}) does not decrypt: "
                           "it was damaged or moved") from exc

    # ---- collections

    def collection(self, name: str, *, create: bool = False) -> Collection:
        name = name.strip()
        if not name:
            raise DocumentError("a collection needs a name")
        name_mac = self.mac("collection", name)
        row = self._db.execute("SELECT id, name, created, updated, generation, budget FROM docs_collections "
                               "WHERE name_mac = ?", (name_mac,)).fetchone()
        if row is None:
            if not create:
                raise DocumentError(f"there is no collection '{name}' (add documents with: ferry docs add)")
            now = time.time()
            with self._db:
                self._db.execute("INSERT INTO docs_collections(name_mac, name, created, updated) "
                                       "VALUES (?, ?, ?, ?)",
                                       (name_mac, self.seal(name, f"docs:collection:{name_mac.hex()}"), now, now))
            return self.collection(name)
        return self._collection(row, name_mac)

    def _collection(self, row, name_mac: bytes) -> Collection:
        cid = row[0]
        files, = self._db.execute("SELECT COUNT(*) FROM docs_files WHERE collection_id = ?", (cid,)).fetchone()
        chunks, = self._db.execute("SELECT COUNT(*) FROM docs_chunks WHERE collection_id = ?", (cid,)).fetchone()
        return Collection(cid, self.open_(row[1], f"docs:collection:{name_mac.hex()}"), row[2], row[3], row[4],
                          row[5] or DEFAULT_BUDGET, files, chunks)

    def collections(self) -> list[Collection]:
        rows = self._db.execute("SELECT id, name, created, updated, generation, budget, name_mac "
                                "FROM docs_collections ORDER BY updated DESC").fetchall()
        return [self._collection(r[:6], bytes(r[6])) for r in rows]

    def set_budget(self, name: str, tokens: int) -> None:
        if tokens < 64:
            raise DocumentError("the passage budget must be at least 64 tokens")
        coll = self.collection(name)
        with self._db:
            self._db.execute("UPDATE docs_collections SET budget = ? WHERE id = ?", (int(tokens), coll.id))

    def delete_collection(self, name: str) -> None:
        coll = self.collection(name)
        with self._db:
            self._db.execute("DELETE FROM docs_chunks WHERE collection_id = ?", (coll.id,))
            self._db.execute("DELETE FROM docs_files WHERE collection_id = ?", (coll.id,))
            self._db.execute("DELETE FROM docs_collections WHERE id = ?", (coll.id,))

    def files(self, name: str) -> list[FileInfo]:
        coll = self.collection(name)
        rows = self._db.execute("SELECT id, path_mac, info, added FROM docs_files WHERE collection_id = ? "
                                "ORDER BY id", (coll.id,)).fetchall()
        out = []
        for fid, path_mac, info, added in rows:
            d = self.open_(info, f"docs:file:{coll.id}:{bytes(path_mac).hex()}")
            out.append(FileInfo(fid, d["path"], d["name"], d["kind"], d["pages"], d["chunks"], d["chars"],
                                d["size"], d["sha256"], added))
        return out

    def remove_file(self, name: str, path: str | Path) -> bool:
        coll = self.collection(name)
        path_mac = self.mac("path", str(Path(path).expanduser().resolve()))
        with self._db:
            row = self._db.execute("SELECT id FROM docs_files WHERE collection_id = ? AND path_mac = ?",
                                   (coll.id, path_mac)).fetchone()
            if row is None:
                return False
            self._db.execute("DELETE FROM docs_files WHERE id = ?", (row[0],))
            self._db.execute("UPDATE docs_collections SET generation = generation + 1, updated = ? WHERE id = ?",
                             (time.time(), coll.id))
        return True

    # ---- adding

    def add(self, name: str, paths: Iterable[str | Path], *, progress: Callable[[AddProgress], None] | None = None,
            cancelled: Callable[[], bool] | None = None) -> AddReport:
        """Read, chunk and store files and folders; a file that cannot be read
        is reported (``report.failed``, and a "failed" progress event) and skipped."""
        t0 = time.monotonic()
        coll = self.collection(name, create=True)
        files, skipped = expand(paths)
        report = AddReport(failed=list(skipped))
        emit = progress or (lambda p: None)
        for p, why in skipped:
            emit(AddProgress(0, len(files), p, "failed", why))
        for i, f in enumerate(files):
            if cancelled is not None and cancelled():
                report.cancelled = True
                break
            emit(AddProgress(i, len(files), f, "reading"))
            try:
                stage, n = self._add_file(coll.id, f)
            except ExtractError as exc:
                report.failed.append((f, str(exc)))
                emit(AddProgress(i + 1, len(files), f, "failed", str(exc)))
                continue
            (report.added if stage == "indexed" else report.unchanged).append(f)
            report.chunks += n
            emit(AddProgress(i + 1, len(files), f, stage, f"{n} passages" if stage == "indexed" else ""))
        report.seconds = time.monotonic() - t0
        emit(AddProgress(len(files), len(files), Path(), "done"))
        return report

    def _add_file(self, cid: int, f: Path) -> tuple[str, int]:
        resolved = f.expanduser().resolve()
        path_mac = self.mac("path", str(resolved))
        data = read_document_bytes(resolved)
        digest = hashlib.sha256(data).hexdigest()
        aad = f"docs:file:{cid}:{path_mac.hex()}"
        row = self._db.execute("SELECT id, info FROM docs_files WHERE collection_id = ? AND path_mac = ?",
                               (cid, path_mac)).fetchone()
        if row is not None and self.open_(row[1], aad).get("sha256") == digest:
            return "unchanged", 0
        doc = extract(resolved)
        chunks = chunk_document(doc)
        if not chunks:
            raise ExtractError("the file has no text to index")
        info = {"path": str(resolved), "name": resolved.name, "kind": doc.kind, "pages": len(doc.pages),
                "chunks": len(chunks), "chars": doc.chars, "size": len(data), "sha256": digest}
        with self._db:
            if row is not None:
                self._db.execute("DELETE FROM docs_files WHERE id = ?", (row[0],))
            cur = self._db.execute("INSERT INTO docs_files(collection_id, path_mac, info, added) VALUES (?, ?, ?, ?)",
                                   (cid, path_mac, self.seal(info, aad), time.time()))
            fid = int(cur.lastrowid)
            self._db.executemany("INSERT INTO docs_pages(file_id, idx, body) VALUES (?, ?, ?)",
                                 [(fid, i, self.seal({"number": p.number, "text": p.text}, f"docs:page:{fid}:{i}"))
                                  for i, p in enumerate(doc.pages)])
            page_idx = {p.number: i for i, p in enumerate(doc.pages)}
            self._db.executemany(
                "INSERT INTO docs_chunks(file_id, collection_id, seq, body) VALUES (?, ?, ?, ?)",
                [(fid, cid, c.seq, self.seal({"page": c.page, "page_idx": page_idx.get(c.page, 0), "heading": c.heading,
                                              "start": c.start, "end": c.end, "text": c.text},
                                             f"docs:chunk:{fid}:{c.seq}")) for c in chunks])
            self._db.execute("UPDATE docs_collections SET generation = generation + 1, updated = ? WHERE id = ?",
                             (time.time(), cid))
        return "indexed", len(chunks)

    # ---- reading

    def page_text(self, file_id: int, page: int | None) -> str:
        """The whole text of a file's page (for showing a passage in context)."""
        rows = self._db.execute("SELECT idx, body FROM docs_pages WHERE file_id = ? ORDER BY idx",
                                (file_id,)).fetchall()
        for idx, body in rows:
            d = self.open_(body, f"docs:page:{file_id}:{idx}")
            if d["number"] == page:
                return d["text"]
        raise DocumentError(f"file {file_id} has no page {page}")

    def chunks(self, name: str) -> list[IndexedChunk]:
        coll = self.collection(name)
        files = {f.id: f for f in self.files(name)}
        rows = self._db.execute("SELECT id, file_id, seq, body FROM docs_chunks WHERE collection_id = ? "
                                "ORDER BY file_id, seq", (coll.id,)).fetchall()
        out = []
        for cid, fid, seq, body in rows:
            d = self.open_(body, f"docs:chunk:{fid}:{seq}")
            f = files[fid]
            out.append(IndexedChunk(cid, fid, f.name, f.path, d["page"], d["heading"], d["start"], d["end"],
                                    d["text"], seq))
        return out

    def index(self, name: str) -> MemoryIndex:
        """The collection's in-memory index (built once per change of the collection)."""
        coll = self.collection(name)
        key = (str(self.path), coll.id, coll.generation)
        with _INDEX_LOCK:
            hit = _INDEX_CACHE.get(key)
        if hit is None:
            hit = MemoryIndex(self.chunks(name))
            with _INDEX_LOCK:
                for k in [k for k in _INDEX_CACHE if k[:2] == key[:2]]:
                    del _INDEX_CACHE[k]
                _INDEX_CACHE[key] = hit
        return hit


def conversation_collection(conversation_id: int) -> str:
    """The collection that holds the files attached to one conversation."""
    return f"conversation:{int(conversation_id)}"
