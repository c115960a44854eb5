"""Retrieval terms and the persistent index: BM25 over words, and BM25 over
character 4-grams as the second signal, stored in the encrypted database
(app/documents/store.py: an FTS5 table of the words, the 4-grams of the
collection's vocabulary, and both signals' document frequencies) and
searched in place.

A search has two stages. FTS5 finds the candidates: the best-ranked chunks
for the question's words, and for the indexed words that share the
question's rarest 4-grams (a misspelt or other form of a word). Those candidates are
then scored with the exact Okapi BM25 the in-memory index used (same k1, b,
IDF ``log(1 + (N - df + 0.5) / (df + 0.5))``, the collection's own N, df and
average length), so the ranking of a small collection is what it was, and a
large one is searched without reading every passage."""
from __future__ import annotations

import contextlib
from collections import Counter
from dataclasses import dataclass
from typing import Iterable, Sequence

from app.documents import champions
from app.documents.terms import B, K1, STOPWORDS, _idf, bm25, raw_words, stem, word_grams

#: candidates taken from each FTS5 table before the exact rerank
CANDIDATES = 25
#: candidates from each "all the question's words but one" intersection (when few hold them all)
SUBSET_CANDIDATES = 5
#: at most this many of the question's 4-grams (the rarest) choose the n-gram candidates
CANDIDATE_GRAMS = 24
#: at most this many of the collection's words sharing those 4-grams (the most shared first) choose them
GRAM_WORDS = 16
#: FTS5 ranks every chunk that holds a candidate term, so the terms that choose candidates
#: are the rarest ones, adding more while their chunks (document frequencies) sum to at most
#: this; the rarest term is always taken. A small collection takes every term.
POSTINGS_BUDGET = 5_000
#: the page cache of the connection a search reads through, KiB (SQLite's default is 2 MB): every
#: page read from the file is decrypted and authenticated, and the postings of a collection's
#: common words, read by most questions, are larger than the default
SEARCH_CACHE_KIB = 65_536
@dataclass
class IndexedChunk:
    id: int
    file_id: int
    file_name: str
    path: str
    page: int | None
    heading: str
    start: int
    end: int
    text: str
    seq: int


_CHUNK_COLS = ('c.id, c.file_id, f.name, f.path, c.page, c.heading, c.start, c."end", c.text, c.seq, '
               'c.wlen, c.glen')


def _match(terms: Iterable[str]) -> str:
    return " OR ".join('"' + t.replace('"', '""') + '"' for t in terms)


def _rarest(terms: Sequence[str], df: dict[str, int], most: int) -> list[str]:
    """The rarest present terms whose document frequencies fit POSTINGS_BUDGET (at least one)."""
    chosen: list[str] = []
    total = 0
    for t in sorted((t for t in terms if df[t]), key=lambda t: df[t])[:most]:
        if chosen and total + df[t] > POSTINGS_BUDGET:
            break
        chosen.append(t)
        total += df[t]
    return chosen


