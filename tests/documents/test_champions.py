"""Champion lists (app/documents/champions.py) on a generated archive with a low threshold, so
many words are common: rare-word questions rank exactly as the exhaustive search does, common-word
questions keep most of its top 5, and the stored lists stay what they would be if built from the
index again after files are added, changed and removed."""
from __future__ import annotations

import pytest

from app.documents import champions, index, terms
from app.documents.retrieve import search
from app.documents.store import DocumentStore
from app.store.crypto import EphemeralKeys

from corpus_tools import load_corpus_generator

docs_corpus = load_corpus_generator()

COMMON_QUESTIONS = ["payment", "the monthly rent and the deposit", "insurance policy premium", '"interest rate"',
                    "when is the council tax payment due", "doctor", "annual leave salary"]


@pytest.fixture
def archive(tmp_path, monkeypatch):
    monkeypatch.setattr(champions, "CHAMPION_DF", 40)
    monkeypatch.setattr(champions, "KEEP", 30)
    folder = tmp_path / "archive"
    docs_corpus.generate(folder, 0.5, seed=3)
    store = DocumentStore(tmp_path / "ferry.db", EphemeralKeys())
    store.add("a", [folder], workers=1)
    yield store, folder
    store.close()


def _exhaustive(store: DocumentStore, monkeypatch):
    """The reference: every passage that holds a question term is scored by the full scorer."""
    monkeypatch.setattr(index, "POSTINGS_BUDGET", 10**9)
    monkeypatch.setattr(index, "CANDIDATES", 10**6)
    monkeypatch.setattr(index, "CANDIDATE_GRAMS", 10**6)
    return store.index("a", use_champions=False)


def _top(idx, q: str, k: int = 5) -> list[int]:
    return [h.chunk.id for h in search(idx, q, k=k, mode="bm25")]


def _rare_words(store: DocumentStore, n: int) -> list[str]:
    return [r[0] for r in store.db.execute(
        "SELECT term FROM docs_df WHERE signal = 0 AND df BETWEEN 2 AND 8 AND term GLOB '[a-z]*' "
        "ORDER BY term LIMIT ?", (n,))]


