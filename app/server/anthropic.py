"""Anthropic's Messages API beside the OpenAI one: ``POST /v1/messages`` and
``POST /v1/messages/count_tokens``, for clients and coding agents that speak
Claude's API.

A Messages request becomes the OpenAI ``ChatCompletionRequest`` that says the
same thing (``openai_request``: system and text blocks, ``tool_use`` blocks as
an assistant's ``tool_calls``, ``tool_result`` blocks as ``tool`` messages,
``tool_choice`` auto/any/tool/none, ``thinking`` as the thinking switch), so
both APIs build the same prompt through the one turn pipeline
(``ChatFormatter.prepare``) and run on the same engine service. The turn's
events come back in Anthropic's shapes: a ``message`` with thinking, text
and tool_use content blocks (``message_body``), or its server-sent event
sequence (``stream_events``). Errors are Anthropic error objects
(``error_response``).
"""
from __future__ import annotations

import json
from typing import Annotated, Any, Literal, Union

from fastapi.responses import JSONResponse
from pydantic import Field, field_validator
from sse_starlette import ServerSentEvent

from app.chat.stream_parser import ToolCall, unsent_arguments
from app.events import PromptProgress, Reasoning, Text, ToolCallDelta, ToolCallMade, TurnDone
from app.server.errors import APIError, invalid
from app.server.schemas import (MAX_STOP_CHARS, MAX_STOP_SEQUENCES, MAX_TOOLS, ChatCompletionRequest, Open,
                                Strict)

#: Paths answered in Anthropic's shapes (their errors too).
PREFIX = "/v1/messages"
#: Anthropic's error types by HTTP status.
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 405: "invalid_request_error", 413: "request_too_large",
               429: "rate_limit_error", 500: "api_error", 503: "overloaded_error"}
CacheControl = dict[str, Any] | None   #: accepted on blocks and tools, and ignored (Ferry keeps its own prefix)


# ---------------------------------------------------------------- requests

class TextBlock(Strict):
    type: Literal["text"]
    text: str = Field(max_length=1 << 22)
    cache_control: CacheControl = None
    citations: list[Any] | None = None


class ImageSource(Strict):
    type: Literal["base64", "url"]
    media_type: str | None = Field(default=None, max_length=64)
    data: str | None = Field(default=None, max_length=64 << 20)
    url: str | None = Field(default=None, max_length=1 << 16)


class ImageBlock(Strict):
    """An image (models with a vision tower: Kimi K3): base64 only, a URL source is refused (nothing is fetched)."""
    type: Literal["image"]
    source: ImageSource
    cache_control: CacheControl = None


class ToolUseBlock(Strict):
    type: Literal["tool_use"]
    id: str = Field(min_length=1, max_length=256)
    name: str = Field(min_length=1, max_length=256)
    input: dict[str, Any]
    cache_control: CacheControl = None


class ToolResultBlock(Strict):
    type: Literal["tool_result"]
    tool_use_id: str = Field(min_length=1, max_length=256)
    content: Union[str, list[TextBlock], None] = None
    is_error: bool | None = None
    cache_control: CacheControl = None


class ThinkingBlock(Strict):
    type: Literal["thinking"]
    thinking: str = Field(max_length=1 << 22)
    signature: str | None = Field(default=None, max_length=1 << 16)


class RedactedThinkingBlock(Strict):
    type: Literal["redacted_thinking"]
    data: str = Field(max_length=1 << 22)


Block = Annotated[Union[TextBlock, ImageBlock, ToolUseBlock, ToolResultBlock, ThinkingBlock, RedactedThinkingBlock],
                  Field(discriminator="type")]


BLOCK_TYPES = ("text", "image", "tool_use", "tool_result", "thinking", "redacted_thinking")


class MessageParam(Strict):
    role: Literal["user", "assistant"]
    content: Union[str, list[Block]]

    @field_validator("content", mode="before")
    @classmethod
    def _known_blocks(cls, value):
        for j, block in enumerate(value if isinstance(value, list) else ()):
            kind = block.get("type") if isinstance(block, dict) else None
            if kind not in BLOCK_TYPES:
                raise ValueError(f"content[{j}] is a {kind!r} block; this server takes "
                                 f"{', '.join(BLOCK_TYPES)} blocks")
        return value


