"""Documents at the scale of an archive: add, open, search, recall, at 10 MB,
100 MB and (opt-in) 1 GB of generated text (bench/docs_corpus.py).

    .venv/bin/python bench/docs_scale.py --json [--sizes 10,100] [--workers N] [--keep DIR] [--pdf]
                                        [--corpus-cache ~/.cache/ferry-bench] [--model DEMO_MODEL_DIR]
    .venv/bin/python bench/docs_scale.py --json --measure KEPT_DIR/home/ferry.db
    .venv/bin/python bench/docs_scale.py --json --measure KEPT_DIR/home/ferry.db --cold [--warm-budget MB]
    .venv/bin/python bench/docs_scale.py --json --resume KEPT_DIR/home/ferry.db --sizes 1000 --corpus-cache ~/.cache/ferry-bench

For each size, in a fresh data folder with an encrypted database: the add
(MB of text per second, files, passages, peak RSS of the adding process and
of its worker processes, and the CPU seconds per MB of text of the adding
process, the writer, against its workers: which side bounds the add), database size against the text's size, the time to open the
store and the collection, search latency p50/p95 over single-word,
multi-word and phrase questions, and recall@3 / MRR of the test corpus's 58
questions with the generated corpus in the same collection. With --model,
the time to first token of ``ferry docs ask`` for a first and a later question.
Search is also run without champion lists (the reference), and the word
signal against the exhaustive ranking (every passage holding a question
word): top-5 overlaps. ``--measure`` does the measuring part alone on a kept
database (e.g. one whose add was stopped part way); ``--resume`` first goes on
with the add of that size's cached corpus into a kept database whose add was
stopped (``kill -9``), as adding the same folder again does in the app.
Each size runs in a child process so its peak RSS is its own. ``--pdf``
renders the generated documents as PDF files (as most of a real archive is),
where extraction, not the index, is most of the work; the RSS trace's
``text_mb`` then counts the files' bytes.

``--cold`` measures the first search on a database that is not in the OS page
cache (as after a reboot): before each question the database's pages are
evicted (``posix_fadvise(DONTNEED)`` on ``ferry.db`` and its ``-wal``; no root
needed; Linux), the store is opened and the question asked once, with no
warm-up, with the background warm-up started at open and the question asked at
once ("warming"), and after the warm-up finished; per question kind p50 / p95 /
max of those first searches and the bytes they read from the disk
(``/proc/self/io``), and the warm-up's time and bytes.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "tests" / "documents"))

SINGLE = ["payment", "mortgage", "boiler", "penicillin", "deposit", "invoice", "aldbelran", "pension", "tenant",
          "electricity"]
MULTI = ["what is the balance of the mortgage account", "when was the boiler serviced",
         "how much is the monthly rent", "which medication was prescribed after the hospital visit",
         "what does the insurance policy cover for water damage", "who signed the tenancy agreement",
         "when is the council tax payment due", "how long is the notice period in the contract"]
PHRASES = ['"annual leave"', '"credit card number"', '"blood pressure"', '"notice period"', '"interest rate"',
           '"signed witness"']


class RssTrace:
    """An add's progress callback that samples memory as text is stored: the adding process's RSS
    and its peak (VmRSS, VmHWM), SQLite's own allocations (sqlite3_memory_used of the sqlcipher3
    library, by ctypes), and its worker processes' RSS, at 10, 20, 50, 100 MB of text in the
    collection and every 100 MB after (``start_mb``: text already in it)."""

    def __init__(self, start_mb: float = 0.0, then: "callable | None" = None):
        import ctypes
        import glob

        import sqlcipher3

        lib = ctypes.CDLL(glob.glob(os.path.join(os.path.dirname(sqlcipher3.__file__), "_sqlite3*.so"))[0])
        lib.sqlite3_memory_used.restype = ctypes.c_int64
        self._sqlite = lib.sqlite3_memory_used
        self.start_mb, self.then = start_mb, then
        self.samples: list[dict] = []
        self._added, self._last = 0, 0
        self._marks = [m for m in (10, 20, 50, 100) if m > start_mb] + [100 * k for k in range(2, 10**4)
                                                                       if 100 * k > start_mb]

    @staticmethod
    def _status(pid: str | int = "self") -> dict[str, float]:
        out = {}
        try:
            with open(f"/proc/{pid}/status") as f:
                for line in f:
                    if line.startswith(("VmRSS:", "VmHWM:")):
                        out[line[:5]] = int(line.split()[1]) / 1024
        except OSError:
            pass
        return out

    @staticmethod
    def _children() -> list[str]:
        kids = []
        for task in Path("/proc/self/task").iterdir():
            try:
                kids += (task / "children").read_text().split()
            except OSError:
                pass
        return kids

    def sample(self) -> dict:
        me = self._status()
        row = {"text_mb": round(self.start_mb + self._added / 1e6, 1), "rss_mb": round(me.get("VmRSS", 0)),
               "peak_rss_mb": round(me.get("VmHWM", 0)), "sqlite_mb": round(self._sqlite() / 2**20, 1),
               "workers_rss_mb": sorted(round(self._status(k).get("VmRSS", 0)) for k in self._children()),
               "t": time.strftime("%H:%M:%S"), "load": round(os.getloadavg()[0], 1)}
        self.samples.append(row)
        print(json.dumps({"rss": row}), file=sys.stderr, flush=True)
        return row

    def __call__(self, p) -> None:
        if p.stage == "indexed":
            self._added += p.bytes_done - self._last
        self._last = p.bytes_done
        if self._marks and self.start_mb + self._added / 1e6 >= self._marks[0]:
            while self._marks and self.start_mb + self._added / 1e6 >= self._marks[0]:
                self._marks.pop(0)
            self.sample()
        if self.then is not None:
            self.then(p)


def _pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def run_size(megabytes: float, workers: int | None, keep: Path | None, seed: int,
             corpus_cache: Path | None = None, pdf: bool = False) -> dict:
    """One size, in this process (the parent runs it in a child)."""
    import docs_corpus
    from corpus_tools import build_corpus

    from app.documents.store import DocumentStore
    from app.store.crypto import PassphraseKeys

    work = Path(tempfile.mkdtemp(prefix="ferry-docs-scale-", dir=keep))
    corpus = work / "archive"
    t0 = time.perf_counter()
    if corpus_cache is not None:        # generated once, kept outside the repository for later runs
        corpus = corpus_cache / f"archive-{'pdf-' if pdf else ''}{megabytes:g}-{seed}"
        if not corpus.is_dir():
            tmp = corpus.with_name(corpus.name + ".tmp")
            shutil.rmtree(tmp, ignore_errors=True)
            docs_corpus.generate(tmp, megabytes, seed, pdf=pdf)
            tmp.rename(corpus)
        files = sorted(p for p in corpus.rglob("*") if p.is_file())
    else:
        files = docs_corpus.generate(corpus, megabytes, seed, pdf=pdf)
    gen_s = time.perf_counter() - t0
    text_bytes = sum(f.stat().st_size for f in files)
    db = work / "home" / "ferry.db"
    keys = PassphraseKeys("bench passphrase")
    store = DocumentStore(db, keys)
    trace = RssTrace()
    t0, cpu0 = time.perf_counter(), os.times()
    report = store.add("archive", [corpus], workers=workers, progress=trace)
    add_s, cpu1 = time.perf_counter() - t0, os.times()
    # the text itself (a PDF's file is larger than its text): what the throughput is counted in
    text_chars = sum(f.chars for f in store.files("archive"))
    trace.sample()
    print(json.dumps({"added": report.as_dict() | {"added": len(report.added), "unchanged": len(report.unchanged)},
                      "add_s": round(add_s, 1),
                      "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}),
          file=sys.stderr, flush=True)     # an early look at a long run
    test_corpus = build_corpus(work / "test-corpus")
    store.add("archive", [test_corpus], workers=1)
    coll = store.collection("archive")
    store.close()
    db_bytes = sum(p.stat().st_size for p in db.parent.iterdir() if p.name.startswith("ferry.db"))
    rss_self = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    rss_children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024

    measured = measure(db, keys, seed)
    out = {"megabytes": megabytes, "kind": "pdf" if pdf else "text", "files": len(files),
           "file_mb": round(text_bytes / 1e6, 1), "text_mb": round(text_chars / 1e6, 1),
           "generate_s": round(gen_s, 1), "add_s": round(add_s, 1),
           "add_mb_per_s": round(text_chars / 1e6 / add_s, 3), "passages": coll.chunks,
           "add_writer_s": {"storing": round(report.store_seconds, 1), "waiting_for_workers": round(report.wait_seconds, 1)},
           # CPU seconds per MB of text: the adding process (the writer: SQLite, FTS5, champion lists)
           # against its worker processes (reading, extracting, chunking, index terms)
           "add_cpu_s_per_mb": {"writer": round((cpu1.user + cpu1.system - cpu0.user - cpu0.system) / (text_chars / 1e6), 3),
                                "workers": round((cpu1.children_user + cpu1.children_system - cpu0.children_user
                                                  - cpu0.children_system) / (text_chars / 1e6), 3)},
           "failed": len(report.failed), "workers": workers or os.cpu_count(),
           "peak_rss_mb": {"adding_process": round(rss_self), "largest_worker": round(rss_children)},
           "rss_by_text": trace.samples, "db_mb": round(db_bytes / 1e6, 1), "db_over_text": round(db_bytes / (text_chars if pdf else text_bytes), 2),
           **measured}
    if keep is None:
        shutil.rmtree(work, ignore_errors=True)
    return out


def measure(db: Path, keys, seed: int) -> dict:
    """Open time, search latency, the champion lists against the reference search, and recall of
    the test corpus's questions, on a database whose "archive" collection holds the test corpus."""
    from corpus_tools import questions

    from app.documents.retrieve import search
    from app.documents.store import DocumentStore

    t0 = time.perf_counter()
    store = DocumentStore(db, keys)
    index = store.index("archive")
    open_s = time.perf_counter() - t0
    # the passphrase's scrypt is a fixed cost; opening the database itself:
    t0 = time.perf_counter()
    store2 = store.clone()
    store2.index("archive")
    reopen_s = time.perf_counter() - t0
    store2.close()

    lat = {}
    rng = random.Random(seed)
    for kind, qs in (("single_word", SINGLE), ("multi_word", MULTI), ("phrase", PHRASES)):
        times = []
        for _ in range(3):
            for q in rng.sample(qs, len(qs)):
                t0 = time.perf_counter()
                search(index, q, k=5)
                times.append((time.perf_counter() - t0) * 1000)
        # the first time each question is asked in this process apart (the later rounds find more of
        # its pages in the connection's cache)
        first = times[:len(qs)]
        lat[kind] = {"p50_ms": round(_pct(times, 50), 1), "p95_ms": round(_pct(times, 95), 1), "n": len(times),
                     "first_ask_p50_ms": round(_pct(first, 50), 1), "first_ask_max_ms": round(max(first), 1)}

    # the champion lists against the reference search (FTS5 ranks every posting of the chosen words)
    reference = store.index("archive", use_champions=False)
    overlap, ref_times = {}, []
    for kind, qs in (("single_word", SINGLE), ("multi_word", MULTI), ("phrase", PHRASES)):
        shares = []
        for q in qs:
            fast = {h.chunk.id for h in search(index, q, k=5)}
            t0 = time.perf_counter()
            ref = {h.chunk.id for h in search(reference, q, k=5)}
            ref_times.append((time.perf_counter() - t0) * 1000)
            shares.append(len(fast & ref) / len(ref) if ref else float(not fast))
        overlap[kind] = {"mean": round(sum(shares) / len(shares), 3), "min": round(min(shares), 3)}
    # the word signal (mode bm25) against the exhaustive ranking: every passage holding a question word
    exhaustive = {}
    for kind, qs in (("single_word", SINGLE), ("multi_word", MULTI), ("phrase", PHRASES)):
        shares = []
        for q in qs:
            fast = [h.chunk.id for h in search(index, q, k=5, mode="bm25")]
            best = _exhaustive_bm25(store, index, q, 5)
            shares.append(len(set(fast) & set(best)) / len(best) if best else float(not fast))
        exhaustive[kind] = {"mean": round(sum(shares) / len(shares), 3), "min": round(min(shares), 3)}
    qs = questions()
    hybrid = _evaluate(index, qs)
    hybrid_reference = _evaluate(reference, qs)
    lists = store.db.execute("SELECT count(*), COALESCE(SUM(length(entries)), 0) FROM docs_champ").fetchone()
    store.close()
    return {"passages": len(index), "open_s": round(open_s, 3), "open_without_scrypt_s": round(reopen_s, 3),
            "search": lat, "test_questions_mixed_in": hybrid,
            "champion_lists": {"words": lists[0], "mb": round(lists[1] / 1e6, 1)},
            "top5_overlap_with_reference": overlap,
            "bm25_top5_overlap_with_exhaustive": exhaustive,
            "reference_search_ms": {"p50": round(_pct(ref_times, 50), 1), "p95": round(_pct(ref_times, 95), 1)},
            "test_questions_mixed_in_reference": hybrid_reference}