def _check_lists(store: DocumentStore) -> int:
    """Every common word has a list; every list entry is a passage holding the word with that tf and
    length; the list is the best KEEP (as rebuilt from FTS5 now: the same passages, up to the drift of
    the average length since an entry was left out)."""
    db = store.db
    cid = store.collection("a").id
    common = champions._common(db, cid)
    lists = champions.read(db, cid, list(common))
    assert set(lists) == set(common)
    assert db.execute("SELECT count(*) FROM docs_champ WHERE collection_id = ?", (cid,)).fetchone()[0] == len(common)
    avgdl = champions._avgdl(db, cid)
    for term, entries in lists.items():
        # a removal may leave a list shorter, down to KEEP // 2 before it is refilled
        assert min(champions.KEEP // 2, common[term]) <= len(entries) <= min(champions.KEEP, common[term])
        fresh = champions._from_postings(db, cid, term, avgdl)
        assert champions._from_fts(db, cid, term, avgdl) == fresh, term
        truth = {pid: (tf, length) for pid, tf, length in fresh}
        for pid, tf, length in entries:
            row = db.execute("SELECT wlen FROM docs_chunks WHERE id = ?", (pid,)).fetchone()
            assert row is not None and row[0] == length
            if pid in truth:
                assert truth[pid] == (tf, length)
        # left out or kept under an older average length: only passages that were close to the cut
        cut = champions.impact(fresh[len(entries) - 1][1], fresh[len(entries) - 1][2], avgdl)
        assert all(champions.impact(tf, length, avgdl) >= 0.95 * cut for _, tf, length in entries), term
        assert len({e[0] for e in entries} & set(truth)) >= 0.8 * len(entries), term
    return len(lists)


def test_rare_word_questions_rank_as_the_exhaustive_search(archive, monkeypatch):
    store, _ = archive
    rare = _rare_words(store, 12)
    assert len(rare) >= 8
    questions = rare + [" ".join(rare[i:i + 3]) for i in range(0, 9, 3)]
    fast = [_top(store.index("a"), q) for q in questions]
    exhaustive = _exhaustive(store, monkeypatch)
    assert fast == [_top(exhaustive, q) for q in questions]


def test_common_word_questions_keep_the_exhaustive_top_5(archive, monkeypatch):
    store, _ = archive
    idx = store.index("a")
    common = champions._common(store.db, idx.collection_id)
    assert {"payment", "rent", "doctor"} <= set(common)     # the lists are in use
    fast = {q: _top(idx, q) for q in COMMON_QUESTIONS}
    exhaustive = _exhaustive(store, monkeypatch)
    overlap = [len(set(fast[q]) & set(_top(exhaustive, q))) / 5 for q in COMMON_QUESTIONS]
    assert min(overlap) >= 0.6 and sum(overlap) / len(overlap) >= 0.8, overlap


def test_lists_follow_added_changed_and_removed_files(archive, tmp_path):
    store, folder = archive
    assert _check_lists(store) > 20
    files = sorted(folder.rglob("*.md"))
    # a changed file: its old passages leave the lists, the new ones enter where they rank
    changed = files[0]
    changed.write_text("# Payment\n\n" + "The payment of the rent is due. " * 40, encoding="utf-8")
    store.rescan("a", workers=1)
    new_ids = {r[0] for r in store.db.execute(
        "SELECT c.id FROM docs_chunks c JOIN docs_files f ON f.id = c.file_id WHERE f.path = ?", (str(changed),))}
    lists = champions.read(store.db, store.collection("a").id, ["payment", "rent"])
    assert all(new_ids & {e[0] for e in lists[t]} for t in ("payment", "rent"))
    _check_lists(store)
    # removed files: none of their passages stay in a list, shrunken lists are refilled
    for f in files[1:6]:
        gone = {r[0] for r in store.db.execute(
            "SELECT c.id FROM docs_chunks c JOIN docs_files f ON f.id = c.file_id WHERE f.path = ?", (str(f),))}
        assert store.remove_file("a", f)
        for entries in champions.read(store.db, store.collection("a").id, ["payment", "rent", "the"]).values():
            assert not gone & {e[0] for e in entries}
    _check_lists(store)
    # a new folder: words that become common get their lists from the index
    more = tmp_path / "more"
    docs_corpus.generate(more, 0.2, seed=9)
    store.add("a", [more], workers=1)
    _check_lists(store)


def test_a_collection_indexed_before_the_lists_gets_them_on_open(archive, tmp_path):
    store, _ = archive
    want = {t: e for t, e in champions.read(store.db, store.collection("a").id, ["payment", "rent"]).items()}
    with store.db:
        store.db.execute("DELETE FROM docs_champ")
        store.db.execute("UPDATE docs_collections SET champ_ready = 0")
    again = store.clone()
    try:
        assert champions.read(again.db, again.collection("a").id, ["payment", "rent"]) == want
        _check_lists(again)
    finally:
        again.close()


def test_a_list_from_fts5s_ranking_is_the_list_from_every_posting(archive, monkeypatch):
    """The term frequencies recovered from FTS5's scores, and the fallback that counts them from the
    text when a score does not match (here: a wrong df, so every recovered tf fails its check)."""
    store, _ = archive
    db = store.db
    cid = store.collection("a").id
    avgdl = champions._avgdl(db, cid)
    common = champions._common(db, cid)
    assert len(common) > 20
    for term in common:
        assert champions._from_fts(db, cid, term, avgdl) == champions._from_postings(db, cid, term, avgdl), term
    term = min(common, key=common.get)      # held by fewer than half the passages: its IDF is not FTS5's floor
    want = champions._from_postings(db, cid, term, avgdl)
    counted = []
    word_terms = terms.word_terms
    monkeypatch.setattr(terms, "word_terms", lambda text: counted.append(1) or word_terms(text))
    db.execute("UPDATE docs_df SET df = df + 7 WHERE collection_id = ? AND signal = 0 AND term = ?", (cid, term))
    try:
        assert champions._from_fts(db, cid, term, avgdl) == want
        assert len(counted) == len(want)
    finally:
        db.rollback()


def test_list_upkeep_memory_does_not_grow_with_the_common_words(tmp_path, monkeypatch):
    """The same small batch is added to a collection, then again after the collection has grown
    4x: the memory the lists' upkeep holds (traced peak of champions.added) must not grow with the
    number of common words times KEEP (merging every touched list at once did: 241 MB at 1 GB of
    text, docs/bench-log/2026-12-04.md). Growth of a float per common word is allowed."""
    import shutil
    import tracemalloc

    monkeypatch.setattr(champions, "CHAMPION_DF", 20)
    monkeypatch.setattr(champions, "KEEP", 20)
    monkeypatch.setattr(champions, "SLICE", 8)
    peaks: list[tuple[int, int]] = []
    added = champions.added

    def traced(db, cid, passages):
        tracemalloc.start()
        try:
            added(db, cid, passages)
            peaks.append((tracemalloc.get_traced_memory()[1], len(champions._common(db, cid))))
        finally:
            tracemalloc.stop()

    docs_corpus.generate(tmp_path / "base", 0.15, seed=4)
    docs_corpus.generate(tmp_path / "more", 0.45, seed=5, start=1000)
    docs_corpus.generate(tmp_path / "probe1", 0.06, seed=6, start=5000)
    shutil.copytree(tmp_path / "probe1", tmp_path / "probe2")
    store = DocumentStore(tmp_path / "ferry.db", EphemeralKeys())
    try:
        store.add("a", [tmp_path / "base"], workers=1)
        monkeypatch.setattr(champions, "added", traced)
        store.add("a", [tmp_path / "probe1"], workers=1)
        monkeypatch.setattr(champions, "added", added)
        store.add("a", [tmp_path / "more"], workers=1)
        monkeypatch.setattr(champions, "added", traced)
        store.add("a", [tmp_path / "probe2"], workers=1)
        _check_lists(store)
    finally:
        store.close()
    (peak1, common1), (peak2, common2) = peaks[0], peaks[-1]
    assert len(peaks) == 2 and common2 >= 2 * common1 > 100, peaks
    # a list held as tuples costs ~KEEP * 100 bytes; a float per word ~100 bytes
    assert peak2 - peak1 < (common2 - common1) * champions.KEEP * 25, peaks


def test_array_impacts_and_best_are_the_scalar_ones():
    """The upkeep ranks lists as numpy arrays: every impact must be bit-identical to the scalar
    function's, and the chosen entries those of sorting tuples by (-impact, id) with the last
    entry of a passage kept (the reference below)."""
    import random

    import numpy as np

    rng = random.Random(7)
    for avgdl in (0.0, 1.0, 57.3, 212.9187):
        tf = [rng.randint(1, 60) for _ in range(3000)]
        length = [rng.randint(1, 900) for _ in range(3000)]
        arr = champions.impact(np.array(tf), np.array(length), avgdl)
        assert arr.tolist() == [champions.impact(t, n, avgdl) for t, n in zip(tf, length)]
        entries = [(rng.randint(1, 400), t, n) for t, n in zip(tf, length)]     # repeated ids too
        uniq = {e[0]: e for e in entries}
        want = sorted(uniq.values(), key=lambda e: (-champions.impact(e[1], e[2], avgdl), e[0]))[:champions.KEEP]
        assert champions._best(entries, avgdl) == want
    assert champions._best([], 3.0) == []
    assert champions.unpack(champions._pack([(5, 2, 30), (9, 1, 12)])) == [(5, 2, 30), (9, 1, 12)]