class ToolParam(Strict):
    name: str = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_.\-]+$")
    description: str | None = Field(default=None, max_length=1 << 16)
    input_schema: dict[str, Any]
    type: Literal["custom"] | None = None
    cache_control: CacheControl = None


class ToolChoiceAuto(Strict):
    type: Literal["auto"]
    disable_parallel_tool_use: bool | None = None


class ToolChoiceAny(Strict):
    type: Literal["any"]
    disable_parallel_tool_use: bool | None = None


class ToolChoiceTool(Strict):
    type: Literal["tool"]
    name: str = Field(min_length=1, max_length=128)
    disable_parallel_tool_use: bool | None = None


class ToolChoiceNone(Strict):
    type: Literal["none"]


class ThinkingEnabled(Strict):
    type: Literal["enabled"]
    budget_tokens: int = Field(ge=1, description="must be less than max_tokens; the thinking part ends after this many tokens "
                                                   "(its end is written for the model, which then answers)")
    display: Literal["summarized", "omitted"] | None = None


class ThinkingAdaptive(Strict):
    type: Literal["adaptive"]
    display: Literal["summarized", "omitted"] | None = None


class ThinkingDisabled(Strict):
    type: Literal["disabled"]


class CountTokensRequest(Strict):
    """What ``/v1/messages/count_tokens`` takes: the prompt half of a request."""

    model: str = Field(max_length=512)
    messages: list[MessageParam] = Field(min_length=1, max_length=4096)
    system: Union[str, list[TextBlock], None] = None
    tools: list[ToolParam] | None = Field(default=None, max_length=MAX_TOOLS)
    tool_choice: Annotated[Union[ToolChoiceAuto, ToolChoiceAny, ToolChoiceTool, ToolChoiceNone],
                           Field(discriminator="type")] | None = None
    thinking: Annotated[Union[ThinkingEnabled, ThinkingAdaptive, ThinkingDisabled],
                        Field(discriminator="type")] | None = Field(
        default=None, description="enabled/adaptive: the model's thinking mode where its format has one; "
                                  "absent or disabled: no thinking")


class MessagesRequest(CountTokensRequest):
    max_tokens: int = Field(ge=1)
    stop_sequences: list[Annotated[str, Field(min_length=1, max_length=MAX_STOP_CHARS)]] | None = Field(
        default=None, max_length=MAX_STOP_SEQUENCES)
    stream: bool = False
    temperature: float | None = Field(default=None, ge=0, le=1)
    top_p: float | None = Field(default=None, gt=0, le=1)
    top_k: int | None = Field(default=None, ge=0, le=1 << 20)
    metadata: dict[str, Any] | None = Field(default=None, description="accepted; not stored")
    service_tier: str | None = Field(default=None, max_length=64, description="accepted; ignored")
    cache_control: CacheControl = Field(default=None, description="accepted; ignored (Ferry keeps the longest "
                                                                  "prefix it can anyway)")


# ---------------------------------------------------------------- responses (the OpenAPI description)

class ErrorDetail(Open):
    type: str
    message: str


class ErrorResponse(Open):
    type: Literal["error"] = "error"
    error: ErrorDetail


class Usage(Open):
    input_tokens: int
    output_tokens: int
    cache_read_input_tokens: int | None = None
    cache_creation_input_tokens: int | None = None


class Message(Open):
    id: str
    type: Literal["message"] = "message"
    role: Literal["assistant"] = "assistant"
    model: str
    content: list[dict[str, Any]] = Field(description="thinking, text and tool_use blocks")
    stop_reason: Literal["end_turn", "max_tokens", "stop_sequence", "tool_use"]
    stop_sequence: str | None = None
    usage: Usage


class TokenCount(Open):
    input_tokens: int


# ---------------------------------------------------------------- request → the OpenAI request

