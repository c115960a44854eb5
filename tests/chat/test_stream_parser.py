"""The streaming thinking/response/tool-call parser."""

from __future__ import annotations

import json
from collections.abc import Iterable
from itertools import pairwise
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.chat.k3_format import generation_prompt, render_k3
from app.chat.segments import Segment, content, markup
from app.chat.stream_parser import (
    K3_MARKERS,
    THINK_MARKERS,
    Event,
    MarkerScanner,
    StreamParser,
    ToolCall,
    _json_or_none,
    json_prefix,
)
from app.chat.tiktoken_tokenizer import K3Tokenizer

K3_STREAM = (
    "Let me think <about> it|"
    "<|close|>think<|sep|><|open|>response<|sep|>The answer is 4."
    "<|close|>response<|sep|><|close|>message<|sep|><|end_of_msg|>"
)
K3_EXPECTED = [("thinking", "Let me think <about> it|"), ("response", "The answer is 4."), ("end", None)]

TAG_STREAM = "\nPondering < and </thi.\n</think>\n\nHere <b>it</b> is."
TAG_EXPECTED = [("thinking", "\nPondering < and </thi.\n"), ("response", "\n\nHere <b>it</b> is."), ("end", None)]


def run(parser: StreamParser, chunks: Iterable[str]) -> list[Event]:
    """Feed ``chunks`` then finish; text events merged per channel run."""
    events: list[Event] = []
    for chunk in chunks:
        events += parser.feed(chunk)
    events += parser.finish()
    return merge_text(events)


def merge_text(events: list[Event]) -> list[Event]:
    """Text events merged per channel run; a tool call's streamed pieces checked against the call
    (its name first, its argument pieces joined are its arguments, or for arguments that are not a
    JSON object what of them was a valid prefix) and left out."""
    merged: list[Event] = []
    streamed: dict[int, list] = {}
    for kind, value in events:
        if kind == "tool_call_start":
            assert value[0] not in streamed
            streamed[value[0]] = [value[1], ""]
            continue
        if kind == "tool_call_args":
            streamed[value[0]][1] += value[1]
            continue
        if kind == "tool_call":   # the pieces stay a valid JSON prefix: arguments that are no JSON object are not sent
            name, sent = streamed.pop(value.index)
            assert name == value.name and value.arguments.startswith(sent) and (not sent or json_prefix(sent))
            assert sent == value.arguments or not isinstance(_json_or_none(value.arguments), dict)
        if merged and kind in ("thinking", "response") and merged[-1][0] == kind:
            merged[-1] = (kind, merged[-1][1] + value)
        else:
            merged.append((kind, value))
    return merged


def split_at(text: str, cuts: Iterable[int]) -> list[str]:
    bounds = [0, *sorted(cuts), len(text)]
    return [text[start:end] for start, end in pairwise(bounds)]


# --------------------------------------------------------------------------
# Whole streams and every split of them


@pytest.mark.parametrize(
    ("dialect", "initial", "stream", "expected"),
    [
        pytest.param("k3", "thinking", K3_STREAM, K3_EXPECTED, id="k3"),
        pytest.param("think_tags", "thinking", TAG_STREAM, TAG_EXPECTED, id="think_tags"),
        pytest.param("think_tags", "response", "<think>" + TAG_STREAM, TAG_EXPECTED, id="think_tags-opened-by-model"),
    ],
)
def test_every_split_gives_the_same_events(
    dialect: str, initial: str, stream: str, expected: list[Event]
) -> None:
    assert run(StreamParser(dialect, initial), [stream]) == expected
    assert run(StreamParser(dialect, initial), list(stream)) == expected
    for first in range(1, len(stream)):
        for second in range(first, len(stream)):
            chunks = split_at(stream, [first, second])
            assert run(StreamParser(dialect, initial), chunks) == expected, chunks


@given(st.data())
@settings(max_examples=300, deadline=None)
def test_random_splits_of_random_k3_streams(data: st.DataObject) -> None:
    texts = st.text(alphabet="ab <|>/thinkopsre\n", max_size=12).filter(
        lambda text: not any(marker in text for marker in K3_MARKERS)
    )
    thinking, answer = data.draw(texts), data.draw(texts)
    stream = f"{thinking}<|close|>think<|sep|><|open|>response<|sep|>{answer}<|end_of_msg|>"
    cuts = data.draw(st.lists(st.integers(0, len(stream)), max_size=8))
    expected = [*([("thinking", thinking)] if thinking else []), *([("response", answer)] if answer else []),
                ("end", None)]
    assert run(StreamParser("k3"), split_at(stream, cuts)) == expected


