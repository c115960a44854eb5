"""Tool calling end to end through the official `openai` client, for the
formats that have tool calls: Kimi K3's own, and Jinja templates in the
Hermes / Qwen and Llama 3.1 shapes (tests/server/tool_templates.py on the
demo model). The models never write a call on their own, so the sampler is
scripted (tests/scripted.py): the engine decodes every step and the server
parses what the model "wrote" — non-streamed and streamed calls, parallel
calls, parallel_tool_calls=false, results fed back into the prompt, and
tool_choice none / auto / required / a named function — and refuses with a
400 what a format cannot do."""
from __future__ import annotations

import json

import openai
import pytest

from app.chat.turn import ChatFormat, TurnRequest
from tests.scripted import script_ids, scripted_sampler

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                             "parameters": {"type": "object",
                                                            "properties": {"city": {"type": "string"}}}}}
TIME = {"type": "function", "function": {"name": "get_time", "description": "The time in a zone",
                                          "parameters": {"type": "object", "properties": {"zone": {"type": "string"}}}}}
TOOLS = [WEATHER, TIME]
ASK = [{"role": "user", "content": "Weather and time in Oslo?"}]
CALLS = [("get_weather", {"city": "Oslo"}), ("get_time", {"zone": "CET"})]


def _hermes(name, args):
    return f'<tool_call>\n{json.dumps({"name": name, "arguments": args})}\n</tool_call>'


def _k3_call(i, name, args):
    arg = "".join(f'<|open|>argument key="{k}" type="string"<|sep|>{v}<|close|>argument<|sep|>' for k, v in args.items())
    return f'<|open|>call tool="{name}" index="{i}"<|sep|>{arg}<|close|>call<|sep|>'


K3_END = "<|close|>message<|sep|><|end_of_msg|>"
K3_THINK = "Two lookups.<|close|>think<|sep|><|open|>response<|sep|>One moment.<|close|>response<|sep|>"
#: family -> what the model writes: two calls; an answer after the results; the rest of a call after
#: tool_choice "required" opened it; the rest of a get_time call after tool_choice named it.
SCRIPTS = {
    "hermes": dict(
        two=_hermes(*CALLS[0]) + "\n" + _hermes(*CALLS[1]),
        answer="It is 12 C in Oslo.",
        required='get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>',
        named='{"zone": "CET"}}\n</tool_call>'),
    "llama31": dict(
        two='{"name": "get_weather", "parameters": {"city": "Oslo"}}; {"name": "get_time", "parameters": {"zone": "CET"}}',
        answer="It is 12 C in Oslo.",
        required='get_weather", "parameters": {"city": "Oslo"}}',
        named='{"zone": "CET"}}'),
    "k3": dict(
        two=K3_THINK + "<|open|>tools<|sep|>" + _k3_call(1, *CALLS[0]) + _k3_call(2, *CALLS[1])
        + "<|close|>tools<|sep|>" + K3_END,
        answer="Done.<|close|>think<|sep|><|open|>response<|sep|>It is 12 C in Oslo.<|close|>response<|sep|>" + K3_END,
        required=K3_THINK + "<|open|>tools<|sep|>" + _k3_call(1, *CALLS[0]) + "<|close|>tools<|sep|>" + K3_END,
        named='<|open|>argument key="zone" type="string"<|sep|>CET<|close|>argument<|sep|><|close|>call<|sep|>'
              '<|close|>tools<|sep|>' + K3_END),
}


@pytest.fixture
def family(request, tool_templates, tiny_k3, live, monkeypatch):
    """A served model of ``request.param``, its scripted sampler, and ``say(key)`` to script the next answer."""
    name = request.param
    server = live(tiny_k3 if name == "k3" else tool_templates[name])
    script = scripted_sampler(monkeypatch, min(server.model.tokenizer.eos_ids))
    markers = ("<|open|>", "<|close|>", "<|sep|>", "<|end_of_msg|>") if name == "k3" else ()

    def say(key: str) -> None:
        script.ids = script_ids(server.model, SCRIPTS[name][key], markers)

    return name, server, say


def _calls(tool_calls) -> list[tuple[str, dict]]:
    return [(c.function.name, json.loads(c.function.arguments)) for c in tool_calls or ()]


