"""Adding documents at scale, and keeping watched folders in sync. No Qt here.

* Files are read, chunked and turned into index terms in worker processes
  (one per core; CPU-bound Python, so processes rather than threads), while
  the calling thread stores each finished file in one transaction. At most
  two files per worker are in flight, so memory is bounded by the largest
  files being read, not by the size of the corpus.
* Progress: files, bytes and passages done, and the time left (from the
  bytes read so far), through :class:`app.documents.store.AddProgress`.
* Cancel stops between files; whatever was stored stays. Every file is one
  transaction, so a crash or ``kill -9`` leaves whole files or nothing of a
  file, and adding the same folders again (``DocumentStore.rescan``)
  resumes: a file whose size and modification time are unchanged is not
  read again.
* A folder that was added is a *source*: adding it again also removes the
  files that are no longer in it. Watched sources are checked when Ferry
  opens and then every few seconds by :class:`FolderWatcher` (polling: one
  ``stat`` per file; measured in docs/bench-log/2026-12-03.md), which picks up new,
  changed and deleted files.
"""
from __future__ import annotations

import hashlib
import multiprocessing
import os
import threading
import time
from collections import deque
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Iterable

from app.documents.chunk import chunk_document
from app.documents.extract import MAX_FILE_BYTES, ExtractError, extract
from app.documents.terms import terms_for
from app.documents.walk import display_name, expand, read_document_bytes
from app.documents.upkeep import IndexBatch, df_counts

if TYPE_CHECKING:   # the store calls the indexer (DocumentStore.add), not the other way round
    from app.documents.store import DocumentStore


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



NO_COUNTS: tuple[dict, dict] = ({}, {})

#: below this much to read, files are read in the calling thread (no process start-up)
INLINE_BYTES = 4 * 2**20
INLINE_FILES = 8
#: finished files are stored together in one transaction until they hold this much text or this
#: long has passed since the transaction began, and at least 10x as long as the last commit took
#: (each commit writes new FTS5 segments that are merged later, and syncs; one transaction per
#: file made storing the bottleneck, and so did 1 s batches on a large index: docs/bench-log/2026-12-03.md)
BATCH_BYTES = 16 * 2**20
BATCH_SECONDS = 1.0
BATCH_COMMIT_SHARE = 10
#: files go to a worker in groups of up to this many bytes or files: the worker counts the group's
#: document frequencies (passages holding each word and 4-gram) once, so the writer merges one count
#: per distinct term of a group rather than one per term of each passage (a third of the writer's
#: time before) or of each file (most 4-grams of a file are distinct to it)
GROUP_BYTES = 1 * 2**20
GROUP_FILES = 32


def walk(paths: Iterable[str | Path]) -> tuple[list[Path], list[tuple[Path, str]]]:
    """The files to read under ``paths`` (absolute, symbolic links resolved) and the ones skipped
    with why. The one call site of the file walker."""
    files, skipped = expand([Path(p).expanduser().resolve() for p in paths])
    # folders are walked from their resolved path without following links, so only a linked file
    # needs resolving (a resolve per file costs a syscall per path component)
    return [f.resolve() if f.is_symlink() else f for f in files], skipped


