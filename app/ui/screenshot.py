"""``--screenshot DIR``: drive the real window through its main states on a
real model and save one PNG per state. Used for the docs and by a test."""
from __future__ import annotations

import sys
import time
from pathlib import Path

from PySide6.QtCore import QObject, QTimer
from PySide6.QtWidgets import QApplication

TIMEOUT_S = 300
STREAM_CHARS = 160   #: grab the streaming state once this much text is on screen


class ScreenshotRun(QObject):
    def __init__(self, window, out: Path, model: str | None, prompt: str):
        super().__init__(window)
        self.w = window
        self.out = out
        self.model = model
        self.prompt = prompt
        self.ok = False
        self.saved: list[Path] = []
        self.t0 = time.monotonic()
        self._stream_grabbed = False
        self._poll = QTimer(self)
        self._poll.setInterval(40)
        self._poll.timeout.connect(self._watch_stream)
        self._deadline = QTimer(self)
        self._deadline.setSingleShot(True)
        self._deadline.timeout.connect(self._timed_out)

    def start(self) -> None:
        self._deadline.start(TIMEOUT_S * 1000)
        self.w.model_loaded.connect(self._loaded)
        self.w.worker.worker.load_failed.connect(self._load_failed)
        self.w.stack.setCurrentWidget(self.w.welcome)
        QTimer.singleShot(300, self._welcome)

    def _welcome(self) -> None:
        self._grab("01-welcome")
        if self.model:
            self.w.load_model(self.model)
        else:
            self.w.welcome.start_demo()
            if self.w.welcome.task is not None:
                self.w.welcome.task.failed.connect(self._demo_failed)

    # bound methods, so that signals from other threads are queued to this one
    def _load_failed(self, message: str) -> None:
        self._fail(f"the model did not open: {message}")

    def _demo_failed(self, message: str) -> None:
        self._fail(f"the demo model is unavailable: {message}")

    def _loaded(self, _info: dict) -> None:
        QTimer.singleShot(300, self._empty)

    def _empty(self) -> None:
        self._grab("02-empty-chat")
        self.w.answer_finished.connect(self._finished)
        self.w.send_text(self.prompt)
        self._poll.start()

    def _watch_stream(self) -> None:
        if self._stream_grabbed or not self.w.chat.busy:
            return
        m = self.w.chat.tree.by_id.get(self.w.chat.streaming_id)
        if m is None:
            return
        thinking_open = bool(m.thinking) and not m.content and len(m.thinking) >= STREAM_CHARS
        if thinking_open or len(m.content) >= STREAM_CHARS:
            self.w.chat_view.refresh_streaming()
            self._stream_grabbed = True
            self._grab("03-streaming")

    def _finished(self, reason: str) -> None:
        self._poll.stop()
        if not self._stream_grabbed:  # a very quick answer: show what the stream left
            self._stream_grabbed = True
            self._grab("03-streaming")
        QTimer.singleShot(400, self._after_finish)

    def _after_finish(self) -> None:
        self._grab("04-finished")
        self._grab("05-gauges", self.w.gauge_scroll)
        d = self.w.open_settings()
        QTimer.singleShot(300, lambda: self._settings(d))

    def _settings(self, dialog) -> None:
        self._grab("06-settings", dialog)
        dialog.reject()
        self.ok = True
        print("\n".join(str(p) for p in self.saved))
        QApplication.instance().quit()

    def _grab(self, name: str, widget=None) -> None:
        QApplication.processEvents()
        target = widget or self.w
        path = self.out / f"{name}.png"
        if not target.grab().save(str(path), "PNG"):
            self._fail(f"could not write {path}")
            return
        self.saved.append(path)

    def _timed_out(self) -> None:
        self._fail(f"timed out after {TIMEOUT_S} s")

    def _fail(self, message: str) -> None:
        if self.ok:
            return
        print(f"ferry: screenshot run failed: {message}", file=sys.stderr)
        QApplication.instance().exit(1)
