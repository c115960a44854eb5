"""Page 6: every checksum of the new container, then a chat on it."""
from __future__ import annotations

from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QProgressBar, QVBoxLayout, QWizardPage

from app.ui.wizard.common import GREEN, RED, Job, colour, esc, para, size


class FinishPage(QWizardPage):
    def __init__(self, state, parent=None):
        super().__init__(parent)
        self.state = state
        self.setTitle("Checking the converted model")
        self.setSubTitle("Every record is read back and its checksum compared, so a bad disk shows up now.")
        lay = QVBoxLayout(self)
        self.bar = QProgressBar()
        self.bar.setAccessibleName("Verification progress")
        self.bar.setRange(0, 1000)
        lay.addWidget(self.bar)
        self.message = para()
        self.message.setAccessibleName("Verification result")
        lay.addWidget(self.message)
        lay.addStretch(1)
        self.verified = False
        self.job: Job | None = None
        self._frac = 0.0
        self._poll = QTimer(self)
        self._poll.setInterval(100)
        self._poll.timeout.connect(lambda: self.bar.setValue(int(1000 * self._frac)))

    def initializePage(self) -> None:
        from app.api import verify

        self.verified = False
        self.bar.setValue(0)
        self.message.setText("Reading every record back…")
        path = self.state.result

        def progress(done: int, total: int):
            self._frac = done / total if total else 0.0

        job = Job(lambda: verify(path, progress), self)
        job.done.connect(self._ok)
        job.failed.connect(self._bad)
        self.job = job.start()
        self._poll.start()

    def _ok(self, _none) -> None:
        self._poll.stop()
        self.bar.setValue(1000)
        self.verified = True
        out = self.state.result
        on_disk = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
        self.message.setText(colour("<b>The model is ready.</b>", GREEN) +
                             f"<p>{esc(out.name)}: {size(on_disk)} in {esc(out.parent)}, every checksum "
                             "correct.</p><p><b>Open a chat</b> starts a conversation with it.</p>")
        self.completeChanged.emit()

    def _bad(self, exc) -> None:
        self._poll.stop()
        self.message.setText(colour(f"<b>The converted model is damaged:</b> {esc(exc)}", RED) +
                             "<p>The disk may be failing. Delete the folder and convert again, ideally to "
                             "another disk.</p>")

    def isComplete(self) -> bool:
        return self.verified

    def nextId(self) -> int:
        return -1                      # the last page (the download page is added after it)
