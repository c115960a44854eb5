"""Conversation history in SQLite, encrypted at rest. No Qt here.

A conversation is a tree of messages: every message names its parent, so a
regenerated answer or an edited question is a sibling of the one it replaces
and both stay reachable. The conversation remembers which leaf is shown.

The history lives in Ferry's one encrypted database (``ferry.db``, every
page encrypted by SQLCipher: :mod:`app.store.database`), beside the
documents. Titles, message bodies and thinking traces are in addition
AES-GCM blobs bound to their row (see :mod:`app.store.crypto`), as they were
when the file itself was not encrypted; a ``check`` value in the key side
file tells a wrong key from a right one before anything is read.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import functools
import sqlite3

from app.store import database
from app.store.crypto import Cipher, KeyProvider
from app.store.migrate import META_KEYS, Part, legacy_tables, migrate
from app.store.database import CHECK_TEXT, stored_key_kind  # noqa: F401 (re-exported)

SCHEMA_VERSION = 2

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS conversations (
    id INTEGER PRIMARY KEY,
    created REAL NOT NULL,
    updated REAL NOT NULL,
    title BLOB NOT NULL,
    leaf_id INTEGER,
    model TEXT NOT NULL DEFAULT ''
);
CREATE TABLE IF NOT EXISTS messages (
    id INTEGER PRIMARY KEY,
    conversation_id INTEGER NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
    parent_id INTEGER REFERENCES messages(id) ON DELETE CASCADE,
    role TEXT NOT NULL,
    body BLOB NOT NULL,
    thinking BLOB NOT NULL,
    thinking_seconds REAL,
    status TEXT NOT NULL,
    created REAL NOT NULL,
    stats TEXT NOT NULL DEFAULT '{}'
);
CREATE INDEX IF NOT EXISTS messages_by_conversation ON messages(conversation_id);
CREATE TABLE IF NOT EXISTS message_images (
    message_id INTEGER NOT NULL REFERENCES messages(id) ON DELETE CASCADE,
    idx INTEGER NOT NULL,
    name BLOB NOT NULL,
    data BLOB NOT NULL,
    PRIMARY KEY (message_id, idx)
);
"""


def default_path() -> Path:
    return database.default_path()


def copy_legacy(old: sqlite3.Connection, new, key: bytes) -> dict[str, int]:
    """The history's half of the migration from the previous layout (``app.store.migrate``): the
    conversations and messages row for row (their blobs stay as they were) and the ``meta`` rows."""
    new.executescript(_SCHEMA)
    have = legacy_tables(old)
    counts = {}
    with new:
        for k, v in database.read_meta(old).items():
            if k not in META_KEYS:
                new.execute("INSERT OR REPLACE INTO meta(key, value) VALUES (?, ?)", (k, v))
        for table, cols in (("conversations", "id, created, updated, title, leaf_id, model"),
                            ("messages", "id, conversation_id, parent_id, role, body, thinking, thinking_seconds, "
                                         "status, created, stats")):
            rows = old.execute(f"SELECT {cols} FROM {table}").fetchall() if table in have else []
            new.executemany(f"INSERT INTO {table}({cols}) VALUES ({','.join('?' * len(cols.split(',')))})", rows)
            counts[table] = len(rows)
    for table in ("conversations", "messages"):
        got, = new.execute(f"SELECT COUNT(*) FROM {table}").fetchone()
        if got != counts[table]:
            raise RuntimeError(f"migration lost rows of {table} ({got} of {counts[table]}); the old file is kept")
    return counts


@dataclass
class ConversationInfo:
    id: int
    title: str
    created: float
    updated: float
    leaf_id: int | None
    model: str = ""


@dataclass
class MessageRecord:
    id: int
    conversation_id: int
    parent_id: int | None
    role: str                 #: "user" or "assistant"
    content: str
    thinking: str = ""
    thinking_seconds: float | None = None
    status: str = "done"      #: "done", "streaming", "stop", "length", "cancelled", "error"
    created: float = 0.0
    stats: dict = field(default_factory=dict)
    #: the images a question carries: {"name": file name, "url": a data: URL} (sealed like the body)
    images: list[dict] = field(default_factory=list)