def openai_request(req: CountTokensRequest, max_tokens_limit: int | None = None) -> ChatCompletionRequest:
    """The OpenAI chat request saying what ``req`` says (the one prompt path).
    ``max_tokens`` is required in Anthropic's API and agents send large
    values, so it is capped at ``max_tokens_limit`` (the server's limit)
    rather than refused."""
    messages: list[dict[str, Any]] = []
    if req.system:
        system = req.system if isinstance(req.system, str) else [_part(b.text) for b in req.system]
        messages.append({"role": "system", "content": system})
    for i, m in enumerate(req.messages):
        where = f"messages[{i}]"
        if isinstance(m.content, str):
            messages.append({"role": m.role, "content": m.content})
        elif m.role == "user":
            messages += _user_messages(m.content, where)
        else:
            messages.append(_assistant_message(m.content, where))
    if req.messages[-1].role == "assistant":
        raise invalid("The last message is the assistant's: Ferry answers a user turn and does not continue a "
                      "partial assistant message (a prefill).", f"messages[{len(req.messages) - 1}]")
    thinking = req.thinking is not None and req.thinking.type != "disabled"
    body: dict[str, Any] = {"model": req.model, "messages": messages,
                            "reasoning_effort": None if thinking else "none"}
    choice = req.tool_choice
    if isinstance(req, MessagesRequest):
        if isinstance(req.thinking, ThinkingEnabled) and req.thinking.budget_tokens >= req.max_tokens:
            raise invalid("max_tokens must be greater than thinking.budget_tokens.", "max_tokens")
        if thinking and choice is not None and choice.type in ("any", "tool"):
            raise invalid("Thinking may not be enabled when tool_choice forces tool use.", "tool_choice")
        body.update(max_tokens=min(req.max_tokens, max_tokens_limit or req.max_tokens), stop=req.stop_sequences, temperature=req.temperature,
                    top_p=req.top_p, top_k=req.top_k)
    if req.tools:
        body["tools"] = [{"type": "function", "function": {"name": t.name, "description": t.description,
                                                            "parameters": t.input_schema}} for t in req.tools]
    if choice is not None:
        if choice.type == "tool":
            body["tool_choice"] = {"type": "function", "function": {"name": choice.name}}
        else:
            body["tool_choice"] = {"auto": "auto", "any": "required", "none": "none"}[choice.type]
        if getattr(choice, "disable_parallel_tool_use", None):
            body["parallel_tool_calls"] = False
    return ChatCompletionRequest.model_validate({k: v for k, v in body.items() if v is not None})


def _part(text: str) -> dict[str, str]:
    return {"type": "text", "text": text}


def _image_part(b: ImageBlock, where: str) -> dict[str, Any]:
    """An image block as the chat format's image part (a data URL); a URL source is refused."""
    src = b.source
    if src.type != "base64":
        raise invalid("Image URLs are refused: send the image as base64 (Ferry fetches nothing).", where + ".source")
    if not src.data or not (src.media_type or "").startswith("image/"):
        raise invalid("A base64 image needs data and an image/... media_type.", where + ".source")
    return {"type": "image_url", "image_url": {"url": f"data:{src.media_type};base64,{src.data}"}}


def _user_messages(blocks: list, where: str) -> list[dict[str, Any]]:
    """A user turn: its tool results (as ``tool`` messages, first, as they answer the previous turn's calls),
    then its text."""
    results, parts = [], []
    for j, b in enumerate(blocks):
        if isinstance(b, ToolResultBlock):
            text = b.content if isinstance(b.content, str) else "".join(p.text for p in b.content or ())
            if b.is_error:
                text = "Error: " + text
            results.append({"role": "tool", "tool_call_id": b.tool_use_id, "content": text})
        elif isinstance(b, TextBlock):
            parts.append(_part(b.text))
        elif isinstance(b, ImageBlock):
            parts.append(_image_part(b, f"{where}.content[{j}]"))
        else:
            raise invalid(f"A user message cannot hold a {b.type} block.", f"{where}.content[{j}]")
    return results + ([{"role": "user", "content": parts}] if parts or not results else [])


