"""Documents in the app: attach files or folders to a conversation (or a named
collection), watch them being read in the background, set the passage
budget, and open a citation with its passage highlighted in its page.

The main window needs only these calls (see docs/DOCUMENTS.md):

* ``open_documents_panel(parent, store, collection)`` — the "Attach…" dialog;
* ``show_citation(parent, store, citation)`` (citation_dialog.py) when a ``cite:n``
  link is clicked.

Putting passages into a turn and linking an answer's markers is Qt-free:
``app/controller/passages.py``.

Indexing runs on its own QThread with its own connection to the store; the
GUI thread never waits for it.
"""
from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (QDialog, QDialogButtonBox, QFileDialog, QHBoxLayout, QInputDialog, QLabel,
                               QListWidget, QListWidgetItem, QProgressBar, QPushButton, QSpinBox, QVBoxLayout,
                               QWidget)

from app.documents.library import count
from app.documents.store import CONVERSATION_PREFIX, DocumentError, DocumentStore
from app.documents.extract import SUFFIXES
from app.ui.add_runner import AddRunner

FILE_FILTER = "Documents (" + " ".join(f"*{s}" for s in sorted(SUFFIXES)) + ")"


def progress_widgets(lay: QVBoxLayout) -> tuple[QProgressBar, QLabel]:
    bar = QProgressBar()
    bar.setAccessibleName("Indexing progress")
    bar.hide()
    status = QLabel("")
    status.setWordWrap(True)
    lay.addWidget(bar)
    lay.addWidget(status)
    return bar, status


