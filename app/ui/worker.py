"""The engine worker: a thin Qt adapter. A QObject living in its own QThread
that loads the model (local or remote), hands each turn to the loaded
engine through the one door (``TurnEngine.submit``: the engine service that
owns a local session, or a server) and turns the typed events
(``app.events``) into signals. It builds no prompt and parses no stream, and
runs a turn the same way whichever engine answers.

The window talks to it with queued signals (``load``, ``generate``) and calls
:meth:`EngineWorker.stop` directly (thread-safe: the service's cancel).

A turn with attached documents comes with a ``PassageSearch``: the collection
is searched here, before the turn, through a connection this thread keeps
(``citations`` reports the passages chosen), so the window never waits on the
database. The passages are kept as a saved prefix (``keep_prefixes``: the local
engine gets the document store's states, as ``ferry docs ask``'s does).

Text is coalesced here: the window gets at most ~20 text signals a second,
however fast the engine runs. Stats are sampled a few times a second.

With a local engine the worker can also serve the loaded model on 127.0.0.1
(``app.server``): the server then queues its requests on the same engine
service as the chat.
"""
from __future__ import annotations

import dataclasses
import threading
import time

from PySide6.QtCore import QObject, QThread, Signal, Slot

from app.api import (AttachedStream, EngineService, ImageProgress, LiveStats, LoadOptions, LoadedModel, MemoryPlan, ModelHeld, ModelInfo, ModelLoaded,
                     PromptProgress, Reasoning, RemoteEngine, Text, ToolCallMade, TurnDone, TurnError, TurnRequest,
                     logprobs_content, open_model, session_context, vision_of)
from app.chat.summary import summarise_to_fit
from app.chat.token_probs import compact
from app.controller.passages import keep_prefixes
from app.documents.prompt import Estimate
from app.memory.stats import StatsSample, TurnFigures

TEXT_INTERVAL = 0.05    #: seconds between text signals (20 a second at most)



def _serve_shared(model, service, key: str):
    """``app.server.serve_shared``, imported when a model is first shared (the server's web stack is
    not loaded before)."""
    from app.server import serve_shared

    return serve_shared(model, service, key)


