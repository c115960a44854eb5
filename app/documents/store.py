"""Collections of documents in Ferry's encrypted database (``ferry.db``).

The tables live in the same SQLCipher database as the conversation history
(:mod:`app.store.database`): every page of the file is encrypted, so the
documents' text, their passages and the **persistent full-text index** over
them (SQLite FTS5) are stored as ordinary rows and searched in place —
nothing is rebuilt when a collection is searched.

Each collection has a contentless FTS5 table (``docs_fts_w_<id>``: the words
after stop-word removal and light stemming; see :mod:`app.documents.index`),
so the BM25 statistics are the collection's own, as they were when the index
lived in memory. The character 4-grams, the second signal, are indexed over
the collection's vocabulary, not its passages (``docs_gramvocab``: each
4-gram of each indexed word), and their document frequencies are kept in
``docs_df``; a collection indexed before that had a per-passage 4-gram FTS5
table (``docs_fts_g_<id>``), replaced once on open.
Adding is done by :mod:`app.documents.indexer` (in parallel, with progress,
cancel and resume); this module holds the rows.
"""
from __future__ import annotations

import json
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Sequence

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from app.documents import champions
from app.documents.index import FtsIndex, IndexedChunk
from app.documents.indexer import AddProgress, AddReport, add_paths
from app.documents.schema import _FTS, _SCHEMA, fts_tables
from app.documents.terms import terms_for
from app.documents.upkeep import IndexBatch, build_gram_vocab, count_df, df_counts, write_df
from app.documents.walk import display_name
from app.documents.warm import WARM_BUDGET, Gate, Warmer
from app.store import database
from app.store.crypto import KeyProvider, WrongKey
from app.store.migrate import legacy_tables, subkey

#: the token budget for passages in a prompt, unless the user sets one
DEFAULT_BUDGET = 1024

class DocumentError(ValueError):
    """A request the document store cannot satisfy (no such collection...)."""


@dataclass
class Keys:
    """Subkeys derived from Ferry's key (the saved prefix states are files of their own)."""

    states: bytes

    @classmethod
    def derive(cls, key: bytes) -> "Keys":
        return cls(HKDF(algorithm=hashes.SHA256(), length=32, salt=None,
                        info=b"ferry documents v1 states").derive(key))


@dataclass
class Collection:
    id: int
    name: str
    created: float
    updated: float
    generation: int
    budget: int
    files: int = 0            #: indexed files
    chunks: int = 0
    skipped: int = 0          #: files that could not be read
    size: int = 0             #: bytes of the indexed files
    last_indexed: float | None = None


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
    status: str = "indexed"   #: "indexed" or "skipped"
    reason: str = ""          #: why it was skipped
    mtime_ns: int = 0


@dataclass
class Source:
    path: str
    watch: bool
    added: float


