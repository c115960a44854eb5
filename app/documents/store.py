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

import re
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Sequence

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from app.documents import champions
from app.documents.index import FtsIndex, IndexedChunk, terms_for, word_grams
from app.documents.warm import WARM_BUDGET, Gate, Warmer
from app.documents.walk import display_name
from app.store import database
from app.store.crypto import KeyProvider

#: the token budget for passages in a prompt, unless the user sets one
DEFAULT_BUDGET = 1024

_SCHEMA = """
CREATE TABLE IF NOT EXISTS docs_collections (
    id INTEGER PRIMARY KEY,
    name TEXT NOT NULL UNIQUE,
    created REAL NOT NULL,
    updated REAL NOT NULL,
    generation INTEGER NOT NULL DEFAULT 0,
    budget INTEGER NOT NULL DEFAULT 0,
    n_chunks INTEGER NOT NULL DEFAULT 0,
    wlen INTEGER NOT NULL DEFAULT 0,
    glen INTEGER NOT NULL DEFAULT 0,
    last_indexed REAL
);
CREATE TABLE IF NOT EXISTS docs_sources (
    id INTEGER PRIMARY KEY,
    collection_id INTEGER NOT NULL REFERENCES docs_collections(id) ON DELETE CASCADE,
    path TEXT NOT NULL,
    watch INTEGER NOT NULL DEFAULT 0,
    added REAL NOT NULL,
    UNIQUE (collection_id, path)
);
CREATE TABLE IF NOT EXISTS docs_files (
    id INTEGER PRIMARY KEY,
    collection_id INTEGER NOT NULL REFERENCES docs_collections(id) ON DELETE CASCADE,
    path TEXT NOT NULL,
    name TEXT NOT NULL,
    kind TEXT NOT NULL DEFAULT '',
    pages INTEGER NOT NULL DEFAULT 0,
    chunks INTEGER NOT NULL DEFAULT 0,
    chars INTEGER NOT NULL DEFAULT 0,
    size INTEGER NOT NULL DEFAULT 0,
    mtime_ns INTEGER NOT NULL DEFAULT 0,
    sha256 TEXT NOT NULL DEFAULT '',
    added REAL NOT NULL,
    status TEXT NOT NULL DEFAULT 'indexed',
    reason TEXT NOT NULL DEFAULT '',
    UNIQUE (collection_id, path)
);
CREATE TABLE IF NOT EXISTS docs_pages (
    file_id INTEGER NOT NULL REFERENCES docs_files(id) ON DELETE CASCADE,
    idx INTEGER NOT NULL,
    number INTEGER,
    text TEXT NOT NULL,
    PRIMARY KEY (file_id, idx)
);
CREATE TABLE IF NOT EXISTS docs_chunks (
    id INTEGER PRIMARY KEY,
    file_id INTEGER NOT NULL REFERENCES docs_files(id) ON DELETE CASCADE,
    collection_id INTEGER NOT NULL,
    seq INTEGER NOT NULL,
    page INTEGER,
    heading TEXT NOT NULL,
    start INTEGER NOT NULL,
    "end" INTEGER NOT NULL,
    text TEXT NOT NULL,
    wlen INTEGER NOT NULL,
    glen INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS docs_chunks_by_file ON docs_chunks(file_id, seq);
CREATE INDEX IF NOT EXISTS docs_chunks_by_collection ON docs_chunks(collection_id, file_id, seq);
CREATE TABLE IF NOT EXISTS docs_df (
    collection_id INTEGER NOT NULL,
    signal INTEGER NOT NULL,
    term TEXT NOT NULL,
    df INTEGER NOT NULL,
    PRIMARY KEY (collection_id, signal, term)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS docs_gramvocab (
    collection_id INTEGER NOT NULL,
    gram TEXT NOT NULL,
    term TEXT NOT NULL,
    PRIMARY KEY (collection_id, gram, term)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS docs_attached (
    conversation_id INTEGER NOT NULL,
    collection_id INTEGER NOT NULL REFERENCES docs_collections(id) ON DELETE CASCADE,
    PRIMARY KEY (conversation_id, collection_id)
) WITHOUT ROWID;
"""
#: docs_attached: the collections a chat searches besides its own attached files (``conversation:<id>``):
#: a collection is not owned by any chat and may be attached to many (GPT4All's LocalDocs). Added after
#: the first release of this layout: ``CREATE TABLE IF NOT EXISTS`` adds it to an older database on open.

#: docs_gramvocab: per collection, each 4-gram of each spelt word (stem, no digit) in its docs_df, written when the
#: word first enters the collection (a few per file once the vocabulary has grown, where a
#: per-passage 4-gram index took every passage's 4-grams: about 40 % of the writer's CPU). A word
#: whose passages were all removed keeps its rows; searches join docs_df, which no longer has it.

#: docs_df: per collection and signal (0 words, 1 4-grams) the number of passages holding each
#: term, kept with the rows on every add and remove, so a search reads its BM25 statistics
#: instead of counting each term's postings (O(passages) per term in FTS5)
SIGNALS = (0, 1)

