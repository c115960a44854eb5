"""Streaming split of generated text into thinking, response and tool calls.

A ``StreamParser`` takes a model's output one token at a time and returns
events as soon as they are certain:

* ``("thinking", text)`` and ``("response", text)``: text for the thinking
  trace and for the answer;
* ``("tool_call", ToolCall)``: a complete tool call (K3 dialect only);
  before it, as the call is written, ``("tool_call_start", (index, name))``
  and ``("tool_call_args", (index, text))``: pieces of its JSON arguments,
  which joined are the call's ``arguments``; each piece keeps what was sent
  a valid JSON prefix (``unsent_arguments`` says what a consumer still has
  to send when the call ends, or that the model's JSON broke);
* ``("end", None)``: the turn is over (``<|end_of_msg|>``, or ``finish()``).

Two dialects are understood:

``"k3"``
    K3's markup. The generation prompt opened ``think`` (or ``response``);
    the model writes ``<|close|>think<|sep|>``, ``<|open|>response<|sep|>``,
    optionally a ``tools`` element, and ends with ``<|end_of_msg|>``.
``"think_tags"``
    ``<think> ... </think>`` written as text, as many GGUF/HF models do.

Markers split across tokens are reassembled: text that could still be the
start of a marker is held back, and nothing else is. Text fed with
``feed`` is scanned for markers; with ``feed_token`` and the K3 dialect only
special token ids count as markers, so a model that writes the characters
``<|close|>`` as ordinary tokens does not switch channels.
"""

from __future__ import annotations

import codecs
import json
import re
from collections.abc import Iterable, Set
from typing import Any, Literal, Protocol, TypeAlias

import pydantic_core

from app.events import ToolCall  # the tool-call type lives with the events that carry it

Channel: TypeAlias = Literal["thinking", "response"]
Dialect: TypeAlias = Literal["k3", "think_tags"]
Event: TypeAlias = tuple[str, Any]
Piece: TypeAlias = tuple[str, bool]  # (text, is_marker)

K3_OPEN = "<|open|>"
K3_CLOSE = "<|close|>"
K3_SEP = "<|sep|>"
K3_END_OF_MSG = "<|end_of_msg|>"
K3_MARKERS = (K3_OPEN, K3_CLOSE, K3_SEP, K3_END_OF_MSG)
THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"
THINK_MARKERS = (THINK_OPEN, THINK_CLOSE)

CHANNELS = ("thinking", "response")
DIALECTS = ("k3", "think_tags")

_ATTRIBUTE = re.compile(r'([\w-]+)="([^"]*)"')


class TokenSource(Protocol):
    """What ``StreamParser.feed_token`` needs from a tokenizer."""

    @property
    def special_ids(self) -> Set[int]: ...

    def decode_token_bytes(self, token_id: int) -> bytes: ...


class MarkerScanner:
    """Splits a text stream into text and marker pieces.

    Only a suffix that is a proper prefix of some marker is held back
    between calls; ``flush`` releases it as text at the end of the stream.
    """

    def __init__(self, markers: Iterable[str]) -> None:
        self._markers = tuple(sorted(markers, key=len, reverse=True))
        self._held = ""

    def feed(self, text: str) -> list[Piece]:
        """Pieces that are certain after appending ``text`` to the stream."""
        buffer = self._held + text
        pieces: list[Piece] = []
        start = 0
        while (hit := self._next_marker(buffer, start)) is not None:
            position, marker = hit
            if position > start:
                pieces.append((buffer[start:position], False))
            pieces.append((marker, True))
            start = position + len(marker)
        end = len(buffer) - self._partial_marker_length(buffer, start)
        if end > start:
            pieces.append((buffer[start:end], False))
        self._held = buffer[end:]
        return pieces

    def flush(self) -> str:
        """The held-back text; at the end of the stream it is ordinary text."""
        held, self._held = self._held, ""
        return held

    def _next_marker(self, buffer: str, start: int) -> tuple[int, str] | None:
        hits = [(buffer.find(marker, start), marker) for marker in self._markers]
        found = [hit for hit in hits if hit[0] >= 0]
        return min(found, key=lambda hit: hit[0]) if found else None

    def _partial_marker_length(self, buffer: str, start: int) -> int:
        """Length of the longest suffix of ``buffer[start:]`` that starts a marker."""
        longest = max(len(marker) for marker in self._markers) - 1
        for length in range(min(longest, len(buffer) - start), 0, -1):
            suffix = buffer[len(buffer) - length:]
            if any(marker.startswith(suffix) for marker in self._markers):
                return length
        return 0


