"""Anthropic's Messages API through the official `anthropic` client, for
every family: the demo (its Jinja template) against `ferry serve` in a
subprocess, a Hermes-style Jinja tool template and the tiny Kimi K3
(thinking and tool use) served in-process with a scripted sampler
(tests/scripted.py). The same conversation through the OpenAI endpoint gives
the same prompt: both go through the one turn pipeline."""
from __future__ import annotations

import json
from collections import Counter

import anthropic
import httpx
import pytest

from tests.scripted import script_ids, scripted_sampler
from tests.server.conftest import start_ferry_serve
from tests.server.test_tool_calls import CALLS, K3_END, K3_THINK, SCRIPTS

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
GREEDY = {"temperature": 0}   # sampling settings this SDK no longer names travel in extra_body
WEATHER = {"name": "get_weather", "description": "Weather in a city",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}
TIME = {"name": "get_time", "description": "The time in a zone",
        "input_schema": {"type": "object", "properties": {"zone": {"type": "string"}}}}
ASK = [{"role": "user", "content": "Weather and time in Oslo?"}]


def _client(served, key="unused", **kw) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=served.url.removesuffix("/v1"), api_key=key, max_retries=0, **kw)


def _raw(served, body, path="/messages", **kw) -> httpx.Response:
    return httpx.post(served.url + path, timeout=60, **({"json": body} if body is not None else {}), **kw)


def _anthropic_error(r: httpx.Response, status: int, kind: str, *words: str) -> dict:
    assert r.status_code == status, r.text
    body = r.json()
    assert body["type"] == "error" and set(body["error"]) == {"type", "message"} and body["error"]["type"] == kind
    assert all(w in body["error"]["message"] for w in words), body
    return body


RAW = ("message_start", "content_block_start", "content_block_delta", "content_block_stop", "message_delta",
       "message_stop")


def _events(stream) -> tuple[list[str], list]:
    """The server's events in a MessageStream (the SDK adds its own convenience events between them)."""
    events = [e for e in stream if e.type in RAW]
    return [e.type for e in events], events


def _well_formed(types: list[str]) -> None:
    """message_start, then blocks of start / deltas / stop, then message_delta and message_stop."""
    assert types[0] == "message_start" and types[-2:] == ["message_delta", "message_stop"]
    inside = False
    for t in types[1:-2]:
        if t == "content_block_start":
            assert not inside
            inside = True
        elif t == "content_block_stop":
            assert inside
            inside = False
        else:
            assert t == "content_block_delta" and inside, types
    assert not inside


# ---------------------------------------------------------------- the demo, a real `ferry serve`

def test_messages_answer_as_the_openai_endpoint_does(served):
    client = _client(served)
    oa = served.client().chat.completions.create(model=served.model, messages=QUESTION, max_tokens=12,
                                                 temperature=0)
    m = client.messages.create(model=served.model, max_tokens=12, messages=QUESTION, extra_body=GREEDY,
                               metadata={"user_id": "someone"})
    assert m.type == "message" and m.role == "assistant" and m.model == served.model and m.id.startswith("msg_")
    assert [b.type for b in m.content] == ["text"] and m.content[0].text == oa.choices[0].message.content
    assert "Paris" in m.content[0].text
    assert m.stop_reason == {"stop": "end_turn", "length": "max_tokens"}[oa.choices[0].finish_reason]
    assert m.stop_sequence is None
    assert m.usage.input_tokens + m.usage.cache_read_input_tokens == oa.usage.prompt_tokens
    assert m.usage.output_tokens == oa.usage.completion_tokens
    count = client.messages.count_tokens(model=served.model, messages=QUESTION)
    assert count.input_tokens == oa.usage.prompt_tokens
    # the system prompt as a string or as text blocks is the same prompt (the OpenAI system message)
    system = "Answer in one word."
    oa_sys = served.client().chat.completions.create(
        model=served.model, messages=[{"role": "system", "content": system}, *QUESTION], max_tokens=1)
    for given in (system, [{"type": "text", "text": system, "cache_control": {"type": "ephemeral"}}]):
        assert client.messages.count_tokens(model=served.model, system=given,
                                            messages=QUESTION).input_tokens == oa_sys.usage.prompt_tokens


