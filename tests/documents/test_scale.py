"""Adding at scale: the process pool with progress, no plaintext on disk with a
larger corpus, kill -9 in the middle of an add, resume, watched folders."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from corpus_tools import load_corpus_generator
from test_store import scan_for

from app.documents import indexer
from app.documents.terms import terms_for, word_grams
from app.documents.retrieve import search
from app.documents.store import DocumentStore, df_counts, fts_tables
from app.store.crypto import PassphraseKeys

ROOT = Path(__file__).resolve().parents[2]


docs_corpus = load_corpus_generator()

NEEDLE = "Quetzal-marmalade-4417 safe combination"


def consistent(store: DocumentStore, name: str) -> dict:
    """Every stored file has exactly its passages, in the table and in both indexes, and the stored
    document frequencies are those of the stored passages (the workers count them per group of files)."""
    db = store.db
    assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    coll = store.collection(name)
    per_file = dict(db.execute("SELECT file_id, COUNT(*) FROM docs_chunks WHERE collection_id = ? GROUP BY file_id",
                               (coll.id,)).fetchall())
    for f in store.files(name):
        assert per_file.get(f.id, 0) == (f.chunks if f.status == "indexed" else 0), f
    total = sum(per_file.values())
    assert coll.chunks == total
    words, old_grams = fts_tables(coll.id)
    assert db.execute(f"SELECT COUNT(*) FROM {words}").fetchone()[0] == total
    assert not db.execute("SELECT 1 FROM sqlite_master WHERE name = ?", (old_grams,)).fetchone()
    want = df_counts(terms_for(h, t) for h, t in db.execute(
        "SELECT heading, text FROM docs_chunks WHERE collection_id = ?", (coll.id,)).fetchall())
    for sig in (0, 1):
        assert dict(db.execute("SELECT term, df FROM docs_df WHERE collection_id = ? AND signal = ?",
                               (coll.id, sig))) == want[sig]
    # every spelt word's 4-grams are in the vocabulary index (a word whose passages went may stay there)
    vocab = set(db.execute("SELECT gram, term FROM docs_gramvocab WHERE collection_id = ?", (coll.id,)))
    assert {(g, w) for w in want[0] if not any(c.isdigit() for c in w) for g in word_grams(w)} <= vocab
    return {"files": coll.files, "chunks": total}


@pytest.mark.slow
def test_a_larger_corpus_through_the_pool_leaves_no_plaintext(home, tmp_path, monkeypatch):
    corpus = tmp_path / "archive"
    files = docs_corpus.generate(corpus, 1.5, seed=3)
    files[7].write_text(files[7].read_text() + f"\n\nThe {NEEDLE} is in the study.\n")
    monkeypatch.setattr(indexer, "INLINE_BYTES", 0)       # the process pool even for this size
    store = DocumentStore(keys=PassphraseKeys("pw"))
    events = []
    report = store.add("archive", [corpus], progress=events.append, workers=2)
    assert not report.failed and len(report.added) == len(files)
    done = [e for e in events if e.stage == "indexed"]
    assert [e.done for e in done] == list(range(1, len(files) + 1))
    assert all(a.bytes_done <= b.bytes_done for a, b in zip(done, done[1:]))
    assert done[-1].bytes_done == done[-1].bytes_total == sum(f.stat().st_size for f in files)
    assert any(e.eta_s is not None for e in done[:-1]) and "files" in done[3].summary()
    hit = search(store.index("archive"), "where is the safe combination?", k=1)[0]
    assert NEEDLE in hit.chunk.text
    needles = [NEEDLE, "Quetzal-marmalade", "in the study", "archive", str(corpus)]
    assert scan_for(home, needles) == []
    consistent(store, "archive")
    store.close()
    assert scan_for(home, needles) == []


_ADDER = textwrap.dedent("""
    import sys
    sys.path.insert(0, {root!r})
    from app.documents import indexer
    from app.documents.store import DocumentStore
    from app.store.crypto import PassphraseKeys
    # batches of a few files, by size alone: the kill lands between batches however fast the machine
    indexer.BATCH_BYTES, indexer.BATCH_SECONDS = 60_000, 3600.0
    store = DocumentStore(keys=PassphraseKeys("pw"))
    def progress(p):
        if p.stage == "indexed":
            print(p.done, flush=True)
    store.add("c", [{corpus!r}], progress=progress, workers=1)
    print("finished", flush=True)
