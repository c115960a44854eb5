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


def test_a_tokens_bytes_are_what_the_text_is_made_of(demo_container, tmp_path):
    """Byte-level BPE ("Ġthe"), SentencePiece ("▁the", "<0x0A>") and added tokens
    spelled as the bytes they stand for: what logprobs give as each token's text."""
    from tokenizers import AddedToken, Tokenizer, decoders, models

    from app.chat.hf_tokenizer import HFTokenizer
    from app.chat.turn import token_bytes
    from app.model import LoadedModel

    model = LoadedModel(demo_container)
    try:
        tok = model.tokenizer
        text = 'Hello  world\n\ndef f():\n    return "é中 ☃"'
        ids = tok.encode_content(text)
        pieces = [token_bytes(tok, i) for i in ids]
        assert b"".join(pieces).decode("utf-8") == text
        assert b" world" in pieces and not any("Ġ".encode() in p or "Ċ".encode() in p for p in pieces)
    finally:
        model.close()
    sp = Tokenizer(models.BPE(vocab={"▁the": 0, "<0x0A>": 1, "a": 2, "▁": 3}, merges=[], byte_fallback=True))
    sp.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                    decoders.Strip(" ", 1, 0)])
    sp.add_tokens([AddedToken("<|end|>", special=True)])
    sp.save(str(tmp_path / "sp.json"))
    hf = HFTokenizer(tmp_path / "sp.json")
    assert [hf.decode_token_bytes(i) for i in range(5)] == [b" the", b"\n", b"a", b" ", b"<|end|>"]
