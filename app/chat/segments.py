"""The prompt representation shared by every chat format.

A rendered prompt is a list of segments, each a ``(text, is_markup)`` pair:

* markup (``is_markup`` true) is text written by the format itself; it may
  contain control/special tokens, which the tokenizer encodes by their ids;
* content (``is_markup`` false) is text that came from the conversation
  (messages, names, tool arguments, documents); the tokenizer encodes it as
  ordinary text, so a literal ``<|open|>`` in it can never become a control
  token.

Segments are kept exactly as a format produces them: adjacent segments of
the same kind are not merged, because the release's K3 encoder does not
merge them either (its conformance cases keep ``message``, `` role``,
``="`` ... as separate content segments).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import TypeAlias

Segment: TypeAlias = tuple[str, bool]


def markup(text: str) -> Segment:
    """A segment of format-owned text that may hold control tokens."""
    return (text, True)


def content(text: str) -> Segment:
    """A segment of conversation text that must never become a control token."""
    return (text, False)


def segments_to_json(segments: Iterable[Segment]) -> str:
    """Serialise segments as a JSON list of ``[text, is_markup]`` pairs.

    The layout (one-space indent, non-ASCII kept as is) matches the
    conformance cases in ``k3-chat-format/cases.json``.
    """
    pairs = [[text, is_markup] for text, is_markup in segments]
    return json.dumps(pairs, ensure_ascii=False, indent=1)
