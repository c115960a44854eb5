"""The persisted per-collection statistics search reads (docs_df): equal to FTS5's own counts after
add, a changed file, a removal and a deleted collection, filled once for a collection indexed before
they existed, and the rerank's fast term counting equal to counting every term of the passage."""
from __future__ import annotations

from collections import Counter

from app.documents.terms import bm25, ngram_terms, raw_words, terms_for, word_terms
from app.documents.retrieve import search
from app.documents.store import DocumentStore, df_counts
from app.store.crypto import EphemeralKeys


def _stored_equals_counted(store: DocumentStore, name: str) -> int:
    """docs_df against FTS5's postings (words) and against the passages themselves (4-grams)."""
    stored = store.index(name)
    assert stored._df_stored
    counted = store.index(name)
    counted._df_stored = 0          # the FTS5 path: count each word's postings
    terms = [r[0] for r in store.db.execute("SELECT term FROM docs_df WHERE collection_id = ? AND signal = 0",
                                            (stored.collection_id,))]
    a, b = stored._df("words", terms), counted._df("words", terms)
    assert a == b and all(a.values())
    grams = df_counts(terms_for(h, t) for h, t in store.db.execute(
        "SELECT heading, text FROM docs_chunks WHERE collection_id = ?", (stored.collection_id,)).fetchall())[1]
    assert stored._df("grams", list(grams)) == grams
    return len(terms) + len(grams)


def _df(store: DocumentStore, term: str) -> list:
    return [r[0] for r in store.db.execute("SELECT df FROM docs_df WHERE signal = 0 AND term = ?", (term,))]


def test_stored_document_frequencies_follow_add_change_remove(corpus_dir, tmp_path):
    folder = tmp_path / "docs"
    folder.mkdir()
    for f in sorted(corpus_dir.glob("*.md"))[:4]:
        (folder / f.name).write_text(f.read_text(encoding="utf-8"), encoding="utf-8")
    store = DocumentStore(tmp_path / "ferry.db", EphemeralKeys())
    try:
        store.add("x", [folder], workers=1)
        assert _stored_equals_counted(store, "x") > 100
        changed = sorted(folder.glob("*.md"))[0]
        changed.write_text(changed.read_text(encoding="utf-8") + "\nThe zebracorn invoice was paid.\n",
                           encoding="utf-8")
        store.rescan("x", workers=1)
        assert _df(store, "zebracorn") == [1]
        _stored_equals_counted(store, "x")
        assert store.remove_file("x", changed)
        assert _df(store, "zebracorn") == []
        _stored_equals_counted(store, "x")
        store.delete_collection("x")
        assert store.db.execute("SELECT count(*) FROM docs_df").fetchone()[0] == 0
    finally:
        store.close()


def test_a_collection_indexed_before_the_statistics_gets_them_once_on_open(corpus_dir, tmp_path):
    db = tmp_path / "ferry.db"
    keys = EphemeralKeys()
    store = DocumentStore(db, keys)
    store.add("x", [corpus_dir], workers=1)
    expected = {(r[0], r[1]): r[2] for r in store.db.execute("SELECT signal, term, df FROM docs_df")}
    before = [(h.chunk.id, h.score) for h in search(store.index("x"), "how much is the monthly rent", k=5)]
    with store.db:      # as a database written before docs_df existed
        store.db.execute("DELETE FROM docs_df")
        store.db.execute("UPDATE docs_collections SET df_ready = 0")
    assert not store.index("x")._df_stored
    store.close()
    store = DocumentStore(db, keys)
    try:
        assert store.index("x")._df_stored
        assert {(r[0], r[1]): r[2] for r in store.db.execute("SELECT signal, term, df FROM docs_df")} == expected
        assert [(h.chunk.id, h.score) for h in search(store.index("x"), "how much is the monthly rent", k=5)] == before
    finally:
        store.close()


def test_rerank_counts_equal_counting_every_term(corpus_dir, tmp_path):
    """score()'s per-distinct-word counting gives bit-identical BM25 to Counter over all the passage's terms."""
    store = DocumentStore(tmp_path / "ferry.db", EphemeralKeys())
    try:
        store.add("x", [corpus_dir], workers=1)
        index = store.index("x")
        for question in ("How much is the monthly rent?", "penicillin allergy", "Café crème brûlée 2,400",
                         '"notice period" landlord'):
            words, grams = word_terms(question), ngram_terms(question)
            uw, ug = list(dict.fromkeys(words)), list(dict.fromkeys(grams))
            df = {"words": index._df("words", uw), "grams": index._df("grams", ug)}
            scored = index.score(words, grams)
            assert scored
            for chunk, w, g in scored:
                raw = raw_words(f"{chunk.heading}\n{chunk.text}")
                wlen, glen = len(word_terms("", raw)), len(ngram_terms("", raw))
                expect = []
                for signal, query, tf, length in (("words", uw, Counter(word_terms("", raw)), wlen),
                                                  ("grams", ug, Counter(ngram_terms("", raw)), glen)):
                    expect.append(sum(bm25(tf[t], df[signal][t], index.n, length, index._avgdl[signal])
                                      for t in query if tf[t]))
                assert (w, g) == tuple(expect)
    finally:
        store.close()
