"""Text typed by the user on a command line or a terminal: Python decodes
argv and (here) stdin with ``surrogateescape``, so bytes that are not UTF-8
arrive as lone surrogates. Paths may hold such bytes (the OS takes them back
as they came); text for a model may not. No Qt here."""
from __future__ import annotations

import sys
from typing import Iterable


def not_text(text: str) -> str | None:
    """Why ``text`` is not valid UTF-8 text, or None when it is."""
    for i, ch in enumerate(text):
        if 0xDC80 <= ord(ch) <= 0xDCFF:
            return f"byte 0x{ord(ch) - 0xDC00:02x} at character {i} is not UTF-8"
        if 0xD800 <= ord(ch) <= 0xDFFF:
            return f"a lone surrogate at character {i}"
    return None


def text_argument_problem(args, names: Iterable[str]) -> str | None:
    """The first of ``args``' text arguments ``names`` that is not valid text, said as a usage error."""
    for name in names:
        value = getattr(args, name, None)
        if isinstance(value, str) and (bad := not_text(value)):
            return f"--{name} is not valid UTF-8 text: {bad}" if name == "system" else \
                   f"the {name} is not valid UTF-8 text: {bad}"
    return None


def tolerant_stdin() -> None:
    """Read stdin with surrogateescape, so a line that is not UTF-8 arrives
    (to be refused by :func:`not_text`) instead of an exception."""
    try:
        sys.stdin.reconfigure(errors="surrogateescape")
    except (AttributeError, ValueError):
        pass