class EngineWorker(QObject):
    # results
    loaded = Signal(object)            #: an app.api.ModelLoaded
    load_failed = Signal(str)
    response_text = Signal(str)      #: coalesced answer text
    thinking_text = Signal(str)      #: coalesced thinking text
    prompt_progress = Signal(int, int)  #: prompt tokens read, total (one per prefill chunk)
    image_progress = Signal(int, int, str)  #: an image in the vision tower: blocks done, blocks, the line to show
    stats = Signal(object)             #: an app.memory.stats.StatsSample (the last of a turn: final, its TurnFigures)
    tool_call = Signal(object)         #: an app.chat.stream_parser.ToolCall the model made
    finished = Signal(str, str, str)  #: reason, answer text, thinking text
    turn_done = Signal(object)         #: the pipeline's TurnDone (prompt ids, figures, tool calls)
    token_probs = Signal(object)       #: the answer's token probabilities (app.chat.token_probs.compact), when asked
    error = Signal(str)
    started = Signal(int)            #: the generation id that began
    serving = Signal(str, str)       #: the server's URL ("" when off), and why it failed ("" if it did not)
    citations = Signal(int, object)  #: a turn's id and the passages its documents put in its prompt (Citation list)
    summarised = Signal(int, object)  #: a turn's id and the app.chat.summary.ContextSummary its older turns became

    def __init__(self):
        super().__init__()
        self.model: LoadedModel | None = None
        self.service: EngineService | None = None   #: owns the local session; the server queues on it too
        self.remote = None               #: an app.engine.remote.RemoteEngine when the engine is remote
        self.engine = None               #: the engine turns go to (``TurnEngine``): the service or the remote one
        self.server = None               #: an app.server.Server while the loaded model is served
        self._lock = threading.Lock()
        self._running_id = 0
        self._stop_id = 0
        self._stream = None             #: the running turn's stream (``TurnStream``), to cancel
        self._documents = None          #: this thread's own connection to the window's document store
        self._documents_of = None       #: ... and the store it is a clone of
        self._opened = None             #: (path, options, recommended budget, ModelLoaded) of the local model open
        self._attached = None           #: (path, options, recommended budget, holder's record) when attached

    # ---- any thread

    def stop(self, gen_id: int | None = None) -> None:
        """Stop the answer ``gen_id`` (default: the one running), mid-prompt or mid-answer."""
        with self._lock:
            self._stop_id = gen_id if gen_id is not None else max(self._running_id, self._stop_id)
            if self._running_id and self._stop_id == self._running_id and self._stream is not None:
                self._stream.cancel()

    # ---- the worker thread

    @Slot(str, object)
    def load(self, path: str, options: LoadOptions) -> None:
        if options.engine == "remote":
            return self._load_remote(path, options)
        previous = self._opened     # kept open when the new one is refused, reopened when it fails to open
        try:
            want = int(options.context_length)
            from app.memory.plan import plan_container
            from app.units import budget_problem

            plan = plan_container(path, want, activations=options.activations)   # the one budget rule
            problem = budget_problem(int(options.ram_budget), plan.floor, plan.recommended)
            if problem:     # refused before the open model is closed
                raise ValueError(problem)
            self._close()
            self._open(path, options, plan.recommended)
        except Exception as exc:
            message = f"{type(exc).__name__}: {exc}" if not str(exc) else str(exc)
            if previous is not None:
                message += f" {previous[3].name} stays open."
            self.load_failed.emit(message)
            if previous is not None:
                if self.model is None:
                    try:
                        self._open(*previous)
                    except Exception:      # noqa: BLE001 - the first failure was said; no model is open
                        return
                else:
                    self.loaded.emit(previous[3])
            return
        if options.serve_port:
            self.set_serving(int(options.serve_port))

    def _open(self, path: str, options: LoadOptions, recommended: int, _info=None) -> None:
        """Open ``path`` with ``options`` and say so (``loaded``); this is the model open now."""
        want = int(options.context_length)
        budget = int(options.ram_budget) or recommended
        try:
            model = open_model(path, ram_budget=budget, threads=int(options.threads), n_ctx=want,
                               verify_reads=bool(options.verify_reads), activations=options.activations,
                               holder="the Ferry window", serve=_serve_shared)
        except ModelHeld as held:   # another Ferry process has it open: its engine answers (app.engine.registry)
            self._use_remote(path, held.attach(), note=held.notice, vision=vision_of(path))
            self._attached = (path, options, recommended, held.record)
            return
        info = model.engine.info
        n_ctx = min(session_context(want, info.max_ctx), info.max_ctx)   # (a setting kept across models)
        session = model.new_session(n_ctx)
        plan = model.engine.plan(n_ctx)
        service = EngineService(model, session)
        with self._lock:
            self.model, self.service, self.engine = model, service, service
        loaded = ModelLoaded(path=str(path), name=model.name, n_ctx=session.n_ctx, info=info,
                             plan=plan, has_experts=bool(info.n_moe_layers and info.n_experts),
                             chat_format=service.format.kind, engine="local", recommended_budget=recommended,
                             takes_tools=service.format.takes_tools,
                             vision=model.vision_config if service.format.kind == "k3" else None)
        self._opened = (path, options, recommended, loaded)
        self.loaded.emit(loaded)

    def _load_remote(self, path: str, options: LoadOptions) -> None:
        try:
            remote = RemoteEngine(options.remote_url, options.remote_model, options.remote_api_key or None)
            card = remote.check()
        except Exception as exc:
            self.load_failed.emit(str(exc) or type(exc).__name__)
            return
        self._close()
        self._use_remote(path, remote, owned_by=card.get("owned_by"))

    def _use_remote(self, path: str, remote, *, owned_by: str | None = "ferry", note: str = "",
                    vision: dict | None = None) -> None:
        with self._lock:
            self.remote = self.engine = remote
        self.loaded.emit(ModelLoaded(path=str(path), name=remote.model, n_ctx=remote.n_ctx,
                                     info=_blank(ModelInfo, arch="remote", max_ctx=remote.n_ctx),
                                     plan=_blank(MemoryPlan), has_experts=remote.is_ferry, chat_format="remote",
                                     engine="remote", url=remote.url, provides=tuple(sorted(remote.provided)),
                                     owned_by=owned_by, note=note, takes_tools=remote.takes_tools,
                                     vision=vision))

    def _reopen(self):
        """The model opened again after the process whose engine it used let go of it (itself, or
        through the process that holds it now): the engine turns now go to."""
        path, options, recommended, _record = self._attached
        self._close()
        self._open(path, options, recommended)
        return self.engine

    def _holder_left(self) -> bool:
        from app.api import holder_left

        return holder_left(self._attached[3])

    def clients(self) -> dict | None:
        """Who the local engine works for (``EngineService.clients``), or None; any thread."""
        with self._lock:
            service = self.service
        return service.clients() if service is not None else None

    @Slot(int)
    def set_serving(self, port: int) -> None:
        """Serve the loaded (local) model on 127.0.0.1:``port``; 0 stops serving."""
        self._stop_server()
        if not port:
            self.serving.emit("", "")
            return
        if self.model is None or self.service is None:
            self.serving.emit("", "serving needs a model on this computer")
            return
        from app.server import Server
        from app.store.settings import served_api_key

        try:
            self.server = Server(self.model, host="127.0.0.1", port=int(port), service=self.service,
                                 api_key=served_api_key()).start()
        except Exception as exc:  # e.g. the port is taken
            self.serving.emit("", f"cannot serve on 127.0.0.1:{port}: {exc}")
            return
        self.serving.emit(self.server.url, "")

    def _stop_server(self) -> None:
        server, self.server = self.server, None
        if server is not None:
            server.stop()

    @Slot(int, object, object)
    def generate(self, gen_id: int, turn: TurnRequest, search=None) -> None:
        """``turn``: the window's ``TurnRequest`` (built by the window, read-only here); ``search``: a
        ``PassageSearch`` when documents are attached (searched here; the passages go into a copy of
        ``turn``'s messages and ``citations`` says which)."""
        if self._attached is not None and self._holder_left():   # the model's holder closed it: open it again
            try:
                self._reopen()
            except Exception as exc:   # noqa: BLE001 - said; no model is open
                self.load_failed.emit(str(exc) or type(exc).__name__)
        if self.engine is None:
            self.error.emit("no model is loaded")
            self.finished.emit("error", "", "")
            return
        if search is not None:
            turn = dataclasses.replace(turn, messages=list(turn.messages))
            keep_prefixes(self.engine, search.store)     # the passages are read once, then restored
            try:
                found = search.attach(turn, self._documents_for(search.store), self.model or Estimate)
            except Exception as exc:   # a damaged or locked database: said, and no answer without its documents
                self.error.emit(f"the attached documents could not be searched: {exc}")
                self.finished.emit("error", "", "")
                return
            self.citations.emit(gen_id, found)
        self._run(gen_id, turn)

    def _documents_for(self, store):
        """This thread's clone of the window's ``store`` (SQLite connections stay on their thread), kept
        from one question to the next so its page cache stays warm; a new one if the store changed."""
        if self._documents_of is not store:
            self._close_documents()
            self._documents, self._documents_of = store.clone(), store
        return self._documents

    def _close_documents(self) -> None:
        documents, self._documents, self._documents_of = self._documents, None, None
        if documents is not None:
            documents.close()

    def _events(self, gen_id: int, engine, turn: TurnRequest):
        """The engine's events for one turn, read on this thread (a stop asked before it began: cancelled).
        On a local engine the "summarise" context policy's summary is written first, when the turn would
        not fit (a remote engine's turn leaves the oldest turns out)."""
        if isinstance(engine, EngineService):
            turn, summary = summarise_to_fit(engine, turn, lambda stream: self._read(gen_id, stream))
            if summary is not None:
                self.summarised.emit(gen_id, summary)
        attached = self._attached
        stream = AttachedStream(engine, turn, attached[3], self._reopen) if attached else engine.submit(turn)
        yield from self._read(gen_id, stream)

    def _read(self, gen_id: int, stream):
        """``stream``'s events, the stream kept for a stop from the window's thread."""
        with self._lock:
            self._stream = stream
            if self._stop_id == gen_id:
                stream.cancel()
        try:
            yield from stream
        finally:
            with self._lock:
                self._stream = None

    def _run(self, gen_id: int, turn: TurnRequest) -> None:
        engine = self.engine
        with self._lock:
            self._running_id = gen_id
        self.started.emit(gen_id)
        texts = {"thinking": [], "response": []}
        pending = {"thinking": [], "response": []}
        last_text = 0.0
        phase = "prefill"
        latest: dict = {}   #: the last figures: a local session's running totals, a remote answer's counters

        def flush() -> None:
            for channel, signal in (("thinking", self.thinking_text), ("response", self.response_text)):
                if pending[channel]:
                    signal.emit("".join(pending[channel]))
                    pending[channel].clear()

        def sample(figures: dict, final: bool = False, turn: TurnFigures | None = None) -> None:
            if figures or final:
                self.stats.emit(StatsSample(figures, phase, time.monotonic(), final, turn))

        end: TurnDone | None = None
        try:
            for ev in self._events(gen_id, engine, turn):
                now = time.monotonic()
                if isinstance(ev, PromptProgress):
                    self.prompt_progress.emit(ev.done, ev.total)
                elif isinstance(ev, ImageProgress):
                    self.image_progress.emit(ev.block, ev.blocks, ev.label)
                elif isinstance(ev, (Reasoning, Text)):
                    phase = "decode"
                    channel = "thinking" if isinstance(ev, Reasoning) else "response"
                    texts[channel].append(ev.text)
                    pending[channel].append(ev.text)
                    if now - last_text >= TEXT_INTERVAL:
                        flush()
                        last_text = now
                elif isinstance(ev, ToolCallMade):
                    self.tool_call.emit(ev.call)
                elif isinstance(ev, LiveStats):   # a few a second, made on the engine's thread
                    latest = ev.totals or ev.counters
                    sample(latest)
                elif isinstance(ev, TurnDone):
                    end = ev
        except TurnError as exc:
            self.error.emit(exc.message)
        except Exception as exc:
            self.error.emit(str(exc) or type(exc).__name__)
        finally:
            with self._lock:
                self._running_id = 0
        flush()
        if end is None:
            sample(latest, final=True)
            self.finished.emit("error", "".join(texts["response"]), "".join(texts["thinking"]))
            return
        if end.reason == "error" and end.error:
            self.error.emit(end.error)
        sample(end.totals or end.counters, final=True, turn=TurnFigures.of(end))
        if end.logprobs:   # the tokens spelled here, where the tokenizer is (a remote engine: the server's bytes)
            self.token_probs.emit(compact(logprobs_content(end.logprobs, (self.engine or engine).tokenizer)))
        self.turn_done.emit(end)
        reason = "stop" if end.reason == "tool_calls" else end.reason
        self.finished.emit(reason, "".join(texts["response"]), "".join(texts["thinking"]))

    @Slot()
    def shutdown(self) -> None:
        self._close()
        self._close_documents()

    def _close(self) -> None:
        self._stop_server()
        with self._lock:
            service, model, remote = self.service, self.model, self.remote
            self.service = self.model = None
            self.remote = self.engine = None
        self._opened = self._attached = None
        if remote is not None:
            remote.close()
        if service is not None:
            service.close()
            service.session.close()
        if model is not None:
            model.close()