def evict(db: Path) -> None:
    """Drop the database's pages from the OS page cache (clean pages; the file is not being written)."""
    for p in db.parent.iterdir():
        if p.name.startswith(db.name) and not p.name.endswith("-shm") and p.is_file():
            fd = os.open(p, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def _disk_read_bytes() -> int | None:
    try:
        with open("/proc/self/io") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("read_bytes:"))
    except (OSError, StopIteration):
        return None


def measure_cold(db: Path, keys, warm_budget: int | None = None) -> dict:
    """Every question's first search on a cold OS page cache, in three variants (see the module's doc)."""
    from app.documents.retrieve import search
    from app.documents.store import DocumentStore
    from app.documents.warm import WARM_BUDGET

    budget = WARM_BUDGET if warm_budget is None else warm_budget
    out: dict = {"warm_budget_mb": round(budget / 1e6, 1)}
    for variant in ("no_warmup", "warming", "after_warmup"):
        res: dict = {}
        opens, warmups = [], []
        for kind, qs in (("single_word", SINGLE), ("multi_word", MULTI), ("phrase", PHRASES)):
            times, reads = [], []
            for q in qs:
                evict(db)
                t0 = time.perf_counter()
                store = DocumentStore(db, keys)
                warmer = store.warm(budget) if variant != "no_warmup" else None
                index = store.index("archive")
                opens.append((time.perf_counter() - t0) * 1000)
                if variant == "after_warmup":
                    warmer.wait()
                    warmups.append(warmer.stats.as_dict())
                r0 = _disk_read_bytes()
                t0 = time.perf_counter()
                search(index, q, k=5)
                times.append((time.perf_counter() - t0) * 1000)
                r1 = _disk_read_bytes()
                if r0 is not None and r1 is not None:
                    reads.append((r1 - r0) / 1e6)
                store.close()
            res[kind] = {"p50_ms": round(_pct(times, 50), 1), "p95_ms": round(_pct(times, 95), 1),
                         "max_ms": round(max(times), 1), "n": len(times),
                         "read_mb_p50": round(_pct(reads, 50), 2) if reads else None,
                         "read_mb_max": round(max(reads), 2) if reads else None}
        res["open_ms_p50"] = round(_pct(opens, 50), 1)
        if warmups:
            res["warmup"] = {"seconds_p50": round(_pct([w["seconds"] for w in warmups], 50), 2),
                             "mb": warmups[-1]["mb"], "parts_mb": warmups[-1]["parts_mb"],
                             "doclists": warmups[-1]["doclists"], "finished": warmups[-1]["finished"]}
        out[variant] = res
    return out


