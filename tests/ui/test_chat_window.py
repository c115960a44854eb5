"""The window on the real engine: streaming, stop, branches, restart, gauges."""
from __future__ import annotations

import time

import pytest

from PySide6.QtCore import Qt

from app.chat.conversation import Chat
from app.memory.stats import StatsSample, TurnFigures
from app.store.crypto import KeychainKeys
from app.store.history import HistoryStore
from tests.ui.conftest import on_gui, close_window, reference_answer

LONG = 120_000  # ms


def wait_answer(qtbot, w, timeout=LONG) -> str:
    with qtbot.waitSignal(w.answer_finished, timeout=timeout) as blocker:
        pass
    return blocker.args[0]


def send(qtbot, w, text: str) -> str:
    with qtbot.waitSignal(w.answer_finished, timeout=LONG) as blocker:
        w.send_text(text)
    return blocker.args[0]


def test_send_streams_tokens_in_order(qtbot, make_window, demo_container):
    w = make_window(demo_container, max_tokens=16)
    chunks: list[str] = []
    on_gui(w.worker.worker.response_text, chunks.append)
    reason = send(qtbot, w, "Name three colours.")
    assert reason in ("stop", "length")
    expected, pieces = reference_answer(demo_container, [{"role": "user", "content": "Name three colours."}], 16)
    assert "".join(chunks) == expected == "".join(pieces)
    assert len(chunks) >= 1
    shown = w.chat.visible()
    assert [m.role for m in shown] == ["user", "assistant"]
    assert shown[1].content == expected and shown[1].status == reason
    # the view shows it, rendered from Markdown
    longest = max((t.strip("*_`.,:;!?") for t in expected.split()), key=len)
    assert longest in w.chat_view.widgets[-1].body.toPlainText()
    # and the store has it
    stored = w.store.messages(w.chat.id)
    assert stored[-1].content == expected


def test_stop_mid_answer_keeps_a_consistent_conversation(qtbot, make_window, demo_container):
    w = make_window(demo_container, max_tokens=400)
    got: list[str] = []

    def first(text):
        got.append(text)
        if len(got) == 2:
            w.stop()

    on_gui(w.worker.worker.response_text, first)
    reason = send(qtbot, w, "Tell me a long story about a lighthouse keeper.")
    assert reason == "cancelled"
    m = w.chat.visible()[-1]
    assert m.status == "cancelled" and m.content == "".join(got) and m.content
    assert not w.chat.busy and w.send_btn.isEnabled() and not w.stop_btn.isEnabled()
    assert w.store.messages(w.chat.id)[-1].content == m.content
    assert "Stopped" in w.chat_view.widgets[-1].note.full_text
    # the session is still usable: the next turn answers normally
    w.settings.max_tokens = 6
    assert send(qtbot, w, "Thanks.") in ("stop", "length")
    assert [x.role for x in w.chat.visible()] == ["user", "assistant", "user", "assistant"]


def test_stop_mid_prompt(qtbot, make_window, demo_container):
    w = make_window(demo_container, max_tokens=50)
    progress: list[tuple[int, int]] = []

    def on_progress(done, total):
        progress.append((done, total))
        if len(progress) == 1:
            w.stop()

    on_gui(w.worker.worker.prompt_progress, on_progress)
    t0 = time.monotonic()
    reason = send(qtbot, w, "Summarise this: " + "the quick brown fox jumps over the lazy dog. " * 40)
    assert reason == "cancelled"
    assert progress and progress[0][0] < progress[0][1]  # stopped before the prompt was all read
    m = w.chat.visible()[-1]
    assert m.role == "assistant" and m.content == "" and m.status == "cancelled"
    assert w.prompt_row.isHidden()
    assert time.monotonic() - t0 < 30


def test_prompt_progress_is_shown(qtbot, make_window, demo_container):
    w = make_window(demo_container, max_tokens=2)
    seen = []
    on_gui(w.worker.worker.prompt_progress, lambda d, t: seen.append((d, t, w.prompt_row.isVisible(), w.prompt_label.text())))
    send(qtbot, w, "Read this carefully: " + "one two three four five six seven eight. " * 12)
    assert len(seen) >= 2
    d, t, visible, label = seen[0]
    assert visible and f"{d} of {t} tokens" in label
    assert seen[-1][0] == seen[-1][1]


