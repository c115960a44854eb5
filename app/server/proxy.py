"""``ferry serve`` on a model another Ferry process already holds (one engine
per model per machine, ``app.engine.registry``): the address and key the
user asked for, in front of the holder's loopback API.

Every request passes the same guard as the server's own (host check, the
user's API key, body size), then goes to the holder with the holder's random
key; its answer, streamed or not, comes back as it is. A client that leaves
closes the upstream connection, so the holder stops that answer as it does
for its own clients.
"""
from __future__ import annotations

import asyncio
from typing import Any

from app.server.app import Guard, is_loopback
from app.server.chat import Limits
from app.server.errors import APIError

#: Request headers not forwarded (the connection's own, and the client's key).
DROP_REQUEST = frozenset({"host", "authorization", "x-api-key", "content-length", "connection", "keep-alive",
                          "transfer-encoding", "accept-encoding"})
DROP_RESPONSE = frozenset({"content-length", "transfer-encoding", "connection", "keep-alive", "date", "server"})


class Proxy:
    """An ASGI app forwarding every HTTP request to ``upstream`` (``http://127.0.0.1:PORT``)."""

    def __init__(self, upstream: str, key: str):
        self.upstream = upstream.rstrip("/")
        self.key = key
        self._client = None

    def _http(self):
        import httpx

        if self._client is None:
            self._client = httpx.AsyncClient(timeout=httpx.Timeout(30.0, read=None))
        return self._client

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return
        body = bytearray()
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in scope.get("headers", [])
                   if k.decode("latin-1").lower() not in DROP_REQUEST]
        headers.append(("authorization", f"Bearer {self.key}"))
        url = self.upstream + scope.get("raw_path", scope["path"].encode()).decode("latin-1")
        if scope.get("query_string"):
            url += "?" + scope["query_string"].decode("latin-1")
        import httpx

        client = self._http()
        try:
            request = client.build_request(scope["method"], url, headers=headers, content=bytes(body))
            response = await client.send(request, stream=True)
        except httpx.HTTPError as exc:
            return await APIError(502, f"the Ferry process that holds the model does not answer: {exc}",
                                  code="upstream_unavailable").response()(scope, receive, send)
        left = asyncio.Event()

        async def watch() -> None:   # the client leaving ends the upstream answer
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    left.set()
                    return

        watcher = asyncio.create_task(watch())
        try:
            await send({"type": "http.response.start", "status": response.status_code,
                        "headers": [(k.encode("latin-1"), v.encode("latin-1")) for k, v in response.headers.items()
                                    if k.lower() not in DROP_RESPONSE]})
            async for chunk in response.aiter_raw():
                if left.is_set():
                    break
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except (httpx.HTTPError, OSError):
            pass    # the holder or the client went away mid-answer: the connection ends
        finally:
            watcher.cancel()
            await response.aclose()


def create_proxy(upstream: str, key: str, *, api_key: str | None, host: str, limits: Limits = Limits()) -> Any:
    """The proxy behind the server's own guard."""
    return Guard(Proxy(upstream, key), api_key=api_key, max_body=limits.max_request_bytes,
                 loopback_only=is_loopback(host))