class StreamParser:
    """Routes generated tokens to the thinking trace, the answer and tool calls."""

    def __init__(
        self,
        dialect: Dialect = "k3",
        initial_channel: Channel = "thinking",
        *,
        tokenizer: TokenSource | None = None,
    ) -> None:
        """``initial_channel`` is the channel the generation prompt left open.

        ``tokenizer`` is needed only for ``feed_token``.
        """
        if dialect not in DIALECTS:
            raise ValueError(f"dialect must be one of {', '.join(DIALECTS)}; got {dialect!r}")
        if initial_channel not in CHANNELS:
            raise ValueError(f"initial_channel must be one of {', '.join(CHANNELS)}; got {initial_channel!r}")
        self._dialect = dialect
        self._machine: _K3Machine | _ThinkTagMachine
        if dialect == "k3":
            self._machine = _K3Machine(initial_channel)
            self._scanner = MarkerScanner(K3_MARKERS)
            self._end_marker: str | None = K3_END_OF_MSG
        else:
            self._machine = _ThinkTagMachine(initial_channel)
            self._scanner = MarkerScanner(THINK_MARKERS)
            self._end_marker = None
        self._tokenizer = tokenizer
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._ended = False

    @property
    def thinking(self) -> bool:
        """Whether generated text goes to the thinking trace now (outside any tag or tool call)."""
        return self._machine.thinking

    @property
    def ended(self) -> bool:
        """True once the end event has been returned; later input is ignored."""
        return self._ended

    def feed(self, text: str) -> list[Event]:
        """Take the next piece of generated text (markers may be split across calls)."""
        if self._ended:
            return []
        return self._consume(self._scanner.feed(text))

    def feed_token(self, token_id: int) -> list[Event]:
        """Take the next generated token id (multi-byte characters may span tokens).

        Feed a stream either as text (``feed``) or as ids (``feed_token``),
        not a mix of both: text held back by one is not seen by the other.
        """
        if self._tokenizer is None:
            raise ValueError("feed_token needs a parser built with tokenizer=...")
        if self._ended:
            return []
        data = self._tokenizer.decode_token_bytes(token_id)
        if self._dialect != "k3":
            return self.feed(self._utf8.decode(data))
        if token_id not in self._tokenizer.special_ids:
            return self._consume([(self._utf8.decode(data), False)])
        pieces: list[Piece] = [(self._utf8.decode(b"", final=True), False)]
        name = data.decode("utf-8")
        if name in K3_MARKERS:  # other specials ([EOS], reserved ids) carry no text
            pieces.append((name, True))
        return self._consume(pieces)

    def finish(self) -> list[Event]:
        """End of generation: release held-back text and end the turn."""
        if self._ended:
            return []
        pieces = self._scanner.feed(self._utf8.decode(b"", final=True))
        events = self._consume([*pieces, (self._scanner.flush(), False)])
        if not self._ended:
            self._ended = True
            events.append(("end", None))
        return events

    def _consume(self, pieces: Iterable[Piece]) -> list[Event]:
        events: list[Event] = []
        for text, is_marker in pieces:
            if is_marker and text == self._end_marker:
                self._ended = True
                events.append(("end", None))
                break
            if is_marker:
                events += self._machine.marker(text)
            elif text:
                events += self._machine.text(text)
        return events


class _ThinkTagMachine:
    """``<think>`` switches to the thinking channel, ``</think>`` to the response."""

    def __init__(self, channel: Channel) -> None:
        self._channel = channel

    @property
    def thinking(self) -> bool:
        return self._channel == "thinking"

    def marker(self, marker: str) -> list[Event]:
        self._channel = "thinking" if marker == THINK_OPEN else "response"
        return []

    def text(self, text: str) -> list[Event]:
        return [(self._channel, text)]