class DocumentsPanel(QDialog):
    """The files of one collection, "Add files…"/"Add folder…", progress,
    the files that could not be read (by name), and the passage budget."""

    indexing_finished = Signal(object)   #: the AddReport as a dict

    def __init__(self, store: DocumentStore, collection: str, parent: QWidget | None = None,
                 title: str | None = None, conversation_id: int | None = None):
        super().__init__(parent)
        self.store, self.collection, self.conversation_id = store, collection, conversation_id
        self.setWindowTitle(f"Documents — {title or collection}")
        self.setAccessibleName("Documents")
        self.resize(560, 460)
        lay = QVBoxLayout(self)
        lay.addWidget(QLabel("Files are read and indexed on this computer; nothing leaves it. "
                             "The index is encrypted with your history's key."))
        self.files_list = QListWidget()
        self.files_list.setAccessibleName("Attached files")
        lay.addWidget(self.files_list, 1)
        row = QHBoxLayout()
        self.add_files_btn = QPushButton("Add files…")
        self.add_files_btn.clicked.connect(self._pick_files)
        self.add_folder_btn = QPushButton("Add folder…")
        self.add_folder_btn.clicked.connect(self._pick_folder)
        row.addWidget(self.add_files_btn)
        row.addWidget(self.add_folder_btn)
        row.addStretch(1)
        row.addWidget(QLabel("Passages in each prompt, up to"))
        self.budget = QSpinBox()
        self.budget.setRange(64, 32768)
        self.budget.setSingleStep(128)
        self.budget.setSuffix(" tokens")
        self.budget.setAccessibleName("Passage token budget")
        self.budget.valueChanged.connect(self._budget_changed)
        row.addWidget(self.budget)
        lay.addLayout(row)
        self.share_btn = QPushButton("Share as a collection…")
        self.share_btn.setAccessibleName("Make these files a collection other chats can use")
        self.share_btn.setToolTip("These files become a named collection: attached to this chat, attachable to "
                                  "others, kept when this chat is deleted")
        self.share_btn.clicked.connect(lambda: self.share())
        row.insertWidget(2, self.share_btn)
        self.shared_label = QLabel("Also search these collections (shared with other chats):")
        lay.addWidget(self.shared_label)
        self.shared_list = QListWidget()
        self.shared_list.setAccessibleName("Collections this chat searches")
        self.shared_list.setMaximumHeight(110)
        self.shared_list.itemChanged.connect(self._shared_toggled)
        lay.addWidget(self.shared_list)
        self.progress, self.status = progress_widgets(lay)
        self.errors = QListWidget()
        self.errors.setAccessibleName("Files that could not be read")
        self.errors.hide()
        lay.addWidget(self.errors)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        buttons.rejected.connect(self.close)
        lay.addWidget(buttons)
        self._runner = AddRunner(self)
        self._runner.progress.connect(self._on_progress)
        self._runner.finished.connect(self._on_finished)
        self.refresh()

    # ---- state

    def refresh(self) -> None:
        self.files_list.clear()
        self._show_shared()
        try:
            coll = self.store.collection(self.collection)
        except DocumentError:
            self.budget.blockSignals(True)
            self.budget.setValue(1024)
            self.budget.blockSignals(False)
            self.status.setText("No files yet: add files or a folder.")
            return
        self.budget.blockSignals(True)
        self.budget.setValue(coll.budget)
        self.budget.blockSignals(False)
        for f in self.store.files(self.collection):
            if f.status != "indexed":
                continue            # listed under "could not be read" while adding, and on the documents page
            pages = f"{count(f.pages, 'page')}, " if f.kind == "pdf" else ""
            self.files_list.addItem(f"{f.name}  —  {f.kind}, {pages}{count(f.chunks, 'passage')}")

    def _show_shared(self) -> None:
        """The named collections, checked where this chat searches them (no chat: hidden)."""
        shown = self.conversation_id is not None
        self.shared_label.setVisible(shown)
        self.shared_list.setVisible(shown)
        self.share_btn.setVisible(shown)
        if not shown:
            return
        self.share_btn.setEnabled(self._own_files())
        attached = set(self.store.attached(self.conversation_id))
        names = sorted(c.name for c in self.store.collections() if not c.name.startswith(CONVERSATION_PREFIX))
        self.shared_list.blockSignals(True)
        self.shared_list.clear()
        for name in names:
            chats = len(self.store.attached_to(name))
            item = QListWidgetItem(f"{name}  —  {count(chats, 'chat')}" if chats else name)
            item.setData(Qt.ItemDataRole.UserRole, name)
            item.setFlags(item.flags() | Qt.ItemFlag.ItemIsUserCheckable)
            item.setCheckState(Qt.CheckState.Checked if name in attached else Qt.CheckState.Unchecked)
            self.shared_list.addItem(item)
        if not names:
            empty = QListWidgetItem("No collections yet: add one on the Documents page, or share these files.")
            empty.setFlags(Qt.ItemFlag.NoItemFlags)
            self.shared_list.addItem(empty)
        self.shared_list.blockSignals(False)

    def _own_files(self) -> bool:
        try:
            return bool(self.store.files(self.collection))
        except DocumentError:
            return False

    def _shared_toggled(self, item: QListWidgetItem) -> None:
        name = item.data(Qt.ItemDataRole.UserRole)
        if name is None:
            return
        if item.checkState() == Qt.CheckState.Checked:
            self.store.attach(self.conversation_id, name)
        else:
            self.store.detach(self.conversation_id, name)
        self.refresh()

    def share(self, name: str | None = None) -> bool:
        """"Share as a collection…": this chat's own files become the collection ``name`` (asked when
        None), still searched here and attachable to other chats."""
        if not self._own_files():
            self.status.setText("This chat has no files of its own to share: add files or a folder first.")
            return False
        if name is None:
            name, ok = QInputDialog.getText(self, "Share as a collection", "Collection name:")
            if not ok:
                return False
        try:
            self.store.rename_collection(self.collection, name)
            self.store.attach(self.conversation_id, name.strip())
        except DocumentError as exc:
            self.status.setText(str(exc))
            return False
        self.status.setText(f"These files are now the collection “{name.strip()}”.")
        self.refresh()
        return True

    def _budget_changed(self, value: int) -> None:
        try:
            self.store.set_budget(self.collection, value)
        except DocumentError:
            pass  # no collection yet: it gets the default

    # ---- adding

    def _pick_files(self) -> None:
        names, _ = QFileDialog.getOpenFileNames(self, "Attach files", str(Path.home()), FILE_FILTER)
        if names:
            self.add_paths(names)

    def _pick_folder(self) -> None:
        folder = QFileDialog.getExistingDirectory(self, "Attach a folder", str(Path.home()))
        if folder:
            self.add_paths([folder])

    def add_paths(self, paths: list[str]) -> None:
        """Read and index files/folders in the background."""
        if self._runner.busy:
            return
        self.errors.clear()
        self.errors.hide()
        self.progress.setRange(0, 0)
        self.progress.show()
        self.status.setText("Reading…")
        self.add_files_btn.setEnabled(False)
        self.add_folder_btn.setEnabled(False)
        self._runner.start(self.store, self.collection, [str(p) for p in paths])

    @property
    def busy(self) -> bool:
        return self._runner.busy

    def _on_progress(self, done: int, total: int, name: str, stage: str, message: str) -> None:
        if total:
            self.progress.setRange(0, total)
            self.progress.setValue(done)
        if stage == "failed":
            self.errors.show()
            self.errors.addItem(f"{name}: {message}")
        elif stage == "reading":
            self.status.setText(f"Reading {name} ({done + 1} of {total})…")

    def _on_finished(self, report: dict) -> None:
        self.progress.hide()
        self.add_files_btn.setEnabled(True)
        self.add_folder_btn.setEnabled(True)
        failed = report.get("failed", [])
        for f in failed:
            if not f.get("name"):
                self.errors.show()
                self.errors.addItem(f["error"])
        self.status.setText(f"{len(report['added'])} added ({count(report['chunks'], 'passage')}), "
                            f"{len(report['unchanged'])} unchanged, {len(failed)} could not be read.")
        self.refresh()
        self.indexing_finished.emit(report)

    def closeEvent(self, event) -> None:
        self._runner.stop()
        super().closeEvent(event)


# ---------------------------------------------------------------- the main window's calls

def open_documents_panel(parent: QWidget | None, store: DocumentStore, collection: str,
                         title: str | None = None, conversation_id: int | None = None) -> DocumentsPanel:
    """``title``: what the dialog is called after (the chat's name), instead of the collection's id;
    ``conversation_id``: the chat, whose shared collections are listed to attach or detach."""
    panel = DocumentsPanel(store, collection, parent, title, conversation_id)
    panel.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
    panel.show()
    return panel
