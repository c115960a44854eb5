"""Ferry's public Python API: the one module the CLI, the window's worker and
the server import to run a model. Everything a front end needs to hold a
conversation is here; the modules behind it are implementation.

    from app.api import open_model, EngineService, TurnRequest, Text, TurnDone

    model = open_model("model.ferry")
    engine = EngineService(model, model.new_session(4096))     # or RemoteEngine(url): the same door
    for ev in engine.submit(TurnRequest([{"role": "user", "content": "Hi"}])):
        if isinstance(ev, Text):
            print(ev.text, end="")

Both engines implement ``TurnEngine`` (``app.engine.door``): ``submit(request)``
gives a ``TurnStream`` to iterate and ``cancel()``; every front end runs its
turns through it.

Event types live one floor below (``app.events``): the engines and the
pipeline produce them, the front ends consume them.
"""
from __future__ import annotations

import functools
import os
from dataclasses import dataclass, field
from pathlib import Path

from app.activations import ACTIVATION_CHOICES, DEFAULT_ACTIVATIONS
from app.activations import describe as describe_activations
from app.chat.stream_parser import ToolCall
from app.chat.turn import (MAX_STOP_CHARS, MAX_STOPS, MAX_TOP_LOGPROBS, ChatFormat, Prepared, TurnError, TurnRequest,
                           apply_routing, check_routing, collect, logprobs_content, run_turn)
from app.engine.binding import KERNEL_CHOICES, FerryError, MemoryPlan, ModelInfo, verify
from app.engine.door import TurnEngine, TurnStream
from app.engine.registry import holder_left
from app.engine.remote import RemoteEngine, RemoteError
from app.engine.service import EngineService, LocalStream, ServiceBusy, ServiceClosed
from app.engine.states import StateCache, StateError
from app.events import (Finished, ImageProgress, LiveStats, Logprob, PromptProgress, Reasoning, Text, Token, TokenLogprob,
                        ToolCallDelta, ToolCallMade, TurnDone, TurnEvent)
from app.context import DEFAULT_CONTEXT, session_context
from app.model import LoadedModel, ModelError, log_softmax
from app.sampling import SamplingParams

__all__ = [
    # the door: both engines, what they take and what they give
    "TurnEngine", "TurnStream", "EngineService", "LocalStream", "RemoteEngine", "TurnRequest", "TurnError",
    "ServiceBusy", "ServiceClosed", "RemoteError", "SamplingParams", "ToolCall",
    "Finished", "ImageProgress", "LiveStats", "Logprob", "PromptProgress", "Reasoning", "Text", "Token", "TokenLogprob",
    "ToolCallDelta", "ToolCallMade", "TurnDone", "TurnEvent",
    # opening a model, and what the window's worker reports of it
    "DEFAULT_CONTEXT", "session_context",
    "open_model", "LoadedModel", "ModelError", "LoadOptions", "ModelHeld", "AttachedStream", "ModelLoaded", "holder_left", "vision_of", "ModelInfo", "MemoryPlan",
    "ACTIVATION_CHOICES", "DEFAULT_ACTIVATIONS", "describe_activations", "KERNEL_CHOICES", "FerryError", "verify",
    # the pipeline's parts a front end shapes requests and answers with
    "ChatFormat", "Prepared", "MAX_STOPS", "MAX_STOP_CHARS", "MAX_TOP_LOGPROBS", "check_routing", "apply_routing",
    "logprobs_content", "log_softmax", "collect", "run_turn",
    # saved prefix states (the local engine's, for document questions)
    "StateCache", "StateError",
]