def test_messages_stream_anthropics_event_sequence(served):
    client = _client(served)
    whole = client.messages.create(model=served.model, max_tokens=10, messages=QUESTION, extra_body=GREEDY)
    with client.messages.stream(model=served.model, max_tokens=10, messages=QUESTION, extra_body=GREEDY) as s:
        types, events = _events(s)
        final = s.get_final_message()
    _well_formed(types)
    assert types.count("content_block_start") == 1 and types.count("content_block_delta") >= 3   # it streamed
    assert all(e.delta.type == "text_delta" for e in events if e.type == "content_block_delta")
    assert final.content[0].text == whole.content[0].text and final.stop_reason == whole.stop_reason
    assert final.usage.output_tokens == whole.usage.output_tokens
    assert events[0].message.usage.input_tokens == client.messages.count_tokens(
        model=served.model, messages=QUESTION).input_tokens
    # the raw stream: named SSE events whose data's type is the event's name
    with httpx.stream("POST", served.url + "/messages", timeout=60,
                      json={"model": served.model, "max_tokens": 3, "stream": True, "messages": QUESTION}) as r:
        lines = [line for line in r.iter_lines() if line.startswith(("event:", "data:"))]
    names = [line.split(":", 1)[1].strip() for line in lines if line.startswith("event:")]
    datas = [json.loads(line.split(":", 1)[1]) for line in lines if line.startswith("data:")]
    assert names == [d["type"] for d in datas] and names[0] == "message_start" and names[-1] == "message_stop"


def test_stop_sequences_and_max_tokens(served):
    client = _client(served)
    full = client.messages.create(model=served.model, max_tokens=12, messages=QUESTION,
                                  extra_body=GREEDY).content[0].text
    m = client.messages.create(model=served.model, max_tokens=12, messages=QUESTION, extra_body=GREEDY,
                               stop_sequences=["zzz", "Paris"])
    assert m.stop_reason == "stop_sequence" and m.stop_sequence == "Paris"
    assert m.content[0].text == full[:full.index("Paris")]
    with client.messages.stream(model=served.model, max_tokens=12, messages=QUESTION, extra_body=GREEDY,
                                stop_sequences=["Paris"]) as s:
        final = s.get_final_message()
    assert (final.stop_reason, final.stop_sequence, final.content[0].text) == ("stop_sequence", "Paris",
                                                                             m.content[0].text)
    short = client.messages.create(model=served.model, max_tokens=2, messages=QUESTION, extra_body=GREEDY)
    assert short.stop_reason == "max_tokens" and short.usage.output_tokens == 2


def test_messages_errors_are_anthropic_errors(served):
    ok = {"model": served.model, "max_tokens": 4, "messages": QUESTION}
    _anthropic_error(_raw(served, {k: v for k, v in ok.items() if k != "max_tokens"}), 400, "invalid_request_error",
                     "max_tokens")
    _anthropic_error(_raw(served, {**ok, "frobnicate": 1}), 400, "invalid_request_error", "frobnicate")
    _anthropic_error(_raw(served, {**ok, "max_tokens": 0}), 400, "invalid_request_error", "max_tokens")
    _anthropic_error(_raw(served, {**ok, "temperature": 1.5}), 400, "invalid_request_error", "temperature")
    _anthropic_error(_raw(served, None, content=b"{not json", headers={"content-type": "application/json"}),
                     400, "invalid_request_error", "JSON")
    _anthropic_error(_raw(served, {**ok, "model": "claude-opus"}), 404, "not_found_error", "claude-opus")
    _anthropic_error(_raw(served, {**ok, "tools": [WEATHER]}), 400, "invalid_request_error", "does not take tools")
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}
    _anthropic_error(_raw(served, {**ok, "messages": [{"role": "user", "content": [image]}]}), 400,
                     "invalid_request_error", "cannot see images")   # a model without a vision tower
    document = {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "x"}}
    _anthropic_error(_raw(served, {**ok, "messages": [{"role": "user", "content": [document]}]}), 400,
                     "invalid_request_error", "messages[0].content", "'document' block")
    _anthropic_error(_raw(served, {**ok, "messages": [*QUESTION, {"role": "assistant", "content": "The"}]}), 400,
                     "invalid_request_error", "prefill")
    _anthropic_error(_raw(served, {**ok, "thinking": {"type": "enabled", "budget_tokens": 8}}), 400,
                     "invalid_request_error", "budget_tokens")
    surrogate = json.dumps({**ok, "messages": [{"role": "user", "content": "\ud800"}]}).encode()   # ASCII escape
    _anthropic_error(_raw(served, None, content=surrogate, headers={"content-type": "application/json"}), 400,
                     "invalid_request_error", "surrogate")
    _anthropic_error(_raw(served, {"model": served.model, "messages": QUESTION, "max_tokens": 1},
                          path="/messages/nope"), 404, "not_found_error")
    _anthropic_error(httpx.get(served.url + "/messages", timeout=10), 405, "invalid_request_error")
    _anthropic_error(_raw(served, {**ok, "stop_sequences": ["a", "b", "c", "d", "e"]}), 400,
                     "invalid_request_error", "stop_sequences")
    with pytest.raises(anthropic.NotFoundError):
        _client(served).messages.create(model="claude-sonnet-4-5", max_tokens=4, messages=QUESTION)
    with pytest.raises(anthropic.NotFoundError) as info:   # the OpenAI habit of a base URL ending in /v1
        anthropic.Anthropic(base_url=served.url, api_key="x", max_retries=0).messages.create(
            model=served.model, max_tokens=4, messages=QUESTION)
    assert "/v1 twice" in info.value.message
    # the OpenAI endpoints keep OpenAI's error shape
    r = httpx.post(served.url + "/chat/completions", json={"model": served.model}, timeout=10)
    assert r.status_code == 400 and set(r.json()) == {"error"} and r.json()["error"]["param"] == "messages"


