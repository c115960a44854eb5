"""The window's document questions take the one prefill path (issue 33): their passages are a prefix
kept as a saved state (``TurnRequest.keep_prefix``), and the window's engine is given the document
store's saved states, as ``ferry docs ask``'s is. A second question on the same passages does not read
them again, and answers as a fresh engine does. Driven as the engine thread drives it (the
controller's request and search, then the engine), on the demo model, without Qt."""
from __future__ import annotations

import pytest

from app.api import EngineService, LoadedModel, RemoteEngine, StateCache, TurnRequest, collect
from app.controller.chat_controller import ChatController
from app.controller.passages import keep_prefixes
from app.store.crypto import KeychainKeys
from app.store.history import HistoryStore
from app.store.settings import Settings

QUESTION = "When is the boiler serviced?"


@pytest.fixture(scope="module")
def demo(demo_container):
    model = LoadedModel(demo_container, n_ctx=1024)
    yield model
    model.close()


@pytest.fixture
def controller(tmp_path, memory_keyring):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "boiler.md").write_text(
        "# Boiler\n\nThe boiler is serviced every October by Hansen Heating, who also check the water tank.\n")
    store = HistoryStore(tmp_path / "ferry.db", KeychainKeys())
    c = ChatController(store, lambda: Settings(temperature=0.0))
    c.documents().add("house", [tmp_path / "docs" / "boiler.md"])
    yield c
    c.close()
    store.close()


def window_turn(c: ChatController, engine, model, question: str = QUESTION):
    """A question in a new chat with the collection attached, as the window's worker runs it
    (``EngineWorker.generate``): the engine gets the store's states, the passages go into the request."""
    c.new_chat()
    c.attach_collection("house")
    request, search = c.turn_request(c.send(question))
    assert search is not None
    request.max_tokens = 6
    keep_prefixes(engine, search.store)
    found = search.attach(request, search.store, model)
    assert [x.file for x in found] == ["boiler.md"] and request.keep_prefix
    end = collect(engine.submit(request))
    c.finish(end.reason, end.content)
    return request, end


def engine(model, **kw) -> EngineService:
    return EngineService(model, model.new_session(), **kw)


def close(*engines: EngineService) -> None:
    for e in engines:
        e.close()
        e.session.close()


def test_a_second_document_question_reuses_the_saved_passages(controller, demo):
    service = engine(demo)          # as the window opens it: no states yet
    again, fresh = engine(demo), engine(demo)
    try:
        request, first = window_turn(controller, service, demo)
        assert isinstance(service.states, StateCache) and service.states.key == controller.documents().keys.states
        prefix = service.prepare(request).prefix_len
        assert prefix > 16 and first.prefix_state == "saved" and first.reused_tokens == 0
        # the same engine, the next chat on the same passages: the session still holds them
        _, held = window_turn(controller, service, demo)
        assert held.prefix_state == "held" and held.reused_tokens >= prefix
        assert held.token_ids == first.token_ids
        # the model opened again (a new session): the passages come back from their saved state
        _, restored = window_turn(controller, again, demo)
        assert restored.prefix_state == "restored" and restored.reused_tokens == prefix
        assert restored.prompt_tokens - restored.reused_tokens < 30
        # ...and it answers as an engine that never saved or restored anything
        plain = collect(fresh.submit(TurnRequest(messages=request.messages, max_tokens=6, sampling=request.sampling)))
        assert plain.prefix_state == "" and plain.reused_tokens == 0
        assert restored.token_ids == first.token_ids == plain.token_ids and restored.content == plain.content
    finally:
        close(service, again, fresh)


def test_an_engine_with_its_own_states_or_a_remote_one_keeps_its_own(controller, demo, tmp_path):
    store = controller.documents()
    remote = RemoteEngine("http://127.0.0.1:9", "m")
    own = StateCache(b"k" * 32, root=tmp_path / "states")
    service = engine(demo, states=own)
    try:
        keep_prefixes(remote, store)
        keep_prefixes(service, store)
        assert not hasattr(remote, "states") and service.states is own
    finally:
        remote.close()
        close(service)
