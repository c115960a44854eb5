"""The one encrypted database: the SQLCipher build it needs, the key side file,
and the migration from the previous layout (history.sqlite3 with AES-GCM values)."""
from __future__ import annotations

import hashlib
import hmac
import json
import os
import sqlite3

import pytest
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from sqlcipher3 import dbapi2 as sqlcipher

from app.documents.retrieve import search
from app.documents.store import LEGACY_PARTS, DocumentStore
from app.store.crypto import Cipher, PassphraseKeys, WrongKey
from app.store.database import CHECK_TEXT, KeyFile, stored_key_kind
from app.store.history import HistoryStore
from app.store.migrate import MigrationRefused


@pytest.fixture
def home(tmp_path, monkeypatch):
    h = tmp_path / "ferry-home"
    monkeypatch.setenv("FERRY_HOME", str(h))
    return h


def test_the_sqlcipher_build_has_what_ferry_needs():
    db = sqlcipher.connect(":memory:")
    opts = {r[0] for r in db.execute("PRAGMA compile_options")}
    assert "ENABLE_FTS5" in opts
    version = tuple(int(x) for x in db.execute("SELECT sqlite_version()").fetchone()[0].split("."))
    assert version >= (3, 43, 0)          # FTS5 contentless_delete
    assert db.execute("PRAGMA cipher_version").fetchone()[0].startswith("4.")


# ---- the previous layout, written as the previous version wrote it

_OLD_SCHEMA = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value BLOB NOT NULL);
CREATE TABLE conversations (id INTEGER PRIMARY KEY, created REAL NOT NULL, updated REAL NOT NULL,
    title BLOB NOT NULL, leaf_id INTEGER, model TEXT NOT NULL DEFAULT '');
CREATE TABLE messages (id INTEGER PRIMARY KEY, conversation_id INTEGER NOT NULL, parent_id INTEGER,
    role TEXT NOT NULL, body BLOB NOT NULL, thinking BLOB NOT NULL, thinking_seconds REAL, status TEXT NOT NULL,
    created REAL NOT NULL, stats TEXT NOT NULL DEFAULT '{}');
CREATE TABLE docs_collections (id INTEGER PRIMARY KEY, name_mac BLOB NOT NULL UNIQUE, name BLOB NOT NULL,
    created REAL NOT NULL, updated REAL NOT NULL, generation INTEGER NOT NULL DEFAULT 0,
    budget INTEGER NOT NULL DEFAULT 0);
CREATE TABLE docs_files (id INTEGER PRIMARY KEY, collection_id INTEGER NOT NULL, path_mac BLOB NOT NULL,
    info BLOB NOT NULL, added REAL NOT NULL);
CREATE TABLE docs_pages (file_id INTEGER NOT NULL, idx INTEGER NOT NULL, body BLOB NOT NULL);
CREATE TABLE docs_chunks (id INTEGER PRIMARY KEY, file_id INTEGER NOT NULL, collection_id INTEGER NOT NULL,
    seq INTEGER NOT NULL, body BLOB NOT NULL);
