"""``ferry``: the command-line client (``app.cli.main``). Every command is a
thin call into the public Python API (``app.api``) the window and the server
use. Options and helpers shared with ``ferry docs`` live in
``app.cli.common``, so the document commands never import the main parser."""
from app.cli.main import main

__all__ = ["main"]
