"""The main window: conversation list, chat, composer, gauges. It renders the
state held by ``Chat``, ``StatsView`` and ``Settings`` and forwards what the
user asks for to them and to the engine worker."""
from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

from PySide6.QtCore import QEvent, Qt, QTimer, Signal
from PySide6.QtGui import QAction, QKeySequence, QShortcut
from PySide6.QtWidgets import (QApplication, QComboBox, QFileDialog, QFrame, QHBoxLayout, QInputDialog, QLabel,
                               QLineEdit,
                               QListWidget, QListWidgetItem, QMainWindow, QMenu, QMessageBox, QPlainTextEdit,
                               QProgressBar, QPushButton, QScrollArea, QSplitter, QStackedWidget,
                               QToolButton,
                               QVBoxLayout, QWidget)

from app.chat import export, token_probs
from app.chat.conversation import Chat, ChatError, TurnStart, _title_from, recover_interrupted
from app.documents.ask import Citation
from app.documents.library import drop_orphans, forget_conversation
from app.documents.store import DocumentError, DocumentStore, conversation_collection
from app.api import ModelLoaded, SamplingParams, TurnRequest
from app.library import Library, display_name, find_containers, is_container, is_source
from app.memory.stats import StatsSample, StatsView, memory_split
from app.store import settings as settings_mod
from app.store.history import HistoryStore
from app.store.settings import Settings
from app.ui import theme
from app.ui.chat_view import ChatView
from app.ui.elided import ElidedLabel
from app.ui.documents_panel import PassageSearch, link_markers, open_documents_panel, show_citation
from app.ui.gauges import GaugePanel
from app.ui.library_dialog import LibraryDialog
from app.ui.model_settings_dialog import ModelSettingsDialog
from app.ui.settings_dialog import SettingsDialog
from app.ui.welcome import WelcomePage
from app.ui.worker import WorkerThread, load_options

REPAINT_INTERVAL_MS = 50   #: the answer is redrawn at most 20 times a second


