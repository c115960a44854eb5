"""The main window composes the views — conversation list, top bar with the
model picker, chat view, composer, gauges — over a Qt-free
``ChatController`` (app/controller), which holds the conversation and makes
each turn. The window renders state and forwards intent: the user's to the
controller and the engine worker, the worker's typed events to the
controller."""
from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtGui import QKeySequence, QShortcut
from PySide6.QtWidgets import (QApplication, QMainWindow, QSplitter,
                               QStackedWidget, QVBoxLayout, QWidget)

from app.api import ModelLoaded
from app.chat.conversation import ChatError, TurnStart
from app.controller.chat_controller import ChatController, setup_note
from app.memory.stats import StatsSample, StatsView
from app.store import settings as settings_mod
from app.store.history import HistoryStore
from app.store.settings import Settings
from app.ui import theme
from app.ui.chat_page import ChatPage
from app.ui.citation_dialog import show_citation
from app.ui.conversation_list import ConversationList
from app.ui.documents_panel import open_documents_panel
from app.ui import export_dialog
from app.ui.gauges import GaugeDock
from app.ui.model_host import ModelHost
from app.ui.settings_dialog import SettingsDialog
from app.ui.image_attach import ImageAttach
from app.ui.tool_rounds import ToolRounds
from app.ui.top_bar import TopBar
from app.ui.welcome import WelcomePage
from app.ui.worker import WorkerThread, on_gui

REPAINT_INTERVAL_MS = 50   #: the answer is redrawn at most 20 times a second


def install_shortcuts(w) -> None:
    """The window's keyboard shortcuts (send, stop, new chat, search)."""
    for keys, slot in ((("Ctrl+Return", "Ctrl+Enter"), w.send), (("Esc",), w.stop),
                       (("Ctrl+N",), w.new_chat), (("Ctrl+F",), w.focus_search)):
        for k in keys:
            sc = QShortcut(QKeySequence(k), w)
            sc.setContext(Qt.ShortcutContext.WindowShortcut)
            sc.activated.connect(slot)