class DocumentStore:
    """Use from one thread; :meth:`clone` opens another connection for a worker thread."""

    def __init__(self, path: str | Path | None = None, keys: KeyProvider | None = None, *,
                 _opened: tuple[bytes, bytes] | None = None, _gate: Gate | None = None):
        self.path = Path(path) if path is not None else database.default_path()
        if _opened is None:
            if keys is None:
                raise ValueError("a key provider is required: documents are never stored in plaintext")
            from app.store.history import HistoryStore

            # creates (or migrates, the documents too), refuses a wrong key
            history = HistoryStore(self.path, keys, legacy_parts=LEGACY_PARTS)
            key = history.key
            history.close()
            _opened = (key, database.sqlcipher_key(key))
        self._key, self._raw = _opened
        self.keys = Keys.derive(self._key)
        #: searches through this store and its clones; the background warm-up waits while one runs
        self._gate = _gate or Gate()
        self._warmer: Warmer | None = None
        self._db = database.connect(self.path, self._raw)
        try:
            self.ensure_schema(self._db)
        except BaseException:
            self._db.close()
            raise

    @classmethod
    def on_connection(cls, db) -> "DocumentStore":
        """A store over an open connection it does not own (the migration's)."""
        self = cls.__new__(cls)
        self.path, self._key, self._raw, self.keys, self._db = None, None, None, None, db
        self._gate, self._warmer = Gate(), None
        return self

    @staticmethod
    def ensure_schema(db) -> None:
        db.executescript(_SCHEMA)
        if not any(r[1] == "df_ready" for r in db.execute("PRAGMA table_info(docs_collections)")):
            with db:
                db.execute("ALTER TABLE docs_collections ADD COLUMN df_ready INTEGER NOT NULL DEFAULT 0")
        for cid, in db.execute("SELECT id FROM docs_collections WHERE df_ready = 0").fetchall():
            count_df(db, cid)
        champions.ensure_schema(db)
        if not any(r[1] == "champ_ready" for r in db.execute("PRAGMA table_info(docs_collections)")):
            with db:
                db.execute("ALTER TABLE docs_collections ADD COLUMN champ_ready INTEGER NOT NULL DEFAULT 0")
        for cid, in db.execute("SELECT id FROM docs_collections WHERE champ_ready = 0").fetchall():
            with db:        # once, for a collection indexed before champion lists existed
                champions.build_missing(db, cid)
                db.execute("UPDATE docs_collections SET champ_ready = 1 WHERE id = ?", (cid,))
        if not any(r[1] == "gram_vocab_ready" for r in db.execute("PRAGMA table_info(docs_collections)")):
            with db:
                db.execute("ALTER TABLE docs_collections ADD COLUMN gram_vocab_ready INTEGER NOT NULL DEFAULT 0")
        for cid, in db.execute("SELECT id FROM docs_collections WHERE gram_vocab_ready = 0").fetchall():
            build_gram_vocab(db, cid)

    @classmethod
    def beside(cls, history) -> "DocumentStore":
        """The documents of an open :class:`~app.store.history.HistoryStore` (the same database): its
        key is used as it is, without asking the key provider again (a passphrase's scrypt)."""
        return cls(history.path, _opened=(history.key, database.sqlcipher_key(history.key)))

    def clone(self) -> "DocumentStore":
        return DocumentStore(self.path, _opened=(self._key, self._raw), _gate=self._gate)

    @property
    def db(self):
        return self._db

    def warm(self, budget: int = WARM_BUDGET) -> Warmer | None:
        """Start reading ahead, in the background, what searches of this database read
        (:mod:`app.documents.warm`; at most ``budget`` bytes); the running warm-up if there is one.
        None for a store over a borrowed connection. Stopped by :meth:`close`."""
        if self.path is None or self._db is None:
            return None
        if self._warmer is None or not self._warmer.running:
            path, raw = self.path, self._raw
            self._warmer = Warmer(lambda: database.connect(path, raw), self._gate, budget=budget).start()
        return self._warmer

    def close(self) -> None:
        if self._warmer is not None:
            self._warmer.cancel()
        if self._db is not None:
            self._db.close()
            self._db = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ---- collections

    def collection(self, name: str, *, create: bool = False) -> Collection:
        name = name.strip()
        if not name:
            raise DocumentError("a collection needs a name")
        row = self._db.execute("SELECT id, name, created, updated, generation, budget, n_chunks, last_indexed "
                               "FROM docs_collections WHERE name = ?", (name,)).fetchone()
        if row is None:
            if not create:
                raise DocumentError(f"there is no collection '{name}' (add documents with: ferry docs add)")
            now = time.time()
            with self._db:
                # another process may create it at the same moment: the first one wins, the other uses it
                cur = self._db.execute("INSERT OR IGNORE INTO docs_collections(name, created, updated, df_ready, "
                                       "champ_ready, gram_vocab_ready) VALUES (?, ?, ?, 1, 1, 1)",
                                       (name, now, now))
                if cur.rowcount == 1:
                    self._db.execute(_FTS.format(t=fts_tables(cur.lastrowid)[0]))
            return self.collection(name)
        return self._collection(row)

    def _collection(self, row) -> Collection:
        cid = row[0]
        files, size, skipped = self._db.execute(
            "SELECT COALESCE(SUM(status = 'indexed'), 0), COALESCE(SUM(CASE WHEN status = 'indexed' THEN size END), 0), "
            "COALESCE(SUM(status != 'indexed'), 0) FROM docs_files WHERE collection_id = ?", (cid,)).fetchone()
        return Collection(cid, row[1], row[2], row[3], row[4], row[5] or DEFAULT_BUDGET, files, row[6], skipped,
                          size, row[7])

    def collections(self) -> list[Collection]:
        rows = self._db.execute("SELECT id, name, created, updated, generation, budget, n_chunks, last_indexed "
                                "FROM docs_collections ORDER BY updated DESC").fetchall()
        return [self._collection(r) for r in rows]

    def set_budget(self, name: str, tokens: int) -> None:
        if tokens < 64:
            raise DocumentError("the passage budget must be at least 64 tokens")
        coll = self.collection(name)
        with self._db:
            self._db.execute("UPDATE docs_collections SET budget = ? WHERE id = ?", (int(tokens), coll.id))

    def delete_collection(self, name: str) -> None:
        coll = self.collection(name)
        forget_states()
        with self._db:
            self._db.execute(f"DROP TABLE IF EXISTS temp.docs_vocab_{int(coll.id)}")     # champions' view of it
            for t in fts_tables(coll.id):
                self._db.execute(f"DROP TABLE IF EXISTS {t}")
            self._db.execute("DELETE FROM docs_chunks WHERE collection_id = ?", (coll.id,))
            self._db.execute("DELETE FROM docs_df WHERE collection_id = ?", (coll.id,))
            self._db.execute("DELETE FROM docs_gramvocab WHERE collection_id = ?", (coll.id,))
            self._db.execute("DELETE FROM docs_champ WHERE collection_id = ?", (coll.id,))
            self._db.execute("DELETE FROM docs_files WHERE collection_id = ?", (coll.id,))
            self._db.execute("DELETE FROM docs_attached WHERE collection_id = ?", (coll.id,))
            self._db.execute("DELETE FROM docs_collections WHERE id = ?", (coll.id,))

    def rename_collection(self, name: str, new: str) -> None:
        """A collection under another name (its files, index and attachments stay)."""
        new = new.strip()
        if not new or new.startswith(CONVERSATION_PREFIX):
            raise DocumentError(f"a collection needs a name (not starting with '{CONVERSATION_PREFIX}')")
        coll = self.collection(name)
        if new != coll.name and self._db.execute("SELECT 1 FROM docs_collections WHERE name = ?",
                                                  (new,)).fetchone():
            raise DocumentError(f"there is already a collection '{new}'")
        with self._db:
            self._db.execute("UPDATE docs_collections SET name = ? WHERE id = ?", (new, coll.id))

    # ---- collections attached to chats (not owned by them)

    def attach(self, conversation_id: int, name: str) -> None:
        """Chat ``conversation_id`` searches the collection ``name`` too (it stays the collection's)."""
        coll = self.collection(name)
        with self._db:
            self._db.execute("INSERT OR IGNORE INTO docs_attached(conversation_id, collection_id) VALUES (?, ?)",
                             (int(conversation_id), coll.id))

    def detach(self, conversation_id: int, name: str | None = None) -> None:
        """The chat no longer searches ``name`` (None: any attached collection); the collection stays."""
        with self._db:
            if name is None:
                self._db.execute("DELETE FROM docs_attached WHERE conversation_id = ?", (int(conversation_id),))
            else:
                self._db.execute("DELETE FROM docs_attached WHERE conversation_id = ? AND collection_id = "
                                 "(SELECT id FROM docs_collections WHERE name = ?)", (int(conversation_id), name))

    def attached(self, conversation_id: int) -> list[str]:
        """The collections attached to a chat (besides its own files), by name."""
        return [r[0] for r in self._db.execute(
            "SELECT c.name FROM docs_attached a JOIN docs_collections c ON c.id = a.collection_id "
            "WHERE a.conversation_id = ? ORDER BY c.name", (int(conversation_id),))]

    def attached_to(self, name: str) -> list[int]:
        """The chats a collection is attached to."""
        return [r[0] for r in self._db.execute(
            "SELECT a.conversation_id FROM docs_attached a JOIN docs_collections c ON c.id = a.collection_id "
            "WHERE c.name = ? ORDER BY a.conversation_id", (name,))]

    # ---- sources (folders and files the user added; watched ones are kept in sync)

    def add_source(self, name: str, path: str | Path, *, watch: bool | None = None) -> None:
        coll = self.collection(name, create=True)
        p = str(Path(path).expanduser().resolve())
        with self._db:
            self._db.execute("INSERT INTO docs_sources(collection_id, path, added) VALUES (?, ?, ?) "
                             "ON CONFLICT(collection_id, path) DO NOTHING", (coll.id, p, time.time()))
            if watch is not None:
                self._db.execute("UPDATE docs_sources SET watch = ? WHERE collection_id = ? AND path = ?",
                                 (int(watch), coll.id, p))

    def sources(self, name: str) -> list[Source]:
        coll = self.collection(name)
        return [Source(r[0], bool(r[1]), r[2]) for r in self._db.execute(
            "SELECT path, watch, added FROM docs_sources WHERE collection_id = ? ORDER BY path", (coll.id,))]

    def set_watch(self, name: str, path: str | Path, watch: bool) -> None:
        self.add_source(name, path, watch=watch)

    def watched(self) -> list[tuple[str, Source]]:
        rows = self._db.execute("SELECT c.name, s.path, s.watch, s.added FROM docs_sources s "
                                "JOIN docs_collections c ON c.id = s.collection_id WHERE s.watch = 1 "
                                "ORDER BY c.name, s.path").fetchall()
        return [(r[0], Source(r[1], True, r[3])) for r in rows]

    # ---- files

    def files(self, name: str) -> list[FileInfo]:
        """Every file of the collection, indexed or skipped (``status``)."""
        coll = self.collection(name)
        rows = self._db.execute("SELECT id, path, name, kind, pages, chunks, chars, size, sha256, added, status, "
                                "reason, mtime_ns FROM docs_files WHERE collection_id = ? ORDER BY path",
                                (coll.id,)).fetchall()
        return [FileInfo(*r) for r in rows]

    def known(self, cid: int) -> dict[str, tuple[int, int, int, str, str]]:
        """path -> (file id, size, mtime_ns, sha256, status) of a collection's files."""
        return {r[0]: tuple(r[1:]) for r in self._db.execute(
            "SELECT path, id, size, mtime_ns, sha256, status FROM docs_files WHERE collection_id = ?", (cid,))}

    def remove_file(self, name: str, path: str | Path) -> bool:
        coll = self.collection(name)
        p = str(Path(path).expanduser().resolve())
        row = self._db.execute("SELECT id FROM docs_files WHERE collection_id = ? AND path = ?",
                               (coll.id, p)).fetchone()
        if row is None:
            row = self._db.execute("SELECT id FROM docs_files WHERE collection_id = ? AND path = ?",
                                   (coll.id, str(path))).fetchone()
        if row is None:
            return False
        with self._db:
            self.delete_file_rows(coll.id, row[0])
            self._db.execute("DELETE FROM docs_sources WHERE collection_id = ? AND path = ?", (coll.id, p))
        return True

    def delete_file_rows(self, cid: int, file_id: int, batch: IndexBatch | None = None) -> None:
        """Delete a file, its pages, passages and index entries (inside the caller's transaction;
        a pending ``batch`` is written first)."""
        db = self._db
        if batch is not None:
            batch.flush(db)
        n, wl, gl = db.execute("SELECT COUNT(*), COALESCE(SUM(wlen), 0), COALESCE(SUM(glen), 0) FROM docs_chunks "
                               "WHERE file_id = ?", (file_id,)).fetchone()
        if n:
            rows = db.execute("SELECT id, heading, text FROM docs_chunks WHERE file_id = ?", (file_id,)).fetchall()
            terms = [terms_for(h, t) for _, h, t in rows]
            counts = df_counts(terms)
            write_df(db, cid, counts, -1)
            words = fts_tables(cid)[0]
            db.execute(f"DELETE FROM {words} WHERE rowid IN (SELECT id FROM docs_chunks WHERE file_id = ?)",
                       (file_id,))
        db.execute("DELETE FROM docs_files WHERE id = ?", (file_id,))
        db.execute("UPDATE docs_collections SET n_chunks = n_chunks - ?, wlen = wlen - ?, glen = glen - ?, "
                   "generation = generation + 1, updated = ? WHERE id = ?", (n, wl, gl, time.time(), cid))
        if n:
            champions.removed(db, cid, {r[0] for r in rows}, counts[0])
            forget_states()

    def insert_file(self, cid: int, info: dict, pages: Sequence[tuple[int | None, str]],
                    chunks: Sequence[tuple], terms: Sequence[tuple[str, int, str, int]],
                    batch: IndexBatch | None = None, df: tuple[dict, dict] | None = None) -> int:
        """Store one read file (inside the caller's transaction): ``info`` (path, name, kind, chars,
        size, mtime_ns, sha256), its pages (number, text), its chunks (seq, page, heading, start, end,
        text) and per chunk its index terms (words, count, grams, count), with their df_counts if the
        caller has them (a worker process makes them). With a ``batch``, document frequencies and champion lists are left to its ``flush`` (before the transaction commits)."""
        db = self._db
        old = db.execute("SELECT id FROM docs_files WHERE collection_id = ? AND path = ?",
                         (cid, info["path"])).fetchone()
        if old is not None:
            self.delete_file_rows(cid, old[0], batch)
        cur = db.execute("INSERT INTO docs_files(collection_id, path, name, kind, pages, chunks, chars, size, "
                         "mtime_ns, sha256, added, status) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 'indexed')",
                         (cid, info["path"], info["name"], info["kind"], len(pages), len(chunks), info["chars"],
                          info["size"], info["mtime_ns"], info["sha256"], time.time()))
        fid = int(cur.lastrowid)
        db.executemany("INSERT INTO docs_pages(file_id, idx, number, text) VALUES (?, ?, ?, ?)",
                       [(fid, i, number, text) for i, (number, text) in enumerate(pages)])
        first, = db.execute("SELECT COALESCE(MAX(id), 0) + 1 FROM docs_chunks").fetchone()
        ids = range(first, first + len(chunks))
        db.executemany('INSERT INTO docs_chunks(id, file_id, collection_id, seq, page, heading, start, "end", text, '
                       'wlen, glen) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)',
                       [(i, fid, cid, *c, t[1], t[3]) for i, c, t in zip(ids, chunks, terms)])
        db.executemany(f"INSERT INTO {fts_tables(cid)[0]}(rowid, terms) VALUES (?, ?)",
                       [(i, t[0]) for i, t in zip(ids, terms)])
        now = time.time()
        db.execute("UPDATE docs_collections SET n_chunks = n_chunks + ?, wlen = wlen + ?, glen = glen + ?, "
                   "generation = generation + 1, updated = ?, last_indexed = ? WHERE id = ?",
                   (len(chunks), sum(t[1] for t in terms), sum(t[3] for t in terms), now, now, cid))
        own = batch is None
        batch = IndexBatch(cid) if own else batch
        batch.add(ids, terms, df)
        if own:
            batch.flush(db)
        return fid

    def mark_skipped(self, cid: int, path: str, reason: str, size: int = 0, mtime_ns: int = 0,
                     batch: IndexBatch | None = None) -> None:
        """Record a file that could not be read, with why (inside the caller's transaction).
        A name that is not UTF-8 is kept as printable text (U+FFFD for its bad bytes)."""
        path = display_name(path)
        old = self._db.execute("SELECT id FROM docs_files WHERE collection_id = ? AND path = ?",
                               (cid, path)).fetchone()
        if old is not None:
            self.delete_file_rows(cid, old[0], batch)
        self._db.execute("INSERT INTO docs_files(collection_id, path, name, size, mtime_ns, added, status, reason) "
                         "VALUES (?, ?, ?, ?, ?, ?, 'skipped', ?)",
                         (cid, path, Path(path).name, size, mtime_ns, time.time(), reason))

    # ---- adding

    def add(self, name: str, paths: Iterable[str | Path], *, progress: Callable[[AddProgress], None] | None = None,
            cancelled: Callable[[], bool] | None = None, workers: int | None = None,
            watch: bool | None = None) -> AddReport:
        """Read, chunk, index and store files and folders (see :mod:`app.documents.indexer`);
        a file that cannot be read is reported, recorded as skipped, and the rest go on."""
        return add_paths(self, name, paths, progress=progress, cancelled=cancelled, workers=workers, watch=watch)

    def rescan(self, name: str, **kw) -> AddReport:
        """Bring a collection up to date with its sources: new and changed files are read,
        deleted ones removed; a cancelled or interrupted add resumes where it stopped."""
        return self.add(name, [s.path for s in self.sources(name)], **kw)

    # ---- reading

    def page_text(self, file_id: int, page: int | None) -> str:
        """The whole text of a file's page (for showing a passage in context)."""
        for number, text in self._db.execute("SELECT number, text FROM docs_pages WHERE file_id = ? ORDER BY idx",
                                             (file_id,)):
            if number == page:
                return text
        raise DocumentError(f"file {file_id} has no page {page}")

    def chunks(self, name: str) -> list[IndexedChunk]:
        """Every passage of a collection (for small collections and tests; search uses :meth:`index`)."""
        return self.index(name).head(None)

    def index(self, name: str, *, use_champions: bool = True) -> FtsIndex:
        """The collection's persistent index (nothing is built here); ``use_champions=False`` gives
        the reference search that lets FTS5 rank every posting (for measuring the lists)."""
        # the collection's id only: its file counts (Collection.files...) would read a row of every
        # file, scattered over the file (1,741 random reads at 1 GB of text on a cold OS cache)
        row = self._db.execute("SELECT id FROM docs_collections WHERE name = ?", (name.strip(),)).fetchone()
        cid = row[0] if row is not None else self.collection(name).id      # (the error for a missing one)
        return FtsIndex(self._db, cid, fts_tables(cid)[0], use_champions=use_champions, gate=self._gate)


