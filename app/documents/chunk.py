"""Cut an extracted document into passages for retrieval.

* A chunk never crosses a heading or a page: a heading starts a new section,
  and its title (with the titles above it) is kept as the chunk's
  ``heading``, indexed with the chunk's words.
* Chunks are whole sentences, up to ``max_words`` words; a sentence longer
  than that is cut at word boundaries.
* Consecutive chunks of a section overlap by their last sentence(s), up to
  ``overlap_words`` words, so an answer that straddles a boundary is whole
  in one of them.
* Every chunk's text is exactly ``page_text[start:end]``: the passage shown
  and highlighted is the one that was read.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from app.documents.extract import Extracted

MAX_WORDS = 110
OVERLAP_WORDS = 30
#: A "word" longer than this (a file without spaces, a base64 blob) is cut into pieces this long,
#: and a chunk holds at most MAX_CHUNK_CHARS characters (its overlap at most a quarter of that), so
#: a file of any shape becomes passages of bounded size. Real text never reaches either.
MAX_WORD_CHARS = 1_000
MAX_CHUNK_CHARS = 8_000

_ABBREV = {"mr", "mrs", "ms", "dr", "prof", "st", "no", "nos", "vs", "etc", "e.g", "i.e", "inc", "ltd", "co",
           "jr", "sr", "approx", "dept", "fig", "ref", "art", "sec", "p", "pp", "vol", "mg", "ml", "u.s", "a.m",
           "p.m", "jan", "feb", "mar", "apr", "jun", "jul", "aug", "sep", "sept", "oct", "nov", "dec"}
_END = re.compile(r"[.!?…]+[\"')\]]*(?=\s+|$)")


@dataclass(frozen=True)
class Chunk:
    page: int | None
    heading: str
    start: int          #: offset in the page's text
    end: int
    text: str           #: page_text[start:end]
    seq: int = 0        #: order within the file


def sentence_spans(text: str, base: int = 0) -> list[tuple[int, int]]:
    """(start, end) of each sentence of ``text``, offset by ``base``."""
    spans = []
    start = 0
    for m in _END.finditer(text):
        end = m.end()
        dot = m.start()
        following = text[end:end + 3].lstrip()
        if text[dot] == ".":
            # the run of word characters and dots before the full stop ("e.g", "Dr"), within the sentence
            k = dot
            while k > start and (text[k - 1].isalnum() or text[k - 1] in "._"):
                k -= 1
            if k < dot and text[k:dot].lower().rstrip(".") in _ABBREV:
                continue
            if dot > 0 and text[dot - 1].isdecimal() and following[:1].isdigit():
                continue
        if following and following[0].islower():
            continue
        spans.append((start, end))
        start = end
        while start < len(text) and text[start].isspace():
            start += 1
    if start < len(text) and text[start:].strip():
        spans.append((start, len(text.rstrip())))
    return [(base + a, base + b) for a, b in spans if b > a]


def _word_cut(text: str, a: int, b: int, max_words: int) -> list[tuple[int, int]]:
    """Split the span [a, b) of ``text`` into pieces of at most max_words words."""
    words = [(s, min(s + MAX_WORD_CHARS, e)) for m in re.finditer(r"\S+", text[a:b])
             for e in (m.end() + a,) for s in range(m.start() + a, e, MAX_WORD_CHARS)]
    out = []
    i = 0
    while i < len(words):
        j = i + 1       # up to max_words words and MAX_CHUNK_CHARS characters (at least one word)
        while j < len(words) and j - i < max_words and words[j][1] - words[i][0] <= MAX_CHUNK_CHARS:
            j += 1
        out.append((words[i][0], words[j - 1][1]))
        i = j
    return out


def _nwords(text: str) -> int:
    return len(text.split())


def chunk_document(doc: Extracted, *, max_words: int = MAX_WORDS, overlap_words: int = OVERLAP_WORDS) -> list[Chunk]:
    chunks: list[Chunk] = []
    titles: list[tuple[int, str]] = []      # the heading path: (level, text)
    for page in doc.pages:
        text = page.text
        pos = 0
        sections: list[tuple[str, list[tuple[int, int]]]] = []
        current: list[tuple[int, int]] = []
        heading = " > ".join(t for _, t in titles)
        pending_heading: tuple[int, int] | None = None
        for block in page.blocks:
            b_start = pos
            pos += len(block.text) + 2
            if block.kind == "heading":
                if current:
                    sections.append((heading, current))
                elif pending_heading is not None:
                    sections.append((heading, [pending_heading]))   # a heading with nothing under it
                current = []
                titles = [t for t in titles if t[0] < block.level] + [(block.level, block.text)]
                heading = " > ".join(t for _, t in titles)
                pending_heading = (b_start, b_start + len(block.text))
                continue
            pending_heading = None
            for a, b in sentence_spans(block.text, b_start):
                if b - a > MAX_CHUNK_CHARS or _nwords(text[a:b]) > max_words:
                    current.extend(_word_cut(text, a, b, max_words))
                else:
                    current.append((a, b))
        if current:
            sections.append((heading, current))
        elif pending_heading is not None:
            sections.append((heading, [pending_heading]))
        for head, sents in sections:
            i = 0
            while i < len(sents):
                j = i
                words = 0
                while j < len(sents) and (j == i or (words + _nwords(text[sents[j][0]:sents[j][1]]) <= max_words
                                                     and sents[j][1] - sents[i][0] <= MAX_CHUNK_CHARS)):
                    words += _nwords(text[sents[j][0]:sents[j][1]])
                    j += 1
                a, b = sents[i][0], sents[j - 1][1]
                chunks.append(Chunk(page.number, head, a, b, text[a:b], len(chunks)))
                if j >= len(sents):
                    break
                # overlap: step back over the last sentences that fit in overlap_words
                k, back = j, 0
                while (k - 1 > i and back + _nwords(text[sents[k - 1][0]:sents[k - 1][1]]) <= overlap_words
                       and sents[j - 1][1] - sents[k - 1][0] <= MAX_CHUNK_CHARS // 4):
                    back += _nwords(text[sents[k - 1][0]:sents[k - 1][1]])
                    k -= 1
                i = k
    return chunks
