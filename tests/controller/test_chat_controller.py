"""The window's turn logic without Qt (no qtbot): a ChatController on a real
history store, fed the events a real engine service writes for the demo
model, and the records, citations, status lines and exports it makes."""
from __future__ import annotations

import json

import pytest

from app.api import EngineService, Text, TurnDone, open_model
from app.chat.conversation import ChatError
from app.chat.stream_parser import ToolCall
from app.controller.chat_controller import ChatController
from app.documents.ask import Citation
from app.store.crypto import KeychainKeys
from app.store.history import HistoryStore
from app.store.settings import Settings


@pytest.fixture
def store(tmp_path, memory_keyring):
    s = HistoryStore(tmp_path / "history.sqlite3", KeychainKeys())
    yield s
    s.close()


def controller(store, **settings) -> ChatController:
    s = Settings(**{"temperature": 0.0, "max_tokens": 8, **settings})
    return ChatController(store, lambda: s)


def run(c: ChatController, service: EngineService, request) -> None:
    """What the worker does: the service's events for ``request``, handed to the controller."""
    for ev in service.submit(request):
        if isinstance(ev, Text):
            c.on_text("response", ev.text)
        elif isinstance(ev, TurnDone):
            c.on_turn_done(ev)
            return ev
    return None


def test_a_turn_on_the_demo_model_is_recorded_with_its_figures(store, demo_container):
    c = controller(store, system_prompt="Be brief.")
    c.set_model("smollm2")
    model = open_model(demo_container)
    session = model.new_session(512)
    service = EngineService(model, session)
    try:
        start = c.send("What is the capital of France?")
        assert c.busy and start.messages[0] == {"role": "system", "content": "Be brief."}
        request, search = c.turn_request(start)
        assert search is None and request.max_tokens == 8 and request.sampling.temperature == 0.0
        assert request.client == "window" and request.messages == start.messages
        c.started(7)
        done = run(c, service, request)
        message = c.finish(done.reason, done.content, done.reasoning)
    finally:
        service.close()
        session.close()
        model.close()
    assert not c.busy and message.content == done.content and message.status == done.reason
    assert message.stats["turn_tokens"] == len(done.token_ids) > 0
    assert message.stats["turn_prompt_tokens"] == done.prompt_tokens - done.reused_tokens
    line = c.status_line(done.reason, message)
    assert line.startswith(f"{len(done.token_ids)} tokens in ") and "prompt tokens read" in line
    # saved: a new controller on the same store opens it as it was
    again = controller(store)
    again.open(c.chat.id)
    kept = again.chat.visible()
    assert [m.role for m in kept] == ["user", "assistant"] and kept[1].stats == message.stats
    assert again.chat.title == "What is the capital of France?"


def test_tool_calls_token_probabilities_and_citations_go_with_the_answer(store):
    c = controller(store)
    start = c.send("Look it up")
    c.turn_request(start)
    c.started(3)
    cite = Citation(n=2, file="notes.md", path="/x/notes.md", page=None, heading="", passage="The tank holds 3.5 l.",
                    chunk_id=1, file_id=1, start=0, end=21)
    c.on_citations(2, [cite])            # another turn's: ignored
    assert c.turn.citations == []
    c.on_citations(3, [cite])
    c.on_token_probs([["a", -0.1, []]])
    c.on_turn_done(TurnDone(reason="tool_calls", tool_calls=[ToolCall("search", 1, '{"q": "tank"}')],
                            token_ids=[1, 2], prompt_tokens=10, seconds=0.5, ttft_s=0.2))
    m = c.finish("stop", "The tank holds 3.5 l [2].", "")
    assert m.stats["tool_calls"] == [{"name": "search", "arguments": '{"q": "tank"}'}]
    assert m.stats["citations"][0]["n"] == 2 and c.citations[m.id] == [cite]
    assert "cite:2" in c.linked(m, m.content) and c.citation(m.id, 2) == cite and c.citation(m.id, 5) is None
    # the links come back from the saved record after a restart
    again = controller(store)
    again.open(c.chat.id)
    assert again.citations[m.id][0].passage == cite.passage


def test_an_error_says_the_engines_message_and_no_answer_is_left_streaming(store):
    c = controller(store)
    c.turn_request(c.send("hello"))
    c.on_error("the prompt has 600 tokens but the context holds 512")
    m = c.finish("error", "", "")
    assert m.status == "error" and set(m.stats) == {"model"}       # no figures: only what was asked to write it
    assert c.status_line("error", m) == "Error: the prompt has 600 tokens but the context holds 512"
    assert c.finish("stop", "late", "") is None         # nothing is being written any more
    assert c.status_line("cancelled", None) == "Stopped"


