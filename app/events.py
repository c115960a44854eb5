"""The events of one turn, as typed values. This module is the floor: it
imports nothing of Ferry's (the tool-call type is defined here), and every front end (the
window's worker, the CLI, the server, document Q&A) and both engines (the
local core, a remote OpenAI-compatible server) speak these types.

Two layers:

* the **engine stream** (``LoadedModel.generate``): ``ImageProgress`` per
  block of the vision tower (a prompt with images it has not read yet),
  ``PromptProgress`` per prefill chunk, ``Token`` per generated token, then one ``Finished``;
* the **turn stream** (``app.chat.turn``): ``ImageProgress``, ``PromptProgress``, ``Reasoning``
  (thinking-trace text), ``Text`` (answer text), ``ToolCallDelta`` (a call
  as it is written, where the format allows), ``ToolCallMade``,
  ``Logprob`` (one per generated token, when the request asked for
  logprobs; it comes before the text that token completes), ``LiveStats``
  (engine counters so far) and exactly one ``TurnDone``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class ToolCall:
    """A tool call the model made; ``arguments`` is JSON text, as in OpenAI's API."""

    name: str
    index: int
    arguments: str


# ---------------------------------------------------------------- engine stream

@dataclass(frozen=True)
class PromptProgress:
    """Prompt tokens read so far for this turn (one event per prefill chunk)."""

    done: int
    total: int


@dataclass(frozen=True)
class ImageProgress:
    """An image in the vision tower, before the prompt is read: ``block`` of its ``blocks``
    transformer blocks done (0: it has started), for image ``image`` of the ``images`` this
    prompt sends through the tower (1-based). An image the session or the tower's cache
    already holds sends none."""

    image: int
    images: int
    block: int
    blocks: int

    @property
    def label(self) -> str:
        """The front ends' line: "Reading the image: block 12 of 27"."""
        what = "the image" if self.images == 1 else f"image {self.image} of {self.images}"
        return f"Reading {what}: block {self.block} of {self.blocks}"


@dataclass(frozen=True)
class TokenLogprob:
    """The chosen token's log-probability and the most likely alternatives
    (log-softmax of the model's raw logits, as ``ferry eval`` prints them)."""

    logprob: float
    top: tuple[tuple[int, float], ...] = ()
    #: The tokens' bytes where no tokenizer is at hand (a remote engine: as the
    #: server sent them): the chosen token's, then each alternative's. Not
    #: compared: the ids and values are the logprob.
    token_bytes: bytes | None = field(default=None, compare=False)
    top_bytes: tuple[bytes, ...] = field(default=(), compare=False)


@dataclass(frozen=True)
class Token:
    id: int
    text: str          #: the new text this token completes (may be "")
    logprob: TokenLogprob | None = None


@dataclass(frozen=True)
class Finished:
    reason: str        #: "stop" (end token), "length", "cancelled" or "error"
    tokens: list[int]
    text: str
    prompt_tokens: int     #: tokens of the prompt that had to be evaluated
    reused_tokens: int     #: tokens of the prompt the session already held
    seconds: float
    stats: Any             #: app.engine.binding.Stats (or a remote's figures): has as_dict()
    error: str | None = None
    ttft_s: float | None = None   #: seconds from the start to the first generated token


EngineEvent = ImageProgress | PromptProgress | Token | Finished


# ---------------------------------------------------------------- turn stream

@dataclass(frozen=True)
class Reasoning:
    """Text of the thinking trace."""

    text: str


@dataclass(frozen=True)
class Text:
    """Text of the answer."""

    text: str


@dataclass(frozen=True)
class ToolCallDelta:
    """A tool call as the model writes it (K3's markup, and the JSON calls of
    Hermes/Qwen and Llama 3.1 templates written name first): first its name
    (``name`` set, ``arguments`` empty), then pieces of its JSON arguments
    (``name`` None), each leaving the pieces so far a valid JSON prefix. The
    ``ToolCallMade`` with the same ``index`` follows with the whole call; its
    arguments start with the pieces joined, unless the model's JSON went
    another way after them (``app.chat.stream_parser.unsent_arguments``)."""

    index: int
    name: str | None
    arguments: str


@dataclass(frozen=True)
class ToolCallMade:
    call: ToolCall


@dataclass(frozen=True)
class Logprob:
    """One generated token's log-probability (only when the request asked for
    logprobs). It precedes the ``Reasoning``/``Text``/``ToolCallMade`` events
    of the text that token completes (text a stop sequence or a marker holds
    back comes later), so a stream can send each token's logprob with the
    content it belongs to; ``TurnDone.logprobs`` holds them all, in order."""

    token: int
    value: TokenLogprob


@dataclass(frozen=True)
class LiveStats:
    """The engine's counters moved by this turn so far (``Stats`` field names),
    and the session's running totals (read on the engine's thread, so a front
    end never reads a session another thread is using)."""

    counters: dict[str, float]
    totals: dict[str, float] = field(default_factory=dict)


@dataclass
class TurnDone:
    """The end of a turn: why, the whole answer split, and the figures."""

    reason: str                       #: "stop", "length", "tool_calls", "cancelled" or "error"
    content: str = ""
    reasoning: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    prompt_ids: list[int] = field(default_factory=list)   #: the whole prompt (empty for a remote engine)
    token_ids: list[int] = field(default_factory=list)    #: generated ids (remote: the logprobs' ids, else -1 each)
    prompt_tokens: int = 0            #: the whole prompt's length
    reused_tokens: int = 0            #: of which the session already held
    completion_tokens: int = 0
    reasoning_tokens: int = 0
    counters: dict[str, float] = field(default_factory=dict)
    totals: dict[str, float] = field(default_factory=dict)   #: the session's running totals at the end
    seconds: float = 0.0
    queue_seconds: float = 0.0
    ttft_s: float | None = None       #: time to the first generated token (from the turn's start)
    started: float = 0.0
    ended: float = 0.0
    logprobs: list[tuple[int, TokenLogprob]] = field(default_factory=list)  #: (token id, logprob) when asked
    error: str | None = None
    stop_sequence: str | None = None  #: the stop sequence that ended the answer, if one did
    context_full: bool = False        #: a "length" stop where the context, not max_tokens, was the limit
    dropped_messages: int = 0         #: messages the context policy left out of the prompt (TurnRequest.context)
    #: a kept prefix (TurnRequest.keep_prefix): "held", "restored", "partial", "saved", "refused: ..." (local,
    #: with saved states), "remote" (the server keeps its own); "" when none was kept
    prefix_state: str = ""


TurnEvent = ImageProgress | PromptProgress | Reasoning | Text | ToolCallDelta | ToolCallMade | Logprob | LiveStats | TurnDone
