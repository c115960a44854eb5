"""Champion lists: for every common word of a collection, the passages where
that word weighs most, kept in the encrypted database at add time, so a
search for a common word reads a short list instead of letting FTS5 score
every passage that holds it.

A word is *common* when at least :data:`CHAMPION_DF` passages hold it (a rarer
word is searched through FTS5 as before, exactly: FTS5 ranks its few
postings). Its list holds the :data:`KEEP` passages with the largest BM25
contribution of that word, ``tf * (k1 + 1) / (tf + k1 * (1 - b + b * len / avgdl))``
(the word's IDF is the same for every passage, so it does not change the
order), stored as ``(passage id, tf, length)`` so the order is recomputed
with the collection's current average length whenever a list is merged.

Upkeep, inside the add's or the removal's own transaction:

* an add (a batch of files) merges the batch's postings of every common word
  into its list and keeps the best :data:`KEEP`;
* a word that becomes common gets its list from the FTS5 index itself (its
  postings with their term frequencies, read through an ``fts5vocab`` table),
  as does every common word whose list is missing (a database written before
  lists existed);
* a removal drops the removed passages from the lists; a list that falls
  below :data:`KEEP` // 2 while more passages hold the word is rebuilt from
  FTS5; a word that is no longer common loses its list.

A search (:meth:`app.documents.index.FtsIndex.score`) takes as candidates the
passages of the question's common words' lists with the best partial BM25
(summed over those lists), beside FTS5's candidates for its rare words, and
ranks every candidate with the full scorer.
"""
from __future__ import annotations

import math
from collections import Counter, defaultdict
from typing import Iterable, Iterator, Sequence

import numpy as np

from app.documents import terms as _terms     # BM25's constants and the words of a passage

#: a word held by at least this many passages gets a champion list
CHAMPION_DF = 2000
#: passages kept per list
KEEP = 200

_SCHEMA = """
CREATE TABLE IF NOT EXISTS docs_champ (
    collection_id INTEGER NOT NULL,
    term TEXT NOT NULL,
    entries BLOB NOT NULL,
    PRIMARY KEY (collection_id, term)
) WITHOUT ROWID;
"""


def ensure_schema(db) -> None:
    db.executescript(_SCHEMA)


def length_norm(length, avgdl: float):
    """BM25's length normalisation of a passage (or an array of them): ``k1 * (1 - b + b * len / avgdl)``."""
    k1, b = _terms.K1, _terms.B
    return k1 * (1 - b + b * length / (avgdl or 1.0))


def impact_at(tf, norm):
    """A word's BM25 contribution without its IDF, given the passage's :func:`length_norm`."""
    return tf * (_terms.K1 + 1) / (tf + norm)


def impact(tf, length, avgdl: float):
    """A word's BM25 contribution in one passage without its IDF; with numpy arrays for ``tf`` and
    ``length``, of many entries at once, each value bit-identical to the scalar one (the same
    operations in the same order; numpy does not fuse them)."""
    return impact_at(tf, length_norm(length, avgdl))


def _pack(entries) -> bytes:
    """A list as stored: native-order int64 (id, tf, length) triples."""
    return np.asarray(entries, dtype=np.int64).reshape(-1, 3).tobytes()


def _array(blob: bytes) -> np.ndarray:
    return np.frombuffer(blob, dtype=np.int64).reshape(-1, 3)


def _tuples(e: np.ndarray) -> list[tuple[int, int, int]]:
    return [tuple(r) for r in e.tolist()]


def unpack(blob: bytes) -> list[tuple[int, int, int]]:
    return _tuples(_array(blob))


def _best_array(e: np.ndarray, avgdl: float) -> np.ndarray:
    """The KEEP entries of largest impact (ties: the older passage first), one per passage (its
    last entry), as an (n, 3) array."""
    if len(e) == 0:
        return e.reshape(0, 3)
    _, last = np.unique(e[::-1, 0], return_index=True)
    e = e[len(e) - 1 - last]
    order = np.lexsort((e[:, 0], -impact(e[:, 1], e[:, 2], avgdl)))
    return e[order[:KEEP]]


def _best(entries: Iterable[tuple[int, int, int]], avgdl: float) -> list[tuple[int, int, int]]:
    """:func:`_best_array` of a sequence of (id, tf, length) tuples, as tuples."""
    e = np.asarray(list(entries), dtype=np.int64).reshape(-1, 3)
    return _tuples(_best_array(e, avgdl))


def _avgdl(db, cid: int) -> float:
    n, wlen = db.execute("SELECT n_chunks, wlen FROM docs_collections WHERE id = ?", (cid,)).fetchone()
    return wlen / n if n else 0.0


