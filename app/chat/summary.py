"""The "summarise" context policy: when the next turn would not fit, the
model itself summarises the oldest turns into a short note that stays in the
context (after the system prompt), instead of those turns being left out
with nothing in their place ("drop_oldest"). No Qt here: the window's engine
worker runs it before a turn; anything holding an ``EngineService`` can.

``summarise_to_fit(service, turn)`` asks the pipeline (``ChatFormat.prepare``
with "drop_oldest") which turns would be left out; when some would, it runs
one short greedy turn on the same engine — the previous note and those turns
as a transcript, with an instruction to summarise — and returns the request
with the note in place of those turns, and what the note covers. The note
and the count are kept with the answer (the caller's record), so the next
turn sends the note instead of the turns it covers and summarises again only
when the context fills up again.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable, Iterable

from app.chat.turn import TurnError, TurnRequest, text_of
from app.events import Text, TurnDone, TurnEvent
from app.sampling import SamplingParams

#: The longest summary (tokens): a short note, a small share of even a 512-token context.
SUMMARY_TOKENS = 96
#: What the model is told to do with the transcript.
INSTRUCTIONS = ("Summarise the conversation below in at most three short sentences: the facts, names, numbers "
                "and decisions a reader needs to continue it. Write only the summary.")


@dataclass(frozen=True)
class ContextSummary:
    text: str        #: the note now in the context (it includes what an earlier note said)
    covered: int     #: messages of the request (after its system prompt) that the note stands for


def transcript(messages: list[dict], previous: str = "") -> str:
    """The turns to summarise as plain text ("User: …", "Assistant: …"), after any earlier note."""
    lines = [f"Earlier summary: {previous.strip()}"] if previous.strip() else []
    for m in messages:
        who = {"user": "User", "assistant": "Assistant"}.get(m.get("role"), str(m.get("role", "")).title())
        lines.append(f"{who}: {text_of(m.get('content')).strip()}")
    return "\n\n".join(lines)


def _text(events) -> str:
    """The summary's text; "" when it was stopped or failed (the turns are then left out instead)."""
    out = []
    for ev in events:
        if isinstance(ev, Text):
            out.append(ev.text)
        elif isinstance(ev, TurnDone) and ev.reason in ("cancelled", "error"):
            return ""
    return "".join(out)


def summarise_to_fit(service, turn: TurnRequest,
                     read: Callable[[Iterable[TurnEvent]], Iterable[TurnEvent]] | None = None
                     ) -> tuple[TurnRequest, ContextSummary | None]:
    """``turn`` (context "summarise") as it fits the context: unchanged when it fits (or asks for another
    policy); else with the turns that would be left out replaced by a summary the model writes, submitted
    through the door (``app.engine.door``) of ``service``; ``read`` (the caller's, to make it cancellable)
    reads the summary's stream. The request returned asks for "drop_oldest", should the note not be enough."""
    if turn.context != "summarise" or turn.raw or not turn.messages:
        return turn, None
    fallback = dataclasses.replace(turn, context="drop_oldest")
    probe = service.prepare(fallback)
    if not probe.dropped:
        return fallback, None
    first = 1 if turn.messages[0].get("role") in ("system", "developer") else 0
    gone = turn.messages[first:first + probe.dropped]
    text = transcript(gone, turn.context_note)
    ask = _summary_request(turn, text)
    while not _fits(service, ask) and len(text) > 64:
        text = text[len(text) // 4:]     # a transcript longer than the context: its newest part
        ask = _summary_request(turn, "…" + text)
    stream = service.submit(ask)
    note = " ".join(_text(read(stream) if read is not None else stream).split())
    if not note:        # nothing written (stopped, or the model ended at once): leave the turns out
        return fallback, None
    kept = dataclasses.replace(fallback, messages=list(turn.messages[:first]) + list(turn.messages[first + probe.dropped:]),
                               context_note=note)
    return kept, ContextSummary(note, probe.dropped)


def _fits(service, ask: TurnRequest) -> bool:
    """Whether the summary request and the longest summary fit the context."""
    try:
        return len(service.prepare(ask).prompt) + SUMMARY_TOKENS < service.n_ctx
    except TurnError:
        return False


def _summary_request(turn: TurnRequest, text: str) -> TurnRequest:
    return TurnRequest(messages=[{"role": "system", "content": INSTRUCTIONS}, {"role": "user", "content": text}],
                       sampling=SamplingParams(temperature=0.0), max_tokens=SUMMARY_TOKENS, thinking=False,
                       client=f"{turn.client}:summary", context="error")