def _blank(cls, **values):
    """A dataclass with its fields as zeros (a remote engine has no local plan), but ``values``."""
    from dataclasses import fields

    return cls(**{f.name: values.get(f.name, "" if f.type in (str, "str") else 0) for f in fields(cls)})


def load_options(settings, api_key_lookup=None) -> LoadOptions:
    """The options ``EngineWorker.load`` takes, from the app's ``Settings``."""
    from app.store.settings import remote_api_key

    local = dict(ram_budget=settings.ram_budget, threads=settings.threads, context_length=settings.context_length,
                 verify_reads=settings.verify_reads, serve_port=settings.serve_port if settings.serve_local else 0,
                 activations=settings.activations)
    if settings.engine != "remote":
        return LoadOptions(**local)
    lookup = api_key_lookup or remote_api_key
    return LoadOptions(**local, engine="remote", remote_url=settings.remote_url, remote_model=settings.remote_model,
                       remote_api_key=lookup(settings.remote_url))


class _Relay(QObject):
    def __init__(self, fn, parent):
        super().__init__(parent)
        self.fn = fn

    def call(self, *args):
        self.fn(*args)


def on_gui(signal, fn, parent: QObject | None = None) -> QObject:
    """Call ``fn`` on the GUI thread for a signal the engine's thread emits (a plain function or a lambda
    connected to such a signal would run on the engine's thread). Returns the relay; keep it (or give it
    a ``parent``) as long as the connection should live."""
    relay = _Relay(fn, parent)
    signal.connect(relay.call)
    return relay


