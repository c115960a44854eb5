"""From an OpenAI chat request to a prompt, and from generated tokens to an
OpenAI answer. No HTTP here.

``ChatFormatter`` knows the model's chat format: Kimi K3's own (tools,
tool_choice, response_format, thinking and its effort), the model's Jinja2
template (tools passed through when the template takes them;
``enable_thinking`` and any ``chat_template_kwargs``), or plain text for a
model without a template. ``prepare`` refuses what the format cannot do with
an OpenAI-style error rather than silently ignoring it.

``AnswerBuilder`` turns the engine's tokens into reasoning text, answer text
and tool calls (``StreamParser``; ``<tool_call>`` JSON for Hermes-style
templates), and ends the answer at a stop sequence.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from app.chat.conversation import opening_channel
from app.chat.k3_format import render_k3
from app.chat.stream_parser import MarkerScanner, StreamParser, ToolCall
from app.chat.template import TemplateRenderError
from app.model import LoadedModel
from app.sampling import SamplingParams
from app.server.errors import APIError, invalid
from app.server.schemas import ChatCompletionRequest

#: K3's thinking efforts, from the values OpenAI clients send.
K3_EFFORT = {"minimal": "low", "low": "low", "medium": "medium", "high": "high", "xhigh": "max", "max": "max"}
#: Template variables a request may not override.
RESERVED_TEMPLATE_VARS = frozenset({"messages", "add_generation_prompt", "bos_token", "eos_token", "tools"})
HERMES_OPEN, HERMES_CLOSE = "<tool_call>", "</tool_call>"


@dataclass(frozen=True)
class Limits:
    max_tokens: int = 2048              #: the most tokens one answer may ask for
    max_request_bytes: int = 4 << 20    #: the largest request body
    max_waiting: int = 32               #: requests that may wait for the engine


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


@dataclass
class Summary:
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    reasoning_tokens: int
    reused_tokens: int
    counters: dict[str, float]
    seconds: float
    queue_seconds: float
    started: float
    ended: float
    content: str = ""
    reasoning: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)


class ChatFormatter:
    def __init__(self, model: LoadedModel):
        self.model = model
        kimi = (model.manifest.get("model") or {}).get("kimi") or {}
        self.kind = "k3" if kimi.get("variant") == "k3" else ("jinja" if model.template is not None else "plain")
        # The source LoadedModel read (inside the container, bounded), never read again from the folder.
        source = model.template.source if self.kind == "jinja" else ""
        self.template_takes_tools = "tools" in source
        self.hermes = HERMES_OPEN in source
        self._specials = sorted({model.tokenizer.token_text(i) for i in getattr(model.tokenizer, "special_ids", ())
                                 if model.tokenizer.token_text(i).strip()}, key=len, reverse=True)

    # ---------------------------------------------------------------- prompt

    def prepare(self, req: ChatCompletionRequest, *, limits: Limits, n_ctx: int) -> Prepared:
        max_tokens = req.max_completion_tokens or req.max_tokens
        param = "max_completion_tokens" if req.max_completion_tokens else "max_tokens"
        if max_tokens is not None and max_tokens > limits.max_tokens:
            raise invalid(f"{param} is {max_tokens}, but this server allows at most {limits.max_tokens}.", param)
        stops = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
        if len(stops) > 4 or any(not s or len(s) > 256 for s in stops):
            raise invalid("stop takes up to 4 non-empty sequences of at most 256 characters.", "stop")
        try:
            params = SamplingParams(temperature=1.0 if req.temperature is None else req.temperature,
                                    top_p=1.0 if req.top_p is None else req.top_p, top_k=req.top_k or 0,
                                    min_p=req.min_p or 0.0, seed=req.seed)
        except ValueError as exc:
            raise invalid(str(exc), "temperature") from None
        if self.kind == "k3":
            prompt, dialect, channel = self._k3(req)
            hermes = False
        elif self.kind == "jinja":
            prompt, channel = self._jinja(req)
            dialect, hermes = "think_tags", bool(req.tools) and self.hermes and req.tool_choice != "none"
        else:
            prompt, dialect, channel, hermes = self._plain(req), "think_tags", "response", False
        if len(prompt) >= n_ctx:
            raise APIError(400, f"The prompt has {len(prompt)} tokens but the context holds {n_ctx}.",
                           param="messages", code="context_length_exceeded")
        room = n_ctx - len(prompt)
        return Prepared(prompt=prompt, params=params, max_tokens=min(max_tokens or limits.max_tokens, room),
                        stops=stops, dialect=dialect, channel=channel, hermes_tools=hermes)

    def _k3(self, req: ChatCompletionRequest) -> tuple[list[int], str, str]:
        effort = req.reasoning_effort
        thinking = effort != "none"
        if req.chat_template_kwargs:
            if set(req.chat_template_kwargs) - {"thinking", "enable_thinking"}:
                raise invalid("the K3 chat format takes only 'thinking' in chat_template_kwargs",
                              "chat_template_kwargs")
            value = req.chat_template_kwargs.get("thinking", req.chat_template_kwargs.get("enable_thinking"))
            if not isinstance(value, bool):
                raise invalid("chat_template_kwargs.thinking must be true or false", "chat_template_kwargs")
            thinking = value
        body: dict[str, Any] = {
            "messages": [self._k3_message(m) for m in req.messages],
            "thinking": thinking,
            "thinking_effort": K3_EFFORT.get(effort) if thinking and effort else None,
        }
        if req.tools:
            body["tools"] = [t.model_dump(exclude_none=True, by_alias=True) for t in req.tools]
        if req.tool_choice is not None:
            if not isinstance(req.tool_choice, str):
                raise invalid("the K3 chat format cannot force a named tool; use 'auto', 'none' or 'required'",
                              "tool_choice")
            body["tool_choice"] = req.tool_choice
        if req.response_format is not None:
            rf = req.response_format.model_dump(exclude_none=True, by_alias=True)
            if rf.get("type") == "json_schema" and "schema" not in (rf.get("json_schema") or {}):
                raise invalid("response_format.json_schema.schema is required", "response_format")
            body["response_format"] = rf
        try:
            segments = render_k3(body)
        except ValueError as exc:
            raise invalid(str(exc), "messages") from None
        return self.model.encode(segments), "k3", "thinking" if thinking else "response"

    @staticmethod
    def _k3_message(m) -> dict[str, Any]:
        d = m.model_dump(exclude_none=True)
        if d["role"] == "developer":
            d["role"] = "system"
        return d

    def _jinja(self, req: ChatCompletionRequest) -> tuple[list[int], str]:
        if req.response_format is not None and req.response_format.type != "text":
            raise invalid("response_format needs a chat format that supports it (Kimi K3); this model's template "
                          "does not", "response_format")
        tools = None
        if req.tools and req.tool_choice != "none":
            if not self.template_takes_tools:
                raise invalid("this model's chat template does not take tools", "tools")
            if req.tool_choice not in (None, "auto"):
                raise invalid("this model's chat template cannot force a tool call; use 'auto' or 'none'",
                              "tool_choice")
            tools = [t.model_dump(exclude_none=True, by_alias=True) for t in req.tools]
        extra = dict(req.chat_template_kwargs or {})
        clash = RESERVED_TEMPLATE_VARS & set(extra)
        if clash:
            raise invalid(f"chat_template_kwargs may not set {', '.join(sorted(clash))}", "chat_template_kwargs")
        extra.setdefault("enable_thinking", req.reasoning_effort != "none")
        messages = []
        for m in req.messages:
            d: dict[str, Any] = {"role": "system" if m.role == "developer" else m.role,
                                 "content": _text_of(m.content)}
            for key in ("name", "tool_call_id", "reasoning_content"):
                if getattr(m, key) is not None:
                    d[key] = getattr(m, key)
            if m.tool_calls:
                d["tool_calls"] = [c.model_dump(exclude_none=True) for c in m.tool_calls]
            messages.append(d)
        # Everything but message bodies becomes markup: it must not smuggle in control tokens.
        self._refuse_control_tokens({"tools": tools, "kwargs": extra,
                                     "messages": [{k: v for k, v in d.items() if k != "content"} for d in messages]})
        if tools:
            extra["tools"] = tools
        try:
            segments = self.model.template.render(messages, add_generation_prompt=True, **extra)
        except TemplateRenderError as exc:
            raise invalid(f"the model's chat template refused the conversation: {exc}", "messages") from None
        return self.model.encode(segments), opening_channel(segments)

    def _plain(self, req: ChatCompletionRequest) -> list[int]:
        if req.tools:
            raise invalid("this model has no chat template, so it cannot take tools", "tools")
        if req.response_format is not None and req.response_format.type != "text":
            raise invalid("this model has no chat format that supports response_format", "response_format")
        return self.model.encode_plain("\n\n".join(_text_of(m.content) for m in req.messages))

    def _refuse_control_tokens(self, value: Any) -> None:
        text = json.dumps(value, ensure_ascii=False)
        for special in self._specials:
            if special in text:
                raise invalid(f"the request holds the model's control token {special!r} outside a message body",
                              "messages")


def _text_of(content) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(part.text for part in content)


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
        inner = getattr(tokenizer, "_tok", None)
        self._bytes = (inner.decode_token_bytes if inner is not None
                       else lambda i: tokenizer.token_text(i).encode("utf-8"))

    def decode_token_bytes(self, token_id: int) -> bytes:
        return self._bytes(int(token_id))


class AnswerBuilder:
    """Generated tokens in; ("reasoning"|"content", text) and ("tool_call", ToolCall) out."""

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

    def token(self, token_id: int, text: str) -> list[tuple[str, Any]]:
        events = self.parser.feed_token(token_id) if self.k3 else self.parser.feed(text)
        out = self._route(events)
        if out and all(kind == "reasoning" for kind, _ in out):
            self.reasoning_tokens += 1
        return out

    def finish(self) -> list[tuple[str, Any]]:
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
            out.append(("content", tail))
        return out

    def _route(self, events) -> list[tuple[str, Any]]:
        out: list[tuple[str, Any]] = []
        for kind, value in events:
            if self.stop.stopped:
                break
            if kind == "thinking" and value:
                self.reasoning.append(value)
                out.append(("reasoning", value))
            elif kind == "response" and value:
                out += self._hermes(value) if self.hermes is not None else self._content(value)
            elif kind == "tool_call":
                out.append(self._call(value))
        return out

    def _hermes(self, text: str) -> list[tuple[str, Any]]:
        out: list[tuple[str, Any]] = []
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

    def _hermes_call(self, body: str) -> list[tuple[str, Any]]:
        try:
            doc = json.loads(body)
            name, arguments = doc["name"], doc.get("arguments", {})
            if not isinstance(name, str):
                raise TypeError
        except (ValueError, KeyError, TypeError):
            return self._content(HERMES_OPEN + body + HERMES_CLOSE)
        args = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
        return [self._call(ToolCall(name, len(self.tool_calls) + 1, args))]

    def _call(self, call: ToolCall) -> tuple[str, Any]:
        self.tool_calls.append(call)
        return ("tool_call", call)

    def _content(self, text: str) -> list[tuple[str, Any]]:
        text = self.stop.feed(text)
        if not text:
            return []
        self.content.append(text)
        return [("content", text)]


def figures(counters: dict[str, float]) -> dict[str, Any]:
    """Ferry's figures for one answer, from the engine counters it moved."""
    hits, misses = counters.get("hits", 0), counters.get("misses", 0)
    dec_s, pre_s = counters.get("decode_seconds", 0), counters.get("prompt_seconds", 0)
    return {
        "tok_per_s": round(counters.get("decode_tokens", 0) / dec_s, 3) if dec_s > 0 else None,
        "prompt_tok_per_s": round(counters.get("prompt_tokens", 0) / pre_s, 3) if pre_s > 0 else None,
        "hit_rate": round(hits / (hits + misses), 6) if hits + misses else None,
        "bytes_read": int(counters.get("bytes_read", 0)),
        "counters": counters,
    }


def now() -> float:
    return time.monotonic()
