"""The settings dialog: edits a copy of ``Settings``; the window saves it."""
from __future__ import annotations

from dataclasses import replace

from PySide6.QtWidgets import (QCheckBox, QComboBox, QDialog, QDialogButtonBox, QDoubleSpinBox, QFileDialog,
                               QFormLayout, QHBoxLayout, QLabel, QLineEdit, QListWidget, QMessageBox,
                               QPlainTextEdit, QPushButton, QSpinBox, QTabWidget, QVBoxLayout, QWidget)

from app.memory.stats import MemorySplit
from app.units import budget_problem, size
from app.ui.image_budget import ImageBudget
from app.ui.tool_calls import ToolsPage
from app.store.settings import MAX_ALTERNATIVES, Settings, format_stops, parse_stops, remote_api_key, set_remote_api_key

MIB = 1 << 20


def _row(*widgets: QWidget, grow_first: bool = False) -> QWidget:
    """Widgets side by side in one form row: the first takes the room (``grow_first``), or they keep left."""
    row = QWidget()
    lay = QHBoxLayout(row)
    lay.setContentsMargins(0, 0, 0, 0)
    for i, w in enumerate(widgets):
        lay.addWidget(w, 1 if grow_first and i == 0 else 0)
    if not grow_first:
        lay.addStretch(1)
    return row


def _page(form: QFormLayout) -> QWidget:
    """One page of the dialog: its rows at the top."""
    page = QWidget()
    lay = QVBoxLayout(page)
    lay.addLayout(form)
    lay.addStretch(1)
    return page


