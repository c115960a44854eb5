"""The window as a daily driver (issue 16), clicked as a user clicks: Export in
both formats, switching models during an answer, dropping a GGUF file, Enter
and Shift+Enter, citation links after reopening, long titles, the model
library, per-model settings and presets."""
from __future__ import annotations

import json
import shutil

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QFileDialog, QMessageBox

from app.store.crypto import KeychainKeys
from app.store.history import HistoryStore
from tests.ui.conftest import close_window, drop, on_gui, quick_settings
from tests.ui.test_chat_window import LONG, send


def test_export_both_formats_by_clicking(qtbot, make_window, tiny_chat, tmp_path, monkeypatch):
    w = make_window(tiny_chat, max_tokens=6)
    send(qtbot, w, "w10 w11 w12")
    answer = w.chat.visible()[-1]
    note = w.chat_view.widgets[-1].note.full_text     # the answer's own figures, time to first token included
    assert f"{answer.stats['turn_tokens']} tokens" in note and "tok/s" in note and "first token after" in note
    bubble = w.chat_view.widgets[-1]           # the figures never push the buttons out of the bubble
    qtbot.waitUntil(lambda: bubble.action_btn.geometry().right() <= bubble.width())
    assert w.chat_view.inner.width() <= w.chat_view.viewport().width()
    for fmt, filt in (("md", "Markdown (*.md)"), ("json", "JSON (*.json)")):
        target = tmp_path / f"out-{fmt}"                 # no suffix typed: the chosen format adds it
        monkeypatch.setattr(QFileDialog, "getSaveFileName", lambda *a, t=target, f=filt, **k: (str(t), f))
        w.export_btn.click()
        out = target.with_name(target.name + f".{fmt}")
        assert out.exists(), fmt
        text = out.read_text(encoding="utf-8")
        if fmt == "md":
            assert text.startswith(f"# {w.chat.title}") and "## You" in text and "w10 w11 w12" in text
            assert answer.content.strip() in text
        else:
            doc = json.loads(text)
            assert doc["format"] == "ferry-chat" and doc["title"] == w.chat.title
            assert doc["model"] == w.model_info.name
            assert doc["sampling"]["temperature"] == 0.0 and doc["sampling"]["max_tokens"] == 6
            roles = [m["role"] for m in doc["messages"]]
            assert roles == ["user", "assistant"]
            a = doc["messages"][1]
            assert a["content"] == answer.content and a["status"] == answer.status
            assert a["tokens"]["answer"] == answer.stats["turn_tokens"] > 0 and a["tokens"]["prompt"] > 0
            assert a["time_to_first_token_s"] > 0


def test_switch_model_during_a_streaming_answer(qtbot, make_window, demo_container, tiny_chat):
    w = make_window(demo_container, max_tokens=300,
                    model_folders=[str(demo_container.parent), str(tiny_chat.parent)])
    names = [w.model_combo.itemText(i) for i in range(w.model_combo.count())]
    assert names and "chat" in names and w.model_combo.currentText() == "smollm2"
    chunks: list[str] = []
    tiny = names.index("chat")

    def switch(text):
        chunks.append(text)
        if len(chunks) == 2:
            w.model_combo.setCurrentIndex(tiny)
            w.model_combo.activated.emit(tiny)         # what choosing it in the combo does

    on_gui(w.worker.worker.response_text, switch)
    with qtbot.waitSignal(w.model_loaded, timeout=LONG) as loaded:
        with qtbot.waitSignal(w.answer_finished, timeout=LONG) as finished:
            w.send_text("Tell me a long story about a lighthouse keeper.")
    assert finished.args[0] == "cancelled"
    assert loaded.args[0].path == str(tiny_chat)
    m = w.chat.visible()[-1]
    assert m.status == "cancelled" and m.content == "".join(chunks)   # what was streamed is kept
    assert not w.chat.busy and w.send_btn.isEnabled() and w.model_combo.currentText() == "chat"
    assert w.load_bar.isHidden()
    # the new engine answers the next question
    assert send(qtbot, w, "w10 w11") in ("stop", "length")
    # and it is the most recently used in the library
    assert w.library.entries()[0].name == "chat"
    # back to the first model from the Model menu
    w.models.fill()
    action = next(a for a in w.model_menu.actions() if a.text() == "smollm2")
    assert not action.isChecked()
    with qtbot.waitSignal(w.model_loaded, timeout=LONG) as loaded:
        action.trigger()
    assert loaded.args[0].path == str(demo_container) and w.model_combo.currentText() == "smollm2"
    w.models.fill()
    assert next(a for a in w.model_menu.actions() if a.text() == "smollm2").isChecked()


