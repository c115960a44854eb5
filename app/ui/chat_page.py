"""The chat page: the conversation (chat_view.py) above the composer
(composer.py), and what it says before the first message."""
from __future__ import annotations

from PySide6.QtWidgets import QVBoxLayout, QWidget

from app.ui.chat_view import ChatView
from app.ui.composer import ComposerBar


class ChatPage(QWidget):
    def __init__(self, parent=None):
        super().__init__(parent)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.setSpacing(0)
        self.view = ChatView()
        self.composer = ComposerBar()
        lay.addWidget(self.view, 1)
        lay.addWidget(self.composer)

    def show_chat(self, chat, model_name: str | None) -> None:
        """``chat`` on screen, written by ``model_name`` (None: no model is open yet)."""
        keys = self.composer.send_keys()
        self.view.set_placeholder(
            f"<p style='font-size:15pt'>Start a conversation</p><p>{model_name} runs on this computer; "
            f"nothing you type leaves it.</p><p>{keys} · Esc stops · Ctrl+N starts a new chat · "
            "drop a GGUF file here to convert it</p>"
            if model_name else "<p>Open a model to start, or drop a GGUF file or a checkpoint folder here.</p>")
        self.composer.editor.setPlaceholderText(f"Ask anything… ({keys})")
        self.view.show_chat(chat, model_name)
