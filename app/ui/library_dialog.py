"""The model library dialog (Model → Model library…): every converted model
with its size, RAM floor and last use; Open, Rename…, Remove… (with the disk
space it frees) and Convert a model…. It renders ``app.library`` and asks the
window to open or convert; it never loads a model itself."""
from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (QAbstractItemView, QDialog, QHBoxLayout, QHeaderView, QInputDialog, QLabel,
                               QMessageBox, QPushButton, QTableWidget, QTableWidgetItem, QVBoxLayout)

from app.library import Library, LibraryError, ModelEntry, ago
from app.units import size

COLUMNS = ("Name", "Size", "RAM floor", "Last used")


class LibraryDialog(QDialog):
    open_requested = Signal(str)      #: a container path
    convert_requested = Signal()
    removed = Signal(str)             #: the path of a removed model

    def __init__(self, library: Library, current: str | None = None, parent=None):
        super().__init__(parent)
        self.library = library
        self.current = current
        self.setWindowTitle("Model library")
        self.setAccessibleName("Model library")
        self.resize(640, 380)
        lay = QVBoxLayout(self)
        self.note = QLabel("")
        self.note.setObjectName("mutedLabel")
        self.note.setWordWrap(True)
        lay.addWidget(self.note)
        self.table = QTableWidget(0, len(COLUMNS))
        self.table.setAccessibleName("Converted models")
        self.table.setHorizontalHeaderLabels(COLUMNS)
        self.table.verticalHeader().setVisible(False)
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.table.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.horizontalHeader().setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
        for c in range(1, len(COLUMNS)):
            self.table.horizontalHeader().setSectionResizeMode(c, QHeaderView.ResizeMode.ResizeToContents)
        self.table.itemDoubleClicked.connect(lambda _i: self.open_selected())
        self.table.itemSelectionChanged.connect(self._selection_changed)
        lay.addWidget(self.table, 1)
        row = QHBoxLayout()
        self.open_btn = self._button("Open", "Open the selected model", self.open_selected)
        self.rename_btn = self._button("Rename…", "Rename the selected model", self.rename_selected)
        self.remove_btn = self._button("Remove…", "Remove the selected model from disk", self.remove_selected)
        self.convert_btn = self._button("Convert a model…", "Convert a GGUF file or a checkpoint folder",
                                        self._convert)
        for b in (self.open_btn, self.rename_btn, self.remove_btn):
            row.addWidget(b)
        row.addStretch(1)
        row.addWidget(self.convert_btn)
        close = self._button("Close", "Close", self.reject)
        row.addWidget(close)
        lay.addLayout(row)
        self.entries: list[ModelEntry] = []
        self.refresh()

    def _button(self, text: str, name: str, slot) -> QPushButton:
        b = QPushButton(text)
        b.setAccessibleName(name)
        b.clicked.connect(slot)
        return b

    def refresh(self) -> None:
        self.entries = self.library.entries()
        self.table.setRowCount(len(self.entries))
        for r, e in enumerate(self.entries):
            name = e.name + ("  (open)" if self.current and e.key == _key(self.current) else "")
            # disk space in decimal units as disks are sold; RAM as the gauges show it
            cells = (name, size(e.size), size(e.ram_floor) if e.ram_floor else "unknown", ago(e.last_used))
            for c, text in enumerate(cells):
                item = QTableWidgetItem(text)
                if c == 0:
                    item.setToolTip(str(e.path))
                if c:
                    item.setTextAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
                self.table.setItem(r, c, item)
        total = sum(e.size for e in self.entries)
        self.note.setText(f"{len(self.entries)} converted model{'' if len(self.entries) == 1 else 's'}, "
                          f"{size(total)} on disk. The RAM floor is the least memory each runs in "
                          "(at a 4096-token context)." if self.entries else
                          "No converted model yet: convert one from a GGUF file or a checkpoint folder.")
        if self.entries:
            self.table.selectRow(0)
        self._selection_changed()

    def selected(self) -> ModelEntry | None:
        rows = self.table.selectionModel().selectedRows()
        return self.entries[rows[0].row()] if rows else None

    def select(self, name: str) -> None:
        for r, e in enumerate(self.entries):
            if e.name == name:
                self.table.selectRow(r)
                return

    def _selection_changed(self) -> None:
        on = self.selected() is not None
        for b in (self.open_btn, self.rename_btn, self.remove_btn):
            b.setEnabled(on)

    def open_selected(self) -> None:
        e = self.selected()
        if e is not None:
            self.open_requested.emit(str(e.path))
            self.accept()

    def rename_selected(self, new_name: str | None = None) -> None:
        e = self.selected()
        if e is None:
            return
        if self.current and e.key == _key(self.current):
            QMessageBox.information(self, "Rename", f"{e.name} is open: switch to another model to rename it.")
            return
        if new_name is None:
            new_name, ok = QInputDialog.getText(self, f"Rename {e.name}", "New name:", text=e.name)
            if not ok:
                return
        try:
            renamed = self.library.rename(e, new_name)
        except (LibraryError, OSError) as exc:
            QMessageBox.warning(self, "Could not rename the model", str(exc))
            return
        self.refresh()
        self.select(renamed.name)

    def remove_selected(self, confirm: bool = True) -> int:
        """Remove the selected model after asking; returns the bytes freed (0 if not removed)."""
        e = self.selected()
        if e is None:
            return 0
        if self.current and e.key == _key(self.current):
            QMessageBox.information(self, "Remove", f"{e.name} is open: switch to another model to remove it.")
            return 0
        if confirm:
            answer = QMessageBox.question(
                self, f"Remove {e.name}?",
                f"Remove {e.name} from this computer? This frees {size(e.size)} of disk space.\n\n{e.path}\n\n"
                "Your conversations are kept; converting the model again brings it back.",
                QMessageBox.StandardButton.Yes | QMessageBox.StandardButton.Cancel,
                QMessageBox.StandardButton.Cancel)
            if answer != QMessageBox.StandardButton.Yes:
                return 0
        try:
            freed = self.library.remove(e)
        except (LibraryError, OSError) as exc:
            QMessageBox.warning(self, "Could not remove the model", str(exc))
            return 0
        self.removed.emit(str(e.path))
        self.refresh()
        self.note.setText(f"Removed {e.name}: {size(freed)} freed. " + self.note.text())
        return freed

    def _convert(self) -> None:
        self.convert_requested.emit()
        self.accept()


def _key(path: str) -> str:
    from pathlib import Path

    return str(Path(path).resolve())