def _drop(w, path):
    """Drag ``path`` over the window and drop it (as the platform's drag and drop delivers it)."""
    return drop(w, path)


def test_dropping_a_gguf_starts_the_wizard_on_it(qtbot, make_window, demo_gguf, tiny_chat, tmp_path):
    w = make_window(None)
    junk = tmp_path / "notes.txt"
    junk.write_text("hello")
    assert not _drop(w, junk).isAccepted() and w.models.wizard is None
    _drop(w, demo_gguf)
    wiz = w.models.wizard
    assert wiz is not None and wiz.isVisible()
    qtbot.addWidget(wiz)
    assert wiz.currentPage() is wiz.source_page
    assert wiz.source_page.current_kind() == "gguf"
    assert wiz.source_page.path_edit.text() == str(demo_gguf)
    qtbot.waitUntil(lambda: wiz.source_page.isComplete(), timeout=60000)   # the source was checked
    assert wiz.state.report is not None and wiz.state.report.n_experts == 0
    wiz.state.remember = False
    wiz.reject()
    # a checkpoint folder starts it too, as a Hugging Face checkpoint
    ckpt = tiny_chat.parent / "ckpt"
    _drop(w, ckpt)
    wiz = w.models.wizard
    qtbot.addWidget(wiz)
    assert wiz.isVisible() and wiz.source_page.current_kind() == "hf"
    assert wiz.source_page.path_edit.text() == str(ckpt)
    qtbot.waitUntil(lambda: wiz.source_page.isComplete(), timeout=60000)
    wiz.state.remember = False
    wiz.reject()
    # a converted model opens
    with qtbot.waitSignal(w.model_loaded, timeout=LONG) as loaded:
        _drop(w, tiny_chat)
    assert loaded.args[0].path == str(tiny_chat)


def test_enter_sends_and_shift_enter_makes_a_new_line(qtbot, make_window, tiny_chat):
    w = make_window(tiny_chat, max_tokens=3)
    c = w.composer
    c.setFocus()
    qtbot.keyClicks(c, "w10")
    qtbot.keyClick(c, Qt.Key.Key_Return, Qt.KeyboardModifier.ShiftModifier)
    qtbot.keyClicks(c, "w11")
    assert c.toPlainText() == "w10\nw11" and not w.chat.busy
    with qtbot.waitSignal(w.answer_finished, timeout=LONG):
        qtbot.keyClick(c, Qt.Key.Key_Return)
    assert w.chat.visible()[0].content == "w10\nw11" and c.toPlainText() == ""
    assert "Enter sends" in c.placeholderText()
    # swapped in the settings: Enter is a new line, Shift+Enter sends
    s = quick_settings(max_tokens=3, enter_sends=False)
    w.apply_settings(s)
    qtbot.keyClicks(c, "w12")
    qtbot.keyClick(c, Qt.Key.Key_Return)
    qtbot.keyClicks(c, "w13")
    assert c.toPlainText() == "w12\nw13" and not w.chat.busy
    with qtbot.waitSignal(w.answer_finished, timeout=LONG):
        qtbot.keyClick(c, Qt.Key.Key_Return, Qt.KeyboardModifier.ShiftModifier)
    assert w.chat.visible()[2].content == "w12\nw13"


