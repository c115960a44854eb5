"""`ferry serve` on the real demo model, through the official `openai` client."""
from __future__ import annotations

import threading
import time

import httpx
import openai
import pytest

from tests.conftest import run_ferry
from tests.server.conftest import engine_answer, start_ferry_serve

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


def test_models_lists_the_served_model(served):
    client = served.client()
    ids = [m.id for m in client.models.list()]
    assert ids == [served.model]
    assert client.models.retrieve(served.model).owned_by == "ferry"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-4o")


def test_non_streaming_answer_is_the_engines(served, demo_container):
    client = served.client()
    r = client.chat.completions.create(model=served.model, messages=QUESTION, max_tokens=12, temperature=0)
    assert r.object == "chat.completion"
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].message.content == engine_answer(demo_container, QUESTION, 12)
    assert "Paris" in r.choices[0].message.content
    assert r.choices[0].finish_reason in ("stop", "length")
    assert r.usage.prompt_tokens > 10 and 1 <= r.usage.completion_tokens <= 12
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    ferry = r.model_extra["ferry"]
    assert ferry["tok_per_s"] > 0 and ferry["bytes_read"] == 0 and ferry["hit_rate"] is None  # dense model
    # the same question again: the session reuses the prompt it already holds
    again = client.chat.completions.create(model=served.model, messages=QUESTION, max_tokens=12, temperature=0)
    assert again.choices[0].message.content == r.choices[0].message.content
    assert again.usage.prompt_tokens_details.cached_tokens == again.usage.prompt_tokens - 1


