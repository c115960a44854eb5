"""The HTTP API (FastAPI): OpenAI's /v1/models and /v1/chat/completions,
and Anthropic's /v1/messages and /v1/messages/count_tokens
(``app.server.anthropic``), JSON or server-sent events, each with its own
error shape.

``create_app`` wires a ``ChatFormatter`` and the ``EngineService`` into an
ASGI app. A guard in front of it checks the Host header (a loopback server answers
only to loopback names, which stops DNS-rebinding pages), the API key, and the
body size, before any route sees the request.
"""
from __future__ import annotations

import asyncio
import hmac
import json
import secrets
import time
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from sse_starlette import EventSourceResponse, ServerSentEvent
from starlette.exceptions import HTTPException as StarletteHTTPException

from app.chat.stream_parser import ToolCall, unsent_arguments
from app.api import (EngineService, ImageProgress, LiveStats, Logprob, PromptProgress, Reasoning, Text, ToolCallDelta, ToolCallMade,
                     TurnDone, logprobs_content)
from app.server import anthropic
from app.untrusted import is_loopback
from app.server.chat import ChatFormatter, Limits, client_id, figures, turn_request
from app.server.engine import AsyncJob
from app.server.errors import APIError, error_body, lone_surrogate, server_error, too_large, unauthorized
from app.server.schemas import (ChatCompletion, ChatCompletionRequest, ErrorResponse, FerryStatus, ModelCard,
                                ModelList)

SSE_PING_SECONDS = 10
DISCONNECT_POLL = 0.25
PUBLIC_PATHS = ("/openapi.json",)
#: One server-sent event of a streamed answer: ``data`` is a chat.completion.chunk
#: as JSON (or an error object), and the last one is ``[DONE]``.
SSE_EVENT = {"type": "object", "required": ["data"],
             "properties": {"data": {"type": "string"}, "event": {"type": "string"}, "id": {"type": "string"}}}


def _error_responses(*codes: int, model=ErrorResponse) -> dict[int | str, dict[str, Any]]:
    names = {400: "Invalid request", 401: "Missing or wrong API key", 404: "Unknown model", 413: "Body too large",
             429: "Too many requests waiting", 500: "The engine failed", 503: "Shutting down"}
    return {c: {"model": model, "description": names[c]} for c in codes}


