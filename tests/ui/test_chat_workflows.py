"""Issue 34's conveniences, driven in the window: other chats while an answer
streams, Continue, Fork, and the marker of a system prompt in effect."""
from __future__ import annotations

from PySide6.QtCore import Qt

from app.ui.conversation_list import DATE_ROLE, WRITING
from tests.ui.conftest import on_gui

LONG = 60000


def _send(qtbot, w, text):
    with qtbot.waitSignal(w.answer_finished, timeout=LONG) as sig:
        w.send_text(text)
    return sig.args[0]


def _row(w, cid):
    return next(w.conv_list.item(i) for i in range(w.conv_list.count())
                if w.conv_list.item(i).data(Qt.ItemDataRole.UserRole) == cid)


def test_other_chats_while_an_answer_streams(qtbot, make_window, demo_container):
    w = make_window(demo_container, max_tokens=4)
    _send(qtbot, w, "Say hello.")
    older = w.chat.id
    older_text = [m.content for m in w.chat.visible()]
    w.settings.max_tokens = 300
    w.new_chat()
    streamed = []
    on_gui(w.worker.worker.response_text, streamed.append)
    w.send_text("Describe the moon in detail.")
    writing = w.chat.id
    qtbot.waitUntil(lambda: len(streamed) >= 1, timeout=LONG)
    assert w.new_btn.isEnabled() and w.conv_list.isEnabled()
    qtbot.mouseClick(w.new_btn, Qt.MouseButton.LeftButton)             # a new chat while it streams
    assert w.chat.id is None and not w.chat_view.widgets and w.busy
    assert w.stop_btn.isEnabled() and not w.send_btn.isEnabled()
    assert "Answering in “Describe the moon in detail.”" in w.statusBar().currentMessage()
    assert _row(w, writing).data(DATE_ROLE) == WRITING
    w.composer.setPlainText("a draft")
    w.send()                                                            # one answer at a time: the draft waits
    assert w.composer.toPlainText() == "a draft" and "Wait for the answer in" in w.statusBar().currentMessage()
    w.conv_list.setCurrentItem(_row(w, older))                          # reading another chat
    assert w.chat.id == older and [x.record.content for x in w.chat_view.widgets] == older_text
    n = len(streamed)
    qtbot.waitUntil(lambda: len(streamed) > n, timeout=LONG)           # it keeps streaming, into its own chat
    assert [x.record.content for x in w.chat_view.widgets] == older_text
    w.conv_list.setCurrentItem(_row(w, writing))                        # back: the live answer
    assert w.chat is w.controller.writing and w.chat_view.widgets[-1].note.full_text == "writing…"
    w.conv_list.setCurrentItem(_row(w, older))
    with qtbot.waitSignal(w.answer_finished, timeout=LONG) as sig:
        qtbot.keyClick(w.composer, Qt.Key.Key_Escape)                   # Esc stops it from another chat
    assert sig.args[0] == "cancelled" and w.chat.id == older
    assert w.statusBar().currentMessage().startswith("The answer in “Describe the moon in detail.” is done")
    assert _row(w, writing).data(DATE_ROLE) != WRITING and w.send_btn.isEnabled()
    w.open_conversation(writing)
    answer = w.chat.visible()[-1]
    assert answer.status == "cancelled" and answer.content == "".join(streamed) != ""    # nothing lost
    assert w.store.messages(writing)[-1].content == answer.content


def test_continue_fork_and_the_setup_marker(qtbot, make_window, demo_container):
    from dataclasses import replace

    w = make_window(demo_container, max_tokens=4)
    assert not w.composer_bar.setup_label.isVisible()
    assert _send(qtbot, w, "Name three colours.") == "length"
    cut = w.chat.visible()[-1]
    cut_id, cut_text = cut.id, cut.content
    answer = w.chat_view.widgets[-1]
    assert answer.continue_btn.isVisible() and not w.chat_view.widgets[0].continue_btn.isVisible()
    with qtbot.waitSignal(w.answer_finished, timeout=LONG) as sig:
        qtbot.mouseClick(answer.continue_btn, Qt.MouseButton.LeftButton)
    went_on = w.chat.visible()[-1]
    assert went_on.id == cut_id and went_on.content.startswith(cut_text) and len(went_on.content) > len(cut_text)
    assert len(w.chat.visible()) == 2 and went_on.stats["continued"] == 1 and sig.args[0] in ("length", "stop")
    source = w.chat.id
    qtbot.mouseClick(w.chat_view.widgets[0].fork_btn, Qt.MouseButton.LeftButton)     # Fork at the question
    assert w.chat.id != source and w.title_label.full_text == "Name three colours. (fork)"
    assert [(x.record.role, x.record.content) for x in w.chat_view.widgets] == [("user", "Name three colours.")]
    assert w.conv_list.count() == 2 and w.conv_list.currentItem().data(Qt.ItemDataRole.UserRole) == w.chat.id
    # the marker: a system prompt, then a preset that sets it
    key = w.model_key()
    w.apply_settings(replace(w.settings, system_prompt="Talk like a pirate, always, in every answer you write."))
    assert w.composer_bar.setup_label.isVisible()
    assert w.composer_bar.setup_label.text() == "⚙ System prompt: Talk like a pirate, always, in every answer you write."
    pirate = {"system_prompt": "Arr.", "temperature": 0.0}
    w.apply_settings(replace(w.settings, system_prompt="", presets={"Pirate": pirate},
                             model_settings={key: pirate}))
    assert w.composer_bar.setup_label.text() == "⚙ Preset “Pirate” · System prompt: Arr."
    assert "Arr." in w.composer_bar.setup_label.toolTip()
    w.apply_settings(replace(w.settings, model_settings={}))
    assert not w.composer_bar.setup_label.isVisible()


