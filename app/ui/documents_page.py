"""The window's documents page: every collection with its file count, size
and when it was last indexed; the selected collection's files, each indexed
or skipped with why; add a folder (watched or not), watch or stop watching,
remove a file or a collection, re-index (new, changed and deleted files).

Rows come from :mod:`app.documents.library` (no Qt there); adding and
re-indexing run on a QThread of their own (``_AddWorker``), with files, MB,
passages and time left shown while they run, and can be cancelled.
"""
from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (QAbstractItemView, QCheckBox, QDialog, QDialogButtonBox, QFileDialog, QHBoxLayout,
                               QHeaderView, QInputDialog, QLabel, QMessageBox, QPushButton, QSplitter,
                               QTableWidget, QTableWidgetItem, QVBoxLayout, QWidget)

from app.documents.library import collection_rows, file_rows
from app.documents.store import DocumentError, DocumentStore
from app.ui.add_runner import AddRunner
from app.ui.documents_panel import progress_widgets


def _table(headers: list[str], name: str) -> QTableWidget:
    t = QTableWidget(0, len(headers))
    t.setHorizontalHeaderLabels(headers)
    t.setAccessibleName(name)
    t.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
    t.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
    t.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
    t.verticalHeader().hide()
    t.horizontalHeader().setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
    return t


