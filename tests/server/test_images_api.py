"""Images over HTTP on the tiny K3 with a tiny tower: OpenAI ``image_url``
parts and Anthropic ``image`` blocks (base64 / data: URLs only; a remote URL
is refused and nothing is fetched), and a bad image refused as a 400."""
from __future__ import annotations

import base64
import io

import pytest
from PIL import Image

GREEDY = {"top_k": 1}


@pytest.fixture(scope="module")
def k3_vision(tmp_path_factory):
    from app.convert.convert import convert
    from tests.kimi import tiny_k3

    root = tmp_path_factory.mktemp("k3_vision_server")
    tiny_k3.build(root / "ckpt", vision=True)
    return convert(root / "ckpt", root / "k3.ferry")


def png_b64(color=(200, 30, 10)) -> str:
    buf = io.BytesIO()
    Image.new("RGB", (40, 30), color).save(buf, "PNG")
    return base64.b64encode(buf.getvalue()).decode()


def test_openai_image_url_parts(k3_vision, live):
    import openai

    server = live(k3_vision)
    client = server.openai()

    def ask(url):
        return client.chat.completions.create(model=server.id, max_tokens=6, extra_body=GREEDY, messages=[
            {"role": "user", "content": [{"type": "text", "text": "What is this?"},
                                         {"type": "image_url", "image_url": {"url": url}}]}])
    red = ask("data:image/png;base64," + png_b64())
    blue = ask("data:image/png;base64," + png_b64((0, 40, 250)))
    assert red.usage.prompt_tokens > 20 and red.choices[0].finish_reason == "length"
    assert red.usage.prompt_tokens == blue.usage.prompt_tokens
    for url, says in (("https://example.com/cat.png", "only data: URLs"),
                      ("data:image/png;base64," + png_b64()[:40], "not an image Ferry reads")):
        with pytest.raises(openai.BadRequestError) as info:
            ask(url)
        assert says in str(info.value)


def test_anthropic_image_blocks(k3_vision, live):
    import anthropic

    server = live(k3_vision)
    client = server.anthropic()

    def ask(source):
        return client.messages.create(model=server.id, max_tokens=6, extra_body=GREEDY, messages=[
            {"role": "user", "content": [{"type": "image", "source": source},
                                         {"type": "text", "text": "What is this?"}]}])
    m = ask({"type": "base64", "media_type": "image/png", "data": png_b64()})
    assert m.usage.input_tokens > 20 and m.stop_reason == "max_tokens"
    with pytest.raises(anthropic.BadRequestError) as info:
        ask({"type": "url", "url": "https://example.com/cat.png"})
    assert "fetches nothing" in str(info.value)


def test_serve_image_budget_reaches_the_turn():
    from app.server.chat import Limits, turn_request
    from app.server.schemas import ChatCompletionRequest

    req = ChatCompletionRequest.model_validate({"model": "m", "messages": [{"role": "user", "content": [
        {"type": "text", "text": "x"}, {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}]})
    assert turn_request(req, limits=Limits(image_patch_budget=256)).image_patch_budget == 256
    assert turn_request(req, limits=Limits()).image_patch_budget is None
    own = ChatCompletionRequest.model_validate({**req.model_dump(exclude_none=True), "image_patch_budget": 64})
    assert turn_request(own, limits=Limits(image_patch_budget=256)).image_patch_budget == 64   # the request's own
    with pytest.raises(Exception, match="image_patch_budget"):
        ChatCompletionRequest.model_validate({**req.model_dump(exclude_none=True), "image_patch_budget": 8})


def test_a_clients_follow_up_resumes_after_the_image(k3_vision, live):
    """The same client's second question about an image starts from the state after its first prompt
    (cached_tokens), with the answer a fresh server gives reading the whole prompt."""
    server = live(k3_vision)
    client = server.openai()
    first = [{"role": "user", "content": [{"type": "text", "text": "What is this?"},
                                          {"type": "image_url", "image_url": {"url": "data:image/png;base64,"
                                                                                     + png_b64()}}]}]

    def ask(messages):
        return client.chat.completions.create(model=server.id, max_tokens=5, extra_body=GREEDY, messages=messages)
    one = ask(first)
    follow = [*first, {"role": "assistant", "content": one.choices[0].message.content or ""},
              {"role": "user", "content": "And its colour?"}]
    two = ask(follow)
    assert two.usage.prompt_tokens_details.cached_tokens == one.usage.prompt_tokens
    fresh = live(k3_vision).openai().chat.completions.create(model=server.id, max_tokens=5, extra_body=GREEDY,
                                                             messages=follow)
    assert fresh.usage.prompt_tokens_details.cached_tokens == 0
    assert fresh.choices[0].message.content == two.choices[0].message.content


def ask_tokens(server, messages, budget):
    """The prompt tokens the live server counts for ``messages`` with a patch budget of its own asking."""
    done = server.openai().chat.completions.create(model=server.id, max_tokens=1, messages=messages,
                                                   extra_body={"image_patch_budget": budget})
    return done.usage.prompt_tokens


def test_the_towers_progress_reaches_a_remote_engine(k3_vision, live):
    """A Ferry server says where its vision tower is (progress comments); the window's remote engine
    turns them back into ImageProgress events."""
    from app.api import ImageProgress, RemoteEngine, TurnDone, TurnRequest

    server = live(k3_vision)
    messages = [{"role": "user", "content": [{"type": "text", "text": "What is this?"}, {
        "type": "image_url", "image_url": {"url": "data:image/png;base64," + png_b64((9, 99, 199))}}]}]
    remote = RemoteEngine(server.url, api_key=server.key)
    remote.check()
    events = list(remote.generate(TurnRequest(messages, max_tokens=3, image_patch_budget=16)))
    blocks = [(ev.image, ev.images, ev.block, ev.blocks) for ev in events if isinstance(ev, ImageProgress)]
    assert blocks == [(1, 1, b, 2) for b in range(3)] and isinstance(events[-1], TurnDone)
    assert events[-1].reason in ("stop", "length")
    # the window's patch budget went with the request: 40 x 30 px (the tiny tower's patch 4) at 16 patches
    # is 6 positions, at the server's default 20
    assert remote.request_body(TurnRequest(messages, image_patch_budget=16))["image_patch_budget"] == 16
    assert events[-1].prompt_tokens == ask_tokens(server, messages, 16) == ask_tokens(server, messages, 1024) - 14
