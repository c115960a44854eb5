"""Running the API with uvicorn: ``ferry serve`` in the foreground, or a
background thread for the app's "serve the loaded model" switch and tests."""
from __future__ import annotations

import socket
import threading
from pathlib import Path

import uvicorn

from app.api import EngineService, LoadedModel
from app.server.app import create_app
from app.untrusted import is_loopback
from app.server.chat import ChatFormatter, Limits


#: How long an idle connection stays open: a chat client that thinks between
#: turns keeps its connection, and with it its prefix reuse (kept per
#: connection when the server has no API key).
KEEP_ALIVE_SECONDS = 600


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


def _uvicorn(app, log_level: str) -> uvicorn.Server:
    return uvicorn.Server(uvicorn.Config(app, log_level=log_level, access_log=False, timeout_graceful_shutdown=2,
                                         lifespan="off", ws="none", timeout_keep_alive=KEEP_ALIVE_SECONDS))


class Server:
    """The API on one model and session, bound to ``host:port`` (0: any free port).

    ``service``: an engine service already owning the session (the app's,
    when the window serves its loaded model: the chat and the API then queue
    on it together); without one the server makes its own on ``session``
    and closes it when it stops."""

    def __init__(self, model: LoadedModel, session=None, *, host: str = "127.0.0.1", port: int = 8000,
                 api_key: str | None = None, limits: Limits = Limits(), service: EngineService | None = None,
                 model_id: str | None = None, log_level: str = "warning"):
        self.warning = check_binding(host, api_key)
        self.model_id = model_id or model_id_for(model)
        self._own_service = service is None
        self.queue = service or EngineService(model, session, max_waiting=limits.max_waiting)
        self.formatter = ChatFormatter(model)
        try:
            self.socket = bind(host, port)
        except OSError:
            self._close_service()
            raise
        self.host, self.port = host, self.socket.getsockname()[1]
        app = create_app(self.queue, self.formatter, model_id=self.model_id, limits=limits, api_key=api_key,
                         loopback_only=is_loopback(host))
        self._uvicorn = _uvicorn(app, log_level)
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
            self._close_service()
            self.socket.close()

    def _close_service(self) -> None:
        if self._own_service:
            self.queue.close()

    def start(self) -> "Server":
        self._thread = threading.Thread(target=self.run, name="ferry-serve-http", daemon=True)
        self._thread.start()
        return self

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def stop(self, timeout: float = 10.0) -> None:
        self._close_service()       # ends the running answer and every waiting one (its own service only)
        self._uvicorn.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout)


class ProxyServer(Server):
    """``ferry serve`` on a model another Ferry process holds (``app.server.proxy``): ``host:port``
    with the user's ``api_key``, in front of the holder's loopback API (``url``, ``key``)."""

    def __init__(self, upstream_url: str, key: str, model_id: str, *, host: str = "127.0.0.1", port: int = 8000,
                 api_key: str | None = None, limits: Limits = Limits(), log_level: str = "warning"):
        from app.server.proxy import create_proxy

        self.warning = check_binding(host, api_key)
        self.model_id = model_id
        self._own_service = False
        self.socket = bind(host, port)
        self.host, self.port = host, self.socket.getsockname()[1]
        upstream = upstream_url[:-len("/v1")] if upstream_url.endswith("/v1") else upstream_url
        self._uvicorn = _uvicorn(create_proxy(upstream, key, api_key=api_key, host=host, limits=limits), log_level)
        self._thread = None