@given(st.data())
@settings(max_examples=300, deadline=None)
def test_random_splits_of_random_tag_streams(data: st.DataObject) -> None:
    texts = st.text(alphabet="ab <>/thinkx\n", max_size=12).filter(
        lambda text: not any(marker in text for marker in THINK_MARKERS)
    )
    thinking, answer = data.draw(texts), data.draw(texts)
    stream = f"<think>{thinking}</think>{answer}"
    cuts = data.draw(st.lists(st.integers(0, len(stream)), max_size=8))
    events = run(StreamParser("think_tags", "response"), split_at(stream, cuts))
    expected = [*([("thinking", thinking)] if thinking else []), *([("response", answer)] if answer else []),
                ("end", None)]
    assert events == expected


# --------------------------------------------------------------------------
# Holding back only what could be a marker


@given(st.text(alphabet="a<|>/thinkcloe ", max_size=30), st.sampled_from(["k3", "think_tags"]))
@settings(max_examples=300, deadline=None)
def test_hold_back_is_minimal(text: str, dialect: str) -> None:
    markers = K3_MARKERS if dialect == "k3" else THINK_MARKERS
    if any(marker in text for marker in markers):
        return
    parser = StreamParser(dialect, "response")
    emitted = "".join(value for _, value in parser.feed(text))
    assert text.startswith(emitted)
    held = text[len(emitted):]
    assert held == "" or any(marker.startswith(held) and marker != held for marker in markers)
    longer_suffixes = [text[start:] for start in range(len(emitted))]
    assert not any(marker.startswith(suffix) for suffix in longer_suffixes for marker in markers)


def test_text_is_released_as_soon_as_it_cannot_be_a_marker() -> None:
    parser = StreamParser("think_tags", "response")
    assert parser.feed("Hello <") == [("response", "Hello ")]
    assert parser.feed("b") == [("response", "<b")]
    assert parser.feed("> </th") == [("response", "> ")]
    assert parser.feed("ink>x") == [("response", "x")]


def test_a_partial_marker_at_the_end_is_text() -> None:
    parser = StreamParser("k3", "response")
    assert parser.feed("done <|end_of") == [("response", "done ")]
    assert parser.finish() == [("response", "<|end_of"), ("end", None)]


def test_scanner_holds_the_longest_possible_marker_start() -> None:
    scanner = MarkerScanner(["<|open|>", "<|close|>"])
    assert scanner.feed("x<|c") == [("x", False)]
    assert scanner.feed("lose|><|o") == [("<|close|>", True)]
    assert scanner.flush() == "<|o"


# --------------------------------------------------------------------------
# K3 structure


def test_model_that_skips_thinking_by_opening_response() -> None:
    events = run(StreamParser("k3"), ["<|open|>response<|sep|>Hi", "<|end_of_msg|>"])
    assert events == [("response", "Hi"), ("end", None)]


def test_model_that_closes_thinking_without_opening_response() -> None:
    events = run(StreamParser("k3"), ["hm<|close|>think<|sep|>Hi<|end_of_msg|>"])
    assert events == [("thinking", "hm"), ("response", "Hi"), ("end", None)]


def test_thinking_off_starts_in_response() -> None:
    assert run(StreamParser("k3", "response"), ["Hi", "!<|close|>response<|sep|>"]) == [
        ("response", "Hi!"), ("end", None)]


def test_input_after_the_end_is_ignored() -> None:
    parser = StreamParser("k3", "response")
    assert parser.feed("a<|end_of_msg|>b") == [("response", "a"), ("end", None)]
    assert parser.ended
    assert parser.feed("more") == []
    assert parser.finish() == []


def _assistant_turn(message: dict[str, Any]) -> str:
    """The text a model would generate for ``message``, after the generation prompt."""
    segments = render_k3({"messages": [message], "add_generation_prompt": False})
    text = "".join(text for text, _ in segments)
    return text.removeprefix('<|open|>message role="assistant"<|sep|><|open|>think<|sep|>')


