"""atheris harness: the Kimi K3 tokenizer (app/chat/tiktoken_tokenizer.py).

Two kinds of input:
  * a ``tiktoken.model`` file (``BASE64 RANK`` lines): loading it and building
    a K3Tokenizer from it may only raise ValueError;
  * an input starting with ``#text\\n``: the rest, as text, goes through a
    fixed good tokenizer. Content encoding must never yield a special id and
    must decode back to the same text; markup encoding may only refuse with
    ValueError; decoding any ids may only refuse with ValueError.
"""
from __future__ import annotations

import base64

from fuzzlib import allowed, atheris, main, scratch_dir

with atheris.instrument_imports(include=["app"]):
    from app.chat.tiktoken_tokenizer import K3Tokenizer, load_tiktoken_ranks

PATH = scratch_dir() / "tiktoken.model"
TEXT_MARK = b"#text\n"


def _good_ranks() -> dict[bytes, int]:
    ranks = {bytes([b]): b for b in range(256)}
    for word in (b"th", b"he", b"the", b" the", b"in", b"ing", b"<|", b"|>", "你好".encode()):
        ranks.setdefault(word, len(ranks))
    return ranks


GOOD = K3Tokenizer(_good_ranks())


def check_text(data: bytes) -> None:
    fdp = atheris.FuzzedDataProvider(data)
    text = fdp.ConsumeUnicodeNoSurrogates(fdp.ConsumeIntInRange(0, 4096))
    ids = GOOD.encode_content(text)
    assert not set(ids) & GOOD.special_ids, "content became a special token"
    assert GOOD.decode(ids) == text, "content did not round-trip"
    with allowed(ValueError):
        GOOD.decode(GOOD.encode_markup(text))
    raw = fdp.ConsumeIntList(fdp.ConsumeIntInRange(0, 64), 4)
    with allowed(ValueError):
        GOOD.decode([v - (1 << 31) for v in raw])
    with allowed(ValueError):
        GOOD.decode_token_bytes(fdp.ConsumeIntInRange(-2, GOOD.vocab_size + 2))


def check_file(data: bytes) -> None:
    PATH.write_bytes(data)
    with allowed(ValueError):
        ranks = load_tiktoken_ranks(PATH)
        assert ranks and all(isinstance(k, bytes) and k for k in ranks)
        tok = K3Tokenizer(ranks)
        assert tok.vocab_size == len(ranks) + 256
        sample = "The quick 你好 <|open|> fox"
        assert tok.decode(tok.encode_content(sample)) == sample
        tok.encode_markup("<|open|>x<|sep|>")
        assert base64.b64encode(tok.decode_token_bytes(0))


def test_one(data: bytes) -> None:
    if data.startswith(TEXT_MARK):
        check_text(data[len(TEXT_MARK):])
    else:
        check_file(data)


if __name__ == "__main__":
    main(test_one)
