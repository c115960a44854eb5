"""The OpenAI-compatible HTTP API (FastAPI): /v1/models and
/v1/chat/completions, JSON or server-sent events, with OpenAI-style errors.

``create_app`` wires a ``ChatFormatter`` and an ``EngineQueue`` into an ASGI
app. A guard in front of it checks the Host header (a loopback server answers
only to loopback names, which stops DNS-rebinding pages), the API key, and the
body size, before any route sees the request.
"""
from __future__ import annotations

import asyncio
import hmac
import ipaddress
import json
import secrets
import time
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sse_starlette import EventSourceResponse, ServerSentEvent
from starlette.exceptions import HTTPException as StarletteHTTPException

from app.chat.stream_parser import ToolCall
from app.server.chat import ChatFormatter, Limits, Summary, figures
from app.server.engine import EngineQueue, Job
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


def is_loopback(host: str) -> bool:
    host = host.strip("[]")
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _error_responses(*codes: int) -> dict[int | str, dict[str, Any]]:
    names = {400: "Invalid request", 401: "Missing or wrong API key", 404: "Unknown model", 413: "Body too large",
             429: "Too many requests waiting", 500: "The engine failed", 503: "Shutting down"}
    return {c: {"model": ErrorResponse, "description": names[c]} for c in codes}


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
        problem = self._check(scope, headers)
        if problem is not None:
            return await problem.response()(scope, receive, send)
        declared = headers.get("content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > self.max_body):
            return await too_large(self.max_body).response()(scope, receive, send)
        body, more, extra = bytearray(), True, []
        while more:
            message = await receive()
            if message["type"] != "http.request":
                extra.append(message)
                break
            body += message.get("body", b"")
            more = message.get("more_body", False)
            if len(body) > self.max_body:
                return await too_large(self.max_body).response()(scope, receive, send)
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
            auth = headers.get("authorization", "")
            scheme, _, token = auth.partition(" ")
            if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), self.api_key.encode()):
                return unauthorized()
        return None


def openapi_document() -> dict[str, Any]:
    """The API's OpenAPI description (also served at /openapi.json)."""
    from types import SimpleNamespace

    return build_api(SimpleNamespace(limits=Limits()), None, model_id="MODEL").openapi()


def create_app(queue: EngineQueue, formatter: ChatFormatter, *, model_id: str, api_key: str | None = None,
               loopback_only: bool = True, created: int | None = None) -> Any:
    """The ASGI app: the API behind its guard."""
    return Guard(build_api(queue, formatter, model_id=model_id, created=created), api_key=api_key,
                 max_body=queue.limits.max_request_bytes, loopback_only=loopback_only)


def build_api(queue: EngineQueue, formatter: ChatFormatter | None, *, model_id: str,
              created: int | None = None) -> FastAPI:
    limits: Limits = queue.limits
    created = created or int(time.time())
    names = {model_id}
    api = FastAPI(title="Ferry", version="1", docs_url=None, redoc_url=None,
                  description="An OpenAI-compatible chat API over Ferry's local engine.")
    api.state.queue = queue

    @api.exception_handler(APIError)
    async def _api_error(_request, exc: APIError):
        return exc.response()

    @api.exception_handler(RequestValidationError)
    async def _invalid(_request, exc: RequestValidationError):
        return _validation_error(exc.errors()).response()

    @api.exception_handler(StarletteHTTPException)
    async def _http(_request, exc: StarletteHTTPException):
        kind = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
        return JSONResponse(error_body(str(exc.detail), code=kind), status_code=exc.status_code,
                            headers=getattr(exc, "headers", None))

    @api.exception_handler(Exception)
    async def _crash(_request, _exc: Exception):
        return server_error("The server failed while handling this request.").response()

    def card() -> ModelCard:
        return ModelCard(id=model_id, created=created, owned_by="ferry", max_model_len=queue.n_ctx)

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
        return FerryStatus(model=model_id, **queue.status())

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
        prepared = await asyncio.to_thread(formatter.prepare, body, limits=limits, n_ctx=queue.n_ctx)
        job = Job(prepared, asyncio.get_running_loop())
        queue.submit(job)
        rid = "chatcmpl-" + secrets.token_hex(12)
        stamp = int(time.time())
        if body.stream:
            include_usage = bool(body.stream_options and body.stream_options.include_usage)
            return EventSourceResponse(_stream(queue, job, rid, stamp, model_id, include_usage),
                                       ping=SSE_PING_SECONDS, headers={"Cache-Control": "no-store"})
        return await _complete(queue, job, request, rid, stamp, model_id)

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


