"""The cost of an image made visible and not paid twice (issue 38): the vision tower reports each block
(``ImageProgress``) before the prompt is read, a cancel stops it between blocks, and a second question
about the same image resumes from the state the first turn kept (K3's KDA layers cannot rewind), with an
answer bit-identical to a fresh engine reading the whole prompt; through the API (the engine service)
and ``ferry chat``."""
from __future__ import annotations

import io
import re
import time

import pytest

from app.api import EngineService, ImageProgress, PromptProgress, SamplingParams, TurnDone, TurnRequest
from app.model import LoadedModel
from app.vision import image as vi
from tests.kimi import tiny_k3
from tests.kimi.test_images import png


def first(color=(200, 30, 10)) -> list[dict]:
    return [{"role": "user", "content": [{"type": "text", "text": "What is this?"},
                                         {"type": "image_url", "image_url": {"url": vi.data_url(png(50, 30, color))}}]}]


def request(messages, thinking=True, client="local") -> TurnRequest:
    return TurnRequest(messages, image_patch_budget=64, max_tokens=6, thinking=thinking, top_logprobs=3,
                       sampling=SamplingParams(temperature=0.0), client=client)


def follow_up(messages, done: TurnDone) -> list[dict]:
    return [*messages, {"role": "assistant", "content": done.content, "reasoning_content": done.reasoning or None},
            {"role": "user", "content": "And what colour is it?"}]


def answer(service: EngineService, req: TurnRequest, cancel_at_block: int | None = None):
    events, stream = [], service.submit(req)
    for ev in stream:
        events.append(ev)
        if cancel_at_block is not None and isinstance(ev, ImageProgress) and ev.block == cancel_at_block:
            stream.cancel()
    return events, events[-1]


def test_the_tower_reports_each_block_before_the_prompt(k3v):
    k3v.__dict__.get("_image_rows", {}).clear()
    service = EngineService(k3v, k3v.new_session(512))
    try:
        events, done = answer(service, request(first()))
        blocks = int(k3v.vision_config["layers"])
        images = [ev for ev in events if isinstance(ev, ImageProgress)]
        assert [(ev.image, ev.images, ev.block, ev.blocks) for ev in images] == \
            [(1, 1, b, blocks) for b in range(blocks + 1)]
        assert images[-1].label == f"Reading the image: block {blocks} of {blocks}"
        # the tower's blocks come before any of the prompt is read, then the prompt's positions
        kinds = [type(ev) for ev in events if isinstance(ev, (ImageProgress, PromptProgress))]
        last_image = max(i for i, k in enumerate(kinds) if k is ImageProgress)
        reads = [ev for ev in events if isinstance(ev, PromptProgress)]
        assert all(ev.done == 0 for ev in reads[:1]) and kinds[last_image + 1:] == [PromptProgress] * \
            len(kinds[last_image + 1:]) and reads[-1].done == reads[-1].total == done.prompt_tokens
        # the same image again: no tower (its rows are kept), no block events
        events, _ = answer(service, request(first()))
        assert not any(isinstance(ev, ImageProgress) for ev in events)
        assert ImageProgress(2, 3, 5, 27).label == "Reading image 2 of 3: block 5 of 27"
    finally:
        service.close()


def test_a_cancel_in_the_tower_stops_it_and_loses_nothing(k3v, monkeypatch):
    k3v.__dict__.get("_image_rows", {}).clear()
    image_rows = LoadedModel.image_rows

    def slow_tower(self, image, observer=None):   # the tiny tower's blocks take as long as real ones would
        return image_rows(self, image, lambda stage, rows: (time.sleep(0.2), observer(stage, rows))[1])

    monkeypatch.setattr(LoadedModel, "image_rows", slow_tower)
    service = EngineService(k3v, k3v.new_session(512))
    try:
        events, done = answer(service, request(first((1, 2, 3))), cancel_at_block=1)
        blocks = [ev.block for ev in events if isinstance(ev, ImageProgress)]
        assert done.reason == "cancelled" and blocks == [0, 1]     # stopped at the next block
        assert not k3v._image_rows and not any(isinstance(ev, PromptProgress) and ev.done for ev in events)
        _, again = answer(service, request(first((1, 2, 3))))
        fresh = EngineService(k3v, k3v.new_session(512))
        try:
            _, want = answer(fresh, request(first((1, 2, 3))))
        finally:
            fresh.close()
        assert again.reason == want.reason and again.token_ids == want.token_ids and again.logprobs == want.logprobs
    finally:
        service.close()


