"""The sidebar: New chat, the search box and the conversations (newest first,
each with the date it last changed at its right), with Rename and Delete on
a right click; the arrow keys open the conversation they move to. It forwards
what the user picks; the window decides."""
from __future__ import annotations

import time

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QPalette
from PySide6.QtWidgets import (QApplication, QFrame, QInputDialog, QLineEdit, QListWidget, QListWidgetItem, QMenu,
                               QPushButton, QStyle, QStyledItemDelegate, QStyleOptionViewItem, QVBoxLayout)


DATE_ROLE = Qt.ItemDataRole.UserRole + 1   #: the conversation's last change, as shown at the row's right
WRITING = "writing…"    #: at the right of the conversation an answer is being written in


def when(t: float, now: float | None = None) -> str:
    """A conversation's last change, short: "14:03" today, "Yesterday", "Mon" this week, "12 Nov" this
    year, else "2025-11-12"."""
    now = time.time() if now is None else now
    day = time.localtime(t)
    today = time.localtime(now)
    days = (time.mktime(today[:3] + (0, 0, 0, 0, 0, -1)) - time.mktime(day[:3] + (0, 0, 0, 0, 0, -1))) / 86400
    if days < 0.5:
        return time.strftime("%H:%M", day)
    if days < 1.5:
        return "Yesterday"
    if days < 6.5:
        return time.strftime("%a", day)
    return time.strftime("%d %b" if day.tm_year == today.tm_year else "%Y-%m-%d", day)


class _DatedRow(QStyledItemDelegate):
    """A row: the title (elided to leave room) and, at the right, its date (muted unless selected)."""

    def paint(self, painter, option, index) -> None:
        opt = QStyleOptionViewItem(option)
        self.initStyleOption(opt, index)
        date = index.data(DATE_ROLE) or ""
        room = opt.fontMetrics.horizontalAdvance(date) + 18 if date else 0
        opt.text = opt.fontMetrics.elidedText(opt.text, Qt.TextElideMode.ElideRight, opt.rect.width() - room - 8)
        style = opt.widget.style() if opt.widget is not None else QApplication.style()
        style.drawControl(QStyle.ControlElement.CE_ItemViewItem, opt, painter, opt.widget)
        if date:
            painter.save()
            selected = opt.state & QStyle.StateFlag.State_Selected
            painter.setPen(opt.palette.color(QPalette.ColorRole.HighlightedText if selected
                                             else QPalette.ColorRole.PlaceholderText))
            painter.drawText(opt.rect.adjusted(0, 0, -6, 0),
                             Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter, date)
            painter.restore()


class ConversationList(QFrame):
    new_requested = Signal()
    open_requested = Signal(int)
    rename_requested = Signal(int)
    delete_requested = Signal(int)
    search_changed = Signal(str)

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setObjectName("sidebar")
        sl = QVBoxLayout(self)
        sl.setContentsMargins(10, 10, 10, 10)
        self.new_btn = QPushButton("New chat")
        self.new_btn.setAccessibleName("New chat")
        self.new_btn.setToolTip("New chat (Ctrl+N)")
        self.new_btn.clicked.connect(self.new_requested)
        sl.addWidget(self.new_btn)
        self.search = QLineEdit()
        self.search.setPlaceholderText("Search conversations (Ctrl+F)")
        self.search.setAccessibleName("Search conversations")
        self.search.setClearButtonEnabled(True)
        self.search.textChanged.connect(self.search_changed)
        sl.addWidget(self.search)
        self.list = QListWidget()
        self.list.setAccessibleName("Conversations")
        self.list.setTextElideMode(Qt.TextElideMode.ElideRight)
        self.list.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.list.setUniformItemSizes(True)
        self.list.setItemDelegate(_DatedRow(self.list))
        self.list.itemClicked.connect(self._open)
        self.list.itemActivated.connect(self._open)
        self.list.currentItemChanged.connect(lambda item, _old: item is not None and self._open(item))
        self.list.itemDoubleClicked.connect(
            lambda item: self.rename_requested.emit(item.data(Qt.ItemDataRole.UserRole)))
        self.list.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)
        self.list.customContextMenuRequested.connect(self._menu)
        sl.addWidget(self.list, 1)
        self.setMinimumWidth(200)

    def show_conversations(self, infos, current_id: int | None, writing_id: int | None = None) -> None:
        """``writing_id``: the conversation an answer is being written in (its date reads "writing…")."""
        self.list.blockSignals(True)
        self.list.clear()
        for info in infos:
            item = QListWidgetItem(info.title or "Untitled")
            item.setData(Qt.ItemDataRole.UserRole, info.id)
            item.setToolTip(time.strftime("%Y-%m-%d %H:%M", time.localtime(info.updated)))
            item.setData(DATE_ROLE, WRITING if info.id == writing_id else when(info.updated))
            self.list.addItem(item)
            if info.id == current_id:
                item.setSelected(True)
                self.list.setCurrentItem(item)
        self.list.blockSignals(False)

    def ask_title(self, current: str) -> str | None:
        """Rename…: the new title typed, or None on Cancel."""
        # a short window title: a small dialog's title bar clipped "Rename “…”" to "Renam… Ferry"
        title, ok = QInputDialog.getText(self, "Rename the chat", "New title:", text=current)
        return title if ok else None

    def focus_search(self) -> None:
        self.search.setFocus()
        self.search.selectAll()

    def _open(self, item: QListWidgetItem) -> None:
        self.open_requested.emit(item.data(Qt.ItemDataRole.UserRole))

    def _menu(self, pos) -> None:
        item = self.list.itemAt(pos)
        if item is None:
            return
        cid = item.data(Qt.ItemDataRole.UserRole)
        menu = QMenu(self)
        menu.addAction("Rename…", lambda: self.rename_requested.emit(cid))
        menu.addAction("Delete", lambda: self.delete_requested.emit(cid))
        menu.exec(self.list.mapToGlobal(pos))