def prepare(path: str, known: tuple | None) -> dict:
    """Read one file into what the store keeps (runs in a worker process).
    ``known``: (file id, size, mtime_ns, sha256, status) of the stored version, if any."""
    try:
        st = os.stat(path)
        size, mtime_ns = st.st_size, st.st_mtime_ns
        if known is not None and known[4] == "indexed" and (known[1], known[2]) == (size, mtime_ns):
            return {"state": "unchanged", "size": size}
        if size > MAX_FILE_BYTES:
            raise ExtractError(f"the file is larger than {MAX_FILE_BYTES // 2**20} MiB")
        data = read_document_bytes(path, MAX_FILE_BYTES)   # never blocks on a FIFO swapped in after the walk
    except OSError as exc:
        return {"state": "failed", "size": 0, "mtime_ns": 0, "reason": f"cannot be read ({exc.strerror or exc})"}
    except ExtractError as exc:
        return {"state": "failed", "size": size, "mtime_ns": mtime_ns, "reason": str(exc)}
    digest = hashlib.sha256(data).hexdigest()
    if known is not None and known[4] == "indexed" and known[3] == digest:
        return {"state": "touched", "size": size, "mtime_ns": mtime_ns}
    try:
        doc = extract(path, data)
        chunks = chunk_document(doc)
        if not chunks:
            raise ExtractError("the file has no text to index")
    except ExtractError as exc:
        return {"state": "failed", "size": size, "mtime_ns": mtime_ns, "reason": str(exc)}
    except Exception as exc:  # a parser's own failure on a damaged file
        return {"state": "failed", "size": size, "mtime_ns": mtime_ns,
                "reason": f"cannot be read ({type(exc).__name__}: {exc})"}
    del data
    p = Path(path)
    terms = [terms_for(c.heading, c.text) for c in chunks]
    return {"state": "indexed", "size": size,
            "info": {"path": path, "name": p.name, "kind": doc.kind, "chars": doc.chars, "size": size,
                     "mtime_ns": mtime_ns, "sha256": digest},
            "pages": [(pg.number, pg.text) for pg in doc.pages],
            "chunks": [(c.seq, c.page, c.heading, c.start, c.end, c.text) for c in chunks],
            "terms": terms}


def prepare_group(items: list[tuple[str, tuple | None]]) -> tuple[list[dict], tuple[dict, dict]]:
    """:func:`prepare` for several files (in a worker process), and how many of their passages
    hold each word and each 4-gram."""
    results = [prepare(path, known) for path, known in items]
    return results, df_counts(t for r in results if r["state"] == "indexed" for t in r["terms"])


class _Inline:
    """The executor's interface, run in the calling thread (small adds)."""

    def submit(self, fn, *args) -> Future:
        fut: Future = Future()
        fut.set_result(fn(*args))
        return fut

    def shutdown(self, wait: bool = True, cancel_futures: bool = False) -> None:
        pass


def default_workers() -> int:
    return max(1, os.cpu_count() or 1)


