"""Page 3: where the container goes: enough room, and a disk fast enough."""
from __future__ import annotations

import re
import shutil
import threading
from pathlib import Path

from PySide6.QtCore import QTimer
from PySide6.QtWidgets import (QFileDialog, QFormLayout, QHBoxLayout, QLineEdit, QProgressBar, QPushButton,
                               QVBoxLayout, QWizardPage)

from app import paths
from app.store.private import private_models_dir
from app.convert.convert import JOURNAL, SPACE_MARGIN, _already_written, partial_dir
from app.ui.wizard.common import GREEN, ORANGE, RED, Job, colour, esc, para, rate, size


def container_name(source: Path) -> str:
    stem = source.stem if source.suffix.lower() == ".gguf" else source.name
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", stem).strip("-").lower() or "model"
    return f"{name}.ferry"


def free_name(folder: Path, name: str) -> str:
    """``name``, or name-2, name-3… when a finished model already has it."""
    base = name[:-6] if name.endswith(".ferry") else name
    candidate, n = name, 2
    while (folder / candidate).exists():
        candidate, n = f"{base}-{n}.ferry", n + 1
    return candidate


class DestinationPage(QWizardPage):
    def __init__(self, state, parent=None):
        super().__init__(parent)
        self.state = state
        self.setTitle("Where should the converted model go?")
        self.setSubTitle("It needs room for the whole model, and the disk's speed sets how fast the model answers.")
        lay = QVBoxLayout(self)
        form = QFormLayout()
        row = QHBoxLayout()
        self.folder_edit = QLineEdit()
        self.folder_edit.setAccessibleName("Destination folder")
        self.folder_edit.textChanged.connect(lambda _t: self._debounce.start())
        self.browse_btn = QPushButton("Browse…")
        self.browse_btn.setAccessibleName("Browse for the destination folder")
        self.browse_btn.clicked.connect(self.browse)
        row.addWidget(self.folder_edit, 1)
        row.addWidget(self.browse_btn)
        form.addRow("Folder", row)
        self.name_edit = QLineEdit()
        self.name_edit.setAccessibleName("Model name")
        self.name_edit.textEdited.connect(self._name_typed)
        self.name_edit.textChanged.connect(lambda _t: self._debounce.start())
        form.addRow("Name", self.name_edit)
        lay.addLayout(form)
        self.space = para()
        self.space.setAccessibleName("Free space")
        lay.addWidget(self.space)
        self.speed_bar = QProgressBar()
        self.speed_bar.setAccessibleName("Measuring the disk")
        self.speed_bar.setRange(0, 1000)
        self.speed_bar.setVisible(False)
        lay.addWidget(self.speed_bar)
        self.speed = para()
        self.speed.setAccessibleName("Disk speed")
        lay.addWidget(self.speed)
        lay.addStretch(1)
        self._debounce = QTimer(self)
        self._debounce.setSingleShot(True)
        self._debounce.setInterval(350)
        self._debounce.timeout.connect(self.check)
        self._poll = QTimer(self)
        self._poll.setInterval(100)
        self._poll.timeout.connect(lambda: self.speed_bar.setValue(int(self._probe_frac * 1000)))
        self._probe_frac = 0.0
        self._cancel_probe: threading.Event | None = None
        self.probe_job: Job | None = None
        self.space_ok = False
        self._preset_out: Path | None = None
        self._probed: Path | None = None
        self._name_auto = True       #: the name is ours to choose until the user types one

    # ---- intents

    def preset(self, out: Path) -> None:
        self._preset_out = out

    def set_folder(self, folder: str | Path, name: str | None = None) -> None:
        self.folder_edit.setText(str(folder))
        if name is not None:
            self.name_edit.setText(name)
            self._name_auto = False
        self.check()

    def _name_typed(self, _text: str) -> None:
        self._name_auto = False

    def _default_name(self) -> None:
        """A name from the source that is free in the folder (or the one an
        unfinished conversion there used, so that it resumes)."""
        src = self.state.source
        if src is None or not self._name_auto:
            return
        from app import demo
        folder = Path(self.folder_edit.text()).expanduser()
        name = demo.CONTAINER_NAME if self.state.kind == "demo" else container_name(src)
        self.name_edit.setText(name if partial_dir(folder / name).exists() else free_name(folder, name))

    def browse(self) -> None:
        p = QFileDialog.getExistingDirectory(self, "Where to put the converted model", self.folder_edit.text())
        if p:
            self.folder_edit.setText(p)

    def initializePage(self) -> None:
        if self._preset_out is not None:
            out, self._preset_out = self._preset_out, None
            self.folder_edit.setText(str(out.parent))
            self.name_edit.setText(out.name)
            self._name_auto = False
        else:
            if not self.folder_edit.text():
                self.folder_edit.setText(str(paths.models_dir()))
            self._name_auto = True
            self._default_name()
        self.check()

    def cleanupPage(self) -> None:
        self._stop_probe()

    # ---- checks

    def out_path(self) -> Path | None:
        folder, name = self.folder_edit.text().strip(), self.name_edit.text().strip()
        if not folder or not name:
            return None
        if not name.endswith(".ferry"):
            name += ".ferry"
        return Path(folder).expanduser() / name

    def check(self) -> None:
        self._debounce.stop()
        if self._name_auto:
            self.name_edit.blockSignals(True)
            self._default_name()
            self.name_edit.blockSignals(False)
        self.space_ok = False
        self.state.out = None
        out = self.out_path()
        report = self.state.report
        self.completeChanged.emit()
        if out is None or report is None:
            self.space.setText("Choose a folder and a name.")
            return
        folder = out.parent
        if not folder.is_dir():
            made = folder.parent.is_dir() and folder == paths.models_dir()
            if made:
                private_models_dir()
            else:
                self.space.setText(colour(f"The folder {esc(folder)} does not exist.", RED))
                return
        if out.exists():
            self.space.setText(colour(f"There is already a model called <b>{esc(out.name)}</b> in this folder. "
                                      "Choose another name.", RED))
            return
        if "/" in self.name_edit.text() or "\\" in self.name_edit.text():
            self.space.setText(colour("The name cannot contain a slash.", RED))
            return
        done = _already_written(partial_dir(out)) if (partial_dir(out) / JOURNAL).exists() else 0
        need = max(0, report.container_bytes - done) + SPACE_MARGIN
        free = shutil.disk_usage(folder).free
        resume = ""
        if done:
            pct = 100 * min(done, report.container_bytes) / max(1, report.container_bytes)
            resume = (f"An earlier conversion into this name stopped at {pct:.0f} %; it will go on from there "
                      "(if the source is unchanged). ")
        if free < need:
            self.space.setText(colour(
                f"<b>Not enough space:</b> {resume}the converted model needs {size(need)} more, and this disk "
                f"has {size(free)} free. Choose another folder, or free {size(need - free)}.", RED))
            self.speed.setText("")
            self.completeChanged.emit()
            return
        self.space_ok = True
        self.state.out = out
        self.space.setText(colour(f"{resume}The converted model needs {size(need)} (with {size(SPACE_MARGIN)} "
                                  f"to spare); this disk has {size(free)} free.", GREEN))
        self.completeChanged.emit()
        report = self.state.report
        if report is not None and not (report.n_experts and report.record_bytes):
            # a dense model streams nothing from the disk: its speed does not matter
            self.state.speed = None
            self.speed.setText("This model has no experts to stream: it reads the disk only while it opens, "
                               "so the disk's speed was not measured.")
        elif self._probed != folder:
            self.start_probe(folder)

    # ---- the disk probe

    def start_probe(self, folder: Path) -> None:
        from app.memory.disk_probe import probe

        self._stop_probe()
        report = self.state.report
        block = report.record_bytes or 4 << 20
        self._probe_frac = 0.0
        cancel = threading.Event()
        self._cancel_probe = cancel
        self.speed_bar.setValue(0)
        self.speed_bar.setVisible(True)
        self.speed.setText("Measuring how fast this disk reads expert-sized blocks…")
        self._poll.start()

        def run():
            return probe(folder, block=block, progress=lambda f: setattr(self, "_probe_frac", f), cancel=cancel)

        job = Job(run, self)
        job.done.connect(lambda speed, f=folder, c=cancel: self._probe_done(f, c, speed))
        job.failed.connect(lambda exc, f=folder, c=cancel: self._probe_failed(f, c, exc))
        self.probe_job = job.start()
        self.completeChanged.emit()

    def _stop_probe(self) -> None:
        if self._cancel_probe is not None:
            self._cancel_probe.set()
        if self.probe_job is not None:
            self.probe_job.thread.join(30)
        self.probe_job = None
        self._poll.stop()
        self.speed_bar.setVisible(False)

    def _probe_done(self, folder: Path, cancel, speed) -> None:
        if cancel is not self._cancel_probe:
            return
        self.probe_job = None
        self._poll.stop()
        self.speed_bar.setVisible(False)
        self._probed = folder
        self.state.speed = speed
        self.speed.setText(describe_speed(speed, self.state.report))
        self.completeChanged.emit()

    def _probe_failed(self, folder: Path, cancel, exc) -> None:
        if cancel is not self._cancel_probe:
            return
        self.probe_job = None
        self._poll.stop()
        self.speed_bar.setVisible(False)
        self._probed = folder
        self.state.speed = None
        self.speed.setText(colour(f"The disk's speed could not be measured ({esc(exc)}). You can still convert "
                                  "here.", ORANGE))
        self.completeChanged.emit()

    def isComplete(self) -> bool:
        return self.space_ok and self.probe_job is None


