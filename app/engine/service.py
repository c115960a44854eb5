"""The engine service: the one owner of a loaded model's session. Turns from
every client (the window, the server, document Q&A) wait in one queue and
one thread runs them one at a time.

Cancellation is one scheme for all: ``cancel(job)`` drops a job that waits
and stops the running one (``Session.cancel()``, thread-safe, between
layers); it never touches another job. Every job ends with exactly one
``TurnDone`` delivered to its sink, whatever happens (cancelled, engine
fault, shutdown).

Prefix reuse is kept per client: the session reuses the prompt prefix it
holds only when that prefix was left by the same client (a server keys
clients by API key, or by connection when there is none). So
``usage.prompt_tokens_details.cached_tokens`` and the time to the first
token only ever reflect the caller's own earlier requests.
"""
from __future__ import annotations

import queue
import threading
import time
from collections import deque
from typing import Any, Callable, Iterator

from app.chat.turn import ChatFormat, Prepared, TurnRequest, check_routing, run_turn
from app.events import TurnDone, TurnEvent


class ServiceBusy(RuntimeError):
    """Too many turns are already waiting."""


class ServiceClosed(RuntimeError):
    """The service is shutting down."""


class Job:
    """One turn in the queue; ``sink`` receives its events on the engine thread."""

    def __init__(self, prepared: Prepared, sink: Callable[[TurnEvent], None]):
        self.prepared = prepared
        self.sink = sink
        self.cancelled = False
        self.done = False
        self.submitted = time.monotonic()

    @property
    def client(self) -> str:
        return self.prepared.client


class EngineService:
    def __init__(self, model, session, *, max_waiting: int = 32):
        self.model = model
        self.session = session
        self.format = ChatFormat(model)
        self.max_waiting = max_waiting
        self._cv = threading.Condition()
        self._waiting: deque[Job] = deque()
        self._current: Job | None = None
        self._owner: str | None = None       #: the client whose turns the session holds
        self._closed = False
        self.served = 0
        self.cancelled = 0
        self._answered: dict[str, int] = {}   #: answers given, by client
        self._thread = threading.Thread(target=self._run, name="ferry-engine", daemon=True)
        self._thread.start()
        self._holding = getattr(model, "holding", None)   #: the model's registry hold (app.engine.registry)
        if self._holding is not None:
            self._holding.service_started(self)   # serves it to the other Ferry processes

    # ---- any thread

    @property
    def n_ctx(self) -> int:
        return self.session.n_ctx

    def prepare(self, request: TurnRequest, max_tokens_limit: int | None = None) -> Prepared:
        """Render and encode ``request`` (raises ``TurnError``); any thread."""
        prepared = self.format.prepare(request, n_ctx=self.n_ctx, max_tokens_limit=max_tokens_limit)
        check_routing(self.session, prepared)
        return prepared

    def stream(self, prepared: Prepared) -> "TurnStream":
        """Submit a turn and read its events on the calling thread."""
        return TurnStream(self, prepared)

    def status(self) -> dict[str, Any]:
        with self._cv:
            return {"busy": self._current is not None, "waiting": len(self._waiting), "served": self.served,
                    "cancelled": self.cancelled}

    def clients(self) -> dict[str, Any]:
        """Who the engine works for: ``answered`` (answers given, by client), ``running`` (the
        client of the answer running, or None) and ``waiting`` (by client). The window shows
        the requests of clients other than its own ("local") in its gauges."""
        with self._cv:
            waiting: dict[str, int] = {}
            for job in self._waiting:
                waiting[job.client] = waiting.get(job.client, 0) + 1
            return {"answered": dict(self._answered), "waiting": waiting,
                    "running": self._current.client if self._current is not None else None}

    def submit(self, prepared: Prepared, sink: Callable[[TurnEvent], None]) -> Job:
        job = Job(prepared, sink)
        with self._cv:
            if self._closed:
                raise ServiceClosed("the engine is shutting down")
            if len(self._waiting) >= self.max_waiting:
                raise ServiceBusy(f"the engine already has {self.max_waiting} requests waiting; try again shortly")
            self._waiting.append(job)
            self._cv.notify_all()
        return job

    def cancel(self, job: Job) -> None:
        """Drop ``job`` if it waits, stop it if it runs; nothing once it is over."""
        with self._cv:
            if job.done or job.cancelled:
                return
            job.cancelled = True
            if job is self._current:
                self.session.cancel()
                return
            if job in self._waiting:
                self._waiting.remove(job)
            self.cancelled += 1
            job.done = True
        job.sink(TurnDone("cancelled", prompt_tokens=len(job.prepared.prompt)))

    def close(self, timeout: float = 10.0) -> None:
        if self._holding is not None:   # other processes' answers finish first; then its server stops
            self._holding.service_closed(self)
        with self._cv:
            self._closed = True
            waiting, self._waiting = list(self._waiting), deque()
            for job in waiting:
                job.cancelled = job.done = True
            if self._current is not None:
                self._current.cancelled = True
                self.session.cancel()
            self._cv.notify_all()
        for job in waiting:
            job.sink(TurnDone("error", error="the engine is shutting down"))
        if self._thread is not threading.current_thread():
            self._thread.join(timeout)

    # ---- the engine thread

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._waiting and not self._closed:
                    self._cv.wait()
                if self._closed:
                    return
                job = self._waiting.popleft()
                self._current = job
                self.session.clear_cancel()
            end: TurnDone | None = None
            try:
                reuse = None if job.client == self._owner else 0
                self._owner = job.client
                for ev in run_turn(self.model, self.session, job.prepared, reuse_limit=reuse,
                                   submitted=job.submitted):
                    if isinstance(ev, TurnDone):
                        end = ev
                        break
                    if job.cancelled:
                        self.session.cancel()
                    job.sink(ev)
            except Exception as exc:  # an engine fault ends this answer, never the service
                end = TurnDone("error", error=f"the engine failed: {exc}", prompt_tokens=len(job.prepared.prompt))
            if end is None:
                end = TurnDone("error", error="the turn ended without an answer")
            if job.cancelled and end.reason != "error":
                end.reason = "cancelled"
            with self._cv:
                self._current = None
                job.done = True
                if end.reason == "cancelled":
                    self.cancelled += 1
                else:
                    self.served += 1
                    self._answered[job.client] = self._answered.get(job.client, 0) + 1
                self.session.clear_cancel()
            job.sink(end)


class TurnStream:
    """A submitted turn whose events are read by iterating (on any one thread);
    ``cancel()`` from any thread. Leaving the loop early cancels the turn."""

    def __init__(self, service: EngineService, prepared: Prepared):
        self.service = service
        self._inbox: queue.Queue = queue.Queue()
        self.job = service.submit(prepared, self._inbox.put)

    def cancel(self) -> None:
        self.service.cancel(self.job)

    def __iter__(self) -> Iterator[TurnEvent]:
        try:
            while True:
                ev = self._inbox.get()
                yield ev
                if isinstance(ev, TurnDone):
                    return
        finally:
            self.cancel()   # no-op once it is done
