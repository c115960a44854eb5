"""The server's prompt and answer handling without HTTP: K3 requests (tools,
tool_choice, response_format, thinking effort) rendered by the K3 format, K3
and Hermes tool calls parsed out of the answer, stop sequences, and what a
format cannot do refused."""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from app.chat.k3_format import render_k3
from app.chat.turn import AnswerBuilder, Prepared, StopFilter
from app.server.chat import ChatFormatter, Limits
from app.server.errors import APIError
from app.events import Reasoning, Text, ToolCallDelta, ToolCallMade
from app.server.schemas import ChatCompletionRequest
from app.sampling import SamplingParams


def pairs(events) -> list[tuple]:
    """The pipeline's typed events as (kind, value) for compact asserts."""
    names = {Reasoning: "reasoning", Text: "content", ToolCallMade: "tool_call", ToolCallDelta: "tool_call_delta"}
    return [(names[type(e)], e.call if isinstance(e, ToolCallMade) else
             (e.index, e.name, e.arguments) if isinstance(e, ToolCallDelta) else e.text) for e in events]

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                             "parameters": {"type": "object",
                                                            "properties": {"city": {"type": "string"}}}}}


class K3Stub:
    """Just enough of a LoadedModel with the K3 chat format."""

    def __init__(self):
        self.manifest = {"model": {"kimi": {"variant": "k3"}}, "tokenizer": {"kind": "tiktoken"}}
        self.template = None
        self.path = "k3.ferry"
        self.tokenizer = SimpleNamespace(special_ids=frozenset(), token_text=lambda i: "")
        self.segments = None

    def encode(self, segments):
        self.segments = list(segments)
        return list(range(len(self.segments)))


def request(**kw) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate({"model": "k3", "messages": [{"role": "user", "content": "Hi"}],
                                                 **kw})


def test_k3_requests_use_the_k3_format():
    stub = K3Stub()
    fmt = ChatFormatter(stub)
    assert fmt.kind == "k3"
    p = fmt.prepare(request(tools=[WEATHER], tool_choice="required", reasoning_effort="high",
                            response_format={"type": "json_schema",
                                             "json_schema": {"name": "w", "schema": {"type": "object"}}}),
                    limits=Limits(), n_ctx=4096)
    assert stub.segments == render_k3({
        "messages": [{"role": "user", "content": "Hi"}], "tools": [WEATHER], "tool_choice": "required",
        "thinking": True, "thinking_effort": "high",
        "response_format": {"type": "json_schema", "json_schema": {"name": "w", "schema": {"type": "object"}}}})
    assert p.dialect == "k3" and p.channel == "thinking"
    fmt.prepare(request(reasoning_effort="none"), limits=Limits(), n_ctx=4096)
    assert stub.segments == render_k3({"messages": [{"role": "user", "content": "Hi"}], "thinking": False})
    # a named tool: K3 is told "required", thinks not, and the call to that tool is opened after the prompt
    stub.tokenizer.encode_segments = lambda segs: [1000 + i for i, _ in enumerate(segs)]
    p = fmt.prepare(request(tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "get_weather"}}),
                    limits=Limits(), n_ctx=4096)
    assert stub.segments == render_k3({"messages": [{"role": "user", "content": "Hi"}], "tools": [WEATHER],
                                       "tool_choice": "required", "thinking": False})
    assert p.channel == "response" and p.prefill_ids and p.prompt[-len(p.prefill_ids):] == p.prefill_ids
    assert p.prefill_text.startswith("<|close|>response<|sep|><|open|>tools<|sep|><|open|>call tool=\"get_weather\"")
    for bad in ({"type": "function", "function": {"name": "nope"}}, "required"):
        with pytest.raises(APIError) as info:
            fmt.prepare(request(tools=[WEATHER] if bad != "required" else None, tool_choice=bad),
                        limits=Limits(), n_ctx=4096)
        assert info.value.param == "tool_choice" and info.value.status == 400
    with pytest.raises(APIError) as info:
        fmt.prepare(request(messages=[{"role": "tool", "content": "20 C"}]), limits=Limits(), n_ctx=4096)
    assert "tool" in info.value.message