class WorkerThread(QObject):
    """A worker and the thread it lives in; ``close()`` ends both."""

    request_load = Signal(str, object)
    request_generate = Signal(int, object, object)
    request_shutdown = Signal()
    request_serving = Signal(int)

    def __init__(self, parent=None):
        super().__init__(parent)
        self.thread = QThread()
        self.thread.setObjectName("ferry-engine")
        self.worker = EngineWorker()
        self.worker.moveToThread(self.thread)
        self.request_load.connect(self.worker.load)
        self.request_generate.connect(self.worker.generate)
        self.request_shutdown.connect(self.worker.shutdown)
        self.request_serving.connect(self.worker.set_serving)
        self.thread.start()
        self._next_id = 0

    def load(self, path: str, options: LoadOptions) -> None:
        self.request_load.emit(str(path), options)

    def generate(self, request: TurnRequest, search=None) -> int:
        """Queue a turn (``search``: its ``PassageSearch``, or None); returns its id."""
        self._next_id += 1
        self.request_generate.emit(self._next_id, request, search)
        return self._next_id

    def stop(self, gen_id: int | None = None) -> None:
        self.worker.stop(gen_id)

    def set_serving(self, port: int) -> None:
        """Serve the loaded model on 127.0.0.1:``port`` (0: stop); ``worker.serving`` reports."""
        self.request_serving.emit(int(port))

    def close(self, timeout_ms: int = 10000) -> None:
        if not self.thread.isRunning():
            return
        self.worker.stop()
        self.request_shutdown.emit()
        self.thread.quit()
        self.thread.wait(timeout_ms)
