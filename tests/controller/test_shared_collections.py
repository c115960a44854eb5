"""Document collections reusable across chats (issue 34, GPT4All's LocalDocs): a named collection is
attached to several chats and owned by none; a chat's own files can become one; a fork searches what
its chat searched. Driven through the ChatController on a real encrypted store, no Qt."""
from __future__ import annotations

import pytest

from app.controller.chat_controller import ChatController
from app.controller.passages import attach_passages
from app.api import TurnRequest
from app.documents.prompt import Estimate
from app.documents.store import DocumentStore, conversation_collection
from app.store.crypto import KeychainKeys
from app.store.history import HistoryStore
from app.store.settings import Settings


@pytest.fixture
def store(tmp_path, memory_keyring):
    s = HistoryStore(tmp_path / "ferry.db", KeychainKeys())
    yield s
    s.close()


@pytest.fixture
def files(tmp_path):
    d = tmp_path / "docs"
    d.mkdir()
    (d / "boiler.md").write_text("# Boiler\n\nThe boiler is serviced every October by Hansen Heating.\n")
    (d / "garden.md").write_text("# Garden\n\nThe apple trees are pruned in February, never in spring.\n")
    return d


def chat(c: ChatController, question: str) -> int:
    c.new_chat()
    c.send(question)
    c.finish("stop", "noted")
    return c.chat.id


def searched(c: ChatController, question: str) -> list[str]:
    """The files whose passages a question in the chat on screen gets (what the engine thread attaches)."""
    request, search = c.turn_request(c.send(question))
    found = [] if search is None else search.attach(request, search.store, Estimate)
    c.finish("stop", "ok")
    return sorted({x.file for x in found})


def test_a_collection_is_attached_to_several_chats_and_owned_by_none(store, files):
    c = ChatController(store, lambda: Settings(temperature=0.0))
    try:
        docs = c.documents()
        docs.add("house", [files / "boiler.md"])
        a = chat(c, "first")
        assert [n for n, on in c.shared_collections()] == ["house"] and not c.has_documents()
        c.attach_collection("house")
        assert c.shared_collections() == [("house", True)] and c.has_documents()
        assert searched(c, "When is the boiler serviced?") == ["boiler.md"]
        b = chat(c, "second")
        c.attach_collection("house")
        assert sorted(docs.attached_to("house")) == [a, b]
        assert c.delete(a) == ""                          # deleting a chat keeps the collection
        assert docs.attached_to("house") == [b] and searched(c, "boiler serviced when?") == ["boiler.md"]
        c.attach_collection("house", on=False)             # detached: this chat no longer searches it
        assert c.shared_collections() == [("house", False)] and not c.has_documents()
        assert docs.collection("house").files == 1
        # a chat's own files become a collection other chats can attach, and outlive the chat
        own = chat(c, "third")
        docs.add(conversation_collection(own), [files / "garden.md"])
        c.share_files("garden")
        assert c.collections() == (conversation_collection(own), "garden")
        assert searched(c, "When are the apple trees pruned?") == ["garden.md"]
        c.open(b)
        c.attach_collection("garden")
        c.attach_collection("house")
        assert searched(c, "boiler October apple trees pruned") == ["boiler.md", "garden.md"]   # both, one prompt
        c.delete(own)
        assert docs.collection("garden").files == 1 and docs.attached(b) == ["garden", "house"]
        with pytest.raises(Exception, match="conversation:"):
            docs.rename_collection("garden", "conversation:99")
    finally:
        c.close()


def test_a_fork_searches_its_chats_files_and_keeps_them_when_that_chat_goes(store, files):
    c = ChatController(store, lambda: Settings(temperature=0.0))
    try:
        docs = c.documents()
        src = chat(c, "about the boiler")
        docs.add(conversation_collection(src), [files / "boiler.md"])
        fork = c.fork(c.chat.visible()[-1].id)
        assert c.chat.id == fork and c.collections() == (conversation_collection(fork), conversation_collection(src))
        assert searched(c, "When is the boiler serviced?") == ["boiler.md"]
        c.delete(src)                                     # the source's files stay: the fork searches them
        assert docs.collection(conversation_collection(src)).files == 1
        c.delete(fork)                                    # ... until no chat does
        assert conversation_collection(src) not in {x.name for x in docs.collections()}
    finally:
        c.close()


def test_an_older_database_gets_the_attachments_table(store, files):
    docs = DocumentStore.beside(store)
    docs.add("house", [files / "boiler.md"])
    with docs.db:
        docs.db.execute("DROP TABLE docs_attached")    # as a database written before shared collections
    docs.close()
    again = DocumentStore.beside(store)
    try:
        again.attach(1, "house")
        assert again.attached(1) == ["house"] and again.collection("house").files == 1
    finally:
        again.close()


def test_several_collections_share_the_largest_budget(store, files):
    docs = DocumentStore.beside(store)
    try:
        docs.add("a", [files / "boiler.md"])
        docs.add("b", [files / "garden.md"])
        docs.set_budget("a", 64)
        docs.set_budget("b", 64)
        request = TurnRequest(messages=[{"role": "user", "content": "boiler October apple trees pruned"}])
        found = attach_passages(request, docs, ("a", "b"), Estimate, "boiler October apple trees pruned")
        assert [x.n for x in found] == list(range(1, len(found) + 1)) and len(found) >= 1
        assert request.messages[0]["role"] == "system"
    finally:
        docs.close()
