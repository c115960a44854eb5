"""The thinking panel, fed by the real worker and engine through the stream parser."""
from __future__ import annotations

from app.chat.turn import ChatFormat, TurnRequest
from app.model import LoadedModel
from tests.ui.conftest import on_gui, THINK_PROMPT

LONG = 60_000


def test_thinking_panel_fills_then_collapses(qtbot, make_window, thinking_model):
    container, n_before = thinking_model
    # the template's generation prompt opens <think>: the answer starts in the thinking channel
    m = LoadedModel(container)
    channel = ChatFormat(m).prepare(TurnRequest([{"role": "user", "content": THINK_PROMPT}]), n_ctx=2048).channel
    m.close()
    assert channel == "thinking"

    w = make_window(container, max_tokens=40)
    during = []

    def on_thinking(_text):
        # render now, as the repaint timer would, and look at the panel
        w.chat_view.refresh_streaming()
        mw = w.chat_view.widgets[-1]
        during.append((mw.thinking.isVisible(), mw.thinking.expanded, mw.thinking.toggle.text(),
                       mw.thinking.body.toPlainText()))

    after = []

    def on_response(_text):
        w.chat_view.refresh_streaming()
        mw = w.chat_view.widgets[-1]
        after.append((mw.thinking.expanded, mw.body.toPlainText()))

    on_gui(w.worker.worker.thinking_text, on_thinking)
    on_gui(w.worker.worker.response_text, on_response)
    with qtbot.waitSignal(w.answer_finished, timeout=LONG):
        w.send_text(THINK_PROMPT)
    done = w.chat.visible()[-1]
    text, thinking = done.content, done.thinking
    assert during, "no thinking text arrived"
    visible, expanded, title, body = during[0]
    assert visible and expanded and title.startswith("Thinking")
    assert body.strip() and body.split()[0].startswith("w")
    assert len(thinking.split()) == n_before          # everything before </think>
    assert "</think>" not in thinking and "</think>" not in text
    assert text.strip(), "the answer after </think> is empty"
    assert after and after[0][0] is False              # collapsed once the answer starts
    assert not w.chat.busy
    mw = w.chat_view.widgets[-1]
    assert mw.thinking.isVisible() and not mw.thinking.expanded
    assert mw.thinking.toggle.text().startswith("Thought for")
    assert not mw.thinking.body.isVisible()
    mw.thinking.toggle.click()                          # expandable later
    assert mw.thinking.expanded and mw.thinking.body.isVisible()
    assert mw.thinking.body.toPlainText() == thinking.strip()
    stored = w.store.messages(w.chat.id)[-1]
    assert stored.thinking == thinking and stored.content == text
    assert stored.thinking_seconds is not None