class K3Tokens:
    """A toy K3 tokenizer: ids 1-4 are the control tokens, others are text."""

    MARKERS = {1: "<|open|>", 2: "<|close|>", 3: "<|sep|>", 4: "<|end_of_msg|>"}

    def __init__(self):
        self.special_ids = frozenset(self.MARKERS)
        self.text: dict[int, str] = {}
        self._tok = self

    def decode_token_bytes(self, i: int) -> bytes:
        return (self.MARKERS.get(i) or self.text[i]).encode()

    def ids(self, *pieces: str) -> list[int]:
        out = []
        for piece in pieces:
            known = {v: k for k, v in self.MARKERS.items()}
            if piece in known:
                out.append(known[piece])
            else:
                i = 100 + len(self.text)
                self.text[i] = piece
                out.append(i)
        return out


def test_k3_answers_give_reasoning_content_and_tool_calls():
    tok = K3Tokens()
    O, C, S, E = "<|open|>", "<|close|>", "<|sep|>", "<|end_of_msg|>"
    ids = tok.ids("Let me look", " it up.", C, "think", S, O, "response", S, "Checking.", C, "response", S,
                  O, "tools", S, O, 'call tool="get_weather"', S, O, 'argument key="city" type="string"', S,
                  "Paris", C, "argument", S, C, "call", S, C, "tools", S, E, "never seen")
    b = AnswerBuilder(Prepared(prompt=[], params=SamplingParams(), max_tokens=50, stops=[], dialect="k3",
                               channel="thinking"), tok)
    out = []
    for i in ids:
        out += pairs(b.token(i, ""))
        if b.ended:
            break
    out += pairs(b.finish())
    assert "".join(v for k, v in out if k == "reasoning") == "Let me look it up."
    assert "".join(v for k, v in out if k == "content") == "Checking."
    calls = [v for k, v in out if k == "tool_call"]
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("get_weather", {"city": "Paris"})]
    pieces = [v for k, v in out if k == "tool_call_delta"]   # the call as it was written: its name, then its arguments
    assert pieces[0] == (1, "get_weather", "") and "".join(a for _, _, a in pieces[1:]) == calls[0].arguments
    assert b.reasoning_tokens == 2


def test_hermes_tool_calls_in_a_jinja_models_answer():
    b = AnswerBuilder(Prepared(prompt=[], params=SamplingParams(), max_tokens=50, stops=[], dialect="think_tags",
                               channel="response", hermes_tools=True), None)
    out = []
    for piece in ["Sure. <tool", '_call>{"name": "get_weather", ', '"arguments": {"city": "Oslo"}}</tool_',
                  "call>", " <tool_call>not json</tool_call>"]:
        out += pairs(b.token(0, piece))
    out += pairs(b.finish())
    calls = [v for k, v in out if k == "tool_call"]
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("get_weather", {"city": "Oslo"})]
    assert "".join(v for k, v in out if k == "content") == "Sure.  <tool_call>not json</tool_call>"


@pytest.mark.parametrize("pieces,stops,shown", [
    (["Hello wor", "ld. Bye"], ["world"], "Hello "),
    (["ab", "c", "d"], ["cd", "x"], "ab"),
    (["a<", "b"], ["<x"], "a<b"),
    (["no stop here"], ["zz"], "no stop here"),
    (["sto", "p"], [], "stop"),
])
def test_stop_sequences_across_pieces(pieces, stops, shown):
    f = StopFilter(stops)
    text = "".join(f.feed(p) for p in pieces) + f.flush()
    assert text == shown
    assert f.stopped == (shown != "".join(pieces))


def test_unknown_and_mistyped_fields_are_refused():
    from pydantic import ValidationError

    for bad in ({"temperature": "0.5"}, {"stream": 1}, {"n": 0}, {"unknown": True}, {"stop": 5},
                {"messages": [{"role": "wizard", "content": "x"}]}):
        with pytest.raises(ValidationError):
            request(**bad)
    assert request(temperature=1).temperature == 1.0          # an integer is a fine number


def test_k3_conformance_text_parts_and_a_bare_json_schema():
    """Content as a list of text parts is rendered part by part; a json_schema
    that holds the schema itself is taken as the schema."""
    stub = K3Stub()
    fmt = ChatFormatter(stub)
    parts = [{"type": "text", "text": "Look "}, {"type": "text", "text": "here."}]
    fmt.prepare(request(messages=[{"role": "user", "content": parts}]), limits=Limits(), n_ctx=4096)
    assert stub.segments == render_k3({"messages": [{"role": "user", "content": parts}], "thinking": True})
    assert ("Look ", False) in stub.segments and ("here.", False) in stub.segments
    schema = {"type": "object", "properties": {"city": {"type": "string"}}}
    fmt.prepare(request(response_format={"type": "json_schema", "json_schema": schema}), limits=Limits(), n_ctx=4096)
    bare = stub.segments
    fmt.prepare(request(response_format={"type": "json_schema", "json_schema": {"name": "c", "schema": schema}}),
                limits=Limits(), n_ctx=4096)
    assert bare == stub.segments