class _K3Machine:
    """Follows K3 elements: ``think``, ``response`` and ``tools``/``call``.

    Text outside any element after thinking closed (a model that skips
    ``<|open|>response<|sep|>``) is response; unknown elements do not change
    the channel; whitespace between tool calls is dropped.
    """

    def __init__(self, channel: Channel) -> None:
        self._channel: Channel = channel
        self._tag: str | None = None  # K3_OPEN or K3_CLOSE while reading a tag
        self._tag_text = ""
        self._in_tools = False
        self._call: _ToolCallBuilder | None = None
        self._calls_made = 0

    @property
    def thinking(self) -> bool:
        return self._channel == "thinking" and self._tag is None and self._call is None and not self._in_tools

    def marker(self, marker: str) -> list[Event]:
        if marker in (K3_OPEN, K3_CLOSE):
            self._tag, self._tag_text = marker, ""
            return []
        if self._tag is None:  # a stray <|sep|>
            return []
        tag, self._tag = self._tag, None
        name, attributes = _parse_tag(self._tag_text)
        if tag == K3_OPEN:
            return self._open(name, attributes)
        return self._close(name)

    def text(self, text: str) -> list[Event]:
        if self._tag is not None:
            self._tag_text += text
        elif self._call is not None:
            return self._call.add_text(text)
        elif not self._in_tools:
            return [(self._channel, text)]
        return []

    def _open(self, name: str, attributes: dict[str, str]) -> list[Event]:
        if name == "think":
            self._channel = "thinking"
        elif name == "response":
            self._channel = "response"
        elif name == "tools":
            self._in_tools = True
        elif name == "call" and self._in_tools:
            self._call = _ToolCallBuilder(attributes.get("tool", ""), self._calls_made + 1)
            return [("tool_call_start", (self._call.index, self._call.name))]
        elif name in ("argument", "json") and self._call is not None:
            return self._call.begin_value(name, attributes)
        return []

    def _close(self, name: str) -> list[Event]:
        if name == "think":
            self._channel = "response"
        elif name == "tools":
            self._in_tools = False
        elif name in ("argument", "json") and self._call is not None:
            return self._call.end_value()
        elif name == "call" and self._call is not None:
            self._calls_made += 1
            builder, self._call = self._call, None
            call = builder.build(self._calls_made)
            rest = builder.rest(call.arguments) if isinstance(_json_or_none(call.arguments), dict) else ""
            return ([("tool_call_args", (call.index, rest))] if rest else []) + [("tool_call", call)]
        return []


class _ToolCallBuilder:
    """Collects the ``argument`` (or raw ``json``) elements of one ``call``,
    and streams its JSON arguments as they are written: a string argument's
    text as it comes (escaped), a typed value or a raw ``json`` element whole
    when it ends. The pieces joined are what ``build`` returns."""

    def __init__(self, name: str, index: int) -> None:
        self.name = name
        self.index = index
        self._arguments: dict[str, Any] = {}
        self._raw: str | None = None
        self._value: tuple[str, str, str] | None = None  # (element, key, type)
        self._parts: list[str] = []
        self._sent: list[str] = []   # the argument text streamed so far

    def _send(self, text: str) -> list[Event]:
        self._sent.append(text)
        return [("tool_call_args", (self.index, text))]

    def begin_value(self, element: str, attributes: dict[str, str]) -> list[Event]:
        self._value = (element, attributes.get("key", ""), attributes.get("type", "string"))
        self._parts = []
        if element == "argument" and self._value[2] == "string" and self._raw is None:
            return self._send(("{" if not self._sent else ", ") + json.dumps(self._value[1], ensure_ascii=False)
                              + ': "')
        return []

    def add_text(self, text: str) -> list[Event]:
        if self._value is None:
            return []
        self._parts.append(text)
        if self._streaming_string():
            return self._send(json.dumps(text, ensure_ascii=False)[1:-1])
        return []

    def _streaming_string(self) -> bool:
        return self._value is not None and self._value[0] == "argument" and self._value[2] == "string" \
            and self._raw is None

    def end_value(self) -> list[Event]:
        if self._value is None:
            return []
        streaming = self._streaming_string()
        (element, key, kind), text = self._value, "".join(self._parts)
        self._value = None
        if element == "json":
            self._raw = text
            return self._send(text) if not self._sent and isinstance(_json_or_text(text), dict) else []
        self._arguments[key] = text if kind == "string" else _json_or_text(text)
        if self._raw is not None:
            return []
        if streaming:
            return self._send('"')
        return self._send(("{" if not self._sent else ", ") + json.dumps(key, ensure_ascii=False) + ": "
                          + json.dumps(self._arguments[key], ensure_ascii=False))

    def build(self, index: int) -> ToolCall:
        """The finished call, numbered ``index`` (1-based within the turn): its
        arguments are the pieces streamed, closed (a raw ``json`` element's text
        when the call has one)."""
        if self._raw is not None:
            arguments = self._raw
        elif self._sent:
            arguments = "".join(self._sent) + "}"
        else:
            arguments = "{}"
        return ToolCall(self.name, index, arguments)

    def rest(self, arguments: str) -> str:
        """What of ``arguments`` was not streamed yet ("" if the stream went another way)."""
        return unsent_arguments("".join(self._sent), arguments) or ""


def unsent_arguments(sent: str, arguments: str) -> str | None:
    """What of a finished call's ``arguments`` is left to send after the
    pieces ``sent`` while it was written; None when those pieces cannot become
    them (the model's JSON broke after they were sent: they cannot be taken back)."""
    return arguments[len(sent):] if arguments.startswith(sent) else None