def test_regenerate_and_edit_make_the_right_tree(qtbot, make_window, tiny_chat):
    w = make_window(tiny_chat, max_tokens=5, temperature=1.0)
    send(qtbot, w, "w10 w11")
    user, first = w.chat.visible()
    with qtbot.waitSignal(w.answer_finished, timeout=LONG):
        w.chat_view.widgets[-1].action_btn.click()          # Regenerate
    path = w.chat.visible()
    second = path[-1]
    assert path[0].id == user.id and second.id != first.id
    assert [m.id for m in w.chat.tree.siblings(second.id)] == [first.id, second.id]
    assert w.chat_view.widgets[-1].pos_label.text() == "2/2"
    # switch back to the first answer
    w.chat_view.widgets[-1].prev_btn.click()
    assert w.chat.visible()[-1].id == first.id
    assert w.chat_view.widgets[-1].pos_label.text() == "1/2"
    # edit the question and resend
    uw = w.chat_view.widgets[0]
    uw.action_btn.click()
    assert uw.editor.isVisible()
    uw.editor.setPlainText("w20 w21")
    with qtbot.waitSignal(w.answer_finished, timeout=LONG):
        uw.resend_btn.click()
    path = w.chat.visible()
    assert path[0].content == "w20 w21" and path[0].parent_id is None
    assert [m.id for m in w.chat.tree.siblings(path[0].id)] == [user.id, path[0].id]
    assert path[1].parent_id == path[0].id
    # the store holds the same tree: two questions at the root, two answers under the first
    rows = w.store.messages(w.chat.id)
    assert sorted((r.parent_id or 0, r.role) for r in rows) == sorted(
        [(0, "user"), (0, "user"), (user.id, "assistant"), (user.id, "assistant"), (path[0].id, "assistant")])
    # a restart opens the same branch
    again = Chat(w.store, w.chat.id)
    assert [m.id for m in again.visible()] == [m.id for m in path]


def test_history_survives_restart(qtbot, make_window, tiny_chat, tmp_path):
    db = tmp_path / "hist.sqlite3"
    w1 = make_window(tiny_chat, db=db)
    send(qtbot, w1, "w30 w31 w32")
    w1.rename_conversation(title="Lighthouse notes")
    before = [(m.role, m.content, m.status) for m in w1.chat.visible()]
    close_window(w1)
    w2 = make_window(tiny_chat, db=db)
    items = [w2.conv_list.item(i).text() for i in range(w2.conv_list.count())]
    assert items == ["Lighthouse notes"]
    w2.conv_list.itemClicked.emit(w2.conv_list.item(0))
    assert [(m.role, m.content, m.status) for m in w2.chat.visible()] == before
    assert w2.title_label.full_text == "Lighthouse notes"
    # shown whole once the layout has settled (mid-layout the label can be narrow and elide it)
    qtbot.waitUntil(lambda: w2.title_label.text() == "Lighthouse notes", timeout=5000)


def test_answer_saved_while_streaming(qtbot, make_window, demo_container, tmp_path):
    """A kill mid-answer loses nothing already shown for more than half a second."""
    w = make_window(demo_container, max_tokens=400)
    seen = []
    t_first = []

    def watch(_text):
        if not t_first:
            t_first.append(time.monotonic())
        if time.monotonic() - t_first[0] > 1.2 and not seen:
            seen.append(w.chat.tree.by_id[w.chat.streaming_id].content)
            # another connection reads the database like a fresh process would
            other = HistoryStore(w.store.path, KeychainKeys())
            seen.append(other.messages(w.chat.id)[-1])
            other.close()
            w.stop()

    on_gui(w.worker.worker.response_text, watch)
    send(qtbot, w, "Write a long poem about the sea.")
    shown, stored = seen
    assert stored.status == "streaming"
    assert stored.content and shown.startswith(stored.content)
    assert len(stored.content) >= len(shown) // 3