def test_the_key_is_checked_for_anthropic_clients(demo_container, tmp_path):
    keyed = start_ferry_serve(demo_container, tmp_path, "--max-tokens", "8", env={"FERRY_API_KEY": "s3cret"})
    try:
        m = _client(keyed, "s3cret").messages.create(model=keyed.model, max_tokens=2, messages=QUESTION)
        assert m.content[0].text and m.usage.output_tokens <= 2              # x-api-key, with anthropic-version
        # an agent's large max_tokens is capped at the server's --max-tokens (8 here), not refused
        big = _client(keyed, "s3cret").messages.create(model=keyed.model, max_tokens=4096, messages=QUESTION,
                                                       extra_body=GREEDY)
        assert big.usage.output_tokens <= 8 and big.stop_reason in ("max_tokens", "end_turn")
        bearer = anthropic.Anthropic(base_url=keyed.url.removesuffix("/v1"), auth_token="s3cret", max_retries=0)
        assert bearer.messages.count_tokens(model=keyed.model, messages=QUESTION).input_tokens > 10
        with pytest.raises(anthropic.AuthenticationError) as info:
            _client(keyed, "wrong").messages.create(model=keyed.model, max_tokens=2, messages=QUESTION)
        assert info.value.body["error"]["type"] == "authentication_error"
        for headers in ({}, {"x-api-key": "wrong"}, {"authorization": "Bearer wrong"}):
            _anthropic_error(_raw(keyed, {"model": keyed.model, "messages": QUESTION}, "/messages/count_tokens",
                                  headers=headers), 401, "authentication_error", "x-api-key")
        # x-api-key opens the OpenAI endpoints too (one key, either header)
        r = httpx.get(keyed.url + "/models", headers={"x-api-key": "s3cret"}, timeout=10)
        assert r.status_code == 200 and r.json()["data"][0]["id"] == keyed.model
    finally:
        keyed.stop()


# ---------------------------------------------------------------- tool use: a Hermes template and K3

@pytest.fixture
def scripted_live(tool_templates, tiny_k3, live, monkeypatch):
    """``start(family)``: a served model whose next answers ``say(text)`` scripts."""

    def start(name: str):
        server = live(tiny_k3 if name == "k3" else tool_templates[name])
        script = scripted_sampler(monkeypatch, min(server.model.tokenizer.eos_ids))
        markers = ("<|open|>", "<|close|>", "<|sep|>", "<|end_of_msg|>") if name == "k3" else ()

        def say(text: str) -> None:
            script.ids = script_ids(server.model, text, markers)

        return server, say

    return start


