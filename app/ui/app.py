"""``python -m app``: the desktop app. ``--screenshot DIR`` drives the real
window through its main states, writes one PNG per state and exits."""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path
from typing import Sequence

NO_DISPLAY = ("ferry: no display to open a window on. Run Ferry from a desktop session, or set "
              "QT_QPA_PLATFORM=offscreen (e.g. for --screenshot on a server) or run it under xvfb-run.")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m app", description="Ferry: chat with language models offline.")
    ap.add_argument("--model", help="a converted model (container folder) to open")
    ap.add_argument("--screenshot", metavar="DIR",
                    help="open the window, go through its main states, save one PNG per state in DIR, and exit")
    ap.add_argument("--prompt", default="Write a Python function that reverses a string, with a short example.",
                    help="the message sent in --screenshot mode")
    ap.add_argument("--size", default="1280x800", help="window size in --screenshot mode (default 1280x800)")
    return ap


def display_problem() -> str | None:
    if os.environ.get("QT_QPA_PLATFORM"):
        return None
    if sys.platform.startswith("linux") or "bsd" in sys.platform:
        if not os.environ.get("DISPLAY") and not os.environ.get("WAYLAND_DISPLAY"):
            return NO_DISPLAY
    return None


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    problem = display_problem()
    if problem:
        print(problem, file=sys.stderr)
        return 2
    try:
        w, h = (int(x) for x in args.size.lower().split("x"))
    except ValueError:
        print(f"ferry: --size must look like 1280x800, not {args.size!r}", file=sys.stderr)
        return 2
    if args.model:
        from app.library import Library, LibraryError

        try:   # a path or the name of a converted model; else what to do (convert it, close names)
            args.model = str(Library().resolve(args.model))
        except LibraryError as exc:
            print(f"ferry: {exc}", file=sys.stderr)
            return 2

    from PySide6.QtCore import QTimer
    from PySide6.QtWidgets import QApplication, QMessageBox

    app = QApplication.instance() or QApplication([sys.argv[0]])
    app.setApplicationName("Ferry")
    app.setApplicationDisplayName("Ferry")
    if app.platformName() in ("", "minimal"):
        print(NO_DISPLAY, file=sys.stderr)
        return 2

    from app.store import settings as settings_mod
    from app.store.crypto import EphemeralKeys, KeyUnavailable
    from app.store.history import HistoryStore
    from app.ui import theme
    from app.ui.main_window import MainWindow
    from app.ui.unlock import HistoryLocked, dialog_prompt, open_history

    theme.apply(app)
    if args.screenshot:
        from app.ui.screenshot import ScreenshotRun

        out = Path(args.screenshot)
        out.mkdir(parents=True, exist_ok=True)
        # A throw-away history and default settings: screenshots never touch the user's data.
        tmp = tempfile.TemporaryDirectory(prefix="ferry-shot-")
        store = HistoryStore(Path(tmp.name) / "history.sqlite3", EphemeralKeys())
        folders = [str(Path(args.model).resolve().parent)] if args.model else []   # the library lists it
        window = MainWindow(store, settings_mod.Settings(temperature=0.0, model_folders=folders,
                                                         token_probabilities=True),   # for 04a
                            persist_settings=False)
        window.resize(w, h)
        run = ScreenshotRun(window, out, args.model, args.prompt)
        window.show()
        run.start()
        code = app.exec()
        _dispose(window)
        store.close()
        tmp.cleanup()
        return code if run.ok else 1

    try:
        store = open_history(prompt=dialog_prompt())
    except HistoryLocked as exc:
        print(f"ferry: {exc}", file=sys.stderr)
        # said in the window too: started from a dock or a menu, nobody reads stderr (issue 34)
        QMessageBox.information(None, "Ferry stays closed", f"Ferry did not start: {exc}. Your conversations are "
                                "safe; start Ferry again and type the passphrase to open them.")
        return 1
    except KeyUnavailable as exc:
        QMessageBox.critical(None, "Ferry cannot open your history", str(exc))
        return 1
    window = MainWindow(store)
    window.show()
    QTimer.singleShot(0, window.controller.start_documents)   # watched folders, the index read-ahead (background)
    if args.model:
        window.load_model(args.model)
    else:
        window.models.open_default_model()
    code = app.exec()
    _dispose(window)
    store.close()
    return code


def _dispose(window) -> None:
    """Stop the engine thread and delete the widgets while Python is still
    whole: leaving them to interpreter shutdown can crash PySide."""
    import gc

    from PySide6.QtCore import QCoreApplication, QEvent

    window.shutdown()
    window.deleteLater()
    QCoreApplication.sendPostedEvents(None, QEvent.Type.DeferredDelete)
    gc.collect()