def add_paths(store: DocumentStore, name: str, paths: Iterable[str | Path], *,
              progress: Callable[[AddProgress], None] | None = None, cancelled: Callable[[], bool] | None = None,
              workers: int | None = None, watch: bool | None = None) -> AddReport:
    t0 = time.monotonic()
    paths = [Path(p).expanduser() for p in paths]
    coll = store.collection(name, create=True)
    db = store.db
    for p in paths:
        if p.exists():
            store.add_source(name, p, watch=watch)
    files, skipped = walk(paths)
    report = AddReport(failed=list(skipped))
    emit = progress or (lambda p: None)
    known = store.known(coll.id)
    # files gone from an added folder (or an added file that is gone) are removed
    present = {str(f) for f in files} | {display_name(p.resolve()) for p, _ in skipped}
    roots = [str(p.resolve()) for p in paths if p.is_dir() or not p.exists()]
    gone = [path for path in known if path not in present
            and any(path == r or path.startswith(r.rstrip(os.sep) + os.sep) for r in roots)]
    if gone:
        with db:
            for path in gone:
                store.delete_file_rows(coll.id, known[path][0])
        report.removed = [Path(p) for p in gone]
    for path in gone:
        emit(AddProgress(0, len(files), Path(path), "removed"))
    with db:
        for p, why in skipped:
            if p.exists():
                store.mark_skipped(coll.id, str(p.resolve()), why)
    for p, why in skipped:
        emit(AddProgress(0, len(files), p, "failed", why))

    sizes = []
    for f in files:
        try:
            sizes.append(f.stat().st_size)
        except OSError:
            sizes.append(0)
    state = AddProgress(0, len(files), Path(), "reading", bytes_total=sum(sizes))
    to_read = sum(s for f, s in zip(files, sizes)
                  if not (known.get(str(f)) and known[str(f)][1] == s and known[str(f)][4] == "indexed"))
    n_workers = default_workers() if workers is None else workers
    inline = n_workers <= 1 or to_read < INLINE_BYTES or len(files) < INLINE_FILES
    pool = _Inline() if inline else ProcessPoolExecutor(
        n_workers, mp_context=multiprocessing.get_context("spawn"))
    window = 1 if inline else 2 * n_workers
    read_done = 0       # bytes of the files read (not skipped as unchanged) and stored
    pending: deque[tuple[list[tuple[Path, int]], Future]] = deque()    # groups of (file, size)
    todo = iter(zip(files, sizes))
    group_bytes, group_files = (GROUP_BYTES, GROUP_FILES) if not inline else (0, 1)

    def submit(group: list[tuple[Path, int]]) -> Future:
        return pool.submit(prepare_group, [(str(f), known.get(str(f))) for f, _ in group])

    def stage(f: Path, what: str, message: str = "") -> None:
        state.path, state.stage, state.message = f, what, message
        state.seconds = time.monotonic() - t0
        # the time left from the bytes actually read, against those still to read: a resumed add
        # skips its stored files in seconds, and counting their bytes promised minutes for an hour
        left = to_read - read_done
        state.eta_s = state.seconds * left / read_done if read_done and left > 0 else None
        emit(AddProgress(**vars(state)))

    batch = IndexBatch(coll.id)
    # a larger page cache for the writer (bounded: 64 MiB): FTS5 merges and the champion lists
    # re-read their pages, and every page read from the file is decrypted and authenticated
    db.execute("PRAGMA cache_size = -65536")
    stored: list[tuple[Path, int, str, str]] = []    # in the open transaction: (file, size, stage, message)
    batch_bytes, batch_t0, batch_s = 0, time.monotonic(), BATCH_SECONDS

    def commit() -> None:
        # progress says "indexed" only for what is committed: a crash after it loses none of it
        nonlocal batch_bytes, batch_t0, batch_s, read_done
        t = time.monotonic()
        if db.in_transaction:
            batch.flush(db)
            db.commit()
        took = time.monotonic() - t
        report.store_seconds += took
        batch_s = max(BATCH_SECONDS, BATCH_COMMIT_SHARE * took)
        for f, size, what, message in stored:
            state.done += 1
            state.bytes_done += size
            read_done += size if what != "unchanged" else 0
            state.chunks = report.chunks
            stage(f, what, message)
        stored.clear()
        batch_bytes, batch_t0 = 0, time.monotonic()

    try:
        nxt = next(todo, None)
        while True:
            while len(pending) < window and nxt is not None:
                if cancelled is not None and cancelled():
                    break
                group, gbytes = [], 0
                while nxt is not None and (not group or (len(group) < group_files and gbytes + nxt[1] <= group_bytes)):
                    group.append(nxt)
                    gbytes += nxt[1]
                    stage(nxt[0], "reading")
                    nxt = next(todo, None)
                pending.append((group, submit(group)))
            if not pending:
                break
            if cancelled is not None and cancelled():
                report.cancelled = True
                break
            group, fut = pending.popleft()
            t = time.monotonic()
            try:
                results, counts = fut.result()
            except BrokenProcessPool:
                # a worker died (out of memory, killed, or a host that cannot start processes):
                # the rest is read here, one file at a time
                pool.shutdown(wait=False, cancel_futures=True)
                pool, window = _Inline(), 1
                pending = deque((g, submit(g)) for g, _ in pending)
                results, counts = prepare_group([(str(f), known.get(str(f))) for f, _ in group])
            report.wait_seconds += time.monotonic() - t
            t = time.monotonic()
            try:
                batch.add_counts(counts)
                for (f, size), result in zip(group, results):
                    _store(store, coll.id, f, result, report, batch)
                    what = {"indexed": "indexed", "failed": "failed"}.get(result["state"], "unchanged")
                    n = len(result.get("chunks", ()))
                    stored.append((f, size, what,
                                   result.get("reason", f"{n} passages" if what == "indexed" else "")))
                    batch_bytes += size if what == "indexed" else 0
            except BaseException:
                db.rollback()
                raise
            report.store_seconds += time.monotonic() - t
            if batch_bytes >= BATCH_BYTES or time.monotonic() - batch_t0 >= batch_s:
                commit()
        commit()
        if cancelled is not None and cancelled() and (pending or nxt is not None):
            report.cancelled = True
    finally:
        if db.in_transaction:       # an error above: the files of the open batch are read again next time
            db.rollback()
        pool.shutdown(wait=True, cancel_futures=True)
    report.seconds = time.monotonic() - t0
    state.done = state.done if report.cancelled else len(files)
    stage(Path(), "done")
    return report


