"""OpenAI-style error objects. Every failure the server reports, from a body
that is not JSON to an engine fault, is one of these; no traceback ever
reaches a client."""
from __future__ import annotations

from typing import Any

from fastapi.responses import JSONResponse


class APIError(Exception):
    """A request the server refuses (or could not serve), as OpenAI reports it."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code

    def body(self) -> dict[str, Any]:
        return error_body(self.message, type=self.type, param=self.param, code=self.code)

    def response(self, headers: dict[str, str] | None = None) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=headers)


def error_body(message: str, *, type: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def invalid(message: str, param: str | None = None, code: str | None = "invalid_value") -> APIError:
    return APIError(400, message, param=param, code=code)


def unauthorized() -> APIError:
    return APIError(401, "Incorrect or missing API key: send it as 'Authorization: Bearer KEY' or 'x-api-key: KEY'.",
                    code="invalid_api_key")


def too_large(limit: int) -> APIError:
    return APIError(413, f"The request body is larger than this server accepts ({limit} bytes).",
                    code="request_too_large")


def queue_full(limit: int) -> APIError:
    return APIError(429, f"The engine already has {limit} requests waiting; try again shortly.",
                    type="rate_limit_error", code="queue_full")


def server_error(message: str = "The engine failed while answering.") -> APIError:
    return APIError(500, message, type="server_error", code="engine_error")


def lone_surrogate(value: Any, param: str = "") -> APIError | None:
    """A 400 naming the first string in ``value`` (a parsed JSON body) that holds
    a lone UTF-16 surrogate such as ``"\\ud800"``: JSON can spell one, but it is
    not text and cannot be tokenized, so it is refused rather than guessed at."""
    stack: list[tuple[str, Any]] = [(param, value)]
    while stack:
        where, v = stack.pop()
        if isinstance(v, str):
            if any(0xD800 <= ord(c) <= 0xDFFF for c in v):
                return APIError(400, f"{where or 'The body'} holds a lone UTF-16 surrogate (an escape such as "
                                     "\\ud800 without its pair), which is not text.",
                                param=where or None, code="invalid_unicode")
        elif isinstance(v, dict):
            stack.extend((f"{where}.{k}" if where else str(k), x) for k, x in reversed(list(v.items())))
            stack.extend((where or "body", k) for k in v if isinstance(k, str))
        elif isinstance(v, (list, tuple)):
            stack.extend((f"{where}[{i}]", x) for i, x in reversed(list(enumerate(v))))
    return None
