"""The bar above the chat: its title, the model switcher, and Attach…,
Documents, Export…, Gauges and Settings. Where the row leaves the title less
than ``TITLE_ROOM`` pixels (a narrow window, the gauges shown) the title
takes a row of its own above the controls, so it never shrinks to "Wh…"."""
from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QFrame, QGridLayout, QHBoxLayout, QToolButton, QWidget

from app.ui.elided import ElidedLabel
from app.ui.model_picker import ModelPicker


def _button(text: str, name: str) -> QToolButton:
    b = QToolButton()
    b.setText(text)
    b.setAccessibleName(name)
    b.setToolTip(name)
    b.setAutoRaise(True)
    return b


TITLE_ROOM = 260   #: the least width the title keeps beside the controls before it takes its own row


class TopBar(QFrame):
    def __init__(self, parent=None):
        super().__init__(parent)
        self.setObjectName("topBar")
        self.grid = QGridLayout(self)
        self.grid.setContentsMargins(14, 6, 10, 6)
        self.grid.setVerticalSpacing(2)
        self.title_label = ElidedLabel("New chat")
        self.title_label.setObjectName("chatTitle")
        self.controls = QWidget()
        tl = QHBoxLayout(self.controls)
        tl.setContentsMargins(0, 0, 0, 0)
        self.model_combo = ModelPicker()
        tl.addWidget(self.model_combo)
        self.attach_btn = _button("Attach…", "Attach files or folders to this conversation")
        self.documents_btn = _button("Documents", "Collections of documents: add folders, watch, re-index")
        self.export_btn = _button("Export…", "Export this conversation (Markdown or JSON)")
        self.gauges_btn = _button("Gauges", "Show or hide the gauges")
        self.gauges_btn.setCheckable(True)
        self.gauges_btn.setChecked(True)
        self.settings_btn = _button("Settings", "Settings")
        for b in (self.attach_btn, self.documents_btn, self.export_btn, self.gauges_btn, self.settings_btn):
            tl.addWidget(b)
        self.two_rows = None
        self._arrange(False)

    @property
    def stacked(self) -> bool:
        """Whether the title has a row of its own."""
        return bool(self.two_rows)

    def _arrange(self, two_rows: bool) -> None:
        if two_rows == self.two_rows:
            return
        self.two_rows = two_rows
        self.grid.removeWidget(self.title_label)
        self.grid.removeWidget(self.controls)
        if two_rows:
            self.grid.addWidget(self.title_label, 0, 0)
            self.grid.addWidget(self.controls, 1, 0, Qt.AlignmentFlag.AlignRight)
            self.grid.setColumnStretch(0, 1)
            self.grid.setColumnStretch(1, 0)
        else:
            self.grid.addWidget(self.title_label, 0, 0)
            self.grid.addWidget(self.controls, 0, 1)
            self.grid.setColumnStretch(0, 1)
            self.grid.setColumnStretch(1, 0)

    def resizeEvent(self, event) -> None:
        m = self.grid.contentsMargins()
        room = event.size().width() - m.left() - m.right() - self.controls.sizeHint().width()
        self._arrange(room < TITLE_ROOM)
        super().resizeEvent(event)

    def set_ready(self, ready: bool) -> None:
        self.export_btn.setVisible(ready)
        self.gauges_btn.setVisible(ready)
        self._arrange(self.width() - self.controls.sizeHint().width() - 24 < TITLE_ROOM)