@pytest.mark.parametrize("name", ["hermes", "llama31", "k3"])
def test_tool_use_round_trip(scripted_live, name):
    server, say = scripted_live(name)
    client = server.anthropic()
    thinking = {"type": "enabled", "budget_tokens": 200} if name == "k3" else None
    ask = dict(model=server.id, max_tokens=400, messages=ASK, tools=[WEATHER, TIME], extra_body=GREEDY,
               **({"thinking": thinking} if thinking else {}))

    say(SCRIPTS[name]["two"])
    m = client.messages.create(**ask)
    kinds = [b.type for b in m.content]
    assert kinds == (["thinking", "text", "tool_use", "tool_use"] if name == "k3" else ["tool_use", "tool_use"])
    uses = [b for b in m.content if b.type == "tool_use"]
    assert [(b.name, b.input) for b in uses] == CALLS and len({b.id for b in uses}) == 2
    assert m.stop_reason == "tool_use" and all(b.id.startswith("toolu_") for b in uses)
    if name == "k3":
        assert m.content[0].thinking == "Two lookups." and m.content[1].text == "One moment."

    with client.messages.stream(**ask) as s:
        types, events = _events(s)
        final = s.get_final_message()
    _well_formed(types)
    deltas = [e.delta.type for e in events if e.type == "content_block_delta"]
    pieces = Counter(e.index for e in events if e.type == "content_block_delta" and e.delta.type == "input_json_delta")
    assert len(pieces) == 2 and min(pieces.values()) >= 3   # each input streams in pieces as it is written
    assert ("thinking_delta" in deltas and "text_delta" in deltas) == (name == "k3")
    assert [b.type for b in final.content] == kinds and final.stop_reason == "tool_use"
    assert [(b.name, b.input) for b in final.content if b.type == "tool_use"] == CALLS

    # the results go back as tool_result blocks (the thinking block echoed back as clients do)
    history = [*ASK, {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in m.content]},
               {"role": "user", "content": [
                   {"type": "tool_result", "tool_use_id": uses[0].id, "content": "12 C"},
                   {"type": "tool_result", "tool_use_id": uses[1].id,
                    "content": [{"type": "text", "text": "14:00"}]}]}]
    say(SCRIPTS[name]["answer"])
    after = client.messages.create(**{**ask, "messages": history})
    assert [b.text for b in after.content if b.type == "text"] == ["It is 12 C in Oslo."]
    assert after.stop_reason == "end_turn"
    # the same conversation through the OpenAI endpoint: the same prompt
    oa_history = [*ASK, {"role": "assistant", "content": "One moment." if name == "k3" else None,
                         **({"reasoning_content": "Two lookups."} if name == "k3" else {}),
                         "tool_calls": [{"id": b.id, "type": "function",
                                         "function": {"name": b.name, "arguments": json.dumps(b.input)}}
                                        for b in uses]},
                  {"role": "tool", "tool_call_id": uses[0].id, "content": "12 C"},
                  {"role": "tool", "tool_call_id": uses[1].id, "content": "14:00"}]
    oa_tools = [{"type": "function", "function": {"name": t["name"], "description": t["description"],
                                                  "parameters": t["input_schema"]}} for t in (WEATHER, TIME)]
    oa = server.openai().chat.completions.create(model=server.id, messages=oa_history, tools=oa_tools,
                                                 max_tokens=400, temperature=0,
                                                 **({} if name == "k3" else {"reasoning_effort": "none"}))
    counted = client.messages.count_tokens(model=server.id, messages=history, tools=[WEATHER, TIME],
                                           **({"thinking": thinking} if thinking else {}))
    assert counted.input_tokens == oa.usage.prompt_tokens
    assert after.usage.input_tokens + after.usage.cache_read_input_tokens == oa.usage.prompt_tokens

    # tool_choice: any (a call is opened or required), a named tool, one call only
    if name == "k3":
        with pytest.raises(anthropic.BadRequestError) as info:   # as Anthropic's API: no thinking when forced
            client.messages.create(**ask, tool_choice={"type": "any"})
        assert "tool_choice" in info.value.body["error"]["message"]
        ask.pop("thinking")
    say(SCRIPTS[name]["required"])
    forced = client.messages.create(**ask, tool_choice={"type": "any"})
    assert [(b.name, b.input) for b in forced.content if b.type == "tool_use"] == CALLS[:1]
    say(SCRIPTS[name]["named"])
    named = client.messages.create(**ask, tool_choice={"type": "tool", "name": "get_time"})
    assert [(b.name, b.input) for b in named.content if b.type == "tool_use"] == CALLS[1:]
    assert named.stop_reason == "tool_use" and not any(b.type == "thinking" for b in named.content)
    say(SCRIPTS[name]["two"])
    single = client.messages.create(**ask, tool_choice={"type": "auto", "disable_parallel_tool_use": True})
    assert [(b.name, b.input) for b in single.content if b.type == "tool_use"] == CALLS[:1]
    none = client.messages.count_tokens(model=server.id, messages=ASK, tools=[WEATHER, TIME],
                                        tool_choice={"type": "none"})
    assert none.input_tokens != client.messages.count_tokens(model=server.id, messages=ASK,
                                                             tools=[WEATHER, TIME]).input_tokens