def describe_speed(speed, report) -> str:
    from app.memory.disk_probe import tok_s_bound

    how = "bypassing the cache" if speed.direct else esc(speed.note)
    readers = f"{speed.readers} readers" if speed.readers > 1 else "one reader"
    text = (f"<b>This disk reads {rate(speed.read_bytes_per_s)}</b> in {size(speed.block)} pieces from {readers}, "
            f"as the engine does ({how}); "
            f"it wrote {rate(speed.write_bytes_per_s)}.")
    bound = tok_s_bound(speed.read_bytes_per_s, report.cold_bytes_per_token if report else 0)
    if bound is None:
        return text + "<br>This model has no experts to stream: the disk's speed only matters while it opens."
    text += (f"<br>For this model that means at most <b>{bound:.1f} tokens per second</b> while the experts "
             f"a token needs ({size(report.cold_bytes_per_token)}) are not in RAM yet; the cache makes "
             "repeated ones faster.")
    if speed.slow:
        why = "it is attached by USB" if speed.device == "usb" else "it reads under 1 GB/s"
        text += "<br>" + colour(f"<b>This disk is slow for Ferry</b> ({why}). An internal SSD typically reads "
                                "3–7 GB/s and would make the model several times faster. You can still use it.",
                                ORANGE)
    return text
