"""The conversation on screen: one widget per message of the branch shown,
Markdown bodies with copyable code blocks, a collapsible thinking panel, and
per-message actions (copy, edit and resend, regenerate, switch between
alternatives). It renders a ``Chat``; every action is a signal."""
from __future__ import annotations

from PySide6.QtCore import QEvent, QSize, Qt, QTimer, QUrl, Signal
from PySide6.QtGui import QDesktopServices, QGuiApplication, QTextOption
from PySide6.QtWidgets import (QFrame, QHBoxLayout, QLabel, QPlainTextEdit, QPushButton, QScrollArea,
                               QSizePolicy, QTextBrowser, QToolButton, QVBoxLayout, QWidget)

from app.chat import token_probs
from app.chat.conversation import STREAMING, UNFINISHED, Chat
from app.controller.chat_controller import CONTEXT_FULL, WRITER, describe_writer, latest_summary, memory_start
from app.store.history import MessageRecord
from app.ui import theme
from app.ui.elided import ElidedLabel
from app.ui.image_attach import message_images
from app.ui.markdown import render
from app.ui.tool_calls import ToolCallsView

STATUS_NOTES = {"cancelled": "Stopped", "error": "Ended by an error", "length": "Cut off at the length limit",
                CONTEXT_FULL: "Stopped: the context is full"}
MEMORY_MARK = "Earlier turns are outside the model's memory"
SUMMARY_MARK = "The model keeps a summary of the turns above"


class AutoBrowser(QTextBrowser):
    """A QTextBrowser as tall as its text (the chat scrolls, not each message)."""

    copied = Signal(str)
    cite = Signal(int)   #: a citation marker [n] was clicked

    def __init__(self, parent=None, *, markdown: bool = True):
        super().__init__(parent)
        self.markdown = markdown
        self.code_blocks: list[str] = []
        self._source = None
        self.setOpenLinks(False)
        self.setOpenExternalLinks(False)
        self.anchorClicked.connect(self._anchor)
        self.setFrameShape(QFrame.Shape.NoFrame)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setVerticalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        self.setWordWrapMode(QTextOption.WrapMode.WrapAtWordBoundaryOrAnywhere)
        self.viewport().setAutoFillBackground(False)
        self.setStyleSheet("QTextBrowser { background: transparent; }")
        self.document().setDocumentMargin(2)
        self.document().documentLayout().documentSizeChanged.connect(self._fit)

    def set_text(self, text: str) -> None:
        if text == self._source:
            return
        self._source = text
        if self.markdown:
            r = render(text, theme.markdown_colors())
            self.code_blocks = r.code_blocks
            self.setHtml(r.html)
        else:
            self.setPlainText(text)
        self._fit()

    def restyle(self) -> None:
        text, self._source = self._source, None
        if text is not None:
            self.set_text(text)

    def _anchor(self, url: QUrl) -> None:
        if url.scheme() == "copy":
            try:
                code = self.code_blocks[int(url.path() or url.toString().split(":", 1)[1])]
            except (ValueError, IndexError):
                return
            QGuiApplication.clipboard().setText(code)
            self.copied.emit(code)
        elif url.scheme() == "cite":
            try:
                self.cite.emit(int(url.path() or url.toString().split(":", 1)[1]))
            except ValueError:
                return
        elif url.scheme() in ("http", "https", "mailto"):
            QDesktopServices.openUrl(url)

    def resizeEvent(self, event) -> None:
        super().resizeEvent(event)
        self._fit()

    def _fit(self, *_) -> None:
        self.document().setTextWidth(self.viewport().width())
        h = int(self.document().size().height()) + 4
        if h != self.height():
            self.setFixedHeight(h)

    def sizeHint(self) -> QSize:
        return QSize(400, self.height())

    def wheelEvent(self, event) -> None:  # let the chat scroll
        event.ignore()


def _fold_button(parent: QWidget, name: str, toggled) -> QToolButton:
    """The one-line title that folds a panel open and shut (an arrow beside the text)."""
    b = QToolButton(parent)
    b.setCheckable(True)
    b.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
    b.setAutoRaise(True)
    b.setAccessibleName(name)
    # its title may be long ("Token probabilities · 90 tokens · mean…"): it never widens the bubble
    # (a narrow window clipped the bubbles' buttons); the whole title is the tooltip
    b.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Fixed)
    b.setMinimumWidth(120)
    b.toggled.connect(toggled)
    return b


