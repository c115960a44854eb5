"""The background warm-up at open (app/documents/warm.py): it runs on its own thread and connection,
reads every part it is meant to (FTS5 structure, segment index, passage lengths, champion lists,
common words' doclists), stays within its byte budget, waits while a search runs, stops when the
store is closed, writes nothing, and never changes what a search finds."""
from __future__ import annotations

import threading

import pytest

from app.documents import champions, warm
from app.documents.retrieve import search
from app.documents.store import DocumentStore
from app.store.crypto import EphemeralKeys

from corpus_tools import build_corpus, load_corpus_generator

QUESTIONS = ["payment", "the monthly rent and the deposit", "when is the council tax payment due", '"interest rate"',
             "penicillin allergy", "who pays for repairs", "insurance policy premium water damage"]


@pytest.fixture(scope="module")
def archive(tmp_path_factory):
    """A small archive with common words (a low threshold) beside the test corpus: every part is warmed."""
    tmp = tmp_path_factory.mktemp("warm")
    mp = pytest.MonkeyPatch()
    mp.setattr(champions, "CHAMPION_DF", 40)
    mp.setattr(champions, "KEEP", 30)
    folder = tmp / "archive"
    load_corpus_generator().generate(folder, 0.3, seed=5)
    keys = EphemeralKeys()
    store = DocumentStore(tmp / "home" / "ferry.db", keys)
    store.add("a", [folder, build_corpus(tmp / "corpus")], workers=1)
    store.add("b", [tmp / "corpus"], workers=1)
    path, opened = store.path, (store._key, store._raw)
    store.close()
    yield path, opened, mp
    mp.undo()


def _open(archive) -> DocumentStore:
    path, opened, _ = archive
    return DocumentStore(path, _opened=opened)


def _results(store: DocumentStore) -> list:
    out = []
    for name in ("a", "b"):
        index = store.index(name)
        for mode in ("hybrid", "bm25", "ngram"):
            for q in QUESTIONS:
                out.append([(h.chunk.id, h.score, h.bm25, h.ngram) for h in search(index, q, k=0, mode=mode)])
    return out


def test_the_warm_up_reads_every_part_and_changes_no_result(archive):
    path = archive[0]
    store = _open(archive)
    try:
        before = _results(store)            # no warm-up in this process yet
        files = sorted((p.name, p.stat().st_size) for p in path.parent.iterdir())
        warmer = store.warm(budget=1 << 30)
        assert store.warm() is warmer       # one at a time
        assert warmer.wait(60)
        stats = warmer.stats
        assert stats.finished and not stats.cancelled and not stats.error, stats
        assert set(stats.parts) == {"structure", "idx", "docsize", "common words", "doclists", "champions"}
        common = store.db.execute("SELECT count(*) FROM docs_champ").fetchone()[0]
        assert common and stats.doclists == common     # every common word of both collections
        assert _results(store) == before    # the same passages, the same scores, bit for bit
        with DocumentStore(path, _opened=archive[1]) as other:     # and as a store that never warmed
            assert _results(other) == before
        # it only reads: the database's files are the same files, no plaintext or side file appears
        assert sorted(p.name for p in path.parent.iterdir()) == [n for n, _ in files]
    finally:
        store.close()


def test_the_warm_up_stays_within_its_budget(archive, monkeypatch):
    monkeypatch.setattr(warm, "STEP_BYTES", 2048)       # steps small against this small database
    with _open(archive) as store:
        full = store.warm(budget=1 << 30)
        full.wait(60)
        total = full.stats.bytes
    for budget in (1, total // 3, total // 2):
        with _open(archive) as store:
            w = store.warm(budget=budget)
            assert w.wait(60)
            s = w.stats
            assert s.finished and s.bytes < total
            if budget == 1:
                assert s.steps == 1          # a step begins only while the count is under the budget
            # a doclist is read only when its estimate fits; a scan step may end past the budget by
            # about one step (sized from the rows before it: a champion list is ~30 x 24 bytes here)
            assert s.parts.get("doclists", 0) <= budget
            assert s.bytes <= budget + 2048 + 1024


def test_closing_the_store_cancels_the_warm_up_and_it_waits_while_a_search_runs(archive):
    store = _open(archive)
    index = store.index("a")
    entered = threading.Event()
    with store._gate.busy():                # a search is running: the warm-up begins no step
        warmer = store.warm()
        assert not warmer.wait(0.5)
        assert warmer.running and warmer.stats.steps == 0
        entered.set()
        store.close()                        # cancels it and joins its thread
    assert entered.is_set()
    assert warmer.wait(0) and not warmer.running
    assert warmer.stats.cancelled and not warmer.stats.finished and warmer.stats.steps == 0
    with pytest.raises(Exception):
        search(index, "payment")             # the store is closed (nothing hangs)


def test_a_warm_up_that_loses_its_database_stops_quietly(tmp_path):
    store = DocumentStore(tmp_path / "ferry.db", EphemeralKeys())
    try:
        w = warm.Warmer(lambda: (_ for _ in ()).throw(OSError("gone")), store._gate).start()
        assert w.wait(10) and "gone" in w.stats.error and not w.stats.finished
        assert DocumentStore.on_connection(store.db).warm() is None      # a borrowed connection: no warm-up
    finally:
        store.close()
