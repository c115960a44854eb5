"""The in-memory retrieval index: BM25 over words, and BM25 over character
4-grams as the second signal. Built from decrypted chunks when a collection
is first searched; it never touches the disk (see docs/DOCUMENTS.md for why
the postings are not stored, even encrypted per term)."""
from __future__ import annotations

import math
import re
import unicodedata
from collections import Counter
from dataclasses import dataclass
from typing import Iterable, Sequence

K1 = 1.2
B = 0.75
NGRAM = 4

STOPWORDS = frozenset("""
a about above after again against all am an and any are as at be because been before being below between both
but by can could did do does doing down during each few for from further had has have having he her here hers
herself him himself his how i if in into is it its itself just me more most my myself no nor not now of off on
once only or other our ours ourselves out over own same she should so some such than that the their theirs them
themselves then there these they this those through to too under until up very was we were what when where which
while who whom why will with would you your yours yourself yourselves shall may must also per any
""".split())

_TOKEN = re.compile(r"\d+(?:[.,:/]\d+)*|[^\W\d_]+(?:['’][^\W\d_]+)?", re.UNICODE)


def _fold(text: str) -> str:
    text = unicodedata.normalize("NFKD", text.casefold())
    return "".join(c for c in text if not unicodedata.combining(c))


def stem(word: str) -> str:
    """A light English suffix stripper (plural, -ing, -ed, -ly): enough to join
    "charges"/"charged"/"charge"; the n-gram signal covers the rest."""
    w = word
    if len(w) <= 3 or w[0].isdigit():
        return w
    if w.endswith(("'s", "’s")):
        w = w[:-2]
    if w.endswith("ies") and len(w) > 4:
        w = w[:-3] + "y"
    elif w.endswith("sses"):
        w = w[:-2]
    elif w.endswith("s") and not w.endswith(("ss", "us", "is")) and len(w) > 3:
        w = w[:-1]
    for suffix in ("ingly", "edly", "ing", "ed", "ly"):
        if w.endswith(suffix) and len(w) - len(suffix) >= 3:
            w = w[:-len(suffix)]
            if len(w) > 3 and w[-1] == w[-2] and w[-1] not in "lsz":
                w = w[:-1]      # "stopped" -> "stopp" -> "stop"
            break
    if w.endswith("e") and len(w) > 4:
        w = w[:-1]              # "charge"/"charged" -> "charg"
    return w


def raw_words(text: str) -> list[str]:
    out = []
    for m in _TOKEN.finditer(_fold(text)):
        w = m.group()
        if w[0].isdigit():
            w = re.sub(r"(?<=\d),(?=\d{3})", "", w)     # 2,400 -> 2400
        out.append(w)
    return out


def word_terms(text: str) -> list[str]:
    return [stem(w) for w in raw_words(text) if w not in STOPWORDS]


def ngram_terms(text: str) -> list[str]:
    grams = []
    for w in raw_words(text):
        if w in STOPWORDS:
            continue
        padded = f"#{w}#"
        if len(padded) <= NGRAM:
            grams.append(padded)
        else:
            grams.extend(padded[i:i + NGRAM] for i in range(len(padded) - NGRAM + 1))
    return grams


class BM25:
    """Okapi BM25 over bags of terms, all in memory."""

    def __init__(self, docs: Iterable[Sequence[str]], k1: float = K1, b: float = B):
        self.k1, self.b = k1, b
        self.tfs: list[Counter] = [Counter(d) for d in docs]
        self.lengths = [sum(c.values()) for c in self.tfs]
        self.n = len(self.tfs)
        self.avgdl = (sum(self.lengths) / self.n) if self.n else 0.0
        self.postings: dict[str, list[tuple[int, int]]] = {}
        for i, tf in enumerate(self.tfs):
            for term, f in tf.items():
                self.postings.setdefault(term, []).append((i, f))

    def idf(self, term: str) -> float:
        df = len(self.postings.get(term, ()))
        return math.log(1.0 + (self.n - df + 0.5) / (df + 0.5))

    def scores(self, query: Sequence[str]) -> dict[int, float]:
        out: dict[int, float] = {}
        if not self.n:
            return out
        for term, qf in Counter(query).items():
            plist = self.postings.get(term)
            if not plist:
                continue
            idf = self.idf(term)
            for i, f in plist:
                norm = self.k1 * (1 - self.b + self.b * self.lengths[i] / (self.avgdl or 1.0))
                out[i] = out.get(i, 0.0) + idf * f * (self.k1 + 1) / (f + norm)
        return out


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


class MemoryIndex:
    """Both signals over one collection's chunks."""

    def __init__(self, chunks: list[IndexedChunk]):
        self.chunks = chunks
        fields = [f"{c.heading}\n{c.text}" for c in chunks]
        self.words = BM25(word_terms(f) for f in fields)
        self.ngrams = BM25(ngram_terms(f) for f in fields)

    def __len__(self) -> int:
        return len(self.chunks)
