"""The prompt of a question about documents.

Passages are chosen to fit a token budget (the user's, shown in the app and
``--context-tokens`` on the command line), numbered, and put in the system
message; the question is the user message. The model's chat format (the one
turn pipeline's ``ChatFormat``: K3's renderer, a Jinja template, or plain
text) renders both as *content* segments, so a document can never produce a
control token or a fake turn: ``<|im_start|>system`` in a file is tokenized
as the text it is.

Everything before the question's segment is the *document prefix*. It does
not depend on the question when the whole collection fits in the budget
(then every passage is included, in document order), or when two questions
select the same passages (the selection is put in document order too), so
its session state can be saved once and restored (app/engine/states.py).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence, TypeVar

from app.chat.segments import Segment
from app.chat.turn import ChatFormat, Prepared, TurnError, TurnRequest
from app.documents.index import IndexedChunk, FtsIndex
from app.documents.retrieve import search

T = TypeVar("T")

INSTRUCTIONS = (
    "Answer the question using only the numbered passages below, which come from the user's own documents. "
    "After each fact, cite the passage it comes from with its number in square brackets, like [1]. "
    "If the passages do not answer the question, say that the documents do not say.")
#: most passages in one prompt
MAX_PASSAGES = 24


class EstimatedTokens:
    """Counts a passage's tokens where the model's tokenizer is not on this
    machine (a remote engine): four characters a token, an estimate."""

    @staticmethod
    def encode_content(text: str) -> list[int]:
        return [0] * (len(text) // 4 + 1)


class Estimate:
    """Stands for the model in :func:`select_passages` when it is a remote engine's."""

    tokenizer = EstimatedTokens()


@dataclass
class Passage:
    n: int
    chunk: IndexedChunk
    score: float
    tokens: int

    def label(self) -> str:
        where = self.chunk.file_name + (f", page {self.chunk.page}" if self.chunk.page is not None else "")
        if self.chunk.heading:
            where += f", {self.chunk.heading}"
        return where


@dataclass
class DocPrompt:
    prepared: Prepared              #: the turn, ready for the engine
    segments: list[Segment]
    ids: list[int]
    prefix_ids: list[int] | None    #: the question-independent part of ``ids`` (None: not cacheable)
    passages: list[Passage]
    whole_collection: bool
    passage_tokens: int
    budget: int


def format_passage(n: int, chunk: IndexedChunk) -> str:
    where = chunk.file_name + (f", page {chunk.page}" if chunk.page is not None else "")
    if chunk.heading:
        where += f" — {chunk.heading}"
    return f"[{n}] ({where})\n{chunk.text}"


def _overlaps(a: IndexedChunk, b: IndexedChunk) -> bool:
    if a.file_id != b.file_id or a.page != b.page:
        return False
    inter = min(a.end, b.end) - max(a.start, b.start)
    return inter > 0.5 * min(a.end - a.start, b.end - b.start)


def passage_cost(model, chunk: IndexedChunk) -> int:
    """The tokens a passage takes in the prompt (counted with ``model.tokenizer``)."""
    return len(model.tokenizer.encode_content(format_passage(99, chunk) + "\n\n"))


def select_passages(model, index: FtsIndex, question: str, budget: int, mode: str = "hybrid"
                    ) -> tuple[list[tuple[IndexedChunk, float]], bool, int]:
    """(chunks with scores in prompt order, whole collection?, their tokens)."""
    count = lambda c: passage_cost(model, c)  # noqa: E731
    hits = search(index, question, k=0, mode=mode)
    scores = {h.chunk.id: h.score for h in hits}
    costs = {}
    total = 0
    head = index.head(MAX_PASSAGES + 1) if len(index) <= MAX_PASSAGES else []
    for c in head:
        costs[c.id] = count(c)
        total += costs[c.id]
        if total > budget:
            break
    if len(index) <= MAX_PASSAGES and total <= budget:
        return [(c, scores.get(c.id, 0.0)) for c in head], True, total
    chosen: list[tuple[IndexedChunk, float]] = []
    used = 0
    for h in hits:
        if h.score <= 0 or len(chosen) >= MAX_PASSAGES:
            break
        cost = costs.get(h.chunk.id) or count(h.chunk)
        if used + cost > budget or any(_overlaps(h.chunk, c) for c, _ in chosen):
            continue
        chosen.append((h.chunk, h.score))
        used += cost
    chosen.sort(key=lambda cs: (cs[0].file_id, cs[0].seq))
    return chosen, False, used