class ThinkingPanel(QFrame):
    """The thinking trace, collapsed to one line titled with its duration."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setObjectName("thinkingPanel")
        lay = QVBoxLayout(self)
        lay.setContentsMargins(8, 4, 8, 4)
        lay.setSpacing(2)
        self.toggle = _fold_button(self, "Show or hide the thinking trace", self._toggled)
        self.body = AutoBrowser(self, markdown=False)
        self.body.setAccessibleName("Thinking trace")
        lay.addWidget(self.toggle, 0, Qt.AlignmentFlag.AlignLeft)
        lay.addWidget(self.body)
        self.user_touched = False
        self._apply(False)

    def set_title(self, title: str) -> None:
        self.toggle.setText(title)

    @property
    def expanded(self) -> bool:
        return self.toggle.isChecked()

    def set_expanded(self, on: bool) -> None:
        self.toggle.blockSignals(True)
        self.toggle.setChecked(on)
        self.toggle.blockSignals(False)
        self._apply(on)

    def _toggled(self, on: bool) -> None:
        self.user_touched = True
        self._apply(on)

    def _apply(self, on: bool) -> None:
        self.toggle.setArrowType(Qt.ArrowType.DownArrow if on else Qt.ArrowType.RightArrow)
        self.body.setVisible(on)


class TokenProbsPanel(QFrame):
    """An answer's token probabilities, collapsed to one line: each token shaded by
    how likely the model found it; the token under the mouse (or the one clicked)
    is described below with its alternatives (``app.chat.token_probs``)."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setObjectName("thinkingPanel")
        lay = QVBoxLayout(self)
        lay.setContentsMargins(8, 4, 8, 4)
        lay.setSpacing(4)
        self.toggle = _fold_button(self, "Show or hide the token probabilities", self._apply)
        self.tokens_label = QLabel(self)
        self.tokens_label.setAccessibleName("Token probabilities")
        self.tokens_label.setWordWrap(True)
        self.tokens_label.setTextFormat(Qt.TextFormat.RichText)
        self.tokens_label.setTextInteractionFlags(Qt.TextInteractionFlag.LinksAccessibleByMouse
                                                  | Qt.TextInteractionFlag.LinksAccessibleByKeyboard)
        self.tokens_label.linkHovered.connect(self._hovered)
        self.tokens_label.linkActivated.connect(self._clicked)
        self.detail = QLabel(self)
        self.detail.setObjectName("mutedLabel")
        self.detail.setAccessibleName("The token and its alternatives")
        self.detail.setWordWrap(True)
        self.detail.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        lay.addWidget(self.toggle, 0, Qt.AlignmentFlag.AlignLeft)
        lay.addWidget(self.tokens_label)
        lay.addWidget(self.detail)
        self.tokens: list[token_probs.TokenProb] = []
        self.selected: int | None = None
        self._apply(False)

    def set_tokens(self, tokens: list[token_probs.TokenProb]) -> None:
        if tokens == self.tokens:
            return
        self.tokens, self.selected = tokens, None
        self.toggle.setText(f"Token probabilities · {token_probs.summary(tokens)}")
        self.toggle.setToolTip(self.toggle.text())
        self.render()

    def render(self) -> None:
        self.tokens_label.setText(token_probs.tokens_html(self.tokens, theme.probability_colors(), self.selected))
        self._show(self.selected)

    def _show(self, index: int | None) -> None:
        self.detail.setText(token_probs.describe(self.tokens[index]) if index is not None else
                            "Point at a token (or click it) to see how likely it was and what else the model "
                            "considered.")

    def select(self, index: int | None) -> None:
        """Pin the description to token ``index`` (None: none)."""
        self.selected = index
        self.render()

    def _hovered(self, href: str) -> None:
        i = token_probs.link_index(href, len(self.tokens))
        self._show(i if i is not None else self.selected)

    def _clicked(self, href: str) -> None:
        i = token_probs.link_index(href, len(self.tokens))
        if i is not None:
            self.select(None if i == self.selected else i)

    @property
    def expanded(self) -> bool:
        return self.toggle.isChecked()

    def _apply(self, on: bool) -> None:
        self.toggle.setArrowType(Qt.ArrowType.DownArrow if on else Qt.ArrowType.RightArrow)
        self.tokens_label.setVisible(on)
        self.detail.setVisible(on)