def _streamed(client, **kw):
    """The tool calls a stream builds from its deltas (as clients merge them), and the finish reason."""
    merged: dict[int, dict] = {}
    finish = None
    for chunk in client.chat.completions.create(stream=True, **kw):
        if not chunk.choices:
            continue
        finish = chunk.choices[0].finish_reason or finish
        for d in chunk.choices[0].delta.tool_calls or ():
            slot = merged.setdefault(d.index, {"id": None, "name": "", "arguments": ""})
            assert d.type in (None, "function")
            slot["id"] = d.id or slot["id"]
            slot["name"] += d.function.name or ""
            slot["arguments"] += d.function.arguments or ""
    assert sorted(merged) == list(range(len(merged)))   # indexes 0, 1, ...
    return [(v["id"], v["name"], json.loads(v["arguments"])) for _, v in sorted(merged.items())], finish


@pytest.mark.parametrize("family", ["hermes", "llama31", "k3"], indirect=True)
def test_tool_calls_round_trip_through_the_openai_client(family):
    name, server, say = family
    client = server.openai()
    ask = dict(model=server.id, messages=ASK, tools=TOOLS, max_tokens=400, temperature=0)

    say("two")   # parallel calls, non-streamed and streamed
    r = client.chat.completions.create(**ask)
    msg = r.choices[0].message
    assert r.choices[0].finish_reason == "tool_calls" and _calls(msg.tool_calls) == CALLS
    assert len({c.id for c in msg.tool_calls}) == 2 and all(c.type == "function" for c in msg.tool_calls)
    assert (msg.content is None) == (name != "k3")   # K3 also said "One moment."
    streamed, finish = _streamed(client, **ask)
    assert finish == "tool_calls" and [(n, a) for _, n, a in streamed] == CALLS and all(i for i, _, _ in streamed)

    one = client.chat.completions.create(**ask, parallel_tool_calls=False)   # the answer ends at its first call
    assert _calls(one.choices[0].message.tool_calls) == CALLS[:1] and one.choices[0].finish_reason == "tool_calls"
    if name != "llama31":   # a Llama 3.1 answer is read whole; the others stop generating at the first call
        assert one.usage.completion_tokens < r.usage.completion_tokens

    # the results fed back: role "tool" messages answering the calls by id
    history = [*ASK, msg.model_dump(exclude_none=True),
               {"role": "tool", "tool_call_id": msg.tool_calls[0].id, "content": "12 C"},
               {"role": "tool", "tool_call_id": msg.tool_calls[1].id, "content": "14:00"}]
    say("answer")
    after = client.chat.completions.create(**{**ask, "messages": history})
    assert after.choices[0].message.content == "It is 12 C in Oslo." and after.choices[0].finish_reason == "stop"
    local = ChatFormat(server.model).prepare(TurnRequest(messages=[{k: v for k, v in m.items() if k != "refusal"}
                                                                   for m in history], tools=TOOLS), n_ctx=1 << 30)
    assert after.usage.prompt_tokens == len(local.prompt)           # the server's prompt is the pipeline's
    assert ("12 C", False) in local.segments and ("14:00", False) in local.segments   # results are content
    assert any("get_time" in text for text, _ in local.segments)    # and the calls are in the history

    say("two")   # tool_choice none: the tools leave the prompt (Jinja) or the model is told not to call (K3)
    none = client.chat.completions.create(**ask, tool_choice="none")
    assert none.usage.prompt_tokens != r.usage.prompt_tokens
    if name != "k3":   # a Jinja answer is not read for calls then: what the model wrote is the answer
        assert none.choices[0].message.tool_calls is None and "get_weather" in none.choices[0].message.content

    say("required")
    req = client.chat.completions.create(**ask, tool_choice="required")
    assert _calls(req.choices[0].message.tool_calls) == CALLS[:1] and req.choices[0].finish_reason == "tool_calls"
    say("named")   # a named function: its call is opened after the prompt; the model writes the arguments
    named = dict(ask, tool_choice={"type": "function", "function": {"name": "get_time"}})
    forced = client.chat.completions.create(**named)
    assert _calls(forced.choices[0].message.tool_calls) == CALLS[1:]
    assert forced.choices[0].message.model_extra.get("reasoning_content") is None   # the answer did not think
    streamed, finish = _streamed(client, **named)
    assert [(n, a) for _, n, a in streamed] == CALLS[1:] and finish == "tool_calls"

    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(**{**ask, "tool_choice": {"type": "function", "function": {"name": "nope"}}})
    assert info.value.body["param"] == "tool_choice" and "nope" in info.value.body["message"]
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=server.id, messages=ASK, tool_choice="required", max_tokens=5)
    assert info.value.body["param"] == "tool_choice"


