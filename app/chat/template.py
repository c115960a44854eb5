"""A model's own Jinja2 chat template rendered into markup/content segments.

The template is rendered in a sandbox with every piece of conversation text
replaced by a unique placeholder; the output is then cut at the
placeholders, so the template's own text becomes markup (where its special
tokens are recognised) and conversation text becomes content (where they are
not). A user can therefore never type a control token into the prompt.

A template is foreign code from a model folder, so besides Jinja's sandbox
(no attribute access to internals, no mutation) a render is bounded: at most
:data:`MAX_STEPS` template lines executed, :data:`MAX_SECONDS` of time,
:data:`MAX_OUTPUT_CHARS` of output, and no value built past that size --
by ``*``, ``+``, ``~``, ``%``, a captured block, ``str.format`` or a string
method (``center``, ``ljust``, ``join``, ``replace``...) or a filter
(``center``, ``format``, ``indent``, ``wordwrap``, ``join``, ``replace``,
``batch``, ``slice``, ``tojson``): widths above :data:`MAX_WIDTH` are
refused before anything is allocated. Filters that sort or walk a whole
sequence take at most :data:`MAX_ITEMS` items and count them as steps,
``lipsum`` is refused. These checks are the filters themselves, so they also
hold while Jinja folds constants at compile time (it calls filters on
constant arguments then: a refusal there just leaves the expression to the
render, which refuses it). A template that exceeds a bound fails with a
:class:`TemplateRenderError` saying which, instead of hanging the app or
eating its memory.
"""
from __future__ import annotations

import functools
import itertools
import operator
import re
import secrets
import string
import sys
import threading
import time
from datetime import datetime
from typing import Any

from jinja2 import TemplateError
from jinja2.compiler import CodeGenerator
from jinja2.filters import FILTERS
from jinja2.runtime import markup_join, str_join
from jinja2.sandbox import ImmutableSandboxedEnvironment

from app.chat.segments import Segment


#: Template lines one render may execute (about a second here; rendering 3000 messages takes a tenth of that).
MAX_STEPS = 1_000_000
#: Wall-clock seconds one render may take.
MAX_SECONDS = 5.0
#: Characters one render may produce (the conversation's own text is not counted: it is held aside).
MAX_OUTPUT_CHARS = 4 << 20
#: Largest field width or padding a template may ask for (``center``, ``%10s``, ``{:>10}``, ``indent``).
MAX_WIDTH = 10_000
#: Most items a filter that sorts or walks a whole sequence takes.
MAX_ITEMS = 100_000
#: Jinja gives compiled templates this file name; only their lines are counted.
_TEMPLATE_FILE = "<template>"
#: The render running on this thread (its step count and deadline), None while compiling.
_active = threading.local()


def _refuse(what: str) -> TemplateRenderError:
    return TemplateRenderError(f"the chat template {what}")


def _charge(n: int) -> None:
    """Count ``n`` steps of work done outside the template's own lines (a sort,
    a join) against the running render's limits."""
    b = getattr(_active, "bounds", None)
    if b is not None:
        b.steps += n
        b.check()


def _width(n: Any, what: str) -> None:
    if isinstance(n, int) and n > MAX_WIDTH:
        raise _refuse(f"asks for a {what} of {n} (the most is {MAX_WIDTH})")


def _size(n: int) -> None:
    if n > MAX_OUTPUT_CHARS:
        raise _refuse(f"builds a value of more than {MAX_OUTPUT_CHARS} characters")