@dataclass(frozen=True)
class LoadOptions:
    """How the window asks its worker to open a model (from the app's settings)."""

    ram_budget: int = 0          #: bytes; 0: the recommended budget (the one budget rule)
    threads: int = 0             #: 0: the engine's default
    context_length: int = DEFAULT_CONTEXT   #: tokens; 0: the model's whole context
    verify_reads: bool = False
    activations: str = DEFAULT_ACTIVATIONS   #: "auto": 8-bit activations on quantized weights; "exact"
    serve_port: int = 0          #: serve the loaded model on 127.0.0.1:port (0: no)
    engine: str = "local"        #: "local" or "remote"
    remote_url: str = ""
    remote_model: str = ""
    remote_api_key: str | None = field(default=None, repr=False)   #: never in a repr or a log


@dataclass(frozen=True)
class ModelLoaded:
    """A model ready for turns, as the window's worker reports it (local or remote)."""

    path: str                   #: the container's path (a remote engine: the window's key for it)
    name: str
    n_ctx: int                  #: the session's context (a remote engine: the server's max_model_len, or 0)
    info: ModelInfo             #: the engine's model info (a remote engine: blank but for arch and max_ctx)
    plan: MemoryPlan            #: the engine's memory plan (a remote engine: blank)
    has_experts: bool           #: expert gauges apply (a remote engine: it is a Ferry server)
    chat_format: str            #: "k3", "jinja", "plain" or "remote"
    engine: str = "local"       #: "local" or "remote"
    recommended_budget: int | None = None   #: the one budget rule's figure (local engine)
    url: str | None = None      #: the remote server's URL
    provides: tuple[str, ...] = ()          #: the figures a remote server reports
    owned_by: str | None = None             #: the remote model card's owner
    takes_tools: bool = False   #: its chat format can list tools (K3's, or a Jinja template that takes them)
    note: str = ""                          #: said when it opens ("using the model already open in Ferry...")
    vision: dict | None = None  #: its vision tower's shape (the manifest's ``model.vision``): None, it cannot see images

    @property
    def remote(self) -> bool:
        return self.engine == "remote"


class ModelHeld(ModelError):
    """Another Ferry process holds this model open (one engine per model per machine,
    ``app.engine.registry``): ``attach()`` reaches its engine through its loopback API."""

    def __init__(self, record, engine=None):
        self.record = record
        self._engine = engine     #: the holder's engine, already checked (``open_model`` checks it answers)
        why = "" if record.port else ", which does not share it"
        super().__init__(f"{Path(record.path).name} is already open in Ferry (pid {record.pid}, {record.holder})"
                         f"{why}; to open it here as well, close it first or pass --no-share")

    @property
    def notice(self) -> str:
        """What the user is told when a front end attaches."""
        return f"using the model already open in Ferry (pid {self.record.pid}, {self.record.holder})"

    def attach(self):
        """The holder's engine as a ``RemoteEngine`` (checked); ModelError when it does not serve it."""
        from app.engine.remote import RemoteEngine, RemoteError

        if not self.record.port:
            raise ModelError(str(self))
        if self._engine is not None:
            return self._engine
        engine = RemoteEngine(self.record.url, self.record.name, self.record.key)
        try:
            engine.check()
        except RemoteError as exc:
            raise ModelError(f"the Ferry process holding {Path(self.record.path).name} (pid {self.record.pid}) "
                             f"does not answer: {exc}") from None
        return engine


class AttachedStream:
    """A turn sent to the engine of the Ferry process holding the model (``ModelHeld.attach``), as a
    ``TurnStream``. That process may let go of the model just as the turn is sent (it was closing:
    its server stopped, or its engine turned the turn away as it shut down); the turn then fails
    before it began, and instead ``reopen()`` — the front end opening the model again, itself or
    through whichever process holds it by then, and giving the engine it now uses — runs it. So no
    turn fails because its holder closed."""

    def __init__(self, engine: TurnEngine, request: TurnRequest, record, reopen):
        self.request, self.record, self._reopen = request, record, reopen
        self._stream = engine.submit(request)

    def __iter__(self):
        events = iter(self._stream)
        first = next(events, None)
        if isinstance(first, TurnDone) and first.reason == "error" and holder_left(self.record):
            self._stream = self._reopen().submit(self.request)
            yield from self._stream
            return
        if first is not None:
            yield first
        yield from events

    def cancel(self) -> None:
        self._stream.cancel()


