"""The one door every front end uses to run a turn, whichever engine answers.

Two engines implement it: the local one (``app.engine.service.EngineService``:
a model on this machine, one session, a queue of turns) and a remote one
(``app.engine.remote.RemoteEngine``: any OpenAI-compatible server). The
window's worker, ``ferry run``/``chat``, ``ferry docs ask`` and the server each
drive a turn the same way::

    stream = engine.submit(request)     # TurnError: the request cannot be honoured
    for event in stream:                # the typed events of app.events, ending with one TurnDone
        ...
    stream.cancel()                     # any thread; also when the loop is left early

Nothing in a front end asks which engine it holds to run a turn; what differs
is said by the engine's own attributes (``kind``, ``tokenizer``, ``provided``).
"""
from __future__ import annotations

from typing import Any, Iterator, Protocol, runtime_checkable

from app.chat.turn import TurnRequest
from app.events import TurnEvent


@runtime_checkable
class TurnStream(Protocol):
    """A submitted turn: its events by iterating (on one thread, ending with one
    ``TurnDone``); ``cancel()`` from any thread (a no-op once it is over)."""

    def __iter__(self) -> Iterator[TurnEvent]: ...

    def cancel(self) -> None: ...


@runtime_checkable
class TurnEngine(Protocol):
    """What answers turns (not ``app.engine.binding.Engine``, the loaded container the local one runs on)."""

    #: "local" (a model on this machine) or "remote" (a server)
    kind: str
    #: the model's name (a remote engine: the id the server serves it under)
    name: str
    #: the context in tokens (a remote engine: the server's max_model_len, or 0 when it does not say)
    n_ctx: int
    #: the model's tokenizer where it is on this machine (counting passages, spelling logprobs); None: remote
    tokenizer: Any

    def submit(self, request: TurnRequest) -> TurnStream:
        """Queue ``request``; raises ``TurnError`` (what cannot be honoured, said before any work) and
        ``ServiceBusy`` / ``ServiceClosed`` (a local engine's queue is full / shutting down)."""
        ...

    def close(self) -> None: ...