def _exhaustive_bm25(store, index, question: str, k: int) -> list[int]:
    """The top k of the word BM25 over every passage that holds a question word (term frequencies of
    all postings from FTS5 through fts5vocab), scored with the index's own formula and statistics."""
    from app.documents.terms import bm25, word_terms
    from app.documents.store import fts_tables

    words = list(dict.fromkeys(word_terms(question)))
    df = index._df("words", words)
    vocab = f"docs_vocab_{index.collection_id}"
    store.db.execute(f"CREATE VIRTUAL TABLE IF NOT EXISTS temp.{vocab} USING fts5vocab(main, "
                     f"{fts_tables(index.collection_id)[0]}, instance)")
    score: dict[int, float] = {}
    for w in words:
        if not df[w]:
            continue
        for pid, tf, length in store.db.execute(
                f"SELECT v.doc, count(*), c.wlen FROM temp.{vocab} v JOIN docs_chunks c ON c.id = v.doc "
                "WHERE v.term = ? GROUP BY v.doc", (w,)):
            score[pid] = score.get(pid, 0.0) + bm25(tf, df[w], index.n, length, index._avgdl["words"])
    return sorted(score, key=lambda p: (-score[p], p))[:k]


def _evaluate(index, qs) -> dict:
    from app.documents.retrieve import search

    hits3, rr = 0, 0.0
    for q in qs:
        ranked = search(index, q["q"], k=0)
        norm = lambda t: " ".join(t.split())  # noqa: E731
        rank = next((i + 1 for i, h in enumerate(ranked)
                     if h.chunk.file_name == q["file"] and norm(q["answer"]) in norm(h.chunk.text)), None)
        hits3 += rank is not None and rank <= 3
        rr += 1.0 / rank if rank else 0.0
    return {"recall@3": round(hits3 / len(qs), 4), "mrr": round(rr / len(qs), 4), "questions": len(qs)}


