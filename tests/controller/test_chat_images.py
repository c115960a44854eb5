"""Images in the window's conversations, without Qt: the controller's pending images go with the next
question as image parts (data URLs), the tiny K3 with its tiny tower answers with the image's positions
in its prompt, and the images are kept with the question in the encrypted history (a reopened chat, a
Regenerate, an Edit and a Fork still have them; deleting the chat deletes them)."""
from __future__ import annotations

import io

import pytest
from PIL import Image

from app.api import EngineService, ModelLoaded, Text, TurnDone, open_model
from app.chat.conversation import ChatError
from app.controller.chat_controller import ChatController
from app.store.crypto import KeychainKeys
from app.store.history import HistoryStore
from app.store.settings import Settings
from app.vision.image import ImageError
from tests.kimi import tiny_k3


def png(w=50, h=30, color=(200, 30, 10)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (w, h), color).save(buf, "PNG")
    return buf.getvalue()


@pytest.fixture(scope="module")
def k3v(tmp_path_factory):
    from app.convert.convert import convert

    root = tmp_path_factory.mktemp("k3chatimg")
    tiny_k3.build(root / "ckpt", vision=True)
    return convert(root / "ckpt", root / "k3.ferry")


@pytest.fixture
def store(tmp_path, memory_keyring):
    s = HistoryStore(tmp_path / "history.sqlite3", KeychainKeys())
    yield s
    s.close()


def loaded(model, service, session) -> ModelLoaded:
    """The ModelLoaded the window's worker reports for ``model`` (tests/ui drive the worker itself)."""
    info = model.engine.info
    return ModelLoaded(path=str(model.path), name=model.name, n_ctx=session.n_ctx, info=info,
                       plan=model.engine.plan(session.n_ctx), has_experts=True, chat_format=service.format.kind,
                       vision=model.vision_config if service.format.kind == "k3" else None)


def run(c: ChatController, service: EngineService, start) -> TurnDone:
    request, _ = c.turn_request(start)
    c.started(1)
    for ev in service.submit(request):
        if isinstance(ev, Text):
            c.on_text("response", ev.text)
        elif isinstance(ev, TurnDone):
            c.on_turn_done(ev)
            c.finish(ev.reason, ev.content, ev.reasoning)
            return ev
    raise AssertionError("no TurnDone")


def test_an_image_goes_with_the_question_and_stays_with_it(store, k3v, tmp_path, memory_keyring):
    s = Settings(temperature=0.0, max_tokens=4)
    c = ChatController(store, lambda: s)
    model = open_model(k3v)
    session = model.new_session(512)
    service = EngineService(model, session)
    try:
        c.set_model(model.name, loaded(model, service, session))
        assert c.image_support() == ""
        with pytest.raises(ImageError, match="note.png: not an image Ferry reads"):
            c.attach_image(b"hello, not an image", "note.png")     # hostile: one line, nothing pending
        assert c.pending_images == []
        p = c.attach_image(png(), "red.png")
        assert p.grid.positions > 0 and p.cost.startswith("50 x 30 px, ") and p.thumbnail_png[:4] == b"\x89PNG"
        assert f"{p.grid.positions} prompt positions" in p.cost
        start = c.send("What is this?")
        assert c.pending_images == []
        user = start.messages[-1]["content"]
        assert user[0] == {"type": "text", "text": "What is this?"} and user[1]["image_url"]["url"] == p.url
        with_image = run(c, service, start)
        assert with_image.error is None and with_image.completion_tokens > 0
        # the prompt holds the image: one placeholder per position the composer showed as its cost
        assert with_image.prompt_ids.count(tiny_k3.MEDIA_PAD) == p.grid.positions
        cid = c.chat.id

        # the same question without the image, in a new chat: shorter by the positions and the markup
        c.new_chat()
        plain = run(c, service, c.send("What is this?"))
        assert tiny_k3.MEDIA_PAD not in plain.prompt_ids
        assert with_image.prompt_tokens - plain.prompt_tokens >= p.grid.positions + 3
        c.open(cid)

        # a Regenerate of the first answer sends the image again (from the history)
        first = c.chat.visible()[1]
        c.chat.switch_to(first.id)
        regen = run(c, service, c.regenerate(first.id))
        assert regen.prompt_ids == with_image.prompt_ids and regen.token_ids == with_image.token_ids
        question = c.chat.visible()[0]
        assert question.images == [{"name": "red.png", "url": p.url}]
        # an edit of the question keeps its image; a fork copies it
        edited = c.edit(question.id, "And this?")
        assert edited.messages[-1]["content"][1]["image_url"]["url"] == p.url
        run(c, service, edited)
        fid = c.fork(c.chat.visible()[1].id)
        assert c.chat.visible()[0].images == [{"name": "red.png", "url": p.url}]
    finally:
        service.close()
        session.close()
        model.close()
    store.close()

    # a reopened history has the images (sealed in the encrypted store, not beside it)
    again = HistoryStore(tmp_path / "history.sqlite3", KeychainKeys())
    try:
        c2 = ChatController(again, lambda: s)
        c2.open(cid)
        assert c2.chat.visible()[0].images[0]["url"] == p.url
        msgs = c2.chat.prompt_messages(c2.chat.visible()[0].id)
        assert msgs[-1]["content"][1]["image_url"]["url"] == p.url
        assert p.url.split(",")[1][:40].encode() not in (tmp_path / "history.sqlite3").read_bytes()
        assert sorted(x.name for x in tmp_path.iterdir() if x.is_file() and "png" in x.name) == []
        # exports keep the images beside the chat, as files the Markdown and the JSON name
        out = tmp_path / "out"
        out.mkdir()
        md = c2.export(out / "my chat.md").read_text()
        qid = c2.chat.visible()[0].id
        kept = out / f"my chat-{qid}-1.png"
        assert kept.read_bytes() == png() and f"![red.png](<my chat-{qid}-1.png>)" in md
        import json
        doc = json.loads(c2.export(out / "chat.json").read_text())
        assert doc["messages"][0]["images"] == [{"name": "red.png", "file": f"chat-{qid}-1.png"}]
        assert (out / f"chat-{qid}-1.png").read_bytes() == png()
        assert sorted(x.name for x in out.iterdir()) == sorted(["my chat.md", kept.name, "chat.json",
                                                                f"chat-{qid}-1.png"])
        c2.delete(fid)
        c2.delete(cid)
        assert again._db.execute("SELECT COUNT(*) FROM message_images").fetchone()[0] == 0
        c2.close()
    finally:
        again.close()


def test_a_model_without_a_tower_takes_no_image(store, demo_container):
    s = Settings(temperature=0.0, max_tokens=4)
    c = ChatController(store, lambda: s)
    assert c.image_support() == "Open a model first"
    model = open_model(demo_container)
    session = model.new_session(128)
    service = EngineService(model, session)
    try:
        c.set_model(model.name, loaded(model, service, session))
        assert "cannot see images (it has no vision tower" in c.image_support()
        with pytest.raises(ChatError, match="cannot see images"):
            c.attach_image(png(), "red.png")
        assert c.pending_images == []
    finally:
        service.close()
        session.close()
        model.close()
