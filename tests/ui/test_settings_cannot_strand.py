"""Settings that cannot strand the user (issue 34): the budget field refuses a
value below the open model's floor, in words with the floor and the
recommended budget, and a model that fails to open leaves the one that was
open working."""
from __future__ import annotations

from dataclasses import replace

from PySide6.QtWidgets import QMessageBox

from app.units import size

MIB = 1 << 20


def test_the_budget_field_refuses_a_value_below_the_floor(qtbot, make_window, demo_container):
    w = make_window(demo_container)
    d = w.open_settings()
    qtbot.addWidget(d)
    floor, rec = w.memory.floor, w.memory.recommended
    assert floor > 2 * MIB
    assert d.save_btn.isEnabled() and "With no budget set" in d.budget_note.text()
    d.budget.setValue(1)                                   # 1 MiB
    note = d.budget_note.text()
    assert not d.save_btn.isEnabled()
    assert f"below this model's floor of {size(floor)}" in note and f"recommended budget is {size(rec)}" in note
    d.accept()
    assert d.isVisible()                                   # not saved, not closed
    d.budget.setValue(-(-floor // MIB))                    # the floor, rounded up to whole MiB
    assert d.save_btn.isEnabled() and "With no budget set" not in d.budget_note.text()   # a budget is set
    d.budget.setValue(0)
    assert d.save_btn.isEnabled()
    d.reject()


def test_a_model_that_cannot_open_leaves_the_open_one_working(qtbot, make_window, demo_container, monkeypatch,
                                                              tmp_path):
    import shutil

    warnings = []
    monkeypatch.setattr(QMessageBox, "warning", lambda _p, title, text, *a: warnings.append(text))
    w = make_window(demo_container, max_tokens=3)
    before = w.model_info
    # a budget below the floor saved some other way (e.g. an old settings file): refused, the model stays open
    with qtbot.waitSignal(w.model_loaded, timeout=60000) as sig:
        w.apply_settings(replace(w.settings, ram_budget=1 * MIB))
    assert sig.args[0].path == before.path and w.model_info is not None
    assert "below this model's floor" in warnings[-1] and "stays open" in warnings[-1]
    assert w.stack.currentWidget() is w.chat_page and w.send_btn.isEnabled()
    # a model that fails to open after the open one was closed (its largest file cut short): it is reopened
    broken = shutil.copytree(demo_container, tmp_path / "broken.ferry")
    biggest = max((p for p in broken.rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)
    with open(biggest, "r+b") as f:
        f.truncate(biggest.stat().st_size // 3)
    with qtbot.waitSignal(w.model_loaded, timeout=60000) as sig:
        w.switch_model(broken)
    assert sig.args[0].path == before.path and "stays open" in warnings[-1]
    with qtbot.waitSignal(w.answer_finished, timeout=60000) as done:
        w.send_text("Hello")
    assert done.args[0] in ("stop", "length")
