"""Renderer for the Kimi K3 chat format ("XTML").

``render_k3`` turns an OpenAI-style chat request into the prompt segments the
release's own encoder produces (see ``docs/CHAT_FORMATS.md``). Control tokens
are emitted as markup segments; every piece of text between them (element
names, attributes, message bodies, tool JSON) is a content segment, so
nothing taken from the request can turn into a control token.

Malformed requests raise ``ValueError`` with a message naming the offending
field, e.g. ``messages[2].tool_calls[0].function.name``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from app.chat.segments import Segment, content, markup, segments_to_json

OPEN = "<|open|>"
CLOSE = "<|close|>"
SEP = "<|sep|>"
END_OF_MSG = "<|end_of_msg|>"
IMAGE_PLACEHOLDER = "<|kimi_image_placeholder|>"

THINKING_EFFORTS = ("low", "medium", "high", "max")
ROLES = ("system", "user", "assistant", "tool")

_TOOLS_HEADING = "# Tools\nHere are the available tools, described in JSONSchema.\n\n"
_NEW_TOOLS_HEADING = (
    "## New Tools Available\n"
    "The system dynamically extends the toolset via lazy-loading.\n"
    "You have access to all existing and extended tools.\n"
    "Here are the specs for the extended tools.\n\n"
)
_THINKING_EFFORT_TEXT = (
    "`thinking_effort` guides on how much to think in your thinking channel "
    "(not including the response channel), supported values include `low`, "
    "`medium`, `high`, and `max`.\n"
    "Now the system is invoked with `thinking_effort={}`."
)
_TOOL_CHOICE_RULES = {
    "required": "You MUST call tools in the next message.",
    "none": "You MUST NOT call any tools in the next message.",
}
_RAW_JSON_RULE = (
    "Your response must be raw JSON data without markdown code blocks (```json) "
    "or any additional formatting."
)
_IMAGE_PART_TYPES = ("image_url", "image")

Attributes = Sequence[tuple[str, str]]


# --------------------------------------------------------------------------
# Public entry points


def render_k3(request: Mapping[str, Any]) -> list[Segment]:
    """Render an OpenAI-style chat request as K3 prompt segments.

    Recognised keys: ``messages`` (required), ``tools``, ``tool_choice``,
    ``response_format``, ``thinking`` (default true), ``thinking_effort``,
    ``add_generation_prompt`` (default true) and ``image_prompts``; other keys
    (model, sampling settings, ...) do not affect the prompt and are ignored.
    """
    if not isinstance(request, Mapping):
        raise ValueError("request must be a JSON object")
    messages = _require_list(request.get("messages"), "messages")
    thinking = _bool_option(request, "thinking", default=True)
    add_generation_prompt = _bool_option(request, "add_generation_prompt", default=True)
    effort = _thinking_effort(request.get("thinking_effort"))
    images = _ImagePrompts(request.get("image_prompts"))

    segments: list[Segment] = []
    tools = _tool_list(request.get("tools"), "tools")
    if tools:
        segments += _system_message("tool-declare", _TOOLS_HEADING + _json_block(tools))
    if effort is not None and thinking:
        segments += _system_message("thinking-effort", _THINKING_EFFORT_TEXT.format(effort))
    segments += _render_conversation(messages, images)
    segments += _tool_choice_message(request.get("tool_choice"))
    segments += _response_format_message(request.get("response_format"))
    images.check_all_used()
    if add_generation_prompt:
        segments += generation_prompt(thinking)
    return segments


def render_chat_json(request: Mapping[str, Any] | str | os.PathLike[str]) -> str:
    """Render a request (or a JSON file holding one) as JSON segment pairs.

    The output is a JSON list of ``[text, is_markup]`` pairs laid out like the
    conformance cases. Unreadable files and invalid JSON raise ``ValueError``.
    """
    if not isinstance(request, Mapping):
        request = _read_request(Path(request))
    return segments_to_json(render_k3(request))


def generation_prompt(thinking: bool = True) -> list[Segment]:
    """The opening of the assistant turn the model is asked to complete."""
    channel = "think" if thinking else "response"
    return [*_open_tag("message", [("role", "assistant")]), *_open_tag(channel)]


def forced_call_prefix(tool: str) -> list[Segment]:
    """What follows a no-thinking generation prompt to make the answer call
    ``tool``: the (empty) response closed, the ``tools`` element and the call
    opened, as the model would write them; the model continues with the
    call's arguments."""
    return [markup(CLOSE), content("response"), markup(SEP), *_open_tag("tools"),
            *_open_tag("call", [("tool", tool), ("index", "1")])]