class DocumentsPage(QDialog):
    indexing_finished = Signal(object)    #: the AddReport as a dict

    def __init__(self, store: DocumentStore, parent: QWidget | None = None, titles: dict[int, str] | None = None):
        super().__init__(parent)
        self.store = store
        self.titles = titles or {}     #: the chats' titles by id (a chat's attached files show under its title)
        self.setWindowTitle("Documents")
        self.setAccessibleName("Documents")
        self.resize(820, 560)
        lay = QVBoxLayout(self)
        lay.addWidget(QLabel("Collections are read and indexed on this computer and kept in Ferry's "
                             "encrypted database; nothing leaves it."))
        split = QSplitter(Qt.Orientation.Vertical)
        self.collections = _table(["Collection", "Files", "Skipped", "Passages", "Size", "Last indexed",
                                   "Watched"], "Collections")
        self.collections.itemSelectionChanged.connect(self._show_files)
        self.files = _table(["File", "Status", "Details"], "Files of the collection")
        self.files.horizontalHeader().setSectionResizeMode(0, QHeaderView.ResizeMode.ResizeToContents)
        self.files.horizontalHeader().setSectionResizeMode(2, QHeaderView.ResizeMode.Stretch)
        split.addWidget(self.collections)
        split.addWidget(self.files)
        lay.addWidget(split, 1)
        row = QHBoxLayout()
        self.add_btn = QPushButton("Add folder…")
        self.add_btn.clicked.connect(self._pick_folder)
        self.watch_box = QCheckBox("Watch for changes")
        self.watch_box.setToolTip("New, changed and deleted files are picked up when Ferry opens and while it runs")
        self.watch_box.toggled.connect(self._watch_toggled)
        self.reindex_btn = QPushButton("Re-index")
        self.reindex_btn.clicked.connect(self.reindex)
        self.remove_file_btn = QPushButton("Remove file")
        self.remove_file_btn.clicked.connect(self._remove_file)
        self.remove_btn = QPushButton("Remove collection")
        self.remove_btn.clicked.connect(self._remove_collection)
        self.cancel_btn = QPushButton("Cancel")
        self.cancel_btn.clicked.connect(self.cancel)
        self.cancel_btn.hide()
        for w in (self.add_btn, self.watch_box, self.reindex_btn, self.remove_file_btn, self.remove_btn):
            row.addWidget(w)
        row.addStretch(1)
        row.addWidget(self.cancel_btn)
        lay.addLayout(row)
        self.progress, self.status = progress_widgets(lay)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        buttons.rejected.connect(self.close)
        lay.addWidget(buttons)
        self._runner = AddRunner(self)
        self._runner.progress.connect(self._on_progress)
        self._runner.summary.connect(self.status.setText)
        self._runner.finished.connect(self._on_finished)
        self._rows = []
        self.refresh()

    # ---- state

    def selected(self) -> str | None:
        r = self.collections.currentRow()
        return self._rows[r].name if 0 <= r < len(self._rows) else None

    def refresh(self, select: str | None = None) -> None:
        select = select or self.selected()
        self._rows = collection_rows(self.store, self.titles)
        self.collections.setRowCount(len(self._rows))
        for i, c in enumerate(self._rows):
            for j, v in enumerate([c.label, str(c.files), str(c.skipped), f"{c.passages:,}", c.size, c.last_indexed,
                                   "yes" if c.watched else ""]):
                item = QTableWidgetItem(v)
                if j:
                    item.setTextAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
                self.collections.setItem(i, j, item)
        names = [c.name for c in self._rows]
        if names:
            self.collections.selectRow(names.index(select) if select in names else 0)
        else:
            self.status.setText("No collections yet: add a folder.")
        self._show_files()

    def _show_files(self) -> None:
        name = self.selected()
        rows = file_rows(self.store, name) if name else []
        self.files.setRowCount(len(rows))
        for i, f in enumerate(rows):
            for j, v in enumerate([f.name, f.status, f.detail]):
                item = QTableWidgetItem(v)
                item.setToolTip(f.path)
                self.files.setItem(i, j, item)
        row = next((c for c in self._rows if c.name == name), None)
        self.watch_box.blockSignals(True)
        self.watch_box.setChecked(bool(row and row.watched))
        self.watch_box.setEnabled(bool(row and row.sources))
        self.watch_box.blockSignals(False)
        for b in (self.reindex_btn, self.remove_btn, self.remove_file_btn):
            b.setEnabled(name is not None and not self._runner.busy)

    # ---- actions

    def _pick_folder(self) -> None:
        folder = QFileDialog.getExistingDirectory(self, "Add a folder", str(Path.home()))
        if not folder:
            return
        name, ok = QInputDialog.getText(self, "Collection", "Add to the collection:", text=Path(folder).name)
        if ok and name.strip():
            self.add_folder(name.strip(), folder, watch=self.watch_box.isChecked())

    def add_folder(self, collection: str, folder: str, *, watch: bool = False) -> None:
        self._start(collection, [folder], watch)

    def reindex(self) -> None:
        name = self.selected()
        if name:
            self._start(name, None, None)

    def set_watch(self, watch: bool) -> None:
        name = self.selected()
        if name is None:
            return
        for src in self.store.sources(name):
            self.store.set_watch(name, src.path, watch)
        self.refresh(name)

    def _watch_toggled(self, on: bool) -> None:
        self.set_watch(on)

    def remove_file(self, path: str) -> None:
        name = self.selected()
        if name and self.store.remove_file(name, path):
            self.status.setText(f"Removed {Path(path).name} and its passages.")
        self.refresh(name)

    def _remove_file(self) -> None:
        r = self.files.currentRow()
        item = self.files.item(r, 0) if r >= 0 else None
        if item is not None:
            self.remove_file(item.toolTip())

    def remove_collection(self, name: str) -> None:
        try:
            self.store.delete_collection(name)
        except DocumentError as exc:
            self.status.setText(str(exc))
        self.refresh()

    def _remove_collection(self) -> None:
        name = self.selected()
        if name and QMessageBox.question(self, "Remove collection",
                                         f"Remove '{name}' and its index? The files themselves stay.") \
                == QMessageBox.StandardButton.Yes:
            self.remove_collection(name)

    # ---- background work

    @property
    def busy(self) -> bool:
        return self._runner.busy

    def _start(self, collection: str, paths: list[str] | None, watch: bool | None) -> None:
        if self._runner.busy:
            return
        self.progress.setRange(0, 0)
        self.progress.show()
        self.cancel_btn.show()
        self.status.setText("Reading…")
        self.add_btn.setEnabled(False)
        self._pending_select = collection
        self._runner.start(self.store, collection, paths, watch)
        self._show_files()

    def cancel(self) -> None:
        self._runner.cancel()

    def _on_progress(self, done: int, total: int, name: str, stage: str, message: str) -> None:
        if total:
            self.progress.setRange(0, total)
            self.progress.setValue(done)

    def _on_finished(self, report: dict) -> None:
        self.progress.hide()
        self.cancel_btn.hide()
        self.add_btn.setEnabled(True)
        failed = report.get("failed", [])
        done = "Cancelled: " if report.get("cancelled") else ""
        self.status.setText(f"{done}{len(report['added'])} added ({report['chunks']:,} passages), "
                            f"{len(report['unchanged'])} unchanged, {len(report.get('removed', []))} removed, "
                            f"{len(failed)} skipped.")
        self.refresh(self._pending_select)
        self.indexing_finished.emit(report)

    def closeEvent(self, event) -> None:
        self._runner.stop()
        super().closeEvent(event)


def open_documents_page(parent: QWidget | None, store: DocumentStore,
                        titles: dict[int, str] | None = None) -> DocumentsPage:
    page = DocumentsPage(store, parent, titles)
    page.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
    page.show()
    return page
