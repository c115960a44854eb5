"""The server's side of the engine service (``app.engine.service``): a turn
submitted through the one door (``EngineService.submit``) whose typed events
reach the asyncio loop through ``loop.call_soon_threadsafe``, and the door's
errors as OpenAI errors. The queue, the session and cancellation are the
service's, shared with the app's own chat when the window serves its loaded
model."""
from __future__ import annotations

import asyncio

from app.api import EngineService, LocalStream, ServiceBusy, ServiceClosed, TurnError, TurnEvent, TurnRequest
from app.server.errors import APIError, queue_full


class AsyncJob:
    """A turn submitted from the event loop (``await AsyncJob.start(...)``); ``await next()`` gives its events."""

    def __init__(self, service: EngineService, loop: asyncio.AbstractEventLoop):
        self.service = service
        self.loop = loop
        self.events: asyncio.Queue = asyncio.Queue()
        self.stream: LocalStream | None = None

    @classmethod
    async def start(cls, service: EngineService, turn: TurnRequest, max_tokens_limit: int) -> "AsyncJob":
        """Submit ``turn`` (prepared on a worker thread: rendering and encoding take a while); a request
        that cannot be honoured is a 400, a full queue a 429, a service shutting down a 503."""
        job = cls(service, asyncio.get_running_loop())
        try:
            job.stream = await asyncio.to_thread(service.submit, turn, sink=job._emit,
                                                 max_tokens_limit=max_tokens_limit)
        except TurnError as exc:
            raise APIError(400, exc.message, param=exc.param, code=exc.code) from None
        except ServiceBusy:
            raise queue_full(service.max_waiting) from None
        except ServiceClosed:
            raise APIError(503, "The server is shutting down.", type="server_error", code="shutting_down") from None
        return job

    @property
    def prompt_tokens(self) -> int:
        return len(self.stream.prepared.prompt)

    def _emit(self, event: TurnEvent) -> None:
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, event)
        except RuntimeError:  # the event loop is gone (server stopped)
            pass

    async def next(self) -> TurnEvent:
        return await self.events.get()

    def cancel(self) -> None:
        if self.stream is not None:
            self.stream.cancel()
