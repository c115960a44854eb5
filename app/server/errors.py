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
    return APIError(401, "Incorrect or missing API key: send it as 'Authorization: Bearer KEY'.",
                    code="invalid_api_key")


def too_large(limit: int) -> APIError:
    return APIError(413, f"The request body is larger than this server accepts ({limit} bytes).",
                    code="request_too_large")


def queue_full(limit: int) -> APIError:
    return APIError(429, f"The engine already has {limit} requests waiting; try again shortly.",
                    type="rate_limit_error", code="queue_full")


def server_error(message: str = "The engine failed while answering.") -> APIError:
    return APIError(500, message, type="server_error", code="engine_error")
