"""The window's models: which one is open (or opening), loading it on the
engine worker, the switcher's list, the Model menu and what it opens (the
model library, this model's settings, the conversion wizard — also for a GGUF
file or checkpoint folder dropped on the window), the model to open at
start-up, and the status bar's model label. The window shows an opened model
(``MainWindow.show_model``)."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from PySide6.QtCore import QEvent, QObject, QTimer
from PySide6.QtGui import QAction, QKeySequence
from PySide6.QtWidgets import QLabel, QMessageBox, QProgressBar

from app.api import ModelLoaded
from app.library import Library, display_name, find_containers, folder_size, is_container, is_source, roots
from app.store import settings as settings_mod
from app.ui.library_dialog import LibraryDialog
from app.ui.model_picker import fill_model_menu
from app.ui.model_settings_dialog import ModelSettingsDialog
from app.ui.worker import load_options


def dropped_path(event) -> Path | None:
    """The one container, GGUF file or checkpoint folder a drag carries, else None."""
    urls = event.mimeData().urls() if event.mimeData().hasUrls() else []
    local = [Path(u.toLocalFile()) for u in urls if u.isLocalFile()]
    return local[0] if len(local) == 1 and (is_container(local[0]) or is_source(local[0])) else None


class ModelHost(QObject):
    def __init__(self, window):
        super().__init__(window)
        self.w = window
        self.info: ModelLoaded | None = None   #: the open model
        self.loading: str | None = None        #: the model being opened, while it loads
        self.library = Library(window.settings.model_folders)
        self.wizard = None
        self.label = QLabel("No model", objectName="mutedLabel", accessibleName="Model")
        self.load_bar = QProgressBar(accessibleName="Opening the model", maximumWidth=140, maximumHeight=12)
        self.load_bar.setRange(0, 0)
        self.load_bar.setVisible(False)
        window.statusBar().addPermanentWidget(self.load_bar)
        window.statusBar().addPermanentWidget(self.label)
        window.worker.worker.loaded.connect(self._on_loaded)
        window.worker.worker.load_failed.connect(self._on_load_failed)
        window.worker.worker.serving.connect(self._on_serving)
        self.clients_timer = QTimer(self, interval=1000)   # other clients' requests, for the gauges
        self.clients_timer.timeout.connect(self._show_clients)
        window.setAcceptDrops(True)
        window.installEventFilter(self)    # a model dropped on the window
        self.menu = window.menuBar().addMenu("&Model")
        self.menu.aboutToShow.connect(self.fill)
        self.library_action = self._action("Model library…", "Ctrl+Shift+L", lambda: self.open_library())
        self.model_settings_action = self._action("Settings for this model…", None,
                                                  lambda: self.open_model_settings())
        self.convert_action = self._action("Convert a model…", "Ctrl+Shift+N", lambda: self.open_wizard())
        self.fill()

    def _action(self, text: str, keys: str | None, slot) -> QAction:
        a = QAction(text, self.w)
        if keys:
            a.setShortcut(QKeySequence(keys))
            self.w.addAction(a)   # the shortcut works before the menu was ever opened
        a.triggered.connect(slot)
        return a

    # ---- the open model

    def key(self) -> str:
        """What per-model settings are kept under: the open (or opening) container's path."""
        if self.info is not None:
            return self.info.path
        return self.loading or self.w.settings.model_path

    def load(self, path: str | Path) -> None:
        """Open a model in the background (the window stays usable; a bar shows it is loading)."""
        self.info, self.loading = None, str(path)
        self.label.setText(f"Opening {display_name(Path(path).name)}…")
        self.w.statusBar().showMessage(f"Opening {path}…")
        self.load_bar.setVisible(True)
        self.w._set_busy(self.w.busy)
        self.w.worker.load(str(path), load_options(settings_mod.for_model(self.w.settings, str(path))))

    def switch(self, path: str | Path) -> None:
        """Answer with another model: a running answer is stopped first (it is kept, marked
        stopped), then the new engine loads in the background."""
        if self.info is not None and Path(self.info.path).resolve() == Path(path).resolve():
            return
        if self.w.busy:
            self.w.stop()   # the worker ends that answer before it loads the next model
        self.load(path)

    def refresh(self) -> None:
        """The model switcher: every converted model, the open one selected."""
        self.library.model_folders = list(self.w.settings.model_folders)
        self.w.model_combo.show_models(self.library.entries(), self.key(), self.info)

    def _on_loaded(self, info: ModelLoaded) -> None:
        # one name for one model: the library's (the switcher's, the menu's), else the model's own
        entry = None if info.remote else next(
            (e for e in self.library.entries() if e.key == str(Path(info.path).resolve())), None)
        info = replace(info, name=entry.name if entry is not None else display_name(info.name))
        self.info, self.loading = info, None
        self.load_bar.setVisible(False)
        if not info.remote:
            try:
                self.library.mark_used(info.path)
            except OSError:
                pass
        where = f"{info.n_ctx} tokens of context" if info.n_ctx else (info.url or "remote server")
        fast = ("" if info.remote else
                " · 8-bit activations" if info.info.activations == "q8" else " · exact activations")
        self.label.setText(f"{info.name} · {where}{fast}")
        settings = self.w.settings
        if not info.remote:      # a small model's measured defaults, the first time it opens
            settings = settings_mod.first_open(settings, info.path, folder_size(Path(info.path)))
        if settings.model_path != info.path or settings is not self.w.settings:
            self.w.settings = settings
            settings.model_path = info.path
            self.w._save_settings()
        self.refresh()
        self.w.show_model(info)
        if info.note:
            self.w.statusBar().showMessage(info.note[0].upper() + info.note[1:], 10000)
        if info.remote:
            self.clients_timer.stop()
        else:
            self.clients_timer.start()
        self._show_clients()

    def _show_clients(self) -> None:
        self.w.gauges.show_clients(self.w.worker.worker.clients())

    def _on_load_failed(self, message: str) -> None:
        self.loading = None
        self.load_bar.setVisible(False)
        self.refresh()
        self.label.setText("No model")
        self.w.stack.setCurrentWidget(self.w.welcome)    # until the model kept open says it is (``loaded``)
        self.w.statusBar().showMessage(f"Could not open the model: {message}")
        QMessageBox.warning(self.w, "Could not open the model", message)

    def settings_changed(self, old, new) -> None:
        """The settings in effect changed from ``old`` to ``new``: the engine reopens when they
        change how it runs; serving starts or stops."""
        if settings_mod.engine_changed(old, new):
            if new.engine == "remote" and not self.info:
                self.load(new.model_path or "remote")
            elif self.info and not self.w.busy:
                self.load(self.info.path)
        elif (old.serve_local, old.serve_port) != (new.serve_local, new.serve_port):
            self.w.worker.set_serving(new.serve_port if new.serve_local else 0)

    def _on_serving(self, url: str, error: str) -> None:
        if error:
            self.w.statusBar().showMessage(f"Could not serve the model: {error}")
        elif url:
            self.w.statusBar().showMessage(f"Serving the model at {url} (OpenAI and Anthropic APIs; the key is in "
                                           f"Settings)", 6000)

    def eventFilter(self, obj, event) -> bool:
        """A container dropped on the window opens; a GGUF file or a checkpoint folder starts the wizard."""
        kind = event.type()
        if obj is not self.w or kind not in (QEvent.Type.DragEnter, QEvent.Type.DragMove, QEvent.Type.Drop):
            return False
        path = dropped_path(event)
        if path is None:
            event.ignore()
            return True
        event.acceptProposedAction()
        if kind == QEvent.Type.Drop:
            self.switch(path) if is_container(path) else self.open_wizard(path)
        return True

    # ---- the Model menu

    def fill(self) -> None:
        key = self.key()
        self.model_settings_action.setEnabled(bool(key))
        fill_model_menu(self.menu, [self.library_action, self.model_settings_action], self.library.entries(),
                        key, [self.convert_action], self.switch)

    def model_name(self) -> str:
        return self.info.name if self.info else display_name(Path(self.key()).name)

    def open_library(self) -> LibraryDialog:
        d = LibraryDialog(self.library, self.key() or None, self.w)
        d.open_requested.connect(self.switch)
        d.convert_requested.connect(lambda: self.open_wizard())
        d.removed.connect(lambda _p: self.refresh())
        d.finished.connect(lambda _r: self.refresh())
        d.open()
        return d

    def open_model_settings(self) -> ModelSettingsDialog | None:
        key = self.key()
        if not key:
            return None
        d = ModelSettingsDialog(self.w.settings, key, self.model_name(), self.w)
        d.show_expert_options(self.info is None or self.info.has_experts)   # none to route on a dense model
        d.accepted.connect(lambda: self.w.apply_settings(d.result_settings()))
        d.open()
        return d

    def open_default_model(self) -> bool:
        """Open the last model or the first one found; False shows the welcome page
        and, on a first run, the conversion wizard. An unfinished conversion
        opens the wizard too, which offers to resume it."""
        from app.ui.wizard import pending

        settings = self.w.settings
        if settings.engine == "remote":
            self.load(settings.model_path or "remote")
            return True
        unfinished = pending.load() is not None
        last = Path(settings.model_path) if settings.model_path else None
        models = [last] if last and is_container(last) else find_containers(settings.model_folders)
        if models:
            self.load(models[0])
            if unfinished:
                QTimer.singleShot(0, self.open_wizard)
            return True
        self.w.stack.setCurrentWidget(self.w.welcome)
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
            wiz = self.wizard = ConvertWizard(self.w)
            wiz.model_ready.connect(self._wizard_model_ready)
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
        folder = Path(path).resolve().parent
        known = {r.resolve() for r in roots(self.w.settings.model_folders)}
        if folder not in known:    # converted elsewhere: its folder joins the library, so the switcher lists it
            self.w.settings.model_folders = [*self.w.settings.model_folders, str(folder)]
        if budget != self.w.settings.ram_budget or folder not in known:
            self.w.settings.ram_budget = budget
            self.w._save_settings()
        self.load(path)

    def shutdown(self) -> None:
        if self.wizard is not None:
            from shiboken6 import isValid
            if isValid(self.wizard):
                self.wizard.shutdown()