def _built(pieces, **prepared) -> tuple[list, AnswerBuilder]:
    b = AnswerBuilder(Prepared(prompt=[], params=SamplingParams(), max_tokens=50, stops=[], dialect="think_tags",
                               channel="response", **prepared), None)
    out = []
    for piece in pieces:
        out += pairs(b.token(0, piece))
    return out + pairs(b.finish()), b


@pytest.mark.parametrize("pieces,calls,text", [
    (['{"name": "get_weather", "para', 'meters": {"city": "Oslo"}}'], [("get_weather", {"city": "Oslo"})], ""),
    (['<|python_tag|>{"name": "a", "parameters": {}}; ', '{"name": "b", "arguments": {"x": 1}}'],
     [("a", {}), ("b", {"x": 1})], ""),
    (["  ", '{"not": "a call"}'], [], '  {"not": "a call"}'),       # JSON that is no call is the answer
    # a call streams as it is written, so it stays a call whatever follows; the rest is the answer
    (['{"name": "a", "parameters": {}} and more'], [("a", {})], "and more"),
    (["Hello", ' {"name": "a"}'], [], 'Hello {"name": "a"}'),        # only an answer that starts with one
])
def test_llama3_tool_calls_in_a_jinja_models_answer(pieces, calls, text):
    out, _ = _built(pieces, llama3_tools=True)
    assert [(c.name, json.loads(c.arguments)) for k, c in out if k == "tool_call"] == calls
    assert "".join(v for k, v in out if k == "content") == text


def test_forced_call_prefill_and_a_single_call():
    """A forced call's opening is read as if written; parallel_tool_calls=false ends the answer at the first."""
    out, b = _built(['get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>\n<tool_call>{"name": "x", ',
                     '"arguments": {}}</tool_call>'], hermes_tools=True, prefill_text='<tool_call>\n{"name": "',
                    parallel_tool_calls=False)
    assert [(c.name, json.loads(c.arguments)) for k, c in out if k == "tool_call"] == [("get_weather",
                                                                                       {"city": "Oslo"})]
    assert b.ended and not [v for k, v in out if k == "content"]


@pytest.mark.parametrize("family", ["k3", "think_template", "jinja"])
def test_continue_final_in_every_chat_format(family, tiny_k3, tiny_chat, demo_container):
    """Continue (TurnRequest.continue_final) in each chat format: K3's own, a Jinja template that opens
    <think> (closed before the answer goes on), and the demo's Jinja template. The prompt ends with the
    answer so far as content, the stream continues the answer channel, and only new text streams."""
    from app.api import EngineService, Reasoning, Text, TurnDone
    from app.chat.segments import content
    from app.chat.turn import ChatFormat, TurnError, TurnRequest
    from app.model import LoadedModel

    container, question, partial = {"k3": (tiny_k3, "Hello there", "The answer is"),
                                     "think_template": (tiny_chat, "w10 w11", "w20 w21"),
                                     "jinja": (demo_container, "Name three colours.", "1. Red")}[family]
    model = LoadedModel(container)
    session = model.new_session(256)
    service = EngineService(model, session)
    try:
        req = TurnRequest([{"role": "user", "content": question}, {"role": "assistant", "content": partial}],
                          max_tokens=4, continue_final=True)
        p = ChatFormat(model).prepare(req, n_ctx=256)
        tail = model.tokenizer.encode_segments([content(partial)])
        assert p.channel == "response" and p.prompt[-len(tail):] == tail
        events = list(service.submit(req))
        assert not any(isinstance(e, Reasoning) for e in events)
        assert isinstance(events[-1], TurnDone) and events[-1].reason in ("stop", "length")
        assert not "".join(e.text for e in events if isinstance(e, Text)).startswith(partial)
        with pytest.raises(TurnError, match="continue_final"):
            ChatFormat(model).prepare(TurnRequest([{"role": "user", "content": question}], continue_final=True),
                                      n_ctx=256)
    finally:
        service.close()
        session.close()
        model.close()