def test_reopened_app_shows_the_citation_links(qtbot, make_window, demo_container, tmp_path, memory_keyring):
    doc = tmp_path / "manual.md"
    doc.write_text("# Kettle manual\n\nThe water tank of the kettle holds 3.5 litres. "
                   "Descale the kettle every month with white vinegar.\n")
    db = tmp_path / "h.sqlite3"
    w = make_window(demo_container, db=db, max_tokens=24)
    panel = w.open_documents()
    qtbot.addWidget(panel)
    assert panel.windowTitle() == "Documents — New chat"       # the chat's name, not its id
    with qtbot.waitSignal(panel.indexing_finished, timeout=60000):
        panel.add_paths([str(doc)])
    assert "1 passage" in panel.files_list.item(0).text() and "1 passages" not in panel.files_list.item(0).text()
    panel.close()
    send(qtbot, w, "How many litres does the water tank hold?")
    # a chat started with Attach… is titled from its first question
    assert w.chat.title.startswith("How many litres")
    assert w.store.conversation(w.chat.id).title == w.chat.title
    answer = w.chat.visible()[-1]
    before = w.controller.citations[answer.id]
    html_before = w.chat_view.widgets[-1].body.toHtml()
    cid = w.chat.id
    close_window(w)
    w2 = make_window(demo_container, db=db, max_tokens=24)
    w2.open_conversation(cid)
    after = w2.controller.citations.get(answer.id)
    assert after and [c.as_dict() for c in after] == [c.as_dict() for c in before]
    assert ("cite:" in w2.chat_view.widgets[-1].body.toHtml()) == ("cite:" in html_before)
    dialog = w2.show_citation(answer.id, after[0].n)
    qtbot.addWidget(dialog)
    assert dialog.highlighted_text() == after[0].passage
    dialog.close()
    # and the export carries them
    # and the export keeps what was shown: the markers, and only the sources the answer cites
    from app.controller.passages import mark_citations

    shown, used = mark_citations(answer.content, after)
    last = json.loads(w2.export_chat(tmp_path / "cited.json").read_text(encoding="utf-8"))["messages"][-1]
    assert [c["passage"] for c in last["passages"]] == [c.passage for c in after]
    assert last["content"] == shown and [c["n"] for c in last.get("citations", [])] == [c.n for c in used]
    md = w2.export_chat(tmp_path / "cited.md").read_text(encoding="utf-8")
    assert shown.strip() in md and ("**Sources**" in md) == bool(used) and ("manual.md" in md) == bool(used)


def test_long_titles_are_elided_with_an_ellipsis(qtbot, make_window, tiny_chat):
    w = make_window(tiny_chat, max_tokens=2)
    send(qtbot, w, "w10")
    long = "Ein sehr langer Titel über Überlandleitungen " * 6
    w.rename_conversation(title=long)
    qtbot.waitUntil(lambda: w.title_label.text().endswith("…"))
    shown = w.title_label.text()
    assert long.strip().startswith(shown[:-1].rstrip()) and len(shown) < len(long)
    assert w.title_label.full_text == long.strip()