def test_gauges_show_engine_stats(qtbot, make_window, demo_container):
    w = make_window(demo_container, max_tokens=10)
    w.stats_view.window = 600  # one window over the whole answer, to compare with the final counters
    snaps, dones = [], []
    on_gui(w.worker.worker.stats, snaps.append)
    on_gui(w.worker.worker.turn_done, dones.append)
    send(qtbot, w, "Say hello.")
    assert all(isinstance(s, StatsSample) for s in snaps) and [s.final for s in snaps].count(True) == 1
    last = snaps[-1]
    final = last.counters
    assert last.final and final["decode_tokens"] >= 1 and final["prompt_tokens"] >= 1
    with pytest.raises(TypeError):
        final["decode_tokens"] = 0          # the sample is immutable: the window cannot change it
    with pytest.raises(AttributeError):
        last.final = False
    assert last.turn == TurnFigures(len(dones[0].prompt_ids), 0, len(dones[0].token_ids), dones[0].seconds,
                                    dones[0].ttft_s) and last.turn.ttft_s > 0
    assert w.chat.visible()[-1].stats["turn_tokens"] == last.turn.tokens   # kept with the answer
    v = w.stats_view.values
    decode_snaps = [s for s in snaps if s.counters["decode_seconds"] > 0]
    assert v.decode_tps and v.decode_tps > 0
    # the gauge is the engine's own ratio (window covers this whole short answer)
    assert abs(v.decode_tps - final["decode_tokens"] / final["decode_seconds"]) < 1e-6 * v.decode_tps + 1e-9
    assert abs(v.prompt_tps - final["prompt_tokens"] / final["prompt_seconds"]) < 1e-6 * v.prompt_tps + 1e-9
    assert f"{v.decode_tps:,.1f}" in w.gauges.decode.value.text() or f"{v.decode_tps:,.0f}" in w.gauges.decode.value.text()
    assert len(w.gauges.decode.spark.values) == len(snaps)
    assert decode_snaps
    # the demo model is dense: no empty expert gauges, a note says why
    assert w.gauges.no_experts.isVisible()
    assert "no experts to stream" in w.gauges.no_experts.text()
    assert not any(t.isVisible() for t in (w.gauges.disk, w.gauges.hit_decode, w.gauges.hit_prefill))
    # RAM bar from engine.plan
    plan = w.model_info.plan
    assert w.memory.trunk == plan.trunk_bytes and w.memory.state == plan.state_bytes
    assert w.memory.usable > 0 and "usable RAM" in w.gauges.ram_note.text()


def test_gauges_on_a_moe_model(qtbot, make_window, tiny_moe):
    _ckpt, container, _torch_model = tiny_moe
    w = make_window(container, max_tokens=8)
    snaps = []
    on_gui(w.worker.worker.stats, snaps.append)
    w.settings.max_tokens = 8
    send(qtbot, w, "hello there")   # no chat template: a plain prompt
    final = snaps[-1].counters
    assert final["hits"] + final["misses"] > 0
    assert not w.gauges.no_experts.isVisible() and w.gauges.disk.isVisible() and w.gauges.hit_decode.isVisible()
    v = w.stats_view.values
    assert v.hit_decode_total is not None and v.hit_prefill_total is not None
    assert v.bytes_read_total == final["bytes_read"]
    assert w.gauges.hit_decode.value.text().endswith("%")
    assert w.memory.expert_cache > 0


def test_shortcuts_search_rename_export(qtbot, make_window, tiny_chat, tmp_path):
    w = make_window(tiny_chat, max_tokens=3)
    w.composer.setPlainText("w40 w41")
    with qtbot.waitSignal(w.answer_finished, timeout=LONG):
        qtbot.keyClick(w.composer, Qt.Key.Key_Return, Qt.KeyboardModifier.ControlModifier)
    first = w.chat.id
    qtbot.keyClick(w.composer, Qt.Key.Key_N, Qt.KeyboardModifier.ControlModifier)
    assert w.chat.id is None and not w.chat_view.widgets
    send(qtbot, w, "w50 w51")
    assert w.conv_list.count() == 2
    qtbot.keyClick(w.composer, Qt.Key.Key_F, Qt.KeyboardModifier.ControlModifier)
    assert w.search.hasFocus()
    qtbot.keyClicks(w.search, "w40")
    assert [w.conv_list.item(i).data(Qt.ItemDataRole.UserRole) for i in range(w.conv_list.count())] == [first]
    w.rename_conversation(first, "Renamed one")
    assert w.conv_list.item(0).text() == "Renamed one"
    w.search.clear()
    assert w.conv_list.count() == 2
    out = w.export_chat(tmp_path / "chat.md", "md")
    text = out.read_text()
    assert text.startswith("# w50 w51") and "## You" in text and "## Assistant" in text
    for b in (w.send_btn, w.stop_btn, w.new_btn, w.search, w.composer, w.conv_list):
        assert b.accessibleName()


def test_escape_stops(qtbot, make_window, demo_container):
    w = make_window(demo_container, max_tokens=300)
    fired = []

    def on_text(_t):
        if not fired:
            fired.append(1)
            qtbot.keyClick(w.composer, Qt.Key.Key_Escape)

    on_gui(w.worker.worker.response_text, on_text)
    assert send(qtbot, w, "Describe the moon in detail.") == "cancelled"
