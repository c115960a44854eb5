"""The engine worker: a QObject living in its own QThread that owns the
LoadedModel and its session. The window talks to it with queued signals
(``load``, ``generate``) and calls :meth:`EngineWorker.stop` directly (it only
sets a flag and calls ``Session.cancel``, which is thread-safe).

Text is coalesced here: the window gets at most ~20 text signals a second,
however fast the engine runs. Stats are sampled a few times a second.

The engine is either local (a container on this computer) or remote (an
OpenAI-compatible server, ``app.engine.remote``): ``load`` chooses from its
options (see ``load_options``), and both drive the same signals. With a local
engine the worker can also serve the loaded model on 127.0.0.1
(``app.server``); the server and the chat then take turns on the one session
through ``gate``.
"""
from __future__ import annotations

import threading
import time
import traceback
from dataclasses import asdict

from PySide6.QtCore import QObject, QThread, Signal, Slot

from app.chat.conversation import build_prompt
from app.chat.stream_parser import StreamParser
from app.engine.binding import MemoryPlan, ModelInfo
from app.model import Finished, LoadedModel, PromptProgress, Token
from app.sampling import SamplingParams

TEXT_INTERVAL = 0.05    #: seconds between text signals (20 a second at most)
STATS_INTERVAL = 0.25   #: seconds between stats samples