def end_thinking() -> list[Segment]:
    """What ends the thinking element and opens the response, as the model
    would write them: written for it when its thinking budget is spent."""
    return [markup(CLOSE), content("think"), markup(SEP), *_open_tag("response")]


# --------------------------------------------------------------------------
# Elements


def _text(text: str) -> list[Segment]:
    """A content segment for ``text``; empty text yields no segment at all."""
    return [content(text)] if text else []


def _escape_attribute(value: str) -> str:
    return value.replace("&", "&amp;").replace('"', "&quot;")


def _open_tag(name: str, attributes: Attributes = ()) -> list[Segment]:
    segments = [markup(OPEN), content(name)]
    for key, value in attributes:
        segments += [content(" " + key), content('="'), *_text(_escape_attribute(value)), content('"')]
    segments.append(markup(SEP))
    return segments


def _element(name: str, body: list[Segment], attributes: Attributes = ()) -> list[Segment]:
    return [*_open_tag(name, attributes), *body, markup(CLOSE), content(name), markup(SEP)]


def _message(role: str, body: list[Segment], attributes: Attributes = ()) -> list[Segment]:
    return [*_element("message", body, [("role", role), *attributes]), markup(END_OF_MSG)]


def _system_message(kind: str, text: str, attributes: Attributes = ()) -> list[Segment]:
    return _message("system", _text(text), [*attributes, ("type", kind)])


def _json_block(value: Any) -> str:
    """Compact, key-sorted JSON in a ```json fence (tool lists, schemas)."""
    try:
        text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"value is not JSON-serialisable: {exc}") from None
    return f"```json\n{text}\n```"


# --------------------------------------------------------------------------
# Request-level system messages


def _thinking_effort(value: Any) -> str | None:
    if value is None or value in THINKING_EFFORTS:
        return value
    raise ValueError(f"thinking_effort must be one of {', '.join(THINKING_EFFORTS)}; got {value!r}")


def _tool_choice_message(value: Any) -> list[Segment]:
    if value is None or value == "auto":
        return []
    if not isinstance(value, str) or value not in _TOOL_CHOICE_RULES:
        raise ValueError(
            f"tool_choice must be 'auto', 'none' or 'required' (the K3 format has no wording "
            f"for forcing a named tool); got {value!r}"
        )
    text = f"The system is invoked with `tool_choice={value}`.\n{_TOOL_CHOICE_RULES[value]}"
    return _system_message("tool-choice", text)


def _response_format_message(value: Any) -> list[Segment]:
    if value is None:
        return []
    if not isinstance(value, Mapping):
        raise ValueError("response_format must be an object with a 'type'")
    kind = value.get("type")
    if kind == "text":
        return []
    if kind not in ("json_object", "json_schema"):
        raise ValueError(f"response_format.type must be text, json_object or json_schema; got {kind!r}")
    lines = [f"The system is invoked with `response_format={kind}`.", _RAW_JSON_RULE]
    if kind == "json_schema":
        schema = _json_schema(value.get("json_schema"))
        if not isinstance(schema, Mapping):
            raise ValueError("response_format.json_schema.schema must be an object")
        lines.append("The JSON data must match the following schema:\n" + _json_block(schema))
    return _system_message("response-format", "\n".join(lines))


# --------------------------------------------------------------------------
# The conversation


