"""``python -m app`` opens the Ferry window (see app/ui/app.py)."""
import os
import sys

from app.ui.app import main

if __name__ == "__main__":
    code = main()
    # main() has stopped the engine thread, closed the history and deleted the
    # widgets. Leave without the interpreter's final garbage collection: it
    # can still trip over PySide objects (seen once under Xvfb in CI as
    # "none_dealloc" at exit), and nothing is left to save.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
