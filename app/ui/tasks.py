"""Long jobs (fetching the demo model, converting a model) on a plain Python
thread, reporting to the GUI through queued Qt signals."""
from __future__ import annotations

import threading
import traceback
from typing import Any, Callable

from PySide6.QtCore import QObject, Signal

from app.convert.convert import Progress


class BackgroundTask(QObject):
    progress = Signal(float, str)   #: fraction done (0..1, or -1 when unknown), what is happening
    done = Signal(object)
    failed = Signal(str)

    def __init__(self, fn: Callable[[Callable[[Progress], None]], Any], parent=None):
        super().__init__(parent)
        self._fn = fn
        self.thread: threading.Thread | None = None

    def start(self) -> None:
        self.thread = threading.Thread(target=self._run, name="ferry-task", daemon=True)
        self.thread.start()

    def _report(self, p: Progress) -> None:
        frac = p.done_bytes / p.total_bytes if p.total_bytes else -1.0
        mib = p.done_bytes / 2**20
        self.progress.emit(frac, f"{p.stage} — {mib:.0f} of {p.total_bytes / 2**20:.0f} MiB")

    def _run(self) -> None:
        try:
            result = self._fn(self._report)
        except Exception as exc:
            msg = str(exc) or type(exc).__name__
            if not str(exc):
                msg += "\n" + traceback.format_exc(limit=3)
            self.failed.emit(msg)
        else:
            self.done.emit(result)