class HistoryStore:
    """Open (or create) the history at ``path`` with a key from ``keys``.

    Raises :class:`app.store.crypto.WrongKey` when the key does not open an existing history
    and :class:`app.store.crypto.KeyUnavailable` when there is no key to have.
    An older Ferry's history is migrated on the first open: the history's half here, the other halves
    (``legacy_parts``: the documents', ``app.documents.store.LEGACY_PARTS``) from the caller; a file
    with data no half given copies is refused as it is (``app.store.migrate.MigrationRefused``).
    Use from one thread (the GUI's main thread)."""

    def __init__(self, path: str | Path | None = None, keys: KeyProvider | None = None, *,
                 legacy_parts: dict[str, Part] | None = None):
        if keys is None:
            raise ValueError("a key provider is required: the history is never stored in plaintext")
        self.path = Path(path) if path is not None else default_path()
        self.key_provider = keys  #: kept so the document store opens with the same key
        self.key_kind = keys.kind
        parts = {"conversations": copy_legacy, **(legacy_parts or {})}
        self._db, self.key = database.open_database(self.path, keys, migrate=functools.partial(migrate, parts=parts))
        try:
            self._db.executescript(_SCHEMA)
            with self._db:
                self._db.execute("INSERT OR REPLACE INTO meta(key, value) VALUES ('schema', ?)",
                                 (str(SCHEMA_VERSION).encode(),))
            self._cipher = Cipher(self.key)
        except BaseException:
            self._db.close()
            raise

    @property
    def cipher(self) -> Cipher:
        """This history's cipher, for other values sealed with the same key (the settings' user text)."""
        return self._cipher

    # ---- conversations

    def create_conversation(self, title: str = "New chat", model: str = "") -> int:
        now = time.time()
        with self._db:
            cur = self._db.execute("INSERT INTO conversations(created, updated, title, model) VALUES (?, ?, ?, ?)",
                                   (now, now, b"", model))
            cid = int(cur.lastrowid)
            self._db.execute("UPDATE conversations SET title = ? WHERE id = ?", (self._enc(title, cid), cid))
        return cid

    def rename(self, conversation_id: int, title: str) -> None:
        with self._db:
            self._db.execute("UPDATE conversations SET title = ?, updated = ? WHERE id = ?",
                             (self._enc(title, conversation_id), time.time(), conversation_id))

    def delete_conversation(self, conversation_id: int) -> None:
        with self._db:
            self._db.execute("DELETE FROM message_images WHERE message_id IN "
                             "(SELECT id FROM messages WHERE conversation_id = ?)", (conversation_id,))
            self._db.execute("DELETE FROM messages WHERE conversation_id = ?", (conversation_id,))
            self._db.execute("DELETE FROM conversations WHERE id = ?", (conversation_id,))

    def conversation(self, conversation_id: int) -> ConversationInfo:
        row = self._db.execute("SELECT id, title, created, updated, leaf_id, model FROM conversations WHERE id = ?",
                               (conversation_id,)).fetchone()
        if row is None:
            raise KeyError(f"no conversation {conversation_id}")
        return self._info(row)

    def conversations(self) -> list[ConversationInfo]:
        """Every conversation, the most recently changed first."""
        rows = self._db.execute("SELECT id, title, created, updated, leaf_id, model FROM conversations "
                                "ORDER BY updated DESC, id DESC").fetchall()
        return [self._info(r) for r in rows]

    def conversation_ids(self) -> set[int]:
        """The ids of every conversation (nothing decrypted)."""
        return {r[0] for r in self._db.execute("SELECT id FROM conversations")}

    def set_leaf(self, conversation_id: int, leaf_id: int | None) -> None:
        with self._db:
            self._db.execute("UPDATE conversations SET leaf_id = ? WHERE id = ?", (leaf_id, conversation_id))

    def search(self, query: str) -> list[ConversationInfo]:
        """Conversations whose title or any message contains ``query`` (case-insensitive).
        The text is encrypted, so this decrypts in memory; nothing is indexed on disk."""
        q = query.casefold().strip()
        found = []
        for info in self.conversations():
            if not q or q in info.title.casefold() or any(
                    q in m.content.casefold() or q in m.thinking.casefold()
                    for m in self.messages(info.id, images=False)):
                found.append(info)
        return found

    # ---- messages

    def add_message(self, conversation_id: int, parent_id: int | None, role: str, content: str = "", *,
                    thinking: str = "", status: str = "done", images: list[dict] | None = None) -> int:
        """A message; ``images`` ({"name", "url"}: a data URL) are kept with it, sealed like its body."""
        now = time.time()
        with self._db:
            cur = self._db.execute(
                "INSERT INTO messages(conversation_id, parent_id, role, body, thinking, status, created) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)", (conversation_id, parent_id, role, b"", b"", status, now))
            mid = int(cur.lastrowid)
            self._db.execute("UPDATE messages SET body = ?, thinking = ? WHERE id = ?",
                             (self._enc(content, mid, "body"), self._enc(thinking, mid, "thinking"), mid))
            for i, img in enumerate(images or ()):
                self._db.execute("INSERT INTO message_images(message_id, idx, name, data) VALUES (?, ?, ?, ?)",
                                 (mid, i, self._enc(str(img.get("name") or f"image {i + 1}"), mid, f"image{i}.name"),
                                  self._enc(str(img["url"]), mid, f"image{i}.data")))
            self._db.execute("UPDATE conversations SET updated = ?, leaf_id = ? WHERE id = ?",
                             (now, mid, conversation_id))
        return mid

    def update_message(self, message_id: int, *, content: str | None = None, thinking: str | None = None,
                       status: str | None = None, thinking_seconds: float | None = None,
                       stats: dict | None = None) -> None:
        sets, args = [], []
        if content is not None:
            sets.append("body = ?")
            args.append(self._enc(content, message_id, "body"))
        if thinking is not None:
            sets.append("thinking = ?")
            args.append(self._enc(thinking, message_id, "thinking"))
        if status is not None:
            sets.append("status = ?")
            args.append(status)
        if thinking_seconds is not None:
            sets.append("thinking_seconds = ?")
            args.append(float(thinking_seconds))
        if stats is not None:
            sets.append("stats = ?")
            args.append(json.dumps(stats))
        if not sets:
            return
        with self._db:
            self._db.execute(f"UPDATE messages SET {', '.join(sets)} WHERE id = ?", (*args, message_id))
            self._db.execute("UPDATE conversations SET updated = ? WHERE id = "
                             "(SELECT conversation_id FROM messages WHERE id = ?)", (time.time(), message_id))

    def messages(self, conversation_id: int, *, images: bool = True) -> list[MessageRecord]:
        """The conversation's messages, oldest first; ``images`` False leaves the images unread."""
        rows = self._db.execute(
            "SELECT id, conversation_id, parent_id, role, body, thinking, thinking_seconds, status, created, stats "
            "FROM messages WHERE conversation_id = ? ORDER BY id", (conversation_id,)).fetchall()
        out = [MessageRecord(id=r[0], conversation_id=r[1], parent_id=r[2], role=r[3],
                             content=self._dec(r[4], r[0], "body"), thinking=self._dec(r[5], r[0], "thinking"),
                             thinking_seconds=r[6], status=r[7], created=r[8], stats=json.loads(r[9] or "{}"))
               for r in rows]
        if images and out:
            by_id = {m.id: m for m in out}
            for mid, idx, name, data in self._db.execute(
                    "SELECT i.message_id, i.idx, i.name, i.data FROM message_images i JOIN messages m "
                    "ON m.id = i.message_id WHERE m.conversation_id = ? ORDER BY i.message_id, i.idx",
                    (conversation_id,)):
                if mid in by_id:
                    by_id[mid].images.append({"name": self._dec(name, mid, f"image{idx}.name"),
                                              "url": self._dec(data, mid, f"image{idx}.data")})
        return out

    def close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None

    # ---- helpers

    def _info(self, row) -> ConversationInfo:
        return ConversationInfo(id=row[0], title=self._dec(row[1], row[0]), created=row[2], updated=row[3],
                                leaf_id=row[4], model=row[5])

    def _enc(self, text: str, row_id: int, column: str = "title") -> bytes:
        table = "conv" if column == "title" else "msg"
        return self._cipher.encrypt(text, f"{table}:{row_id}:{column}")

    def _dec(self, blob: bytes, row_id: int, column: str = "title") -> str:
        if not blob:
            return ""
        table = "conv" if column == "title" else "msg"
        return self._cipher.decrypt(bytes(blob), f"{table}:{row_id}:{column}")