class Guard:
    """Host check, API key and body size, as plain ASGI (before any parsing)."""

    def __init__(self, app, *, api_key: str | None, max_body: int, loopback_only: bool):
        self.app = app
        self.api_key = api_key
        self.max_body = max_body
        self.loopback_only = loopback_only

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        shape = anthropic.error_response if anthropic.is_anthropic(scope.get("path", "")) else APIError.response
        problem = self._check(scope, headers)
        if problem is not None:
            return await shape(problem)(scope, receive, send)
        declared = headers.get("content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > self.max_body):
            return await shape(too_large(self.max_body))(scope, receive, send)
        body, more, extra = bytearray(), True, []
        while more:
            message = await receive()
            if message["type"] != "http.request":
                extra.append(message)
                break
            body += message.get("body", b"")
            more = message.get("more_body", False)
            if len(body) > self.max_body:
                return await shape(too_large(self.max_body))(scope, receive, send)
        replay = [{"type": "http.request", "body": bytes(body), "more_body": False}, *extra]

        async def replayed():
            return replay.pop(0) if replay else await receive()

        await self.app(scope, replayed, send)

    def _check(self, scope, headers) -> APIError | None:
        if self.loopback_only:
            host = headers.get("host", "")
            name = host.rsplit(":", 1)[0] if not host.endswith("]") else host
            if host and not is_loopback(name):
                return APIError(400, "This server answers only to loopback host names.", code="invalid_host")
        if self.api_key and scope.get("path") not in PUBLIC_PATHS:
            # OpenAI's clients send "Authorization: Bearer KEY", Anthropic's "x-api-key: KEY"; either will do.
            scheme, _, token = headers.get("authorization", "").partition(" ")
            offered = [token.strip()] if scheme.lower() == "bearer" else []
            if "x-api-key" in headers:
                offered.append(headers["x-api-key"].strip())
            key = self.api_key.encode()
            if not any([hmac.compare_digest(t.encode(), key) for t in offered]):
                return unauthorized()
        return None


def openapi_document() -> dict[str, Any]:
    """The API's OpenAPI description (also served at /openapi.json)."""
    from types import SimpleNamespace

    return build_api(SimpleNamespace(n_ctx=0), None, model_id="MODEL").openapi()


def create_app(service: EngineService, formatter: ChatFormatter, *, model_id: str, limits: Limits = Limits(),
               api_key: str | None = None, loopback_only: bool = True, created: int | None = None) -> Any:
    """The ASGI app: the API behind its guard."""
    return Guard(build_api(service, formatter, model_id=model_id, limits=limits, created=created,
                           keyed=bool(api_key)),
                 api_key=api_key, max_body=limits.max_request_bytes, loopback_only=loopback_only)


def build_api(service: EngineService, formatter: ChatFormatter | None, *, model_id: str, limits: Limits = Limits(),
              created: int | None = None, keyed: bool = False) -> FastAPI:
    queue = service
    created = created or int(time.time())
    activations = formatter.model.engine.info.activations if formatter is not None else "f32"  # shown in the status
    names = {model_id}
    api = FastAPI(title="Ferry", version="1", docs_url=None, redoc_url=None,
                  description="OpenAI- and Anthropic-compatible chat APIs over Ferry's local engine.")
    api.state.queue = queue

    def shaped(request: Request, exc: APIError, headers=None):
        if anthropic.is_anthropic(request.url.path):
            return anthropic.error_response(exc, headers)
        return exc.response(headers)

    @api.exception_handler(APIError)
    async def _api_error(request, exc: APIError):
        return shaped(request, exc)

    @api.exception_handler(RequestValidationError)
    async def _invalid(request, exc: RequestValidationError):
        return shaped(request, _validation_error(exc.errors()))

    @api.exception_handler(StarletteHTTPException)
    async def _http(request, exc: StarletteHTTPException):
        kind = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
        detail = str(exc.detail)
        if exc.status_code == 404 and request.url.path.startswith("/v1/v1/"):
            detail += ": the path has /v1 twice (Anthropic's clients add /v1 themselves; give them http://HOST:PORT)"
        return shaped(request, APIError(exc.status_code, detail, code=kind),
                      getattr(exc, "headers", None))

    @api.exception_handler(Exception)
    async def _crash(request, _exc: Exception):
        return shaped(request, server_error("The server failed while handling this request."))

    def card() -> ModelCard:
        tools = formatter is not None and formatter.format.takes_tools
        return ModelCard(id=model_id, created=created, owned_by="ferry", max_model_len=queue.n_ctx,
                         capabilities=["tool_use"] if tools else [])

    @api.get("/v1/models", response_model=ModelList, responses=_error_responses(401))
    async def list_models() -> ModelList:
        return ModelList(data=[card()])

    @api.get("/v1/models/{model}", response_model=ModelCard, responses=_error_responses(401, 404))
    async def get_model(model: str) -> ModelCard:
        if model not in names:
            raise _unknown_model(model)
        return card()

    @api.get("/ferry/status", response_model=FerryStatus, responses=_error_responses(401))
    async def status() -> FerryStatus:
        return FerryStatus(model=model_id, activations=activations, **queue.status())

    @api.post("/v1/chat/completions", response_model=ChatCompletion,
              responses={200: {"content": {"text/event-stream": {"schema": SSE_EVENT}},
                               "description": "The answer; with stream=true, a stream of chat.completion.chunk "
                                              "events ending with [DONE]"},
                         **_error_responses(400, 401, 404, 413, 429, 500, 503)})
    async def chat_completions(body: ChatCompletionRequest, request: Request):
        if body.model not in names:
            raise _unknown_model(body.model)
        if (bad_text := lone_surrogate(body.model_dump(exclude_none=True))) is not None:
            raise bad_text
        client = client_id(keyed, (request.client.host, request.client.port) if request.client else None)
        job = await AsyncJob.start(queue, turn_request(body, limits=limits, client=client), limits.max_tokens)
        rid = "chatcmpl-" + secrets.token_hex(12)
        stamp = int(time.time())
        tokenizer = formatter.model.tokenizer
        if body.stream:
            include_usage = bool(body.stream_options and body.stream_options.include_usage)
            return EventSourceResponse(_stream(job, rid, stamp, model_id, include_usage, tokenizer),
                                       ping=SSE_PING_SECONDS, headers={"Cache-Control": "no-store"})
        return await _complete(job, request, rid, stamp, model_id, tokenizer)

    @api.post("/v1/messages", response_model=anthropic.Message,
              responses={200: {"content": {"text/event-stream": {"schema": SSE_EVENT}},
                               "description": "An Anthropic message; with stream=true, Anthropic's event sequence "
                                              "(message_start ... message_stop)"},
                         **_error_responses(400, 401, 404, 413, 429, 500, 503, model=anthropic.ErrorResponse)})
    async def messages(body: anthropic.MessagesRequest, request: Request):
        req, client, budget = await anthropic_request(body, request)
        turn = turn_request(req, limits=limits, client=client)
        turn.thinking_budget = budget
        job = await AsyncJob.start(queue, turn, limits.max_tokens)
        mid = "msg_" + secrets.token_hex(12)
        if body.stream:
            return EventSourceResponse(anthropic.stream_events(job, mid, model_id, job.prompt_tokens, _ferry),
                                       ping=SSE_PING_SECONDS, headers={"Cache-Control": "no-store"})
        done = await _wait(job, request)
        if done is None:
            return anthropic.error_response(APIError(400, "the client went away"))
        if done.reason in ("cancelled", "error"):
            raise _failed(done)
        return JSONResponse(anthropic.message_body(done, mid, model_id, _ferry(done)))

    @api.post("/v1/messages/count_tokens", response_model=anthropic.TokenCount,
              responses=_error_responses(400, 401, 404, 413, 500, model=anthropic.ErrorResponse))
    async def count_tokens(body: anthropic.CountTokensRequest, request: Request):
        req, client, _ = await anthropic_request(body, request)
        prepared = await asyncio.to_thread(formatter.prepare, req, limits=limits, n_ctx=1 << 62, client=client)
        return {"input_tokens": len(prepared.prompt)}

    async def anthropic_request(body, request: Request):
        """The Messages request as the OpenAI request it means, who asks, and its thinking budget (checked,
        not prepared)."""
        if body.model not in names:
            raise _unknown_model(body.model)
        if (bad_text := lone_surrogate(body.model_dump(exclude_none=True))) is not None:
            raise bad_text
        try:
            req = anthropic.openai_request(body, limits.max_tokens)
        except ValidationError as exc:
            raise _validation_error(exc.errors()) from None
        client = client_id(keyed, (request.client.host, request.client.port) if request.client else None)
        budget = body.thinking.budget_tokens if isinstance(body.thinking, anthropic.ThinkingEnabled) else None
        return req, client, budget

    return api


def _unknown_model(name: str) -> APIError:
    return APIError(404, f"The model '{name}' does not exist on this server; GET /v1/models lists it.",
                    param="model", code="model_not_found")


def _validation_error(errors: list[dict[str, Any]]) -> APIError:
    first = errors[0] if errors else {"msg": "invalid request", "loc": ()}
    loc = [str(x) for x in first.get("loc", ()) if x != "body"]
    # a Union reports the branch it tried as a location element: keep the request's own path
    path = ".".join(part if not part.isdigit() else f"[{part}]" for part in loc).replace(".[", "[")
    kind = first.get("type", "")
    if kind == "json_invalid":
        return APIError(400, f"The body is not valid JSON: {first.get('ctx', {}).get('error', first['msg'])}.",
                        code="invalid_json")
    if kind == "extra_forbidden":
        return APIError(400, f"Unrecognized request argument supplied: {path}", param=path or None,
                        code="unknown_parameter")
    if kind == "missing":
        return APIError(400, f"Missing required parameter: '{path}'.", param=path or None,
                        code="missing_required_parameter")
    if not loc:
        return APIError(400, "The body must be a JSON object (with Content-Type: application/json).",
                        code="invalid_body")
    return APIError(400, f"Invalid value for '{path}': {first.get('msg', 'invalid')}.", param=path or None,
                    code="invalid_value")


def _usage(s: TurnDone) -> dict[str, Any]:
    return {"prompt_tokens": s.prompt_tokens, "completion_tokens": s.completion_tokens,
            "total_tokens": s.prompt_tokens + s.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": s.reused_tokens},
            "completion_tokens_details": {"reasoning_tokens": s.reasoning_tokens}}


def _ferry(s: TurnDone) -> dict[str, Any]:
    return {**figures(s.counters), "seconds": round(s.seconds, 6), "queue_seconds": round(s.queue_seconds, 6),
            "ttft_s": round(s.ttft_s, 6) if s.ttft_s is not None else None,
            "prompt_tokens_evaluated": s.prompt_tokens - s.reused_tokens, "reused_tokens": s.reused_tokens,
            "started": s.started, "ended": s.ended}


def _logprobs(s: TurnDone, tokenizer) -> dict[str, Any] | None:
    return {"content": logprobs_content(s.logprobs, tokenizer), "refusal": None} if s.logprobs else None


def _out_call(call: ToolCall, rid: str) -> dict[str, Any]:
    return {"id": f"call_{rid[-12:]}_{call.index}", "type": "function",
            "function": {"name": call.name, "arguments": call.arguments}}


def _failed(s: TurnDone) -> APIError:
    if s.reason == "cancelled":
        return APIError(503, "The request was cancelled.", type="server_error", code="cancelled")
    return server_error(s.error or "The engine failed while answering.")


async def _wait(job: AsyncJob, request: Request) -> TurnDone | None:
    """Wait for the whole answer; a client that leaves meanwhile cancels it (None)."""
    checked = time.monotonic()
    try:
        while True:
            try:
                ev = await asyncio.wait_for(job.next(), DISCONNECT_POLL)
            except asyncio.TimeoutError:
                ev = None
            if time.monotonic() - checked >= DISCONNECT_POLL:
                checked = time.monotonic()
                if await request.is_disconnected():
                    job.cancel()
                    return None
            if isinstance(ev, TurnDone):
                return ev
    finally:
        job.cancel()  # no-op once it is done


async def _complete(job: AsyncJob, request: Request, rid: str, stamp: int, model_id: str, tokenizer):
    ev = await _wait(job, request)
    if ev is None:
        return JSONResponse(error_body("the client went away"), status_code=400)
    s: TurnDone = ev
    if s.reason in ("cancelled", "error"):
        raise _failed(s)
    message: dict[str, Any] = {"role": "assistant", "content": s.content if s.content or not s.tool_calls else None}
    if s.reasoning:
        message["reasoning_content"] = s.reasoning
    if s.tool_calls:
        message["tool_calls"] = [_out_call(c, rid) for c in s.tool_calls]
    return JSONResponse({"id": rid, "object": "chat.completion", "created": stamp, "model": model_id,
                         "system_fingerprint": "ferry",
                         "choices": [{"index": 0, "message": message, "finish_reason": s.reason,
                                      "logprobs": _logprobs(s, tokenizer)}],
                         "usage": _usage(s), "ferry": _ferry(s)})


async def _stream(job: AsyncJob, rid: str, stamp: int, model_id: str, include_usage: bool, tokenizer):
    """chat.completion.chunk events; prompt progress rides in SSE comments
    (``: ferry {"prompt_progress": [done, total]}``), which clients ignore.
    With logprobs asked for, each chunk carries the logprobs of the tokens
    whose text it sends (as OpenAI does); tokens that show no text (an end
    token, chat markup, text a stop sequence swallowed) ride with the next
    chunk, at the latest the final one. In order, they are the non-streamed
    answer's ``logprobs.content``."""

    def chunk(delta: dict[str, Any] | None, finish: str | None = None, logprobs=None, **extra) -> ServerSentEvent:
        choices = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish,
                                            "logprobs": logprobs}]
        doc = {"id": rid, "object": "chat.completion.chunk", "created": stamp, "model": model_id,
               "system_fingerprint": "ferry", "choices": choices, **extra}
        return ServerSentEvent(json.dumps(doc, ensure_ascii=False, separators=(",", ":")))

    pending_stats: dict[str, Any] | None = None
    pending_logprobs: list = []
    calls = 0
    streaming: dict[int, tuple[int, str]] = {}   # a call being written: its index -> (its slot, arguments sent)

    def logprobs() -> dict[str, Any] | None:
        if not pending_logprobs:
            return None
        content = logprobs_content(pending_logprobs, tokenizer)
        pending_logprobs.clear()
        return {"content": content, "refusal": None}

    try:
        yield chunk({"role": "assistant", "content": ""})
        while True:
            ev = await job.next()
            if isinstance(ev, PromptProgress):
                yield ServerSentEvent(comment="ferry " + json.dumps({"prompt_progress": [ev.done, ev.total]}))
            elif isinstance(ev, ImageProgress):   # an image in the vision tower, before the prompt
                yield ServerSentEvent(comment="ferry " + json.dumps(
                    {"image_progress": [ev.image, ev.images, ev.block, ev.blocks]}))
            elif isinstance(ev, LiveStats):
                pending_stats = {**figures(ev.counters)}
            elif isinstance(ev, Logprob):
                pending_logprobs.append((ev.token, ev.value))
            elif isinstance(ev, (Text, Reasoning)):
                key = "content" if isinstance(ev, Text) else "reasoning_content"
                extra = {"ferry": pending_stats} if pending_stats else {}
                pending_stats = None
                yield chunk({key: ev.text}, logprobs=logprobs(), **extra)
            elif isinstance(ev, ToolCallDelta):
                # As OpenAI streams a call: its id, type and name with empty arguments, then argument pieces.
                if ev.name is not None:
                    streaming[ev.index] = (calls, "")
                    opened = _out_call(ToolCall(ev.name, ev.index, ""), rid)
                    yield chunk({"tool_calls": [{"index": calls, **opened}]}, logprobs=logprobs())
                    calls += 1
                elif ev.index in streaming and ev.arguments:
                    slot, sent = streaming[ev.index]
                    streaming[ev.index] = (slot, sent + ev.arguments)
                    yield chunk({"tool_calls": [{"index": slot, "function": {"arguments": ev.arguments}}]},
                                logprobs=logprobs())
            elif isinstance(ev, ToolCallMade):
                if ev.call.index in streaming:   # written piece by piece: what was not sent yet, if anything
                    slot, sent = streaming.pop(ev.call.index)
                    rest = unsent_arguments(sent, ev.call.arguments)   # the model's broken JSON too, as written
                    if rest:
                        yield chunk({"tool_calls": [{"index": slot, "function": {"arguments": rest}}]},
                                    logprobs=logprobs())
                    continue
                call = _out_call(ev.call, rid)
                yield chunk({"tool_calls": [{"index": calls, **call}]}, logprobs=logprobs())
                calls += 1
            elif isinstance(ev, TurnDone):
                s = ev
                if s.reason in ("cancelled", "error"):
                    message = s.error if s.reason == "error" and s.error else "The request was cancelled."
                    yield ServerSentEvent(json.dumps(error_body(message, type="server_error", code="engine_error")))
                    return
                yield chunk({}, s.reason, logprobs(), ferry=_ferry(s), usage=None)
                if include_usage:
                    yield chunk(None, usage=_usage(s))
                yield ServerSentEvent("[DONE]")
                return
    finally:
        job.cancel()