"""


def _sub(key: bytes, info: bytes) -> bytes:
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=info).derive(key)


def write_legacy(path, passphrase: str, text: str) -> None:
    db = sqlite3.connect(path)
    db.executescript(_OLD_SCHEMA)
    meta = {}

    class M:
        get = staticmethod(meta.get)

        @staticmethod
        def set(k, v):
            meta[k] = v

    key = PassphraseKeys(passphrase).key(M)
    c = Cipher(key)
    meta.update(check=c.encrypt(CHECK_TEXT, "meta:check"), key_kind=b"passphrase", schema=b"1")
    db.executemany("INSERT INTO meta VALUES (?, ?)", list(meta.items()))
    db.execute("INSERT INTO conversations VALUES (1, 1.0, 2.0, ?, 2, 'demo')", (c.encrypt("Harbour plans", "conv:1:title"),))
    db.execute("INSERT INTO messages VALUES (1, 1, NULL, 'user', ?, ?, NULL, 'done', 1.0, '{}')",
               (c.encrypt("where is the key?", "msg:1:body"), c.encrypt("", "msg:1:thinking")))
    db.execute("INSERT INTO messages VALUES (2, 1, 1, 'assistant', ?, ?, 0.5, 'done', 2.0, '{\"tokens\": 3}')",
               (c.encrypt("under the blue stone", "msg:2:body"), c.encrypt("hmm", "msg:2:thinking")))
    aead, mackey = AESGCM(_sub(key, b"ferry documents v1 aead")), _sub(key, b"ferry documents v1 mac")

    def seal(v, aad):
        n = os.urandom(12)
        return n + aead.encrypt(n, json.dumps(v).encode(), aad.encode())

    def mac(*parts):
        h = hmac.new(mackey, digestmod=hashlib.sha256)
        for p in parts:
            b = p.encode()
            h.update(len(b).to_bytes(4, "little") + b)
        return h.digest()

    nm = mac("collection", "household")
    db.execute("INSERT INTO docs_collections VALUES (1, ?, ?, 1.0, 2.0, 3, 500)",
               (nm, seal("household", f"docs:collection:{nm.hex()}")))
    pm = mac("path", "/home/u/notes.md")
    info = {"path": "/home/u/notes.md", "name": "notes.md", "kind": "markdown", "pages": 1, "chunks": 2,
            "chars": len(text), "size": len(text), "sha256": "ab" * 32}
    db.execute("INSERT INTO docs_files VALUES (1, 1, ?, ?, 1.0)", (pm, seal(info, f"docs:file:1:{pm.hex()}")))
    db.execute("INSERT INTO docs_pages VALUES (1, 0, ?)", (seal({"number": None, "text": text}, "docs:page:1:0"),))
    half = text.index(". ") + 1
    for seq, (a, b) in enumerate([(0, half), (half + 1, len(text))]):
        db.execute("INSERT INTO docs_chunks VALUES (?, 1, 1, ?, ?)", (seq + 1, seq, seal(
            {"page": None, "page_idx": 0, "heading": "Notes", "start": a, "end": b, "text": text[a:b]},
            f"docs:chunk:1:{seq}")))
    db.commit()
    db.close()


TEXT = "The spare key is under the blue stone by the gate. The boiler was serviced in March by Aldous Heating."


def test_migration_keeps_every_conversation_and_document(home):
    home.mkdir(parents=True)
    legacy = home / "history.sqlite3"
    write_legacy(legacy, "open sesame", TEXT)
    assert stored_key_kind(home / "ferry.db") == "passphrase"
    with pytest.raises(WrongKey):                       # a wrong passphrase changes nothing
        HistoryStore(keys=PassphraseKeys("open sesame?"))
    assert legacy.exists() and not (home / "ferry.db").exists()

    with pytest.raises(MigrationRefused, match="holds documents"):   # only with the documents' half
        HistoryStore(keys=PassphraseKeys("open sesame"))
    assert legacy.exists() and not (home / "ferry.db").exists()
    store = HistoryStore(keys=PassphraseKeys("open sesame"), legacy_parts=LEGACY_PARTS)
    assert store.path == home / "ferry.db" and not legacy.exists()
    [conv] = store.conversations()
    assert (conv.title, conv.leaf_id, conv.model) == ("Harbour plans", 2, "demo")
    msgs = store.messages(1)
    assert [(m.role, m.content, m.thinking) for m in msgs] == [("user", "where is the key?", ""),
                                                             ("assistant", "under the blue stone", "hmm")]
    assert msgs[1].stats == {"tokens": 3} and msgs[1].thinking_seconds == 0.5
    store.close()

    docs = DocumentStore(keys=PassphraseKeys("open sesame"))
    coll = docs.collection("household")
    assert (coll.files, coll.chunks, coll.budget) == (1, 2, 500)
    [hit] = search(docs.index("household"), "who serviced the boiler?", k=1)
    assert hit.chunk.file_name == "notes.md" and "Aldous" in hit.chunk.text
    assert docs.page_text(hit.chunk.file_id, None) == TEXT
    docs.close()
    for needle in (b"blue stone", b"Aldous", b"Harbour plans", b"household"):
        for f in home.iterdir():
            assert needle not in f.read_bytes(), f
    assert KeyFile(home / "ferry.db").get("key_kind") == b"passphrase"


def test_a_named_legacy_file_is_migrated_in_place(tmp_path):
    legacy = tmp_path / "history.sqlite3"
    write_legacy(legacy, "pw", TEXT)
    store = HistoryStore(legacy, PassphraseKeys("pw"), legacy_parts=LEGACY_PARTS)
    assert store.messages(1)[1].content == "under the blue stone"
    store.close()
    assert legacy.read_bytes()[:16] != b"SQLite format 3\x00"


def test_a_lost_key_file_is_written_again_from_a_key_that_opens(kr, tmp_path):
    from app.store.crypto import KeychainKeys

    db = tmp_path / "ferry.db"
    HistoryStore(db, KeychainKeys()).close()
    KeyFile(db).path.unlink()
    HistoryStore(db, KeychainKeys()).close()            # the keychain's key still opens it
    assert KeyFile(db).get("check") is not None
    KeyFile(db).path.unlink()
    with pytest.raises(WrongKey):
        HistoryStore(db, PassphraseKeys("guess"))
    assert KeyFile(db).get("check") is None             # nothing written by a key that failed