def passages_message(passages: Sequence[Passage], instructions: str = INSTRUCTIONS) -> str:
    """The system message that carries the numbered passages."""
    body = "\n\n".join(format_passage(p.n, p.chunk) for p in passages) or "(no passage matches the question)"
    return f"{instructions}\n\nPassages:\n\n{body}"


@dataclass
class Question:
    """A question about a collection as a turn: the request (the passages as its system message, the
    question as the user's), and the passages chosen for it."""

    request: TurnRequest
    passages: list[Passage]
    whole_collection: bool
    passage_tokens: int
    budget: int
    system: str
    question: str


def question_turn(model, index: FtsIndex, question: str, budget: int, *, mode: str = "hybrid",
                  instructions: str = INSTRUCTIONS, request: TurnRequest | None = None) -> Question:
    """The passages for ``question`` within ``budget`` (counted by ``model``'s tokenizer: a loaded
    model, an engine, or ``Estimate``) and ``request`` (sampling, thinking...) carrying them, its
    prefix (everything before the question) marked to be kept."""
    chosen, whole, used = select_passages(model, index, question, budget, mode)
    passages = [Passage(i + 1, c, s, 0) for i, (c, s) in enumerate(chosen)]
    system = passages_message(passages, instructions)
    request = request or TurnRequest(messages=[])
    request.messages, request.keep_prefix = passage_messages(system, question), True
    return Question(request, passages, whole, used, budget, system, question)


def prepare_question(q: Question, prepare: Callable[[TurnRequest], T]) -> T:
    """``prepare(q.request)`` (a chat format's prepare, or an engine's submit); for a template without
    a system role, again with the passages and the question in one user message (no prefix kept)."""
    try:
        return prepare(q.request)
    except TurnError as exc:
        if not without_system_role(exc):
            raise
        q.request.messages, q.request.keep_prefix = merged_message(q.system, q.question), False
        return prepare(q.request)


def build_prompt(model, index: FtsIndex, question: str, budget: int, *, mode: str = "hybrid",
                 instructions: str = INSTRUCTIONS, request: TurnRequest | None = None,
                 n_ctx: int | None = None) -> DocPrompt:
    """The prompt ``question_turn`` makes, prepared by ``model``'s chat format (what a local engine reads)."""
    q = question_turn(model, index, question, budget, mode=mode, instructions=instructions, request=request)
    fmt = ChatFormat(model)
    n_ctx = n_ctx or model.engine.info.max_ctx
    prepared = prepare_question(q, lambda r: fmt.prepare(r, n_ctx=n_ctx))
    ids = prepared.prompt
    prefix_ids = ids[:prepared.prefix_len] if prepared.prefix_len else None
    return DocPrompt(prepared, prepared.segments, ids, prefix_ids, q.passages, q.whole_collection,
                     q.passage_tokens, budget)


def passage_messages(system: str, question: str) -> list[dict]:
    """The passages as the system message, the question as the user's (their prefix can be kept)."""
    return [{"role": "system", "content": system}, {"role": "user", "content": question}]


def merged_message(system: str, question: str) -> list[dict]:
    """For a template without a system role: one user message holding the passages and the question."""
    return [{"role": "user", "content": f"{system}\n\nQuestion: {question}"}]


def without_system_role(exc: TurnError) -> bool:
    """``exc`` says the template refused the system message (not that the prompt is too long)."""
    return exc.param == "messages" and "context holds" not in exc.message


def content_only(segments: Sequence[Segment], texts: Sequence[str]) -> bool:
    """Whether each of ``texts`` appears only inside content segments."""
    return all(not any(t in s for s, is_markup in segments if is_markup) for t in texts)
