"""A one-line label that ends in an ellipsis when its text does not fit."""
from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QLabel, QSizePolicy


class ElidedLabel(QLabel):
    """Ends in "…" when the text does not fit (whole characters only, never a
    clipped letter); ``full_text`` is the whole text, also the tooltip. It takes
    the room its layout gives it and never widens the layout."""

    def __init__(self, text: str = "", parent=None):
        super().__init__(parent)
        self.full_text = text
        self.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        self._elide()

    def set_full_text(self, text: str) -> None:
        self.full_text = text
        self.setToolTip(text)
        self._elide()

    def resizeEvent(self, event) -> None:
        super().resizeEvent(event)
        self._elide()

    def _elide(self) -> None:
        if self.width() <= 1:      # not laid out yet: the next resize elides
            shown = self.full_text
        else:
            shown = self.fontMetrics().elidedText(self.full_text, Qt.TextElideMode.ElideRight, self.width() - 2)
        if shown != self.text():
            self.setText(shown)