""")


def test_kill_9_during_an_add_leaves_a_consistent_resumable_collection(home, tmp_path):
    corpus = tmp_path / "archive"
    files = docs_corpus.generate(corpus, 0.8, seed=5)
    env = dict(os.environ, FERRY_HOME=str(home))
    proc = subprocess.Popen([sys.executable, "-c", _ADDER.format(root=str(ROOT), corpus=str(corpus))],
                            stdout=subprocess.PIPE, text=True, env=env)
    try:
        for line in proc.stdout:
            if line.strip().isdigit() and int(line) >= 4:
                break
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(timeout=60)
    store = DocumentStore(keys=PassphraseKeys("pw"))
    partial = consistent(store, "c")
    assert 4 <= partial["files"] < len(files)
    stored = {f.path for f in store.files("c")}
    events = []
    report = store.rescan("c", progress=events.append)      # resume: the stored files are not read again
    assert len(report.unchanged) == partial["files"] and len(report.added) == len(files) - partial["files"]
    # the time left comes from the bytes read in this add against those still to read (the stored
    # files, skipped in no time, do not count)
    to_read = sum(f.stat().st_size for f in files if str(f.resolve()) not in stored)
    read, checked = 0, 0
    for e in events:
        if e.stage == "indexed":
            read += e.path.stat().st_size
            if read < to_read:
                assert e.eta_s == pytest.approx(e.seconds * (to_read - read) / read)
                checked += 1
    assert checked >= 2
    full = consistent(store, "c")
    assert full["files"] == len(files)
    # the same as one uninterrupted add
    other = DocumentStore(tmp_path / "other" / "ferry.db", PassphraseKeys("pw"))
    other.add("c", [corpus], workers=1)
    assert consistent(other, "c") == full
    other.close()
    store.close()


def test_a_watched_folder_picks_up_new_changed_and_deleted_files(home, tmp_path):
    folder = tmp_path / "inbox"
    folder.mkdir()
    (folder / "a.md").write_text("# Boiler\n\nThe boiler was serviced by Aldous Heating in March.\n")
    (folder / "b.txt").write_text("The spare key is under the blue stone by the gate.\n")
    store = DocumentStore(keys=PassphraseKeys("pw"))
    store.add("inbox", [folder], watch=True)
    assert [s.watch for s in store.sources("inbox")] == [True]
    changes = []
    watcher = indexer.FolderWatcher(store, interval=0.1, on_change=changes.append).start()
    try:
        time.sleep(0.3)
        assert changes == []                                  # nothing changed, nothing read
        (folder / "a.md").write_text("# Boiler\n\nThe boiler was replaced by Brightwater Plumbing in June.\n")
        (folder / "c.md").write_text("# Car\n\nThe car insurance renews on 4 October.\n")
        (folder / "b.txt").unlink()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            names = {f.name for f in store.files("inbox")}
            text = " ".join(c.text for c in store.chunks("inbox"))
            if names == {"a.md", "c.md"} and "Brightwater" in text:
                break
            time.sleep(0.1)
    finally:
        watcher.stop()
    assert watcher.error is None
    assert {f.name for f in store.files("inbox")} == {"a.md", "c.md"}
    text = " ".join(c.text for c in store.chunks("inbox"))
    assert "Brightwater" in text and "Aldous" not in text and "blue stone" not in text
    consistent(store, "inbox")
    # changes while Ferry was closed are picked up on open
    (folder / "d.txt").write_text("The pension statement arrived in May.\n")
    reports = indexer.sync_watched(store)
    assert [p.name for r in reports.values() for p in r.added] == ["d.txt"]
    store.close()


def test_the_benchmarks_pdf_archive_reads_back_as_its_text(home, tmp_path):
    """bench/docs_scale.py --pdf measures adding PDFs (extraction against the index): its generator
    makes the same documents as PDF files, and adding them stores their text, word for word."""
    texts = docs_corpus.generate(tmp_path / "text", 0.03, seed=7)
    pdfs = docs_corpus.generate(tmp_path / "pdf", 0.03, seed=7, pdf=True)
    assert [p.suffix for p in pdfs] == [".pdf"] * len(texts) and len(texts) >= 2
    unicode_font = docs_corpus.pdf_font() is not None
    with DocumentStore(home / "ferry.db", PassphraseKeys("pw")) as store:
        report = store.add("pdfs", [tmp_path / "pdf"], workers=1)
        assert not report.failed and len(report.added) == len(pdfs)
        assert {f.kind for f in store.files("pdfs")} == {"pdf"}
        for text_file, pdf_file in zip(texts, pdfs):
            want = text_file.read_text(encoding="utf-8")
            if not unicode_font:
                want = want.encode("latin-1", "replace").decode("latin-1")
            got = " ".join(t for t, in store.db.execute(
                "SELECT c.text FROM docs_chunks c JOIN docs_files f ON f.id = c.file_id WHERE f.path = ? "
                "ORDER BY c.seq", (str(pdf_file),))).split()
            # every word of the source in the stored passages, in order (passages may overlap)
            pos = 0
            for w in want.split():
                assert w in got[pos:], (pdf_file.name, w, pos)
                pos = got.index(w, pos) + 1