def test_an_answer_streams_into_its_own_chat_while_the_user_reads_and_starts_others(store):
    c = controller(store)
    c.send("older question")
    c.finish("stop", "older answer")
    older = c.chat.id
    c.new_chat()
    c.turn_request(c.send("one"))
    writing = c.chat.id
    assert c.busy and c.on_screen and c.on_text("response", "Hi")
    c.new_chat()                                   # a new chat while the answer streams
    assert c.busy and not c.on_screen and c.chat.id is None
    with pytest.raises(ChatError, match="“one”"):   # one answer at a time; the draft waits
        c.send("second question")
    assert c.chat.id is None and store.conversation_ids() == {older, writing}
    c.open(older)                                  # reading another chat
    assert [m.content for m in c.chat.visible()] == ["older question", "older answer"]
    assert c.on_text("response", " there")        # the stream keeps going into its own chat
    assert c.delete(writing) == "Stop the answer first (Esc)"
    c.rename(writing, "Renamed while writing")
    c.open(writing)                                # back to it: the live answer, not a stale copy
    assert c.on_screen and c.chat.visible()[-1].content == "Hi there"
    c.open(older)
    m = c.finish("cancelled")                      # Esc from another chat stops it; nothing lost
    assert m.conversation_id == writing and m.status == "cancelled" and not c.busy
    assert [x.content for x in c.chat.visible()] == ["older question", "older answer"]
    assert not c.on_text("response", "more")
    kept = controller(store)
    kept.open(writing)
    assert kept.chat.title == "Renamed while writing"
    assert [(x.role, x.content, x.status) for x in kept.chat.visible()] == [
        ("user", "one", "done"), ("assistant", "Hi there", "cancelled")]
    c.turn_request(c.send("now a question here"))  # the engine is free: the chat on screen answers
    assert c.on_screen and c.writing.id == older


def test_attach_first_then_the_first_question_names_the_chat(store):
    c = controller(store)
    assert c.ensure_saved() and not c.ensure_saved()
    assert c.chat.title == "New chat"
    c.send("Where is the boiler serviced?")
    assert c.titles()[c.chat.id] == "Where is the boiler serviced?"


def test_export_writes_the_branch_with_model_and_sampling(store, tmp_path):
    c = controller(store, temperature=0.3)
    c.set_model("smollm2")
    with pytest.raises(ValueError):
        c.export(tmp_path / "empty.md")
    c.turn_request(c.send("Hi"))
    c.finish("stop", "Hello.", "")
    doc = json.loads(c.export(tmp_path / "chat.json").read_text())
    assert doc["model"] == "smollm2" and doc["sampling"]["temperature"] == 0.3
    assert [m["content"] for m in doc["messages"]] == ["Hi", "Hello."]


def test_continue_writes_on_in_the_same_answer_and_fork_copies_the_turns(store, demo_container):
    """Continue: an answer cut off at 8 tokens, continued for 8 more, is the answer written in one go
    (greedy, the demo model); Fork: a new chat with the turns up to a message."""
    model = open_model(demo_container)
    session = model.new_session(512)
    service = EngineService(model, session)
    try:
        whole = controller(store, max_tokens=16)
        start = whole.send("Name three colours.")
        request, _ = whole.turn_request(start)
        done = run(whole, service, request)
        once = whole.finish(done.reason, done.content, done.reasoning)
        c = controller(store)
        c.set_model("smollm2")
        start = c.send("Name three colours.")
        request, _ = c.turn_request(start)
        done = run(c, service, request)
        cut = c.finish(done.reason, done.content, done.reasoning)
        assert cut.status == "length" and cut.content and len(once.content) > len(cut.content)
        start = c.continue_answer(cut.id)
        assert start.continued and start.assistant_id == cut.id and start.messages[-1]["content"] == cut.content
        request, _ = c.turn_request(start)
        assert request.continue_final and c.busy
        done = run(c, service, request)
        assert not done.content.startswith(cut.content[:4])      # only what comes next streams
        went_on = c.finish(done.reason, done.content, done.reasoning)
    finally:
        service.close()
        session.close()
        model.close()
    assert went_on.id == cut.id and went_on.content == once.content      # the same message, written on
    assert went_on.stats["continued"] == 1 and went_on.stats["model"]["sampling"]["max_tokens"] == 8
    assert [m.role for m in c.chat.visible()] == ["user", "assistant"]
    with pytest.raises(ChatError):                 # only an answer that stopped early is continued
        c.continue_answer(c.chat.visible()[0].id)
    again = controller(store)
    again.open(c.chat.id)
    assert again.chat.visible()[-1].content == once.content
    # Fork at the question: a new chat, on screen, with a copy of the question only
    source = c.chat.id
    fid = c.fork(c.chat.visible()[0].id)
    assert fid != source and c.chat.id == fid and c.chat.title == "Name three colours. (fork)"
    assert [(m.role, m.content) for m in c.chat.visible()] == [("user", "Name three colours.")]
    original = again.chat.visible()
    fid2 = again.fork(original[-1].id)     # at the answer: its record goes with it
    copy = controller(store)
    copy.open(fid2)
    kept = copy.chat.visible()
    assert [(m.role, m.content, m.status, m.stats) for m in kept] == [
        (m.role, m.content, m.status, m.stats) for m in original]
    assert {m.id for m in kept}.isdisjoint(m.id for m in original)
    assert [m.content for m in controller_view(store, source)] == ["Name three colours.", once.content]


def controller_view(store, cid):
    c = controller(store)
    c.open(cid)
    return c.chat.visible()