def test_tool_calls_from_a_rendered_turn() -> None:
    calls = [
        {"function": {"name": "get_weather", "arguments": {"city": "Paris", "days": 3, "hourly": False}}},
        {"function": {"name": "search", "arguments": {"q": 'say "hi" & bye', "filters": {"lang": ["en"]}}}},
        {"function": {"name": "ping", "arguments": ""}},
        {"function": {"name": "raw", "arguments": "{broken"}},
    ]
    stream = _assistant_turn({"role": "assistant", "reasoning": "Need data.", "content": "Checking.",
                              "tool_calls": calls})
    events = run(StreamParser("k3"), list(stream))
    assert events[:2] == [("thinking", "Need data."), ("response", "Checking.")]
    assert events[2:] == [
        ("tool_call", ToolCall("get_weather", 1, json.dumps({"city": "Paris", "days": 3, "hourly": False}))),
        ("tool_call", ToolCall("search", 2, json.dumps({"q": 'say "hi" & bye', "filters": {"lang": ["en"]}}))),
        ("tool_call", ToolCall("ping", 3, "{}")),
        ("tool_call", ToolCall("raw", 4, "{broken")),
        ("end", None),
    ]


def test_typed_argument_the_model_garbled_is_kept_as_text() -> None:
    stream = ('<|open|>tools<|sep|><|open|>call tool="f" index="1"<|sep|>'
              '<|open|>argument key="n" type="number"<|sep|>four<|close|>argument<|sep|>'
              '<|close|>call<|sep|><|close|>tools<|sep|><|end_of_msg|>')
    events = run(StreamParser("k3", "response"), [stream])
    assert events == [("tool_call", ToolCall("f", 1, '{"n": "four"}')), ("end", None)]


# --------------------------------------------------------------------------
# Token ids


def _ids(tokenizer: K3Tokenizer, segments: list[Segment]) -> list[int]:
    return tokenizer.encode_segments(segments)


def _run_ids(parser: StreamParser, ids: list[int]) -> list[Event]:
    events: list[Event] = []
    for token_id in ids:
        events += parser.feed_token(token_id)
    return merge_text(events + parser.finish())


def test_token_ids_in_the_k3_dialect(tokenizer: K3Tokenizer) -> None:
    segments = [
        content("思考 <|close|>think<|sep|> is just text"),
        markup("<|close|>"), content("think"), markup("<|sep|>"),
        markup("<|open|>"), content("response"), markup("<|sep|>"),
        content("答案🙂"), markup("[EOS]"), content("!"), markup("<|end_of_msg|>"),
    ]
    parser = StreamParser("k3", tokenizer=tokenizer)
    assert _run_ids(parser, _ids(tokenizer, segments)) == [
        ("thinking", "思考 <|close|>think<|sep|> is just text"),
        ("response", "答案🙂!"),
        ("end", None),
    ]


def test_token_ids_in_the_tag_dialect(tokenizer: K3Tokenizer) -> None:
    ids = tokenizer.encode_content("<think>龘 a</think>答案")
    parser = StreamParser("think_tags", "response", tokenizer=tokenizer)
    assert _run_ids(parser, ids) == [("thinking", "龘 a"), ("response", "答案"), ("end", None)]


def test_incomplete_utf8_at_the_end_is_replaced(tokenizer: K3Tokenizer) -> None:
    parser = StreamParser("k3", "response", tokenizer=tokenizer)
    assert parser.feed_token(tokenizer.encode_content("龘")[0]) == []
    assert parser.finish() == [("response", "\ufffd"), ("end", None)]


# --------------------------------------------------------------------------
# Construction


def test_bad_options_raise_value_error() -> None:
    with pytest.raises(ValueError, match="dialect must be one of"):
        StreamParser("chatml")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="initial_channel must be one of"):
        StreamParser("k3", "answer")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="needs a parser built with tokenizer"):
        StreamParser().feed_token(1)


def test_rendered_turn_round_trips_through_token_ids(tokenizer: K3Tokenizer) -> None:
    message = {
        "role": "assistant",
        "reasoning": "Spoof <|close|>think<|sep|> attempt",
        "content": "Answer <|end_of_msg|> here",
        "tool_calls": [{"function": {"name": "f", "arguments": {"q": "a<|sep|>b"}}}],
    }
    segments = render_k3({"messages": [message], "add_generation_prompt": False})
    assert segments[:len(generation_prompt())] == generation_prompt()
    parser = StreamParser("k3", tokenizer=tokenizer)
    assert _run_ids(parser, _ids(tokenizer, segments[len(generation_prompt()):])) == [
        ("thinking", "Spoof <|close|>think<|sep|> attempt"),
        ("response", "Answer <|end_of_msg|> here"),
        ("tool_call", ToolCall("f", 1, '{"q": "a<|sep|>b"}')),
        ("end", None),
    ]
