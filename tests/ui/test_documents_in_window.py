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
    citations = w.controller.citations.get(answer.id)
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


def test_the_window_never_waits_for_a_search(qtbot, make_window, demo_container, corpus_dir_ui, monkeypatch):
    """The attached documents are searched on the engine's thread, through a connection it keeps: while a
    search is held up the window goes on handling events and says what it is doing; a second question
    reuses that connection; Stop during the search ends the turn before the prompt is read."""
    import threading

    from app.controller import passages

    w = make_window(demo_container, max_tokens=8)
    panel = w.open_documents()
    qtbot.addWidget(panel)
    with qtbot.waitSignal(panel.indexing_finished, timeout=60000):
        panel.add_paths([str(corpus_dir_ui / "note.md")])
    panel.close()
    release, entered, seen = threading.Event(), threading.Event(), []
    real = passages.attach_passages

    def held(request, store, *args):
        seen.append((threading.current_thread(), store))
        entered.set()
        assert release.wait(30)
        return real(request, store, *args)

    monkeypatch.setattr(passages, "attach_passages", held)
    w.composer.setPlainText("Who serviced the boiler?")
    w.send()
    assert entered.wait(30)
    ticks = []
    from PySide6.QtCore import QTimer
    QTimer.singleShot(0, lambda: ticks.append(1))
    qtbot.waitUntil(lambda: bool(ticks), timeout=5000)       # the GUI thread runs while the search waits
    assert w.busy and w.prompt_label.text() == "Searching the documents…"
    with qtbot.waitSignal(w.answer_finished, timeout=60000):
        release.set()
    answer = w.chat.visible()[-1]
    assert any("Aldous Heating" in c.passage for c in w.controller.citations.get(answer.id, []))
    # the search ran on the engine's thread, through its own connection (not the window's)
    thread, store = seen[0]
    assert thread is not threading.main_thread() and store is not w.controller._documents
    release.clear()
    entered.clear()
    w.composer.setPlainText("When was the boiler serviced?")
    w.send()
    assert entered.wait(30)
    assert seen[1][1] is store                               # kept from one question to the next
    w.stop()
    with qtbot.waitSignal(w.answer_finished, timeout=60000) as done:
        release.set()
    assert done.args[0] == "cancelled"


def test_the_window_reads_the_documents_index_ahead_at_start_up(make_window, corpus_dir_ui):
    """app.ui.app calls start_documents once the window shows: the documents open, their index is read
    ahead in the background (app/documents/warm.py), and shutting the window down stops it."""
    w = make_window(None)
    w.controller.start_documents()
    store = w.controller._documents
    assert store is not None and store._warmer is not None
    store.add("kept", [corpus_dir_ui], workers=1)
    warmer = store.warm()                     # the first finished on the empty database: a new one starts
    w.shutdown()                              # cancels and joins it, then closes the store
    assert not warmer.running and (warmer.stats.finished or warmer.stats.cancelled)
    assert w.controller._documents is None


@pytest.fixture
def corpus_dir_ui(tmp_path):
    d = tmp_path / "docs"
    d.mkdir()
    (d / "note.md").write_text("# Boiler\n\nThe boiler was serviced by Aldous Heating in March.\n")
    return d


def test_deleting_a_chat_deletes_its_documents(qtbot, make_window, demo_container, corpus_dir_ui):
    """A chat's attached files go with it: deleted with the chat, and a new chat (SQLite may give it the
    deleted one's id) starts with none of them."""
    from app.documents.store import conversation_collection

    w = make_window(demo_container)
    panel = w.open_documents()
    qtbot.addWidget(panel)
    with qtbot.waitSignal(panel.indexing_finished, timeout=60000):
        panel.add_paths([str(corpus_dir_ui / "note.md")])
    panel.close()
    old = w.chat.id
    assert w.controller.has_documents()
    w.delete_conversation(old)
    assert conversation_collection(old) not in [c.name for c in w.controller.documents().collections()]
    w.new_chat()
    panel = w.open_documents()
    qtbot.addWidget(panel)
    panel.close()
    assert w.chat.id == old                      # the id is used again ...
    assert not w.controller.has_documents()                # ... but not the documents


def test_documents_left_by_a_deleted_chat_are_removed_at_open(make_window, corpus_dir_ui):
    """An earlier version deleted a chat and kept its documents: when the window opens the documents,
    collections of chats that no longer exist are removed (a new chat could get that id and them)."""
    from app.documents.library import collection_rows
    from app.documents.store import conversation_collection

    w = make_window(None)
    kept = w.store.create_conversation("Kept", model="")
    gone = w.store.create_conversation("Gone", model="")
    docs = w.controller.documents()
    docs.add(conversation_collection(kept), [corpus_dir_ui], workers=1)
    docs.add(conversation_collection(gone), [corpus_dir_ui], workers=1)
    docs.add("archive", [corpus_dir_ui], workers=1)
    w.store.delete_conversation(gone)            # as before: the conversation only
    w.shutdown()
    w2 = make_window(None)
    names = [c.name for c in w2.controller.documents().collections()]
    assert sorted(names) == sorted([conversation_collection(kept), "archive"])
    labels = {r.name: r.label for r in collection_rows(w2.controller.documents(), w2.controller.titles())}
    assert labels == {conversation_collection(kept): "Chat “Kept”", "archive": "archive"}