def thinking_title(seconds: float | None, still_thinking: bool) -> str:
    if still_thinking:
        return f"Thinking… {seconds:.0f} s" if seconds else "Thinking…"
    if seconds is None:
        return "Thoughts"
    return f"Thought for {max(1, round(seconds))} s" if seconds >= 0.5 else "Thought for less than a second"


def turn_figures(stats: dict | None) -> str:
    """An answer's own figures: '42 tokens · 12.3 tok/s · first token after 0.4 s' ('' when unknown)."""
    stats = stats or {}
    n, secs, ttft = stats.get("turn_tokens"), stats.get("turn_seconds"), stats.get("ttft_s")
    if not n or not secs:
        return ""
    # the answer's own speed, as the gauge shows it: the tokens after the first over the time after it
    # (the prompt's reading is in the time to the first token, not in the answer's rate)
    rate = (n - 1) / (secs - ttft) if ttft is not None and n > 1 and secs > ttft else n / secs
    text = f"{n} token{'' if n == 1 else 's'} · {rate:.1f} tok/s"
    return text + (f" · first token after {ttft:.1f} s" if ttft is not None else "")


class MessageWidget(QFrame):
    regenerate = Signal(int)
    resume = Signal(int)      #: Continue: an answer that stopped early, written on
    fork = Signal(int)        #: a new chat with the conversation up to this message
    edit = Signal(int, str)
    switch = Signal(int)
    copied = Signal(str)
    cite = Signal(int, int)   #: message id, citation number

    def __init__(self, record: MessageRecord, author: str, siblings: list[int], parent=None, decorate=None):
        super().__init__(parent)
        self.record = record
        self.decorate = decorate  #: (record, markdown) -> markdown, e.g. citation links
        self.message_id = record.id
        self.setObjectName("userBubble" if record.role == "user" else "assistantBubble")
        self.setFrameShape(QFrame.Shape.StyledPanel)
        outer = QVBoxLayout(self)
        outer.setContentsMargins(12, 8, 12, 8)
        outer.setSpacing(4)

        head = QHBoxLayout()
        head.setSpacing(6)
        self.author = QLabel(f"<b>{author}</b>")
        head.addWidget(self.author)
        self.note = ElidedLabel("")      # status and figures: elided, never widening the bubble
        self.note.setObjectName("mutedLabel")
        head.addWidget(self.note, 1)
        self.prev_btn = self._tool("‹", "Previous version")
        self.pos_label = QLabel("")
        self.pos_label.setObjectName("mutedLabel")
        self.next_btn = self._tool("›", "Next version")
        for w in (self.prev_btn, self.pos_label, self.next_btn):
            head.addWidget(w)
        self.copy_btn = self._tool("Copy", "Copy this message")
        head.addWidget(self.copy_btn)
        if record.role == "user":
            self.action_btn = self._tool("Edit", "Edit and resend this message")
            self.action_btn.clicked.connect(self._begin_edit)
        else:
            self.action_btn = self._tool("Regenerate", "Write another answer")
            self.action_btn.clicked.connect(lambda: self.regenerate.emit(self.message_id))
        self.continue_btn = self._tool("Continue", "Write on from where this answer stopped")
        self.continue_btn.clicked.connect(lambda: self.resume.emit(self.message_id))
        self.continue_btn.setVisible(False)
        head.addWidget(self.continue_btn)
        self.fork_btn = self._tool("Fork", "A new chat with the conversation up to here")
        self.fork_btn.clicked.connect(lambda: self.fork.emit(self.message_id))
        head.addWidget(self.fork_btn)
        head.addWidget(self.action_btn)
        outer.addLayout(head)

        self.thinking = ThinkingPanel(self)
        self.thinking.setVisible(False)
        outer.addWidget(self.thinking)
        self.images = message_images(record.images, self)   # a question's images, as thumbnails
        if self.images is not None:
            outer.addWidget(self.images)
        self.body = AutoBrowser(self)
        self.body.cite.connect(lambda n: self.cite.emit(self.message_id, n))
        self.body.setAccessibleName("Your message" if record.role == "user" else "Answer")
        self.body.copied.connect(self.copied)
        outer.addWidget(self.body)
        self.calls = ToolCallsView(self)   # the answer's tool calls: name, arguments, result (app/ui/tool_calls.py)
        outer.addWidget(self.calls)
        self.probs = TokenProbsPanel(self)
        self.probs.setVisible(False)
        outer.addWidget(self.probs)

        self.editor = QPlainTextEdit(self)
        self.editor.setAccessibleName("Edit the message")
        self.editor.setVisible(False)
        self.editor.setFixedHeight(90)
        self.editor.setToolTip("Enter saves and resends · Shift+Enter starts a new line · Esc cancels")
        self.editor.installEventFilter(self)
        outer.addWidget(self.editor)
        self.edit_row = QWidget(self)
        er = QHBoxLayout(self.edit_row)
        er.setContentsMargins(0, 0, 0, 0)
        er.addStretch(1)
        cancel = QPushButton("Cancel")
        cancel.setAccessibleName("Cancel editing")
        cancel.clicked.connect(self._end_edit)
        self.resend_btn = QPushButton("Save && resend")
        self.resend_btn.setAccessibleName("Save the edit and resend")
        self.resend_btn.clicked.connect(self._resend)
        er.addWidget(cancel)
        er.addWidget(self.resend_btn)
        self.edit_row.setVisible(False)
        outer.addWidget(self.edit_row)

        self.copy_btn.clicked.connect(self._copy)
        self._siblings = siblings
        self.prev_btn.clicked.connect(lambda: self._go(-1))
        self.next_btn.clicked.connect(lambda: self._go(+1))
        self._auto_collapsed = False
        self.update_from(record, streaming=record.status == STREAMING)

    def _tool(self, text: str, name: str) -> QToolButton:
        b = QToolButton(self)
        b.setText(text)
        b.setToolTip(name)
        b.setAccessibleName(name)
        b.setAutoRaise(True)
        return b

    def update_from(self, record: MessageRecord, *, streaming: bool, thinking_seconds: float | None = None,
                    busy: bool = False) -> None:
        self.record = record
        has_thinking = bool(record.thinking)
        self.thinking.setVisible(has_thinking)
        if has_thinking:
            still = streaming and not record.content
            secs = thinking_seconds if thinking_seconds is not None else record.thinking_seconds
            self.thinking.set_title(thinking_title(secs, still))
            self.thinking.body.set_text(record.thinking.strip())
            if streaming and not record.content and not self.thinking.user_touched:
                self.thinking.set_expanded(True)
            elif record.content and not self._auto_collapsed:
                self._auto_collapsed = True
                self.thinking.set_expanded(False)
            elif not streaming and not self._auto_collapsed:
                self._auto_collapsed = True
                self.thinking.set_expanded(False)
        text = record.content
        if not text and streaming:
            text = "" if has_thinking else "…"
        elif not text and record.role == "assistant":
            text = "*(no answer)*"
        if self.decorate and record.content:
            text = self.decorate(record, text)
        self.body.set_text(text)
        self.body.setVisible(bool(text))
        self.calls.set_calls(record.stats)   # while it is written too: a tool round shows its calls as they run
        probs = [] if streaming else token_probs.from_stats(record.stats)
        self.probs.setVisible(bool(probs))
        if probs:
            self.probs.set_tokens(probs)
        note = "writing…" if streaming else " · ".join(
            x for x in (STATUS_NOTES.get(record.status, ""), turn_figures(record.stats)) if x)
        self.note.set_full_text(note)
        n = len(self._siblings)
        multi = n > 1
        for w in (self.prev_btn, self.pos_label, self.next_btn):
            w.setVisible(multi)
        if multi:
            i = self._siblings.index(record.id) if record.id in self._siblings else 0
            self.pos_label.setText(f"{i + 1}/{n}")
            self.prev_btn.setEnabled(i > 0 and not busy)
            self.next_btn.setEnabled(i < n - 1 and not busy)
        self.action_btn.setEnabled(not busy)
        self.continue_btn.setVisible(record.role == "assistant" and record.status in UNFINISHED
                                     and bool(record.content))
        self.continue_btn.setEnabled(not busy)
        self.fork_btn.setEnabled(not streaming)
        self.copy_btn.setEnabled(bool(record.content))

    def restyle(self) -> None:
        self.body.restyle()
        self.thinking.body.restyle()
        if self.probs.tokens:
            self.probs.render()

    def _copy(self) -> None:
        QGuiApplication.clipboard().setText(self.record.content)
        self.copied.emit(self.record.content)

    def _go(self, step: int) -> None:
        i = self._siblings.index(self.message_id) + step
        if 0 <= i < len(self._siblings):
            self.switch.emit(self._siblings[i])

    def _begin_edit(self) -> None:
        self.editor.setPlainText(self.record.content)
        self.editor.setVisible(True)
        self.edit_row.setVisible(True)
        self.body.setVisible(False)
        self.editor.setFocus()

    def _end_edit(self) -> None:
        self.editor.setVisible(False)
        self.edit_row.setVisible(False)
        self.body.setVisible(True)

    def eventFilter(self, obj, event) -> bool:
        """In the inline editor: Enter saves and resends, Shift+Enter starts a new line, Esc cancels."""
        if obj is self.editor and event.type() == QEvent.Type.KeyPress:
            mods = event.modifiers() & ~Qt.KeyboardModifier.KeypadModifier
            if event.key() in (Qt.Key.Key_Return, Qt.Key.Key_Enter) and mods == Qt.KeyboardModifier.NoModifier:
                self._resend()
                return True
            if event.key() == Qt.Key.Key_Escape:
                self._end_edit()
                return True
        return super().eventFilter(obj, event)

    def _resend(self) -> None:
        text = self.editor.toPlainText().strip()
        if text:
            self._end_edit()
            self.edit.emit(self.message_id, text)


