"""What the wizard's pages share: the state being built, a background job
that reports to the GUI thread, and number formatting."""
from __future__ import annotations

import threading
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from PySide6.QtCore import QObject, Signal
from PySide6.QtWidgets import QLabel

from app.units import size  # noqa: F401  (the pages take it from here)

SOURCE_KINDS = ("hf", "gguf", "demo", "download")
RED, ORANGE, GREEN = "#c9302c", "#b35c00", "#2e7d32"


@dataclass
class WizardState:
    kind: str = "hf"                 #: "hf", "gguf", "demo" or "download"
    source: Path | None = None
    report: Any = None               #: app.convert.validate.SourceReport of `source`
    trunk_format: str = "auto"       #: how the trunk is stored (app.convert.format_choices)
    expert_format: str = "auto"      #: how the experts are stored
    out: Path | None = None          #: the container to write
    speed: Any = None                #: app.memory.disk_probe.DiskSpeed of the destination
    budget: int = 0                  #: the RAM budget chosen (bytes)
    result: Path | None = None       #: the finished container
    remember: bool = True            #: note an unfinished conversion for the next start (off in screenshots)


class Job(QObject):
    """``fn`` on a plain thread; ``done`` / ``failed`` arrive on the GUI thread
    (connect them to methods of QObjects that live there)."""

    done = Signal(object)
    failed = Signal(object)          #: the exception

    def __init__(self, fn: Callable[[], Any], parent=None):
        super().__init__(parent)
        self._fn = fn
        self.thread = threading.Thread(target=self._run, name="ferry-wizard-job", daemon=True)

    def start(self) -> "Job":
        self.thread.start()
        return self

    def running(self) -> bool:
        return self.thread.is_alive()

    def _run(self) -> None:
        try:
            result = self._fn()
        except BaseException as exc:   # reported, never lost on the thread
            if not str(exc):
                exc.args = (type(exc).__name__ + "\n" + traceback.format_exc(limit=4),)
            self.failed.emit(exc)
        else:
            self.done.emit(result)


def rate(bps: float) -> str:
    return f"{size(bps)}/s"


def duration(seconds: float) -> str:
    s = int(round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s" if s < 600 else f"{round(s / 60)} min"
    return f"{s // 3600} h {(s % 3600) // 60:02d} min"


def para(text: str = "") -> QLabel:
    """A wrapping rich-text label."""
    label = QLabel(text)
    label.setWordWrap(True)
    label.setTextFormat(__import__("PySide6.QtCore", fromlist=["Qt"]).Qt.TextFormat.RichText)
    label.setOpenExternalLinks(False)
    return label


def colour(text: str, c: str) -> str:
    return f"<span style='color:{c}'>{text}</span>"


def esc(text: object) -> str:
    """Text for a rich-text label: control and invisible characters shown as
    escapes (app.untrusted.shown: a hub's file name, a model's metadata), then
    HTML-escaped."""
    import html

    from app.untrusted import shown
    return html.escape(shown(text, newlines=True))
