"""Ask a question about a collection: retrieve, build the prompt, hand it to
the engine (which reuses the document prefix's saved state), and cite.

Citations: the model is asked to write ``[n]`` after each fact. Markers it
writes for passages it was given are kept ("model"). A sentence of the
answer without a marker that shares most of its words with one passage gets
that passage's marker appended ("match"; small models rarely cite by
themselves). Each citation carries the file, page, heading, offsets and the
exact passage text.
"""
from __future__ import annotations

import re
import time
from dataclasses import asdict, dataclass, field
from typing import Iterator

from app.documents.terms import word_terms
from app.documents.prompt import Estimate, Passage, prepare_question, question_turn
from app.documents.store import DocumentStore
from app.chat.stream_parser import ToolCall
from app.chat.turn import TurnRequest, logprobs_content
from app.events import PromptProgress, Reasoning, Text, ToolCallMade, TurnDone
from app.sampling import SamplingParams

_MARKER = re.compile(r"\[(\d{1,3}(?:\s*,\s*\d{1,3})*)\]")


@dataclass
class Citation:
    n: int
    file: str
    path: str
    page: int | None
    heading: str
    start: int
    end: int
    passage: str
    file_id: int
    chunk_id: int
    source: str = "model"    #: "model" (the model wrote the marker) or "match" (added by word overlap)

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass
class Answer:
    text: str                      #: the answer with its citation markers
    model_text: str                #: what the model wrote (its answer; the thinking trace is ``reasoning``)
    citations: list[Citation]
    passages: list[Citation]       #: every passage the model was given
    reason: str
    prompt_tokens: int             #: tokens evaluated for this answer (prefix and question)
    reused_tokens: int
    prefix_state: str              #: "restored", "partial" (a saved state's common beginning), "saved",
    #: "held", "refused: ...", "off", "remote" (TurnDone.prefix_state)
    passage_tokens: int
    budget: int
    whole_collection: bool
    seconds: float
    tokens: list[int] = field(default_factory=list)
    error: str | None = None
    reasoning: str = ""
    prompt_ids: list[int] = field(default_factory=list)
    passages_s: float = 0.0        #: choosing the passages (search and prompt)
    ttft_s: float | None = None    #: question to first answer token (passages, prefill, first token)
    tool_calls: list[ToolCall] = field(default_factory=list)   #: calls the model made (name, index, arguments)
    logprobs: list[dict] | None = None   #: when asked: each token's, as the server's ``logprobs.content``

    def as_dict(self) -> dict:
        d = asdict(self)
        d["citations"] = [c.as_dict() for c in self.citations]
        d["passages"] = [c.as_dict() for c in self.passages]
        return d


def _citation(p: Passage, source: str = "model") -> Citation:
    c = p.chunk
    return Citation(p.n, c.file_name, c.path, c.page, c.heading, c.start, c.end, c.text, c.file_id, c.id, source)


def cite(text: str, passages: list[Passage]) -> tuple[str, list[Citation]]:
    """The answer with markers, and the passages it cites in order of first mention."""
    by_n = {p.n: p for p in passages}
    order: dict[int, str] = {}
    out = []
    pieces = re.split(r"(?<=[.!?])(\s+)", text)
    terms = {p.n: set(word_terms(p.chunk.text)) for p in passages}
    for piece in pieces:
        if not piece.strip():
            out.append(piece)
            continue
        marks = [int(n) for m in _MARKER.finditer(piece) for n in m.group(1).split(",") if int(n) in by_n]
        for n in marks:
            order.setdefault(n, "model")
        if not marks and passages:
            words = set(word_terms(piece))
            if len(words) >= 2:
                best, n = max((len(words & terms[p.n]), p.n) for p in passages)
                if best >= 2 and best >= 0.5 * len(words):
                    order.setdefault(n, "match")
                    m = re.search(r"[.!?]*\s*$", piece)
                    piece = piece[:m.start()] + f" [{n}]" + piece[m.start():]
        out.append(piece)
    return "".join(out), [_citation(by_n[n], src) for n, src in order.items()]


class DocumentChat:
    """Questions about collections, answered by ``engine`` through the one door (``app.engine.door``):
    a local engine service (given saved prefix states, it reads a collection's passages once and
    restores them for later questions: ``TurnRequest.keep_prefix``) or a server (an OpenAI-compatible
    one the user named). Retrieval stays on this machine either way: only the passages chosen and the
    question go to the engine, as the system and user messages. Where the model's tokenizer is not here
    (a server) the passages' tokens are estimated (four characters a token) against the budget."""

    def __init__(self, engine, store: DocumentStore):
        self.engine = engine
        self.store = store

    def ask(self, collection: str, question: str, *, budget: int | None = None, params: SamplingParams | None = None,
            max_tokens: int | None = None, mode: str = "hybrid", request: TurnRequest | None = None
            ) -> Iterator[PromptProgress | Reasoning | Text | ToolCallMade | Answer]:
        """The engine's events for the question, then the ``Answer``. ``request`` carries the turn's
        options (thinking, routing, max_tokens...); its messages are replaced by the passages and the
        question."""
        t0 = time.monotonic()
        request = request or TurnRequest(messages=[], max_tokens=256)
        if params is not None:
            request.sampling = params
        if max_tokens is not None:
            request.max_tokens = max_tokens
        request.client = "documents"
        budget = int(budget or self.store.collection(collection).budget)
        counter = self.engine if self.engine.tokenizer is not None else Estimate
        q = question_turn(counter, self.store.index(collection), question, budget, mode=mode, request=request)
        stream = prepare_question(q, self.engine.submit)
        passages_s = time.monotonic() - t0
        end: TurnDone | None = None
        for ev in stream:
            if isinstance(ev, (PromptProgress, Reasoning, Text, ToolCallMade)):
                yield ev
            elif isinstance(ev, TurnDone):
                end = ev
        assert end is not None
        yield _answer(end, q.passages, t0=t0, turn_at=passages_s, tokenizer=self.engine.tokenizer,
                      logprobs=request.top_logprobs is not None,
                      prompt_tokens=end.prompt_tokens - end.reused_tokens, reused_tokens=end.reused_tokens,
                      prefix_state=end.prefix_state or "off", passage_tokens=q.passage_tokens, budget=budget,
                      whole_collection=q.whole_collection, passages_s=passages_s)


def _answer(end: TurnDone, passages: list[Passage], *, t0: float, turn_at: float, tokenizer=None,
            logprobs: bool = False, **figures) -> Answer:
    """The ``Answer`` of a finished turn over ``passages``: its text with citation markers, and its figures
    (``logprobs``: with each token's, spelled by ``tokenizer``, or by the bytes a remote engine sent)."""
    text, citations = cite(end.content, passages)
    return Answer(text=text, model_text=end.content, citations=citations, passages=[_citation(p) for p in passages],
                  reason=end.reason, seconds=time.monotonic() - t0, tokens=end.token_ids, error=end.error,
                  reasoning=end.reasoning, prompt_ids=end.prompt_ids,
                  ttft_s=None if end.ttft_s is None else turn_at + end.ttft_s, tool_calls=list(end.tool_calls),
                  logprobs=logprobs_content(end.logprobs, tokenizer) if logprobs else None, **figures)