def test_model_library_rename_and_remove(qtbot, make_window, tiny_chat, tmp_path, monkeypatch):
    folder = tmp_path / "models"
    shutil.copytree(tiny_chat, folder / "spare.ferry")
    w = make_window(tiny_chat, model_folders=[str(folder), str(tiny_chat.parent)])
    d = w.models.open_library()
    qtbot.addWidget(d)
    names = [d.table.item(r, 0).text() for r in range(d.table.rowCount())]
    assert "chat  (open)" in names and "spare" in names
    assert d.table.item(names.index("spare"), 2).text() != "unknown"     # the RAM floor
    d.select("spare")
    d.rename_selected("kept copy")
    assert (folder / "kept copy").is_dir()
    d.select("kept copy")
    monkeypatch.setattr(QMessageBox, "question", lambda *a, **k: QMessageBox.StandardButton.Cancel)
    assert d.remove_selected() == 0 and (folder / "kept copy").exists()
    monkeypatch.setattr(QMessageBox, "question", lambda *a, **k: QMessageBox.StandardButton.Yes)
    freed = d.remove_selected()
    assert freed > 0 and not (folder / "kept copy").exists() and "freed" in d.note.text()
    # the removed model leaves the model menu; the open one stays (tiny_chat's folder is shared with other
    # session fixtures, which may hold other models: only these two names are checked)
    listed = [w.model_combo.itemText(i) for i in range(w.model_combo.count())]
    assert "chat" in listed and not any(n in ("spare", "kept copy") for n in listed)
    d.close()
    # Open switches to the chosen model; Convert a model… opens the wizard
    shutil.copytree(tiny_chat, folder / "second")
    d = w.models.open_library()
    qtbot.addWidget(d)
    d.select("second")
    with qtbot.waitSignal(w.model_loaded, timeout=LONG) as loaded:
        d.open_btn.click()
    assert loaded.args[0].path == str(folder / "second") and not d.isVisible()
    d = w.models.open_library()
    qtbot.addWidget(d)
    d.convert_btn.click()
    assert w.models.wizard is not None and w.models.wizard.isVisible()
    qtbot.addWidget(w.models.wizard)
    w.models.wizard.state.remember = False
    w.models.wizard.reject()


def test_per_model_settings_reset_and_presets(qtbot, make_window, tiny_chat):
    w = make_window(tiny_chat, max_tokens=3)
    d = w.models.open_model_settings()
    qtbot.addWidget(d)
    assert d.windowTitle() == f"Settings for {w.model_info.name}"
    d.temperature.setValue(1.3)
    d.system.setPlainText("Answer in w40.")
    d.experts.setValue(2)
    d.margin.setValue(0.05)
    d.save_preset("Loose")
    d.accept()
    key = w.model_info.path
    assert w.settings.model_settings[key]["temperature"] == 1.3
    assert w.settings.presets["Loose"]["experts_per_token"] == 2
    assert w.effective().temperature == 1.3 and w.settings.temperature == 0.0    # the general value is kept
    general = w.open_settings()
    qtbot.addWidget(general)
    assert general.model_note.isVisibleTo(general) and "its own settings" in general.model_note.text()
    general.reject()
    sent = []
    generate = w.worker.generate
    w.worker.generate = lambda req, **kw: (sent.append(req), generate(req, **kw))[1]
    send(qtbot, w, "w10")
    req = sent[0]
    assert req.sampling.temperature == 1.3 and req.experts_per_token == 2 and req.client == "window"
    assert req.cache_aware_margin == 0.05 and req.messages[0] == {"role": "system", "content": "Answer in w40."}
    d2 = w.models.open_model_settings()
    qtbot.addWidget(d2)
    d2.reset()
    assert d2.temperature.value() == 0.0 and d2.experts.value() == 0
    d2.apply_preset("Loose")
    assert d2.temperature.value() == 1.3
    d2.reset()
    d2.accept()
    assert key not in w.settings.model_settings and w.effective().temperature == 0.0
    assert "Loose" in w.settings.presets


def test_gauges_show_the_budget_actually_chosen(qtbot, make_window, tiny_chat):
    from app.memory.plan import plan_container
    from app.units import size

    w = make_window(tiny_chat, context_length=2048)          # no budget set: the one budget rule chooses
    chosen = plan_container(tiny_chat, w.model_info.n_ctx).recommended
    assert w.settings.ram_budget == 0 and w.memory.budget == chosen
    assert f"budget: {size(chosen)}" in w.gauges.ram_note.text()