def test_the_documents_panel_attaches_shared_collections_and_shares_a_chats_files(qtbot, make_window, tiny_chat,
                                                                                   tmp_path):
    (tmp_path / "boiler.md").write_text("# Boiler\n\nThe boiler is serviced every October.\n")
    (tmp_path / "garden.md").write_text("# Garden\n\nThe apple trees are pruned in February.\n")
    w = make_window(tiny_chat)
    docs = w.controller.documents()
    docs.add("house", [tmp_path / "boiler.md"])
    panel = w.open_documents()                        # a new chat: saved so files can belong to it
    first = w.chat.id
    assert panel.shared_list.count() == 1 and panel.shared_list.item(0).checkState() == Qt.CheckState.Unchecked
    panel.shared_list.item(0).setCheckState(Qt.CheckState.Checked)
    assert docs.attached(first) == ["house"] and panel.shared_list.item(0).text() == "house  —  1 chat"
    panel.close()
    w.new_chat()
    panel = w.open_documents()
    second = w.chat.id
    panel.shared_list.item(0).setCheckState(Qt.CheckState.Checked)
    assert docs.attached_to("house") == [first, second] and w.controller.has_documents()
    docs.add(w.controller.collection(), [tmp_path / "garden.md"])
    panel.refresh()
    assert panel.files_list.count() == 1
    assert panel.share("garden")                      # "Share as a collection…"
    assert panel.files_list.count() == 0 and docs.attached(second) == ["garden", "house"]
    assert [panel.shared_list.item(i).text() for i in range(2)] == ["garden  —  1 chat", "house  —  2 chats"]
    assert not panel.share_btn.isEnabled() and not panel.share("house") and "no files" in panel.status.text()
    docs.add(w.controller.collection(), [tmp_path / "garden.md"])
    panel.refresh()
    assert panel.share_btn.isEnabled() and not panel.share("house") and "already" in panel.status.text()
    panel.close()


def test_one_model_one_name_and_the_switcher_keeps_a_model_converted_elsewhere(qtbot, make_window, tiny_chat,
                                                                               demo_container, demo_gguf):
    from app.convert.validate import validate_source
    from app.model import LoadedModel
    from app.server.run import model_id_for
    from app.ui.wizard.source_page import describe

    m = LoadedModel(tiny_chat)        # converted from a folder "ckpt" into "chat.ferry"
    try:
        assert m.name == "chat" == model_id_for(m) and m.source_name == "ckpt"
    finally:
        m.close()
    w = make_window(demo_container)   # neither model is in the library's folders
    assert w.model_info.name == "smollm2" and w.model_combo.currentText() == "smollm2"
    # the wizard converted a model into a folder of the user's: at its end the model opens, and the
    # switcher keeps listing it after another model opens
    with qtbot.waitSignal(w.model_loaded, timeout=LONG):
        w.models._wizard_model_ready(str(tiny_chat), w.settings.ram_budget)
    assert w.model_info.name == "chat" and str(tiny_chat.parent) in w.settings.model_folders
    with qtbot.waitSignal(w.model_loaded, timeout=LONG):
        w.switch_model(demo_container)
    names = [w.model_combo.itemText(i) for i in range(w.model_combo.count())]
    assert "chat" in names and w.model_combo.currentText() == "smollm2"
    # the wizard names the demo by its own name, not "gguf:llama"
    text = describe(validate_source(demo_gguf))
    assert "gguf:" not in text and "SmolLM2-135M-Instruct.Q4_1 (llama)" in text


def test_settings_offer_the_context_policy(make_window):
    from app.ui.settings_dialog import SettingsDialog

    w = make_window(None)
    d = SettingsDialog(w.settings, None, w)
    assert d.context_policy.currentData() == "drop_oldest"       # the default: leave the oldest turns out
    d.context_policy.setCurrentIndex(d.context_policy.findData("summarise"))
    s = d.result_settings()
    assert s.context_policy == "summarise"
    w.apply_settings(s)
    start = w.controller.send("hello")
    assert w.controller.request(start).context == "summarise"
    w.controller.finish("cancelled")
    d.close()


def test_the_switcher_elides_a_long_name_instead_of_cutting_it(make_window, demo_container):
    w = make_window(demo_container)
    combo = w.model_combo
    assert combo.shown_text() == combo.currentText() == "smollm2" and "smollm2" in combo.toolTip()
    combo.setItemText(combo.currentIndex(), "smollm2-135m-instruct-with-a-long-name")
    combo.setFixedWidth(110)
    assert combo.shown_text().endswith("…") and combo.shown_text() != combo.currentText()
    combo.grab()      # paints without error