def _assistant_message(blocks: list, where: str) -> dict[str, Any]:
    parts, thinking, calls = [], [], []
    for j, b in enumerate(blocks):
        if isinstance(b, TextBlock):
            parts.append(_part(b.text))
        elif isinstance(b, ThinkingBlock):
            thinking.append(b.thinking)
        elif isinstance(b, ToolUseBlock):
            calls.append({"id": b.id, "type": "function",
                          "function": {"name": b.name, "arguments": json.dumps(b.input, ensure_ascii=False)}})
        elif isinstance(b, ToolResultBlock):
            raise invalid("An assistant message cannot hold a tool_result block.", f"{where}.content[{j}]")
        # redacted_thinking: another server's sealed reasoning; nothing of it can be shown to this model
    message: dict[str, Any] = {"role": "assistant", "content": parts or None}
    if thinking:
        message["reasoning_content"] = "".join(thinking)
    if calls:
        message["tool_calls"] = calls
    return message


# ---------------------------------------------------------------- answers

def tool_input(arguments: str) -> dict[str, Any]:
    """A call's JSON arguments as Anthropic's ``input`` object; arguments that
    are not a JSON object (a model's mistake) are kept as ``{"_raw_arguments": text}``."""
    value = _object(arguments)
    return value if value is not None else {"_raw_arguments": arguments}


def _object(arguments: str) -> dict[str, Any] | None:
    try:
        value = json.loads(arguments) if arguments.strip() else {}
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def tool_use_id(mid: str, call: ToolCall) -> str:
    return f"toolu_{mid[-12:]}_{call.index}"


def stop_reason(s: TurnDone) -> str:
    if s.reason == "tool_calls":
        return "tool_use"
    if s.reason == "length":
        return "max_tokens"
    return "stop_sequence" if s.stop_sequence is not None else "end_turn"


def usage(s: TurnDone) -> dict[str, int]:
    """Anthropic's usage: ``input_tokens`` are the prompt tokens evaluated for
    this answer, ``cache_read_input_tokens`` those the session already held."""
    return {"input_tokens": s.prompt_tokens - s.reused_tokens, "output_tokens": s.completion_tokens,
            "cache_read_input_tokens": s.reused_tokens, "cache_creation_input_tokens": 0}


def message_body(s: TurnDone, mid: str, model_id: str, ferry: dict[str, Any]) -> dict[str, Any]:
    content: list[dict[str, Any]] = []
    if s.reasoning:
        content.append({"type": "thinking", "thinking": s.reasoning, "signature": ""})
    if s.content:
        content.append({"type": "text", "text": s.content})
    for call in s.tool_calls:
        content.append({"type": "tool_use", "id": tool_use_id(mid, call), "name": call.name,
                        "input": tool_input(call.arguments)})
    return {"id": mid, "type": "message", "role": "assistant", "model": model_id, "content": content,
            "stop_reason": stop_reason(s), "stop_sequence": s.stop_sequence, "usage": usage(s), "ferry": ferry}


def _event(name: str, data: dict[str, Any]) -> ServerSentEvent:
    return ServerSentEvent(json.dumps({"type": name, **data}, ensure_ascii=False, separators=(",", ":")),
                           event=name)


