"""Ask a question about a collection: retrieve, build the prompt, reuse the
document prefix's saved state, generate, and cite.

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

from app.documents.index import word_terms
from app.documents.prompt import DocPrompt, Estimate, Passage, build_prompt, passages_message, select_passages
from app.documents.states import StateCache, StateError, model_fingerprint, shared_prefix
from app.documents.store import DocumentStore
from app.engine.binding import FerryError
from app.chat.stream_parser import ToolCall
from app.chat.turn import TurnRequest, logprobs_content, run_turn
from app.events import PromptProgress, Reasoning, Text, ToolCallMade, TurnDone
from app.model import PROMPT_STEP, LoadedModel
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
    #: "held", "refused: ...", "off"
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
    """Questions about collections on one model and session (reused across questions)."""

    def __init__(self, model: LoadedModel, store: DocumentStore, *, states: StateCache | None = None,
                 n_ctx: int = 0):
        self.model = model
        self.store = store
        self.states = states
        self.session = model.new_session(n_ctx)
        self.fingerprint = model_fingerprint(model.path)

    def prompt(self, collection: str, question: str, budget: int | None = None, mode: str = "hybrid",
               request: TurnRequest | None = None) -> DocPrompt:
        coll = self.store.collection(collection)
        budget = int(budget or coll.budget)
        return build_prompt(self.model, self.store.index(collection), question, budget, mode=mode,
                            request=request, n_ctx=self.session.n_ctx)

    def ask(self, collection: str, question: str, *, budget: int | None = None, params: SamplingParams | None = None,
            max_tokens: int = 256, mode: str = "hybrid", request: TurnRequest | None = None
            ) -> Iterator[PromptProgress | Reasoning | Text | ToolCallMade | Answer]:
        """The turn pipeline's events for the question, then the ``Answer``.
        ``request`` carries the turn's options (thinking, routing...); its
        messages are replaced by the passages and the question."""
        t0 = time.monotonic()
        request = request or TurnRequest(messages=[])
        if params is not None:
            request.sampling = params
        request.max_tokens = max_tokens
        request.client = "documents"
        dp = self.prompt(collection, question, budget, mode, request)
        passages_s = time.monotonic() - t0
        session = self.session
        state = "off"
        evaluated = 0
        if dp.prefix_ids is not None and self.states is not None:
            prefix = dp.prefix_ids
            if session.tokens[:len(prefix)] == prefix:
                state = "held"
            else:
                try:
                    restored = self.states.restore(session, self.fingerprint, prefix)
                except StateError as exc:
                    restored = False
                    state = f"refused: {exc}"
                if restored:
                    state = "restored"
                else:
                    # other passages: start from the saved prefix that shares the most with this one
                    partial = None if state.startswith("refused") else self.states.longest(self.fingerprint, prefix)
                    if partial is not None and partial[1] > shared_prefix(session.tokens, prefix):
                        try:
                            session.import_state(self.states.read(partial[0], self.fingerprint))
                            state = "partial"
                        except (StateError, FerryError):
                            pass                # left as it was: the prefix is read, and saved below
                    kept = session.sync(prefix)
                    todo = prefix[kept:]
                    total = len(dp.ids) - kept
                    for i in range(0, len(todo), PROMPT_STEP):
                        session.eval(todo[i:i + PROMPT_STEP])
                        yield PromptProgress(min(i + PROMPT_STEP, len(todo)), total)
                    evaluated = len(todo)
                    self.states.save(self.fingerprint, session.export_state())
                    if not state.startswith("refused"):
                        state = "partial" if state == "partial" and kept else "saved"
        end: TurnDone | None = None
        offset = evaluated
        turn_at = time.monotonic() - t0     # passages, and the prefix read or restored
        for ev in run_turn(self.model, session, dp.prepared):
            if isinstance(ev, PromptProgress):
                yield PromptProgress(offset + ev.done, offset + ev.total)
            elif isinstance(ev, (Reasoning, Text, ToolCallMade)):
                yield ev
            elif isinstance(ev, TurnDone):
                end = ev
        assert end is not None
        yield _answer(end, dp.passages, t0=t0, turn_at=turn_at, tokenizer=self.model.tokenizer,
                      logprobs=request.top_logprobs is not None,
                      prompt_tokens=evaluated + len(dp.ids) - end.reused_tokens,
                      reused_tokens=end.reused_tokens - evaluated, prefix_state=state,
                      passage_tokens=dp.passage_tokens, budget=dp.budget, whole_collection=dp.whole_collection,
                      passages_s=passages_s)

    def close(self) -> None:
        self.session.close()


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


def ask_remote(remote, store: DocumentStore, collection: str, question: str, *, budget: int | None = None,
               mode: str = "hybrid", request: TurnRequest | None = None
               ) -> Iterator[PromptProgress | Reasoning | Text | ToolCallMade | Answer]:
    """The question answered by a remote engine (``app.engine.remote.RemoteEngine``:
    an OpenAI-compatible server the user named). Retrieval stays here: the
    collection is searched on this machine and only the passages chosen and the
    question are sent to the server, as the system and user messages a local
    answer reads. The server's tokenizer is not here, so the passages' tokens
    are estimated (four characters a token) against the budget. There is no
    document prefix state to reuse (``prefix_state`` "remote")."""
    t0 = time.monotonic()
    request = request or TurnRequest(messages=[])
    request.client = "documents"
    budget = int(budget or store.collection(collection).budget)
    chosen, whole, used = select_passages(Estimate, store.index(collection), question, budget, mode)
    passages = [Passage(i + 1, c, s, 0) for i, (c, s) in enumerate(chosen)]
    request.messages = [{"role": "system", "content": passages_message(passages)},
                        {"role": "user", "content": question}]
    passages_s = time.monotonic() - t0
    end: TurnDone | None = None
    remote.clear_cancel()
    for ev in remote.generate(request):
        if isinstance(ev, (PromptProgress, Reasoning, Text, ToolCallMade)):
            yield ev
        elif isinstance(ev, TurnDone):
            end = ev
    assert end is not None
    yield _answer(end, passages, t0=t0, turn_at=passages_s, logprobs=request.top_logprobs is not None,
                  prompt_tokens=end.prompt_tokens - end.reused_tokens,
                  reused_tokens=end.reused_tokens, prefix_state="remote", passage_tokens=used, budget=budget,
                  whole_collection=whole, passages_s=passages_s)
