"""The window's seed, stop sequences and token probabilities, on a real engine
(a tiny model): the settings dialog edits them, a seed makes Regenerate repeat a sampled
answer, and each answer's token probabilities are shown under it (the
alternatives of the token under the mouse), kept across a restart. The same
figures in the other front ends: tests/ui/test_front_end_matrix.py."""
from __future__ import annotations

import json

from app.chat import token_probs as tp
from app.chat.turn import token_bytes
from app.store.settings import Settings
from app.ui.settings_dialog import SettingsDialog
from tests.ui.conftest import close_window, on_gui

LONG = 60000


def test_settings_dialog_edits_the_seed_stops_and_token_probabilities(qtbot):
    d = SettingsDialog(Settings(seed=42, token_probabilities=True, token_alternatives=4))
    qtbot.addWidget(d)
    assert d.seed.value() == 42 and d.token_probs.isChecked() and d.token_alternatives.value() == 4
    out = d.result_settings()
    assert (out.seed, out.token_probabilities, out.token_alternatives) == (42, True, 4)
    d.seed.setValue(-1)                      # shown as "Random"
    d.token_probs.setChecked(False)
    assert d.seed.text() == "Random" and not d.token_alternatives.isEnabled()
    out = d.result_settings()
    assert out.seed is None and not out.token_probabilities
    d.seed.setValue(0)
    assert d.result_settings().seed == 0
    d.stop.setPlainText("###\n\\n\\nUser:")
    assert d.result_settings().stop == ["###", "\n\nUser:"]
    d.close()
    again = SettingsDialog(Settings(stop=["\n\nUser:"]))
    qtbot.addWidget(again)
    assert again.stop.toPlainText() == "\\n\\nUser:" and again.result_settings().stop == ["\n\nUser:"]
    again.close()


def test_the_settings_dialog_fits_a_small_laptop_screen(qtbot):
    """A 13-inch MacBook Air leaves about 850 points of height for a window; every row on one page
    had grown the dialog to about 900 px. Its pages (Engine, Answers, Tools) keep it well under that."""
    d = SettingsDialog(Settings(engine="remote", token_probabilities=True))
    qtbot.addWidget(d)
    d.show()
    assert d.pages.count() == 3 and d.height() <= 700 and d.sizeHint().height() <= 700
    d.close()


def _answer(qtbot, w, send):
    done = []
    on_gui(w.worker.worker.turn_done, done.append)
    with qtbot.waitSignal(w.answer_finished, timeout=LONG):
        send()
    qtbot.waitUntil(lambda: bool(done), timeout=10000)
    return done[-1]


def test_a_seed_makes_regenerate_repeat_a_sampled_answer(qtbot, make_window, tiny_chat):
    w = make_window(tiny_chat, temperature=1.5, top_k=0, top_p=1.0, min_p=0.0, seed=11, max_tokens=12)
    first = _answer(qtbot, w, lambda: w.send_text("w10 w11 w12"))
    again = _answer(qtbot, w, lambda: w.regenerate(w.chat.visible()[-1].id))
    assert again.token_ids == first.token_ids and first.token_ids
    w.settings = Settings(**{**w.settings.__dict__, "seed": 12})
    other = _answer(qtbot, w, lambda: w.regenerate(w.chat.visible()[-1].id))
    w.settings = Settings(**{**w.settings.__dict__, "temperature": 0.0, "seed": None})
    greedy = _answer(qtbot, w, lambda: w.regenerate(w.chat.visible()[-1].id))
    # sampling at 1.5 on a random model: another seed, or greedy, answers otherwise
    assert other.token_ids != first.token_ids or greedy.token_ids != first.token_ids


def test_the_window_shows_each_tokens_probability_and_alternatives(qtbot, make_window, tiny_chat, tmp_path):
    db = tmp_path / "history.sqlite3"
    w = make_window(tiny_chat, db, token_probabilities=True, token_alternatives=3, max_tokens=8)
    done = _answer(qtbot, w, lambda: w.send_text("w10 w11 w12"))
    assert len(done.logprobs) == len(done.token_ids) == 8
    shown = w.chat.visible()[-1]
    kept = tp.from_stats(shown.stats)
    assert [round(t.logprob, 9) for t in kept] == [round(lp.logprob, 9) for _, lp in done.logprobs]
    assert all(len(t.alternatives) == 3 for t in kept)
    tokenizer = w.worker.worker.model.tokenizer
    assert [t.text for t in kept] == [token_bytes(tokenizer, i).decode("utf-8", "replace") for i in done.token_ids]
    panel = w.chat_view.widgets[-1].probs
    assert panel.isVisible() and not panel.expanded and "8 tokens" in panel.toggle.text()
    panel.toggle.click()
    assert panel.tokens_label.isVisible() and panel.tokens_label.text().count("href='tok:") == 8
    panel.tokens_label.linkHovered.emit("tok:2")          # the mouse over the third token
    assert panel.detail.text() == tp.describe(kept[2])
    panel.tokens_label.linkActivated.emit("tok:5")        # a click pins it
    panel.tokens_label.linkHovered.emit("")
    assert panel.detail.text() == tp.describe(kept[5]) and panel.selected == 5
    assert not w.chat_view.widgets[0].probs.isVisible()        # the question has none
    exported = json.loads(w.export_chat(tmp_path / "chat.json", "json").read_text())
    assert [e["logprob"] for e in exported["messages"][-1]["logprobs"]] == [t.logprob for t in kept]
    assert exported["sampling"]["seed"] is None
    cid = w.chat.id
    close_window(w)
    # kept with the answer: shown again after a restart
    w2 = make_window(None, db, token_probabilities=False)
    w2.open_conversation(cid)
    assert tp.from_stats(w2.chat.visible()[-1].stats) == kept
    assert w2.chat_view.widgets[-1].probs.isVisible()