def test_k3_thinking_follows_the_thinking_setting(scripted_live):
    """K3's thinking mode is on with thinking enabled (the trace is a thinking block) and off without it:
    the prompt opens the response, so the same written text is the answer."""
    server, say = scripted_live("k3")
    client = server.anthropic()
    text = "Hmm.<|close|>think<|sep|><|open|>response<|sep|>Hello.<|close|>response<|sep|>" + K3_END
    say(text)
    on = client.messages.create(model=server.id, max_tokens=300, messages=ASK, extra_body=GREEDY,
                                thinking={"type": "enabled", "budget_tokens": 100})
    assert [(b.type, getattr(b, "thinking", None) or getattr(b, "text", None)) for b in on.content] == \
        [("thinking", "Hmm."), ("text", "Hello.")]
    say("Hello there." + "<|close|>response<|sep|>" + K3_END)
    for off in ({}, {"thinking": {"type": "disabled"}}):
        m = client.messages.create(model=server.id, max_tokens=300, messages=ASK, extra_body=GREEDY, **off)
        assert [(b.type, b.text) for b in m.content] == [("text", "Hello there.")]
    say(text)
    with client.messages.stream(model=server.id, max_tokens=300, messages=ASK, extra_body=GREEDY,
                                thinking={"type": "adaptive"}) as s:
        types, events = _events(s)
    _well_formed(types)
    assert [e.content_block.type for e in events if e.type == "content_block_start"] == ["thinking", "text"]
    assert [e.delta.type for e in events if e.type == "content_block_delta"][:1] == ["thinking_delta"]
    # an unknown tool in a tool_use the model never made is still just history; a result naming no call is refused
    bad = [*ASK, {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_x", "content": "1"}]}]
    with pytest.raises(anthropic.BadRequestError) as info:
        client.messages.create(model=server.id, max_tokens=10, messages=bad)
    assert "toolu_x" in info.value.body["error"]["message"]


@pytest.mark.parametrize("name", ["k3", "hermes"])
def test_thinking_budget_tokens_caps_the_thinking(scripted_live, name):
    """``thinking.budget_tokens`` is a hard cap: once the answer has thought that many tokens, the markup that
    ends its thinking (K3's, or ``</think>``) is written for it and it answers. The model here would think on
    for 40 words, so the rest of its words and its answer land in the text block."""
    server, say = scripted_live(name)
    client = server.anthropic()
    words = " ".join(f"w{i}" for i in range(40))
    text = (f"{words}<|close|>think<|sep|><|open|>response<|sep|>Hello.<|close|>response<|sep|>" + K3_END
            if name == "k3" else f"<think>{words}</think>Hello.")
    say(text)
    markers = ("<|open|>", "<|close|>", "<|sep|>", "<|end_of_msg|>") if name == "k3" else ()
    ids = script_ids(server.model, text, markers)
    start = 0 if name == "k3" else len(script_ids(server.model, "<think>", ()))
    ask = dict(model=server.id, max_tokens=300, messages=ASK, extra_body=GREEDY)

    free = client.messages.create(**ask, thinking={"type": "enabled", "budget_tokens": 200})
    assert [b.type for b in free.content] == ["thinking", "text"]
    assert free.content[0].thinking.strip() == words and free.content[1].text == "Hello."

    budget = 6
    capped = client.messages.create(**ask, thinking={"type": "enabled", "budget_tokens": budget})
    thought = server.model.tokenizer.decode(ids[start:start + budget])
    assert [b.type for b in capped.content] == ["thinking", "text"]
    assert capped.content[0].thinking == thought and len(thought) < len(words)
    assert capped.content[1].text.endswith("Hello.") and capped.content[1].text.strip().startswith(
        words[len(thought):].strip()[:3])   # the model's next words, after its thinking was closed
    with client.messages.stream(**ask, thinking={"type": "enabled", "budget_tokens": budget}) as s:
        types, events = _events(s)
    _well_formed(types)
    assert "".join(e.delta.thinking for e in events if e.type == "content_block_delta"
                   and e.delta.type == "thinking_delta") == thought


#: A call whose input breaks after part of it streamed: Hermes JSON with a stray comma; in K3 a raw json
#: element after a string argument had already streamed (the input went another way).
BROKEN = {"hermes": '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo",, }}\n</tool_call>',
          "k3": K3_THINK + '<|open|>tools<|sep|><|open|>call tool="get_weather"<|sep|><|open|>argument key="city" '
                'type="string"<|sep|>Oslo<|close|>argument<|sep|><|open|>json<|sep|>{"zone": "CET"}<|close|>json'
                '<|sep|><|close|>call<|sep|><|close|>tools<|sep|>' + K3_END}


@pytest.mark.slow
@pytest.mark.parametrize("name", ["k3", "hermes"])
def test_tool_input_streams_in_pieces_from_a_live_ferry_serve(name, tool_templates, tiny_k3, tmp_path):
    """`ferry serve` in its own process (its sampler scripted by tests/tools/scripted_ferry.py): the SDK's
    stream helper gets each tool_use input in several input_json_delta events as the model writes it, and
    accumulates them into the object the non-streamed answer has. A call whose JSON breaks after pieces went
    (they cannot be taken back) ends the stream with an error event, which the SDK raises, so no client runs
    a cut input; the non-streamed answer keeps what the model wrote."""
    from app.model import LoadedModel

    container = tiny_k3 if name == "k3" else tool_templates[name]
    model = LoadedModel(container, threads=1, n_ctx=256)
    try:
        markers = ("<|open|>", "<|close|>", "<|sep|>", "<|end_of_msg|>") if name == "k3" else ()
        two, broken = (script_ids(model, t, markers) for t in (SCRIPTS[name]["two"], BROKEN[name]))
        eos = min(model.tokenizer.eos_ids)
    finally:
        model.close()
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"eos": eos, "answers": [two, two, broken, broken], "log": str(tmp_path / "log")}))
    served = start_ferry_serve(container, tmp_path, "--max-tokens", "400", script=script)
    try:
        client = _client(served)
        ask = dict(model=served.model, max_tokens=400, messages=ASK, tools=[WEATHER, TIME], extra_body=GREEDY)
        whole = client.messages.create(**ask)
        with client.messages.stream(**ask) as s:
            types, events = _events(s)
            final = s.get_final_message()
        _well_formed(types)
        uses = [b for b in final.content if b.type == "tool_use"]
        assert [(b.name, b.input) for b in uses] == CALLS == [(b.name, b.input) for b in whole.content
                                                              if b.type == "tool_use"]
        for block in (i for i, b in enumerate(final.content) if b.type == "tool_use"):
            pieces = [e.delta.partial_json for e in events
                      if e.type == "content_block_delta" and e.index == block and e.delta.type == "input_json_delta"]
            assert len(pieces) >= 3 and json.loads("".join(pieces)) == final.content[block].input

        kept = client.messages.create(**ask)
        (use,) = [b for b in kept.content if b.type == "tool_use"]
        assert use.input == ({"zone": "CET"} if name == "k3" else {"_raw_arguments": '{"city": "Oslo",, }}'})
        seen = []
        with pytest.raises(anthropic.APIStatusError) as info:
            with client.messages.stream(**ask) as s:
                for e in s:
                    seen.append(e)
        assert "get_weather is not valid JSON" in str(info.value)
        assert [e.type for e in seen if e.type in RAW][-1] == "content_block_stop"   # the block was closed first
        assert any(e.type == "content_block_delta" and e.delta.type == "input_json_delta" for e in seen)
    finally:
        served.stop()
