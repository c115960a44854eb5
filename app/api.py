"""Ferry's public Python API: the one module the CLI, the window's worker and
the server import to run a model. Everything a front end needs to hold a
conversation is here; the modules behind it are implementation.

    from app.api import open_model, EngineService, TurnRequest, Text, TurnDone

    model = open_model("model.ferry")
    service = EngineService(model, model.new_session(4096))
    for ev in service.stream(service.prepare(TurnRequest([{"role": "user", "content": "Hi"}]))):
        if isinstance(ev, Text):
            print(ev.text, end="")

Event types live one floor below (``app.events``): the engines and the
pipeline produce them, the front ends consume them.
"""
from __future__ import annotations

import functools
import os
from dataclasses import dataclass, field
from pathlib import Path

from app.chat.stream_parser import ToolCall
from app.chat.turn import ChatFormat, Prepared, TurnError, TurnRequest, collect, run_turn
from app.engine.activations import ACTIVATION_CHOICES, DEFAULT_ACTIVATIONS
from app.engine.activations import describe as describe_activations
from app.engine.binding import MemoryPlan, ModelInfo
from app.engine.service import EngineService, ServiceBusy, ServiceClosed, TurnStream
from app.events import (Finished, LiveStats, Logprob, PromptProgress, Reasoning, Text, Token, TokenLogprob,
                        ToolCallMade, TurnDone, TurnEvent)
from app.model import LoadedModel, ModelError
from app.sampling import SamplingParams

__all__ = [
    "ACTIVATION_CHOICES", "DEFAULT_ACTIVATIONS", "describe_activations",
    "ChatFormat", "EngineService", "Finished", "LiveStats", "LoadOptions", "LoadedModel", "Logprob", "ModelError",
    "ModelHeld", "ModelLoaded", "Prepared",
    "PromptProgress", "Reasoning", "SamplingParams", "ServiceBusy", "ServiceClosed", "Text", "Token",
    "TokenLogprob", "ToolCall", "ToolCallMade", "TurnDone", "TurnError", "TurnEvent", "TurnRequest", "TurnStream",
    "collect", "open_model", "run_turn",
]


@dataclass(frozen=True)
class LoadOptions:
    """How the window asks its worker to open a model (from the app's settings)."""

    ram_budget: int = 0          #: bytes; 0: the recommended budget (the one budget rule)
    threads: int = 0             #: 0: the engine's default
    context_length: int = 4096   #: tokens; 0: the model's whole context
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
    note: str = ""                          #: said when it opens ("using the model already open in Ferry...")

    @property
    def remote(self) -> bool:
        return self.engine == "remote"


class ModelHeld(ModelError):
    """Another Ferry process holds this model open (one engine per model per machine,
    ``app.engine.registry``): ``attach()`` reaches its engine through its loopback API."""

    def __init__(self, record):
        self.record = record
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
        engine = RemoteEngine(self.record.url, self.record.name, self.record.key)
        try:
            engine.check()
        except RemoteError as exc:
            raise ModelError(f"the Ferry process holding {Path(self.record.path).name} (pid {self.record.pid}) "
                             f"does not answer: {exc}") from None
        return engine


def open_model(path: str | os.PathLike, *, ram_budget: int = 0, threads: int = 0, n_ctx: int = 0,
               share: bool | None = None, holder: str = "", **engine_options) -> LoadedModel:
    """Open a container. ``ram_budget`` 0 takes the recommended budget for this
    machine and context (the one budget rule, ``app.memory.plan``). A context the
    model cannot hold is left to the core to choose.

    One engine per model per machine (``app.engine.registry``; ``share`` False or
    ``FERRY_SHARE=0`` opts out): the model is registered with its budget, and the
    first engine service run on it serves it on loopback with a random key for the
    other Ferry processes. Raises ``ModelHeld`` when another process holds it (attach
    to it), ``ModelError`` when it does not fit beside the models others hold.
    ``holder``: who holds it, as other processes are told ("ferry run")."""
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
        holding.serve = functools.partial(_serve_shared, model)
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

    if not registry.sharing_enabled(share):
        return None
    reg = registry.Registry()
    ident = registry.identity(path)
    while True:
        try:
            claim = reg.claim(ident, budget, holder=holder or "a Ferry process")
        except registry.LedgerFull as exc:
            raise ModelError(str(exc)) from None
        if claim.held is None:
            return claim.holding
        try:
            ready = reg.wait_ready(claim.held)
        except TimeoutError as exc:
            raise ModelError(str(exc)) from None
        if ready is not None:
            raise ModelHeld(ready)
        # its owner let go of it meanwhile: claim it again


def _serve_shared(model: LoadedModel, service: EngineService, key: str):
    """The loopback server through which other Ferry processes use ``model``'s engine."""
    from app.server import Server

    return Server(model, host="127.0.0.1", port=0, api_key=key, service=service).start()
