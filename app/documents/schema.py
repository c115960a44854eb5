"""The documents' tables in the one encrypted database (``ferry.db``): the floor every other part
of ``app.documents`` stands on (the ranking reads them, the store writes them). No logic here."""
from __future__ import annotations

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
