"""Page 5: the conversion, in the background, pausable, resumable."""
from __future__ import annotations

import collections
import time

from PySide6.QtCore import QTimer, Signal
from PySide6.QtWidgets import QHBoxLayout, QProgressBar, QPushButton, QVBoxLayout, QWizardPage

from app.convert.convert import ConvertCancelled, ConvertControl, convert
from app.ui.wizard import pending
from app.ui.wizard.common import GREEN, RED, Job, colour, duration, esc, para, rate, size

RATE_WINDOW_S = 8.0


class ConvertPage(QWizardPage):
    converted = Signal(str)      #: the container's path
    stopped = Signal(str)        #: "cancelled" or the error message

    def __init__(self, state, parent=None):
        super().__init__(parent)
        self.state = state
        self.setTitle("Converting")
        self.setSubTitle("You can keep using your computer. Pause or stop at any time: what is done is kept, "
                         "and Ferry resumes it later, even after it was closed.")
        lay = QVBoxLayout(self)
        self.what = para()
        lay.addWidget(self.what)
        self.bar = QProgressBar()
        self.bar.setAccessibleName("Conversion progress")
        self.bar.setRange(0, 1000)
        lay.addWidget(self.bar)
        self.amount = para()
        self.amount.setAccessibleName("Bytes converted")
        lay.addWidget(self.amount)
        self.speed = para()
        self.speed.setAccessibleName("Speed and time left")
        lay.addWidget(self.speed)
        self.stage = para()
        self.stage.setAccessibleName("Current layer")
        lay.addWidget(self.stage)
        self.message = para()
        self.message.setAccessibleName("Conversion status")
        lay.addWidget(self.message)
        row = QHBoxLayout()
        self.pause_btn = QPushButton("Pause")
        self.pause_btn.setAccessibleName("Pause the conversion")
        self.pause_btn.clicked.connect(self.toggle_pause)
        self.stop_btn = QPushButton("Stop")
        self.stop_btn.setAccessibleName("Stop the conversion (it can be resumed)")
        self.stop_btn.setToolTip("Stop now; what is converted is kept and Resume goes on from there")
        self.stop_btn.clicked.connect(self.stop)
        self.resume_btn = QPushButton("Resume")
        self.resume_btn.setAccessibleName("Resume the conversion")
        self.resume_btn.clicked.connect(self.start)
        for b in (self.pause_btn, self.stop_btn, self.resume_btn):
            row.addWidget(b)
        row.addStretch(1)
        lay.addLayout(row)
        lay.addStretch(1)
        self.control: ConvertControl | None = None
        self.job: Job | None = None
        self.latest = None            #: the newest Progress (written by the converter's thread)
        self.samples: collections.deque = collections.deque()
        self._bps = 0.0
        self._poll = QTimer(self)
        self._poll.setInterval(100)
        self._poll.timeout.connect(self._show_progress)
        self._buttons(running=False)

    # ---- lifecycle

    def initializePage(self) -> None:
        s = self.state
        self.what.setText(f"<b>{esc(s.source.name)}</b> → {esc(s.out)}<br>"
                          f"{size(s.report.container_bytes)} to write.")
        self.message.setText("")
        self.start()

    def cleanupPage(self) -> None:   # Back: stop, keeping the work
        self.stop_and_wait()

    def running(self) -> bool:
        """A conversion whose outcome has not been shown yet."""
        return self.job is not None

    def start(self) -> None:
        if self.running() or self.state.result is not None:
            return
        s = self.state
        if s.remember:
            pending.save(s.kind, s.source, s.out, s.budget, s.trunk_format, s.expert_format)
        self.control = ctl = ConvertControl()
        self.latest = None
        self.samples.clear()
        self.message.setText("Starting…")
        src, out, trunk, experts = s.source, s.out, s.trunk_format, s.expert_format

        def run():
            return convert(src, out, trunk_format=trunk, expert_format=experts, progress=self._progress,
                           control=ctl)

        job = Job(run, self)
        job.done.connect(self._done)
        job.failed.connect(self._failed)
        self.job = job.start()
        self._poll.start()
        self._buttons(running=True)

    def toggle_pause(self) -> None:
        if not self.running():
            return
        if self.control.paused:
            self.control.resume()
            self.pause_btn.setText("Pause")
            self.message.setText("")
        else:
            self.control.pause()
            self.pause_btn.setText("Continue")
            self.message.setText("Paused. The work so far is safe on disk; Continue goes on.")

    def stop(self) -> None:
        if self.running():
            self.control.cancel()
            self.message.setText("Stopping…")

    def stop_and_wait(self, timeout: float = 60) -> None:
        """Cancel and wait for the converter to stop (it checks after every record)."""
        if self.running():
            self.control.cancel()
            self.job.thread.join(timeout)

    # ---- reports

    def _progress(self, p) -> None:   # on the converter's thread: just keep it
        self.latest = p

    def _show_progress(self) -> None:
        p = self.latest
        if p is None:
            return
        total = max(1, p.total_bytes)
        self.bar.setValue(int(1000 * p.done_bytes / total))
        self.amount.setText(f"{size(p.done_bytes)} of {size(p.total_bytes)} ({100 * p.done_bytes / total:.1f} %)")
        now = time.monotonic()
        if not p.paused:
            self.samples.append((now, p.done_bytes))
        while len(self.samples) > 2 and now - self.samples[0][0] > RATE_WINDOW_S:
            self.samples.popleft()
        if p.paused:
            self.speed.setText("Paused" + (f" (it was writing {rate(self._bps)})" if self._bps else ""))
        elif len(self.samples) >= 2 and self.samples[-1][0] > self.samples[0][0]:
            (t0, d0), (t1, d1) = self.samples[0], self.samples[-1]
            bps = self._bps = (d1 - d0) / (t1 - t0)
            left = (p.total_bytes - p.done_bytes) / bps if bps > 0 else None
            self.speed.setText(f"{rate(bps)}" + (f" · about {duration(left)} left" if left is not None else ""))
        where = p.stage.replace("paused: ", "")
        self.stage.setText(f"Now: {esc(where)}")

    def _done(self, path) -> None:
        self._show_progress()
        self._poll.stop()
        self.job = None
        self.state.result = path
        if self.state.remember:
            pending.clear()
        self.bar.setValue(1000)
        self.message.setText(colour("Converted.", GREEN))
        self._buttons(running=False)
        self.completeChanged.emit()
        self.converted.emit(str(path))
        w = self.wizard()
        if w is not None and w.currentPage() is self:
            QTimer.singleShot(0, w.next)

    def _failed(self, exc) -> None:
        self._show_progress()
        self._poll.stop()
        self.job = None
        self._buttons(running=False)
        if isinstance(exc, ConvertCancelled):
            p = self.latest
            kept = f"{size(p.done_bytes)} of {size(p.total_bytes)} " if p else ""
            self.message.setText(f"Stopped. {kept}converted so far is kept. <b>Resume</b> goes on from there, "
                                 "now or after Ferry was closed.")
            self.speed.setText("")
            self.stopped.emit("cancelled")
        else:
            self.message.setText(colour(f"<b>The conversion stopped:</b> {esc(exc)}", RED))
            self.resume_btn.setText("Try again")
            self.stopped.emit(str(exc))

    def _buttons(self, running: bool) -> None:
        self.pause_btn.setEnabled(running)
        self.pause_btn.setText("Pause")
        self.stop_btn.setEnabled(running)
        self.resume_btn.setVisible(not running and self.state.result is None and self.control is not None)
        if running:
            self.resume_btn.setText("Resume")

    def isComplete(self) -> bool:
        return self.state.result is not None