#: contentless (the text is in docs_chunks). The word table keeps term frequencies (FTS5's
#: ranking chooses the candidates, and without them it ranks by length alone: recall@3 of the
#: test questions in a 10 MB archive fell from 0.90 to 0.31). The rerank in app/documents/index.py
#: is the exact BM25.
_FTS = ("CREATE VIRTUAL TABLE IF NOT EXISTS {t} USING fts5(terms, content='', contentless_delete=1, "
        "tokenize=\"ascii tokenchars '#.,:/''_'\")")


def fts_tables(cid: int) -> tuple[str, str]:
    """A collection's FTS5 word table, and the per-passage 4-gram table of the layout before
    docs_gramvocab (dropped when the store opens; no collection has one after that)."""
    return f"docs_fts_w_{int(cid)}", f"docs_fts_g_{int(cid)}"


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


@dataclass
class AddProgress:
    done: int             #: files finished
    total: int
    path: Path            #: the file being read now (or just finished)
    stage: str            #: "reading", "indexed", "unchanged", "failed", "removed", "done"
    message: str = ""
    bytes_done: int = 0
    bytes_total: int = 0
    chunks: int = 0       #: passages stored so far
    seconds: float = 0.0
    eta_s: float | None = None

    def summary(self) -> str:
        """"120/4,000 files · 35/900 MB · 8,211 passages · about 2 min left"."""
        mb = f"{self.bytes_done / 1e6:,.0f}/{self.bytes_total / 1e6:,.0f} MB"
        eta = ""
        if self.eta_s is not None and self.stage != "done":
            eta = f" · about {self.eta_s:.0f} s left" if self.eta_s < 90 else f" · about {self.eta_s / 60:.0f} min left"
        return f"{self.done:,}/{self.total:,} files · {mb} · {self.chunks:,} passages{eta}"


@dataclass
class AddReport:
    added: list[Path] = field(default_factory=list)
    unchanged: list[Path] = field(default_factory=list)
    failed: list[tuple[Path, str]] = field(default_factory=list)
    removed: list[Path] = field(default_factory=list)
    chunks: int = 0
    bytes: int = 0
    seconds: float = 0.0
    cancelled: bool = False
    store_seconds: float = 0.0    #: of ``seconds``, storing (inserts, index upkeep, commits)
    wait_seconds: float = 0.0     #: of ``seconds``, waiting for the workers' next file

    def as_dict(self) -> dict:
        return {"added": [str(p) for p in self.added], "unchanged": [str(p) for p in self.unchanged],
                "failed": [{"path": display_name(p), "name": display_name(p.name), "error": why}
                           for p, why in self.failed],
                "removed": [str(p) for p in self.removed], "chunks": self.chunks, "bytes": self.bytes,
                "seconds": round(self.seconds, 3), "cancelled": self.cancelled,
                "store_seconds": round(self.store_seconds, 3), "wait_seconds": round(self.wait_seconds, 3)}


class DocumentStore:
    """Use from one thread; :meth:`clone` opens another connection for a worker thread."""

    def __init__(self, path: str | Path | None = None, keys: KeyProvider | None = None, *,
                 _opened: tuple[bytes, bytes] | None = None, _gate: Gate | None = None):
        self.path = Path(path) if path is not None else database.default_path()
        if _opened is None:
            if keys is None:
                raise ValueError("a key provider is required: documents are never stored in plaintext")
            from app.store.history import HistoryStore

            history = HistoryStore(self.path, keys)      # creates / migrates, refuses a wrong key
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
            _count_df(db, cid)
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
            _build_gram_vocab(db, cid)

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
            _write_df(db, cid, counts, -1)
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
        from app.documents.indexer import add_paths

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


def df_counts(terms: Iterable[tuple[str, int, str, int]]) -> tuple[dict[str, int], dict[str, int]]:
    """How many of these passages (their terms_for) hold each word and each 4-gram. A worker
    process computes this per group of files (app/documents/indexer.py), so the writer merges one
    count per distinct term of a group instead of counting every posting (which was a third of the
    writer's time at 100 MB)."""
    w: Counter = Counter()
    g: Counter = Counter()
    for t in terms:
        w.update(set(t[0].split()))        # the FTS5 tokenizer splits the stored terms on spaces alone
        g.update(set(t[2].split()))
    return dict(w), dict(g)


def _write_df(db, cid: int, counts: tuple[dict, dict], sign: int) -> None:
    """Add (sign +1) or take away (-1) document frequencies to / from the collection's docs_df
    (in key order: the b-tree's pages are then visited once each, in order); words new to the
    collection get their 4-grams in docs_gramvocab."""
    for signal, df in zip(SIGNALS, counts):
        items = sorted(df.items())
        if sign > 0 and signal == 0:
            _add_gram_vocab(db, cid, _new_words(db, cid, [term for term, _ in items]))
        if sign > 0:
            db.executemany("INSERT INTO docs_df(collection_id, signal, term, df) VALUES (?, ?, ?, ?) "
                           "ON CONFLICT DO UPDATE SET df = df + excluded.df",
                           [(cid, signal, term, n) for term, n in items])
        else:
            db.executemany("UPDATE docs_df SET df = df - ? WHERE collection_id = ? AND signal = ? AND term = ?",
                           [(n, cid, signal, term) for term, n in items])
            db.executemany("DELETE FROM docs_df WHERE collection_id = ? AND signal = ? AND term = ? AND df <= 0",
                           [(cid, signal, term) for term, _ in items])


