"""The 4-gram signal's index over the collection's vocabulary (docs_gramvocab): kept as words enter,
and built once, from docs_df, for a database written with the older per-passage 4-gram FTS5 table."""
from __future__ import annotations

from app.documents.terms import terms_for, word_grams
from app.documents.retrieve import search
from app.documents.store import DocumentStore, fts_tables
from app.store.crypto import EphemeralKeys

QUESTIONS = ["how much is the monthly rent", "Is she allergic to any antibiotics?", "penicilin allergy",
             "when was the boiler servised", "notice period"]


def _answers(store: DocumentStore) -> dict:
    index = store.index("x")
    return {q: [(h.chunk.id, h.score) for h in search(index, q, k=5)] for q in QUESTIONS}


def _exists(store: DocumentStore, table: str) -> bool:
    return store.db.execute("SELECT 1 FROM sqlite_master WHERE name = ?", (table,)).fetchone() is not None


def test_words_entering_a_collection_get_their_4grams(corpus_dir, tmp_path):
    store = DocumentStore(tmp_path / "ferry.db", EphemeralKeys())
    try:
        store.add("x", [corpus_dir], workers=1)
        cid = store.collection("x").id
        assert not _exists(store, fts_tables(cid)[1])          # no per-passage 4-gram table
        words = [r[0] for r in store.db.execute("SELECT term FROM docs_df WHERE signal = 0")]
        spelt = [w for w in words if not any(c.isdigit() for c in w)]
        vocab = set(store.db.execute("SELECT gram, term FROM docs_gramvocab WHERE collection_id = ?", (cid,)))
        assert vocab == {(g, w) for w in spelt for g in word_grams(w)} and 500 < len(spelt) < len(words)
        note = tmp_path / "note.txt"
        note.write_text("The zebracorn invoice was paid on Tuesday.\n", encoding="utf-8")
        store.add("x", [note], workers=1)
        assert ("ebra", "zebracorn") in set(store.db.execute("SELECT gram, term FROM docs_gramvocab"))
        hits = search(store.index("x"), "zebrakorn", k=3)                 # misspelt: found by its 4-grams
        assert hits and "zebracorn" in hits[0].chunk.text
        store.delete_collection("x")
        assert store.db.execute("SELECT count(*) FROM docs_gramvocab").fetchone()[0] == 0
    finally:
        store.close()


def test_an_older_collection_moves_to_the_vocabulary_once_on_open(corpus_dir, tmp_path):
    db, keys = tmp_path / "ferry.db", EphemeralKeys()
    store = DocumentStore(db, keys)
    store.add("x", [corpus_dir], workers=1)
    cid = store.collection("x").id
    vocab = set(store.db.execute("SELECT gram, term FROM docs_gramvocab"))
    before = _answers(store)
    grams_table = fts_tables(cid)[1]
    with store.db:      # as the layout before: a per-passage 4-gram table, no vocabulary, no column
        store.db.execute(f"CREATE VIRTUAL TABLE {grams_table} USING fts5(terms, content='', contentless_delete=1, "
                         "detail=none, tokenize=\"ascii tokenchars '#.,:/''_'\")")
        rows = store.db.execute("SELECT id, heading, text FROM docs_chunks WHERE collection_id = ?", (cid,)).fetchall()
        store.db.executemany(f"INSERT INTO {grams_table}(rowid, terms) VALUES (?, ?)",
                             [(i, terms_for(h, t)[2]) for i, h, t in rows])
        store.db.execute("DELETE FROM docs_gramvocab")
        store.db.execute("ALTER TABLE docs_collections DROP COLUMN gram_vocab_ready")
    store.close()
    store = DocumentStore(db, keys)
    try:
        assert not _exists(store, grams_table)
        assert set(store.db.execute("SELECT gram, term FROM docs_gramvocab")) == vocab
        assert _answers(store) == before
        assert store.db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    finally:
        store.close()
    store = DocumentStore(db, keys)        # once: the next open finds nothing to do
    try:
        assert store.db.execute("SELECT gram_vocab_ready FROM docs_collections").fetchall() == [(1,)]
        assert set(store.db.execute("SELECT gram, term FROM docs_gramvocab")) == vocab
    finally:
        store.close()