def _common(db, cid: int, terms: Iterable[str] | None = None) -> dict[str, int]:
    """df of the collection's common words (of ``terms`` only, when given)."""
    if terms is None:
        return dict(db.execute("SELECT term, df FROM docs_df WHERE collection_id = ? AND signal = 0 AND df >= ?",
                               (cid, CHAMPION_DF)))
    out: dict[str, int] = {}
    terms = list(terms)
    for i in range(0, len(terms), 500):
        part = terms[i:i + 500]
        out.update(db.execute(f"SELECT term, df FROM docs_df WHERE collection_id = ? AND signal = 0 AND df >= ? "
                              f"AND term IN ({','.join('?' * len(part))})", (cid, CHAMPION_DF, *part)))
    return out


def read(db, cid: int, terms: Sequence[str]) -> dict[str, list[tuple[int, int, int]]]:
    """The stored lists of these words (the words that have one)."""
    return {t: _tuples(a) for t, a in _read_arrays(db, cid, terms).items()}


def _read_arrays(db, cid: int, terms: Sequence[str]) -> dict[str, np.ndarray]:
    return dict(_each_list(db, cid, terms))


def _each_list(db, cid: int, terms: Sequence[str]) -> Iterator[tuple[str, np.ndarray]]:
    """(word, its list as an (n, 3) array) of these words that have one, read 500 at a time
    (nothing of a read list is held by this generator after it is yielded)."""
    terms = list(terms)
    for i in range(0, len(terms), 500):
        part = terms[i:i + 500]
        for term, blob in db.execute(f"SELECT term, entries FROM docs_champ WHERE collection_id = ? AND term IN "
                                     f"({','.join('?' * len(part))})", (cid, *part)):
            yield term, _array(blob)


def _from_fts(db, cid: int, term: str, avgdl: float) -> list[tuple[int, int, int]]:
    """A word's list from the FTS5 index. For a one-word query FTS5's own BM25 (its ``rank``, in C)
    orders the word's passages as :func:`impact` does (the same k1 and b, and the same average
    length: a passage's FTS5 tokens are its stored words); ties go to the older passage, as in
    :func:`_best`. Only the best KEEP are read back. Their term frequencies are FTS5's, recovered
    from its score (``-idf * tf * (k1 + 1) / (tf + K)`` solved for tf, with the collection's N and
    the word's df) and checked by scoring them again; a passage whose score does not match has its
    words counted from its text. Reading every posting instead (:func:`_from_postings`, the
    reference the tests compare with) was a sixth of an add's time at 100 MB."""
    from app.documents.schema import fts_tables

    words = fts_tables(cid)[0]
    ranked = db.execute(f"SELECT rowid, rank FROM {words} WHERE {words} MATCH ? ORDER BY rank, rowid LIMIT ?",
                        ('"' + term.replace('"', '""') + '"', KEEP)).fetchall()
    if not ranked:
        return []
    ids = [r[0] for r in ranked]
    length = dict(db.execute(f"SELECT id, wlen FROM docs_chunks WHERE id IN ({','.join('?' * len(ids))})", ids))
    n, = db.execute("SELECT n_chunks FROM docs_collections WHERE id = ?", (cid,)).fetchone()
    df, = db.execute("SELECT df FROM docs_df WHERE collection_id = ? AND signal = 0 AND term = ?",
                     (cid, term)).fetchone() or (0,)
    idf = math.log((n - df + 0.5) / (df + 0.5)) if df else 0.0
    idf = idf if idf > 0 else 1e-6             # FTS5's floor for a word in over half the passages
    k1 = _terms.K1
    entries, unsure = [], []
    for pid, rank in ranked:
        k = length_norm(length[pid], avgdl)
        y = -rank / idf
        tf = round(y * k / (k1 + 1 - y)) if y < k1 + 1 else 0
        if tf >= 1 and abs(idf * tf * (k1 + 1) / (tf + k) + rank) <= 1e-9 * abs(rank):
            entries.append((pid, tf, length[pid]))
        else:
            unsure.append(pid)
    if unsure:
        entries += [(pid, _terms.word_terms(f"{heading}\n{text}").count(term), length[pid])
                    for pid, heading, text in db.execute(
                        f"SELECT id, heading, text FROM docs_chunks WHERE id IN ({','.join('?' * len(unsure))})",
                        unsure)]
    return _best(entries, avgdl)


def _from_postings(db, cid: int, term: str, avgdl: float) -> list[tuple[int, int, int]]:
    """A word's list from every one of its postings (their term frequencies read through an
    ``fts5vocab`` table): the reference :func:`_from_fts` is tested against."""
    from app.documents.schema import fts_tables

    words = fts_tables(cid)[0]
    vocab = f"docs_vocab_{int(cid)}"
    db.execute(f"CREATE VIRTUAL TABLE IF NOT EXISTS temp.{vocab} USING fts5vocab(main, {words}, instance)")
    rows = db.execute(f"SELECT v.doc, count(*), c.wlen FROM temp.{vocab} v JOIN docs_chunks c ON c.id = v.doc "
                      f"WHERE v.term = ? GROUP BY v.doc", (term,))
    return _best(rows, avgdl)


def _write(db, cid: int, lists: dict[str, list[tuple[int, int, int]]]) -> None:
    db.executemany("INSERT OR REPLACE INTO docs_champ(collection_id, term, entries) VALUES (?, ?, ?)",
                   [(cid, t, _pack(e)) for t, e in lists.items()])