def forget_states() -> int:
    """Delete every saved prefix state: they hold (as attention caches) the passages they were
    read from, so a removed or changed file must not live on in one. They are a cache: the next
    question reads its passages again. Returns how many were deleted."""
    from app.engine.states import INDEX_NAME, states_dir

    n = 0
    root = states_dir()
    if root.is_dir():
        for f in root.glob("*.fxds"):
            f.unlink(missing_ok=True)
            n += 1
        (root / INDEX_NAME).unlink(missing_ok=True)     # their token lists go with them
    return n


#: The name of a chat's own collection (the files attached to it alone) starts with this.
CONVERSATION_PREFIX = "conversation:"


def conversation_collection(conversation_id: int) -> str:
    """The collection that holds the files attached to one conversation."""
    return f"{CONVERSATION_PREFIX}{int(conversation_id)}"


def copy_legacy(old: sqlite3.Connection, new, key: bytes) -> dict[str, int]:
    """The documents' half of the migration from the previous layout (``app.store.migrate``): every
    document of the old file decrypted, then stored and indexed as new ones are."""
    DocumentStore.ensure_schema(new)
    if "docs_collections" not in legacy_tables(old):
        return {}
    store = DocumentStore.on_connection(new)
    aead = AESGCM(subkey(key, b"ferry documents v1 aead"))

    def unseal(blob, aad: str):
        blob = bytes(blob)
        try:
            # a 12-byte nonce, then the sealed value
            return json.loads(aead.decrypt(blob[:12], blob[12:], aad.encode()))
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


#: The documents' half of the migration, for whatever opens the database first (``HistoryStore``'s
#: ``legacy_parts``: the window, and this store itself)
LEGACY_PARTS = {"docs_collections": copy_legacy}
