"""How text becomes the index's terms (words, folded and stemmed, and their character 4-grams) and
the Okapi BM25 both signals score with: the floor the ranking (``app.documents.index``, its champion
lists ``app.documents.champions``) stands on. No database here."""
from __future__ import annotations

import functools
import math
import re
import unicodedata

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


_COMBINING: re.Pattern | None = None


def _combining_marks() -> re.Pattern:
    """One character class of every combining mark below U+10000 (unicodedata.combining), as ranges."""
    marks = [cp for cp in range(0x300, 0x10000) if unicodedata.combining(chr(cp))]
    ranges, start = [], marks[0]
    for prev, cp in zip(marks, marks[1:] + [None]):
        if cp != prev + 1:
            ranges.append(f"{chr(start)}-{chr(prev)}" if prev > start else chr(start))
            start = cp
    return re.compile("[" + "".join(ranges) + "]+")


def _fold(text: str) -> str:
    """Casefolded, without accents ("Café" -> "cafe"); ASCII text takes the fast path."""
    global _COMBINING
    text = text.casefold()
    if text.isascii():
        return text
    if _COMBINING is None:
        _COMBINING = _combining_marks()
    return _COMBINING.sub("", unicodedata.normalize("NFKD", text))


@functools.lru_cache(maxsize=200_000)
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


_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3})")


#: Longest word indexed: a longer one (a run of letters without a space) is indexed by its first
#: MAX_TOKEN_CHARS characters, in documents and questions alike, so its 4-grams are bounded.
MAX_TOKEN_CHARS = 100


def raw_words(text: str) -> list[str]:
    text = _fold(text)
    if "," in text:
        # 2,400 -> 2400 (a digit, a comma and three digits are always inside one number token)
        text = _THOUSANDS.sub("", text)
    words = _TOKEN.findall(text)
    if any(len(w) > MAX_TOKEN_CHARS for w in words):
        words = [w[:MAX_TOKEN_CHARS] for w in words]
    return words


def word_terms(text: str, raw: list[str] | None = None) -> list[str]:
    return [stem(w) for w in (raw_words(text) if raw is None else raw) if w not in STOPWORDS]


@functools.lru_cache(maxsize=200_000)
def word_grams(word: str) -> tuple[str, ...]:
    """A word's character 4-grams, with boundary marks (#)."""
    padded = f"#{word}#"
    if len(padded) <= NGRAM:
        return (padded,)
    return tuple(padded[i:i + NGRAM] for i in range(len(padded) - NGRAM + 1))


def ngram_terms(text: str, raw: list[str] | None = None) -> list[str]:
    grams: list[str] = []
    for w in (raw_words(text) if raw is None else raw):
        if w not in STOPWORDS:
            grams.extend(word_grams(w))
    return grams


@functools.lru_cache(maxsize=200_000)
def _gram_text(word: str) -> str:
    return " ".join(word_grams(word))


def terms_for(heading: str, text: str) -> tuple[str, int, str, int]:
    """A chunk's index terms as stored: (words, how many, 4-grams, how many); the same terms as
    word_terms and ngram_terms, joined through per-word caches (this runs for every passage added)."""
    raw = [w for w in raw_words(f"{heading}\n{text}") if w not in STOPWORDS]
    if not raw:
        return "", 0, "", 0
    g = " ".join(map(_gram_text, raw))
    return " ".join(map(stem, raw)), len(raw), g, g.count(" ") + 1


def _idf(df: int, n: int) -> float:
    return math.log(1.0 + (n - df + 0.5) / (df + 0.5))


def bm25(tf: int, df: int, n: int, length: int, avgdl: float) -> float:
    idf = _idf(df, n)
    return idf * tf * (K1 + 1) / (tf + K1 * (1 - B + B * length / (avgdl or 1.0)))