def vision_of(container: str | os.PathLike) -> dict | None:
    """The vision tower a container's manifest gives (``model.vision``; what ``LoadedModel.vision_config``
    reads), without opening it: how the window knows that the engine another Ferry process holds for
    it can see images. None: no tower, or no readable manifest."""
    from app.engine.container_files import ContainerFileError, read_manifest

    try:
        v = (read_manifest(container).get("model") or {}).get("vision")
    except (ContainerFileError, OSError, AttributeError):
        return None
    return v if isinstance(v, dict) else None


def open_model(path: str | os.PathLike, *, ram_budget: int = 0, threads: int = 0, n_ctx: int = 0,
               share: bool | None = None, holder: str = "", serve=None, **engine_options) -> LoadedModel:
    """Open a container. ``ram_budget`` 0 takes the recommended budget for this
    machine and context (the one budget rule, ``app.memory.plan``). A context the
    model cannot hold is left to the core to choose.

    One engine per model per machine (``app.engine.registry``; ``share`` False or
    ``FERRY_SHARE=0`` opts out): the model is registered with its budget, and the
    first engine service run on it serves it on loopback with a random key for the
    other Ferry processes. Raises ``ModelHeld`` when another process holds it (attach
    to it), ``ModelError`` when it does not fit beside the models others hold.
    ``holder``: who holds it, as other processes are told ("ferry run"); ``serve(model, service, key)``:
    starts the loopback server the others attach through (``app.server.serve_shared``: the front end
    passes it, the server being a layer above this one); without it the model is held, not shared."""
    if ram_budget <= 0:
        from app.memory.plan import plan_container

        ram_budget = plan_container(path, n_ctx, activations=engine_options.get("activations")).recommended
    holding = _claim(path, ram_budget, share, holder)
    try:
        model = _open(path, ram_budget=ram_budget, threads=threads, n_ctx=n_ctx, **engine_options)
    except BaseException:
        if holding is not None:
            holding.release()
        raise
    if holding is not None:
        holding.serve = functools.partial(serve, model) if serve is not None else None
        model.holding = holding
        holding.opened()
    return model


def _open(path, *, ram_budget: int, threads: int, n_ctx: int, **engine_options) -> LoadedModel:
    try:
        return LoadedModel(path, ram_budget=ram_budget, threads=threads, n_ctx=n_ctx, **engine_options)
    except ModelError:
        raise
    except Exception:
        if not n_ctx:
            raise
        return LoadedModel(path, ram_budget=ram_budget, threads=threads, **engine_options)


def _claim(path, budget: int, share: bool | None, holder: str):
    """This process's ``Holding`` of the model (None: not shared, or already held here)."""
    from app.engine import registry
    from app.memory.budget import ledger_room

    if not registry.sharing_enabled(share):
        return None
    reg = registry.Registry()
    ident = registry.identity(path)
    while True:
        try:
            claim = reg.claim(ident, budget, holder=holder or "a Ferry process", room=ledger_room())
        except registry.LedgerFull as exc:
            raise ModelError(str(exc)) from None
        if claim.held is None:
            return claim.holding
        try:
            ready = reg.wait_ready(claim.held)
        except TimeoutError as exc:
            raise ModelError(str(exc)) from None
        if ready is not None and not ready.port:
            raise ModelHeld(ready)
        if ready is not None:
            engine = RemoteEngine(ready.url, ready.name, ready.key)
            try:
                engine.check()
            except RemoteError as exc:
                if not holder_left(ready):
                    raise ModelError(f"the Ferry process holding {Path(ready.path).name} (pid {ready.pid}) "
                                     f"does not answer: {exc}") from None
                continue   # it closed the model just now: claim it again (waiting for it to let go)
            raise ModelHeld(ready, engine)
        # its owner let go of it meanwhile: claim it again