class MainWindow(QMainWindow):
    model_loaded = Signal(object)
    answer_finished = Signal(str)     #: reason

    def __init__(self, store: HistoryStore, settings: Settings | None = None, *, persist_settings: bool = True):
        super().__init__(windowTitle="Ferry", accessibleName="Ferry")
        self.store = store
        self.settings = settings or settings_mod.load(cipher=store.cipher)
        self.persist_settings = persist_settings
        self.controller = ChatController(store, self.effective)
        self.resize(1200, 780)
        self.memory, self.stats_view, self.last_stats = None, StatsView(), None   #: last_stats: the turn's final sample
        self.worker = WorkerThread(self)
        self.quit_action = quit_action = self.menuBar().addMenu("&File").addAction("Quit")   # Ctrl+Q, Cmd+Q
        quit_action.setShortcut(QKeySequence("Ctrl+Q"))     # Cmd+Q on a Mac (Qt maps Ctrl to Cmd there)
        quit_action.triggered.connect(self.close)
        self.models = ModelHost(self)
        self.model_menu, self.convert_action = self.models.menu, self.models.convert_action
        self.library, self.model_label, self.load_bar = self.models.library, self.models.label, self.models.load_bar
        self.load_model, self.switch_model, self.refresh_models = (self.models.load, self.models.switch,
                                                                   self.models.refresh)
        w, c = self.worker.worker, self.controller    # the worker's typed events, on the GUI thread
        for signal, slot in ((w.response_text, lambda t: self._on_text("response", t)),
                             (w.thinking_text, lambda t: self._on_text("thinking", t)),
                             (w.token_probs, c.on_token_probs), (w.turn_done, c.on_turn_done),
                             (w.citations, c.on_citations), (w.summarised, c.on_summary), (w.error, self._on_error)):
            on_gui(signal, slot, self)
        w.prompt_progress.connect(self._on_prompt_progress)
        w.stats.connect(self._on_stats)
        w.finished.connect(self._on_finished)
        self._repaint_timer = QTimer(self, singleShot=True, interval=REPAINT_INTERVAL_MS)
        self._repaint_timer.timeout.connect(lambda: self.chat_view.refresh_streaming())
        self._build()
        install_shortcuts(self)
        self.apply_theme()
        QApplication.instance().styleHints().colorSchemeChanged.connect(lambda *_: self.apply_theme(True))
        self.refresh_list()
        self.refresh_models()
        self._show_current()
        self._set_busy(False)
        self.tools.connect_servers()

    # ------------------------------------------------------------ layout

    def _build(self) -> None:
        split = QSplitter(Qt.Orientation.Horizontal, self)
        split.setChildrenCollapsible(False)
        self.sidebar = ConversationList()
        self.sidebar.new_requested.connect(self.new_chat)
        self.sidebar.search_changed.connect(lambda _t: self.refresh_list())
        self.sidebar.open_requested.connect(lambda cid: cid != self.chat.id and self.open_conversation(cid))
        self.sidebar.rename_requested.connect(self.rename_conversation)
        self.sidebar.delete_requested.connect(self.delete_conversation)
        self.new_btn, self.search, self.conv_list = self.sidebar.new_btn, self.sidebar.search, self.sidebar.list
        split.addWidget(self.sidebar)

        center = QWidget()
        cl = QVBoxLayout(center)
        cl.setContentsMargins(0, 0, 0, 0)
        cl.setSpacing(0)
        self.top = top = TopBar()
        self.title_label, self.model_combo, self.export_btn = top.title_label, top.model_combo, top.export_btn
        top.model_combo.chosen.connect(self.switch_model)
        top.attach_btn.clicked.connect(self.open_documents)
        top.documents_btn.clicked.connect(lambda: self.open_documents_page())
        top.export_btn.clicked.connect(lambda: self.export_chat())
        top.settings_btn.clicked.connect(self.open_settings)
        cl.addWidget(top)
        self.stack = QStackedWidget()
        self.welcome = WelcomePage()
        self.welcome.model_ready.connect(self.load_model)
        self.welcome.convert_requested.connect(lambda: self.models.open_wizard())
        self.stack.addWidget(self.welcome)
        self.chat_page = page = ChatPage()
        self.chat_view, self.composer_bar = page.view, page.composer
        bar = page.composer
        self.chat_view.regenerate.connect(self.regenerate)
        self.chat_view.resume.connect(self.continue_answer)
        self.chat_view.fork.connect(self.fork_at)
        self.chat_view.edit.connect(self.edit_and_resend)
        self.chat_view.switch.connect(self.switch_to)
        self.chat_view.copied.connect(lambda _t: self.statusBar().showMessage("Copied to the clipboard", 2000))
        self.chat_view.cite.connect(self.show_citation)
        self.chat_view.decorate = self.controller.linked
        bar.send_requested.connect(self.send)
        bar.stop_requested.connect(self.stop)
        bar.enter_sends = lambda: self.settings.enter_sends
        self.composer, self.send_btn, self.stop_btn = bar.editor, bar.send_btn, bar.stop_btn
        self.prompt_row, self.prompt_label, self.prompt_bar = bar.prompt_row, bar.prompt_label, bar.prompt_bar
        self.tools = ToolRounds(self, page)   # MCP tool calls between the parts of an answer
        self.images = ImageAttach(self, page)   # images for the next message: attach, drop, paste
        self.tool_approval = self.tools.approval
        self.stack.addWidget(self.chat_page)
        cl.addWidget(self.stack, 1)
        split.addWidget(center)

        self.gauge_scroll = GaugeDock()
        self.gauges = self.gauge_scroll.panel
        top.gauges_btn.toggled.connect(lambda on: self.gauge_scroll.setVisible(on and self.model_info is not None))
        split.addWidget(self.gauge_scroll)
        for i, stretch in enumerate((0, 1, 0)):
            split.setStretchFactor(i, stretch)
        split.setSizes([240, 640, 320])
        self.setCentralWidget(split)
        self.statusBar().showMessage("Ready")

    def apply_theme(self, rerender: bool = False) -> None:
        theme.apply(QApplication.instance())
        self.setStyleSheet(theme.window_stylesheet())
        if rerender:
            self.chat_view.restyle()

    @property
    def chat(self):
        return self.controller.chat

    @property
    def busy(self) -> bool:
        return self.controller.busy

    # ------------------------------------------------------------ model

    @property
    def model_info(self) -> ModelLoaded | None:
        return self.models.info

    def model_key(self) -> str:
        return self.models.key()

    def effective(self) -> Settings:
        """The settings in effect for the open model (its own values over the general ones)."""
        return settings_mod.for_model(self.settings, self.model_key())

    def show_model(self, info: ModelLoaded) -> None:
        """A model is open: its gauges, the chat page, its name on answers."""
        self.stats_view = StatsView()
        self.memory = self.gauges.show_model(info, self.settings.ram_budget)
        self.stack.setCurrentWidget(self.chat_page)
        self.controller.set_model(info.name, info)
        self.chat_view.author = info.name
        self._show_current()
        self.statusBar().showMessage(f"{info.name} is ready", 4000)
        self._set_busy(False)
        self.composer.setFocus()
        self.model_loaded.emit(info)

    # ------------------------------------------------------------ chat intents

    def send(self) -> None:
        text = self.composer.toPlainText().strip()
        if self.busy and (text or self.controller.pending_images):   # one answer at a time; the draft stays
            where = "" if self.controller.on_screen else f" in “{self.controller.writing.title}”"
            return self.statusBar().showMessage(f"Wait for the answer{where}, or stop it (Esc)", 4000)
        if self.model_info is None or not (text or self.controller.pending_images):
            return
        start = self.controller.send(text)
        self.composer_bar.clear()
        self._begin(start)

    def send_text(self, text: str) -> None:
        self.composer.setPlainText(text)
        self.send()

    def regenerate(self, assistant_id: int) -> None:
        if not self.busy and self.model_info is not None:
            self._begin(self.controller.regenerate(assistant_id))

    def continue_answer(self, assistant_id: int) -> None:
        """Continue: the stopped or cut-off answer goes on from where it stopped, in the same message."""
        if not self.busy and self.model_info is not None:
            try:
                start = self.controller.continue_answer(assistant_id)
            except ChatError as exc:
                return self.statusBar().showMessage(str(exc), 4000)
            self._begin(start)

    def fork_at(self, message_id: int) -> None:
        """Fork: a new chat with the conversation up to ``message_id``, opened."""
        try:
            self.controller.fork(message_id)
        except ChatError as exc:
            return self.statusBar().showMessage(str(exc), 4000)
        self.stack.setCurrentWidget(self.chat_page)
        self._show_current()
        self.refresh_list()
        self._say_elsewhere()
        self.statusBar().showMessage(f"Forked into “{self.chat.title}”", 4000)
        self.composer.setFocus()

    def edit_and_resend(self, user_id: int, text: str) -> None:
        if self.busy or self.model_info is None:
            return
        try:
            start = self.controller.edit(user_id, text)
        except ChatError as exc:
            return self.statusBar().showMessage(str(exc), 4000)
        self._begin(start)

    def switch_to(self, message_id: int) -> None:
        if not self.chat.busy:
            self.chat.switch_to(message_id)
            self._show_current()

    def stop(self) -> None:
        if self.tools.stop():   # between two tool rounds: nothing runs on the engine
            self._on_finished("cancelled", None, None)
        elif self.busy:
            self.worker.stop(self.controller.turn.gen_id)
            self.statusBar().showMessage("Stopping…")

    def new_chat(self) -> None:
        """A new chat on screen; an answer being written goes on in its own chat."""
        self.controller.new_chat()
        self._show_current()
        self.conv_list.clearSelection()
        self.composer.setFocus()
        self._say_elsewhere()

    def open_conversation(self, conversation_id: int) -> None:
        self.controller.open(conversation_id)
        self.stack.setCurrentWidget(self.chat_page)
        self._show_current()
        self._say_elsewhere()

    def _say_elsewhere(self) -> None:
        """The chat on screen changed while an answer is being written: where it is, and how to stop it."""
        if self.busy:
            self._set_busy(True)
            if not self.controller.on_screen:
                self.statusBar().showMessage(f"Answering in “{self.controller.writing.title}” · Esc stops it")

    def rename_conversation(self, conversation_id: int | None = None, title: str | None = None) -> None:
        cid = conversation_id if conversation_id is not None else self.chat.id
        if title is None and cid is not None:
            title = self.sidebar.ask_title(self.store.conversation(cid).title)
        if cid is None or title is None:
            return
        self.controller.rename(cid, title)
        self.refresh_list()
        self.title_label.set_full_text(self.chat.title)

    def delete_conversation(self, conversation_id: int) -> None:
        if self.busy and conversation_id == self.controller.writing.id:
            return self.statusBar().showMessage("Stop the answer first (Esc)", 3000)
        self.statusBar().showMessage(self.controller.delete(conversation_id), 6000)   # "" or a warning
        self._show_current()
        self.refresh_list()

    def export_chat(self, path: str | Path | None = None, fmt: str | None = None) -> Path | None:
        """Export… : the conversation as Markdown or JSON. Without ``path`` a save dialog asks."""
        return export_dialog.export_chat(self, path, fmt)

    def focus_search(self) -> None:
        self.sidebar.focus_search()

    # ---- documents

    def open_documents_page(self):
        """The documents page: every collection, its files, add folder / watch / remove / re-index."""
        from app.ui.documents_page import open_documents_page

        return open_documents_page(self, self.controller.documents(), self.controller.titles())

    def open_documents(self):
        """The documents attached to this conversation (a new chat is saved first)."""
        if self.controller.ensure_saved():
            self.refresh_list()
        return open_documents_panel(self, self.controller.documents(), self.controller.collection(),
                                    title=self.chat.title, conversation_id=self.chat.id)

    def show_citation(self, message_id: int, n: int):
        citation = self.controller.citation(message_id, n)
        return show_citation(self, self.controller.documents(), citation) if citation is not None else None

    # ---- settings

    def open_settings(self) -> SettingsDialog:
        d = SettingsDialog(self.settings, self.memory, self)
        if self.model_key() in self.settings.model_settings:
            d.note_model_settings(self.models.model_name())
        d.accepted.connect(lambda: self.apply_settings(d.result_settings()))
        d.open()
        return d

    def apply_settings(self, new: Settings) -> None:
        key = self.model_key()
        old, self.settings = settings_mod.for_model(self.settings, key), new
        self._save_settings()
        self.tools.settings_changed(new)
        self.images.settings_changed()   # the pending images' cost under the patch budget
        self.refresh_models()
        self.show_setup()
        self.models.settings_changed(old, settings_mod.for_model(new, key))

    def _save_settings(self) -> None:
        if self.persist_settings:
            settings_mod.save(self.settings, cipher=self.store.cipher)

    # ------------------------------------------------------------ the worker's events

    def _begin(self, start: TurnStart) -> None:
        self.last_stats = None
        self.statusBar().clearMessage()
        self._show_current()
        self._set_busy(True)
        request, search = self.controller.turn_request(start)
        self.composer_bar.start_reading("Searching the documents…" if search else "Reading the conversation…")
        self.composer.setFocus()     # not the search box (after Save & resend the edited message is gone)
        self.controller.started(self.worker.generate(request, search=search))
        self.refresh_list()

    def _on_text(self, channel: str, text: str) -> None:
        if self.controller.on_text(channel, text) and self.controller.on_screen \
                and not self._repaint_timer.isActive():
            self._repaint_timer.start()

    def _on_prompt_progress(self, done: int, total: int) -> None:
        if self.controller.on_screen:
            self.composer_bar.show_progress(done, total, self.controller.reading_line(done, total))

    def _on_stats(self, sample: StatsSample) -> None:
        self.stats_view.push_sample(sample)
        if sample.final:
            self.last_stats = sample
        self.gauges.show_values(self.stats_view)

    def _on_finished(self, reason: str, text: str, thinking: str) -> None:
        if self.tools.finished(reason):   # its tool calls run, and the answer goes on after them
            return
        here = self.controller.on_screen
        elsewhere = self.controller.writing.title if self.busy and not here else ""
        message = self.controller.finish(reason, text, thinking)
        if message is None:
            return
        self.prompt_row.setVisible(False)
        self._set_busy(False)
        if here:
            self._show_current()
        self.refresh_list()
        line = self.controller.status_line(reason, message)
        if elsewhere:    # the chat on screen stays as the user left it (scrolled, selected)
            line = f"The answer in “{elsewhere}” is done" + (f" · {line}" if line else "")
        if line:
            self.statusBar().showMessage(line)
        self.answer_finished.emit(reason)

    def _on_error(self, message: str) -> None:
        self.controller.on_error(message)
        self.statusBar().showMessage(f"Error: {message}")

    # ------------------------------------------------------------ rendering

    def _set_busy(self, busy: bool) -> None:
        ready = self.model_info is not None
        self.composer_bar.set_state(ready, busy)
        self.models.model_settings_action.setEnabled(bool(self.model_key()))
        self.chat_view.set_busy(busy)
        self.top.set_ready(ready)
        self.gauge_scroll.setVisible(ready and self.top.gauges_btn.isChecked())

    def _show_current(self) -> None:
        self.title_label.set_full_text(self.chat.title)
        self.controller.load_citations()
        name = self.model_info.name if self.model_info else None
        self.chat_page.show_chat(self.chat, name)
        self.show_setup()
        self.prompt_row.setVisible(self.controller.on_screen and self.prompt_row.isVisible())

    def show_setup(self) -> None:
        """The marker above the message box: the preset and system prompt in effect, if any."""
        preset = settings_mod.active_preset(self.settings, self.model_key()) if self.model_key() else None
        self.composer_bar.show_setup(*setup_note(self.effective(), preset))

    def refresh_list(self) -> None:
        q = self.search.text()
        self.sidebar.show_conversations(self.store.search(q) if q.strip() else self.store.conversations(),
                                        self.chat.id, self.controller.writing.id if self.busy else None)

    # ------------------------------------------------------------ shutdown

    def shutdown(self) -> None:
        if self.busy:
            self.worker.stop(self.controller.turn.gen_id)
            self.controller.finish("cancelled")
        self.models.shutdown()
        self.tools.close()
        self.controller.close()
        self.worker.close()

    def closeEvent(self, event) -> None:
        self.shutdown()
        super().closeEvent(event)