def _json_schema(spec: Any) -> Any:
    """The schema of ``response_format.json_schema``: OpenAI's ``{name, schema,
    strict}``, or the schema itself with no ``schema`` wrapper (as clients
    also send it; OpenAI's ``name`` and ``strict`` are then not part of it)."""
    if not isinstance(spec, Mapping):
        return None
    if "schema" in spec:
        return spec["schema"]
    bare = {k: v for k, v in spec.items() if k not in ("name", "strict")}
    return bare or None


def _render_conversation(messages: list[Any], images: _ImagePrompts) -> list[Segment]:
    """Render the messages in order, each run of tool results in call order."""
    segments: list[Segment] = []
    ledger = _CallLedger()
    results: list[tuple[int, list[Segment]]] = []
    for position, message in enumerate(messages):
        where = f"messages[{position}]"
        if not isinstance(message, Mapping):
            raise ValueError(f"{where} must be an object")
        role = message.get("role")
        if role not in ROLES:
            raise ValueError(f"{where}.role must be one of {', '.join(ROLES)}; got {role!r}")
        if role == "tool":
            results.append(_tool_result(message, where, ledger, images))
            continue
        segments += _in_call_order(results)
        results = []
        if role == "assistant":
            segments += _assistant_message(message, where, ledger, images)
        elif role == "system" and message.get("tools") is not None:
            segments += _tool_extension_message(message, where)
        else:
            body = _message_content(message, where, images, required=True)
            segments += _message(role, body, _name_attribute(message, where))
    return segments + _in_call_order(results)


def _in_call_order(results: list[tuple[int, list[Segment]]]) -> list[Segment]:
    ordered = sorted(results, key=lambda result: result[0])
    return [segment for _, rendered in ordered for segment in rendered]


def _name_attribute(message: Mapping[str, Any], where: str) -> list[tuple[str, str]]:
    name = _optional_str(message, "name", where)
    return [("name", name)] if name is not None else []


def _tool_extension_message(message: Mapping[str, Any], where: str) -> list[Segment]:
    """A system message that declares tools mid-conversation."""
    if message.get("content"):
        raise ValueError(f"{where}: a system message carries either content or tools, not both")
    tools = _tool_list(message.get("tools"), f"{where}.tools")
    return _system_message(
        "tool-declare", _NEW_TOOLS_HEADING + _json_block(tools), _name_attribute(message, where)
    )


def _assistant_message(
    message: Mapping[str, Any], where: str, ledger: _CallLedger, images: _ImagePrompts
) -> list[Segment]:
    reasoning = message.get("reasoning_content")
    if reasoning is None:
        reasoning = message.get("reasoning")
    if reasoning is not None and not isinstance(reasoning, str):
        raise ValueError(f"{where}: reasoning must be a string")
    body = _element("think", _text(reasoning or ""))
    body += _element("response", _message_content(message, where, images, required=False))
    calls = _tool_calls(message.get("tool_calls"), f"{where}.tool_calls")
    ledger.start_turn([(call_id, name) for call_id, name, _ in calls])
    if calls:
        body += _element("tools", _call_elements(calls, f"{where}.tool_calls"))
    return _message("assistant", body, _name_attribute(message, where))


def _call_elements(calls: list[tuple[str | None, str, Any]], where: str) -> list[Segment]:
    """One ``call`` element per tool call, numbered from 1 within the turn."""
    segments: list[Segment] = []
    for index, (_, name, arguments) in enumerate(calls, start=1):
        body = _arguments_body(arguments, f"{where}[{index - 1}].function.arguments")
        segments += _element("call", body, [("tool", name), ("index", str(index))])
    return segments


def _tool_result(
    message: Mapping[str, Any], where: str, ledger: _CallLedger, images: _ImagePrompts
) -> tuple[int, list[Segment]]:
    """A rendered tool result and the index of the call it answers."""
    index, tool = ledger.resolve(message, where)
    attributes = [*_name_attribute(message, where), ("tool", tool), ("index", str(index))]
    body = _message_content(message, where, images, required=True)
    return index, _message("tool", body, attributes)


