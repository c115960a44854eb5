"""Issue 34's smaller items, driven in the window: File → Quit (Ctrl+Q), an
answer's tok/s without the prompt's time, Enter in the inline editor, dates
in the conversation list, arrow keys that open the chat they move to."""
from __future__ import annotations

import time

from PySide6.QtCore import Qt

from app.ui.chat_view import turn_figures
from app.ui.conversation_list import DATE_ROLE, when

LONG = 60000


def _send(qtbot, w, text):
    with qtbot.waitSignal(w.answer_finished, timeout=LONG) as sig:
        w.send_text(text)
    return sig.args[0]


def test_quit_is_in_the_file_menu_with_its_standard_keys(make_window):
    w = make_window(None)
    assert w.quit_action.text() == "Quit"
    assert w.quit_action.shortcut().toString() == "Ctrl+Q"
    w.quit_action.trigger()
    assert not w.isVisible()


def test_an_answers_rate_leaves_out_the_prompts_time():
    # 11 tokens in 5 s, the first after 3 s of reading the prompt: 10 tokens in the last 2 s
    assert "5.0 tok/s" in turn_figures({"turn_tokens": 11, "turn_seconds": 5.0, "ttft_s": 3.0})
    assert "2.0 tok/s" in turn_figures({"turn_tokens": 10, "turn_seconds": 5.0})   # older answers: as before


def test_dates_are_short_and_relative():
    now = time.mktime((2026, 12, 6, 15, 0, 0, 0, 0, -1))
    at = lambda *d: time.mktime(d + (0, 0, -1))  # noqa: E731
    assert when(at(2026, 12, 6, 9, 5, 0), now) == "09:05"
    assert when(at(2026, 12, 5, 23, 0, 0), now) == "Yesterday"
    assert when(at(2026, 12, 2, 12, 0, 0), now) == time.strftime("%a", time.localtime(at(2026, 12, 2, 12, 0, 0)))
    assert when(at(2026, 3, 1, 12, 0, 0), now) == time.strftime("%d %b", time.localtime(at(2026, 3, 1, 12, 0, 0)))
    assert when(at(2025, 3, 1, 12, 0, 0), now) == "2025-03-01"


def test_enter_in_the_inline_editor_resends_and_the_list_follows_the_arrow_keys(qtbot, make_window, tiny_chat):
    w = make_window(tiny_chat, max_tokens=3)
    _send(qtbot, w, "w10 w11")
    first = w.chat.id
    question = w.chat_view.widgets[0]
    question._begin_edit()
    question.editor.setPlainText("w12 w13")
    qtbot.keyClick(question.editor, Qt.Key.Key_Return, Qt.KeyboardModifier.ShiftModifier)   # a new line
    assert question.editor.toPlainText().count("\n") == 1 and question.editor.isVisible()
    with qtbot.waitSignal(w.answer_finished, timeout=LONG):
        qtbot.keyClick(question.editor, Qt.Key.Key_Return)                                # saves and resends
    assert w.chat.visible()[0].content == "w12 w13" and w.chat.visible()[0].id != question.message_id
    assert w.composer.hasFocus()                     # not the search box
    w.new_chat()
    _send(qtbot, w, "w20 w21")
    second = w.chat.id
    assert w.conv_list.item(0).data(DATE_ROLE) == when(time.time())
    w.conv_list.setFocus()
    w.conv_list.setCurrentRow(0)
    qtbot.keyClick(w.conv_list, Qt.Key.Key_Down)
    assert w.chat.id == first
    qtbot.keyClick(w.conv_list, Qt.Key.Key_Up)
    assert w.chat.id == second


def test_rename_asks_in_a_dialog_with_a_short_title(make_window, monkeypatch):
    from PySide6.QtWidgets import QInputDialog

    w = make_window(None)
    long = "A rather long conversation title that goes on and on"
    cid = w.store.create_conversation(long, model="")
    w.refresh_list()
    seen = []
    monkeypatch.setattr(QInputDialog, "getText",
                        lambda parent, title, label, **k: seen.append((title, k.get("text"))) or ("Short", True))
    w.rename_conversation(cid)
    assert seen == [("Rename the chat", long)] and w.store.conversation(cid).title == "Short"
    assert w.conv_list.item(0).text() == "Short"


def test_one_model_has_one_name(make_window, tiny_chat):
    """The switcher, the status bar and the answers' headers call a model from the library by the same name."""
    w = make_window(tiny_chat, model_folders=[str(tiny_chat.parent)])
    assert w.model_info.name == w.model_combo.currentText() == "chat"
    assert w.model_label.text().startswith("chat · ") and w.controller.model_name == "chat"


def test_expert_options_show_only_for_a_model_with_experts(qtbot, make_window, tiny_chat, tiny_moe):
    dense = make_window(tiny_chat)
    d = dense.models.open_model_settings()
    qtbot.addWidget(d)
    assert not d.form.isRowVisible(d.experts) and not d.form.isRowVisible(d.margin)
    assert d.form.isRowVisible(d.temperature)
    d.reject()
    moe = make_window(tiny_moe[1])
    d = moe.models.open_model_settings()
    qtbot.addWidget(d)
    assert d.form.isRowVisible(d.experts) and d.form.isRowVisible(d.margin)
    d.reject()