class EngineWorker(QObject):
    # results
    loaded = Signal(object)            #: model name, info, plan, n_ctx, has_experts, path
    load_failed = Signal(str)
    response_text = Signal(str)      #: coalesced answer text
    thinking_text = Signal(str)      #: coalesced thinking text
    prompt_progress = Signal(int, int)  #: tokens done, total
    stats = Signal(object)             #: a snapshot of Session.stats() plus "phase" and "t"
    finished = Signal(str, str, str)  #: reason, answer text, thinking text
    error = Signal(str)
    started = Signal(int)            #: the generation id that began
    serving = Signal(str, str)       #: the server's URL ("" when off), and why it failed ("" if it did not)

    def __init__(self):
        super().__init__()
        self.model: LoadedModel | None = None
        self.session = None
        self.remote = None               #: an app.engine.remote.RemoteEngine when the engine is remote
        self.server = None               #: an app.server.Server while the loaded model is served
        self.gate = threading.Lock()     #: held by whoever uses the session: the chat or the server
        self._lock = threading.Lock()
        self._running_id = 0
        self._stop_id = 0

    # ---- any thread

    def stop(self, gen_id: int | None = None) -> None:
        """Stop the answer ``gen_id`` (default: the one running), mid-prompt or mid-answer."""
        with self._lock:
            self._stop_id = gen_id if gen_id is not None else max(self._running_id, self._stop_id)
            if self._running_id and self._stop_id == self._running_id:
                if self.remote is not None:
                    self.remote.cancel()
                elif self.session is not None:
                    self.session.cancel()

    # ---- the worker thread

    @Slot(str, object)
    def load(self, path: str, options: dict) -> None:
        if options.get("engine") == "remote":
            return self._load_remote(path, options)
        try:
            self._close()
            budget, threads = int(options.get("ram_budget", 0)), int(options.get("threads", 0))
            want = int(options.get("context_length", 4096))
            if budget <= 0:  # "recommended": the engine's safe choice for this machine
                from app.plan import plan_container

                budget = plan_container(path, want).recommended
            verify_reads = bool(options.get("verify_reads", False))
            try:  # the budget must leave room for this context
                model = LoadedModel(path, ram_budget=budget, threads=threads, n_ctx=want, verify_reads=verify_reads)
            except Exception:  # e.g. more context than the model has: let the core pick
                model = LoadedModel(path, ram_budget=budget, threads=threads, verify_reads=verify_reads)
            info = model.engine.info
            n_ctx = min(want or info.max_ctx, info.max_ctx)
            session = model.new_session(n_ctx)
            plan = model.engine.plan(n_ctx)
            with self._lock:
                self.model, self.session = model, session
            self.loaded.emit({"path": str(path), "name": model.name, "n_ctx": session.n_ctx,
                              "info": asdict(info), "plan": asdict(plan),
                              "has_experts": bool(info.n_moe_layers and info.n_experts),
                              "has_template": model.template is not None, "engine": "local"})
        except Exception as exc:
            self.load_failed.emit(f"{type(exc).__name__}: {exc}" if not str(exc) else str(exc))
            return
        if int(options.get("serve_port") or 0):
            self.set_serving(int(options["serve_port"]))

    def _load_remote(self, path: str, options: dict) -> None:
        from app.engine.remote import RemoteEngine

        try:
            remote = RemoteEngine(str(options.get("remote_url", "")), str(options.get("remote_model", "")),
                                  options.get("remote_api_key") or None)
            card = remote.check()
        except Exception as exc:
            self.load_failed.emit(str(exc) or type(exc).__name__)
            return
        self._close()
        with self._lock:
            self.remote = remote
        self.loaded.emit({"path": str(path), "name": remote.model, "n_ctx": remote.n_ctx,
                          "info": _blank(ModelInfo, arch="remote", max_ctx=remote.n_ctx), "plan": _blank(MemoryPlan),
                          "has_experts": remote.is_ferry, "has_template": True, "engine": "remote",
                          "url": remote.url, "provides": sorted(remote.provided), "owned_by": card.get("owned_by")})

    @Slot(int)
    def set_serving(self, port: int) -> None:
        """Serve the loaded (local) model on 127.0.0.1:``port``; 0 stops serving."""
        self._stop_server()
        if not port:
            self.serving.emit("", "")
            return
        if self.model is None or self.session is None:
            self.serving.emit("", "serving needs a model on this computer")
            return
        from app.server import Server

        try:
            self.server = Server(self.model, self.session, host="127.0.0.1", port=int(port), gate=self.gate).start()
        except Exception as exc:  # e.g. the port is taken
            self.serving.emit("", f"cannot serve on 127.0.0.1:{port}: {exc}")
            return
        self.serving.emit(self.server.url, "")

    def _stop_server(self) -> None:
        server, self.server = self.server, None
        if server is not None:
            server.stop()

    @Slot(int, object)
    def generate(self, gen_id: int, request: dict) -> None:
        """``request``: messages, sampling (dict of SamplingParams fields), max_tokens, thinking."""
        if self.remote is not None:
            return self._generate_remote(gen_id, request)
        model, session = self.model, self.session
        if model is None or session is None:
            self.error.emit("no model is loaded")
            self.finished.emit("error", "", "")
            return
        with self.gate:  # uncontended unless the loaded model is also being served
            self._generate_local(gen_id, request, model, session)

    def _generate_local(self, gen_id: int, request: dict, model: LoadedModel, session) -> None:
        with self._lock:
            self._running_id = gen_id
            session.clear_cancel()
            if self._stop_id == gen_id:
                session.cancel()
        self.started.emit(gen_id)
        texts = {"thinking": [], "response": []}
        pending = {"thinking": [], "response": []}
        last_text = last_stats = 0.0
        phase = "prefill"

        def flush() -> None:
            for channel, signal in (("thinking", self.thinking_text), ("response", self.response_text)):
                if pending[channel]:
                    signal.emit("".join(pending[channel]))
                    pending[channel].clear()

        def route(events) -> None:
            for kind, text in events:
                if kind in texts and text:
                    texts[kind].append(text)
                    pending[kind].append(text)

        def sample(now: float, extra: dict | None = None) -> None:
            self.stats.emit({**session.stats().as_dict(), "phase": phase, "t": now, **(extra or {})})

        end: Finished | None = None
        try:
            ids, channel = build_prompt(model, request["messages"], request.get("thinking", True))
            parser = StreamParser("think_tags", channel)
            params = SamplingParams(**request.get("sampling", {}))
            for ev in model.generate(session, ids, params, max_tokens=int(request.get("max_tokens", 512))):
                now = time.monotonic()
                if isinstance(ev, PromptProgress):
                    self.prompt_progress.emit(ev.done, ev.total)
                    if now - last_stats >= STATS_INTERVAL or ev.done == ev.total:
                        sample(now)
                        last_stats = now
                elif isinstance(ev, Token):
                    if phase == "prefill":
                        phase = "decode"
                    route(parser.feed(ev.text))
                    if now - last_text >= TEXT_INTERVAL:
                        flush()
                        last_text = now
                    if now - last_stats >= STATS_INTERVAL:
                        sample(now)
                        last_stats = now
                elif isinstance(ev, Finished):
                    end = ev
        except Exception as exc:
            self.error.emit(f"{exc}\n{traceback.format_exc(limit=3)}" if not str(exc) else str(exc))
            end = None
        finally:
            with self._lock:
                self._running_id = 0
        route(parser.finish() if "parser" in locals() else [])
        flush()
        if end is None:
            sample(time.monotonic(), {"final": True})
            self.finished.emit("error", "".join(texts["response"]), "".join(texts["thinking"]))
            return
        if end.reason == "error" and end.error:
            self.error.emit(end.error)
        sample(time.monotonic(), {"final": True, "turn_prompt_tokens": end.prompt_tokens,
                                  "turn_reused_tokens": end.reused_tokens, "turn_tokens": len(end.tokens),
                                  "turn_seconds": end.seconds})
        self.finished.emit(end.reason, "".join(texts["response"]), "".join(texts["thinking"]))

    def _generate_remote(self, gen_id: int, request: dict) -> None:
        from app.engine.remote import Figures, Thinking

        remote = self.remote
        with self._lock:
            self._running_id = gen_id
            remote.clear_cancel()
            if self._stop_id == gen_id:
                remote.cancel()
        self.started.emit(gen_id)
        texts = {"thinking": [], "response": []}
        pending = {"thinking": [], "response": []}
        last_text = 0.0
        phase = "prefill"
        provides = sorted(remote.provided)

        def flush() -> None:
            for channel, signal in (("thinking", self.thinking_text), ("response", self.response_text)):
                if pending[channel]:
                    signal.emit("".join(pending[channel]))
                    pending[channel].clear()

        def sample(counters: dict, extra: dict | None = None) -> None:
            self.stats.emit({**counters, "phase": phase, "t": time.monotonic(), "remote": True,
                             "provides": provides, **(extra or {})})

        end: Finished | None = None
        try:
            params = SamplingParams(**request.get("sampling", {}))
            for ev in remote.generate(request["messages"], params, max_tokens=int(request.get("max_tokens", 512)),
                                      thinking=request.get("thinking", True)):
                now = time.monotonic()
                if isinstance(ev, PromptProgress):
                    self.prompt_progress.emit(ev.done, ev.total)
                elif isinstance(ev, (Thinking, Token)):
                    phase = "decode"
                    channel = "thinking" if isinstance(ev, Thinking) else "response"
                    texts[channel].append(ev.text)
                    pending[channel].append(ev.text)
                    if now - last_text >= TEXT_INTERVAL:
                        flush()
                        last_text = now
                elif isinstance(ev, Figures):
                    sample(ev.counters)
                elif isinstance(ev, Finished):
                    end = ev
        except Exception as exc:
            self.error.emit(str(exc) or type(exc).__name__)
        finally:
            with self._lock:
                self._running_id = 0
        flush()
        if end is None:
            self.finished.emit("error", "".join(texts["response"]), "".join(texts["thinking"]))
            return
        if end.reason == "error" and end.error:
            self.error.emit(end.error)
        sample(end.stats.as_dict(), {"final": True, "turn_prompt_tokens": end.prompt_tokens,
                                     "turn_reused_tokens": end.reused_tokens, "turn_tokens": len(end.tokens),
                                     "turn_seconds": end.seconds})
        self.finished.emit(end.reason, "".join(texts["response"]), "".join(texts["thinking"]))

    @Slot()
    def shutdown(self) -> None:
        self._close()

    def _close(self) -> None:
        self._stop_server()
        with self._lock:
            session, model = self.session, self.model
            self.session = self.model = None
            self.remote = None
        if session is not None:
            session.close()
        if model is not None:
            model.close()