class _CallLedger:
    """The tool calls of the latest assistant turn, for matching results to them."""

    def __init__(self) -> None:
        self._calls: list[tuple[str | None, str]] = []
        self._answered: set[int] = set()
        self._unmatched = 0

    def start_turn(self, calls: list[tuple[str | None, str]]) -> None:
        """Forget the previous turn; ``calls`` are (id, tool name) in call order."""
        self._calls = calls
        self._answered = set()
        self._unmatched = 0

    def resolve(self, message: Mapping[str, Any], where: str) -> tuple[int, str]:
        """The (index, tool name) a tool result answers.

        A result names its call by ``tool_call_id``; without one it answers
        the earliest unanswered call. An explicit ``tool`` name overrides the
        call's name, and lets a result stand without any call: such results
        are numbered after the turn's calls.
        """
        tool = _optional_str(message, "tool", where)
        call_id = _optional_str(message, "tool_call_id", where)
        index = self._by_id(call_id, where) if call_id is not None else self._earliest_unanswered()
        if index is None:
            if tool is None:
                raise ValueError(
                    f"{where}: tool result has no tool_call_id and there is no unanswered "
                    f"tool call for it to answer"
                )
            self._unmatched += 1
            return len(self._calls) + self._unmatched, tool
        self._answered.add(index)
        return index, tool if tool is not None else self._calls[index - 1][1]

    def _by_id(self, call_id: str, where: str) -> int:
        for index, (known_id, _) in enumerate(self._calls, start=1):
            if known_id == call_id:
                if index in self._answered:
                    raise ValueError(f"{where}: tool call {call_id!r} already has a result")
                return index
        raise ValueError(f"{where}: tool_call_id {call_id!r} matches no call of the preceding assistant turn")

    def _earliest_unanswered(self) -> int | None:
        for index in range(1, len(self._calls) + 1):
            if index not in self._answered:
                return index
        return None


# --------------------------------------------------------------------------
# Tool calls and their arguments


def _tool_calls(value: Any, where: str) -> list[tuple[str | None, str, Any]]:
    """Validated (id, name, arguments) triples of an assistant's tool calls."""
    if value is None:
        return []
    calls = []
    for position, call in enumerate(_require_list(value, where)):
        here = f"{where}[{position}]"
        if not isinstance(call, Mapping):
            raise ValueError(f"{here} must be an object")
        if call.get("type", "function") != "function":
            raise ValueError(f"{here}.type must be 'function'; got {call.get('type')!r}")
        function = call.get("function")
        if not isinstance(function, Mapping):
            raise ValueError(f"{here}.function must be an object")
        name = function.get("name")
        if not isinstance(name, str) or not name:
            raise ValueError(f"{here}.function.name must be a non-empty string")
        calls.append((_optional_str(call, "id", here), name, function.get("arguments")))
    return calls


def _arguments_body(arguments: Any, where: str) -> list[Segment]:
    """One ``argument`` element per key, or a raw ``json`` element.

    Arguments arrive as an object or as JSON text; text that is not a JSON
    object is passed through verbatim in a ``json type="object"`` element.
    """
    if arguments is None:
        return []
    if isinstance(arguments, str):
        if not arguments.strip():
            return []
        parsed = _json_object_or_none(arguments)
        if parsed is None:
            return _element("json", _text(arguments), [("type", "object")])
        arguments = parsed
    if not isinstance(arguments, Mapping):
        raise ValueError(f"{where} must be an object or a string of JSON")
    segments: list[Segment] = []
    for key, value in arguments.items():
        kind, text = _typed_value(value, f"{where}.{key}")
        segments += _element("argument", _text(text), [("key", str(key)), ("type", kind)])
    return segments


def _json_object_or_none(text: str) -> dict[str, Any] | None:
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return None
    return value if isinstance(value, dict) else None


def _typed_value(value: Any, where: str) -> tuple[str, str]:
    """The JSON type name of an argument and its text (strings raw, else JSON)."""
    if isinstance(value, str):
        return "string", value
    if isinstance(value, bool):
        kind = "boolean"
    elif value is None:
        kind = "null"
    elif isinstance(value, (int, float)):
        kind = "number"
    elif isinstance(value, Mapping):
        kind = "object"
    elif isinstance(value, list):
        kind = "array"
    else:
        raise ValueError(f"{where}: {type(value).__name__} is not a JSON value")
    try:
        return kind, json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{where}: value is not JSON-serialisable: {exc}") from None