def measure_kept(db: Path, seed: int, cold: bool = False, warm_budget: int | None = None) -> dict:
    """measure() on a kept database (e.g. one whose add was stopped part way); with ``cold``,
    measure_cold() instead."""
    from corpus_tools import build_corpus

    from app.documents.store import DocumentStore
    from app.store.crypto import PassphraseKeys

    keys = PassphraseKeys("bench passphrase")
    store = DocumentStore(db, keys)
    names = {f.name for f in store.files("archive")}
    with tempfile.TemporaryDirectory() as tmp:
        test_corpus = build_corpus(Path(tmp) / "test-corpus")
        if not {f.name for f in test_corpus.iterdir()} <= names:
            store.add("archive", [test_corpus], workers=1)
    coll = store.collection("archive")
    store.close()
    text = coll.size
    db_bytes = sum(p.stat().st_size for p in db.parent.iterdir() if p.name.startswith("ferry.db"))
    out = {"files": coll.files, "text_mb": round(text / 1e6, 1), "db_mb": round(db_bytes / 1e6, 1),
           "db_over_text": round(db_bytes / max(1, text), 2)}
    return out | ({"cold": measure_cold(db, keys, warm_budget)} if cold else measure(db, keys, seed))


def resume(db: Path, corpus: Path, workers: int | None, stop_after: float | None = None) -> dict:
    """Go on with an add that was stopped (the kept database of a killed run): open it (the time a
    user waits), add the same folder again (stored files are skipped), with progress on stderr;
    ``stop_after`` seconds: cancel the add then (what was stored stays), as the window's Cancel does."""
    from app.documents.store import DocumentStore
    from app.store.crypto import PassphraseKeys

    t0 = time.perf_counter()
    store = DocumentStore(db, PassphraseKeys("bench passphrase"))
    before = store.collection("archive")
    open_s = time.perf_counter() - t0
    last = [0.0]

    def progress(p) -> None:
        if time.monotonic() - last[0] >= 30 or p.stage == "done":
            last[0] = time.monotonic()
            print(json.dumps({"t": time.strftime("%H:%M:%S"), "load": round(os.getloadavg()[0], 1),
                              "progress": p.summary()}), file=sys.stderr, flush=True)

    trace = RssTrace(before.size / 1e6, then=progress)     # files skipped as stored count once
    t0 = time.perf_counter()
    stop = (lambda: time.perf_counter() - t0 > stop_after) if stop_after is not None else None
    report = store.add("archive", [corpus], workers=workers, progress=trace, cancelled=stop)
    add_s = time.perf_counter() - t0
    trace.sample()
    store.close()
    return {"reopened": {"open_s": round(open_s, 3), "files": before.files, "text_mb": round(before.size / 1e6, 1),
                         "passages": before.chunks},
            "resumed_add": {"added": len(report.added), "unchanged": len(report.unchanged),
                            "failed": len(report.failed), "mb": round(report.bytes / 1e6, 1), "add_s": round(add_s, 1),
                            "add_mb_per_s": round(report.bytes / 1e6 / add_s, 3), "cancelled": report.cancelled,
                            "storing_s": round(report.store_seconds, 1),
                            "waiting_for_workers_s": round(report.wait_seconds, 1),
                            "peak_rss_mb": {"adding_process": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
                                            "largest_worker": round(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024)},
                            "rss_by_text": trace.samples}}