def _store(store: DocumentStore, cid: int, f: Path, result: dict, report: AddReport, batch: IndexBatch) -> None:
    """Store one prepared file in the open transaction (the caller commits the batch)."""
    db = store.db
    what = result["state"]
    if what == "unchanged":
        report.unchanged.append(f)
    elif what == "touched":
        db.execute("UPDATE docs_files SET mtime_ns = ? WHERE collection_id = ? AND path = ?",
                   (result["mtime_ns"], cid, str(f)))
        report.unchanged.append(f)
    elif what == "failed":
        store.mark_skipped(cid, str(f), result["reason"], result["size"], result["mtime_ns"], batch)
        report.failed.append((f, result["reason"]))
    else:
        store.insert_file(cid, result["info"], result["pages"], result["chunks"], result["terms"], batch,
                          NO_COUNTS)     # the group's counts are in the batch already
        report.added.append(f)
        report.chunks += len(result["chunks"])
        report.bytes += result["size"]


def _changed(store: DocumentStore, name: str, root: Path) -> bool:
    """Whether a source differs from what is stored (one stat per file)."""
    known = store.known(store.collection(name).id)
    files, _ = walk([root])
    seen = set()
    for f in files:
        seen.add(str(f))
        k = known.get(str(f))
        try:
            st = f.stat()
        except OSError:
            continue
        if k is None or (k[1], k[2]) != (st.st_size, st.st_mtime_ns):
            return True
    r = str(root.resolve())
    return any(p not in seen and (p == r or p.startswith(r.rstrip(os.sep) + os.sep))
               and known[p][4] == "indexed" for p in known)


def sync_watched(store: DocumentStore, *, progress: Callable[[str, AddProgress], None] | None = None,
                 cancelled: Callable[[], bool] | None = None) -> dict[str, AddReport]:
    """Bring every watched source up to date (on open, and from :class:`FolderWatcher`)."""
    reports = {}
    for name, source in store.watched():
        if cancelled is not None and cancelled():
            break
        root = Path(source.path)
        if _changed(store, name, root):
            emit = (lambda p, n=name: progress(n, p)) if progress else None
            reports[f"{name}:{source.path}"] = store.add(name, [root], progress=emit, cancelled=cancelled)
    return reports


class FolderWatcher:
    """Polls the watched sources every ``interval`` seconds in a thread of its own
    (with its own connection); ``on_change(reports)`` is called after a change was stored."""

    def __init__(self, store: DocumentStore, interval: float = 5.0,
                 on_change: Callable[[dict[str, AddReport]], None] | None = None):
        self._store, self.interval, self.on_change = store, interval, on_change
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.error: str | None = None

    def start(self) -> "FolderWatcher":
        self._thread = threading.Thread(target=self._run, name="ferry-folder-watch", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        store = self._store.clone()
        try:
            while not self._stop.is_set():
                t0 = time.monotonic()
                try:
                    reports = sync_watched(store, cancelled=self._stop.is_set)
                except Exception as exc:  # keep watching; say why once
                    self.error = str(exc)
                    reports = {}
                if reports and self.on_change is not None:
                    self.on_change(reports)
                # a large watched archive is polled less often: at most 5% of a core
                self._stop.wait(max(self.interval, 20 * (time.monotonic() - t0)) if not reports else self.interval)
        finally:
            store.close()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
