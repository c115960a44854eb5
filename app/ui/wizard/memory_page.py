"""Page 4: the RAM budget, preset to the engine's safe default."""
from __future__ import annotations

from PySide6.QtWidgets import QHBoxLayout, QLabel, QPushButton, QSpinBox, QVBoxLayout, QWizardPage

from app.ui.wizard.common import ORANGE, colour, para, size

MIB = 2**20


def _mib(n: int) -> int:
    """Bytes as whole MiB, rounded to the nearest as app.units.size rounds them, so the box and the
    "Recommended" line above it show the same number (rounded up, 273.2 MiB read "273 MiB" beside a
    box holding 274). budget() maps the recommendation's value back to its exact bytes and never
    goes below the floor, so rounding down loses nothing."""
    return round(int(n) / MIB)


class MemoryPage(QWizardPage):
    def __init__(self, state, parent=None):
        super().__init__(parent)
        self.state = state
        self.setTitle("How much memory may Ferry use?")
        self.setSubTitle("More memory keeps more experts in RAM, so fewer are read from the disk.")
        lay = QVBoxLayout(self)
        self.facts = para()
        self.facts.setAccessibleName("Memory facts")
        lay.addWidget(self.facts)
        row = QHBoxLayout()
        row.addWidget(QLabel("RAM budget"))
        self.spin = QSpinBox()      # MiB, as the Settings dialog's budget (the labels say sizes in MiB too)
        self.spin.setAccessibleName("RAM budget in MiB")
        self.spin.setSuffix(" MiB")
        self.spin.setSingleStep(256)
        self.spin.valueChanged.connect(self._changed)
        row.addWidget(self.spin)
        self.reset_btn = QPushButton("Use the recommended value")
        self.reset_btn.setAccessibleName("Use the recommended RAM budget")
        self.reset_btn.clicked.connect(lambda: self.spin.setValue(_mib(self.plan.recommended)))
        row.addWidget(self.reset_btn)
        row.addStretch(1)
        lay.addLayout(row)
        self.verdict = para()
        self.verdict.setAccessibleName("Budget check")
        lay.addWidget(self.verdict)
        lay.addWidget(para("<p>You can change this later in Settings; it takes effect when the model is "
                           "opened again.</p>"))
        lay.addStretch(1)
        self.plan = None
        self._preset = 0

    def preset(self, budget: int) -> None:
        self._preset = budget

    def initializePage(self) -> None:
        self.plan = plan = self.state.report.plan
        m = plan.machine
        self.spin.setRange(_mib(plan.floor), _mib(max(plan.everything, plan.recommended, m.total)))
        self.facts.setText(
            "<table>"
            f"<tr><td style='padding-right:14px'><b>The least it runs in</b></td><td>{size(plan.floor)} "
            f"(the always-needed weights {size(plan.trunk)}, the conversation's state at {plan.n_ctx} tokens "
            f"{size(plan.state)}, working memory {size(plan.scratch + plan.min_cache + plan.policy)})</td></tr>"
            f"<tr><td><b>Recommended</b></td><td>{size(plan.recommended)} ({plan.reason})</td></tr>"
            + (f"<tr><td><b>Everything in RAM</b></td><td>{size(plan.everything)}</td></tr>" if plan.record else "")
            + f"<tr><td><b>This computer</b></td><td>{size(m.total)} of RAM, {size(m.usable)} usable now</td></tr>"
            "</table>")
        value = self._preset if self._preset >= plan.floor else plan.recommended
        self._preset = 0
        self.spin.setValue(_mib(value))
        self._changed()

    def budget(self) -> int:
        """Bytes; never below the floor. The spin box shows whole MiB: a value that shows as the
        recommendation is the recommendation, exactly."""
        if self.plan is None:
            return 0
        if self.spin.value() == _mib(self.plan.recommended):
            return self.plan.recommended
        return max(self.plan.floor, self.spin.value() * MIB)

    def _changed(self, *_):
        if self.plan is None:
            return
        b = self.state.budget = self.budget()
        if b > self.plan.machine.usable:
            self.verdict.setText(colour(f"More than the {size(self.plan.machine.usable)} this computer can use "
                                        "now: other programs would be pushed out of memory and everything "
                                        "would slow down.", ORANGE))
        elif b == self.plan.recommended:
            self.verdict.setText("The recommended budget: safe for this computer.")
        else:
            self.verdict.setText("")
        self.completeChanged.emit()

    def isComplete(self) -> bool:
        return self.plan is not None and self.state.budget >= self.plan.floor
