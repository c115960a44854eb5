"""Ferry's OpenAI-compatible server (docs/SERVER.md): ``ferry serve MODEL``
and the app's "serve the loaded model" switch."""
from app.server.chat import Limits
from app.server.run import Server, ServeError, check_binding

__all__ = ["Limits", "Server", "ServeError", "check_binding", "serve_shared"]


def serve_shared(model, service, key: str) -> Server:
    """The loopback server through which other Ferry processes use ``model``'s engine (one engine per
    model per machine, ``app.engine.registry``): what a front end passes to ``app.api.open_model``."""
    return Server(model, host="127.0.0.1", port=0, api_key=key, service=service).start()
