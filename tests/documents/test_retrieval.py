"""Retrieval quality on the test corpus (58 questions, each with the passage
that answers it): the figures in docs/bench-log/2026-12-03.md, "Documents"."""
from __future__ import annotations

from corpus_tools import questions
from retrieval_eval import corpus_index, evaluate

from app.documents.retrieve import search


def test_recall_and_mrr(corpus_dir):
    index = corpus_index(corpus_dir)
    qs = questions()
    assert len(qs) == 58 and len(index) == 45
    bm25, hybrid = evaluate(index, qs, "bm25"), evaluate(index, qs, "hybrid")
    print("\nbm25", bm25["recall@3"], bm25["mrr"], "hybrid", hybrid["recall@3"], hybrid["mrr"])
    assert bm25["recall@3"] >= 0.948 and bm25["mrr"] >= 0.864
    assert hybrid["recall@3"] >= 0.965 and hybrid["mrr"] >= 0.895
    assert hybrid["recall@3"] > bm25["recall@3"] and hybrid["mrr"] > bm25["mrr"]
    assert evaluate(index, qs, "hybrid", k=5)["recall@5"] == 1.0
    ngram = evaluate(index, qs, "ngram")       # one signal alone still reranks every chunk of a small collection
    assert ngram["recall@3"] >= 0.982 and ngram["mrr"] >= 0.896


def test_the_ngram_signal_matches_other_word_forms(corpus_dir):
    index = corpus_index(corpus_dir)
    # "antibiotics" is nowhere; "allergic" shares 4-grams with "ALLERGIES" only
    q = "Is she allergic to any antibiotics?"
    assert not any("Penicillin" in h.chunk.text for h in search(index, q, k=3, mode="bm25"))
    assert "Penicillin causes a rash" in search(index, q, k=1, mode="hybrid")[0].chunk.text