def json_prefix(text: str) -> bool:
    """Whether ``text`` can begin a JSON document, as clients' partial parsers
    read streamed tool arguments (pydantic_core's is jiter, which the
    ``anthropic`` and ``openai`` SDKs use)."""
    try:
        pydantic_core.from_json(text, allow_partial=True)
    except ValueError:
        return False
    return True


#: A JSON tool call's head as Hermes/Qwen and Llama 3.1 templates ask for it: the name, then the
#: arguments object (Llama 3.1's ``parameters``), from whose ``{`` the arguments stream.
_JSON_CALL_HEAD = re.compile(r'[\s;]*\{\s*"name"\s*:\s*("(?:[^"\\]|\\.)*")\s*,\s*"(?:arguments|parameters)"\s*:\s*(?=\{)')


class JsonCallReader:
    """One tool call written as JSON text (``{"name": ..., "arguments": {...}}``,
    Hermes/Qwen and Llama 3.1), streamed as the model writes it: opened
    (``tool_call_start``) once its name and the ``{`` of its arguments are
    written, then the arguments' text in pieces (``tool_call_args``), each
    sent only while everything sent is a valid JSON prefix. Text that breaks
    the JSON stops the pieces (``broken``); ``arguments`` is then everything
    the model wrote from the arguments on, for the client to see. A call
    written another way (arguments first, or as a string) is not opened:
    the caller reads it whole at its end."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.text = ""
        self.name: str | None = None
        self.broken = False
        self._start = 0                  # where the arguments' text begins in ``text``
        self._end: int | None = None     # ... and ends, once its closing brace is written
        self._stop: int | None = None    # the end of the call object
        self._scan = 0
        self._depth = 0
        self._string = self._escape = False
        self._sent = 0

    @property
    def opened(self) -> bool:
        return self.name is not None

    @property
    def complete(self) -> bool:
        """The call object is closed (its text after that is ``tail``)."""
        return self._stop is not None

    @property
    def tail(self) -> str:
        return self.text[self._stop:] if self._stop is not None else ""

    def feed(self, text: str) -> list[Event]:
        if self._stop is not None:
            self.text += text
            return []
        self.text += text
        events: list[Event] = []
        if self.name is None:
            head = _JSON_CALL_HEAD.match(self.text)
            try:
                name = json.loads(head.group(1)) if head else None
            except ValueError:
                name = None
            if name is None:
                return []
            self.name, self._start = name, head.end()
            self._scan = self._start
            events.append(("tool_call_start", (self.index, name)))
        self._track()
        return events + self._pieces()

    def _track(self) -> None:
        """Follows strings and brackets: depth 1 inside the arguments, 0 after them, -1 past the call."""
        for i in range(self._scan, len(self.text)):
            c = self.text[i]
            if self._string:
                if self._escape:
                    self._escape = False
                elif c == "\\":
                    self._escape = True
                elif c == '"':
                    self._string = False
            elif c == '"':
                self._string = True
            elif c in "{[":
                self._depth += 1
            elif c in "}]":
                self._depth -= 1
                if self._depth == 0 and self._end is None:
                    self._end = i + 1
                elif self._depth < 0:
                    self._stop = i + 1
                    break
        self._scan = len(self.text) if self._stop is None else self._stop

    def _pieces(self) -> list[Event]:
        end = self._end if self._end is not None else len(self.text) if self._stop is None else self._stop
        text = self.text[self._start:end]
        if self.broken or len(text) <= self._sent:
            return []
        if not json_prefix(text) or (self._end is not None and not isinstance(_json_or_none(text), dict)):
            self.broken = True
            return []
        piece, self._sent = text[self._sent:], len(text)
        return [("tool_call_args", (self.index, piece))]

    @property
    def arguments(self) -> str:
        """The arguments as written: the object's text when it is whole and valid, else the model's text from
        its start (broken JSON, which a client can see and refuse)."""
        if self._end is not None and not self.broken:
            return self.text[self._start:self._end]
        return self.text[self._start:self._stop].rstrip()


def _parse_tag(tag: str) -> tuple[str, dict[str, str]]:
    """Element name and unescaped attributes of a tag's text."""
    words = tag.split(maxsplit=1)
    name = words[0] if words else ""
    attributes = {key: _unescape(value) for key, value in _ATTRIBUTE.findall(tag)}
    return name, attributes


def _unescape(value: str) -> str:
    return value.replace("&quot;", '"').replace("&amp;", "&")


def _json_or_none(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return None


def _json_or_text(text: str) -> Any:
    """A typed argument's value; text the model got wrong is kept as a string."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text
