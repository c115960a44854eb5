"""The composer bar under the chat: the message box, Send and Stop, Attach
image (app/ui/image_attach.py fills it and the row of pending images above
the box), and the prompt-reading progress line above them. Enter (or Shift+Enter, as the
settings say) sends; the other inserts a new line."""
from __future__ import annotations

from PySide6.QtCore import QEvent, Qt, Signal
from PySide6.QtWidgets import (QFrame, QHBoxLayout, QLabel, QPlainTextEdit, QProgressBar, QPushButton, QVBoxLayout,
                               QWidget)


class ComposerBar(QFrame):
    send_requested = Signal()
    stop_requested = Signal()
    cleared = Signal()     #: the message was sent: the box and the pending images are emptied

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setObjectName("composerBar")
        self.enter_sends = lambda: True    #: whether Enter (not Shift+Enter) sends: the window's setting
        bl = QVBoxLayout(self)
        bl.setContentsMargins(14, 8, 14, 10)
        bl.setSpacing(6)
        self.prompt_row = QWidget()
        prow = QHBoxLayout(self.prompt_row)
        prow.setContentsMargins(0, 0, 0, 0)
        self.prompt_label = QLabel("")
        self.prompt_label.setObjectName("mutedLabel")
        self.prompt_bar = QProgressBar()
        self.prompt_bar.setAccessibleName("Prompt processing")
        self.prompt_bar.setTextVisible(False)
        self.prompt_bar.setMaximumHeight(8)
        prow.addWidget(self.prompt_label)
        prow.addWidget(self.prompt_bar, 1)
        self.prompt_row.setVisible(False)
        bl.addWidget(self.prompt_row)
        self.setup_label = QLabel("")      #: the preset / system prompt in effect, when there is one
        self.setup_label.setObjectName("setupNote")
        self.setup_label.setAccessibleName("Preset and system prompt in effect")
        self.setup_label.setTextFormat(Qt.TextFormat.PlainText)
        self.setup_label.setVisible(False)
        bl.addWidget(self.setup_label, 0, Qt.AlignmentFlag.AlignLeft)
        self.images_row = QWidget()        #: the pending images' thumbnails and costs (image_attach.py)
        self.images_row.setVisible(False)
        bl.addWidget(self.images_row)
        crow = QHBoxLayout()
        self.editor = QPlainTextEdit()
        self.editor.setAccessibleName("Message")
        self.editor.installEventFilter(self)
        self.editor.setFixedHeight(98)
        crow.addWidget(self.editor, 1)
        btns = QVBoxLayout()
        self.send_btn = QPushButton("Send")
        self.send_btn.setAccessibleName("Send")
        self.send_btn.setToolTip("Send (Ctrl+Enter)")
        self.send_btn.setDefault(True)
        self.send_btn.clicked.connect(self.send_requested)
        self.stop_btn = QPushButton("Stop")
        self.stop_btn.setAccessibleName("Stop")
        self.stop_btn.setToolTip("Stop the answer (Esc)")
        self.stop_btn.clicked.connect(self.stop_requested)
        self.image_btn = QPushButton("Attach image…")
        self.image_btn.setAccessibleName("Attach image")
        btns.addWidget(self.send_btn)
        btns.addWidget(self.stop_btn)
        btns.addWidget(self.image_btn)
        crow.addLayout(btns)
        bl.addLayout(crow)

    def clear(self) -> None:
        """The message went: the box is emptied, and the images it carried leave the row."""
        self.editor.clear()
        self.cleared.emit()

    def send_keys(self) -> str:
        return ("Enter sends, Shift+Enter for a new line" if self.enter_sends() else
                "Shift+Enter sends, Enter for a new line")

    def show_setup(self, text: str, tip: str) -> None:
        """The marker of the preset / system prompt in effect ("" hides it)."""
        self.setup_label.setText(f"⚙ {text}" if text else "")
        self.setup_label.setToolTip(tip)
        self.setup_label.setVisible(bool(text))

    def set_state(self, ready: bool, busy: bool) -> None:
        self.send_btn.setEnabled(ready and not busy)
        self.stop_btn.setEnabled(busy)

    def start_reading(self, label: str) -> None:
        """A busy bar and ``label`` until the prompt's progress comes."""
        self.prompt_row.setVisible(True)
        self.prompt_bar.setRange(0, 0)
        self.prompt_label.setText(label)

    def show_progress(self, done: int, total: int, label: str) -> None:
        """``done`` of ``total`` prompt tokens read; hidden once all are."""
        if done >= total:
            self.prompt_row.setVisible(False)
            return
        self.prompt_row.setVisible(True)
        self.prompt_bar.setRange(0, max(1, total))
        self.prompt_bar.setValue(done)
        self.prompt_label.setText(label)

    def eventFilter(self, obj, event) -> bool:
        if obj is self.editor and event.type() == QEvent.Type.KeyPress and \
                event.key() in (Qt.Key.Key_Return, Qt.Key.Key_Enter):
            mods = event.modifiers() & ~Qt.KeyboardModifier.KeypadModifier
            if mods == Qt.KeyboardModifier.NoModifier or mods == Qt.KeyboardModifier.ShiftModifier:
                shift = mods == Qt.KeyboardModifier.ShiftModifier
                if shift != self.enter_sends():   # this key sends
                    self.send_requested.emit()
                    return True
                self.editor.insertPlainText("\n")
                return True
        return super().eventFilter(obj, event)