class SettingsDialog(QDialog):
    def __init__(self, settings: Settings, memory: MemorySplit | None = None, parent=None):
        super().__init__(parent)
        self.setWindowTitle("Settings")
        self.setAccessibleName("Settings")
        self._settings = settings
        self.memory = memory
        form = QFormLayout()
        form.setVerticalSpacing(8)
        self._engine_rows(form, settings)

        self.folders = QListWidget()
        self.folders.setAccessibleName("Model folders")
        self.folders.addItems(settings.model_folders)
        self.folders.setMaximumHeight(70)
        fb = QHBoxLayout()
        add = QPushButton("Add…")
        add.setAccessibleName("Add a model folder")
        add.clicked.connect(self._add_folder)
        rm = QPushButton("Remove")
        rm.setAccessibleName("Remove the selected model folder")
        rm.clicked.connect(lambda: [self.folders.takeItem(self.folders.row(i)) for i in self.folders.selectedItems()])
        fb.addWidget(add)
        fb.addWidget(rm)
        fb.addStretch(1)
        fw = QWidget()
        fl = QVBoxLayout(fw)
        fl.setContentsMargins(0, 0, 0, 0)
        fl.addWidget(self.folders)
        fl.addLayout(fb)
        form.addRow("Model folders", fw)

        self.budget = QSpinBox()
        self.budget.setAccessibleName("RAM budget in MiB")
        self.budget.setRange(0, 1 << 24)
        self.budget.setSuffix(" MiB")
        self.budget.setSpecialValueText("Recommended")
        self.budget.setValue(settings.ram_budget // MIB)
        rec = QPushButton("Use recommended")
        rec.setAccessibleName("Use the recommended RAM budget")
        rec.clicked.connect(lambda: self.budget.setValue(0))
        form.addRow("RAM budget", _row(self.budget, rec, grow_first=True))
        self.budget_note = QLabel(self._budget_note())
        self.budget_note.setObjectName("mutedLabel")
        self.budget_note.setWordWrap(True)
        form.addRow("", self.budget_note)
        self.budget.valueChanged.connect(lambda _v: self._check_budget())

        self.threads = QSpinBox()
        self.threads.setAccessibleName("Compute threads")
        self.threads.setRange(0, 256)
        self.threads.setSpecialValueText("One per CPU")
        self.threads.setValue(settings.threads)
        form.addRow("Threads", self.threads)

        self.ctx = QSpinBox()
        self.ctx.setAccessibleName("Context length in tokens")
        self.ctx.setRange(256, 1 << 20)
        self.ctx.setSingleStep(1024)
        self.ctx.setSuffix(" tokens")
        self.ctx.setValue(settings.context_length)
        self.context_policy = QComboBox()
        self.context_policy.setAccessibleName("When the context is full")
        self.context_policy.addItem("leave the oldest turns out", "drop_oldest")
        self.context_policy.addItem("summarise the oldest turns", "summarise")
        self.context_policy.setToolTip("When the next question would not fit: leave the oldest turns out of the "
                                       "prompt, or have the model summarise them into a short note it keeps "
                                       "(a few seconds more when it happens). The chat itself keeps every turn.")
        self.context_policy.setCurrentIndex(max(0, self.context_policy.findData(settings.context_policy)))
        form.addRow("Context length", _row(self.ctx, QLabel("when full:"), self.context_policy))

        self.verify_reads = QCheckBox("Check each expert read from disk against its checksum")
        self.verify_reads.setAccessibleName("Verify expert reads")
        self.verify_reads.setToolTip("Catches a damaged model file at the answer that reads it, at a small CPU "
                                     "cost per gigabyte read (see docs/bench-log/2026-12-03.md).")
        self.verify_reads.setChecked(settings.verify_reads)
        form.addRow("Integrity", self.verify_reads)

        # two pages, so the dialog fits a 13-inch laptop's screen: the engine, and how it answers
        self.pages = QTabWidget()
        self.pages.setAccessibleName("Settings pages")
        self.pages.addTab(_page(form), "Engine")
        form = QFormLayout()
        form.setVerticalSpacing(8)
        self.temp = self._dspin(0.0, 5.0, 0.05, settings.temperature, "Temperature")
        form.addRow("Temperature", self.temp)
        self.top_p = self._dspin(0.01, 1.0, 0.01, settings.top_p, "Top-p")
        form.addRow("Top-p", self.top_p)
        self.top_k = QSpinBox()
        self.top_k.setAccessibleName("Top-k")
        self.top_k.setRange(0, 100000)
        self.top_k.setSpecialValueText("Off")
        self.top_k.setValue(settings.top_k)
        form.addRow("Top-k", self.top_k)
        self.min_p = self._dspin(0.0, 0.99, 0.01, settings.min_p, "Min-p")
        form.addRow("Min-p", self.min_p)
        self.seed = QSpinBox()
        self.seed.setAccessibleName("Seed")
        self.seed.setRange(-1, 2**31 - 1)
        self.seed.setSpecialValueText("Random")
        self.seed.setValue(-1 if settings.seed is None else min(settings.seed, 2**31 - 1))
        self.seed.setToolTip("Random: each answer draws differently. A number: the same conversation and settings "
                             "give the same answer again (Regenerate repeats it), as `ferry run --seed` and the "
                             "server's seed do. Greedy answers (temperature 0) never vary.")
        seed_random = QPushButton("Back to random")
        seed_random.setAccessibleName("Sample with a fresh seed each answer")
        seed_random.clicked.connect(lambda: self.seed.setValue(-1))
        form.addRow("Seed", _row(self.seed, seed_random, grow_first=True))
        self.max_tokens = QSpinBox()
        self.max_tokens.setAccessibleName("Longest answer in tokens")
        self.max_tokens.setRange(1, 1 << 20)
        self.max_tokens.setSuffix(" tokens")
        self.max_tokens.setValue(settings.max_tokens)
        form.addRow("Longest answer", self.max_tokens)
        self.frequency_penalty = self._dspin(-2.0, 2.0, 0.1, settings.frequency_penalty, "Frequency penalty")
        self.presence_penalty = self._dspin(-2.0, 2.0, 0.1, settings.presence_penalty, "Presence penalty")
        for w, tip in ((self.frequency_penalty, "Lowers a token's chances by this much for each time it was "
                                                "already written in the answer (0: off; as the server's "
                                                "frequency_penalty)."),
                       (self.presence_penalty, "Lowers the chances of any token already written in the answer "
                                               "by this much (0: off; as the server's presence_penalty).")):
            w.setToolTip(tip)
        form.addRow("Repetition", _row(QLabel("frequency"), self.frequency_penalty, QLabel("presence"),
                                       self.presence_penalty))
        self.stop = QPlainTextEdit(format_stops(settings.stop))
        self.stop.setAccessibleName("Stop sequences")
        self.stop.setPlaceholderText("Optional: the answer ends before any of these (one a line, at most 4; "
                                     "\\n is a newline)")
        self.stop.setToolTip("As the server's stop and `ferry run --stop`: the answer ends just before the first "
                             "of these it would write (the thinking trace is not cut).")
        self.stop.setFixedHeight(48)
        form.addRow("Stop at", self.stop)

        self.thinking = QCheckBox("Let thinking models think before they answer")
        self.thinking.setAccessibleName("Thinking")
        self.thinking.setChecked(settings.thinking)
        form.addRow("Thinking", self.thinking)
        self.token_probs = QCheckBox("Show each token's probability, with")
        self.token_probs.setAccessibleName("Show token probabilities")
        self.token_probs.setToolTip("Under each new answer: every token shaded by how likely the model found it; "
                                    "point at one to see the alternatives it considered (the API's logprobs).")
        self.token_probs.setChecked(settings.token_probabilities)
        self.token_alternatives = QSpinBox()
        self.token_alternatives.setAccessibleName("Alternatives per token")
        self.token_alternatives.setRange(0, MAX_ALTERNATIVES)
        self.token_alternatives.setSuffix(" alternatives")
        self.token_alternatives.setValue(settings.token_alternatives)
        self.token_probs.toggled.connect(self.token_alternatives.setEnabled)
        self.token_alternatives.setEnabled(settings.token_probabilities)
        form.addRow("Probabilities", _row(self.token_probs, self.token_alternatives))
        self.image_budget = ImageBudget(settings.image_patch_budget)
        form.addRow("Images", self.image_budget)
        self.enter_sends = QCheckBox("Enter sends, Shift+Enter starts a new line (off: the other way round)")
        self.enter_sends.setAccessibleName("Enter sends")
        self.enter_sends.setChecked(settings.enter_sends)
        form.addRow("Keyboard", self.enter_sends)

        self.system = QPlainTextEdit(settings.system_prompt)
        self.system.setAccessibleName("System prompt")
        self.system.setPlaceholderText("Optional instructions sent before every conversation")
        self.system.setFixedHeight(70)
        form.addRow("System prompt", self.system)

        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Save | QDialogButtonBox.StandardButton.Cancel)
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        self.save_btn = buttons.button(QDialogButtonBox.StandardButton.Save)
        self._check_budget()
        lay = QVBoxLayout(self)
        self.model_note = QLabel("")
        self.model_note.setObjectName("mutedLabel")
        self.model_note.setWordWrap(True)
        self.model_note.setVisible(False)
        self.pages.addTab(_page(form), "Answers")
        self.tools_page = ToolsPage(settings.mcp_servers, settings.trusted_tools)
        self.pages.addTab(self.tools_page, "Tools")
        lay.addWidget(self.model_note)
        lay.addWidget(self.pages)
        lay.addWidget(buttons)
        self.resize(560, self.sizeHint().height())

    def note_model_settings(self, model_name: str) -> None:
        """Say that the open model has its own values, which win over these general ones."""
        self.model_note.setText(f"{model_name} has its own settings (Model → Settings for this model…); its "
                                "system prompt, temperature, context and thinking there take precedence over "
                                "these.")
        self.model_note.setVisible(True)

    def _engine_rows(self, form: QFormLayout, settings: Settings) -> None:
        """The engine: this computer, or an OpenAI-compatible server; and serving the loaded model."""
        self.engine = QComboBox()
        self.engine.setAccessibleName("Engine")
        self.engine.addItem("This computer", "local")
        self.engine.addItem("OpenAI-compatible server", "remote")
        self.engine.setCurrentIndex(1 if settings.engine == "remote" else 0)
        form.addRow("Engine", self.engine)
        self.remote_url = QLineEdit(settings.remote_url)
        self.remote_url.setAccessibleName("Server URL")
        self.remote_url.setPlaceholderText("http://gpu-box:8000/v1")
        form.addRow("Server URL", self.remote_url)
        self.remote_model = QLineEdit(settings.remote_model)
        self.remote_model.setAccessibleName("Server model")
        self.remote_model.setPlaceholderText("the first model the server lists")
        form.addRow("Model", self.remote_model)
        self.api_key = QLineEdit()
        self.api_key.setAccessibleName("API key")
        self.api_key.setEchoMode(QLineEdit.EchoMode.Password)
        self.forget_key = QPushButton("Forget")
        self.forget_key.setAccessibleName("Forget the stored API key")
        self.forget_key.clicked.connect(self._forget_key)
        form.addRow("API key", _row(self.api_key, self.forget_key, grow_first=True))
        self._key_forgotten = False
        self._show_key_state()
        self.remote_note = QLabel("Answers come from the server; the history stays on this computer. "
                                  "The key is kept in the system keychain, never in the settings file.")
        self.remote_note.setObjectName("mutedLabel")
        self.remote_note.setWordWrap(True)
        form.addRow("", self.remote_note)
        self.serve = QCheckBox("Serve the loaded model on 127.0.0.1, port")
        self.serve.setAccessibleName("Serve the loaded model")
        self.serve.setChecked(settings.serve_local)
        self.serve_port = QSpinBox()
        self.serve_port.setAccessibleName("Server port")
        self.serve_port.setRange(1024, 65535)
        self.serve_port.setValue(max(1024, settings.serve_port))
        form.addRow("OpenAI API", _row(self.serve, self.serve_port))
        self.copy_served_key = QPushButton("Copy its API key")
        self.copy_served_key.setAccessibleName("Copy the served model's API key")
        self.copy_served_key.setToolTip("Clients send it as 'Authorization: Bearer KEY' (OpenAI) or 'x-api-key: KEY' "
                                        "(Anthropic). It is kept in the system keychain.")
        self.copy_served_key.clicked.connect(self._copy_served_key)
        form.addRow("", self.copy_served_key)
        self.engine.currentIndexChanged.connect(self._engine_changed)
        self.remote_url.textChanged.connect(lambda _t: self._show_key_state())
        self._engine_changed()

    def _copy_served_key(self) -> None:
        from PySide6.QtGui import QGuiApplication

        from app.store.settings import served_api_key

        QGuiApplication.clipboard().setText(served_api_key())
        self.copy_served_key.setText("Copied")

    def _engine_changed(self, *_args) -> None:
        remote = self.engine.currentData() == "remote"
        for w in (self.remote_url, self.remote_model, self.api_key, self.forget_key, self.remote_note):
            w.setEnabled(remote)
        self.serve.setEnabled(not remote)
        self.serve_port.setEnabled(not remote)
        self.copy_served_key.setEnabled(not remote)

    def _show_key_state(self) -> None:
        stored = not self._key_forgotten and remote_api_key(self.remote_url.text()) is not None
        self.api_key.setPlaceholderText("kept in the keychain (type to replace)" if stored else "none")

    def _forget_key(self) -> None:
        self.api_key.clear()
        self._key_forgotten = True
        self._show_key_state()

    def accept(self) -> None:
        """Keep the API key in the keychain (only there), then close."""
        if self.budget_problem():
            self.pages.setCurrentIndex(0)
            return
        url, key = self.remote_url.text().strip(), self.api_key.text().strip()
        if url and (key or self._key_forgotten):
            try:
                set_remote_api_key(url, key or None)
            except RuntimeError as exc:
                QMessageBox.warning(self, "The API key was not kept", str(exc))
                return
        super().accept()

    def _dspin(self, lo, hi, step, value, name) -> QDoubleSpinBox:
        s = QDoubleSpinBox()
        s.setAccessibleName(name)
        s.setRange(lo, hi)
        s.setSingleStep(step)
        s.setDecimals(2)
        s.setValue(value)
        return s

    def _budget_note(self) -> str:
        m = self.memory
        chosen = getattr(self, "budget", None) and self.budget.value()
        if m is None:
            return ("With no budget set (Recommended), Ferry chooses one for this computer and model when it "
                    "opens it. Open a model to see its floor and recommended budget." if not chosen else
                    "Open a model to see its floor and recommended budget.")
        figures = (f"Floor {size(m.floor)} (the least this model runs in at this context) · "
                   f"recommended {size(m.recommended)} · usable RAM now {size(m.usable)}")
        return f"With no budget set, Ferry uses the recommended one. {figures}" if not chosen else figures

    def budget_problem(self) -> str:
        """Why the budget typed cannot run the open model ("" when it can)."""
        m = self.memory
        return budget_problem(self.budget.value() * MIB, m.floor, m.recommended) if m is not None else ""

    def _check_budget(self) -> None:
        """A budget below the open model's floor is refused in words (Save stays off), never saved to
        close the model."""
        problem = self.budget_problem()
        self.budget_note.setText(problem or self._budget_note())
        self.budget_note.setObjectName("errorLabel" if problem else "mutedLabel")
        self.budget_note.setStyleSheet("color: #d14d4d;" if problem else "")
        if hasattr(self, "save_btn"):
            self.save_btn.setEnabled(not problem)

    def _add_folder(self) -> None:
        d = QFileDialog.getExistingDirectory(self, "A folder with converted models")
        if d:
            self.folders.addItem(d)

    def result_settings(self) -> Settings:
        return replace(
            self._settings, **self.tools_page.values(),
            model_folders=[self.folders.item(i).text() for i in range(self.folders.count())],
            ram_budget=self.budget.value() * MIB, threads=self.threads.value(), context_length=self.ctx.value(),
            context_policy=self.context_policy.currentData(),
            temperature=self.temp.value(), top_p=self.top_p.value(), top_k=self.top_k.value(),
            min_p=self.min_p.value(), seed=None if self.seed.value() < 0 else self.seed.value(),
            token_probabilities=self.token_probs.isChecked(), token_alternatives=self.token_alternatives.value(),
            max_tokens=self.max_tokens.value(), stop=parse_stops(self.stop.toPlainText()),
            frequency_penalty=self.frequency_penalty.value(), presence_penalty=self.presence_penalty.value(),
            thinking=self.thinking.isChecked(), image_patch_budget=self.image_budget.value(),
            enter_sends=self.enter_sends.isChecked(),
            system_prompt=self.system.toPlainText(), engine=self.engine.currentData(),
            remote_url=self.remote_url.text().strip(), remote_model=self.remote_model.text().strip(),
            serve_local=self.serve.isChecked(), serve_port=self.serve_port.value(),
            verify_reads=self.verify_reads.isChecked()).validated()
