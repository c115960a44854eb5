"""A cited passage in its page, highlighted and scrolled into view (a ``cite:n``
link clicked in an answer)."""
from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Qt, QUrl
from PySide6.QtGui import QColor, QDesktopServices, QTextCharFormat, QTextCursor
from PySide6.QtWidgets import QDialog, QDialogButtonBox, QLabel, QTextEdit, QVBoxLayout, QWidget

from app.documents.ask import Citation
from app.documents.store import DocumentError, DocumentStore


class CitationDialog(QDialog):
    """A cited passage in its page, highlighted and scrolled into view."""

    def __init__(self, page_text: str, citation: Citation, parent: QWidget | None = None):
        super().__init__(parent)
        where = citation.file + (f", page {citation.page}" if citation.page is not None else "")
        self.setWindowTitle(f"[{citation.n}] {where}")
        self.setAccessibleName("Cited passage")
        self.resize(620, 480)
        lay = QVBoxLayout(self)
        head = QLabel(f"<b>[{citation.n}]</b> {where}" + (f" — {citation.heading}" if citation.heading else ""))
        head.setTextFormat(Qt.TextFormat.RichText)
        lay.addWidget(head)
        path = QLabel(citation.path)
        path.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        lay.addWidget(path)
        self.text = QTextEdit()
        self.text.setReadOnly(True)
        self.text.setAccessibleName("Page text")
        self.text.setPlainText(page_text)
        start, end = citation.start, citation.end
        if page_text[start:end] != citation.passage:     # the file changed since: find the passage
            at = page_text.find(citation.passage)
            start, end = (at, at + len(citation.passage)) if at >= 0 else (0, 0)
        self.highlight = (start, end)
        if end > start:
            cursor = QTextCursor(self.text.document())
            cursor.setPosition(start)
            cursor.setPosition(end, QTextCursor.MoveMode.KeepAnchor)
            fmt = QTextCharFormat()
            fmt.setBackground(QColor("#ffe58a"))
            fmt.setForeground(QColor("#000000"))
            sel = QTextEdit.ExtraSelection()
            sel.cursor, sel.format = cursor, fmt
            self.text.setExtraSelections([sel])
            view = QTextCursor(self.text.document())
            view.setPosition(end)
            self.text.setTextCursor(view)
            view.setPosition(start)
            self.text.setTextCursor(view)
            self.text.ensureCursorVisible()
        lay.addWidget(self.text, 1)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        self.open_btn = buttons.addButton("Open the file", QDialogButtonBox.ButtonRole.ActionRole)
        self.open_btn.setAccessibleName("Open the cited file in its own application")
        self.open_btn.setEnabled(Path(citation.path).is_file())
        self.open_btn.clicked.connect(lambda: QDesktopServices.openUrl(QUrl.fromLocalFile(citation.path)))
        buttons.rejected.connect(self.close)
        lay.addWidget(buttons)

    def highlighted_text(self) -> str:
        sels = self.text.extraSelections()
        return sels[0].cursor.selectedText().replace("\u2029", "\n") if sels else ""


def show_citation(parent: QWidget | None, store: DocumentStore, citation: Citation) -> CitationDialog:
    try:
        page = store.page_text(citation.file_id, citation.page)
    except DocumentError:
        page = citation.passage
    dialog = CitationDialog(page, citation, parent)
    dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
    dialog.show()
    return dialog
