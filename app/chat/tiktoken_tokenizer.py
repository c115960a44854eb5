"""The Kimi K3 tokenizer: the release's ``tiktoken.model`` through ``tiktoken``.

``tiktoken.model`` holds one base token per line, ``BASE64 RANK``. The
special tokens sit right above the base ranks: 256 reserved ids, of which
K3 names a few at fixed offsets (``K3_NAMED_SPECIALS``); the others are
called ``<|reserved_token_ID|>`` after their id. With the release's 163584
base ranks this gives [BOS] 163584 ... [PAD] 163839 and a vocabulary of
163840.

Prompt segments (see ``app.chat.segments``) are encoded with the two kinds
kept apart: markup may hold special tokens, content never does, so text
from a user or a document that spells ``<|open|>`` stays ordinary BPE
tokens.
"""

from __future__ import annotations

import base64
import binascii
import operator
import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from types import MappingProxyType

import tiktoken

from app.chat.segments import Segment

# The pre-tokenisation pattern of the release's ``tokenization_kimi.py``.
# tiktoken's engine (fancy-regex over Rust ``regex``) supports the ``&&``
# class intersections as written; tests/chat/test_tiktoken_tokenizer.py
# checks the resulting splits against the ``regex`` module's V1 set semantics.
KIMI_PAT_STR = "|".join(
    [
        r"[\p{Han}]+",
        r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*"
        r"[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
        r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+"
        r"[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
        r"\p{N}{1,3}",
        r" ?[^\s\p{L}\p{N}]+[\r\n]*",
        r"\s*[\r\n]+",
        r"\s+(?!\S)",
        r"\s+",
    ]
)

NUM_RESERVED_SPECIAL_TOKENS = 256

# Offsets above the base vocabulary of the special tokens K3 gives names to.
K3_NAMED_SPECIALS: Mapping[int, str] = MappingProxyType(
    {
        0: "[BOS]",
        1: "[EOS]",
        2: "<|end_of_msg|>",
        3: "<|open|>",
        4: "<|close|>",
        5: "<|sep|>",
        # an image's block (docs/KIMI.md, "Images"): <|media_begin|>image WxH<|media_content|>, one
        # placeholder (media_placeholder_token_id) per image position, <|media_end|>
        18: "<|media_begin|>",
        19: "<|media_content|>",
        20: "<|media_end|>",
        21: "<|kimi_image_placeholder|>",
        255: "[PAD]",
    }
)

# The token generation stops on (the release config's eos_token_id).
K3_STOP_TOKEN = "<|end_of_msg|>"

_SPECIAL_LIKE = re.compile(r"<\|[^<>|\s]+\|>")


def k3_special_tokens(base_vocab_size: int) -> dict[str, int]:
    """Name -> id of all 256 K3 special tokens above ``base_vocab_size`` ranks."""
    specials = {}
    for offset in range(NUM_RESERVED_SPECIAL_TOKENS):
        token_id = base_vocab_size + offset
        specials[K3_NAMED_SPECIALS.get(offset, f"<|reserved_token_{token_id}|>")] = token_id
    return specials


def load_tiktoken_ranks(path: str | os.PathLike[str]) -> dict[bytes, int]:
    """Read a ``tiktoken.model`` file into a token-bytes -> rank mapping.

    Raises ``ValueError`` naming the file and line for a malformed line, a
    token or rank seen twice, and an empty file. The set of ranks as a whole
    is checked when a ``K3Tokenizer`` is built from it.
    """
    path = Path(path)
    lines = path.read_bytes().split(b"\n")
    if lines[-1] == b"":
        lines.pop()
    if not lines:
        raise ValueError(f"{path}: the file holds no tokens")
    ranks: dict[bytes, int] = {}
    seen_at: dict[int, int] = {}
    for number, line in enumerate(lines, start=1):
        token, rank = _parse_line(line, f"{path}: line {number}")
        if token in ranks:
            raise ValueError(f"{path}: line {number}: token {token!r} already appeared with rank {ranks[token]}")
        if rank in seen_at:
            raise ValueError(f"{path}: line {number}: rank {rank} already used on line {seen_at[rank]}")
        ranks[token] = rank
        seen_at[rank] = number
    return ranks


def _parse_line(line: bytes, where: str) -> tuple[bytes, int]:
    fields = line.split()
    if len(fields) != 2:
        raise ValueError(f"{where}: expected 'BASE64_TOKEN RANK', got {line[:80]!r}")
    encoded, rank = fields
    try:
        token = base64.b64decode(encoded, validate=True)
    except binascii.Error as exc:
        raise ValueError(f"{where}: token {encoded[:80]!r} is not valid base64 ({exc})") from None
    if not token:
        raise ValueError(f"{where}: empty token")
    if not rank.isdigit():
        raise ValueError(f"{where}: rank {rank[:80]!r} is not a non-negative integer")
    return token, int(rank)