def test_streaming_gives_the_same_text_and_figures(served):
    client = served.client()
    whole = client.chat.completions.create(model=served.model, messages=QUESTION, max_tokens=10, temperature=0)
    chunks = list(client.chat.completions.create(model=served.model, messages=QUESTION, max_tokens=10,
                                                 temperature=0, stream=True,
                                                 stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert len([c for c in chunks if c.choices and c.choices[0].delta.content]) >= 3   # it really streamed
    finals = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finals) == 1 and finals[0].choices[0].finish_reason == whole.choices[0].finish_reason
    assert finals[0].model_extra["ferry"]["tok_per_s"] > 0
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    assert all(not c.choices or c.choices[0].delta.model_extra.get("reasoning_content") is None for c in chunks)


def test_stop_sequences(served):
    client = served.client()
    full = client.chat.completions.create(model=served.model, messages=QUESTION, max_tokens=12,
                                          temperature=0).choices[0].message.content
    word = "Paris"
    assert word in full
    r = client.chat.completions.create(model=served.model, messages=QUESTION, max_tokens=12, temperature=0,
                                       stop=["zzz", word])
    assert r.choices[0].message.content == full[:full.index(word)]
    assert r.choices[0].finish_reason == "stop"
    streamed = client.chat.completions.create(model=served.model, messages=QUESTION, max_tokens=12,
                                              temperature=0, stop=word, stream=True)
    pieces = [c.choices[0].delta.content or "" for c in streamed if c.choices]
    assert "".join(pieces) == full[:full.index(word)]


def test_sampling_is_seeded(served):
    client = served.client()
    ask = dict(model=served.model, messages=[{"role": "user", "content": "Write a word."}], max_tokens=8,
               temperature=1.2, top_p=0.95, seed=1234)
    a = client.chat.completions.create(**ask).choices[0].message.content
    b = client.chat.completions.create(**ask).choices[0].message.content
    assert a == b and a


def test_a_client_that_disconnects_cancels_its_answer(served):
    client = served.client()
    before = served.status()
    story = [{"role": "user", "content": "Tell me a long story about a lighthouse keeper."}]
    stream = client.chat.completions.create(model=served.model, messages=story, max_tokens=400, temperature=0,
                                            stream=True)
    got = 0
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            got += 1
            if got == 3:
                break
    stream.close()                                   # the client goes away mid-answer
    deadline = time.monotonic() + 10
    while served.status()["cancelled"] == before["cancelled"] and time.monotonic() < deadline:
        time.sleep(0.05)
    status = served.status()
    assert status["cancelled"] == before["cancelled"] + 1 and not status["busy"]
    # the engine is free at once: a short answer does not wait for 400 tokens
    t0 = time.monotonic()
    client.chat.completions.create(model=served.model, messages=QUESTION, max_tokens=2, temperature=0)
    assert time.monotonic() - t0 < 5


def test_a_non_streaming_client_that_leaves_cancels_too(served):
    before = served.status()["cancelled"]
    story = {"model": served.model, "messages": [{"role": "user", "content": "Write a long essay about rivers."}],
             "max_tokens": 400, "temperature": 0}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(served.url + "/chat/completions", json=story, timeout=httpx.Timeout(10, read=1.0))
    deadline = time.monotonic() + 10
    while served.status()["cancelled"] == before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert served.status()["cancelled"] == before + 1


def test_concurrent_requests_are_served_in_turn(served, demo_container):
    prompts = [[{"role": "user", "content": q}] for q in ("Name a colour.", "Name a fruit.", "Name a city.")]
    results: dict[int, object] = {}

    def ask(i):
        results[i] = served.client().chat.completions.create(model=served.model, messages=prompts[i],
                                                             max_tokens=6, temperature=0)

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(results) == [0, 1, 2]
    spans = sorted((r.model_extra["ferry"]["started"], r.model_extra["ferry"]["ended"]) for r in results.values())
    for (_, end), (start, _) in zip(spans, spans[1:]):
        assert start >= end                          # one engine, one answer at a time
    assert max(r.model_extra["ferry"]["queue_seconds"] for r in results.values()) > 0
    for i, r in results.items():                     # and each got its own answer
        assert r.choices[0].message.content == engine_answer(demo_container, prompts[i], 6)


def _post(served, body, **kw):
    return httpx.post(served.url + "/chat/completions", timeout=30, **({"json": body} | kw) if body is not None
                      else kw)


def _error(r, status, code=None, param=None):
    assert r.status_code == status, r.text
    assert "Traceback" not in r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    if code:
        assert err["code"] == code, err
    if param:
        assert err["param"] == param, err
    return err


def test_bad_input_gets_openai_error_objects(served):
    ok = {"model": served.model, "messages": QUESTION, "max_tokens": 2}
    headers = {"content-type": "application/json"}
    _error(_post(served, None, content=b'{"model": ', headers=headers), 400, "invalid_json")
    _error(_post(served, None, content=b"[1, 2]", headers=headers), 400)
    _error(_post(served, None, content=b"model=x", headers={"content-type": "text/plain"}), 400)
    _error(_post(served, {**ok, "frobnicate": True}), 400, "unknown_parameter", "frobnicate")
    _error(_post(served, {**ok, "messages": [{"role": "user", "content": "hi", "mood": "x"}]}), 400,
           "unknown_parameter", "messages[0].mood")
    _error(_post(served, {**ok, "max_tokens": "2"}), 400, "invalid_value", "max_tokens")
    _error(_post(served, {**ok, "max_tokens": 100000}), 400, param="max_tokens")
    _error(_post(served, {**ok, "temperature": -1}), 400, param="temperature")
    _error(_post(served, {**ok, "n": 2}), 400, param="n")
    _error(_post(served, {**ok, "messages": []}), 400, param="messages")
    _error(_post(served, {"messages": QUESTION}), 400, "missing_required_parameter", "model")
    _error(_post(served, {**ok, "model": "gpt-4o"}), 404, "model_not_found", "model")
    _error(_post(served, {**ok, "stop": ["a", "b", "c", "d", "e"]}), 400, param="stop")
    _error(_post(served, {**ok, "tools": [{"type": "function", "function": {"name": "f"}}]}), 400, param="tools")
    _error(_post(served, {**ok, "response_format": {"type": "json_object"}}), 400, param="response_format")
    _error(_post(served, {**ok, "messages": [{"role": "user", "content": "word " * 3000}]}), 400,
           "context_length_exceeded")
    _error(_post(served, None, content=b"x" * (5 << 20), headers=headers), 413, "request_too_large")
    _error(httpx.get(served.url + "/chat/completions"), 405)
    _error(httpx.get(served.url + "/nothing-here"), 404)
    # the openai client surfaces them as its own exceptions
    client = served.client()
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=served.model, messages=QUESTION, extra_body={"bogus": 1})
    assert info.value.code == "unknown_parameter" and info.value.param == "bogus"
    # and the server is still fine
    assert client.chat.completions.create(model=served.model, messages=QUESTION, max_tokens=2).choices


def test_a_page_cannot_reach_it_by_dns_rebinding(served):
    r = httpx.get(served.url + "/models", headers={"Host": "evil.example:8000"})
    _error(r, 400, "invalid_host")


def test_api_key_and_network_binding(demo_container, tmp_path):
    res = run_ferry("serve", str(demo_container), "--host", "0.0.0.0", "--port", "0", check=False,
                    env={"FERRY_API_KEY": ""})
    assert res.returncode == 2 and "needs an API key" in res.stderr and "0.0.0.0" in res.stderr
    keyed = start_ferry_serve(demo_container, tmp_path, "--max-tokens", "8", env={"FERRY_API_KEY": "s3cret"})
    try:
        keyed.key = "s3cret"
        with pytest.raises(openai.AuthenticationError):
            keyed.client(api_key="wrong").models.list()
        _error(httpx.get(keyed.url + "/models"), 401, "invalid_api_key")
        r = keyed.client(api_key="s3cret").chat.completions.create(model=keyed.model, messages=QUESTION,
                                                                    max_tokens=2)
        assert r.choices[0].message.content
        assert keyed.status()["served"] == 1
    finally:
        keyed.stop()
