"""Running the API with uvicorn: ``ferry serve`` in the foreground, or a
background thread for the app's "serve the loaded model" switch and tests."""
from __future__ import annotations

import socket
import threading
from pathlib import Path

import uvicorn

from app.model import LoadedModel
from app.server.app import create_app, is_loopback
from app.server.chat import ChatFormatter, Limits
from app.server.engine import EngineQueue


class ServeError(ValueError):
    """A server that must not or cannot start (e.g. open to the network without a key)."""


def model_id_for(model: LoadedModel) -> str:
    """The id clients send as ``model``: the container's folder name."""
    name = Path(model.path).name
    return name[:-len(".ferry")] if name.endswith(".ferry") else name


def check_binding(host: str, api_key: str | None) -> str | None:
    """None for loopback; a warning for a keyed network address; ServeError without a key."""
    if is_loopback(host):
        return None
    if not api_key:
        raise ServeError(f"binding to {host} makes the model reachable from other computers; that needs an API "
                         f"key (--api-key KEY or FERRY_API_KEY). Without one, Ferry serves only 127.0.0.1.")
    return (f"warning: serving on {host}: anyone who can reach this address and has the API key can use the "
            f"model. Requests travel unencrypted (plain HTTP); put a TLS proxy in front for untrusted networks.")


def bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host.strip("[]"), port))
    except OSError:
        sock.close()
        raise
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


class Server:
    """The API on one model and session, bound to ``host:port`` (0: any free port)."""

    def __init__(self, model: LoadedModel, session, *, host: str = "127.0.0.1", port: int = 8000,
                 api_key: str | None = None, limits: Limits = Limits(), gate: threading.Lock | None = None,
                 model_id: str | None = None, log_level: str = "warning"):
        self.warning = check_binding(host, api_key)
        self.model_id = model_id or model_id_for(model)
        self.queue = EngineQueue(model, session, limits=limits, gate=gate)
        self.formatter = ChatFormatter(model)
        try:
            self.socket = bind(host, port)
        except OSError:
            self.queue.close()
            raise
        self.host, self.port = host, self.socket.getsockname()[1]
        app = create_app(self.queue, self.formatter, model_id=self.model_id, api_key=api_key,
                         loopback_only=is_loopback(host))
        config = uvicorn.Config(app, log_level=log_level, access_log=False, timeout_graceful_shutdown=2,
                                lifespan="off", ws="none")
        self._uvicorn = uvicorn.Server(config)
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/v1"

    def run(self) -> None:
        """Serve until interrupted (Ctrl-C) or ``stop()``."""
        try:
            self._uvicorn.run(sockets=[self.socket])
        finally:
            self.queue.close()
            self.socket.close()

    def start(self) -> "Server":
        self._thread = threading.Thread(target=self.run, name="ferry-serve-http", daemon=True)
        self._thread.start()
        return self

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def stop(self, timeout: float = 10.0) -> None:
        self.queue.close()          # ends the running answer and every waiting one
        self._uvicorn.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout)
