"""The first search on a database that is not in the OS page cache (after a
reboot, or after a model's files went through the cache): reading ahead, in the
background, the parts of the encrypted database every search needs.

A cold search reads its pages one at a time, each a random read somewhere in a
file of gigabytes (measured at 1 GB of text: a multi-word question read up to
3,400 pages; most of them were FTS5's ``%_docsize`` rows, one per passage its
``bm25()`` ranks, and its segment index ``%_idx``, then the doclists of common
words). :class:`Warmer` reads those parts once, at open, on its own thread and
connection, so they are in the OS page cache when the user asks:

1. for every collection (most recently updated first): each FTS5 table's
   structure and configuration records and its segment index ``%_idx``, and the
   word table's ``%_docsize`` (the passages' lengths ``bm25()`` reads);
2. then the doclists of each collection's common words (those with champion
   lists), most common first: a ranked intersection of common words reads
   their doclists whole (``bm25()`` counts the passages holding each), and the
   most common words are the likeliest in a question;
3. then the champion lists themselves (``docs_champ``: a question reads one
   row per common word, so they come last).

It is **bounded** (:data:`WARM_BUDGET` bytes, counted as the stored values it
read, doclists estimated at :data:`POSTING_BYTES` a posting; a step is begun
only while the count is under the budget and a doclist only when its estimate
fits what is left), **cancellable** (:meth:`Warmer.cancel`, which
:meth:`DocumentStore.close` calls, stops it between two small steps and joins
it), **low priority** (the thread lowers its own CPU priority where the OS
allows it, which on Linux lowers its I/O priority too) and it **yields to
searches**: while a search runs (:meth:`Gate.busy`), it does not begin a step.
It never changes what a search finds: it only reads, through a connection of
its own, and the pages it reads stay as encrypted as they are on disk (what it
decrypts stays in its connection's page cache, in memory).
"""
from __future__ import annotations

import contextlib
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Iterator

from app.documents import champions

#: at most this many bytes are read ahead, over every collection (the 1 GB archive's step 1 is ~30 MB)
WARM_BUDGET = 128 << 20
#: estimated bytes of one posting of the word index (a rowid delta and positions; measured at 1 GB of
#: text: 327 MB of %_data blocks for 92 M postings)
POSTING_BYTES = 3.6
#: bytes a step of a scan reads, about (a step is what a cancel or a search waits for at most, and
#: how far past the budget the last step may end); its rows are sized from the rows read so far
STEP_BYTES = 256 << 10
#: per-row overhead counted beside the values a scan reads (rowid, record header)
ROW_BYTES = 8


class Gate:
    """Counts the searches running, so the warm-up can wait for none to run before each step."""

    def __init__(self):
        self._cond = threading.Condition()
        self._busy = 0

    @contextlib.contextmanager
    def busy(self) -> Iterator[None]:
        with self._cond:
            self._busy += 1
        try:
            yield
        finally:
            with self._cond:
                self._busy -= 1
                self._cond.notify_all()

    def wait_idle(self, cancelled: threading.Event) -> None:
        with self._cond:
            while self._busy and not cancelled.is_set():
                self._cond.wait(0.05)

    def wake(self) -> None:
        with self._cond:
            self._cond.notify_all()


@dataclass
class WarmStats:
    bytes: int = 0              #: stored bytes read (doclists: estimated)
    steps: int = 0
    doclists: int = 0           #: common words whose doclists were read
    seconds: float = 0.0
    finished: bool = False      #: every step done, or the budget reached
    cancelled: bool = False
    error: str = ""             #: why it stopped early (the database closed under it...); never raised
    parts: dict[str, int] = field(default_factory=dict)     #: bytes per part ("docsize", "idx", ...)

    def as_dict(self) -> dict:
        return {"bytes": self.bytes, "mb": round(self.bytes / 1e6, 1), "steps": self.steps,
                "doclists": self.doclists, "seconds": round(self.seconds, 3), "finished": self.finished,
                "cancelled": self.cancelled, "error": self.error,
                "parts_mb": {k: round(v / 1e6, 2) for k, v in self.parts.items()}}