#: lists are read, merged and written this many words at a time, so the upkeep of a batch holds a
#: bounded number of lists in memory however many words are common (5,986 at 1 GB of text)
SLICE = 256


def _floors(db, cid: int, terms: Sequence[str], avgdl: float) -> dict[str, float]:
    """For each of ``terms`` that has a list: the impact a new passage must exceed to enter it (its
    worst entry's, at today's average length), or -inf for a list with room. Kept as one float per
    word (the lists are not held); the impacts of a list's entries are computed at once."""
    floors: dict[str, float] = {}
    for term, e in _each_list(db, cid, terms):
        floors[term] = float(impact(e[:, 1], e[:, 2], avgdl).min()) if len(e) >= KEEP else -math.inf
    return floors


def added(db, cid: int, passages: Sequence[tuple[int, str]]) -> None:
    """Merge newly stored passages ((id, their stored word terms)) into the lists, after their
    FTS5 rows, docs_df and the collection's counts are written (same transaction).

    A new passage has a larger id than every stored one, so it enters a full list only with an
    impact above the list's worst entry (a tie goes to the older passage): only those entries are
    kept while the batch is read, and only the lists they enter are read again and rewritten,
    SLICE at a time (as arrays: merging lists as Python tuples was a third of the writer's time
    at 1 GB of text). Memory is bounded by the batch and SLICE, not by the number of common words
    times KEEP (merging every touched list at once held 241 MB at 1 GB of text:
    docs/bench-log/2026-12-04.md)."""
    common = _common(db, cid)
    if not common:
        return
    avgdl = _avgdl(db, cid)
    keys = common.keys()
    touched: set[str] = set()
    for _, words in passages:
        touched |= keys & set(words.split())
    floors = _floors(db, cid, sorted(touched), avgdl)
    new: dict[str, list[tuple[int, int, int]]] = defaultdict(list)
    crossing: set[str] = set()          # words that just became common: their lists come from FTS5
    for pid, words in passages:
        split = words.split()
        tf = Counter(split)
        hit = keys & tf.keys()
        if not hit:
            continue
        length = len(split)
        norm = length_norm(length, avgdl)
        for t in hit:
            floor = floors.get(t)
            if floor is None:
                crossing.add(t)
            elif impact_at(tf[t], norm) > floor:
                new[t].append((pid, tf[t], length))
    terms = sorted(new)
    for i in range(0, len(terms), SLICE):
        part = terms[i:i + SLICE]
        old = _read_arrays(db, cid, part)
        _write(db, cid, {t: _best_array(np.concatenate((old[t], np.array(new.pop(t), dtype=np.int64))), avgdl)
                         for t in part})
    crossing_terms = sorted(crossing)
    for i in range(0, len(crossing_terms), SLICE):
        _write(db, cid, {t: _from_fts(db, cid, t, avgdl) for t in crossing_terms[i:i + SLICE]})


def removed(db, cid: int, ids: set[int], terms: Iterable[str]) -> None:
    """Drop removed passages (their ids and word terms) from the lists, after their FTS5 rows and
    docs_df are updated (same transaction)."""
    terms = set(terms)
    old = read(db, cid, list(terms))
    if not old:
        return
    common = _common(db, cid, old)
    avgdl = _avgdl(db, cid)
    gone = [t for t in old if t not in common]
    lists = {}
    for t, entries in old.items():
        if t not in common:
            continue
        kept = [e for e in entries if e[0] not in ids]
        if len(kept) == len(entries):
            continue
        lists[t] = kept if len(kept) >= KEEP // 2 or len(kept) >= common[t] else _from_fts(db, cid, t, avgdl)
    db.executemany("DELETE FROM docs_champ WHERE collection_id = ? AND term = ?", [(cid, t) for t in gone])
    _write(db, cid, lists)


def build_missing(db, cid: int) -> int:
    """Give every common word without a list its list (a database written before lists existed);
    returns how many were built. Inside the caller's transaction."""
    common = _common(db, cid)
    have = {r[0] for r in db.execute("SELECT term FROM docs_champ WHERE collection_id = ?", (cid,))}
    avgdl = _avgdl(db, cid)
    missing = sorted(t for t in common if t not in have)
    for i in range(0, len(missing), SLICE):
        _write(db, cid, {t: _from_fts(db, cid, t, avgdl) for t in missing[i:i + SLICE]})
    return len(missing)


def candidates(lists: dict[str, list[tuple[int, int, int]]], idf: dict[str, float], avgdl: float,
               limit: int) -> list[int]:
    """The ``limit`` passages of these lists with the largest BM25 summed over the lists that hold them."""
    score: dict[int, float] = defaultdict(float)
    for t, entries in lists.items():
        w = idf[t]
        for pid, tf, length in entries:
            score[pid] += w * impact(tf, length, avgdl)
    return sorted(score, key=lambda p: (-score[p], p))[:limit]