@pytest.mark.parametrize("thinking", [True, False])
def test_a_second_question_resumes_from_the_kept_state(k3v, thinking):
    """The follow-up reads only what follows the first prompt (not the image's positions again) and answers
    exactly as a fresh engine reading its whole prompt (ids and log-probabilities, bit for bit)."""
    assert k3v.recurrent
    service = EngineService(k3v, k3v.new_session(512))
    fresh = EngineService(k3v, k3v.new_session(512))
    try:
        _, one = answer(service, request(first(), thinking))
        image_positions = one.prompt_ids.count(tiny_k3.MEDIA_PAD)
        assert one.reason == "length" and image_positions == 24
        point = service.session.resume_point[0].tokens
        assert one.prompt_ids[:len(point)] == one.prompt_ids[:len(point)] and len(point) > image_positions
        second = request(follow_up(first(), one), thinking)
        _, two = answer(service, second)
        assert two.reused_tokens == len(point) and two.prompt_ids[:len(point)] == one.prompt_ids[:len(point)]
        assert two.prompt_tokens - two.reused_tokens < two.prompt_tokens - image_positions
        _, want = answer(fresh, second)
        assert want.reused_tokens == 0
        assert two.token_ids == want.token_ids and two.logprobs == want.logprobs and two.content == want.content
        # the same prompt again (Regenerate): nothing is read, the kept logits answer
        _, three = answer(service, second)
        assert three.token_ids == want.token_ids and three.logprobs == want.logprobs
        assert three.reused_tokens >= len(second_point := service.session.resume_point[0].tokens) and second_point
        # another client never starts from this one's state
        _, other = answer(service, request(follow_up(first(), one), thinking, client="b"))
        assert other.reused_tokens == 0 and other.token_ids == want.token_ids
    finally:
        service.close()
        fresh.close()


def test_a_model_that_rewinds_keeps_no_state(demo_container):
    from app.chat.turn import ChatFormat

    model = LoadedModel(demo_container)
    try:
        assert not model.recurrent
        p = ChatFormat(model).prepare(TurnRequest([{"role": "user", "content": "Hi"}], max_tokens=2), n_ctx=256)
        assert p.resume_len == 0
    finally:
        model.close()


def test_ferry_chat_asks_about_an_image_twice_reading_it_once(k3v, tmp_path, monkeypatch, capsys):
    from app.cli import main as ferry

    red = tmp_path / "red.png"
    red.write_bytes(png(50, 30))
    monkeypatch.setattr("sys.stdin", io.StringIO(f"/image {red}\nWhat is it?\nAnd its colour?\n\n"))
    assert ferry(["chat", str(k3v.path), "-n", "3", "--threads", "2", "--image-budget", "64"]) == 0
    err = capsys.readouterr().err
    figures = [(int(a), int(b)) for a, b in re.findall(r"(\d+) prompt tokens evaluated, (\d+) reused", err)]
    assert len(figures) == 2 and figures[0][0] > 24 and figures[0][1] == 0
    # the second question starts from the state after the first prompt (the image's positions in it)
    assert figures[1][1] == figures[0][0]


def test_the_resume_point_follows_the_turns_the_context_kept(k3v):
    """With the oldest turns left out to fit the context, the follow-up still begins with this prompt."""
    from app.chat.turn import ChatFormat

    long = [{"role": "system", "content": "Be brief."}]
    for i in range(12):
        long += [{"role": "user", "content": f"Question {i}: " + "word " * 20},
                 {"role": "assistant", "content": f"Answer {i}: " + "more " * 20}]
    long.append({"role": "user", "content": "The last question?"})
    p = ChatFormat(k3v).prepare(TurnRequest(long, context="drop_oldest", max_tokens=8), n_ctx=512)
    assert p.dropped > 0 and p.resume_len == len(p.prompt)
    follow = [*long[:1], *long[1 + p.dropped:], {"role": "assistant", "content": "Yes."},
              {"role": "user", "content": "Next?"}]
    again = ChatFormat(k3v).prepare(TurnRequest(follow, max_tokens=8), n_ctx=4096)
    assert again.prompt[:p.resume_len] == p.prompt[:p.resume_len]