def test_formats_without_tool_calls_refuse_clearly(demo_container, tool_templates, live):
    """The demo's template takes no tools; a template that lists tools but has no call format Ferry can read
    takes tools with tool_choice auto (calls come back as text) but cannot force one."""
    demo, lists = live(demo_container).openai(), live(tool_templates["lists_tools"])
    with pytest.raises(openai.BadRequestError) as info:
        demo.chat.completions.create(model=demo.models.list().data[0].id, messages=ASK, tools=TOOLS, max_tokens=4)
    assert info.value.body["param"] == "tools" and "does not take tools" in info.value.body["message"]
    client = lists.openai()
    r = client.chat.completions.create(model=lists.id, messages=ASK, tools=TOOLS, max_tokens=4, temperature=0)
    assert r.choices[0].finish_reason == "length" and r.choices[0].message.tool_calls is None
    for choice in ("required", {"type": "function", "function": {"name": "get_time"}}):
        with pytest.raises(openai.BadRequestError) as info:
            client.chat.completions.create(model=lists.id, messages=ASK, tools=TOOLS, tool_choice=choice,
                                           max_tokens=4)
        assert info.value.body["param"] == "tool_choice" and "no tool-call format" in info.value.body["message"]


def test_streamed_tool_call_arguments_come_in_pieces_as_the_model_writes_them(tiny_k3, live, monkeypatch):
    """K3 writes a call element by element: the stream opens the call (id, type, name, empty arguments) as
    soon as its name is known, then sends its JSON arguments in pieces as they are written, which the
    openai SDK's stream helper accumulates into the same call as the non-streamed answer."""
    server = live(tiny_k3)
    script = scripted_sampler(monkeypatch, min(server.model.tokenizer.eos_ids))
    args = {"city": 'Oslo, "the fjord city", Norway', "days": 3}
    call = ('<|open|>call tool="get_weather" index="1"<|sep|>'
            f'<|open|>argument key="city" type="string"<|sep|>{args["city"]}<|close|>argument<|sep|>'
            '<|open|>argument key="days" type="number"<|sep|>3<|close|>argument<|sep|><|close|>call<|sep|>')
    script.ids = script_ids(server.model, K3_THINK + "<|open|>tools<|sep|>" + call + "<|close|>tools<|sep|>" + K3_END)
    client = server.openai()
    ask = dict(model=server.id, messages=ASK, tools=TOOLS, max_tokens=400, temperature=0)
    whole = client.chat.completions.create(**ask).choices[0].message.tool_calls[0]
    assert json.loads(whole.function.arguments) == args

    raw = [c.choices[0].delta.tool_calls[0] for c in client.chat.completions.create(stream=True, **ask)
           if c.choices and c.choices[0].delta.tool_calls]
    assert raw[0].id.startswith("call_") and (raw[0].type, raw[0].function.name, raw[0].function.arguments) == (
        "function", "get_weather", "")
    assert len(raw) > 5 and all(d.index == 0 and d.id is None and d.function.name is None for d in raw[1:])

    with client.chat.completions.stream(**ask) as stream:
        pieces = [e.arguments_delta for e in stream if e.type == "tool_calls.function.arguments.delta"]
        final = stream.get_final_completion()
    got = final.choices[0].message.tool_calls[0]
    assert final.choices[0].finish_reason == "tool_calls" and len(pieces) > 5
    assert "".join(pieces) == got.function.arguments == whole.function.arguments
    assert got.id.startswith("call_") and got.function.name == "get_weather"
