"""A model's own Jinja2 chat template rendered into markup/content segments.

The template is rendered in a sandbox with every piece of conversation text
replaced by a unique placeholder; the output is then cut at the
placeholders, so the template's own text becomes markup (where its special
tokens are recognised) and conversation text becomes content (where they are
not). A user can therefore never type a control token into the prompt.
"""
from __future__ import annotations

import re
import secrets
from datetime import datetime
from typing import Any

from jinja2 import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from app.chat.segments import Segment


class TemplateRenderError(ValueError):
    """The chat template failed or rejected the conversation."""


def _raise(message: str):
    raise TemplateRenderError(message)


class ChatTemplate:
    def __init__(self, source: str, *, bos_token: str | None = None, eos_token: str | None = None):
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = _raise
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        try:
            self._template = env.from_string(source)
        except TemplateError as exc:
            raise TemplateRenderError(f"the chat template does not parse: {exc}") from exc
        self.bos_token = bos_token or ""
        self.eos_token = eos_token or ""

    def render(self, messages: list[dict[str, Any]], *, add_generation_prompt: bool = True,
               **extra: Any) -> list[Segment]:
        tag = secrets.token_hex(8)
        texts: list[str] = []

        def hold(text: str) -> str:
            texts.append(text)
            return f"\x00{tag}:{len(texts) - 1}\x00"

        safe = [{**m, "content": hold(m["content"]) if isinstance(m.get("content"), str) else m.get("content")}
                for m in messages]
        try:
            out = self._template.render(messages=safe, add_generation_prompt=add_generation_prompt,
                                        bos_token=self.bos_token, eos_token=self.eos_token, **extra)
        except TemplateRenderError:
            raise
        except Exception as exc:  # a template is foreign code: report, never crash
            raise TemplateRenderError(f"the chat template failed: {exc}") from exc
        segments: list[Segment] = []
        pattern = re.compile(f"\x00{tag}:(\\d+)\x00")
        pos = 0
        for m in pattern.finditer(out):
            if m.start() > pos:
                segments.append((out[pos:m.start()], True))
            segments.append((texts[int(m.group(1))], False))
            pos = m.end()
        if pos < len(out):
            segments.append((out[pos:], True))
        return segments
