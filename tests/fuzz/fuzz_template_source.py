"""atheris harness: a hostile chat template's *source* (app/chat/template.py).

fuzz_template.py fuzzes conversations through fixed templates; here the
template itself is the input, as a model folder may carry any text as its
chat template. The input's bytes (UTF-8, undecodable bytes replaced) are the
template source, rendered over a small fixed conversation with tools. Compiling
and rendering may only raise TemplateRenderError, and must stay inside the
sandbox's bounds (a render taking past the libFuzzer timeout, or memory past
its RSS limit, is a finding). When it renders, every content segment is a
message's text and no placeholder leaks into the markup."""
from __future__ import annotations

import re

from fuzzlib import allowed, atheris, main

with atheris.instrument_imports(include=["app", "jinja2"]):
    from app.chat.template import ChatTemplate, TemplateRenderError

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+2?"},
            {"role": "assistant", "content": "4", "tool_calls": [{"type": "function", "id": "c1",
                                                                    "function": {"name": "add", "arguments": "{}"}}]},
            {"role": "tool", "content": "4", "tool_call_id": "c1"}, {"role": "user", "content": "Thanks"}]
TOOLS = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]
TEXTS = {m["content"] for m in MESSAGES}
PLACEHOLDER = re.compile("\x00[0-9a-f]{16}:[0-9]+\x00")


def test_one(data: bytes) -> None:
    source = data.decode("utf-8", "replace")
    with allowed(TemplateRenderError):
        segments = ChatTemplate(source, bos_token="<s>", eos_token="</s>").render(MESSAGES, tools=TOOLS)
        for text, is_markup in segments:
            assert isinstance(text, str) and isinstance(is_markup, bool)
            if is_markup:
                assert not PLACEHOLDER.search(text), "a placeholder leaked into the markup"
            else:
                assert text in TEXTS, "a content segment is not a message's text"


if __name__ == "__main__":
    main(test_one)
