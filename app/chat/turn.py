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
Hermes-style templates and Llama 3.1's JSON calls, streamed as written by
``JsonCallReader``) and ends the answer at a stop sequence. A remote
engine (``app.engine.remote``) yields the same events.

The routing options of a request (``experts_per_token``,
``cache_aware_margin``) are applied here and nowhere else: ``apply_routing``.
"""
from __future__ import annotations

import dataclasses

import json
from collections import deque
import time
from dataclasses import dataclass, field
from typing import Any, Iterator, Sequence

from app.chat.k3_format import end_thinking, forced_call_prefix, render_k3
from app.chat.segments import Segment, content, markup
from app.chat.stream_parser import THINK_CLOSE, JsonCallReader, MarkerScanner, StreamParser, ToolCall
from app.chat.template import TemplateRenderError
from app.events import (Finished, ImageProgress, LiveStats, Logprob, PromptProgress, Reasoning, Text, Token, TokenLogprob,
                        ToolCallDelta, ToolCallMade, TurnDone, TurnEvent)
from app.sampling import SamplingParams
from app.vision.image import ImageError, data_url_bytes, image_markup, image_parts, part_url

#: K3's thinking efforts, from the values OpenAI clients send.
K3_EFFORT = {"minimal": "low", "low": "low", "medium": "medium", "high": "high", "xhigh": "max", "max": "max"}
#: Template variables a request may not override.
RESERVED_TEMPLATE_VARS = frozenset({"messages", "add_generation_prompt", "bos_token", "eos_token", "tools"})
HERMES_OPEN, HERMES_CLOSE = "<tool_call>", "</tool_call>"
#: Llama 3.1's tool calls: the answer is ``{"name": ..., "parameters": {...}}`` (after ``<|python_tag|>``).
LLAMA3_TAG = "<|python_tag|>"
#: tool_choice values that make the model call a tool (besides a named function).
FORCED_CHOICES = ("required",)
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
    parallel_tool_calls: bool = True       #: False: the answer ends after its first tool call
    response_format: dict[str, Any] | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    stop: list[str] = field(default_factory=list)
    top_logprobs: int | None = None        #: None: no logprobs; 0-20: the chosen token's and that many more
    experts_per_token: int | None = None   #: opt-in routing (issue 17): None keeps the model's own
    cache_aware_margin: float = 0.0        #: opt-in cache-aware routing; 0 is off
    thinking_budget: int | None = None     #: the most tokens the thinking part may take (then it is closed)
    raw: bool = False                      #: the messages' text as a plain prompt, no chat format
    image_patch_budget: int | None = None  #: patches an image may have (None: app.vision.image.DEFAULT_PATCH_BUDGET)
    client: str = "local"                  #: who asks: prefix reuse is kept per client
    #: what a prompt that does not fit does: "error" refuses it (the server's: its clients decide), "drop_oldest"
    #: leaves the oldest turns out (the window and ``ferry chat``: a chat never dead-ends); see ``CONTEXT_POLICIES``
    context: str = "error"
    #: the prompt up to the last message's text is worth keeping (document passages before the question): a
    #: local engine with saved states restores it from disk, or reads it once and saves it (``Prepared.prefix_len``;
    #: not for a prompt with images: the saved-prefix step reads tokens, not the vision tower's rows)
    keep_prefix: bool = False
    #: the last message is an answer that stopped early (Stop, the length limit, a full context): the model
    #: continues that same answer from where it stopped instead of writing a new one
    continue_final: bool = False
    #: a summary of earlier turns that are no longer in ``messages`` ("summarise" policy,
    #: ``app.chat.summary``): kept in the context after the system prompt
    context_note: str = ""


#: The context policies a ``TurnRequest`` can name. "summarise" needs the model to write the summary
#: (``app.chat.summary.summarise_to_fit``, run by the engine's caller before the turn); the prompt itself
#: then falls back on "drop_oldest" should the summary not be enough.
CONTEXT_POLICIES = ("error", "drop_oldest", "summarise")
#: How the summary of earlier turns is put after the system prompt.
NOTE_HEADING = "Summary of the earlier conversation (those turns are no longer shown in full):"


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
    llama3_tools: bool = False   #: parse an answer that is Llama 3.1 JSON tool calls
    #: Markup appended after the generation prompt, as if the model had written it (a forced tool call):
    #: its text (think_tags) or ids (K3) are fed to the answer parser before the first generated token.
    prefill_text: str = ""
    prefill_ids: list[int] = field(default_factory=list)
    parallel_tool_calls: bool = True
    segments: list[Segment] = field(default_factory=list)
    top_logprobs: int | None = None
    experts_per_token: int | None = None
    cache_aware_margin: float = 0.0
    client: str = "local"
    dropped: int = 0             #: messages (after the system prompt) left out to fit the context
    #: the most tokens the answer may think: then the thinking is closed for it (its format's markup,
    #: ``thinking_close``) and it answers
    thinking_budget: int | None = None
    thinking_close: list[int] = field(default_factory=list)
    context_bound: bool = False  #: the answer's room is what the context leaves (a length stop is "context full")
    images: list = field(default_factory=list)  #: app.vision.image.PreparedImage, in prompt order
    prefix_len: int = 0          #: leading prompt tokens to keep as a saved state (``TurnRequest.keep_prefix``)
    #: a model that cannot rewind (recurrent KDA layers): how much of this prompt a follow-up turn shares (its
    #: state there is kept in RAM, ``LoadedModel.generate``, so the next question does not read it again); 0: none
    resume_len: int = 0


def with_note(req: TurnRequest) -> TurnRequest:
    """``req`` with its ``context_note`` in the system message (one is added when there is none)."""
    note = f"{NOTE_HEADING}\n{req.context_note.strip()}"
    messages = [dict(m) for m in req.messages]
    if messages and messages[0].get("role") in ("system", "developer"):
        messages[0]["content"] = f"{text_of(messages[0].get('content'))}\n\n{note}".strip()
    else:
        messages.insert(0, {"role": "system", "content": note})
    return dataclasses.replace(req, messages=messages, context_note="")


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
        self.llama3 = not self.hermes and (LLAMA3_TAG in source or "ipython" in source)
        self._specials = sorted({model.tokenizer.token_text(i) for i in getattr(model.tokenizer, "special_ids", ())
                                 if model.tokenizer.token_text(i).strip()}, key=len, reverse=True)

    @property
    def takes_tools(self) -> bool:
        """Whether this format's prompts can list tools (K3's own, or a Jinja template that takes them)."""
        return self.kind == "k3" or (self.kind == "jinja" and self.template_takes_tools)

    # ---------------------------------------------------------------- prompt

    def prepare(self, req: TurnRequest, *, n_ctx: int, max_tokens_limit: int | None = None) -> Prepared:
        stops = list(req.stop or [])
        if len(stops) > MAX_STOPS or any(not s or len(s) > MAX_STOP_CHARS for s in stops):
            raise TurnError(f"stop takes up to {MAX_STOPS} non-empty sequences of at most {MAX_STOP_CHARS} "
                            "characters.", "stop")
        if req.top_logprobs is not None and not 0 <= req.top_logprobs <= MAX_TOP_LOGPROBS:
            raise TurnError(f"top_logprobs must be between 0 and {MAX_TOP_LOGPROBS}.", "top_logprobs")
        if req.sampling.logit_bias:
            vocab = self.model.engine.info.vocab
            outside = sorted(t for t, _ in req.sampling.logit_bias if not 0 <= t < vocab)
            if outside:
                raise TurnError(f"logit_bias key {outside[0]} is not a token id of this model (0 to {vocab - 1}).",
                                "logit_bias")
        named = _named_tool(req.tool_choice)
        if req.tool_choice not in (None, "none", "auto") and not req.tools:
            raise TurnError("tool_choice asks for a tool call, but the request has no tools", "tool_choice")
        if named is not None and named not in {(t.get("function") or {}).get("name") for t in req.tools or ()}:
            raise TurnError(f"tool_choice names the function {named!r}, which is not among the tools",
                            "tool_choice")
        if req.context not in CONTEXT_POLICIES:
            raise TurnError(f"context must be one of {', '.join(CONTEXT_POLICIES)}.", "context")
        self.images = []
        if image_parts(req.messages):
            if req.raw or self.kind != "k3" or self.model.vision_config is None:
                raise TurnError(f"{self.model.name} cannot see images (it has no vision tower); remove the "
                                "image or choose a model that has one", "messages")
        tail: list[Segment] = []
        if req.context_note.strip():
            req = with_note(req)
        if req.continue_final:
            req, tail = self._continued(req)
        segments, dialect, channel, hermes, llama3, prefill = self._render(req)
        if tail:
            segments, channel = segments + self._close_thinking(dialect, channel) + tail, "response"
        prompt = self.model.encode(segments)
        dropped = 0
        if req.context in ("drop_oldest", "summarise") and req.messages and not req.raw:
            prompt, segments, dropped = self._fit(req, n_ctx, prompt, segments, tail)
        prefill_ids = self.model.tokenizer.encode_segments(prefill) if prefill else []
        budget = req.thinking_budget
        if budget is not None and budget < 1:
            raise TurnError("the thinking budget must be at least 1 token", "thinking_budget")
        close = []   # the markup that ends the thinking (a model with think tags may open them itself)
        if budget is not None and (dialect == "think_tags" or channel == "thinking"):
            close = self.model.tokenizer.encode_segments(end_thinking() if dialect == "k3"
                                                         else [markup(THINK_CLOSE + "\n\n")])
        prompt += prefill_ids
        if len(prompt) >= n_ctx:
            raise TurnError(f"The prompt has {len(prompt)} tokens but the context holds {n_ctx}.", "messages",
                            "context_length_exceeded")
        room = n_ctx - len(prompt)
        want = req.max_tokens or max_tokens_limit or room
        return Prepared(prompt=prompt, params=req.sampling, max_tokens=min(want, room), stops=stops,
                        dialect=dialect, channel=channel, hermes_tools=hermes, llama3_tools=llama3,
                        prefill_text="".join(text for text, _ in prefill),
                        prefill_ids=prefill_ids if dialect == "k3" else [],
                        parallel_tool_calls=req.parallel_tool_calls, segments=segments + prefill,
                        top_logprobs=req.top_logprobs, experts_per_token=req.experts_per_token,
                        cache_aware_margin=req.cache_aware_margin, client=req.client, dropped=dropped,
                        context_bound=want >= room, images=list(self.images), thinking_budget=budget if close else None,
                        thinking_close=close,
                        prefix_len=self._prefix_len(req, segments, prompt) if req.keep_prefix and not self.images else 0,
                        resume_len=self._resume_len(req, prompt, dropped) if tail == [] and self._recurrent else 0)

    @property
    def _recurrent(self) -> bool:
        return bool(getattr(self.model, "recurrent", False))

    def _resume_len(self, req: TurnRequest, prompt: list[int], dropped: int = 0) -> int:
        """How many tokens of ``prompt`` the next turn's prompt begins with: the prompt of this conversation
        with an answer and a new question after it, rendered and compared (the generation prompt may differ
        from how the history shows an answer, e.g. an empty thinking block). 0 when it cannot be rendered."""
        if req.raw or not req.messages:
            return 0
        if dropped:   # the turns the context policy left out are not in the prompt
            first = 1 if req.messages[0].get("role") == "system" else 0
            req = dataclasses.replace(req, messages=req.messages[:first] + req.messages[first + dropped:])
        images = self.images
        probe = dataclasses.replace(req, messages=[*req.messages, {"role": "assistant", "content": "\u2026"},
                                                   {"role": "user", "content": "\u2026"}])
        try:
            follow = self.model.encode(self._render(probe)[0])
        except (TurnError, ValueError):
            return 0
        finally:
            self.images = images
        n = 0
        for a, b in zip(prompt, follow):
            if a != b:
                break
            n += 1
        return n

    def _prefix_len(self, req: TurnRequest, segments: list[Segment], prompt: list[int]) -> int:
        """How many tokens of ``prompt`` come before the last message's text, when they encode on their own
        exactly as they begin the prompt (0: no such prefix)."""
        last = text_of(req.messages[-1].get("content")) if req.messages else ""
        at = next((i for i in range(len(segments) - 1, -1, -1) if not segments[i][1] and segments[i][0] == last),
                  None)
        if not at:
            return 0
        prefix = self.model.encode(segments[:at])
        return len(prefix) if prompt[:len(prefix)] == prefix else 0

    def _render(self, req: TurnRequest) -> tuple[list[Segment], str, str, bool, bool, list[Segment]]:
        """The prompt segments, the stream dialect, the channel left open, whether tool calls are Hermes' or
        Llama 3.1's, and the forced-call prefill (a tool_choice asking for a call)."""
        if req.raw:
            return self.plain(req), "think_tags", "response", False, False, []
        if self.kind == "k3":
            segments, channel, prefill = self._k3(req)
            return segments, "k3", channel, False, False, prefill
        if self.kind == "jinja":
            segments, channel, prefill = self._jinja(req)
            tooled = bool(req.tools) and req.tool_choice != "none"
            return segments, "think_tags", channel, tooled and self.hermes, tooled and self.llama3, prefill
        return self.plain(req), "think_tags", "response", False, False, []

    def _continued(self, req: TurnRequest) -> tuple[TurnRequest, list[Segment]]:
        """``continue_final``: the request for a new answer after the conversation before the last message
        (thinking off: the answer part is continued) and that message's text, which the prompt ends with
        as if the model had just written it. The events that follow are only what it writes next."""
        last = req.messages[-1] if req.messages else {}
        text = text_of(last.get("content"))
        if last.get("role") != "assistant" or not text or req.raw or req.tools:
            raise TurnError("continue_final needs the conversation to end with an answer that has text "
                            "(and no tools)", "messages")
        return dataclasses.replace(req, messages=list(req.messages[:-1]), thinking=False, continue_final=False), \
            [content(text)]

    def _close_thinking(self, dialect: str, channel: str) -> list[Segment]:
        """The markup that ends a thinking trace the generation prompt opened, before a continued answer."""
        if channel != "thinking":
            return []
        if dialect != "think_tags":
            raise TurnError("this model's chat format cannot continue an answer after its thinking", "messages")
        return [markup(THINK_CLOSE)]

    def _fit(self, req: TurnRequest, n_ctx: int, prompt: list[int], segments: list[Segment],
             tail: list[Segment] = ()) -> tuple[list[int], list[Segment], int]:
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
            rendered = self._render(trial)
            segments = rendered[0] + (self._close_thinking(rendered[1], rendered[2]) + list(tail) if tail else [])
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

    def _k3(self, req: TurnRequest) -> tuple[list[Segment], str, list[Segment]]:
        """The prompt, the channel it leaves open, and the forced-call prefill (a named tool_choice)."""
        effort = req.reasoning_effort
        thinking = req.thinking and effort != "none"
        asked = None   # thinking switched on or off by chat_template_kwargs
        if req.chat_template_kwargs:
            if set(req.chat_template_kwargs) - {"thinking", "enable_thinking"}:
                raise TurnError("the K3 chat format takes only 'thinking' in chat_template_kwargs",
                                "chat_template_kwargs")
            asked = req.chat_template_kwargs.get("thinking", req.chat_template_kwargs.get("enable_thinking"))
            if not isinstance(asked, bool):
                raise TurnError("chat_template_kwargs.thinking must be true or false", "chat_template_kwargs")
            thinking = asked
        named = _named_tool(req.tool_choice)
        prefill: list[Segment] = []
        if named is not None:
            # K3 has wording for "required" but none for one tool: it is told "required" and that tool's call
            # is opened right after the generation prompt, so the answer cannot think first.
            if asked is True:
                raise TurnError("a tool_choice naming a function cannot be combined with thinking in the K3 "
                                "format (the call is opened right after the prompt)", "tool_choice")
            thinking = False
            prefill = forced_call_prefix(named)
        body: dict[str, Any] = {
            "messages": [self._k3_message(m) for m in req.messages],
            "thinking": thinking,
            "thinking_effort": K3_EFFORT.get(effort) if thinking and effort else None,
        }
        if req.tools:
            body["tools"] = list(req.tools)
        self.images = self._k3_images(req)
        if self.images:
            body["image_prompts"] = [image_markup(img) for img in self.images]
        if req.tool_choice is not None:
            body["tool_choice"] = "required" if named is not None else req.tool_choice
        if req.response_format is not None:
            body["response_format"] = req.response_format
        try:
            segments = render_k3(body)
        except ValueError as exc:
            raise TurnError(str(exc), "messages") from None
        return segments, "thinking" if thinking else "response", prefill

    def _k3_images(self, req: TurnRequest) -> list:
        """The request's images, decoded and resized for the tower, in prompt order (only user messages
        carry images; only data: URLs, nothing is fetched)."""
        images = []
        for n, (i, _, part) in enumerate(image_parts(req.messages), 1):
            where = f"messages[{i}]"
            if req.messages[i].get("role") != "user":
                raise TurnError(f"{where}: images are taken in user messages only", "messages")
            name = part.get("name") if isinstance(part.get("name"), str) else f"image {n}"
            try:
                data = data_url_bytes(part_url(part), name)
                images.append(self.model.prepare_image(data, name, req.image_patch_budget))
            except ImageError as exc:
                raise TurnError(str(exc), "messages") from None
        return images

    @staticmethod
    def _k3_message(m: dict[str, Any]) -> dict[str, Any]:
        d = {k: v for k, v in m.items() if v is not None}
        if d["role"] == "developer":
            d["role"] = "system"
        return d

    def _jinja(self, req: TurnRequest) -> tuple[list[Segment], str, list[Segment]]:
        if req.response_format is not None and req.response_format.get("type") != "text":
            raise TurnError("response_format needs a chat format that supports it (Kimi K3); this model's "
                            "template does not", "response_format")
        tools = None
        prefill: list[Segment] = []
        forced = req.tools and req.tool_choice not in (None, "none", "auto")
        if req.tools and req.tool_choice != "none":
            if not self.template_takes_tools:
                raise TurnError("this model's chat template does not take tools", "tools")
            tools = list(req.tools)
            if forced:
                prefill = [(self._forced_call_text(_named_tool(req.tool_choice)), True)]
        extra = dict(req.chat_template_kwargs or {})
        clash = RESERVED_TEMPLATE_VARS & set(extra)
        if clash:
            raise TurnError(f"chat_template_kwargs may not set {', '.join(sorted(clash))}", "chat_template_kwargs")
        # A forced call is opened right after the generation prompt, so the answer starts without thinking.
        extra.setdefault("enable_thinking", bool(req.thinking) and req.reasoning_effort != "none" and not forced)
        messages = []
        for m in req.messages:
            d: dict[str, Any] = {"role": "system" if m["role"] == "developer" else m["role"],
                                 "content": text_of(m.get("content"))}
            for key in ("name", "tool_call_id", "reasoning_content"):
                if m.get(key) is not None:
                    d[key] = m[key]
            if m.get("tool_calls"):
                d["tool_calls"] = [_template_call(c) for c in m["tool_calls"]]
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
        channel = opening_channel(segments)
        if prefill and channel == "thinking":
            raise TurnError("tool_choice cannot force a call here: this model's template opens its thinking "
                            "after the prompt (set enable_thinking to false, or use 'auto')", "tool_choice")
        return segments, channel, prefill

    def _forced_call_text(self, name: str | None) -> str:
        """The start of a tool call in the template's own format, written after the generation prompt so the
        model continues it: ``required`` opens a call, a named tool_choice also writes the function's name."""
        head = '{"name": ' + (json.dumps(name, ensure_ascii=False) + ", " if name is not None else '"')
        if self.hermes:
            return HERMES_OPEN + "\n" + head + ('"arguments": ' if name is not None else "")
        if self.llama3:
            return head + ('"parameters": ' if name is not None else "")
        raise TurnError("this model's chat template has no tool-call format Ferry can read (Hermes <tool_call> "
                        "or Llama 3.1 JSON), so tool_choice cannot force a call; use 'auto' or 'none'",
                        "tool_choice")

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


