"""The shortcuts a search takes (app/documents/index.py) give what the long way gives: an intersection
no larger than its limit, taken without FTS5 ranking it, is the ranked query's answer; a larger one is
ranked; and searching reads through a page cache of SEARCH_CACHE_KIB without shrinking a larger one."""
from __future__ import annotations

from itertools import combinations

import pytest

from app.documents import index as index_mod
from app.documents.terms import ngram_terms, word_terms
from app.documents.retrieve import search
from app.documents.store import DocumentStore
from app.store.crypto import EphemeralKeys


@pytest.fixture
def store(corpus_dir, tmp_path):
    s = DocumentStore(tmp_path / "ferry.db", EphemeralKeys())
    s.add("x", [corpus_dir], workers=1)
    yield s
    s.close()


def _ranked(idx, words, limit: int) -> list[int]:
    table = idx._words
    match = " AND ".join(f'"{w}"' for w in words)
    return [r[0] for r in idx._db.execute(f"SELECT rowid FROM {table} WHERE {table} MATCH ? ORDER BY rank LIMIT ?",
                                          (match, limit))]


def test_an_intersection_within_its_limit_is_the_ranked_answer(store):
    idx = store.index("x")
    words = list(dict.fromkeys(word_terms("the monthly rent deposit payment landlord tenant repairs notice")))
    df = idx._df("words", words)
    words = [w for w in words if df[w]]
    assert len(words) >= 6
    small = large = 0
    for n in (1, 2, 3):
        for group in combinations(words, n):
            for limit in (1, 2, 5, 25):
                got, want = idx._all_of(group, limit), _ranked(idx, group, limit)
                held = len(_ranked(idx, group, 10**6))
                if held <= limit:
                    small += 1
                    assert sorted(got) == sorted(want) and len(got) == held, group
                else:
                    large += 1
                    assert got == want, group
    assert small > 20 and large > 20        # both ways were taken


def test_search_reads_through_a_larger_page_cache(store):
    db = store.db
    db.execute("PRAGMA cache_size = -2000")
    search(store.index("x"), "monthly rent")
    assert db.execute("PRAGMA cache_size").fetchone()[0] == -index_mod.SEARCH_CACHE_KIB
    db.execute(f"PRAGMA cache_size = -{2 * index_mod.SEARCH_CACHE_KIB}")     # a larger one is kept
    store.index("x")
    assert db.execute("PRAGMA cache_size").fetchone()[0] == -2 * index_mod.SEARCH_CACHE_KIB


def test_the_ngram_candidates_come_from_the_words_sharing_the_rarest_4grams(store):
    """A misspelt word is in no passage: its rarest 4-grams lead to the indexed words that share them
    (docs_gramvocab), and FTS5 ranks those words' passages."""
    idx = store.index("x")
    grams = list(dict.fromkeys(ngram_terms("penicilin")))          # one l short
    assert not idx._df("words", ["penicilin"])["penicilin"]
    chosen = index_mod._rarest(grams, idx._df("grams", grams), index_mod.CANDIDATE_GRAMS)
    words = idx._gram_words(chosen)
    assert words[0] == index_mod.stem("penicillin")
    ids = idx._candidates(words, 25)
    holding = _ranked(idx, words[:1], 25)
    assert holding and set(holding) <= set(ids)
    hits = search(idx, "Is the patient allergic to penicilin?", k=3)
    assert any("Penicillin" in h.chunk.text for h in hits)


