"""An answer's token probabilities as the window shows them (no Qt here).

The engine gives each generated token's log-probability and its likeliest
alternatives (``TurnDone.logprobs``; ``app.chat.turn.logprobs_content`` spells
them in OpenAI's ``logprobs.content`` shape, as the server and ``ferry run
--json --logprobs`` print them). The window keeps them with the answer (in its
stats, under ``"logprobs"``, in the encrypted history) in the compact form
:func:`compact` makes, and renders them with :func:`tokens_html` (each token a
link shaded by its probability) and :func:`describe` (one token and its
alternatives, for the token under the mouse or the one clicked).
"""
from __future__ import annotations

import html
import math
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

STATS_KEY = "logprobs"   #: where an answer's token probabilities are kept in its stats
LINK_SCHEME = "tok"      #: a token's link in the rendered HTML: tok:INDEX


@dataclass(frozen=True)
class TokenProb:
    text: str
    logprob: float
    alternatives: tuple[tuple[str, float], ...] = ()   #: (text, logprob), likeliest first

    @property
    def probability(self) -> float:
        return math.exp(self.logprob) if math.isfinite(self.logprob) else 0.0


def compact(content: Iterable[dict[str, Any]]) -> list[list]:
    """``logprobs.content`` entries -> ``[[text, logprob, [[text, logprob], ...]], ...]`` (what the history keeps)."""
    return [[str(e.get("token", "")), float(e.get("logprob", 0.0)),
             [[str(a.get("token", "")), float(a.get("logprob", 0.0))] for a in e.get("top_logprobs") or []]]
            for e in content]


def from_stats(stats: dict | None) -> list[TokenProb]:
    """The token probabilities kept with an answer ([] when none, or kept by a version that spelled them otherwise)."""
    out = []
    for entry in (stats or {}).get(STATS_KEY) or []:
        try:
            text, lp, alts = entry
            out.append(TokenProb(str(text), float(lp), tuple((str(t), float(v)) for t, v in alts)))
        except (TypeError, ValueError):
            return []
    return out


def percent(logprob: float) -> str:
    """A probability as people read it: '92.1 %', '0.03 %', '< 0.01 %'."""
    p = 100.0 * (math.exp(logprob) if math.isfinite(logprob) else 0.0)
    if p >= 99.95:
        return "100 %" if p >= 100 else "99.9 %"
    if p >= 1:
        return f"{p:.1f} %"
    return f"{p:.2f} %" if p >= 0.01 else "< 0.01 %"


def visible(text: str) -> str:
    """A token's text with its invisible parts shown: a space at either end as '·', a newline as '↵', a tab
    as '→'."""
    if text == "":
        return "∅"
    shown = text.replace("\n", "↵").replace("\t", "→")
    stripped = shown.strip(" ")
    if stripped != shown:
        lead = len(shown) - len(shown.lstrip(" "))
        trail = len(shown) - len(shown.rstrip(" "))
        shown = "·" * lead + stripped + "·" * trail if stripped else "·" * len(shown)
    return shown


def describe(token: TokenProb) -> str:
    """One line: the token, its probability and its alternatives
    ('“·Paris” 92.1 % — also: “·London” 3.2 %, …')."""
    head = f"“{visible(token.text)}” {percent(token.logprob)}"
    others = [(t, v) for t, v in token.alternatives if t != token.text]
    if not others:
        return head + (" — no alternatives kept" if not token.alternatives else " — no other token was likelier")
    return head + " — also: " + ", ".join(f"“{visible(t)}” {percent(v)}" for t, v in others)


def summary(tokens: Sequence[TokenProb]) -> str:
    """'40 tokens · mean 83.2 % · least likely “ boat” 12.0 %' ('' for none)."""
    if not tokens:
        return ""
    mean = sum(t.probability for t in tokens) / len(tokens)
    low = min(tokens, key=lambda t: t.logprob)
    n = len(tokens)
    return (f"{n} token{'' if n == 1 else 's'} · mean {100 * mean:.1f} % · "
            f"least likely “{visible(low.text)}” {percent(low.logprob)}")


def shade(probability: float, colors: dict[str, str]) -> str:
    """The background of a token: ``colors['sure']`` for p ≥ 0.9, ``'likely'`` for ≥ 0.5, ``'unsure'`` for
    ≥ 0.2, ``'rare'`` below (the theme gives the colours, light or dark)."""
    if probability >= 0.9:
        return colors["sure"]
    if probability >= 0.5:
        return colors["likely"]
    return colors["unsure"] if probability >= 0.2 else colors["rare"]


def tokens_html(tokens: Sequence[TokenProb], colors: dict[str, str], selected: int | None = None) -> str:
    """The answer's tokens, each a ``tok:INDEX`` link shaded by its probability: spaces
    kept, a newline shown as '↵' and kept, and a line may break between any two tokens."""
    parts = []
    for i, t in enumerate(tokens):
        text = html.escape(t.text).replace("\t", "    ") or "∅"
        text = text.replace("\r", "").replace("\n", "↵<br>")
        mark = "underline;font-weight:bold" if i == selected else "none"   # the token described below
        parts.append(f"<a href='{LINK_SCHEME}:{i}' style='color:{colors['text']};text-decoration:{mark};"
                     f"background-color:{shade(t.probability, colors)}'>{text}</a>")
    return "<span style='font-family:monospace;white-space:pre-wrap'>" + "\u200b".join(parts) + "</span>"


def link_index(href: str, count: int) -> int | None:
    """The token a ``tok:INDEX`` link names (None: not a token link, or out of range)."""
    scheme, _, rest = href.partition(":")
    if scheme != LINK_SCHEME or not rest.isdigit():
        return None
    i = int(rest)
    return i if 0 <= i < count else None