def _items(value: Any, strings_too: bool = True, cost: int = 1) -> Any:
    """``value`` as a list of at most MAX_ITEMS items (a string or a mapping as
    it is), counted as ``cost`` steps each. ``strings_too=False``: a string of
    any length is fine (a linear walk in C: its length, its first character)."""
    if isinstance(value, str) and not strings_too:
        _charge(len(value) // 64)
        return value
    if isinstance(value, (str, dict)):
        n = len(value)
    else:
        value = list(itertools.islice(value, MAX_ITEMS + 1))
        n = len(value)
    if n > MAX_ITEMS:
        raise _refuse(f"walks a sequence of more than {MAX_ITEMS} items")
    _charge(n * cost)
    return value


_PRINTF = re.compile(r"%(?:\([^)]*\))?[#0 +-]*(\*|\d+)?(?:\.(\*|\d+))?[hlL]?[a-zA-Z%]")


def _ints(values) -> list[int]:
    return [v for v in values if isinstance(v, int) and not isinstance(v, bool)]


def _printf_ok(fmt: Any, args: Any) -> None:
    """A printf-style format (``%``, the ``format`` filter) asks for no width above MAX_WIDTH."""
    if not isinstance(fmt, str):
        return
    values = list(args.values()) if isinstance(args, dict) else list(args) if isinstance(args, tuple) else [args]
    for m in _PRINTF.finditer(fmt):
        for g in m.groups():
            if g == "*":
                for n in _ints(values):
                    _width(n, "width")
            elif g:
                _width(int(g), "width")


def _str_format_ok(fmt: str, args: tuple, kwargs: dict) -> None:
    """``str.format``: no field width or precision above MAX_WIDTH, nested ones included."""
    for _, _, spec, _ in string.Formatter().parse(fmt):
        if not spec:
            continue
        if "{" in spec:
            for n in _ints(list(args) + list(kwargs.values())):
                _width(n, "width")
        for digits in re.findall(r"\d+", spec):
            _width(int(digits), "width")


def _estimate_replace(s: Any, old: Any, new: Any, count: Any = None) -> None:
    if isinstance(s, str) and isinstance(old, str) and isinstance(new, str):
        hits = s.count(old) if old else len(s) + 1
        if isinstance(count, int) and count >= 0:
            hits = min(hits, count)
        _size(len(s) + hits * max(0, len(new) - len(old)))


def _estimate_join(items: list, sep: Any) -> None:
    sep_len = len(sep) if isinstance(sep, str) else 0
    _size(sum(len(x) if isinstance(x, str) else 16 for x in items) + sep_len * max(0, len(items) - 1))


def _guard_filter(name: str, check) -> Any:
    """Jinja's filter ``name`` with ``check(args, kwargs)`` run first on its
    arguments (without the context Jinja passes); ``check`` may return new
    arguments (a generator materialised)."""
    original = FILTERS[name]
    passes = getattr(original, "jinja_pass_arg", None) is not None

    @functools.wraps(original)
    def guarded(*args, **kwargs):
        head, rest = (args[:1], list(args[1:])) if passes else ((), list(args))
        replaced = check(rest, kwargs)
        if replaced is not None:
            rest = replaced
        return original(*head, *rest, **kwargs)

    return guarded


def _arg(rest: list, kwargs: dict, i: int, name: str, default: Any = None) -> Any:
    return rest[i] if len(rest) > i else kwargs.get(name, default)


def _check_indent(rest, kw):
    s, width = _arg(rest, kw, 0, "s", ""), _arg(rest, kw, 1, "width", 4)
    _width(width, "line indent")
    if isinstance(width, str) and isinstance(s, str):
        _size(len(s) + (s.count("\n") + 1) * len(width))


def _check_wordwrap(rest, kw):
    s, width, wrap = _arg(rest, kw, 0, "s", ""), _arg(rest, kw, 1, "width", 79), _arg(rest, kw, 3, "wrapstring")
    if isinstance(s, str) and isinstance(wrap, str) and isinstance(width, int):
        _size(len(s) + (len(s) // max(width, 1) + 1) * len(wrap))


def _check_join(rest, kw):
    if not rest:
        return None
    items = _items(rest[0])
    _estimate_join(list(items) if not isinstance(items, list) else items, _arg(rest, kw, 1, "d", ""))
    return [items, *rest[1:]]


def _json_indent(indent: Any) -> None:
    if (isinstance(indent, int) and indent > 64) or (isinstance(indent, str) and len(indent) > 64):
        raise _refuse("asks for a JSON indent of more than 64")


def _check_sequence(rest, kw):
    return [_items(rest[0]), *rest[1:]] if rest else None


def _check_sort(rest, kw):
    # a sort calls a Python key function per item: a few template lines' worth of time each
    return [_items(rest[0], cost=5), *rest[1:]] if rest else None


def _check_walk(rest, kw):
    return [_items(rest[0], strings_too=False), *rest[1:]] if rest else None


_FILTER_CHECKS = {
    "center": lambda rest, kw: _width(_arg(rest, kw, 1, "width", 80), "width"),
    "format": lambda rest, kw: _printf_ok(_arg(rest, kw, 0, "value"), tuple(rest[1:]) or kw),
    "indent": _check_indent,
    "wordwrap": _check_wordwrap,
    "replace": lambda rest, kw: _estimate_replace(*rest[:3], _arg(rest, kw, 3, "count")) if len(rest) >= 3 else None,
    "join": _check_join,
    "batch": lambda rest, kw: _width(_arg(rest, kw, 1, "linecount"), "batch size"),
    "slice": lambda rest, kw: _width(_arg(rest, kw, 1, "slices"), "number of slices"),
    "tojson": lambda rest, kw: _json_indent(_arg(rest, kw, 1, "indent")),
    **{name: _check_sort for name in ("sort", "dictsort", "unique", "groupby", "min", "max")},
    **{name: _check_sequence for name in ("sum", "list")},
    **{name: _check_walk for name in ("reverse", "map", "select", "reject", "selectattr", "rejectattr", "first",
                                      "last", "random", "length", "count")},
}
_BOUNDED_FILTERS = {name: _guard_filter(name, check) for name, check in _FILTER_CHECKS.items() if name in FILTERS}

#: ``str`` methods that build a string from a width or other strings, and their checks.
_STR_METHOD_CHECKS = {
    "center": lambda s, a, k: _width(a[0] if a else None, "width"),
    "ljust": lambda s, a, k: _width(a[0] if a else None, "width"),
    "rjust": lambda s, a, k: _width(a[0] if a else None, "width"),
    "zfill": lambda s, a, k: _width(a[0] if a else None, "width"),
    "expandtabs": lambda s, a, k: _size(len(s) * max(1, a[0] if a and isinstance(a[0], int) else 8)),
    "replace": lambda s, a, k: _estimate_replace(s, *a[:3]) if len(a) >= 2 else None,
}


def _no_lipsum(*args, **kwargs):
    raise _refuse("calls lipsum(), which Ferry does not provide to chat templates")


class _BoundedBuffer(list):
    """The list a captured block, a macro or a call block writes its output
    to, refusing to hold more than MAX_OUTPUT_CHARS characters."""

    def __init__(self):
        super().__init__()
        self.size = 0

    def append(self, piece) -> None:
        self.size += len(piece)
        _size(self.size)
        super().append(piece)

    def extend(self, pieces) -> None:
        pieces = list(pieces)
        self.size += sum(len(p) for p in pieces)
        _size(self.size)
        super().extend(pieces)


class _BoundedCodeGenerator(CodeGenerator):
    """Jinja's code generator with ``~`` (string concatenation) and captured
    output (``{% set x %}``, macros) bounded in size."""

    def buffer(self, frame) -> None:
        frame.buffer = self.temporary_identifier()
        self.writeline(f"{frame.buffer} = environment.bounded_buffer()")

    def visit_Concat(self, node, frame) -> None:
        self.write("environment.bounded_concat(context.eval_ctx, (")
        for arg in node.nodes:
            self.visit(arg, frame)
            self.write(", ")
        self.write("))")


class TemplateRenderError(ValueError):
    """The chat template failed or rejected the conversation."""


class _BoundedSandbox(ImmutableSandboxedEnvironment):
    """Jinja's immutable sandbox, unable to build huge values (see the module)."""

    intercepted_binops = frozenset({"*", "**", "+", "%"})
    code_generator_class = _BoundedCodeGenerator
    bounded_buffer = _BoundedBuffer

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.filters.update(_BOUNDED_FILTERS)
        self.globals["lipsum"] = _no_lipsum

    @staticmethod
    def concat(pieces) -> str:
        """Joins a captured block (``{% set x %}...{% endset %}``, a macro's output): bounded too."""
        pieces = list(pieces)
        _size(sum(len(p) for p in pieces))
        return "".join(pieces)

    def bounded_concat(self, eval_ctx, items: tuple) -> str:
        strings = [x if isinstance(x, str) else str(x) for x in items]
        _size(sum(len(x) for x in strings) * (6 if eval_ctx.autoescape else 1))
        return (markup_join if eval_ctx.autoescape else str_join)(strings)

    def call_binop(self, context, operator_name: str, left: Any, right: Any) -> Any:
        if operator_name == "+" and type(left) is str and type(right) is str:     # the common case, first
            if len(left) + len(right) > MAX_OUTPUT_CHARS:
                _size(len(left) + len(right))
            return left + right
        if operator_name == "**":
            if isinstance(right, int) and isinstance(left, (int, float)) and abs(right) > 4096 and abs(left) > 1:
                raise TemplateRenderError("the chat template computes a power too large to hold")
            return operator.pow(left, right)
        if operator_name == "+":
            if isinstance(left, (str, list, tuple)) and isinstance(right, (str, list, tuple)):
                _size(len(left) + len(right))
            return operator.add(left, right)
        if operator_name == "%":
            _printf_ok(left, right)
            return operator.mod(left, right)
        for seq, n in ((left, right), (right, left)):
            if isinstance(seq, (str, list, tuple, bytes)) and isinstance(n, int) and len(seq) * max(n, 0) > MAX_OUTPUT_CHARS:
                raise TemplateRenderError(f"the chat template builds a value of more than {MAX_OUTPUT_CHARS} "
                                          "characters")
        return operator.mul(left, right)

    def wrap_str_format(self, value: Any):
        wrapped = super().wrap_str_format(value)
        if wrapped is None:
            return None
        fmt = value.__self__

        def bounded(*args, **kwargs):
            if value.__name__ == "format_map":
                _str_format_ok(fmt, (), args[0] if args and isinstance(args[0], dict) else {})
            else:
                _str_format_ok(fmt, args, kwargs)
            return wrapped(*args, **kwargs)

        return functools.update_wrapper(bounded, value)

    def call(__self, __context, __obj, *args, **kwargs):  # noqa: N805 (Jinja's own signature)
        owner = getattr(__obj, "__self__", None)
        if isinstance(owner, str):
            name = getattr(__obj, "__name__", "")
            if name in _STR_METHOD_CHECKS:
                _STR_METHOD_CHECKS[name](owner, args, kwargs)
            elif name == "join" and args:
                items = _items(args[0])
                _estimate_join(items if isinstance(items, list) else list(items), owner)
                args = (items, *args[1:])
        return super().call(__context, __obj, *args, **kwargs)


class _Bounds:
    """A trace function counting the template's executed lines against the step and time limits."""

    def __init__(self):
        self.steps = 0
        self.deadline = time.monotonic() + MAX_SECONDS

    def check(self) -> None:
        if self.steps > MAX_STEPS:
            raise TemplateRenderError(f"the chat template ran more than {MAX_STEPS} steps (a runaway loop?)")
        if time.monotonic() > self.deadline:
            raise TemplateRenderError(f"the chat template took longer than {MAX_SECONDS:g} s to render")

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
        _active.bounds = self
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
            _active.bounds = None
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
