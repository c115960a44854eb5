"""The index's upkeep: each collection's document frequencies (``docs_df``), its vocabulary's
4-grams (``docs_gramvocab``) and its champion lists, kept with the passages a batch of files stores
or removes. Below the store (which calls it in its transactions) and the indexer (whose workers
count terms per group of files); above the schema and the ranking."""
from __future__ import annotations

import re
from collections import Counter
from typing import Iterable, Sequence

from app.documents import champions
from app.documents.schema import SIGNALS, fts_tables
from app.documents.terms import terms_for, word_grams


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


def write_df(db, cid: int, counts: tuple[dict, dict], sign: int) -> None:
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


def build_gram_vocab(db, cid: int) -> None:
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
    write_df(db, cid, df_counts(terms), sign)


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
            write_df(db, self.cid, self.df, +1)
        if self.passages:
            champions.added(db, self.cid, self.passages)
        self.df = ({}, {})
        self.passages = []


def count_df(db, cid: int) -> None:
    """Fill docs_df of a collection indexed before it existed, once, from its passages."""
    with db:
        db.execute("DELETE FROM docs_df WHERE collection_id = ?", (cid,))
        rows = db.execute("SELECT heading, text FROM docs_chunks WHERE collection_id = ?", (cid,))
        while batch := rows.fetchmany(2000):
            _update_df(db, cid, [terms_for(h, t) for h, t in batch], +1)
        db.execute("UPDATE docs_collections SET df_ready = 1 WHERE id = ?", (cid,))
