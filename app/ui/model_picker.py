"""Choosing the model: the top bar's switcher (every converted model, the open
one selected) and the Model menu (library, this model's settings, the
models, convert). Both forward a chosen path; the window opens it."""
from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QComboBox, QMenu, QStyle, QStyleOptionComboBox, QStylePainter


def _same(entry, current: str | None) -> bool:
    return bool(current) and entry.key == str(Path(current).resolve())


class ModelPicker(QComboBox):
    chosen = Signal(str)    #: a model's path

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setAccessibleName("Switch model")
        self.setToolTip("The model answering; choose another to switch")
        self.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToContents)
        self.activated.connect(self._activated)

    def show_models(self, entries, current: str | None, loaded=None) -> None:
        """``entries``: the library's; ``current``: the open (or opening) model's path; ``loaded``: its
        ``ModelLoaded``, listed too when it is not in the library (e.g. a remote engine)."""
        self.blockSignals(True)
        self.clear()
        for e in entries:
            self.addItem(e.name, str(e.path))
        idx = next((i for i, e in enumerate(entries) if _same(e, current)), -1)
        if idx < 0 and loaded is not None:
            self.addItem(loaded.name, loaded.path)
            idx = self.count() - 1
        self.setCurrentIndex(idx)
        self.blockSignals(False)
        self.setVisible(self.count() > 0)
        self.setToolTip(f"{self.currentText()}: the model answering; choose another to switch"
                        if self.currentText() else "The model answering; choose another to switch")

    def shown_text(self) -> str:
        """The open model's name as it fits the box: ending in "…" when the bar is narrow, never cut
        to what looks like another name ("smollm2" for "smollm2-135m-instruct")."""
        opt = QStyleOptionComboBox()
        self.initStyleOption(opt)
        room = self.style().subControlRect(QStyle.ComplexControl.CC_ComboBox, opt,
                                           QStyle.SubControl.SC_ComboBoxEditField, self).width()
        return self.fontMetrics().elidedText(self.currentText(), Qt.TextElideMode.ElideRight, room)

    def paintEvent(self, _event) -> None:
        p = QStylePainter(self)
        opt = QStyleOptionComboBox()
        self.initStyleOption(opt)
        p.drawComplexControl(QStyle.ComplexControl.CC_ComboBox, opt)
        opt.currentText = self.shown_text()
        p.drawControl(QStyle.ControlElement.CE_ComboBoxLabel, opt)

    def _activated(self, index: int) -> None:
        path = self.itemData(index)
        if path:
            self.chosen.emit(path)


def fill_model_menu(menu: QMenu, head: list, entries, current: str | None, tail: list, switch) -> None:
    """The Model menu: ``head`` actions, the models (the open one checked; ``switch(path)`` opens one),
    then ``tail`` actions."""
    menu.clear()
    for a in head:
        menu.addAction(a)
    menu.addSeparator()
    for e in entries:
        a = menu.addAction(e.name, lambda p=str(e.path): switch(p))
        a.setCheckable(True)
        a.setChecked(_same(e, current))
        a.setToolTip(str(e.path))
    menu.addSeparator()
    for a in tail:
        menu.addAction(a)
