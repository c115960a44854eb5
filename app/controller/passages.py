"""A conversation's documents in a turn (no Qt): the best passages go into the
request as content, and an answer's ``[n]`` markers become ``cite:n`` links.

``PassageSearch(store, collection, question)`` is sent with a turn to the
engine thread, which searches there (through a connection of its own) and
calls :func:`attach_passages` with the model it has open: passages are
counted with that model's own tokenizer (a remote engine's: an estimate), the
same count ``ferry docs ask`` makes. The GUI thread never waits for a search.

As in ``ferry docs ask``, everything before the question (the passages) is marked
as a prefix to keep (``TurnRequest.keep_prefix``), and the window's local engine
is given the document store's saved prefix states (:func:`keep_prefixes`): the
passages are read once, then held or restored for the next question on them.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from app.api import EngineService, StateCache, TurnRequest
from app.documents.ask import Citation, _citation, cite
from app.documents.prompt import MAX_PASSAGES, Passage, passage_cost, passages_message, select_passages
from app.documents.store import DocumentError, DocumentStore


@dataclass(frozen=True)
class PassageSearch:
    """A turn's documents, searched on the engine's thread (``EngineWorker.generate``) rather than the
    window's: ``store`` is the window's store (its file and key); the search runs through a clone of it
    that the engine thread keeps (its page cache stays warm from one question to the next)."""

    store: DocumentStore
    collection: str | tuple[str, ...]     #: the chat's collections: its own files and those attached to it
    question: str

    def attach(self, request: TurnRequest, store: DocumentStore, model) -> list[Citation]:
        return attach_passages(request, store, self.collection, model, self.question)


def keep_prefixes(engine, store: DocumentStore) -> None:
    """Give a local engine (``EngineService``) without saved prefix states ``store``'s (its states key,
    as ``ferry docs ask`` does), so a document question's passages are read once and restored for the
    questions after it. A remote engine keeps prefixes its own way; an engine that has states keeps them."""
    if isinstance(engine, EngineService) and engine.states is None:
        engine.states = StateCache(store.keys.states)


def attach_passages(request: TurnRequest, store: DocumentStore, collection: str | tuple[str, ...], model,
                    question: str) -> list[Citation]:
    """Put the best passages for ``question`` of one collection (or several: a chat's own files and the
    collections attached to it) into ``request.messages`` (in the system message, as content), within
    the token budget counted with ``model.tokenizer`` (the open model, or
    ``app.documents.prompt.Estimate``): one collection's budget; for several, each collection's best
    within its budget, then the highest-scoring of all within the largest budget; the request then
    keeps its prefix (``keep_prefix``). Returns the numbered passages, for :func:`link_markers` and
    citations."""
    names = [collection] if isinstance(collection, str) else list(collection)
    found: list[tuple[object, float, int]] = []   # chunk, score, collection order
    budget = 0
    for order, name in enumerate(names):
        try:
            coll = store.collection(name)
        except DocumentError:
            continue
        budget = max(budget, coll.budget)
        found += [(c, s, order) for c, s in select_passages(model, store.index(name), question, coll.budget)[0]]
    if len(names) > 1 and found:
        kept, used = [], 0
        for c, s, order in sorted(found, key=lambda x: -x[1]):
            cost = passage_cost(model, c)
            if used + cost <= budget and len(kept) < MAX_PASSAGES:
                kept.append((c, s, order))
                used += cost
        found = sorted(kept, key=lambda x: (x[2], x[0].file_id, x[0].seq))
    chosen = [(c, s) for c, s, _ in found]
    if not chosen:
        return []
    passages = [Passage(i + 1, c, s, 0) for i, (c, s) in enumerate(chosen)]
    block = passages_message(passages)   # the same system message as `ferry docs ask`
    messages = [dict(m) for m in request.messages]
    if messages and messages[0].get("role") == "system":
        messages[0]["content"] = f"{messages[0]['content']}\n\n{block}"
    else:
        messages.insert(0, {"role": "system", "content": block})
    request.messages = messages
    request.keep_prefix = True          # the passages before the question: read once, then kept
    return [_citation(p) for p in passages]


def mark_citations(text: str, citations: list[Citation]) -> tuple[str, list[Citation]]:
    """The answer with its ``[n]`` markers (added where a sentence matches a passage), and the
    citations used, in order of first mention: what the window shows and exports keep."""
    from app.documents.index import IndexedChunk

    passages = [Passage(c.n, IndexedChunk(c.chunk_id, c.file_id, c.file, c.path, c.page, c.heading, c.start, c.end,
                                          c.passage, 0), 0.0, 0) for c in citations]
    return cite(text, passages)


def link_markers(text: str, citations: list[Citation]) -> tuple[str, list[Citation]]:
    """The answer (Markdown) with its ``[n]`` markers as ``cite:n`` links
    (markers added where a sentence matches a passage), and the citations used."""
    marked, used = mark_citations(text, citations)
    valid = {c.n for c in citations}
    linked = re.sub(r"\[(\d{1,3})\]", lambda m: f"[\\[{m.group(1)}\\]](cite:{m.group(1)})"
                    if int(m.group(1)) in valid else m.group(0), marked)
    return linked, used
