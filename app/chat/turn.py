"""One turn of a conversation, for every front end: the window, the CLI, the
server and document Q&A all come through here, and none of them builds a
prompt or reads an answer stream itself.

``ChatFormat(model)`` decides the model's chat format once: Kimi K3's own
renderer (tools, tool_choice, response_format, thinking and its effort), the
model's Jinja2 template (tools passed through when it takes them;
``enable_thinking`` and any ``chat_template_kwargs``), or plain text for a
model with neither. ``prepare(TurnRequest)`` renders and encodes, refusing
with a ``TurnError`` what the format cannot do rather than ignoring it.

``run_turn`` generates on a local session and yields the typed events of
``app.events``; ``AnswerBuilder`` splits the generated tokens into thinking,
answer and tool calls (``StreamParser``; ``<tool_call>`` JSON for
Hermes-style templates) and ends the answer at a stop sequence. A remote
engine (``app.engine.remote``) yields the same events.

The routing options of a request (``experts_per_token``,
``cache_aware_margin``) are applied here and nowhere else: ``apply_routing``.
"""
from __future__ import annotations

import dataclasses

import json
import time
from dataclasses import dataclass, field
from typing import Any, Iterator, Sequence

from app.chat.k3_format import render_k3
from app.chat.segments import Segment, content
from app.chat.stream_parser import MarkerScanner, StreamParser, ToolCall
from app.chat.template import TemplateRenderError
from app.events import (Finished, LiveStats, Logprob, PromptProgress, Reasoning, Text, Token, TokenLogprob,
                        ToolCallMade, TurnDone, TurnEvent)
from app.sampling import SamplingParams

#: K3's thinking efforts, from the values OpenAI clients send.
K3_EFFORT = {"minimal": "low", "low": "low", "medium": "medium", "high": "high", "xhigh": "max", "max": "max"}
#: Template variables a request may not override.
RESERVED_TEMPLATE_VARS = frozenset({"messages", "add_generation_prompt", "bos_token", "eos_token", "tools"})
HERMES_OPEN, HERMES_CLOSE = "<tool_call>", "</tool_call>"
STATS_INTERVAL = 0.25   #: seconds between LiveStats events
MAX_TOP_LOGPROBS = 20
MAX_STOPS, MAX_STOP_CHARS = 4, 256   #: stop sequences a turn takes (as OpenAI's API)


class TurnError(ValueError):
    """A request the model's chat format (or the engine build) cannot serve."""

    def __init__(self, message: str, param: str | None = None, code: str = "invalid_value"):
        super().__init__(message)
        self.message, self.param, self.code = message, param, code


@dataclass
class TurnRequest:
    """What one answer needs. ``messages`` are OpenAI-shaped dicts (content a
    string or a list of text parts); ``tools``/``response_format`` are the
    OpenAI shapes too."""

    messages: list[dict[str, Any]]
    sampling: SamplingParams = field(default_factory=SamplingParams)
    max_tokens: int | None = None          #: None: as much as the context (and the caller's limit) allows
    thinking: bool = True
    reasoning_effort: str | None = None    #: OpenAI's values; K3 maps them to its efforts
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    response_format: dict[str, Any] | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    stop: list[str] = field(default_factory=list)
    top_logprobs: int | None = None        #: None: no logprobs; 0-20: the chosen token's and that many more
    experts_per_token: int | None = None   #: opt-in routing (issue 17): None keeps the model's own
    cache_aware_margin: float = 0.0        #: opt-in cache-aware routing; 0 is off
    raw: bool = False                      #: the messages' text as a plain prompt, no chat format
    client: str = "local"                  #: who asks: prefix reuse is kept per client
    #: what a prompt that does not fit does: "error" refuses it (the server's: its clients decide), "drop_oldest"
    #: leaves the oldest turns out (the window and ``ferry chat``: a chat never dead-ends); see ``CONTEXT_POLICIES``
    context: str = "error"


#: The context policies a ``TurnRequest`` can name.
CONTEXT_POLICIES = ("error", "drop_oldest")


@dataclass
class Prepared:
    """A validated request, ready for the engine."""

    prompt: list[int]
    params: SamplingParams
    max_tokens: int
    stops: list[str]
    dialect: str                 #: "k3" or "think_tags"
    channel: str                 #: the channel the generation prompt left open
    hermes_tools: bool = False   #: parse <tool_call>{json}</tool_call> in the answer
    segments: list[Segment] = field(default_factory=list)
    top_logprobs: int | None = None
    experts_per_token: int | None = None
    cache_aware_margin: float = 0.0
    client: str = "local"
    dropped: int = 0             #: messages (after the system prompt) left out to fit the context
    context_bound: bool = False  #: the answer's room is what the context leaves (a length stop is "context full")