def _template_call(call: dict[str, Any]) -> dict[str, Any]:
    """An OpenAI tool call as chat templates read it: the arguments as an
    object when they are JSON text of one (templates write them with
    ``tojson``), else the text as it is."""
    function = dict(call.get("function") or {})
    args = function.get("arguments")
    if isinstance(args, str):
        try:
            parsed = json.loads(args) if args.strip() else {}
        except ValueError:
            parsed = None
        if isinstance(parsed, dict):
            function["arguments"] = parsed
    return {**call, "function": function}


def _named_tool(choice: Any) -> str | None:
    """The function a tool_choice names (OpenAI's ``{"type": "function", "function": {"name": ...}}``)."""
    if isinstance(choice, dict):
        name = (choice.get("function") or {}).get("name")
        if not isinstance(name, str) or not name:
            raise TurnError("tool_choice must be 'none', 'auto', 'required' or name a function", "tool_choice")
        return name
    if choice is not None and choice not in ("none", "auto", *FORCED_CHOICES):
        raise TurnError("tool_choice must be 'none', 'auto', 'required' or name a function", "tool_choice")
    return None


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
        self.matched: str | None = None   #: the stop sequence that ended the answer

    def feed(self, text: str) -> str:
        if self.stopped:
            return ""
        if not self.stops:
            return text
        buf = self.held + text
        hits = [(pos, -len(s), s) for pos, s in ((buf.find(s), s) for s in self.stops) if pos >= 0]
        if hits:
            pos, _, self.matched = min(hits)
            self.held, self.stopped = "", True
            return buf[:pos]
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
        self.llama3 = prepared.llama3_tools
        self._l3: list[str] = []          # a Llama 3.1 answer held while it may be tool calls
        self._l3_mode = "undecided"       # "undecided", "call" (read as calls to the end) or "text"
        self.single_call = not prepared.parallel_tool_calls
        self._in_call = False
        self._call_text: list[str] = []
        self._reader: JsonCallReader | None = None   # the JSON call being written (Hermes, Llama 3.1)
        self._space = ""                  # whitespace held: it shows only if text follows (not a call)
        self.content: list[str] = []
        self.reasoning: list[str] = []
        self.tool_calls: list[ToolCall] = []
        self.reasoning_tokens = 0
        # A forced tool call's opening, written after the prompt: parsed as if the model had written it.
        if prepared.prefill_ids and self.k3:
            self._pending = self._route([ev for i in prepared.prefill_ids for ev in self.parser.feed_token(i)])
        else:
            self._pending = self._route(self.parser.feed(prepared.prefill_text)) if prepared.prefill_text else []

    @property
    def ended(self) -> bool:
        return self.stop.stopped or self.parser.ended or (self.single_call and bool(self.tool_calls))

    def token(self, token_id: int, text: str) -> list[TurnEvent]:
        events = self.parser.feed_token(token_id) if self.k3 else self.parser.feed(text)
        out = self._take_pending() + self._route(events)
        if out and all(isinstance(ev, Reasoning) for ev in out):
            self.reasoning_tokens += 1
        return out

    def text(self, text: str) -> list[TurnEvent]:
        """Generated text without token ids (a remote engine's stream)."""
        return self._take_pending() + self._route(self.parser.feed(text))

    def _take_pending(self) -> list[TurnEvent]:
        out, self._pending = self._pending, []
        return out

    def finish(self) -> list[TurnEvent]:
        out = self._take_pending() + self._route(self.parser.finish())
        if self.hermes is not None:
            rest = self.hermes.flush()
            lead = "" if self.tool_calls else self._space   # space after the last call is not text
            if self._in_call and self._reader is not None and self._reader.opened:
                self._reader.feed(rest)   # an unclosed call already streamed stays a call
                out += self._json_call()
                self._in_call, rest = False, ""
            elif self._in_call:  # an unclosed call is shown as the text it was
                rest = HERMES_OPEN + "".join(self._call_text) + rest
                self._in_call, lead = False, self._space
            self._space = ""
            out += self._content(lead + rest)
        if self.llama3 and self._l3:
            held, self._l3, reader = "".join(self._l3), [], self._reader
            streamed = self._l3_mode == "call" and (bool(self.tool_calls) or (reader is not None and reader.opened))
            if streamed:   # the calls streamed as written stay calls; what follows them is read on its own
                held = reader.text if reader is not None and not reader.opened else ""
                out += self._json_call()
            self._reader = None
            calls = [] if self._l3_mode != "call" else _llama3_calls(held)
            if calls:
                for name, args in calls[:1] if self.single_call else calls:
                    out.append(self.call(ToolCall(name, len(self.tool_calls) + 1, args)))
            elif not streamed:
                out += self._content(held)
            elif held.strip(" ;\n\t"):   # text after calls already streamed
                out += self._content(held.lstrip(" ;\n\t"))
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
                if self.hermes is not None:
                    out += self._hermes(value)
                elif self.llama3:
                    out += self._llama3(value)
                else:
                    out += self._content(value)
            elif kind == "tool_call" and not (self.single_call and self.tool_calls):
                out.append(self.call(value))
            elif kind in ("tool_call_start", "tool_call_args") and not (self.single_call and self.tool_calls):
                index, text = value   # a call as it is written (K3): its name, then pieces of its arguments
                out.append(ToolCallDelta(index, text, "") if kind == "tool_call_start"
                           else ToolCallDelta(index, None, text))
        return out

    def _llama3(self, text: str) -> list[TurnEvent]:
        """A Llama 3.1 answer that begins with ``{`` or ``<|python_tag|>`` is held to the end (then read as
        tool calls, or shown as the text it was); any other answer streams as text."""
        if self._l3_mode == "text":
            return self._content(text)
        self._l3.append(text)
        if self._l3_mode == "call":
            return self._llama3_read(text)
        start = "".join(self._l3).lstrip()
        if not start or LLAMA3_TAG.startswith(start):
            return []
        if start.startswith(("{", LLAMA3_TAG)):
            self._l3_mode = "call"
            return self._llama3_read(start.removeprefix(LLAMA3_TAG))
        self._l3_mode = "text"
        held, self._l3 = "".join(self._l3), []
        return self._content(held)

    def _llama3_read(self, text: str) -> list[TurnEvent]:
        """Llama 3.1 calls streamed as they are written, one after another (``;`` between them)."""
        out: list[TurnEvent] = []
        while text:
            if self._reader is None:
                self._reader = JsonCallReader(len(self.tool_calls) + 1)
            out += self._route(self._reader.feed(text))
            text = ""
            if self._reader.complete:
                text = self._reader.tail
                out += self._json_call()
        return out

    def _hermes(self, text: str) -> list[TurnEvent]:
        out: list[TurnEvent] = []
        for piece, is_marker in self.hermes.feed(text):
            if is_marker and piece == HERMES_OPEN:
                self._in_call, self._call_text = True, []
                self._reader = JsonCallReader(len(self.tool_calls) + 1)
            elif is_marker:
                if self._in_call:
                    out += self._hermes_call("".join(self._call_text))
                self._in_call = False
            elif self._in_call:
                self._call_text.append(piece)
                out += self._route(self._reader.feed(piece))
            elif not piece.strip():
                self._space += piece
            else:
                out += self._content(self._space + piece)
                self._space = ""
        return out

    def _json_call(self) -> list[TurnEvent]:
        """The call the reader streamed, as written (its arguments broken JSON if the model broke them)."""
        reader, self._reader = self._reader, None
        if reader is None or not reader.opened or (self.single_call and self.tool_calls):
            return []
        return [self.call(ToolCall(reader.name, reader.index, reader.arguments))]

    def _hermes_call(self, body: str) -> list[TurnEvent]:
        if self._reader is not None and self._reader.opened:
            self._space = ""
            return self._json_call()
        self._reader = None
        if self.single_call and self.tool_calls:
            return []
        try:
            doc = json.loads(body)
            name, arguments = doc["name"], doc.get("arguments", {})
            if not isinstance(name, str):
                raise TypeError
        except (ValueError, KeyError, TypeError):
            text, self._space = self._space + HERMES_OPEN + body + HERMES_CLOSE, ""
            return self._content(text)
        self._space = ""   # space between text and a call, or between calls, is not text
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