def _blank(cls, **values) -> dict:
    """A dataclass's fields as zeros (a remote engine has no local plan), with ``values``."""
    from dataclasses import fields

    return {f.name: values.get(f.name, "" if f.type in (str, "str") else 0) for f in fields(cls)}


def load_options(settings, api_key_lookup=None) -> dict:
    """The options ``EngineWorker.load`` takes, from the app's ``Settings``."""
    from app.store.settings import remote_api_key

    options = {"ram_budget": settings.ram_budget, "threads": settings.threads,
               "context_length": settings.context_length, "verify_reads": settings.verify_reads,
               "serve_port": settings.serve_port if settings.serve_local else 0}
    if settings.engine == "remote":
        lookup = api_key_lookup or remote_api_key
        options.update(engine="remote", remote_url=settings.remote_url, remote_model=settings.remote_model,
                       remote_api_key=lookup(settings.remote_url))
    return options


class WorkerThread(QObject):
    """A worker and the thread it lives in; ``close()`` ends both."""

    request_load = Signal(str, object)
    request_generate = Signal(int, object)
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

    def load(self, path: str, options: dict) -> None:
        self.request_load.emit(str(path), dict(options))

    def generate(self, request: dict) -> int:
        self._next_id += 1
        self.request_generate.emit(self._next_id, request)
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