class ChatView(QScrollArea):
    """The branch on screen. ``show_chat`` rebuilds; ``refresh_streaming`` only
    redraws the answer being written (the window calls it on a timer)."""

    regenerate = Signal(int)
    resume = Signal(int)      #: Continue: an answer that stopped early, written on
    fork = Signal(int)        #: a new chat with the conversation up to this message
    edit = Signal(int, str)
    switch = Signal(int)
    copied = Signal(str)
    cite = Signal(int, int)   #: message id, citation number

    def __init__(self, parent=None):
        super().__init__(parent)
        self.decorate = None  #: (record, markdown) -> markdown for each message, or None
        self.setWidgetResizable(True)
        self.setFrameShape(QFrame.Shape.NoFrame)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setAccessibleName("Conversation")
        self.inner = QWidget()
        self.inner.setObjectName("chatInner")
        self.lay = QVBoxLayout(self.inner)
        self.lay.setContentsMargins(18, 14, 18, 14)
        self.lay.setSpacing(10)
        self.placeholder = QLabel()
        self.placeholder.setObjectName("chatPlaceholder")
        self.placeholder.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.placeholder.setWordWrap(True)
        self.placeholder.setContentsMargins(20, 140, 20, 0)
        self.lay.addWidget(self.placeholder)
        self.lay.addStretch(1)
        self.setWidget(self.inner)
        self.widgets: list[MessageWidget] = []
        self.memory_mark: QLabel | None = None   #: the line above the oldest message the model still holds
        self.chat: Chat | None = None
        self.author = "Assistant"
        self._stick = True
        self._end_timer = QTimer(self)
        self._end_timer.setSingleShot(True)
        self._end_timer.setInterval(0)
        self._end_timer.timeout.connect(self.scroll_to_end)
        self.verticalScrollBar().rangeChanged.connect(self._range_changed)
        self.verticalScrollBar().valueChanged.connect(self._scrolled)

    def set_placeholder(self, html: str) -> None:
        self.placeholder.setText(html)

    def show_chat(self, chat: Chat | None, author: str | None = None) -> None:
        self.chat = chat
        if author:
            self.author = author
        for w in self.widgets:
            # hide and let Qt delete it on this (the GUI) thread; dropping it from
            # Python could leave it to a garbage collection on the engine's thread
            self.lay.removeWidget(w)
            w.hide()
            w.deleteLater()
        self.widgets = []
        if self.memory_mark is not None:
            self.lay.removeWidget(self.memory_mark)
            self.memory_mark.hide()
            self.memory_mark.deleteLater()
            self.memory_mark = None
        records = chat.visible() if chat else []
        self.placeholder.setVisible(not records)
        busy = bool(chat and chat.busy)
        boundary = memory_start(records)
        summary = latest_summary(records)
        for i, rec in enumerate(records):
            if i == boundary and i > 0:
                mark = SUMMARY_MARK if summary and int(summary["covered"]) == i else MEMORY_MARK
                self.memory_mark = QLabel(f"— {mark} —", objectName="mutedLabel", accessibleName=mark)
                self.memory_mark.setAlignment(Qt.AlignmentFlag.AlignCenter)
                self.memory_mark.setWordWrap(True)
                self.memory_mark.setToolTip(
                    f"The context was full: the model summarised the turns above; it keeps this note instead:\n\n"
                    f"{summary['text']}" if mark == SUMMARY_MARK else
                    "The context is full: the oldest turns were left out of the prompt. "
                    "The model no longer sees them; they stay here and in the history.")
                self.lay.insertWidget(self.lay.count() - 1, self.memory_mark)
            sibs = [m.id for m in chat.tree.siblings(rec.id)]
            wrote = (rec.stats or {}).get(WRITER) or {}
            w = MessageWidget(rec, "You" if rec.role == "user" else self.author_of(rec), sibs, self.inner,
                              decorate=self.decorate)
            w.author.setToolTip(describe_writer(wrote))
            w.cite.connect(self.cite)
            w.regenerate.connect(self.regenerate)
            w.resume.connect(self.resume)
            w.fork.connect(self.fork)
            w.edit.connect(self.edit)
            w.switch.connect(self.switch)
            w.copied.connect(self.copied)
            w.update_from(rec, streaming=rec.status == STREAMING and rec.id == chat.streaming_id, busy=busy,
                          thinking_seconds=chat.thinking_seconds() if rec.id == chat.streaming_id else None)
            self.lay.insertWidget(self.lay.count() - 1, w)
            w.show()
            self.widgets.append(w)
        self._stick = True
        self._end_timer.start()

    def author_of(self, rec: MessageRecord) -> str:
        """The model that wrote an answer, as kept with it; an answer from before answers kept it: the
        model its chat was started with (the one being written: the open model)."""
        if rec.status == STREAMING:
            return self.author
        wrote = (rec.stats or {}).get(WRITER) or {}
        return wrote.get("name") or (self.chat.first_model if self.chat else "") or "Assistant"

    def refresh_streaming(self) -> None:
        chat = self.chat
        if chat is None or not self.widgets:
            return
        w = self.widgets[-1]
        rec = chat.tree.by_id.get(w.message_id)
        if rec is None:
            return
        w.update_from(rec, streaming=chat.streaming_id == rec.id, thinking_seconds=chat.thinking_seconds(),
                      busy=chat.busy)

    def set_busy(self, busy: bool) -> None:
        if self.chat is None:
            return
        for w in self.widgets:
            rec = self.chat.tree.by_id.get(w.message_id)
            if rec is not None:
                w.update_from(rec, streaming=self.chat.streaming_id == rec.id, busy=busy)

    def restyle(self) -> None:
        for w in self.widgets:
            w.restyle()

    def scroll_to_end(self) -> None:
        bar = self.verticalScrollBar()
        bar.setValue(bar.maximum())

    def _range_changed(self, _lo: int, hi: int) -> None:
        if self._stick:
            self.verticalScrollBar().setValue(hi)

    def _scrolled(self, value: int) -> None:
        self._stick = value >= self.verticalScrollBar().maximum() - 8