def _llama3_calls(text: str) -> list[tuple[str, str]]:
    """(name, JSON arguments) of an answer made of Llama 3.1 tool calls: JSON
    objects ``{"name": ..., "parameters": {...}}`` (or ``"arguments"``),
    optionally after ``<|python_tag|>``, separated by ``;`` or whitespace.
    Empty if the answer is anything else."""
    text = text.strip()
    if text.startswith(LLAMA3_TAG):
        text = text[len(LLAMA3_TAG):]
    decoder, pos, calls = json.JSONDecoder(), 0, []
    while True:
        while pos < len(text) and (text[pos].isspace() or text[pos] == ";"):
            pos += 1
        if pos == len(text):
            return calls
        try:
            doc, pos = decoder.raw_decode(text, pos)
        except ValueError:
            return []
        args = doc.get("parameters", doc.get("arguments", {})) if isinstance(doc, dict) else None
        if not isinstance(doc.get("name") if isinstance(doc, dict) else None, str) or not isinstance(args, dict):
            return []
        calls.append((doc["name"], json.dumps(args, ensure_ascii=False)))


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
                        started=start, ended=ended, logprobs=list(logprobs), error=error,
                        stop_sequence=builder.stop.matched, **extra)

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
    # a thinking budget: once the answer has thought that many tokens, the markup that ends its thinking is
    # written for it (the engine takes ``forced`` ids before sampling), and it answers
    forced: deque[int] = deque()
    budget, thought = prepared.thinking_budget, 0
    events = model.generate(session, prepared.prompt, prepared.params, max_tokens=prepared.max_tokens,
                            reuse_limit=reuse_limit, top_logprobs=prepared.top_logprobs, images=prepared.images,
                            **({"forced": forced} if budget is not None else {}),
                            **({"resume_at": prepared.resume_len} if prepared.resume_len else {}))
    try:
        for ev in events:
            if isinstance(ev, ImageProgress):
                yield ev
            elif isinstance(ev, PromptProgress):
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
                thinking = budget is not None and builder.parser.thinking
                yield from builder.token(ev.id, ev.text)
                if builder.ended:
                    break
                if thinking:
                    thought += 1
                    if thought >= budget and builder.parser.thinking:
                        forced.extend(prepared.thinking_close)
                        budget = None
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
