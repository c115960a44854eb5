"""The window's token probabilities, without widgets (app/chat/token_probs.py):
what is kept with an answer, and how it reads."""
from __future__ import annotations

import math

from app.chat import token_probs as tp
from app.chat.turn import logprobs_content
from app.events import TokenLogprob

COLORS = {"sure": "#fff", "likely": "#ff0", "unsure": "#f80", "rare": "#f00", "text": "#000"}


def _content():
    entries = [(5, TokenLogprob(math.log(0.92), ((5, math.log(0.92)), (7, math.log(0.05))),
                                token_bytes=b" Paris", top_bytes=(b" Paris", b" Lyon"))),
               (9, TokenLogprob(math.log(0.3), ((8, math.log(0.6)), (9, math.log(0.3))),
                                token_bytes=b"\n", top_bytes=(b"<b>", b"\n")))]
    return logprobs_content(entries)   # no tokenizer: the bytes they carry (as a remote engine's)


def test_kept_form_round_trips_through_the_stats():
    kept = tp.compact(_content())
    assert kept == [[" Paris", math.log(0.92), [[" Paris", math.log(0.92)], [" Lyon", math.log(0.05)]]],
                    ["\n", math.log(0.3), [["<b>", math.log(0.6)], ["\n", math.log(0.3)]]]]
    tokens = tp.from_stats({tp.STATS_KEY: kept, "turn_tokens": 2})
    assert [t.text for t in tokens] == [" Paris", "\n"]
    assert abs(tokens[0].probability - 0.92) < 1e-12
    assert tokens[1].alternatives[0] == ("<b>", math.log(0.6))
    assert tp.from_stats({}) == [] and tp.from_stats(None) == []
    assert tp.from_stats({tp.STATS_KEY: [["x"]]}) == []     # spelled otherwise: left out, never an exception


def test_descriptions_name_the_token_its_probability_and_the_alternatives():
    a, b = tp.from_stats({tp.STATS_KEY: tp.compact(_content())})
    assert tp.describe(a) == "“·Paris” 92.0 % — also: “·Lyon” 5.0 %"
    assert tp.describe(b) == "“↵” 30.0 % — also: “<b>” 60.0 %"
    assert tp.describe(tp.TokenProb("x", 0.0)) == "“x” 100 % — no alternatives kept"
    assert tp.summary([a, b]) == "2 tokens · mean 61.0 % · least likely “↵” 30.0 %"
    assert tp.summary([]) == ""
    assert tp.percent(math.log(0.00001)) == "< 0.01 %" and tp.percent(-math.inf) == "< 0.01 %"
    assert tp.visible("") == "∅" and tp.visible("  ") == "··" and tp.visible("\tx ") == "→x·"


def test_html_escapes_text_shades_by_probability_and_links_each_token():
    a, b = tp.from_stats({tp.STATS_KEY: tp.compact(_content())})
    html = tp.tokens_html([a, b, tp.TokenProb("<script>", math.log(0.1))], COLORS, selected=1)
    assert "<script>" not in html and "&lt;script&gt;" in html
    assert html.count("<a href='tok:") == 3
    assert "background-color:#fff" in html and "background-color:#f80" in html and "background-color:#f00" in html
    assert html.count("underline;font-weight:bold") == 1 and "↵<br>" in html
    assert [tp.link_index(h, 3) for h in ("tok:0", "tok:2", "tok:3", "tok:x", "cite:1", "")] == [0, 2, None, None,
                                                                                               None, None]
