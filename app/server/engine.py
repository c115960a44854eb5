"""The server's side of the engine service (``app.engine.service``): a job
whose typed events reach the asyncio loop through
``loop.call_soon_threadsafe``, and the service's errors as OpenAI errors.
The queue, the session and cancellation are the service's, shared with the
app's own chat when the window serves its loaded model."""
from __future__ import annotations

import asyncio

from app.chat.turn import Prepared
from app.engine.service import EngineService, Job, ServiceBusy, ServiceClosed
from app.events import TurnEvent
from app.server.errors import APIError, queue_full


class AsyncJob:
    """A job submitted from the event loop; ``await next()`` gives its events."""

    def __init__(self, service: EngineService, prepared: Prepared, loop: asyncio.AbstractEventLoop):
        self.service = service
        self.loop = loop
        self.events: asyncio.Queue = asyncio.Queue()
        try:
            self.job: Job = service.submit(prepared, self._emit)
        except ServiceBusy:
            raise queue_full(service.max_waiting) from None
        except ServiceClosed:
            raise APIError(503, "The server is shutting down.", type="server_error", code="shutting_down") from None

    def _emit(self, event: TurnEvent) -> None:
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, event)
        except RuntimeError:  # the event loop is gone (server stopped)
            pass

    async def next(self) -> TurnEvent:
        return await self.events.get()

    def cancel(self) -> None:
        self.service.cancel(self.job)
