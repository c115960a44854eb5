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

Saved prefixes: a turn whose request keeps its prefix (``TurnRequest.keep_prefix``:
document passages before the question) on a service given a ``StateCache``
(``app.engine.states``) starts from that prefix's saved state when one is on
disk (or from the saved one sharing the longest beginning), reads what is left
of the prefix and saves its state for the next time; ``TurnDone.prefix_state``
says which ("held", "restored", "partial", "saved", "refused: ..."). The one
prefill path serves it: the same engine thread, the same progress events.

The service is the local engine behind the one door (``app.engine.door``):
``submit(request)`` gives a ``LocalStream`` to iterate and cancel.
"""
from __future__ import annotations

import queue
import threading
import time
from collections import deque
from typing import Any, Callable, Iterator

from app.chat.turn import ChatFormat, Prepared, TurnRequest, check_routing, run_turn
from app.events import PromptProgress, TurnDone, TurnEvent


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
    """The local engine (``app.engine.door.TurnEngine``): ``model``'s ``session`` behind one queue.
    ``states``: saved prefix states (``app.engine.states.StateCache``) for requests that keep theirs."""

    kind = "local"

    def __init__(self, model, session, *, max_waiting: int = 32, states=None):
        self.model = model
        self.session = session
        self.format = ChatFormat(model)
        self.max_waiting = max_waiting
        self.states = states
        self._fingerprint: bytes | None = None
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

    @property
    def name(self) -> str:
        return self.model.name

    @property
    def tokenizer(self):
        return self.model.tokenizer

    def prepare(self, request: TurnRequest, max_tokens_limit: int | None = None) -> Prepared:
        """Render and encode ``request`` (raises ``TurnError``); any thread."""
        prepared = self.format.prepare(request, n_ctx=self.n_ctx, max_tokens_limit=max_tokens_limit)
        check_routing(self.session, prepared)
        return prepared

    def submit(self, request: TurnRequest, *, sink: Callable[[TurnEvent], None] | None = None,
               max_tokens_limit: int | None = None) -> "LocalStream":
        """The door (``app.engine.door``): prepare ``request`` on this thread (``TurnError``) and queue it
        (``ServiceBusy``, ``ServiceClosed``). Its events are read by iterating the stream, or, given a
        ``sink``, delivered to it on the engine's thread (the server's event loop)."""
        return LocalStream(self, self.prepare(request, max_tokens_limit), sink)

    def status(self) -> dict[str, Any]:
        with self._cv:
            return {"busy": self._current is not None, "waiting": len(self._waiting), "served": self.served,
                    "cancelled": self.cancelled}

    def clients(self) -> dict[str, Any]:
        """Who the engine works for: ``answered`` (answers given, by client), ``running`` (the
        client of the answer running, or None) and ``waiting`` (by client). The window shows
        the requests of clients other than its own (``WINDOW_CLIENT``) in its gauges."""
        with self._cv:
            waiting: dict[str, int] = {}
            for job in self._waiting:
                waiting[job.client] = waiting.get(job.client, 0) + 1
            return {"answered": dict(self._answered), "waiting": waiting,
                    "running": self._current.client if self._current is not None else None}

    def enqueue(self, prepared: Prepared, sink: Callable[[TurnEvent], None]) -> Job:
        """Queue a prepared turn whose events go to ``sink`` (on the engine's thread)."""
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
                end = self._turn(job)
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

    def _turn(self, job: Job) -> TurnDone | None:
        """Run ``job`` on the session (the engine thread): its saved prefix first when it keeps one, then
        the turn pipeline; returns its ``TurnDone`` (None: the pipeline ended without one)."""
        reuse = None if job.client == self._owner else 0
        prefix = None
        if job.prepared.prefix_len and self.states is not None:
            if reuse == 0:          # nothing another client left may be reused, nor show in the timing
                self._forget()
            self._owner = job.client
            prefix = self._prefix(job)
            reuse = None
            if isinstance(prefix, TurnDone):
                return prefix
        self._owner = job.client
        for ev in run_turn(self.model, self.session, job.prepared, reuse_limit=reuse, submitted=job.submitted):
            if isinstance(ev, TurnDone):
                if prefix is not None:
                    ev = prefix.finish(ev)
                return ev
            if job.cancelled:
                self.session.cancel()
            if prefix is not None and isinstance(ev, PromptProgress):
                ev = prefix.progress(ev)
            job.sink(ev)
        return None

    def _forget(self) -> None:
        try:
            self.session.truncate(0)
        except Exception:       # a recurrent state cannot rewind: start over
            self.session.reset()

    def _prefix(self, job: Job) -> "_Prefix | TurnDone":
        """Bring the job's prefix into the session: held already, restored from its saved state, or read
        (from the saved state sharing the longest beginning, if any) and saved. Progress goes to the
        job's sink; a cancel between chunks ends the turn (its ``TurnDone``)."""
        from app.engine.binding import FerryError
        from app.engine.states import StateError, model_fingerprint, shared_prefix

        started = time.monotonic()
        session, prompt = self.session, job.prepared.prompt
        prefix = prompt[:job.prepared.prefix_len]
        if self._fingerprint is None:
            self._fingerprint = model_fingerprint(self.model.path)
        fingerprint = self._fingerprint
        if session.tokens[:len(prefix)] == prefix:
            return _Prefix("held", 0, started)
        state = ""
        try:
            if self.states.restore(session, fingerprint, prefix):
                return _Prefix("restored", 0, started)
        except StateError as exc:
            state = f"refused: {exc}"
        # other passages: start from the saved prefix that shares the most with this one
        partial = None if state else self.states.longest(fingerprint, prefix)
        if partial is not None and partial[1] > shared_prefix(session.tokens, prefix):
            try:
                session.import_state(self.states.read(partial[0], fingerprint))
                state = "partial"
            except (StateError, FerryError):
                pass                # left as it was: the prefix is read, and saved below
        kept = session.sync(prefix)
        todo = prefix[kept:]
        total = len(prompt) - kept
        step = session.prompt_step
        for i in range(0, len(todo), step):
            if job.cancelled:
                return TurnDone("cancelled", prompt_tokens=len(prompt))
            try:
                session.eval(todo[i:i + step])
            except FerryError:
                if job.cancelled:   # Session.cancel stopped it between layers
                    return TurnDone("cancelled", prompt_tokens=len(prompt))
                raise
            job.sink(PromptProgress(min(i + step, len(todo)), total))
        self.states.save(fingerprint, session.export_state())
        if not state.startswith("refused"):
            state = "partial" if state == "partial" and kept else "saved"
        return _Prefix(state, len(todo), started)


class _Prefix:
    """A turn's saved-prefix step: what it did and how many tokens it read, for the turn's figures."""

    def __init__(self, state: str, evaluated: int, started: float):
        self.state, self.evaluated, self.started = state, evaluated, started
        self.seconds = time.monotonic() - started

    def progress(self, ev: PromptProgress) -> PromptProgress:
        """The pipeline's progress counted on from the prefix read before it."""
        return PromptProgress(self.evaluated + ev.done, self.evaluated + ev.total)

    def finish(self, end: TurnDone) -> TurnDone:
        """The turn's ``TurnDone`` covering the prefix step: its time, and its tokens as evaluated, not reused."""
        end.prefix_state = self.state
        end.reused_tokens = max(0, end.reused_tokens - self.evaluated)
        end.seconds += self.seconds
        end.started = self.started
        if end.ttft_s is not None:
            end.ttft_s += self.seconds
        return end


class LocalStream:
    """A turn submitted to the local engine (``app.engine.door.TurnStream``): its events are read by
    iterating (on any one thread), unless they go to a ``sink``; ``cancel()`` from any thread.
    Leaving the loop early cancels the turn."""

    def __init__(self, service: EngineService, prepared: Prepared, sink: Callable[[TurnEvent], None] | None = None):
        self.service = service
        self.prepared = prepared
        self._inbox: queue.Queue = queue.Queue()
        self.job = service.enqueue(prepared, sink or self._inbox.put)

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
