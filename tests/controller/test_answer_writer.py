"""Answers remember their model (issue 34): each answer keeps the model, chat
format, sampling and routing that wrote it; switching models does not relabel
history; the header and the exports show what actually wrote each answer."""
from __future__ import annotations

import json
import os
from types import SimpleNamespace

import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from app.api import TurnDone  # noqa: E402
from app.controller.chat_controller import WRITER, ChatController, describe_writer
from app.store.crypto import KeychainKeys
from app.store.history import HistoryStore
from app.store.settings import Settings


def _loaded(name: str, fmt: str, arch: str = "llama") -> SimpleNamespace:
    """The fields of the worker's ModelLoaded the record reads."""
    return SimpleNamespace(name=name, path=f"/models/{name}.ferry", engine="local", chat_format=fmt,
                           info=SimpleNamespace(arch=arch, activations="f32"))


@pytest.fixture
def store(tmp_path, memory_keyring):
    s = HistoryStore(tmp_path / "history.sqlite3", KeychainKeys())
    yield s
    s.close()


def _answer(c: ChatController, question: str, text: str):
    c.turn_request(c.send(question))
    c.on_turn_done(TurnDone(reason="stop", content=text, token_ids=[1], seconds=0.1))
    return c.finish("stop", text, "")


def test_each_answer_keeps_what_wrote_it_across_a_model_switch(store, tmp_path):
    settings = Settings(temperature=0.7, top_p=0.9, min_p=0.1, experts_per_token=None)
    c = ChatController(store, lambda: settings)
    c.set_model("smollm2", _loaded("smollm2", "jinja"))
    first = _answer(c, "Capital of France?", "Paris.")
    c.set_model("tiny-k3", _loaded("tiny-k3", "k3", "kimi_k3"))     # the user switches models
    settings = Settings(temperature=0.0, experts_per_token=4, cache_aware_margin=0.5)
    second = _answer(c, "And of Italy?", "Rome.")
    w1, w2 = first.stats[WRITER], second.stats[WRITER]
    assert (w1["name"], w1["chat_format"], w1["sampling"]["temperature"], w1["routing"]) == \
        ("smollm2", "jinja", 0.7, "exact")
    assert (w2["name"], w2["chat_format"], w2["arch"]) == ("tiny-k3", "k3", "kimi_k3")
    assert w2["routing"] == {"experts_per_token": 4, "cache_aware_margin": 0.5}
    assert describe_writer(w1).startswith("smollm2 · jinja · temperature 0.7, top-p 0.9")
    assert "greedy" in describe_writer(w2) and "4 experts/token" in describe_writer(w2)
    # kept in the history: a restart shows the same
    again = ChatController(store, lambda: settings)
    again.open(c.chat.id)
    assert [m.stats.get(WRITER, {}).get("name") for m in again.chat.visible()] == [None, "smollm2", None, "tiny-k3"]
    # exports say which model wrote which answer
    doc = json.loads(again.export(tmp_path / "chat.json").read_text())
    assert [m.get("model", {}).get("name") for m in doc["messages"]] == [None, "smollm2", None, "tiny-k3"]
    assert doc["model"] == "tiny-k3" and doc["models"] == ["smollm2", "tiny-k3"]
    md = again.export(tmp_path / "chat.md").read_text()
    assert "## Assistant (smollm2)" in md and "## Assistant (tiny-k3)" in md


def test_the_header_shows_the_model_that_wrote_each_answer(qtbot, store):
    from app.ui.chat_view import ChatView

    c = ChatController(store, lambda: Settings())
    c.set_model("smollm2", _loaded("smollm2", "jinja"))
    _answer(c, "one", "First.")
    c.set_model("tiny-k3", _loaded("tiny-k3", "k3"))
    _answer(c, "two", "Second.")
    view = ChatView()
    qtbot.addWidget(view)
    view.show_chat(c.chat, "tiny-k3")       # the open model now
    authors = [w.author.text() for w in view.widgets]
    assert authors == ["<b>You</b>", "<b>smollm2</b>", "<b>You</b>", "<b>tiny-k3</b>"]
    assert "jinja" in view.widgets[1].author.toolTip()
    # an answer saved before answers kept their model: the model its chat was started with, not the open one
    store.update_message(view.widgets[1].message_id, stats={})
    old = ChatController(store, lambda: Settings())
    old.open(c.chat.id)
    view.show_chat(old.chat, "tiny-k3")
    assert view.widgets[1].author.text() == "<b>smollm2</b>"