def _tool_list(value: Any, where: str) -> list[Mapping[str, Any]]:
    if value is None:
        return []
    tools = _require_list(value, where)
    for position, tool in enumerate(tools):
        if not isinstance(tool, Mapping):
            raise ValueError(f"{where}[{position}] must be an object")
    return tools


# --------------------------------------------------------------------------
# Message content and images


def _message_content(
    message: Mapping[str, Any], where: str, images: _ImagePrompts, *, required: bool
) -> list[Segment]:
    """Content segments of a message body: a string or a list of parts."""
    value = message.get("content")
    if value is None:
        if required:
            raise ValueError(f"{where} ({message['role']}) has no content")
        return []
    if isinstance(value, str):
        return images.fill(value, f"{where}.content")
    if not isinstance(value, list):
        raise ValueError(f"{where}.content must be a string or a list of parts")
    # Each text part is its own content segment (tokenized on its own), as the
    # release's encoder renders a list of parts.
    segments: list[Segment] = []
    for position, part in enumerate(value):
        here = f"{where}.content[{position}]"
        kind = part.get("type") if isinstance(part, Mapping) else None
        if kind == "text":
            if not isinstance(part.get("text"), str):
                raise ValueError(f"{here}.text must be a string")
            segments += images.fill(part["text"], here)
        elif kind in _IMAGE_PART_TYPES:
            segments.append(images.take(here))
        else:
            raise ValueError(f"{here} must be a text or image part; got type {kind!r}")
    return segments


class _ImagePrompts:
    """The request's ``image_prompts``, handed out to images in order.

    Without ``image_prompts`` a placeholder in text stays literal text (it is
    content, so it still cannot act as a control token) and image parts are
    an error. With them, every image must get exactly one prompt.
    """

    def __init__(self, prompts: Any) -> None:
        if prompts is not None:
            prompts = _require_list(prompts, "image_prompts")
            if not all(isinstance(prompt, str) for prompt in prompts):
                raise ValueError("image_prompts must be a list of strings")
        self._prompts: list[str] | None = prompts
        self._used = 0

    def fill(self, text: str, where: str) -> list[Segment]:
        """Content segments for ``text`` with its placeholders replaced."""
        if self._prompts is None:
            return _text(text)
        pieces = text.split(IMAGE_PLACEHOLDER)
        segments = _text(pieces[0])
        for piece in pieces[1:]:
            segments.append(self.take(where))
            segments += _text(piece)
        return segments

    def take(self, where: str) -> Segment:
        """The markup segment for the next image."""
        if self._prompts is None:
            raise ValueError(f"{where}: an image needs an entry in image_prompts")
        if self._used == len(self._prompts):
            raise ValueError(f"{where}: more images than the {len(self._prompts)} image_prompts given")
        self._used += 1
        return markup(self._prompts[self._used - 1])

    def check_all_used(self) -> None:
        if self._prompts is not None and self._used != len(self._prompts):
            raise ValueError(
                f"image_prompts has {len(self._prompts)} entries but the messages hold {self._used} images"
            )


# --------------------------------------------------------------------------
# Field validation


def _require_list(value: Any, where: str) -> list[Any]:
    if not isinstance(value, list):
        raise ValueError(f"{where} must be a list")
    return value


def _optional_str(obj: Mapping[str, Any], key: str, where: str) -> str | None:
    value = obj.get(key)
    if value is not None and not isinstance(value, str):
        raise ValueError(f"{where}.{key} must be a string")
    return value


def _bool_option(request: Mapping[str, Any], key: str, *, default: bool) -> bool:
    value = request.get(key, default)
    if not isinstance(value, bool):
        raise ValueError(f"{key} must be true or false; got {value!r}")
    return value


def _read_request(path: Path) -> Mapping[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"cannot read request file {path}: {exc}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})") from None
