"""The patch-budget setting of the settings dialog (Answers → Images): how many
14 x 14 patches an attached image may have, and what that costs. "Default"
(0) is the budget every front end uses when none is given
(``app.vision.image.DEFAULT_PATCH_BUDGET``: ``ferry run --image-budget`` and
the server's default), so the window never keeps a constant of its own. The
line under it says what a typical photo then costs in prompt positions (each
read like a prompt token), updated as the value changes."""
from __future__ import annotations

from PySide6.QtWidgets import QLabel, QSpinBox, QVBoxLayout, QWidget

from app.vision.image import DEFAULT_PATCH_BUDGET, MAX_PATCH_BUDGET, MIN_PATCH_BUDGET, plan_grid

#: The typical photo the note prices: a 12-megapixel 4:3 camera picture.
PHOTO = (4000, 3000)


def budget_note(budget: int) -> str:
    """What an image costs under ``budget`` patches (0: the default), as the setting says it."""
    b = budget or DEFAULT_PATCH_BUDGET
    g = plan_grid(*PHOTO, b)
    return (f"A {PHOTO[0]} x {PHOTO[1]} photo: {g.patches:,} patches, {g.positions:,} prompt positions. "
            "Fewer patches: quicker, less detail seen.")


class _Doubling(QSpinBox):
    """A budget's arrows halve or double it (from the default when it shows "Default"); below the least
    budget is "Default". Any value in the range can be typed."""

    def stepBy(self, steps: int) -> None:
        v = self.value() if self.value() >= MIN_PATCH_BUDGET else DEFAULT_PATCH_BUDGET
        v = v << steps if steps > 0 else v >> -steps
        self.setValue(self.minimum() if v < MIN_PATCH_BUDGET else min(v, MAX_PATCH_BUDGET))


class ImageBudget(QWidget):
    """A spin box of patches (its lowest value is "Default") and the note of what a photo costs."""

    def __init__(self, value: int, parent=None):
        super().__init__(parent)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        self.spin = _Doubling(accessibleName="Image patch budget")
        # the lowest value stands for "the default": below the pipeline's least budget
        self.spin.setRange(MIN_PATCH_BUDGET - 1, MAX_PATCH_BUDGET)
        self.spin.setSuffix(" patches")
        self.spin.setSpecialValueText(f"Default ({DEFAULT_PATCH_BUDGET:,} patches)")
        self.spin.setToolTip("The most 14 x 14 patches an attached image is resized to (four patches make one "
                             "prompt position). The vision tower's time grows with the patches, the answer's "
                             "prompt with the positions. As `ferry run --image-budget` and `ferry serve "
                             "--image-budget`.")
        self.spin.setValue(value if value else self.spin.minimum())
        self.note = QLabel(budget_note(self.value()), objectName="mutedLabel", accessibleName="Image cost")
        self.note.setWordWrap(True)
        self.spin.valueChanged.connect(lambda _v: self.note.setText(budget_note(self.value())))
        lay.addWidget(self.spin)
        lay.addWidget(self.note)

    def value(self) -> int:
        """The setting: 0 for the default, else the patches chosen."""
        v = self.spin.value()
        return 0 if v < MIN_PATCH_BUDGET else v