class ChatFormat:
    """The chat format of one loaded model (``app.model.LoadedModel``)."""

    def __init__(self, model):
        self.model = model
        kimi = (model.manifest.get("model") or {}).get("kimi") or {}
        config = (model.manifest.get("source") or {}).get("config") or {}
        is_k3 = kimi.get("variant") == "k3" or config.get("model_type") == "kimi_k3"
        self.kind = "k3" if is_k3 else ("jinja" if model.template is not None else "plain")
        # The source LoadedModel read (inside the container, bounded), never read again from the folder.
        source = model.template.source if self.kind == "jinja" else ""
        self.template_takes_tools = "tools" in source
        self.hermes = HERMES_OPEN in source
        self._specials = sorted({model.tokenizer.token_text(i) for i in getattr(model.tokenizer, "special_ids", ())
                                 if model.tokenizer.token_text(i).strip()}, key=len, reverse=True)

    # ---------------------------------------------------------------- prompt

    def prepare(self, req: TurnRequest, *, n_ctx: int, max_tokens_limit: int | None = None) -> Prepared:
        stops = list(req.stop or [])
        if len(stops) > MAX_STOPS or any(not s or len(s) > MAX_STOP_CHARS for s in stops):
            raise TurnError(f"stop takes up to {MAX_STOPS} non-empty sequences of at most {MAX_STOP_CHARS} "
                            "characters.", "stop")
        if req.top_logprobs is not None and not 0 <= req.top_logprobs <= MAX_TOP_LOGPROBS:
            raise TurnError(f"top_logprobs must be between 0 and {MAX_TOP_LOGPROBS}.", "top_logprobs")
        if req.context not in CONTEXT_POLICIES:
            raise TurnError(f"context must be one of {', '.join(CONTEXT_POLICIES)}.", "context")
        segments, dialect, channel, hermes = self._render(req)
        prompt = self.model.encode(segments)
        dropped = 0
        if req.context == "drop_oldest" and req.messages and not req.raw:
            prompt, segments, dropped = self._fit(req, n_ctx, prompt, segments)
        if len(prompt) >= n_ctx:
            raise TurnError(f"The prompt has {len(prompt)} tokens but the context holds {n_ctx}.", "messages",
                            "context_length_exceeded")
        room = n_ctx - len(prompt)
        want = req.max_tokens or max_tokens_limit or room
        return Prepared(prompt=prompt, params=req.sampling, max_tokens=min(want, room), stops=stops,
                        dialect=dialect, channel=channel, hermes_tools=hermes, segments=segments,
                        top_logprobs=req.top_logprobs, experts_per_token=req.experts_per_token,
                        cache_aware_margin=req.cache_aware_margin, client=req.client, dropped=dropped,
                        context_bound=want >= room)

    def _render(self, req: TurnRequest) -> tuple[list[Segment], str, str, bool]:
        """The prompt segments, the stream dialect, the channel left open, and whether tool calls are Hermes'."""
        if req.raw:
            return self.plain(req), "think_tags", "response", False
        if self.kind == "k3":
            segments, channel = self._k3(req)
            return segments, "k3", channel, False
        if self.kind == "jinja":
            segments, channel = self._jinja(req)
            return segments, "think_tags", channel, bool(req.tools) and self.hermes and req.tool_choice != "none"
        return self.plain(req), "think_tags", "response", False

    def _fit(self, req: TurnRequest, n_ctx: int, prompt: list[int], segments: list[Segment]
             ) -> tuple[list[int], list[Segment], int]:
        """The "drop_oldest" policy: when the prompt and room for an answer (the longest answer asked for,
        at most a quarter of the context) do not fit, whole turns are left out from the oldest on — the
        system prompt and the newest question always stay — until the prompt takes at most half the
        context (so the next few turns fit without dropping again, and reuse this prompt's prefix).
        Returns the prompt, its segments and how many messages were left out."""
        reserve = min(req.max_tokens or n_ctx, n_ctx // 4)
        if len(prompt) + reserve <= n_ctx:
            return prompt, segments, 0
        messages = list(req.messages)
        first = 1 if messages[0].get("role") == "system" else 0
        users = [i for i, m in enumerate(messages) if i >= first and m.get("role") == "user"]
        for start in users[1:] if users and users[0] == first else users:
            trial = dataclasses.replace(req, messages=messages[:first] + messages[start:])
            segments = self._render(trial)[0]
            prompt = self.model.encode(segments)
            if len(prompt) <= n_ctx // 2:
                return prompt, segments, start - first
        return prompt, segments, (users[-1] - first) if users and users[-1] > first else 0

    def render(self, messages: list[dict[str, Any]], *, thinking: bool = True) -> list[Segment]:
        """The prompt segments of ``messages`` (with the generation prompt)."""
        return self.prepare_segments(TurnRequest(messages=messages, thinking=thinking))

    def prepare_segments(self, req: TurnRequest) -> list[Segment]:
        if self.kind == "k3":
            return self._k3(req)[0]
        if self.kind == "jinja":
            return self._jinja(req)[0]
        return self.plain(req)

    def _k3(self, req: TurnRequest) -> tuple[list[Segment], str]:
        effort = req.reasoning_effort
        thinking = req.thinking and effort != "none"
        if req.chat_template_kwargs:
            if set(req.chat_template_kwargs) - {"thinking", "enable_thinking"}:
                raise TurnError("the K3 chat format takes only 'thinking' in chat_template_kwargs",
                                "chat_template_kwargs")
            value = req.chat_template_kwargs.get("thinking", req.chat_template_kwargs.get("enable_thinking"))
            if not isinstance(value, bool):
                raise TurnError("chat_template_kwargs.thinking must be true or false", "chat_template_kwargs")
            thinking = value
        body: dict[str, Any] = {
            "messages": [self._k3_message(m) for m in req.messages],
            "thinking": thinking,
            "thinking_effort": K3_EFFORT.get(effort) if thinking and effort else None,
        }
        if req.tools:
            body["tools"] = list(req.tools)
        if req.tool_choice is not None:
            if not isinstance(req.tool_choice, str):
                raise TurnError("the K3 chat format cannot force a named tool; use 'auto', 'none' or 'required'",
                                "tool_choice")
            body["tool_choice"] = req.tool_choice
        if req.response_format is not None:
            body["response_format"] = req.response_format
        try:
            segments = render_k3(body)
        except ValueError as exc:
            raise TurnError(str(exc), "messages") from None
        return segments, "thinking" if thinking else "response"

    @staticmethod
    def _k3_message(m: dict[str, Any]) -> dict[str, Any]:
        d = {k: v for k, v in m.items() if v is not None}
        if d["role"] == "developer":
            d["role"] = "system"
        return d

    def _jinja(self, req: TurnRequest) -> tuple[list[Segment], str]:
        if req.response_format is not None and req.response_format.get("type") != "text":
            raise TurnError("response_format needs a chat format that supports it (Kimi K3); this model's "
                            "template does not", "response_format")
        tools = None
        if req.tools and req.tool_choice != "none":
            if not self.template_takes_tools:
                raise TurnError("this model's chat template does not take tools", "tools")
            if req.tool_choice not in (None, "auto"):
                raise TurnError("this model's chat template cannot force a tool call; use 'auto' or 'none'",
                                "tool_choice")
            tools = list(req.tools)
        extra = dict(req.chat_template_kwargs or {})
        clash = RESERVED_TEMPLATE_VARS & set(extra)
        if clash:
            raise TurnError(f"chat_template_kwargs may not set {', '.join(sorted(clash))}", "chat_template_kwargs")
        extra.setdefault("enable_thinking", bool(req.thinking) and req.reasoning_effort != "none")
        messages = []
        for m in req.messages:
            d: dict[str, Any] = {"role": "system" if m["role"] == "developer" else m["role"],
                                 "content": text_of(m.get("content"))}
            for key in ("name", "tool_call_id", "reasoning_content", "tool_calls"):
                if m.get(key) is not None:
                    d[key] = m[key]
            messages.append(d)
        # Everything but message bodies becomes markup: it must not smuggle in control tokens.
        self._refuse_control_tokens({"tools": tools, "kwargs": extra,
                                     "messages": [{k: v for k, v in d.items() if k != "content"} for d in messages]})
        if tools:
            extra["tools"] = tools
        try:
            segments = self.model.template.render(messages, add_generation_prompt=True, **extra)
        except TemplateRenderError as exc:
            raise TurnError(f"the model's chat template refused the conversation: {exc}", "messages") from None
        return segments, opening_channel(segments)

    def plain(self, req: TurnRequest) -> list[Segment]:
        if req.tools:
            raise TurnError("this model has no chat template, so it cannot take tools", "tools")
        if req.response_format is not None and req.response_format.get("type") != "text":
            raise TurnError("this model has no chat format that supports response_format", "response_format")
        return [content("\n\n".join(text_of(m.get("content")) for m in req.messages))]

    def _refuse_control_tokens(self, value: Any) -> None:
        text = json.dumps(value, ensure_ascii=False)
        for special in self._specials:
            if special in text:
                raise TurnError(f"the request holds the model's control token {special!r} outside a message body",
                                "messages")


def text_of(value) -> str:
    """A message's content as text (a list of text parts joined)."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    return "".join(part.get("text", "") if isinstance(part, dict) else getattr(part, "text", "") for part in value)


def opening_channel(segments: Sequence[Segment]) -> str:
    """"thinking" if the markup after the last piece of content opens a
    ``<think>`` that it does not close, else "response"."""
    tail = []
    for text, is_markup in reversed(segments):
        if not is_markup:
            break
        tail.append(text)
    tail_text = "".join(reversed(tail))
    opened = tail_text.rfind("<think>")
    return "thinking" if opened >= 0 and tail_text.find("</think>", opened) < 0 else "response"


# -------------------------------------------------------------------- output

class StopFilter:
    """Ends the answer text at the first stop sequence; holds back only text
    that could still begin one."""

    def __init__(self, stops: list[str]):
        self.stops = [s for s in stops if s]
        self.held = ""
        self.stopped = False

    def feed(self, text: str) -> str:
        if self.stopped:
            return ""
        if not self.stops:
            return text
        buf = self.held + text
        hits = [pos for pos in (buf.find(s) for s in self.stops) if pos >= 0]
        if hits:
            self.held, self.stopped = "", True
            return buf[:min(hits)]
        keep = 0
        for n in range(min(len(buf), max(len(s) for s in self.stops) - 1), 0, -1):
            if any(s.startswith(buf[-n:]) for s in self.stops):
                keep = n
                break
        self.held = buf[len(buf) - keep:]
        return buf[:len(buf) - keep]

    def flush(self) -> str:
        held, self.held = self.held, ""
        return "" if self.stopped else held


class _TokenSource:
    """What StreamParser.feed_token needs, from a K3 container's tokenizer."""

    def __init__(self, tokenizer):
        self.special_ids = tokenizer.special_ids
        self._tokenizer = tokenizer

    def decode_token_bytes(self, token_id: int) -> bytes:
        return token_bytes(self._tokenizer, token_id)


def token_bytes(tokenizer, token_id: int) -> bytes:
    """A token's own bytes (a byte-level piece of UTF-8 may be no text alone)."""
    for source in (getattr(tokenizer, "_tok", None), tokenizer):   # the K3 tokenizer, an HFTokenizer
        if source is not None and hasattr(source, "decode_token_bytes"):
            return source.decode_token_bytes(int(token_id))
    return tokenizer.token_text(int(token_id)).encode("utf-8")


def logprobs_content(entries: list[tuple[int, TokenLogprob]], tokenizer=None) -> list[dict[str, Any]]:
    """Generated tokens' logprobs in OpenAI's ``choices[].logprobs.content``
    shape (the server's answer, ``ferry run --json --logprobs``), each with its
    token ``id`` too (as llama.cpp's server gives it), so a client such as
    Ferry's remote engine knows the token and not only its text. Without a
    ``tokenizer`` (a remote engine) the bytes the entries carry are used."""

    def item(tok: int, logprob: float, raw: bytes | None) -> dict[str, Any]:
        if tokenizer is not None:
            raw = token_bytes(tokenizer, tok)
        raw = raw or b""
        return {"id": int(tok), "token": raw.decode("utf-8", "replace"), "logprob": logprob, "bytes": list(raw)}

    def alternatives(lp: TokenLogprob) -> list[dict[str, Any]]:
        raws = lp.top_bytes if len(lp.top_bytes) == len(lp.top) else (None,) * len(lp.top)
        return [item(i, v, raw) for (i, v), raw in zip(lp.top, raws)]

    return [{**item(tok, lp.logprob, lp.token_bytes), "top_logprobs": alternatives(lp)} for tok, lp in entries]


class AnswerBuilder:
    """Generated tokens in; ``Reasoning``, ``Text`` and ``ToolCallMade`` events out."""

    def __init__(self, prepared: Prepared, tokenizer):
        self.k3 = prepared.dialect == "k3"
        self.parser = StreamParser(prepared.dialect, prepared.channel,
                                   tokenizer=_TokenSource(tokenizer) if self.k3 else None)
        self.stop = StopFilter(prepared.stops)
        self.hermes = MarkerScanner((HERMES_OPEN, HERMES_CLOSE)) if prepared.hermes_tools else None
        self._in_call = False
        self._call_text: list[str] = []
        self.content: list[str] = []
        self.reasoning: list[str] = []
        self.tool_calls: list[ToolCall] = []
        self.reasoning_tokens = 0

    @property
    def ended(self) -> bool:
        return self.stop.stopped or self.parser.ended

    def token(self, token_id: int, text: str) -> list[TurnEvent]:
        events = self.parser.feed_token(token_id) if self.k3 else self.parser.feed(text)
        out = self._route(events)
        if out and all(isinstance(ev, Reasoning) for ev in out):
            self.reasoning_tokens += 1
        return out

    def text(self, text: str) -> list[TurnEvent]:
        """Generated text without token ids (a remote engine's stream)."""
        return self._route(self.parser.feed(text))

    def finish(self) -> list[TurnEvent]:
        out = self._route(self.parser.finish())
        if self.hermes is not None:
            rest = self.hermes.flush()
            if self._in_call:  # an unclosed call is shown as the text it was
                rest = HERMES_OPEN + "".join(self._call_text) + rest
                self._in_call = False
            out += self._content(rest)
        tail = self.stop.flush()
        if tail:
            self.content.append(tail)
            out.append(Text(tail))
        return out

    def reasoning_text(self, text: str) -> list[TurnEvent]:
        if not text:
            return []
        self.reasoning.append(text)
        return [Reasoning(text)]

    def _route(self, events) -> list[TurnEvent]:
        out: list[TurnEvent] = []
        for kind, value in events:
            if self.stop.stopped:
                break
            if kind == "thinking" and value:
                out += self.reasoning_text(value)
            elif kind == "response" and value:
                out += self._hermes(value) if self.hermes is not None else self._content(value)
            elif kind == "tool_call":
                out.append(self.call(value))
        return out

    def _hermes(self, text: str) -> list[TurnEvent]:
        out: list[TurnEvent] = []
        for piece, is_marker in self.hermes.feed(text):
            if is_marker and piece == HERMES_OPEN:
                self._in_call, self._call_text = True, []
            elif is_marker:
                if self._in_call:
                    out += self._hermes_call("".join(self._call_text))
                self._in_call = False
            elif self._in_call:
                self._call_text.append(piece)
            else:
                out += self._content(piece)
        return out

    def _hermes_call(self, body: str) -> list[TurnEvent]:
        try:
            doc = json.loads(body)
            name, arguments = doc["name"], doc.get("arguments", {})
            if not isinstance(name, str):
                raise TypeError
        except (ValueError, KeyError, TypeError):
            return self._content(HERMES_OPEN + body + HERMES_CLOSE)
        args = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
        return [self.call(ToolCall(name, len(self.tool_calls) + 1, args))]

    def call(self, call: ToolCall) -> ToolCallMade:
        self.tool_calls.append(call)
        return ToolCallMade(call)

    def _content(self, text: str) -> list[TurnEvent]:
        text = self.stop.feed(text)
        if not text:
            return []
        self.content.append(text)
        return [Text(text)]


# -------------------------------------------------------------------- running

def check_routing(session, prepared: Prepared) -> None:
    """Refuse routing options the engine build cannot honour (before queueing)."""
    if (prepared.experts_per_token is not None or prepared.cache_aware_margin) and \
            getattr(session, "set_routing", None) is None:
        what = "experts_per_token" if prepared.experts_per_token is not None else "cache_aware_margin"
        raise TurnError(f"this engine build does not support {what} (no Session.set_routing)", what,
                        "unsupported_parameter")
    info = getattr(getattr(session, "engine", None), "info", None)
    if info is None or (prepared.experts_per_token is None and not prepared.cache_aware_margin):
        return
    what = "experts_per_token" if prepared.experts_per_token is not None else "cache_aware_margin"
    if info.n_experts <= 0 or info.top_k <= 0:
        raise TurnError(f"{what} applies to mixture-of-experts models; this model has no experts to route", what,
                        "unsupported_parameter")
    n = prepared.experts_per_token
    if n is not None and not 1 <= n <= info.top_k:
        raise TurnError(f"experts_per_token must be 1..{info.top_k} (this model's top-k)", "experts_per_token")
    margin = float(prepared.cache_aware_margin or 0.0)
    if not 0.0 <= margin <= 1e6:
        raise TurnError("cache_aware_margin must be a number from 0 (exact routing) to 1e6", "cache_aware_margin")


def apply_routing(session, prepared: Prepared) -> None:
    """The one place a turn's routing options reach the engine. Default values
    call nothing (unless an earlier turn changed the routing: then it is put
    back); a value the engine build cannot honour is refused."""
    wanted = (prepared.experts_per_token, float(prepared.cache_aware_margin or 0.0))
    current = getattr(session, "_ferry_routing", (None, 0.0))
    if wanted == current:
        return
    check_routing(session, prepared)
    session.set_routing(*wanted)
    try:
        session._ferry_routing = wanted
    except AttributeError:
        pass


def run_turn(model, session, prepared: Prepared, *, reuse_limit: int | None = None,
             submitted: float | None = None) -> Iterator[TurnEvent]:
    """Generate one answer on a local ``session``: typed events, ending with
    exactly one ``TurnDone``. ``reuse_limit`` bounds the prefix the session may
    reuse (the engine service keeps reuse per client)."""
    start = time.monotonic()
    submitted = start if submitted is None else submitted
    base = session.stats().as_dict()

    def counters() -> dict[str, float]:
        now = session.stats().as_dict()
        return {k: now[k] - base.get(k, 0) for k in now}

    def live() -> LiveStats:
        totals = session.stats().as_dict()
        return LiveStats({k: totals[k] - base.get(k, 0) for k in totals}, totals)

    def done(reason: str, error: str | None = None, **extra) -> TurnDone:
        ended = time.monotonic()
        return TurnDone(reason=reason, content="".join(builder.content), reasoning="".join(builder.reasoning),
                        tool_calls=list(builder.tool_calls), prompt_ids=list(prepared.prompt),
                        token_ids=list(out_ids), prompt_tokens=len(prepared.prompt),
                        completion_tokens=len(out_ids), reasoning_tokens=builder.reasoning_tokens,
                        counters=counters(), totals=session.stats().as_dict(), seconds=ended - start,
                        queue_seconds=start - submitted, dropped_messages=prepared.dropped,
                        started=start, ended=ended, logprobs=list(logprobs), error=error, **extra)

    builder = AnswerBuilder(prepared, model.tokenizer)
    out_ids: list[int] = []
    logprobs: list = []
    try:
        apply_routing(session, prepared)
    except TurnError as exc:
        yield done("error", exc.message)
        return
    end: Finished | None = None
    last_stats = start
    events = model.generate(session, prepared.prompt, prepared.params, max_tokens=prepared.max_tokens,
                            reuse_limit=reuse_limit, top_logprobs=prepared.top_logprobs)
    try:
        for ev in events:
            if isinstance(ev, PromptProgress):
                yield ev
                now = time.monotonic()
                if now - last_stats >= STATS_INTERVAL or ev.done == ev.total:
                    yield live()
                    last_stats = now
            elif isinstance(ev, Token):
                out_ids.append(ev.id)
                if ev.logprob is not None:
                    logprobs.append((ev.id, ev.logprob))
                    yield Logprob(ev.id, ev.logprob)
                yield from builder.token(ev.id, ev.text)
                if builder.ended:
                    break
                now = time.monotonic()
                if now - last_stats >= STATS_INTERVAL:
                    yield live()
                    last_stats = now
            elif isinstance(ev, Finished):
                end = ev
    finally:
        events.close()
    if end is not None and end.reason in ("cancelled", "error"):
        yield done(end.reason, end.error or (None if end.reason == "cancelled" else "the engine failed"),
                   reused_tokens=end.reused_tokens, ttft_s=end.ttft_s)
        return
    yield from builder.finish()
    if builder.tool_calls:
        reason = "tool_calls"
    elif end is not None and end.reason == "length":
        reason = "length"
    else:
        reason = "stop"
    reused = end.reused_tokens if end is not None else 0
    ttft = end.ttft_s if end is not None else None
    if ttft is None and out_ids:
        ttft = time.monotonic() - start
    yield done(reason, reused_tokens=reused, ttft_s=ttft, context_full=reason == "length" and prepared.context_bound)


def collect(events: Iterator[TurnEvent]) -> TurnDone:
    """Drain a turn; its ``TurnDone``."""
    end = None
    for ev in events:
        if isinstance(ev, TurnDone):
            end = ev
    if end is None:
        raise RuntimeError("a turn ended without TurnDone")
    return end