class MainWindow(QMainWindow):
    model_loaded = Signal(object)
    answer_finished = Signal(str)     #: reason

    def __init__(self, store: HistoryStore, settings: Settings | None = None, *, persist_settings: bool = True):
        super().__init__()
        self.store = store
        recover_interrupted(store)
        self.settings = settings or settings_mod.load(cipher=store.cipher)
        self.persist_settings = persist_settings
        self.setWindowTitle("Ferry")
        self.setAccessibleName("Ferry")
        self.resize(1200, 780)
        self.model_info: ModelLoaded | None = None
        self._documents: DocumentStore | None = None
        self.citations: dict[int, list] = {}   #: answer message id -> the passages it may cite
        self.pending_citations: list = []
        self.pending_token_probs: list = []   #: the answer being written's token probabilities, when asked
        self.pending_tool_calls: list = []    #: the tool calls it made ({"name", "arguments"})
        self._last_error = ""
        self.memory = None
        self.stats_view = StatsView()
        self.last_stats: StatsSample | None = None   #: the last turn's final sample
        self.gen_id = 0
        self.library = Library(self.settings.model_folders)
        self.loading: str | None = None    #: the model being opened, while it loads
        self.setAcceptDrops(True)
        self.worker = WorkerThread(self)
        w = self.worker.worker
        w.loaded.connect(self._on_loaded)
        w.load_failed.connect(self._on_load_failed)
        w.response_text.connect(self._on_response)
        w.thinking_text.connect(self._on_thinking)
        w.prompt_progress.connect(self._on_prompt_progress)
        w.stats.connect(self._on_stats)
        w.token_probs.connect(self._on_token_probs)
        w.tool_call.connect(self._on_tool_call)
        w.finished.connect(self._on_finished)
        w.error.connect(self._on_error)
        w.serving.connect(self._on_serving)
        w.citations.connect(self._on_citations)
        self.chat = Chat(store)
        self._repaint_timer = QTimer(self)
        self._repaint_timer.setSingleShot(True)
        self._repaint_timer.setInterval(REPAINT_INTERVAL_MS)
        self._repaint_timer.timeout.connect(self._repaint)
        self._build()
        self._shortcuts()
        self.apply_theme()
        QApplication.instance().styleHints().colorSchemeChanged.connect(lambda *_: self.apply_theme(True))
        self._turn_t0 = time.monotonic()
        self.refresh_list()
        self.refresh_models()
        self._show_current()
        self._set_busy(False)

    # ------------------------------------------------------------ layout

    def _build(self) -> None:
        split = QSplitter(Qt.Orientation.Horizontal, self)
        split.setChildrenCollapsible(False)

        side = QFrame()
        side.setObjectName("sidebar")
        sl = QVBoxLayout(side)
        sl.setContentsMargins(10, 10, 10, 10)
        self.new_btn = QPushButton("New chat")
        self.new_btn.setAccessibleName("New chat")
        self.new_btn.setToolTip("New chat (Ctrl+N)")
        self.new_btn.clicked.connect(self.new_chat)
        sl.addWidget(self.new_btn)
        self.search = QLineEdit()
        self.search.setPlaceholderText("Search conversations (Ctrl+F)")
        self.search.setAccessibleName("Search conversations")
        self.search.setClearButtonEnabled(True)
        self.search.textChanged.connect(lambda _t: self.refresh_list())
        sl.addWidget(self.search)
        self.conv_list = QListWidget()
        self.conv_list.setAccessibleName("Conversations")
        self.conv_list.setTextElideMode(Qt.TextElideMode.ElideRight)
        self.conv_list.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.conv_list.setUniformItemSizes(True)
        self.conv_list.itemClicked.connect(self._open_item)
        self.conv_list.itemActivated.connect(self._open_item)
        self.conv_list.itemDoubleClicked.connect(lambda item: self.rename_conversation(item.data(Qt.ItemDataRole.UserRole)))
        self.conv_list.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)
        self.conv_list.customContextMenuRequested.connect(self._list_menu)
        sl.addWidget(self.conv_list, 1)
        side.setMinimumWidth(200)
        split.addWidget(side)

        center = QWidget()
        cl = QVBoxLayout(center)
        cl.setContentsMargins(0, 0, 0, 0)
        cl.setSpacing(0)
        top = QFrame()
        top.setObjectName("topBar")
        tl = QHBoxLayout(top)
        tl.setContentsMargins(14, 6, 10, 6)
        self.title_label = ElidedLabel("New chat")
        self.title_label.setObjectName("chatTitle")
        tl.addWidget(self.title_label, 1)
        self.model_combo = QComboBox()
        self.model_combo.setAccessibleName("Switch model")
        self.model_combo.setToolTip("The model answering; choose another to switch")
        self.model_combo.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToContents)
        self.model_combo.activated.connect(lambda i: self._combo_chosen(i))
        tl.addWidget(self.model_combo)
        self.model_label = QLabel("No model")
        self.model_label.setObjectName("mutedLabel")
        self.model_label.setAccessibleName("Model")
        self.attach_btn = self._top_button("Attach…", "Attach files or folders to this conversation",
                                           self.open_documents)
        self.documents_btn = self._top_button("Documents", "Collections of documents: add folders, watch, re-index",
                                              lambda: self.open_documents_page())
        self.export_btn = self._top_button("Export…", "Export this conversation (Markdown or JSON)",
                                           lambda: self.export_chat())
        self.gauges_btn = self._top_button("Gauges", "Show or hide the gauges", None)
        self.gauges_btn.setCheckable(True)
        self.gauges_btn.setChecked(True)
        self.settings_btn = self._top_button("Settings", "Settings", self.open_settings)
        for b in (self.attach_btn, self.documents_btn, self.export_btn, self.gauges_btn, self.settings_btn):
            tl.addWidget(b)
        cl.addWidget(top)

        self.stack = QStackedWidget()
        self.welcome = WelcomePage()
        self.welcome.model_ready.connect(self.load_model)
        self.welcome.convert_requested.connect(self.open_wizard)
        self.stack.addWidget(self.welcome)
        chat_page = QWidget()
        pl = QVBoxLayout(chat_page)
        pl.setContentsMargins(0, 0, 0, 0)
        pl.setSpacing(0)
        self.chat_view = ChatView()
        self.chat_view.regenerate.connect(self.regenerate)
        self.chat_view.edit.connect(self.edit_and_resend)
        self.chat_view.switch.connect(self.switch_to)
        self.chat_view.copied.connect(lambda _t: self.statusBar().showMessage("Copied to the clipboard", 2000))
        self.chat_view.cite.connect(self.show_citation)
        self.chat_view.decorate = self._with_citation_links
        pl.addWidget(self.chat_view, 1)

        bottom = QFrame()
        bottom.setObjectName("composerBar")
        bl = QVBoxLayout(bottom)
        bl.setContentsMargins(14, 8, 14, 10)
        bl.setSpacing(6)
        prow = QHBoxLayout()
        self.prompt_label = QLabel("")
        self.prompt_label.setObjectName("mutedLabel")
        self.prompt_bar = QProgressBar()
        self.prompt_bar.setAccessibleName("Prompt processing")
        self.prompt_bar.setTextVisible(False)
        self.prompt_bar.setMaximumHeight(8)
        prow.addWidget(self.prompt_label)
        prow.addWidget(self.prompt_bar, 1)
        self.prompt_row = QWidget()
        self.prompt_row.setLayout(prow)
        prow.setContentsMargins(0, 0, 0, 0)
        self.prompt_row.setVisible(False)
        bl.addWidget(self.prompt_row)
        crow = QHBoxLayout()
        self.composer = QPlainTextEdit()
        self.composer.setAccessibleName("Message")
        self.composer.installEventFilter(self)
        self.composer.setFixedHeight(76)
        crow.addWidget(self.composer, 1)
        btns = QVBoxLayout()
        self.send_btn = QPushButton("Send")
        self.send_btn.setAccessibleName("Send")
        self.send_btn.setToolTip("Send (Ctrl+Enter)")
        self.send_btn.setDefault(True)
        self.send_btn.clicked.connect(self.send)
        self.stop_btn = QPushButton("Stop")
        self.stop_btn.setAccessibleName("Stop")
        self.stop_btn.setToolTip("Stop the answer (Esc)")
        self.stop_btn.clicked.connect(self.stop)
        btns.addWidget(self.send_btn)
        btns.addWidget(self.stop_btn)
        crow.addLayout(btns)
        bl.addLayout(crow)
        pl.addWidget(bottom)
        self.stack.addWidget(chat_page)
        self.chat_page = chat_page
        cl.addWidget(self.stack, 1)
        split.addWidget(center)

        self.gauges = GaugePanel()
        self.gauge_scroll = QScrollArea()
        self.gauge_scroll.setWidget(self.gauges)
        self.gauge_scroll.setWidgetResizable(True)
        self.gauge_scroll.setFrameShape(QFrame.Shape.NoFrame)
        self.gauge_scroll.setMinimumWidth(300)
        self.gauge_scroll.setMaximumWidth(420)
        self.gauge_scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.gauges_btn.toggled.connect(lambda on: self.gauge_scroll.setVisible(on and self.model_info is not None))
        split.addWidget(self.gauge_scroll)
        split.setStretchFactor(0, 0)
        split.setStretchFactor(1, 1)
        split.setStretchFactor(2, 0)
        split.setSizes([240, 640, 320])
        self.setCentralWidget(split)
        self.model_menu = self.menuBar().addMenu("&Model")
        self.model_menu.aboutToShow.connect(self._fill_model_menu)
        self.library_action = QAction("Model library…", self)
        self.library_action.setShortcut(QKeySequence("Ctrl+Shift+L"))
        self.library_action.triggered.connect(lambda: self.open_library())
        self.model_settings_action = QAction("Settings for this model…", self)
        self.model_settings_action.triggered.connect(lambda: self.open_model_settings())
        self.convert_action = QAction("Convert a model…", self)
        self.convert_action.setShortcut(QKeySequence("Ctrl+Shift+N"))
        self.convert_action.triggered.connect(lambda: self.open_wizard())
        for a in (self.library_action, self.convert_action):
            self.addAction(a)   # the shortcuts work before the menu was ever opened
        self._fill_model_menu()
        self.wizard = None
        self.load_bar = QProgressBar()
        self.load_bar.setAccessibleName("Opening the model")
        self.load_bar.setRange(0, 0)
        self.load_bar.setMaximumWidth(140)
        self.load_bar.setMaximumHeight(12)
        self.load_bar.setVisible(False)
        self.statusBar().addPermanentWidget(self.load_bar)
        self.statusBar().addPermanentWidget(self.model_label)
        self.statusBar().showMessage("Ready")

    def _top_button(self, text: str, name: str, slot) -> QToolButton:
        b = QToolButton()
        b.setText(text)
        b.setAccessibleName(name)
        b.setToolTip(name)
        b.setAutoRaise(True)
        if slot is not None:
            b.clicked.connect(slot)
        return b

    def _shortcuts(self) -> None:
        for keys, slot in ((("Ctrl+Return", "Ctrl+Enter"), self.send), (("Esc",), self.stop),
                           (("Ctrl+N",), self.new_chat), (("Ctrl+F",), self.focus_search)):
            for k in keys:
                sc = QShortcut(QKeySequence(k), self)
                sc.setContext(Qt.ShortcutContext.WindowShortcut)
                sc.activated.connect(slot)

    def apply_theme(self, rerender: bool = False) -> None:
        app = QApplication.instance()
        theme.apply(app)
        c = theme.bubble_colors()
        self.setStyleSheet(f"""
            QFrame#userBubble {{ background: {c['user']}; border: 1px solid {c['border']}; border-radius: 10px; }}
            QFrame#assistantBubble {{ background: {c['assistant']}; border: 1px solid {c['border']};
                                      border-radius: 10px; }}
            QFrame#thinkingPanel {{ background: {c['thinking']}; border: 1px solid {c['border']};
                                    border-radius: 6px; }}
            QLabel#mutedLabel {{ color: {c['muted']}; }}
            QLabel#chatTitle {{ font-size: 13pt; font-weight: 600; }}
            QLabel#chatPlaceholder {{ color: {c['muted']}; font-size: 12pt; }}
            QLabel#gaugeValue {{ font-size: 15pt; font-weight: 600; }}
            QLabel#gaugeTitle {{ color: {c['muted']}; }}
            QFrame#gaugeTile {{ border: 1px solid {c['border']}; border-radius: 8px; }}
            QFrame#topBar, QFrame#composerBar {{ border: none; }}
        """)
        if rerender:
            self.chat_view.restyle()

    # ------------------------------------------------------------ model

    def load_model(self, path: str | Path) -> None:
        """Open a model in the background (the window stays usable; a bar shows it is loading)."""
        self.model_info = None
        self.loading = str(path)
        self.model_label.setText(f"Opening {display_name(Path(path).name)}…")
        self.statusBar().showMessage(f"Opening {path}…")
        self.load_bar.setVisible(True)
        self._set_busy(self.busy)
        self.worker.load(str(path), load_options(settings_mod.for_model(self.settings, str(path))))

    def switch_model(self, path: str | Path) -> None:
        """Answer with another model: a running answer is stopped first (it is kept, marked
        stopped), then the new engine loads in the background."""
        if self.model_info is not None and Path(self.model_info.path).resolve() == Path(path).resolve():
            return
        if self.busy:
            self.worker.stop(self.gen_id)   # the worker finishes that answer before it loads the next model
        self.load_model(path)

    def model_key(self) -> str:
        """What per-model settings are kept under: the open (or opening) container's path."""
        if self.model_info is not None:
            return self.model_info.path
        return self.loading or self.settings.model_path

    def effective(self) -> Settings:
        """The settings in effect for the open model (its own values over the general ones)."""
        return settings_mod.for_model(self.settings, self.model_key())

    def refresh_models(self) -> None:
        """The model switcher: every converted model, the open one selected."""
        self.library.model_folders = list(self.settings.model_folders)
        entries = self.library.entries()
        current = self.model_key()
        self.model_combo.blockSignals(True)
        self.model_combo.clear()
        for e in entries:
            self.model_combo.addItem(e.name, str(e.path))
        idx = next((i for i, e in enumerate(entries) if current and e.key == str(Path(current).resolve())), -1)
        if idx < 0 and self.model_info is not None:   # e.g. a remote engine or a model outside the library
            self.model_combo.addItem(self.model_info.name, self.model_info.path)
            idx = self.model_combo.count() - 1
        self.model_combo.setCurrentIndex(idx)
        self.model_combo.blockSignals(False)
        self.model_combo.setVisible(self.model_combo.count() > 0)

    def _combo_chosen(self, index: int) -> None:
        path = self.model_combo.itemData(index)
        if path:
            self.switch_model(path)

    def _fill_model_menu(self) -> None:
        m = self.model_menu
        m.clear()
        m.addAction(self.library_action)
        m.addAction(self.model_settings_action)
        self.model_settings_action.setEnabled(bool(self.model_key()))
        m.addSeparator()
        current = self.model_key()
        for e in self.library.entries():
            a = m.addAction(e.name, lambda p=str(e.path): self.switch_model(p))
            a.setCheckable(True)
            a.setChecked(bool(current) and e.key == str(Path(current).resolve()))
            a.setToolTip(str(e.path))
        m.addSeparator()
        m.addAction(self.convert_action)

    def open_library(self) -> LibraryDialog:
        d = LibraryDialog(self.library, self.model_key() or None, self)
        d.open_requested.connect(self.switch_model)
        d.convert_requested.connect(lambda: self.open_wizard())
        d.removed.connect(lambda _p: self.refresh_models())
        d.finished.connect(lambda _r: self.refresh_models())
        d.open()
        return d

    def open_model_settings(self) -> ModelSettingsDialog | None:
        key = self.model_key()
        if not key:
            return None
        name = self.model_info.name if self.model_info else display_name(Path(key).name)
        d = ModelSettingsDialog(self.settings, key, name, self)
        d.accepted.connect(lambda: self.apply_settings(d.result_settings()))
        d.open()
        return d

    # ---- drag and drop: a container opens, a GGUF file or a checkpoint folder starts the wizard

    def _dropped_path(self, event) -> Path | None:
        urls = event.mimeData().urls() if event.mimeData().hasUrls() else []
        local = [Path(u.toLocalFile()) for u in urls if u.isLocalFile()]
        if len(local) == 1 and (is_container(local[0]) or is_source(local[0])):
            return local[0]
        return None

    def dragEnterEvent(self, event) -> None:
        if self._dropped_path(event) is not None:
            event.acceptProposedAction()
        else:
            event.ignore()

    def dragMoveEvent(self, event) -> None:
        self.dragEnterEvent(event)

    def dropEvent(self, event) -> None:
        path = self._dropped_path(event)
        if path is None:
            event.ignore()
            return
        event.acceptProposedAction()
        if is_container(path):
            self.switch_model(path)
        else:
            self.open_wizard(path)

    def open_default_model(self) -> bool:
        """Open the last model or the first one found; False shows the welcome page
        and, on a first run, the conversion wizard. An unfinished conversion
        opens the wizard too, which offers to resume it."""
        from app.ui.wizard import pending

        if self.settings.engine == "remote":
            self.load_model(self.settings.model_path or "remote")
            return True
        unfinished = pending.load() is not None
        last = Path(self.settings.model_path) if self.settings.model_path else None
        models = [last] if last and is_container(last) else find_containers(self.settings.model_folders)
        if models:
            self.load_model(models[0])
            if unfinished:
                QTimer.singleShot(0, self.open_wizard)
            return True
        self.stack.setCurrentWidget(self.welcome)
        QTimer.singleShot(0, self.open_wizard)
        return False

    def open_wizard(self, source: str | Path | None = None):
        """The conversion wizard (Model → Convert a model…); at its end the new model opens.
        With ``source`` (a dropped GGUF file or checkpoint folder) it starts on that source."""
        from shiboken6 import isValid

        from app.ui.wizard import ConvertWizard

        if self.wizard is not None and isValid(self.wizard) and self.wizard.isVisible():
            wiz = self.wizard
        else:
            wiz = ConvertWizard(self)
            wiz.model_ready.connect(self._wizard_model_ready)
            self.wizard = wiz
            wiz.show()
        if source is not None:
            source = Path(source)
            if wiz.currentPage() is wiz.welcome_page:
                wiz.next()
            if wiz.currentPage() is wiz.source_page:
                wiz.source_page.choose("gguf" if source.is_file() else "hf", source)
        wiz.raise_()
        return wiz

    def _wizard_model_ready(self, path: str, budget: int) -> None:
        if budget != self.settings.ram_budget:
            self.settings.ram_budget = budget
            self._save_settings()
        self.load_model(path)

    def _on_loaded(self, info: ModelLoaded) -> None:
        info = replace(info, name=display_name(info.name))
        self.model_info = info
        self.loading = None
        self.load_bar.setVisible(False)
        if not info.remote:
            try:
                self.library.mark_used(info.path)
            except OSError:
                pass
        self.stats_view = StatsView()
        self.memory = memory_split(info.plan, info.info, info.info.ram_budget or self.settings.ram_budget,
                                   recommended=info.recommended_budget)
        self.gauges.set_model(info.has_experts, engine=info)
        self.gauges.show_memory(self.memory)
        where = f"{info.n_ctx} tokens of context" if info.n_ctx else (info.url or "remote server")
        fast = ("" if info.remote else
                " · 8-bit activations" if info.info.activations == "q8" else " · exact activations")
        self.model_label.setText(f"{info.name} · {where}{fast}")
        self.stack.setCurrentWidget(self.chat_page)
        self.chat.model_name = info.name
        self.chat_view.author = info.name
        self._show_current()
        if self.settings.model_path != info.path:
            self.settings.model_path = info.path
            self._save_settings()
        self.refresh_models()
        self.statusBar().showMessage(f"{info.name} is ready", 4000)
        self._set_busy(False)
        self.composer.setFocus()
        self.model_loaded.emit(info)

    def _on_load_failed(self, message: str) -> None:
        self.loading = None
        self.load_bar.setVisible(False)
        self.refresh_models()
        self.model_label.setText("No model")
        self.statusBar().showMessage(f"Could not open the model: {message}")
        QMessageBox.warning(self, "Could not open the model", message)
        self.stack.setCurrentWidget(self.welcome)

    # ------------------------------------------------------------ chat intents

    @property
    def busy(self) -> bool:
        return self.chat.busy

    def send(self) -> None:
        if self.busy or self.model_info is None:
            return
        text = self.composer.toPlainText().strip()
        if not text:
            return
        untitled = self.chat.id is not None and not self.chat.visible()   # saved by Attach… before any question
        start = self.chat.send(text, self.effective().system_prompt)
        if untitled:
            self.chat.rename(_title_from(text))
        self.composer.clear()
        self._begin(start)

    def send_text(self, text: str) -> None:
        self.composer.setPlainText(text)
        self.send()

    def regenerate(self, assistant_id: int) -> None:
        if self.busy or self.model_info is None:
            return
        self._begin(self.chat.regenerate(assistant_id, self.effective().system_prompt))

    def edit_and_resend(self, user_id: int, text: str) -> None:
        if self.busy or self.model_info is None:
            return
        try:
            start = self.chat.edit(user_id, text, self.effective().system_prompt)
        except ChatError as exc:
            self.statusBar().showMessage(str(exc), 4000)
            return
        self._begin(start)

    def switch_to(self, message_id: int) -> None:
        if self.busy:
            return
        self.chat.switch_to(message_id)
        self._show_current()

    def stop(self) -> None:
        if self.busy:
            self.worker.stop(self.gen_id)
            self.statusBar().showMessage("Stopping…")

    def new_chat(self) -> None:
        if self.busy:
            self.statusBar().showMessage("Stop the answer first (Esc)", 3000)
            return
        self.chat = Chat(self.store, model_name=self.model_info.name if self.model_info else "")
        self._show_current()
        self.conv_list.clearSelection()
        self.composer.setFocus()

    def open_conversation(self, conversation_id: int) -> None:
        if self.busy:
            self.statusBar().showMessage("Stop the answer first (Esc)", 3000)
            return
        self.chat = Chat(self.store, conversation_id, model_name=self.model_info.name if self.model_info else "")
        self.stack.setCurrentWidget(self.chat_page)
        self._show_current()

    def rename_conversation(self, conversation_id: int | None = None, title: str | None = None) -> None:
        cid = conversation_id if conversation_id is not None else self.chat.id
        if cid is None:
            return
        if title is None:
            current = self.store.conversation(cid).title
            title, ok = QInputDialog.getText(self, f"Rename “{current}”", "Title:", text=current)
            if not ok:
                return
        if cid == self.chat.id:
            self.chat.rename(title)
        else:
            self.store.rename(cid, title.strip() or "Untitled")
        self.refresh_list()
        self.title_label.set_full_text(self.chat.title)

    def delete_conversation(self, conversation_id: int) -> None:
        if self.busy and conversation_id == self.chat.id:
            return
        try:        # its attached files go with it
            forget_conversation(self.documents(), conversation_id)
        except Exception as exc:  # noqa: BLE001 - said; they are removed at the next open (drop_orphans)
            self.statusBar().showMessage(f"The chat's documents could not be removed now: {exc}", 6000)
        self.store.delete_conversation(conversation_id)
        if conversation_id == self.chat.id:
            self.chat = Chat(self.store, model_name=self.chat.model_name)
            self._show_current()
        self.refresh_list()

    def export_chat(self, path: str | Path | None = None, fmt: str | None = None) -> Path | None:
        """Export… : the conversation as Markdown or JSON (messages, thinking, citations,
        model, sampling, token counts). Without ``path`` a save dialog asks."""
        if not self.chat.visible():
            self.statusBar().showMessage("Nothing to export yet", 3000)
            return None
        if path is None:
            safe = "".join(ch if ch.isalnum() or ch in " -_" else "_" for ch in self.chat.title).strip() or "chat"
            filters = ";;".join(export.FORMATS.values())
            path, chosen = QFileDialog.getSaveFileName(self, f"Export “{self.chat.title}”",
                                                       str(Path.home() / f"{safe}.md"), filters)
            if not path:
                return None
            fmt = next((k for k, v in export.FORMATS.items() if v == chosen), None)
            if fmt and Path(path).suffix.lower() != f".{fmt}":
                path = f"{path}.{fmt}"
        eff = self.effective()
        sampling = {"temperature": eff.temperature, "top_p": eff.top_p, "top_k": eff.top_k, "min_p": eff.min_p,
                    "seed": eff.seed, "stop": list(eff.stop), "frequency_penalty": eff.frequency_penalty,
                    "presence_penalty": eff.presence_penalty,
                    "max_tokens": eff.max_tokens, "thinking": eff.thinking, "system_prompt": eff.system_prompt}
        try:
            out = export.write(self.chat, path, fmt, model=self.chat.model_name, sampling=sampling,
                               citations=self.citations)
        except (OSError, ValueError) as exc:
            QMessageBox.warning(self, "Could not export", str(exc))
            return None
        self.statusBar().showMessage(f"Exported to {out}", 4000)
        return out

    def export_markdown(self, path: str | Path) -> Path | None:
        return self.export_chat(path, "md")

    def focus_search(self) -> None:
        self.search.setFocus()
        self.search.selectAll()

    def open_settings(self) -> SettingsDialog:
        d = SettingsDialog(self.settings, self.memory, self)
        if self.model_key() in self.settings.model_settings:
            d.note_model_settings(self.model_info.name if self.model_info else display_name(
                Path(self.model_key()).name))
        d.accepted.connect(lambda: self.apply_settings(d.result_settings()))
        d.open()
        return d

    def apply_settings(self, new: Settings) -> None:
        key = self.model_key()
        old, self.settings = settings_mod.for_model(self.settings, key), new
        self._save_settings()
        self.library.model_folders = list(new.model_folders)
        self.refresh_models()
        new = settings_mod.for_model(new, key)
        if settings_mod.engine_changed(old, new):
            if new.engine == "remote" and not self.model_info:
                self.load_model(new.model_path or "remote")
            elif self.model_info and not self.busy:
                self.load_model(self.model_info.path)
        elif (old.serve_local, old.serve_port) != (new.serve_local, new.serve_port):
            self.worker.set_serving(new.serve_port if new.serve_local else 0)

    def _on_serving(self, url: str, error: str) -> None:
        if error:
            self.statusBar().showMessage(f"Could not serve the model: {error}")
        elif url:
            self.statusBar().showMessage(f"Serving the model at {url} (OpenAI-compatible)", 6000)

    def _save_settings(self) -> None:
        if self.persist_settings:
            settings_mod.save(self.settings, cipher=self.store.cipher)

    # ------------------------------------------------------------ generation

    def _request(self, start: TurnStart) -> TurnRequest:
        s = self.effective()
        req = TurnRequest(messages=list(start.messages), max_tokens=int(s.max_tokens), thinking=bool(s.thinking),
                          sampling=SamplingParams(temperature=s.temperature, top_p=s.top_p, top_k=s.top_k,
                                                  min_p=s.min_p, seed=s.seed, frequency_penalty=s.frequency_penalty,
                                                  presence_penalty=s.presence_penalty),
                          top_logprobs=int(s.token_alternatives) if s.token_probabilities else None,
                          stop=list(s.stop),
                          # issue 17's opt-in routing modes (None / 0: exact, the default)
                          experts_per_token=s.experts_per_token,
                          cache_aware_margin=float(s.cache_aware_margin or 0.0), client="window")
        return req

    def _passage_search(self, start: TurnStart) -> PassageSearch | None:
        """Attached documents: the engine's thread searches them and puts their best passages
        into the prompt as content (the citations come back by ``_on_citations``)."""
        if self.chat.id is None or not self.model_info or not self._has_documents():
            return None
        return PassageSearch(self.documents(), self._collection(), str(self.model_info.path),
                             start.messages[-1]["content"])

    # ---- documents

    def documents(self) -> DocumentStore:
        """The encrypted document store beside the history, opened on first use."""
        if self._documents is None:
            from app.documents.indexer import FolderWatcher

            self._documents = DocumentStore.beside(self.store)     # the history's key: no second scrypt
            # files attached to chats deleted by a version that kept them (a new chat could get that id)
            drop_orphans(self._documents, self.store.conversation_ids())
            # watched folders: changes since the last run, then every few seconds (its own thread and connection)
            self._watcher = FolderWatcher(self._documents).start()
            # what searches read, into the OS page cache before the first question (background, bounded)
            self._documents.warm()
        return self._documents

    def start_documents(self) -> None:
        """Open the documents at start-up (called once the window shows): watched folders are brought
        up to date and the search index is read ahead, both in background threads, so the first
        question after a reboot does not wait for the disk. A failure here is shown when the
        documents are used."""
        try:
            self.documents()
        except Exception:       # noqa: BLE001 - reported by the first real use, not at start-up
            pass

    def open_documents_page(self):
        """The documents page: every collection, its files, add folder / watch / remove / re-index."""
        from app.ui.documents_page import open_documents_page

        return open_documents_page(self, self.documents(), self.conversation_titles())

    def conversation_titles(self) -> dict[int, str]:
        return {c.id: c.title for c in self.store.conversations()}

    def _collection(self) -> str:
        return conversation_collection(self.chat.id)

    def _has_documents(self) -> bool:
        try:
            return bool(self.documents().files(self._collection()))
        except DocumentError:
            return False

    def open_documents(self):
        """The documents attached to this conversation (a new chat is saved first)."""
        if self.chat.id is None:
            self.chat.id = self.store.create_conversation(self.chat.title or "New chat", model=self.chat.model_name)
            self.refresh_list()
        return open_documents_panel(self, self.documents(), self._collection(), title=self.chat.title)

    def _with_citation_links(self, record, text: str) -> str:
        citations = self.citations.get(record.id)
        return link_markers(text, citations)[0] if citations else text

    def show_citation(self, message_id: int, n: int):
        citation = next((c for c in self.citations.get(message_id, []) if c.n == n), None)
        if citation is None:
            return None
        return show_citation(self, self.documents(), citation)

    def _begin(self, start: TurnStart) -> None:
        self.last_stats = None
        self.pending_token_probs = []
        self.pending_tool_calls = []
        self._last_error = ""
        self.statusBar().clearMessage()
        self._show_current()
        self._set_busy(True)
        self.prompt_row.setVisible(True)
        self.prompt_bar.setRange(0, 0)
        search = self._passage_search(start)
        self.pending_citations = []
        self.prompt_label.setText("Searching the documents…" if search else "Reading the conversation…")
        self._turn_t0 = time.monotonic()
        self.gen_id = self.worker.generate(self._request(start), search=search)
        self.refresh_list()

    def _on_citations(self, gen_id: int, citations: list) -> None:
        if self.chat.busy and gen_id == self.gen_id:
            self.pending_citations = list(citations)

    def _on_response(self, text: str) -> None:
        if self.chat.busy:
            self.chat.append("response", text)
            self._schedule_repaint()

    def _on_thinking(self, text: str) -> None:
        if self.chat.busy:
            self.chat.append("thinking", text)
            self._schedule_repaint()

    def _schedule_repaint(self) -> None:
        if not self._repaint_timer.isActive():
            self._repaint_timer.start()

    def _repaint(self) -> None:
        self.chat_view.refresh_streaming()

    def _on_prompt_progress(self, done: int, total: int) -> None:
        if not self.chat.busy:
            return
        if done >= total:
            self.prompt_row.setVisible(False)
            return
        self.prompt_row.setVisible(True)
        self.prompt_bar.setRange(0, max(1, total))
        self.prompt_bar.setValue(done)
        from app.documents.library import reading_label

        self.prompt_label.setText(reading_label(len(self.pending_citations or []), done, total,
                                                time.monotonic() - self._turn_t0))

    def _on_stats(self, sample: StatsSample) -> None:
        self.stats_view.push_sample(sample)
        if sample.final:
            self.last_stats = sample
        self.gauges.show_values(self.stats_view)

    def _on_tool_call(self, call) -> None:
        if self.chat.busy:
            self.pending_tool_calls.append({"name": call.name, "arguments": call.arguments})

    def _on_token_probs(self, entries: list) -> None:
        if self.chat.busy:
            self.pending_token_probs = entries

    def _on_finished(self, reason: str, text: str, thinking: str) -> None:
        if not self.chat.busy:
            return
        s = self.last_stats
        turn = s.turn.record() if s is not None and s.turn is not None else {}
        if self.pending_token_probs:   # kept with the answer (the encrypted history), shown under it
            turn[token_probs.STATS_KEY] = self.pending_token_probs
            self.pending_token_probs = []
        if self.pending_tool_calls:    # shown under the answer (the window runs no tools)
            turn["tool_calls"] = self.pending_tool_calls
            self.pending_tool_calls = []
        if self.pending_citations:   # kept with the answer, so the links survive a restart
            turn["citations"] = [c.as_dict() for c in self.pending_citations]
        self.chat.finish(reason, text, thinking, stats=turn)
        if self.pending_citations:
            self.citations[self.chat.tree.leaf_id] = self.pending_citations
            self.pending_citations = []
        self.prompt_row.setVisible(False)
        self._set_busy(False)
        self._show_current()
        self.refresh_list()
        if reason == "error":  # the engine's message stays, not the turn's figures
            self.statusBar().showMessage(f"Error: {self._last_error or 'the answer stopped'}")
        elif turn.get("turn_tokens") and turn.get("turn_seconds"):
            first = f"first token after {turn['ttft_s']:.1f} s · " if turn.get("ttft_s") is not None else ""
            msg = (f"{turn['turn_tokens']} tokens in {turn['turn_seconds']:.1f} s · {first}"
                   f"{turn.get('turn_prompt_tokens', 0)} prompt tokens read, "
                   f"{turn.get('turn_reused_tokens', 0)} reused")
            self.statusBar().showMessage(("Stopped · " if reason == "cancelled" else "") + msg)
        elif reason == "cancelled":
            self.statusBar().showMessage("Stopped")
        self.answer_finished.emit(reason)

    def _on_error(self, message: str) -> None:
        self._last_error = message
        self.statusBar().showMessage(f"Error: {message}")

    # ------------------------------------------------------------ rendering

    def _set_busy(self, busy: bool) -> None:
        ready = self.model_info is not None
        self.send_btn.setEnabled(ready and not busy)
        self.stop_btn.setEnabled(busy)
        self.new_btn.setEnabled(not busy)
        self.conv_list.setEnabled(not busy)
        self.model_settings_action.setEnabled(bool(self.model_key()))
        self.chat_view.set_busy(busy)
        self.export_btn.setVisible(ready)
        self.gauges_btn.setVisible(ready)
        self.gauge_scroll.setVisible(ready and self.gauges_btn.isChecked())

    def _show_current(self) -> None:
        self.title_label.set_full_text(self.chat.title)
        self._load_citations()
        name = self.model_info.name if self.model_info else None
        self.chat_view.set_placeholder(
            f"<p style='font-size:15pt'>Start a conversation</p><p>{name} runs on this computer; "
            f"nothing you type leaves it.</p><p>{self._send_keys()} · Esc stops · Ctrl+N starts a new chat · "
            "drop a GGUF file here to convert it</p>"
            if name else "<p>Open a model to start, or drop a GGUF file or a checkpoint folder here.</p>")
        self.composer.setPlaceholderText(f"Ask anything… ({self._send_keys()})")
        self.chat_view.show_chat(self.chat, name)

    def _send_keys(self) -> str:
        return ("Enter sends, Shift+Enter for a new line" if self.settings.enter_sends else
                "Shift+Enter sends, Enter for a new line")

    def _load_citations(self) -> None:
        """The citation links of the conversation's answers, as saved with them (they survive a restart)."""
        for m in self.chat.tree.by_id.values():
            saved = (m.stats or {}).get("citations")
            if saved and m.id not in self.citations:
                try:
                    self.citations[m.id] = [Citation(**c) for c in saved]
                except TypeError:   # saved by another version: the links are left out, the text stays
                    continue

    def eventFilter(self, obj, event) -> bool:
        if obj is self.composer and event.type() == QEvent.Type.KeyPress and \
                event.key() in (Qt.Key.Key_Return, Qt.Key.Key_Enter):
            mods = event.modifiers() & ~Qt.KeyboardModifier.KeypadModifier
            if mods == Qt.KeyboardModifier.NoModifier or mods == Qt.KeyboardModifier.ShiftModifier:
                shift = mods == Qt.KeyboardModifier.ShiftModifier
                if shift != self.settings.enter_sends:   # this key sends
                    self.send()
                    return True
                self.composer.insertPlainText("\n")
                return True
        return super().eventFilter(obj, event)

    def refresh_list(self) -> None:
        q = self.search.text()
        infos = self.store.search(q) if q.strip() else self.store.conversations()
        self.conv_list.blockSignals(True)
        self.conv_list.clear()
        for info in infos:
            item = QListWidgetItem(info.title or "Untitled")
            item.setData(Qt.ItemDataRole.UserRole, info.id)
            item.setToolTip(time.strftime("%Y-%m-%d %H:%M", time.localtime(info.updated)))
            self.conv_list.addItem(item)
            if info.id == self.chat.id:
                item.setSelected(True)
                self.conv_list.setCurrentItem(item)
        self.conv_list.blockSignals(False)

    def _open_item(self, item: QListWidgetItem) -> None:
        cid = item.data(Qt.ItemDataRole.UserRole)
        if cid != self.chat.id:
            self.open_conversation(cid)

    def _list_menu(self, pos) -> None:
        item = self.conv_list.itemAt(pos)
        if item is None:
            return
        cid = item.data(Qt.ItemDataRole.UserRole)
        menu = QMenu(self)
        menu.addAction("Rename…", lambda: self.rename_conversation(cid))
        menu.addAction("Delete", lambda: self.delete_conversation(cid))
        menu.exec(self.conv_list.mapToGlobal(pos))

    # ------------------------------------------------------------ shutdown

    def shutdown(self) -> None:
        if self.chat.busy:
            self.worker.stop(self.gen_id)
            self.chat.finish("cancelled")
        if self.wizard is not None:
            from shiboken6 import isValid
            if isValid(self.wizard):
                self.wizard.shutdown()
        if getattr(self, "_watcher", None) is not None:
            self._watcher.stop()
            self._watcher = None
        if self._documents is not None:     # stops its warm-up too
            self._documents.close()
            self._documents = None
        self.worker.close()

    def closeEvent(self, event) -> None:
        self.shutdown()
        super().closeEvent(event)