def _check_ranks(ranks: Mapping[bytes, int]) -> None:
    """Ranks must be exactly 0..n-1 and include every single byte."""
    count = len(ranks)
    values = set(ranks.values())
    if len(values) != count:
        raise ValueError("mergeable ranks are not unique")
    if values != set(range(count)):
        missing = min(set(range(count)) - values)
        raise ValueError(f"mergeable ranks must be 0..{count - 1} without gaps; rank {missing} is missing")
    absent = [byte for byte in range(256) if bytes([byte]) not in ranks]
    if absent:
        raise ValueError(f"mergeable ranks lack {len(absent)} single-byte tokens (first: {absent[0]:#04x})")


class K3Tokenizer:
    """BPE over the Kimi ranks with the K3 special tokens above them."""

    def __init__(self, mergeable_ranks: Mapping[bytes, int]) -> None:
        """Build from token-bytes -> rank; raises ``ValueError`` for unusable ranks."""
        _check_ranks(mergeable_ranks)
        self._base_vocab_size = len(mergeable_ranks)
        specials = k3_special_tokens(self._base_vocab_size)
        self._encoding = tiktoken.Encoding(
            "kimi-k3",
            pat_str=KIMI_PAT_STR,
            mergeable_ranks=dict(mergeable_ranks),
            special_tokens=specials,
        )
        self._special_tokens: Mapping[str, int] = MappingProxyType(specials)
        self._special_ids = frozenset(specials.values())

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> K3Tokenizer:
        """Load the release's ``tiktoken.model``."""
        return cls(load_tiktoken_ranks(path))

    @property
    def vocab_size(self) -> int:
        """Base ranks plus the 256 reserved special ids."""
        return self._base_vocab_size + NUM_RESERVED_SPECIAL_TOKENS

    @property
    def base_vocab_size(self) -> int:
        """Number of BPE ranks; the first special id."""
        return self._base_vocab_size

    @property
    def special_tokens(self) -> Mapping[str, int]:
        """Name -> id of every special token, reserved ones included."""
        return self._special_tokens

    @property
    def special_ids(self) -> frozenset[int]:
        """Ids of every special token."""
        return self._special_ids

    @property
    def eos_id(self) -> int:
        """The id generation stops on: ``<|end_of_msg|>``."""
        return self._special_tokens[K3_STOP_TOKEN]

    def encode_content(self, text: str) -> list[int]:
        """Encode ordinary text; special-token spellings stay ordinary tokens."""
        return self._encoding.encode_ordinary(text)

    def encode_markup(self, text: str) -> list[int]:
        """Encode format text in which ``<|...|>`` spellings are special tokens.

        Raises ``ValueError`` for a ``<|...|>`` this tokenizer does not know,
        rather than silently encoding a misspelt control token as text.
        """
        for match in _SPECIAL_LIKE.finditer(text):
            if match.group() not in self._special_tokens:
                raise ValueError(f"markup holds {match.group()!r}, which is not a special token of this tokenizer")
        return self._encoding.encode(text, allowed_special="all")

    def encode_segments(self, segments: Iterable[Segment]) -> list[int]:
        """Encode prompt segments: markup with specials, content without."""
        ids: list[int] = []
        for text, is_markup in segments:
            ids += self.encode_markup(text) if is_markup else self.encode_content(text)
        return ids

    def decode(self, ids: Iterable[int]) -> str:
        """Decode ids to text (special tokens by name; bad UTF-8 as U+FFFD)."""
        checked = [self._check_id(token_id) for token_id in ids]
        return self._encoding.decode_bytes(checked).decode("utf-8", errors="replace")

    def decode_token_bytes(self, token_id: int) -> bytes:
        """The bytes of one token (a special token's name for special ids)."""
        return self._encoding.decode_single_token_bytes(self._check_id(token_id))

    def _check_id(self, token_id: int) -> int:
        """``token_id`` as a plain int; ``ValueError`` if it is not a valid id."""
        try:
            value = operator.index(token_id)
        except TypeError:
            raise ValueError(f"token id {token_id!r} is not an integer") from None
        if not 0 <= value < self.vocab_size:
            raise ValueError(f"token id {value} is outside the vocabulary (0..{self.vocab_size - 1})")
        return value
