"""Ranking: BM25 over words, optionally fused with BM25 over character
4-grams (the second signal; measured in docs/bench-log/2026-12-03.md, "Documents")."""
from __future__ import annotations

from dataclasses import dataclass

from app.documents.index import FtsIndex, IndexedChunk
from app.documents.terms import ngram_terms, word_terms

#: weight of the n-gram signal (each signal is divided by its best score first); equal
#: weights, not tuned: see docs/bench-log/2026-12-03.md for the sweep
NGRAM_WEIGHT = 1.0
MODES = ("hybrid", "bm25", "ngram")


@dataclass
class Hit:
    chunk: IndexedChunk
    score: float
    bm25: float
    ngram: float


def search(index: FtsIndex, question: str, k: int = 5, mode: str = "hybrid",
           ngram_weight: float = NGRAM_WEIGHT) -> list[Hit]:
    """The best ``k`` passages (every candidate with k=0) for ``question``."""
    if mode not in MODES:
        raise ValueError(f"unknown search mode '{mode}' (known: {', '.join(MODES)})")
    scored = index.score(word_terms(question) if mode != "ngram" else [],
                         ngram_terms(question) if mode != "bm25" else [])
    top_w = max((w for _, w, _ in scored), default=0.0) or 1.0
    top_g = max((g for _, _, g in scored), default=0.0) or 1.0
    hits = []
    for chunk, w, g in scored:
        if w <= 0 and g <= 0:
            continue
        if mode == "bm25":
            score = w
        elif mode == "ngram":
            score = g
        else:
            score = w / top_w + ngram_weight * g / top_g
        hits.append(Hit(chunk, score, w, g))
    hits.sort(key=lambda h: (-h.score, h.chunk.file_id, h.chunk.seq))
    return hits[:k] if k else hits