class FtsIndex:
    """One collection's persistent index, read through the store's connection."""

    def __init__(self, db, collection_id: int, words_table: str, *, use_champions: bool = True, gate=None):
        self._db, self.collection_id = db, collection_id
        #: app.documents.warm.Gate: the background warm-up begins no step while a search runs
        self._gate = gate
        if db.execute("PRAGMA cache_size").fetchone()[0] > -SEARCH_CACHE_KIB:
            db.execute(f"PRAGMA cache_size = -{SEARCH_CACHE_KIB}")
        #: False: FTS5 ranks every posting of the chosen words (the reference the lists are measured against)
        self.use_champions = use_champions
        self._words = words_table
        self.n, wlen, glen, self._df_stored = db.execute(
            "SELECT n_chunks, wlen, glen, df_ready FROM docs_collections WHERE id = ?", (collection_id,)).fetchone()
        self._avgdl = {"words": wlen / self.n if self.n else 0.0, "grams": glen / self.n if self.n else 0.0}

    def __len__(self) -> int:
        return self.n

    def head(self, limit: int | None) -> list[IndexedChunk]:
        """The first ``limit`` passages in file order (all with None)."""
        sql = (f"SELECT {_CHUNK_COLS} FROM docs_chunks c JOIN docs_files f ON f.id = c.file_id "
               "WHERE c.collection_id = ? ORDER BY c.file_id, c.seq")
        args: tuple = (self.collection_id,)
        if limit is not None:
            sql += " LIMIT ?"
            args += (int(limit),)
        return [IndexedChunk(*r[:10]) for r in self._db.execute(sql, args)]

    def _df(self, signal: str, terms: Sequence[str]) -> dict[str, int]:
        """The number of passages holding each term: read from docs_df (kept by the store on every add
        and remove; filled when the store opens). Without it (only a test asks) words are counted in
        FTS5 and 4-grams are 0."""
        out = dict.fromkeys(terms, 0)
        if not terms:
            return out
        if self._df_stored:
            out.update(self._db.execute(
                f"SELECT term, df FROM docs_df WHERE collection_id = ? AND signal = ? AND term IN "
                f"({','.join('?' * len(terms))})", (self.collection_id, int(signal == "grams"), *terms)))
            return out
        if signal == "words":
            table = self._words
            for t in terms:
                out[t], = self._db.execute(f"SELECT count(*) FROM {table} WHERE {table} MATCH ?",
                                           (_match([t]),)).fetchone()
        return out

    def _candidates(self, terms: Sequence[str], limit: int) -> list[int]:
        """The ``limit`` chunks holding any of the words ``terms`` that FTS5 ranks best."""
        if not terms:
            return []
        table = self._words
        return [r[0] for r in self._db.execute(f"SELECT rowid FROM {table} WHERE {table} MATCH ? ORDER BY rank LIMIT ?",
                                               (_match(terms), limit))]

    def _gram_words(self, grams: Sequence[str]) -> list[str]:
        """The collection's words holding the most of these 4-grams (ties: the rarer word first), as
        many as fit POSTINGS_BUDGET (at least one): those FTS5 ranks for the n-gram candidates."""
        if not grams:
            return []
        rows = self._db.execute(
            "SELECT v.term, count(*) AS hits, d.df FROM docs_gramvocab v JOIN docs_df d "
            "ON d.collection_id = v.collection_id AND d.signal = 0 AND d.term = v.term "
            f"WHERE v.collection_id = ? AND v.gram IN ({','.join('?' * len(grams))}) "
            "GROUP BY v.term ORDER BY hits DESC, d.df, v.term LIMIT ?", (self.collection_id, *grams, GRAM_WORDS))
        chosen: list[str] = []
        total = 0
        for term, _, df in rows:
            if chosen and total + df > POSTINGS_BUDGET:
                break
            chosen.append(term)
            total += df
        return chosen

    def _all_of(self, words: Sequence[str], limit: int) -> list[int]:
        """The ``limit`` chunks holding every one of ``words`` that FTS5 ranks best. An intersection of
        at most ``limit`` chunks is that answer whatever the order, and is found without ranking: FTS5's
        bm25() first reads every posting of each word to count the chunks holding it (for common words
        most of the query's time, growing with the collection), while the unranked query skips through
        the postings. Only a larger intersection is ranked."""
        table = self._words
        match = " AND ".join('"' + w.replace('"', '""') + '"' for w in words)
        ids = [r[0] for r in self._db.execute(f"SELECT rowid FROM {table} WHERE {table} MATCH ? LIMIT ?",
                                              (match, limit + 1))]
        if len(ids) <= limit:
            return ids
        return [r[0] for r in self._db.execute(
            f"SELECT rowid FROM {table} WHERE {table} MATCH ? ORDER BY rank LIMIT ?", (match, limit))]

    def score(self, words: Sequence[str], grams: Sequence[str], *, limit: int = CANDIDATES
              ) -> list[tuple[IndexedChunk, float, float]]:
        """(chunk, word BM25, n-gram BM25) of the candidates for these question terms."""
        if not self.n:
            return []
        with self._gate.busy() if self._gate is not None else contextlib.nullcontext():
            return self._score(words, grams, limit)

    def _score(self, words: Sequence[str], grams: Sequence[str], limit: int) -> list[tuple[IndexedChunk, float, float]]:
        words, grams = list(dict.fromkeys(words)), list(dict.fromkeys(grams))
        if not words or not grams:
            limit *= 2          # one signal alone (mode bm25 or ngram) takes both signals' candidates
        df = {"words": self._df("words", words), "grams": self._df("grams", grams)}
        present = [w for w in words if df["words"][w]]
        # common words are read from their champion lists (app/documents/champions.py), rare ones
        # (and a common one without a list) are ranked by FTS5 over their postings
        lists = champions.read(self._db, self.collection_id,
                               [w for w in present if df["words"][w] >= champions.CHAMPION_DF]
                               ) if self.use_champions else {}
        rare = [w for w in present if w not in lists]
        ids = dict.fromkeys(self._candidates(_rarest(rare, df["words"], len(rare)), limit))
        if lists:
            idf = {t: _idf(df["words"][t], self.n) for t in lists}
            ids.update(dict.fromkeys(champions.candidates(lists, idf, self._avgdl["words"], limit)))
        if len(present) > 1 and sum(df["words"].values()) > POSTINGS_BUDGET:
            # chunks holding every word: the intersection is small and well ranked, and FTS5 finds it
            # by skipping through the postings (a passage holding all the common words of a question
            # is often in none of their champion lists)
            both = self._all_of(present, limit)
            ids.update(dict.fromkeys(both))
            if len(both) < limit and len(present) > 2:
                # few hold them all: those holding all but one (of the six rarest), each left out in turn
                some = sorted(present, key=lambda w: df["words"][w])[:6]
                for out in some:
                    ids.update(dict.fromkeys(self._all_of([w for w in some if w != out], SUBSET_CANDIDATES)))
        chosen = _rarest(grams, df["grams"], CANDIDATE_GRAMS)
        if not (ids and lists and chosen and df["grams"][chosen[0]] > POSTINGS_BUDGET):
            # with champion candidates in hand, 4-grams that are all common add none (FTS5 would
            # rank every passage that holds the rarest of them)
            ids.update(dict.fromkeys(self._candidates(self._gram_words(chosen), limit)))
        if not ids:
            return []
        rows = self._db.execute(f"SELECT {_CHUNK_COLS} FROM docs_chunks c JOIN docs_files f ON f.id = c.file_id "
                                f"WHERE c.id IN ({','.join('?' * len(ids))})", tuple(ids)).fetchall()
        return self._rerank(rows, words, grams, df)

    def _rerank(self, rows, words: Sequence[str], grams: Sequence[str], df: dict[str, dict[str, int]]
                ) -> list[tuple[IndexedChunk, float, float]]:
        """Every candidate row scored with the exact BM25 of both signals (the same arithmetic as
        :func:`bm25`, so the same bits): each passage tokenised once, and only its distinct words
        that bear on the question looked at in Python (a word is classified once per search: its
        stem if the question has it, and the question's 4-grams among its own)."""
        query_words, query_grams = set(words), set(grams)
        idf = {signal: {t: _idf(df[signal][t], self.n) for t in query}
               for signal, query in (("words", words), ("grams", grams))}
        seen: set[str] = set()
        relevant: dict[str, tuple[str | None, tuple[str, ...]]] = {}
        out = []
        for r in rows:
            counts = Counter(raw_words(f"{r[5]}\n{r[8]}"))
            new = set(counts).difference(seen)
            if new:
                seen |= new
                for w in new.difference(STOPWORDS):
                    st, gs = stem(w), word_grams(w)
                    if st in query_words or not query_grams.isdisjoint(gs):
                        relevant[w] = (st if st in query_words else None, tuple(g for g in gs if g in query_grams))
            tf_w: dict[str, int] = {}
            tf_g: dict[str, int] = {}
            for w in counts.keys() & relevant.keys():
                st, gs = relevant[w]
                c = counts[w]
                if st is not None:
                    tf_w[st] = tf_w.get(st, 0) + c
                for g in gs:
                    tf_g[g] = tf_g.get(g, 0) + c
            signals = []
            for signal, query, tf, length in (("words", words, tf_w, r[10]), ("grams", grams, tf_g, r[11])):
                norm = K1 * (1 - B + B * length / (self._avgdl[signal] or 1.0))
                weight = idf[signal]
                signals.append(sum(weight[t] * tf[t] * (K1 + 1) / (tf[t] + norm) for t in query if t in tf))
            out.append((IndexedChunk(*r[:10]), signals[0], signals[1]))
        return out
