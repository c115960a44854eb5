"""A model's own Jinja2 chat template rendered into markup/content segments.

The template is rendered in a sandbox with every piece of conversation text
replaced by a unique placeholder; the output is then cut at the
placeholders, so the template's own text becomes markup (where its special
tokens are recognised) and conversation text becomes content (where they are
not). A user can therefore never type a control token into the prompt.

A template is foreign code from a model folder, so besides Jinja's sandbox
(no attribute access to internals, no mutation) a render is bounded: at most
:data:`MAX_STEPS` template lines executed, :data:`MAX_SECONDS` of time,
:data:`MAX_OUTPUT_CHARS` of output, and no string or list repeated past that
size. A template that exceeds a bound fails with a :class:`TemplateRenderError`
saying which, instead of hanging the app or eating its memory.
"""
from __future__ import annotations

import operator
import re
import secrets
import sys
import time
from datetime import datetime
from typing import Any

from jinja2 import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from app.chat.segments import Segment


#: Template lines one render may execute (about a second here; rendering 3000 messages takes a tenth of that).
MAX_STEPS = 1_000_000
#: Wall-clock seconds one render may take.
MAX_SECONDS = 5.0
#: Characters one render may produce (the conversation's own text is not counted: it is held aside).
MAX_OUTPUT_CHARS = 4 << 20
#: Jinja gives compiled templates this file name; only their lines are counted.
_TEMPLATE_FILE = "<template>"


class TemplateRenderError(ValueError):
    """The chat template failed or rejected the conversation."""


class _BoundedSandbox(ImmutableSandboxedEnvironment):
    """Jinja's immutable sandbox, with ``*`` and ``**`` unable to build huge values."""

    intercepted_binops = frozenset({"*", "**"})

    def call_binop(self, context, operator_name: str, left: Any, right: Any) -> Any:
        if operator_name == "**":
            if isinstance(right, int) and isinstance(left, (int, float)) and abs(right) > 4096 and abs(left) > 1:
                raise TemplateRenderError("the chat template computes a power too large to hold")
            return operator.pow(left, right)
        for seq, n in ((left, right), (right, left)):
            if isinstance(seq, (str, list, tuple, bytes)) and isinstance(n, int) and len(seq) * max(n, 0) > MAX_OUTPUT_CHARS:
                raise TemplateRenderError(f"the chat template builds a value of more than {MAX_OUTPUT_CHARS} "
                                          "characters")
        return operator.mul(left, right)


class _Bounds:
    """A trace function counting the template's executed lines against the step and time limits."""

    def __init__(self):
        self.steps = 0
        self.deadline = time.monotonic() + MAX_SECONDS

    def call(self, frame, event, arg):
        return self.line if frame.f_code.co_filename == _TEMPLATE_FILE else None

    def line(self, frame, event, arg):
        if event == "line":
            self.steps += 1
            if self.steps > MAX_STEPS:
                raise TemplateRenderError(f"the chat template ran more than {MAX_STEPS} steps (a runaway loop?)")
            if self.steps % 1024 == 0 and time.monotonic() > self.deadline:
                raise TemplateRenderError(f"the chat template took longer than {MAX_SECONDS:g} s to render")
        return self.line

    def run(self, template, **context) -> str:
        out: list[str] = []
        size = 0
        previous = sys.gettrace()
        sys.settrace(self.call)
        try:
            for piece in template.generate(**context):
                size += len(piece)
                if size > MAX_OUTPUT_CHARS:
                    raise TemplateRenderError(f"the chat template produced more than {MAX_OUTPUT_CHARS} characters")
                out.append(piece)
                if time.monotonic() > self.deadline:
                    raise TemplateRenderError(f"the chat template took longer than {MAX_SECONDS:g} s to render")
        finally:
            sys.settrace(previous)
        return "".join(out)


def _raise(message: str):
    raise TemplateRenderError(message)


class ChatTemplate:
    def __init__(self, source: str, *, bos_token: str | None = None, eos_token: str | None = None):
        env = _BoundedSandbox(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = _raise
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        try:
            self._template = env.from_string(source)
        except TemplateError as exc:
            raise TemplateRenderError(f"the chat template does not parse: {exc}") from exc
        except (RecursionError, MemoryError, ValueError, OverflowError) as exc:  # e.g. 1000 nested brackets
            raise TemplateRenderError(f"the chat template cannot be compiled: {type(exc).__name__}: {exc}") from exc
        self.source = source       #: the template text (read once, from inside the container)
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
            out = _Bounds().run(self._template, messages=safe, add_generation_prompt=add_generation_prompt,
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