async def stream_events(job, mid: str, model_id: str, input_tokens: int, ferry):
    """Anthropic's event sequence for one answer: ``message_start``; per
    content block ``content_block_start``, its deltas (``thinking_delta``,
    ``text_delta``, ``input_json_delta``) and ``content_block_stop``;
    ``message_delta`` with the stop reason and usage; ``message_stop``. Prompt
    progress rides in SSE comments, which clients ignore. ``ferry(TurnDone)``
    gives Ferry's figures for the ``message_delta``.

    A tool call's input streams as the model writes it (``ToolCallDelta``:
    the block opens with its name, each piece a valid JSON prefix); a call
    read whole (or whose input breaks before any piece went) sends its input
    in one delta, as the answer does. Pieces sent cannot be taken back: if
    the model's JSON breaks after some, the block stops and an ``error``
    event ends the stream (the SDKs raise it), so no client runs a call with
    a cut input; the non-streamed answer keeps ``{"_raw_arguments": text}``."""
    index, open_kind = -1, None
    streamed: dict[int, str] = {}   # a call being written: its index -> the input sent so far

    def delta(text: str) -> ServerSentEvent:
        return _event("content_block_delta", {"index": index, "delta": {"type": "input_json_delta",
                                                                        "partial_json": text}})

    def close():
        nonlocal open_kind
        if open_kind is None:
            return []
        open_kind = None
        return [_event("content_block_stop", {"index": index})]

    def start(kind: str, block: dict[str, Any]):
        nonlocal index, open_kind
        out = close()
        index += 1
        open_kind = kind
        return out + [_event("content_block_start", {"index": index, "content_block": block})]

    try:
        yield _event("message_start", {"message": {
            "id": mid, "type": "message", "role": "assistant", "model": model_id, "content": [],
            "stop_reason": None, "stop_sequence": None,
            "usage": {"input_tokens": input_tokens, "output_tokens": 0}}})
        while True:
            ev = await job.next()
            out: list[ServerSentEvent] = []
            if isinstance(ev, PromptProgress):
                out.append(ServerSentEvent(comment="ferry " + json.dumps({"prompt_progress": [ev.done, ev.total]})))
            elif isinstance(ev, Reasoning):
                if open_kind != "thinking":
                    out += start("thinking", {"type": "thinking", "thinking": "", "signature": ""})
                out.append(_event("content_block_delta", {"index": index,
                                                          "delta": {"type": "thinking_delta", "thinking": ev.text}}))
            elif isinstance(ev, Text):
                if open_kind != "text":
                    out += start("text", {"type": "text", "text": ""})
                out.append(_event("content_block_delta", {"index": index,
                                                          "delta": {"type": "text_delta", "text": ev.text}}))
            elif isinstance(ev, ToolCallDelta):
                if ev.name is not None:
                    out += start("tool_use", {"type": "tool_use", "id": tool_use_id(mid, ToolCall(ev.name, ev.index, "")),
                                              "name": ev.name, "input": {}})
                    streamed[ev.index] = ""
                elif ev.index in streamed and ev.arguments:
                    streamed[ev.index] += ev.arguments
                    out.append(delta(ev.arguments))
            elif isinstance(ev, ToolCallMade):
                sent = streamed.pop(ev.call.index, None)
                if sent:
                    rest = unsent_arguments(sent, ev.call.arguments)
                    if rest is None or _object(ev.call.arguments) is None:
                        for sse in close():
                            yield sse
                        yield _event("error", {"error": {"type": "api_error", "message": (
                            f"The model's call to {ev.call.name} is not valid JSON after part of its input was "
                            f"streamed; it wrote: {ev.call.arguments[:2000]}")}})
                        return
                    out += [delta(rest)] if rest else []
                else:   # read whole, or opened with nothing of its input sent yet: the input in one delta
                    if sent is None:
                        out += start("tool_use", {"type": "tool_use", "id": tool_use_id(mid, ev.call),
                                                  "name": ev.call.name, "input": {}})
                    out.append(delta(json.dumps(tool_input(ev.call.arguments), ensure_ascii=False)))
                out += close()
            elif isinstance(ev, TurnDone):
                if ev.reason in ("cancelled", "error"):
                    message = ev.error if ev.reason == "error" and ev.error else "The request was cancelled."
                    yield _event("error", {"error": {"type": "api_error", "message": message}})
                    return
                for sse in close():
                    yield sse
                yield _event("message_delta", {"delta": {"stop_reason": stop_reason(ev),
                                                         "stop_sequence": ev.stop_sequence},
                                               "usage": usage(ev), "ferry": ferry(ev)})
                yield _event("message_stop", {})
                return
            for sse in out:
                yield sse
    finally:
        job.cancel()


# ---------------------------------------------------------------- errors

def error_body(exc: APIError) -> dict[str, Any]:
    kind = ERROR_TYPES.get(exc.status, "api_error" if exc.status >= 500 else "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": exc.message}}


def error_response(exc: APIError, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(error_body(exc), status_code=exc.status, headers=headers)


def is_anthropic(path: str) -> bool:
    return path == PREFIX or path.startswith(PREFIX + "/")