def _new_words(db, cid: int, words: Sequence[str]) -> list[str]:
    """Those of ``words`` (sorted) that the collection's docs_df does not hold yet, and that are
    spelt (no digit: amounts, dates and numbers are most of a growing archive's new words, and
    nobody misspells 10.92 into a neighbour worth finding by its 4-grams)."""
    words = [w for w in words if not _HAS_DIGIT.search(w)]
    held: set[str] = set()
    for i in range(0, len(words), 500):
        part = words[i:i + 500]
        held.update(r[0] for r in db.execute(
            f"SELECT term FROM docs_df WHERE collection_id = ? AND signal = 0 AND term IN ({','.join('?' * len(part))})",
            (cid, *part)))
    return [w for w in words if w not in held]


_HAS_DIGIT = re.compile(r"\d")


def _add_gram_vocab(db, cid: int, words: Sequence[str]) -> None:
    for i in range(0, len(words), 5_000):       # bounded memory: a first large add brings every word
        db.executemany("INSERT OR IGNORE INTO docs_gramvocab(collection_id, gram, term) VALUES (?, ?, ?)",
                       sorted({(cid, g, w) for w in words[i:i + 5_000] for g in word_grams(w)}))


def _build_gram_vocab(db, cid: int) -> None:
    """Once, for a collection indexed with a per-passage 4-gram FTS5 table: the vocabulary's 4-grams
    from its docs_df, and the old table dropped (in one transaction: an interrupted run is redone)."""
    with db:
        db.execute("DELETE FROM docs_gramvocab WHERE collection_id = ?", (cid,))
        rows = db.execute("SELECT term FROM docs_df WHERE collection_id = ? AND signal = 0", (cid,))
        while part := rows.fetchmany(20_000):
            _add_gram_vocab(db, cid, [r[0] for r in part if not _HAS_DIGIT.search(r[0])])
        db.execute(f"DROP TABLE IF EXISTS {fts_tables(cid)[1]}")
        db.execute("UPDATE docs_collections SET gram_vocab_ready = 1 WHERE id = ?", (cid,))


def _update_df(db, cid: int, terms: Sequence[tuple[str, int, str, int]], sign: int) -> None:
    _write_df(db, cid, df_counts(terms), sign)


def _merge(into: dict[str, int], counts: dict[str, int]) -> dict[str, int]:
    if not into:
        return dict(counts)
    get = into.get
    for term, n in counts.items():
        into[term] = get(term, 0) + n
    return into


class IndexBatch:
    """The index upkeep of several files stored in one transaction, written once by :meth:`flush`
    (document frequencies and champion lists: one upsert per term per batch instead of per file)."""

    def __init__(self, cid: int):
        self.cid = cid
        self.df: tuple[dict[str, int], dict[str, int]] = ({}, {})
        self.passages: list[tuple[int, str]] = []     #: (passage id, its word terms)

    def add(self, ids: Iterable[int], terms: Sequence[tuple[str, int, str, int]],
            counts: tuple[dict[str, int], dict[str, int]] | None = None) -> None:
        """Passages stored in this batch; ``counts``: their df_counts, if the caller has them."""
        self.add_counts(df_counts(terms) if counts is None else counts)
        self.passages.extend((i, t[0]) for i, t in zip(ids, terms))

    def add_counts(self, counts: tuple[dict[str, int], dict[str, int]]) -> None:
        """Document frequencies of passages stored (or about to be stored) in this batch."""
        self.df = (_merge(self.df[0], counts[0]), _merge(self.df[1], counts[1]))

    def flush(self, db) -> None:
        """Write what is pending (inside the caller's transaction, before its commit)."""
        if self.df[0] or self.df[1]:
            _write_df(db, self.cid, self.df, +1)
        if self.passages:
            champions.added(db, self.cid, self.passages)
        self.df = ({}, {})
        self.passages = []


def _count_df(db, cid: int) -> None:
    """Fill docs_df of a collection indexed before it existed, once, from its passages."""
    with db:
        db.execute("DELETE FROM docs_df WHERE collection_id = ?", (cid,))
        rows = db.execute("SELECT heading, text FROM docs_chunks WHERE collection_id = ?", (cid,))
        while batch := rows.fetchmany(2000):
            _update_df(db, cid, [terms_for(h, t) for h, t in batch], +1)
        db.execute("UPDATE docs_collections SET df_ready = 1 WHERE id = ?", (cid,))


def forget_states() -> int:
    """Delete every saved prefix state: they hold (as attention caches) the passages they were
    read from, so a removed or changed file must not live on in one. They are a cache: the next
    question reads its passages again. Returns how many were deleted."""
    from app.documents.states import INDEX_NAME, states_dir

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
