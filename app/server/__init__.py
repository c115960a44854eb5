"""Ferry's OpenAI-compatible server (docs/SERVER.md): ``ferry serve MODEL``
and the app's "serve the loaded model" switch."""
from app.server.chat import Limits
from app.server.run import Server, ServeError, check_binding

__all__ = ["Limits", "Server", "ServeError", "check_binding"]