class Warmer:
    """The background read-ahead of one database; ``connect()`` opens its own connection (in the thread)."""

    def __init__(self, connect: Callable[[], object], gate: Gate | None = None, *, budget: int = WARM_BUDGET):
        self._connect = connect
        self.gate = gate or Gate()
        self.budget = int(budget)
        self.stats = WarmStats()
        self._cancel = threading.Event()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ferry-docs-warm", daemon=True)

    def start(self) -> "Warmer":
        self._thread.start()
        return self

    def cancel(self, timeout: float | None = 30.0) -> None:
        """Stop between two steps and wait for the thread to end."""
        self._cancel.set()
        self.gate.wake()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def wait(self, timeout: float | None = None) -> bool:
        """True once it has stopped (finished, cancelled or failed)."""
        return self._done.wait(timeout)

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    # ---- the thread

    def _run(self) -> None:
        t0 = time.perf_counter()
        _lower_priority()
        db = None
        try:
            db = self._connect()
            db.execute("PRAGMA cache_size = -2048")     # the OS cache is the target, not this connection's
            self.stats.finished = self._warm(db)
        except Exception as exc:            # a closed or removed database: stop, the searches do not need this
            self.stats.error = f"{type(exc).__name__}: {exc}"
        finally:
            if db is not None:
                db.close()
            self.stats.cancelled = self._cancel.is_set()
            self.stats.seconds = time.perf_counter() - t0
            self._done.set()

    def _room(self) -> bool:
        """Whether another step may begin (waits while a search runs)."""
        self.gate.wait_idle(self._cancel)
        return not self._cancel.is_set() and self.stats.bytes < self.budget

    def _count(self, part: str, nbytes: int) -> None:
        self.stats.bytes += nbytes
        self.stats.steps += 1
        self.stats.parts[part] = self.stats.parts.get(part, 0) + nbytes

    def _warm(self, db) -> bool:
        """True when every step was done or the budget reached, False when cancelled."""
        cids = [r[0] for r in db.execute("SELECT id FROM docs_collections ORDER BY updated DESC")]
        # what every search of every collection reads, then what questions of common words read
        for steps in (self._collection_index, self._common_words, self._champions):
            for cid in cids:
                for ok in steps(db, cid):
                    if not ok:
                        return not self._cancel.is_set()
        return True

    def _scan(self, db, part: str, table: str, key: str, size: str, where: str = "", first=-1) -> Iterator[bool]:
        """``table`` read in ``key`` order (a unique key), about STEP_BYTES a step, each step one
        aggregate query (SQLite does the reading with the GIL released, so a search thread is not held
        up by Python work here); ``size`` is an SQL expression of a row's stored bytes."""
        last, limit = first, 1
        cond = f"{where} AND " if where else ""
        sql = (f"SELECT count(*), total({ROW_BYTES} + {size}), max(k) FROM (SELECT {key} AS k, * FROM {table} "
               f"WHERE {cond}{key} > ? ORDER BY {key} LIMIT ?)")
        while True:
            if not self._room():
                yield False
                return
            rows, nbytes, top = db.execute(sql, (last, limit)).fetchone()
            self._count(part, int(nbytes))
            yield True
            if rows < limit:
                return
            last = top
            limit = max(1, min(100_000, STEP_BYTES * rows // max(1, int(nbytes))))

    def _collection_index(self, db, cid: int) -> Iterator[bool]:
        from app.documents.schema import fts_tables

        for table in fts_tables(cid):
            if not _exists(db, f"{table}_data"):
                continue
            if not self._room():
                yield False
                return
            # the averages (id 1) and structure (id 10) records, and the configuration, read by every query
            blocks = db.execute(f"SELECT block FROM {table}_data WHERE id IN (1, 10)").fetchall()
            config = db.execute(f"SELECT k, v FROM {table}_config").fetchall()
            self._count("structure", sum(len(b[0] or b"") for b in blocks) + ROW_BYTES * (len(blocks) + len(config)))
            yield True
            # the segment index (for each term a query looks up, one probe per segment), a segment a step
            segid = -1
            while True:
                if not self._room():
                    yield False
                    return
                segid, = db.execute(f"SELECT min(segid) FROM {table}_idx WHERE segid > ?", (segid,)).fetchone()
                if segid is None:
                    break
                nbytes, = db.execute(f"SELECT total({ROW_BYTES} + 8 + length(term)) FROM {table}_idx WHERE segid = ?",
                                     (segid,)).fetchone()
                self._count("idx", int(nbytes))
                yield True
        words = fts_tables(cid)[0]
        if _exists(db, f"{words}_docsize"):
            # the passages' lengths: bm25() reads one row for every passage it ranks
            yield from self._scan(db, "docsize", f"{words}_docsize", "id", "length(sz)")

    def _common_words(self, db, cid: int) -> Iterator[bool]:
        from app.documents.schema import fts_tables

        if not self._room():
            yield False
            return
        terms = [r[0] for r in db.execute("SELECT term FROM docs_champ WHERE collection_id = ?", (cid,))]
        df: dict[str, int] = {}
        for i in range(0, len(terms), 500):
            part = terms[i:i + 500]
            df.update(db.execute(f"SELECT term, df FROM docs_df WHERE collection_id = ? AND signal = 0 AND df >= ? "
                                 f"AND term IN ({','.join('?' * len(part))})", (cid, champions.CHAMPION_DF, *part)))
        self._count("common words", sum(2 * (ROW_BYTES + len(t)) for t in terms))
        yield True
        words = fts_tables(cid)[0]
        for term in sorted(df, key=lambda t: (-df[t], t)):
            if not self._room():
                yield False
                return
            cost = int(df[term] * POSTING_BYTES)
            if self.stats.bytes + cost > self.budget:
                continue            # a smaller doclist may still fit
            db.execute(f"SELECT count(*) FROM {words} WHERE {words} MATCH ?",
                       ('"' + term.replace('"', '""') + '"',)).fetchone()
            self._count("doclists", cost)
            self.stats.doclists += 1
            yield True

    def _champions(self, db, cid: int) -> Iterator[bool]:
        # (length() of a blob alone reads no overflow page: the concatenation reads the whole list)
        yield from self._scan(db, "champions", "docs_champ", "term",
                              "length(term) + length(CAST(entries || x'' AS BLOB))", f"collection_id = {int(cid)}", "")


def _exists(db, table: str) -> bool:
    return db.execute("SELECT 1 FROM sqlite_master WHERE name = ?", (table,)).fetchone() is not None


def _lower_priority() -> None:
    """This thread at the lowest CPU priority where the OS gives threads their own (Linux; there the
    I/O scheduler's priority follows it); elsewhere it runs at the normal priority."""
    native = getattr(threading, "get_native_id", None)
    if native is None or not hasattr(os, "setpriority") or not os.uname().sysname == "Linux":
        return
    with contextlib.suppress(OSError):
        os.setpriority(os.PRIO_PROCESS, native(), 19)
