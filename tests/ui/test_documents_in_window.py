"""Documents in the window: attach a file to a conversation, ask, and the
answer's citation markers open the exact passage."""
from __future__ import annotations

import pytest

from tests.ui.test_chat_window import send


def test_attach_ask_and_open_a_citation(qtbot, make_window, demo_container, tmp_path):
    doc = tmp_path / "manual.md"
    doc.write_text("# Kettle manual\n\nThe water tank of the kettle holds 3.5 litres. "
                   "Descale the kettle every month with white vinegar.\n\n"
                   "# Warranty\n\nThe warranty lasts two years from the date of purchase.\n")
    w = make_window(demo_container, max_tokens=24)
    panel = w.open_documents()
    qtbot.addWidget(panel)
    assert w.chat.id is not None                       # a new chat is saved so files can attach to it
    with qtbot.waitSignal(panel.indexing_finished, timeout=60000) as sig:
        panel.add_paths([str(doc)])
    added = sig.args[0]["added"]
    assert len(added) == 1 and "manual.md" in str(added[0])
    reason = send(qtbot, w, "How many litres does the water tank hold?")
    assert reason in ("stop", "length")
    answer = w.chat.visible()[-1]
    citations = w.citations.get(answer.id)
    assert citations and any("3.5 litres" in c.passage for c in citations)
    tank = next(c for c in citations if "3.5 litres" in c.passage)
    # The answer is shown with its markers as links; clicking one shows the passage.
    body = w.chat_view.widgets[-1].body
    shown = body.toHtml()
    assert "cite:" in shown or "[" not in answer.content   # the model may write no marker at all
    dialog = w.show_citation(answer.id, tank.n)
    qtbot.addWidget(dialog)
    assert dialog.highlighted_text() == tank.passage
    dialog.close()
    panel.close()


def test_the_window_reads_the_documents_index_ahead_at_start_up(make_window, corpus_dir_ui):
    """app.ui.app calls start_documents once the window shows: the documents open, their index is read
    ahead in the background (app/documents/warm.py), and shutting the window down stops it."""
    w = make_window(None)
    w.start_documents()
    store = w._documents
    assert store is not None and store._warmer is not None
    store.add("kept", [corpus_dir_ui], workers=1)
    warmer = store.warm()                     # the first finished on the empty database: a new one starts
    w.shutdown()                              # cancels and joins it, then closes the store
    assert not warmer.running and (warmer.stats.finished or warmer.stats.cancelled)
    assert w._documents is None


@pytest.fixture
def corpus_dir_ui(tmp_path):
    d = tmp_path / "docs"
    d.mkdir()
    (d / "note.md").write_text("# Boiler\n\nThe boiler was serviced by Aldous Heating in March.\n")
    return d
