"""Fixtures for the chat tests: a small BPE in the real tiktoken.model format.

No release tokenizer is available offline, so the tests learn a few hundred
merges from a short mixed-script corpus, on top of all 256 single bytes, and
write them the way ``tiktoken.model`` is written (``BASE64 RANK`` per line).
"""

from __future__ import annotations

import base64
from collections import Counter
from itertools import pairwise
from pathlib import Path

import pytest
import regex

from app.chat.tiktoken_tokenizer import KIMI_PAT_STR, K3Tokenizer

CORPUS = """\
The quick brown fox jumps over the lazy dog. It's what they'd said they'll do.
Hello, world! Weather in Paris and Rome? The weather is 18C in Paris, 24C in Rome.
def render(request): return [segment for segment in request["messages"]]
We're thinking about the response; the response is what the user reads.
你好，世界！今天天气很好。我们在巴黎和罗马。中文分词测试。
日本語のテキストとカタカナ。한국어 문장도 있습니다.
Numbers: 1234567890, 3.14159, 2026-01-01. Symbols: <|open|> && || -> => {}[]
"""
NUM_MERGES = 300


def learn_bpe(corpus: str, num_merges: int) -> dict[bytes, int]:
    """Byte-level BPE ranks: the 256 bytes, then merges by pair frequency."""
    ranks = {bytes([byte]): byte for byte in range(256)}
    words = Counter(
        tuple(bytes([byte]) for byte in word.encode("utf-8"))
        for word in regex.findall(KIMI_PAT_STR, corpus, flags=regex.V1)
    )
    for _ in range(num_merges):
        pairs: Counter[tuple[bytes, bytes]] = Counter()
        for word, count in words.items():
            for pair in pairwise(word):
                pairs[pair] += count
        if not pairs:
            break
        best = min(pairs, key=lambda pair: (-pairs[pair], pair))
        ranks[best[0] + best[1]] = len(ranks)
        words = Counter({_merge(word, best): count for word, count in words.items()})
    return ranks


def _merge(word: tuple[bytes, ...], pair: tuple[bytes, bytes]) -> tuple[bytes, ...]:
    merged: list[bytes] = []
    position = 0
    while position < len(word):
        if word[position:position + 2] == pair:
            merged.append(pair[0] + pair[1])
            position += 2
        else:
            merged.append(word[position])
            position += 1
    return tuple(merged)


def tiktoken_lines(ranks: dict[bytes, int]) -> list[bytes]:
    """The lines of a tiktoken.model file for ``ranks``, in rank order."""
    ordered = sorted(ranks.items(), key=lambda item: item[1])
    return [base64.b64encode(token) + b" " + str(rank).encode() for token, rank in ordered]


@pytest.fixture(scope="session")
def bpe_ranks() -> dict[bytes, int]:
    return learn_bpe(CORPUS, NUM_MERGES)


@pytest.fixture(scope="session")
def model_lines(bpe_ranks: dict[bytes, int]) -> list[bytes]:
    return tiktoken_lines(bpe_ranks)


@pytest.fixture(scope="session")
def model_file(tmp_path_factory: pytest.TempPathFactory, model_lines: list[bytes]) -> Path:
    path = tmp_path_factory.mktemp("tokenizer") / "tiktoken.model"
    path.write_bytes(b"\n".join(model_lines) + b"\n")
    return path


@pytest.fixture(scope="session")
def tokenizer(model_file: Path) -> K3Tokenizer:
    return K3Tokenizer.from_file(model_file)
