"""The page shown when there is no model yet: the built-in demo model in one
click, or converting a model of one's own."""
from __future__ import annotations

import re
from pathlib import Path

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QHBoxLayout, QLabel, QProgressBar, QPushButton, QVBoxLayout, QWidget

from app import demo, paths
from app.convert.convert import convert
from app.store.private import private_dir
from app.ui.tasks import BackgroundTask


def container_out_path(source: Path) -> Path:
    stem = source.stem if source.is_file() else source.name
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", stem).strip("-").lower() or "model"
    return paths.models_dir() / f"{name}.ferry"


class WelcomePage(QWidget):
    model_ready = Signal(str)   #: the container's path
    convert_requested = Signal()   #: "Convert a model…": the window opens the wizard

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setAccessibleName("Welcome")
        lay = QVBoxLayout(self)
        lay.setContentsMargins(48, 40, 48, 40)
        lay.addStretch(1)
        title = QLabel("<h1>Welcome to Ferry</h1>")
        title.setAlignment(Qt.AlignmentFlag.AlignCenter)
        lay.addWidget(title)
        text = QLabel("Ferry runs language models on this computer, offline. Nothing you type leaves it.<br>"
                      "There is no model here yet: try the small built-in demo model, or convert one you have "
                      "(a GGUF file or a Hugging Face checkpoint folder).")
        text.setWordWrap(True)
        text.setAlignment(Qt.AlignmentFlag.AlignCenter)
        lay.addWidget(text)
        row = QHBoxLayout()
        row.addStretch(1)
        self.demo_btn = QPushButton("Use the demo model")
        self.demo_btn.setAccessibleName("Use the built-in demo model")
        self.demo_btn.setToolTip("SmolLM2-135M-Instruct: small and quick, good for a first look")
        self.demo_btn.setDefault(True)
        self.demo_btn.setMinimumHeight(36)
        self.demo_btn.clicked.connect(self.start_demo)
        self.convert_btn = QPushButton("Convert a model…")
        self.convert_btn.setAccessibleName("Convert a model")
        self.convert_btn.setMinimumHeight(36)
        self.convert_btn.setToolTip("A guided conversion of a Hugging Face checkpoint or a GGUF file")
        self.convert_btn.clicked.connect(self.convert_requested.emit)
        row.addWidget(self.demo_btn)
        row.addWidget(self.convert_btn)
        row.addStretch(1)
        lay.addLayout(row)
        self.bar = QProgressBar()
        self.bar.setAccessibleName("Progress")
        self.bar.setRange(0, 1000)
        self.bar.setVisible(False)
        lay.addWidget(self.bar)
        self.status = QLabel("")
        self.status.setObjectName("mutedLabel")
        self.status.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.status.setWordWrap(True)
        lay.addWidget(self.status)
        lay.addStretch(2)
        self.task: BackgroundTask | None = None

    # ---- actions

    def start_demo(self) -> None:
        self._run(lambda progress: demo.ensure_demo(progress), "Preparing the demo model…")

    def convert_source(self, source: Path, out: Path | None = None) -> None:
        out = out or container_out_path(source)
        private_dir(out.parent)
        self._run(lambda progress: convert(source, out, progress=progress), f"Converting {source.name}…")

    # ---- plumbing

    def _run(self, fn, message: str) -> None:
        if self.task is not None:
            return
        self.demo_btn.setEnabled(False)
        self.convert_btn.setEnabled(False)
        self.bar.setVisible(True)
        self.bar.setRange(0, 0)
        self.status.setText(message)
        self.task = BackgroundTask(fn, self)
        self.task.progress.connect(self._progress)
        self.task.done.connect(self._done)
        self.task.failed.connect(self._failed)
        self.task.start()

    def _progress(self, frac: float, text: str) -> None:
        if frac >= 0:
            self.bar.setRange(0, 1000)
            self.bar.setValue(int(frac * 1000))
        self.status.setText(text)

    def _done(self, path) -> None:
        self.task = None
        self.bar.setRange(0, 1000)
        self.bar.setValue(1000)
        self.status.setText("Ready.")
        self._reset_buttons()
        self.model_ready.emit(str(path))

    def _failed(self, message: str) -> None:
        self.task = None
        self.bar.setVisible(False)
        self.status.setText(f"<span style='color:#d9534f'>That did not work: {message}</span>")
        self._reset_buttons()

    def _reset_buttons(self) -> None:
        self.demo_btn.setEnabled(True)
        self.convert_btn.setEnabled(True)