def _usage(s: Summary) -> dict[str, Any]:
    return {"prompt_tokens": s.prompt_tokens, "completion_tokens": s.completion_tokens,
            "total_tokens": s.prompt_tokens + s.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": s.reused_tokens},
            "completion_tokens_details": {"reasoning_tokens": s.reasoning_tokens}}


def _ferry(s: Summary) -> dict[str, Any]:
    return {**figures(s.counters), "seconds": round(s.seconds, 6), "queue_seconds": round(s.queue_seconds, 6),
            "prompt_tokens_evaluated": s.prompt_tokens - s.reused_tokens, "reused_tokens": s.reused_tokens,
            "started": s.started, "ended": s.ended}


def _out_call(call: ToolCall, rid: str) -> dict[str, Any]:
    return {"id": f"call_{rid[-12:]}_{call.index}", "type": "function",
            "function": {"name": call.name, "arguments": call.arguments}}


async def _complete(queue: EngineQueue, job: Job, request: Request, rid: str, stamp: int, model_id: str):
    """Wait for the whole answer; a client that leaves meanwhile cancels it."""
    checked = time.monotonic()
    try:
        while True:
            try:
                ev = await asyncio.wait_for(job.next(), DISCONNECT_POLL)
            except asyncio.TimeoutError:
                ev = ("waiting",)
            if time.monotonic() - checked >= DISCONNECT_POLL:
                checked = time.monotonic()
                if await request.is_disconnected():
                    queue.cancel(job)
                    return JSONResponse(error_body("the client went away"), status_code=400)
            if ev[0] == "done":
                break
            if ev[0] == "error":
                raise server_error(ev[1])
            if ev[0] == "cancelled":
                raise APIError(503, "The request was cancelled.", type="server_error", code="cancelled")
    finally:
        queue.cancel(job)  # no-op once it is done
    s: Summary = ev[1]
    message: dict[str, Any] = {"role": "assistant", "content": s.content if s.content or not s.tool_calls else None}
    if s.reasoning:
        message["reasoning_content"] = s.reasoning
    if s.tool_calls:
        message["tool_calls"] = [_out_call(c, rid) for c in s.tool_calls]
    return JSONResponse({"id": rid, "object": "chat.completion", "created": stamp, "model": model_id,
                         "system_fingerprint": "ferry",
                         "choices": [{"index": 0, "message": message, "finish_reason": s.finish_reason,
                                      "logprobs": None}],
                         "usage": _usage(s), "ferry": _ferry(s)})


async def _stream(queue: EngineQueue, job: Job, rid: str, stamp: int, model_id: str, include_usage: bool):
    """chat.completion.chunk events; prompt progress rides in SSE comments
    (``: ferry {"prompt_progress": [done, total]}``), which clients ignore."""

    def chunk(delta: dict[str, Any] | None, finish: str | None = None, **extra) -> ServerSentEvent:
        choices = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}]
        doc = {"id": rid, "object": "chat.completion.chunk", "created": stamp, "model": model_id,
               "system_fingerprint": "ferry", "choices": choices, **extra}
        return ServerSentEvent(json.dumps(doc, ensure_ascii=False, separators=(",", ":")))

    pending_stats: dict[str, Any] | None = None
    calls = 0
    try:
        yield chunk({"role": "assistant", "content": ""})
        while True:
            ev = await job.next()
            kind = ev[0]
            if kind == "progress":
                yield ServerSentEvent(comment="ferry " + json.dumps({"prompt_progress": [ev[1], ev[2]]}))
            elif kind == "stats":
                pending_stats = {**figures(ev[1])}
            elif kind in ("content", "reasoning"):
                key = "content" if kind == "content" else "reasoning_content"
                extra = {"ferry": pending_stats} if pending_stats else {}
                pending_stats = None
                yield chunk({key: ev[1]}, **extra)
            elif kind == "tool_call":
                call = _out_call(ev[1], rid)
                yield chunk({"tool_calls": [{"index": calls, **call}]})
                calls += 1
            elif kind == "done":
                s: Summary = ev[1]
                yield chunk({}, s.finish_reason, ferry=_ferry(s), usage=None)
                if include_usage:
                    yield chunk(None, usage=_usage(s))
                yield ServerSentEvent("[DONE]")
                return
            else:
                message = ev[1] if kind == "error" else "The request was cancelled."
                yield ServerSentEvent(json.dumps(error_body(message, type="server_error", code="engine_error")))
                return
    finally:
        queue.cancel(job)
