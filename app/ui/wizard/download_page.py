"""The download page (after Source, when "Download a model" is chosen): the
plan of a hub repository on this computer before its weights move, then the
download converted while it arrives (app.get: this page only renders its
state and forwards intent). The network is used only from here, and the page
says so while it is."""
from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QObject, Qt, Signal
from PySide6.QtWidgets import (QCheckBox, QComboBox, QHBoxLayout, QLineEdit, QListWidget, QListWidgetItem,
                               QProgressBar, QPushButton, QVBoxLayout, QWizardPage)

from app.ui.wizard.common import GREEN, ORANGE, RED, Job, colour, duration, esc, para, rate, size

VERDICT_COLOURS = {"runs well": GREEN, "runs slowly": ORANGE, "does not fit": RED}


class _Relay(QObject):
    """Progress from the download thread, delivered on the GUI thread."""

    progress = Signal(object)


class DownloadPage(QWizardPage):
    def __init__(self, state, parent=None):
        super().__init__(parent)
        self.state = state
        self.setTitle("Download a model")
        self.setSubTitle("Ferry plans the model on this computer from a few small files, then downloads it and "
                         "converts each part as it arrives. This is the only time Ferry uses the network.")
        lay = QVBoxLayout(self)
        self.catalogue = QListWidget()
        self.catalogue.setAccessibleName("Models known to work")
        self.catalogue.setMaximumHeight(110)
        self.catalogue.itemClicked.connect(lambda item: self.set_repo(item.data(Qt.ItemDataRole.UserRole)))
        lay.addWidget(self.catalogue)
        row = QHBoxLayout()
        self.repo_edit = QLineEdit()
        self.repo_edit.setAccessibleName("Repository")
        self.repo_edit.setPlaceholderText("owner/name on the Hugging Face hub, e.g. allenai/OLMoE-1B-7B-0924-Instruct")
        self.repo_edit.returnPressed.connect(self.plan)
        self.plan_btn = QPushButton("Check")
        self.plan_btn.setAccessibleName("Check the repository")
        self.plan_btn.clicked.connect(self.plan)
        row.addWidget(self.repo_edit, 1)
        row.addWidget(self.plan_btn)
        lay.addLayout(row)
        self.file_combo = QComboBox()
        self.file_combo.setAccessibleName("GGUF file")
        self.file_combo.setVisible(False)
        self.file_combo.activated.connect(lambda _i: self.plan())
        lay.addWidget(self.file_combo)
        self.plan_text = para()
        self.plan_text.setAccessibleName("Plan")
        lay.addWidget(self.plan_text)
        self.delete_box = QCheckBox("Delete each downloaded part once it is converted (needs much less disk)")
        self.delete_box.setAccessibleName("Delete the download as it is converted")
        self.delete_box.setVisible(False)
        lay.addWidget(self.delete_box)
        self.network = para()
        self.network.setAccessibleName("Network use")
        lay.addWidget(self.network)
        self.bar = QProgressBar()
        self.bar.setAccessibleName("Download progress")
        self.bar.setRange(0, 1000)
        self.bar.setVisible(False)
        lay.addWidget(self.bar)
        self.status = para()
        self.status.setAccessibleName("Download status")
        lay.addWidget(self.status)
        buttons = QHBoxLayout()
        self.start_btn = QPushButton("Download and convert")
        self.start_btn.setAccessibleName("Download and convert")
        self.start_btn.setEnabled(False)
        self.start_btn.clicked.connect(self.start)
        self.pause_btn = QPushButton("Pause")
        self.pause_btn.setAccessibleName("Pause the download")
        self.pause_btn.setEnabled(False)
        self.pause_btn.clicked.connect(self.toggle_pause)
        self.cancel_btn = QPushButton("Stop")
        self.cancel_btn.setAccessibleName("Stop the download")
        self.cancel_btn.setEnabled(False)
        self.cancel_btn.clicked.connect(self.stop)
        for b in (self.start_btn, self.pause_btn, self.cancel_btn):
            buttons.addWidget(b)
        buttons.addStretch(1)
        lay.addLayout(buttons)
        lay.addStretch(1)
        self.relay = _Relay(self)
        self.relay.progress.connect(self._progress)
        self.plan_job: Job | None = None
        self.job: Job | None = None
        self.control = None
        self.current_plan = None
        self._asked = None
        self.into: Path | None = None          #: where to download (default: Ferry's models folder)
        self.plan_kwargs: dict = {}             #: passed to plan_repo / Getter (tests: memory, speeds)

    # ---- catalogue

    def initializePage(self) -> None:
        if self.catalogue.count() == 0:
            job = Job(lambda: self._catalogue(), self)
            job.done.connect(self._show_catalogue)
            job.failed.connect(lambda exc: self.catalogue.addItem(f"(the catalogue could not be planned: {exc})"))
            self.cat_job = job.start()

    def _catalogue(self):
        from app.get.catalogue import catalogue
        kw = {k: v for k, v in self.plan_kwargs.items() if k in ("memory",)}
        return catalogue(**kw, disk_bps=self.plan_kwargs.get("disk_bps"),
                         kernel_bps_of=(lambda f: self.plan_kwargs["kernel_bps"]) if "kernel_bps" in self.plan_kwargs
                         else None)

    def _show_catalogue(self, rows) -> None:
        self.catalogue.clear()
        for r in rows:
            tps = f", about {r.tok_per_s:.1f} tokens/s" if r.tok_per_s and r.verdict != "does not fit" else ""
            item = QListWidgetItem(f"{r.name} ({r.repo_id}): {r.verdict}{tps}")
            item.setData(Qt.ItemDataRole.UserRole, r.repo_id)
            item.setToolTip(r.reason)
            if r.repo_id == "demo":
                item.setFlags(item.flags() & ~Qt.ItemFlag.ItemIsEnabled)
            self.catalogue.addItem(item)

    # ---- intents

    def set_repo(self, repo_id: str) -> None:
        if repo_id and repo_id != "demo":
            self.repo_edit.setText(repo_id)
            self.plan()

    def plan(self) -> None:
        repo = self.repo_edit.text().strip()
        if not repo or (self.job is not None and self.job.running()):
            return
        file = self.file_combo.currentData() if self.file_combo.isVisible() else None
        self._asked = (repo, file)
        self.current_plan = None
        self.start_btn.setEnabled(False)
        self._network(f"Asking {self._host()} about {repo} (a few small files)…")
        self.plan_text.setText("Checking…")
        into = self._into()
        job = Job(lambda: self._plan(repo, file, into), self)
        job.done.connect(lambda p, ask=self._asked: self._planned(ask, p))
        job.failed.connect(lambda exc, ask=self._asked: self._plan_failed(ask, exc))
        self.plan_job = job.start()

    def _plan(self, repo, file, into):
        from app.get.plan import plan_repo
        return plan_repo(repo, into=into, file=file, **self.plan_kwargs)

    def start(self) -> None:
        from app.convert.convert import ConvertControl
        from app.get.pipeline import Getter

        plan = self.current_plan
        if plan is None:
            return
        self.control = ConvertControl()
        getter = Getter(plan.repo_id, self._into(), revision=plan.commit, file=plan.file,
                        trunk_format=plan.trunk_format, expert_format=plan.expert_format,
                        delete_source=self.delete_box.isChecked(), progress=self.relay.progress.emit,
                        control=self.control, **{k: v for k, v in self.plan_kwargs.items() if k == "memory"})
        self.getter = getter
        self.bar.setVisible(True)
        self.bar.setValue(0)
        self._network(f"<b>Downloading from {esc(self._host())}</b>: Ferry is using the network until the download "
                      "ends. Stop keeps what was downloaded; starting again resumes.")
        self.start_btn.setEnabled(False)
        self.pause_btn.setEnabled(True)
        self.cancel_btn.setEnabled(True)
        self.plan_btn.setEnabled(False)
        job = Job(getter.run, self)
        job.done.connect(self._done)
        job.failed.connect(self._failed)
        self.job = job.start()

    def toggle_pause(self) -> None:
        if self.control is None:
            return
        if self.control.paused:
            self.control.resume()
            self.pause_btn.setText("Pause")
        else:
            self.control.pause()
            self.pause_btn.setText("Resume")
            self.status.setText(self.status.text() + "; pausing (the part being written is finished first)")

    def stop(self) -> None:
        if self.control is not None:
            self.control.cancel()

    def stop_and_wait(self) -> None:
        self.stop()
        if self.job is not None:
            self.job.thread.join(timeout=30)

    # ---- rendering

    def _planned(self, asked, plan) -> None:
        if asked != self._asked:
            return
        from app.get.plan import describe
        self._network("")
        self.current_plan = plan
        if plan.ggufs and len(plan.ggufs) > 1 and not self.file_combo.isVisible():
            self.file_combo.clear()
            for name, n in plan.ggufs:
                self.file_combo.addItem(f"{name} ({size(n)})", name)
            self.file_combo.setVisible(True)
        c = VERDICT_COLOURS.get(plan.verdict, ORANGE)
        body = esc(describe(plan)).replace("\n", "<br>")
        self.plan_text.setText(colour(f"<b>{esc(plan.verdict.capitalize())}</b>: {esc(plan.reason)}", c)
                               + f"<p style='font-size:small'>{body}</p>")
        free = plan.free_disk_bytes
        tight = free is not None and plan.peak_disk_bytes > free
        self.delete_box.setVisible(plan.kind == "hf" and not plan.problems)
        self.delete_box.setChecked(tight)
        self.start_btn.setEnabled(not plan.problems and (free is None or plan.peak_disk_delete_bytes <= free))

    def _plan_failed(self, asked, exc) -> None:
        if asked != self._asked:
            return
        self._network("")
        self.plan_text.setText(colour(f"<b>That cannot be downloaded:</b> {esc(exc)}", RED))

    def _progress(self, p) -> None:
        total = p.download_total + p.convert_total
        if total:
            self.bar.setValue(int(1000 * (p.downloaded + p.converted) / total))
        parts = []
        if p.download_total:
            left = f", {duration(p.eta)} left" if p.eta is not None else ""
            at = f" at {rate(p.rate)}" if p.rate > 0 and not p.paused else ""
            parts.append(f"Downloaded {size(p.downloaded)} of {size(p.download_total)}{at}{left}")
        if p.convert_total:
            parts.append(f"converted {size(p.converted)} of {size(p.convert_total)} ({esc(p.convert_stage)})")
        if p.paused:
            parts.append("paused")
        if p.note:
            parts.append(esc(p.note))
        self.status.setText("; ".join(parts))

    def _done(self, out) -> None:
        self._network("")
        self._buttons_idle()
        self.bar.setValue(1000)
        self.state.result = Path(out)
        self.state.report = None
        self.status.setText(colour(f"<b>Downloaded and converted:</b> {esc(out)}", GREEN))
        self.completeChanged.emit()

    def _failed(self, exc) -> None:
        self._network("")
        self._buttons_idle()
        cancelled = type(exc).__name__ == "ConvertCancelled"
        self.status.setText(colour(f"<b>{'Stopped' if cancelled else 'The download stopped'}:</b> {esc(exc)}",
                                   ORANGE if cancelled else RED))

    def _buttons_idle(self) -> None:
        self.start_btn.setEnabled(self.current_plan is not None and not self.current_plan.problems)
        self.start_btn.setText("Resume the download")
        self.pause_btn.setEnabled(False)
        self.pause_btn.setText("Pause")
        self.cancel_btn.setEnabled(False)
        self.plan_btn.setEnabled(True)

    def _network(self, text: str) -> None:
        self.network.setText(colour(text, ORANGE) if text else "")

    def _host(self) -> str:
        from app.get.hub import endpoint
        return endpoint()

    def _into(self) -> Path:
        if self.into is not None:
            return self.into
        from app.paths import models_dir
        return models_dir()

    def isComplete(self) -> bool:
        return self.state.result is not None and self.state.kind == "download"

    def nextId(self) -> int:
        wiz = self.wizard()
        return wiz.finish_id if wiz is not None else -1