CLI = "import sys; from app.cli import main; sys.exit(main(sys.argv[1:]))"     # `ferry` from this checkout


def ttft(model: str, workdir: Path) -> dict:
    """Time to first token of `ferry docs ask`, each question a new process as from a shell:
    the test corpus (passages chosen per question, so a later question reads new ones), and a
    one-file collection that fits the budget whole (a later question restores the saved state)."""
    from corpus_tools import build_corpus

    env = dict(os.environ, FERRY_HOME=str(workdir / "home"), FERRY_PASSPHRASE="bench passphrase")
    corpus = build_corpus(workdir / "ttft-corpus")
    out = {}
    for coll, source in (("corpus", corpus), ("lease", corpus / "lease.md")):
        subprocess.run([sys.executable, "-c", CLI, "docs", "add", coll, str(source), "--json"], env=env,
                       check=True, capture_output=True, cwd=ROOT)
        for label, q in (("first", "How much is the monthly rent?"), ("later", "Who pays for repairs?")):
            r = subprocess.run([sys.executable, "-c", CLI, "docs", "ask", model, coll, q, "--json", "-n", "8"],
                               env=env, capture_output=True, text=True, cwd=ROOT)
            try:
                stats = json.loads(r.stdout)
            except ValueError:
                stats = {"error": (r.stderr or r.stdout)[-300:]}
            out[f"{coll}_{label}"] = {k: stats.get(k) for k in (
                "ttft_s", "passages_s", "prompt_tokens", "reused_tokens", "prefix_state", "passage_tokens",
                "whole_collection", "error") if k in stats}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--sizes", default="10,100", help="MB of text, comma-separated (1000 for the 1 GB run)")
    ap.add_argument("--workers", type=int, default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--keep", type=Path, default=None, help="work in this folder (default: a temporary one)")
    ap.add_argument("--model", default=None, help="a model folder for the docs ask TTFT")
    ap.add_argument("--corpus-cache", type=Path, default=None,
                    help="generate each size's corpus once into this folder and reuse it (e.g. ~/.cache/ferry-bench)")
    ap.add_argument("--measure", type=Path, default=None,
                    help="only measure a kept database (its ferry.db; the test corpus is added if missing)")
    ap.add_argument("--resume", type=Path, default=None,
                    help="go on with a stopped add into this kept ferry.db (the corpus of --sizes in --corpus-cache), "
                         "then measure it")
    ap.add_argument("--stop-after", type=float, default=None,
                    help="with --resume: cancel the add after this many seconds, then measure")
    ap.add_argument("--cold", action="store_true",
                    help="with --measure: first searches on a cold OS page cache, without and with the warm-up")
    ap.add_argument("--warm-budget", type=float, default=None, help="with --cold: the warm-up's budget, MB")
    ap.add_argument("--pdf", action="store_true",
                    help="the corpus as PDF files (slow to generate: about 9 s per MB of text; cache it)")
    ap.add_argument("--one", type=float, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.measure is not None:
        budget = None if args.warm_budget is None else int(args.warm_budget * 1e6)
        print(json.dumps(measure_kept(args.measure, args.seed, args.cold, budget), indent=None if args.json else 1))
        return
    if args.resume is not None:
        if args.corpus_cache is None:
            ap.error("--resume needs --corpus-cache (the corpus the stopped add was reading)")
        mb = float(args.sizes.split(",")[0])
        out = resume(args.resume, args.corpus_cache / f"archive-{mb:g}-{args.seed}", args.workers, args.stop_after)
        out.update(measure_kept(args.resume, args.seed))
        print(json.dumps(out, indent=None if args.json else 1))
        return
    if args.one is not None:
        print(json.dumps(run_size(args.one, args.workers, args.keep, args.seed, args.corpus_cache, args.pdf)))
        return
    results = []
    for mb in [float(s) for s in args.sizes.split(",") if s.strip()]:
        cmd = [sys.executable, __file__, "--one", str(mb), "--seed", str(args.seed)]
        if args.workers is not None:
            cmd += ["--workers", str(args.workers)]
        if args.keep is not None:
            cmd += ["--keep", str(args.keep)]
        if args.corpus_cache is not None:
            cmd += ["--corpus-cache", str(args.corpus_cache)]
        if args.pdf:
            cmd += ["--pdf"]
        r = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)     # its stderr (early figures) passes through
        if r.returncode != 0:
            results.append({"megabytes": mb, "error": f"exit status {r.returncode} (its stderr is above)"})
        else:
            results.append(json.loads(r.stdout.strip().splitlines()[-1]))
        if not args.json:
            print(json.dumps(results[-1], indent=1), flush=True)
    out = {"machine": platform.machine(), "cpus": os.cpu_count(), "python": platform.python_version(),
           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "sizes": results}
    if args.model:
        with tempfile.TemporaryDirectory() as tmp:
            out["docs_ask_ttft"] = ttft(args.model, Path(tmp))
    if args.json:
        print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