def _deltas(out, index):
    """A call's streamed pieces: its name (from the opening delta) and its argument pieces."""
    ds = [v for k, v in out if k == "tool_call_delta" and v[0] == index]
    return (ds[0][1] if ds else None), [a for _, n, a in ds if n is None]


@pytest.mark.parametrize("kind", ["hermes", "llama3"])
def test_json_tool_calls_stream_as_written(kind):
    """Hermes and Llama 3.1 calls (JSON the model writes as text) stream like K3's: the call opens once its
    name and the arguments' brace are written, and the arguments follow in pieces (fed a character at a
    time), each leaving a valid JSON prefix; joined they are the call's arguments, the model's own text."""
    from app.chat.stream_parser import json_prefix

    args = '{"city": "Oslo, \\"Norway\\"", "days": [1, 2.5e1], "deep": {"x": null}}'
    key = "arguments" if kind == "hermes" else "parameters"
    call = f'{{"name": "get_weather", "{key}": {args}}}'
    text = (f"<tool_call>\n{call}\n</tool_call>" if kind == "hermes" else call + "; " + call)
    out, _ = _built(list(text), **({"hermes_tools": True} if kind == "hermes" else {"llama3_tools": True}))
    calls = [c for k, c in out if k == "tool_call"]
    assert [(c.name, c.arguments) for c in calls] == [("get_weather", args)] * (1 if kind == "hermes" else 2)
    for c in calls:
        name, pieces = _deltas(out, c.index)
        assert name == "get_weather" and "".join(pieces) == args and len(pieces) > 10
        assert all(json_prefix("".join(pieces[:i + 1])) for i in range(len(pieces)))
    first_call = next(i for i, (k, _) in enumerate(out) if k == "tool_call")
    assert [k for k, _ in out[:first_call]] == ["tool_call_delta"] * first_call   # pieces before the call
    assert not [v for k, v in out if k == "content"]


def test_a_streamed_json_call_whose_json_breaks():
    """Pieces sent cannot be taken back: once a call has opened it stays a call; the pieces stop where the
    model's JSON breaks (all of them valid), and the call's arguments are what the model wrote, which a
    client can see is not JSON. A call written another way (arguments as a string) is read whole."""
    out, _ = _built(list('<tool_call>{"name": "a", "arguments": {"x": 1,, "y": 2}}</tool_call> ok'),
                    hermes_tools=True)
    (call,) = [c for k, c in out if k == "tool_call"]
    assert call.name == "a" and call.arguments == '{"x": 1,, "y": 2}}'
    assert "".join(_deltas(out, 1)[1]) == '{"x": 1,'
    assert "".join(v for k, v in out if k == "content") == " ok"
    # an unclosed call that already streamed stays a call (the answer ended inside it)
    out, _ = _built(['<tool_call>{"name": "a", "arguments": {"x": "cut'], hermes_tools=True)
    assert [(c.name, c.arguments) for k, c in out if k == "tool_call"] == [("a", '{"x": "cut')]
    # before it opens, a call is read whole when it ends, as before
    out, _ = _built(['<tool_call>{"name": "a", "arguments": "{\\"x\\": 1}"}</tool_call>'], hermes_tools=True)
    assert [(c.name, c.arguments) for k, c in out if k == "tool_call"] == [("a", '{"x": 1}')]
    assert not [v for k, v in out if k == "tool_call_delta"]
    out, _ = _built(['<tool_call>{"name": "a", "argu'], hermes_tools=True)   # not opened: the text it was
    assert [v for k, v in out if k == "content"] == ['<tool_call>{"name": "a", "argu']


def test_k3_raw_json_arguments_stream_only_when_valid():
    """A K3 call's raw ``json`` element is sent as one piece only when it is a JSON object; otherwise the
    call ends with the text as written and no piece was sent."""
    from app.chat.stream_parser import StreamParser

    for raw, pieces in (('{"a": [1, 2]}', ['{"a": [1, 2]}']), ("{broken", [])):
        p = StreamParser("k3", "response")
        events = p.feed(f'<|open|>tools<|sep|><|open|>call tool="f"<|sep|><|open|>json<|sep|>{raw}'
                        f'<|close|>json<|sep|><|close|>call<|sep|><|close|>tools<|sep|>')
        assert [v[1] for k, v in events if k == "tool_call_args"] == pieces
        assert [v.arguments for k, v in events if k == "tool_call"] == [raw]
