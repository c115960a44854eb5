"""The single engine and its queue. Requests wait in turn; one thread runs
them one at a time on one session (which reuses any prefix it already holds).

A ``gate`` (a lock) may be shared with another user of the same session (the
app's own chat): whoever holds it owns the session. Cancelling a job that
waits removes it; cancelling the running job calls ``Session.cancel()``
(thread-safe), and never touches a job that is not the running one.

Events reach the asyncio side through ``loop.call_soon_threadsafe``:
``("progress", done, total)``, ``("reasoning", text)``, ``("content", text)``,
``("tool_call", ToolCall)``, ``("stats", counters)``, then exactly one of
``("done", Summary)``, ``("error", message)`` or ``("cancelled",)``.
"""
from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from typing import Any

from app.model import Finished, LoadedModel, PromptProgress, Token
from app.server.chat import AnswerBuilder, Limits, Prepared, Summary
from app.server.errors import APIError, queue_full

STATS_INTERVAL = 0.25   #: seconds between live figures in a stream


class Job:
    def __init__(self, prepared: Prepared, loop: asyncio.AbstractEventLoop):
        self.prepared = prepared
        self.loop = loop
        self.events: asyncio.Queue = asyncio.Queue()
        self.cancelled = False
        self.done = False
        self.submitted = time.monotonic()

    def emit(self, event: tuple) -> None:
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, event)
        except RuntimeError:  # the event loop is gone (server stopped)
            pass

    async def next(self) -> tuple:
        return await self.events.get()


class EngineQueue:
    def __init__(self, model: LoadedModel, session, *, limits: Limits = Limits(),
                 gate: threading.Lock | None = None):
        self.model = model
        self.session = session
        self.limits = limits
        self.gate = gate or threading.Lock()
        self._cv = threading.Condition()
        self._waiting: deque[Job] = deque()
        self._current: Job | None = None
        self._closed = False
        self.served = 0
        self.cancelled = 0
        self._thread = threading.Thread(target=self._run, name="ferry-serve-engine", daemon=True)
        self._thread.start()

    # ---- any thread

    @property
    def n_ctx(self) -> int:
        return self.session.n_ctx

    def status(self) -> dict[str, Any]:
        with self._cv:
            return {"busy": self._current is not None, "waiting": len(self._waiting), "served": self.served,
                    "cancelled": self.cancelled}

    def submit(self, job: Job) -> None:
        with self._cv:
            if self._closed:
                raise APIError(503, "The server is shutting down.", type="server_error", code="shutting_down")
            if len(self._waiting) >= self.limits.max_waiting:
                raise queue_full(self.limits.max_waiting)
            self._waiting.append(job)
            self._cv.notify_all()

    def cancel(self, job: Job) -> None:
        """The client went away: drop the job if it waits, stop it if it runs."""
        with self._cv:
            if job.done or job.cancelled:
                return
            job.cancelled = True
            if job is self._current:
                self.session.cancel()
            elif job in self._waiting:
                self._waiting.remove(job)
                self.cancelled += 1
                job.done = True
                job.emit(("cancelled",))

    def close(self, timeout: float = 10.0) -> None:
        with self._cv:
            self._closed = True
            waiting, self._waiting = list(self._waiting), deque()
            for job in waiting:
                job.cancelled = job.done = True
                job.emit(("error", "The server is shutting down."))
            if self._current is not None:
                self._current.cancelled = True
                self.session.cancel()
            self._cv.notify_all()
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
            with self.gate:
                with self._cv:
                    if job.cancelled:  # its client left after it was taken from the queue
                        self.cancelled += 1
                        job.done = True
                        job.emit(("cancelled",))
                        continue
                    self._current = job
                    self.session.clear_cancel()
                try:
                    outcome = self._answer(job)
                except Exception as exc:  # an engine fault ends this answer, never the server
                    outcome = ("error", f"the engine failed: {exc}")
                with self._cv:
                    self._current = None
                    job.done = True
                    if outcome[0] == "cancelled":
                        self.cancelled += 1
                    else:
                        self.served += 1
                    self.session.clear_cancel()
                job.emit(outcome)

    def _answer(self, job: Job) -> tuple:
        p = job.prepared
        start = time.monotonic()
        base = self.session.stats().as_dict()

        def counters() -> dict[str, float]:
            now = self.session.stats().as_dict()
            return {k: now[k] - base.get(k, 0) for k in now}

        builder = AnswerBuilder(p, self.model.tokenizer)
        end: Finished | None = None
        n_tokens = 0
        last_stats = start
        reused = _shared_prefix(self.session.tokens, p.prompt)
        events = self.model.generate(self.session, p.prompt, p.params, max_tokens=p.max_tokens)
        try:
            for ev in events:
                if isinstance(ev, PromptProgress):
                    job.emit(("progress", ev.done, ev.total))
                elif isinstance(ev, Token):
                    n_tokens += 1
                    for out in builder.token(ev.id, ev.text):
                        job.emit(out)
                    if builder.ended:
                        break
                    now = time.monotonic()
                    if now - last_stats >= STATS_INTERVAL:
                        job.emit(("stats", counters()))
                        last_stats = now
                elif isinstance(ev, Finished):
                    end = ev
        finally:
            events.close()
        if job.cancelled or (end is not None and end.reason == "cancelled"):
            return ("cancelled",)
        if end is not None and end.reason == "error":
            return ("error", end.error or "the engine failed")
        for out in builder.finish():
            job.emit(out)
        if end is not None:
            reused = end.reused_tokens
        if builder.tool_calls:
            reason = "tool_calls"
        elif end is not None and end.reason == "length":
            reason = "length"
        else:
            reason = "stop"
        ended = time.monotonic()
        return ("done", Summary(
            finish_reason=reason, prompt_tokens=len(p.prompt), completion_tokens=n_tokens,
            reasoning_tokens=builder.reasoning_tokens, reused_tokens=reused, counters=counters(),
            seconds=ended - start, queue_seconds=start - job.submitted, started=start, ended=ended,
            content="".join(builder.content), reasoning="".join(builder.reasoning),
            tool_calls=list(builder.tool_calls)))


def _shared_prefix(held: list[int], prompt: list[int]) -> int:
    """How much of ``prompt`` the session will keep (as ``Session.sync`` counts)."""
    keep = 0
    for a, b in zip(held, prompt):
        if a != b:
            break
        keep += 1
    return keep - 1 if keep == len(prompt) and keep > 0 else keep
