"""A container's ``tokenizer.json`` through the ``tokenizers`` library, with
markup/content separation: markup may contain special tokens, content never
becomes one (``encode_special_tokens`` makes the library treat the literal
text of a special token as ordinary text)."""
from __future__ import annotations

import json
import re
from functools import lru_cache
from pathlib import Path
from typing import Iterable

from tokenizers import Tokenizer

from app.chat.segments import Segment


class HFTokenizer:
    def __init__(self, path: Path, *, eos_ids: Iterable[int] = (), bos_id: int | None = None):
        try:
            self._markup = Tokenizer.from_file(str(path))
            self._content = Tokenizer.from_file(str(path))
        except Exception as exc:  # the library raises plain Exception for bad files
            raise ValueError(f"{path.name}: cannot load tokenizer: {exc}") from exc
        self._content.encode_special_tokens = True
        added = self._markup.get_added_tokens_decoder()
        self.special_ids = frozenset(i for i, t in added.items() if t.special)
        self.eos_ids = frozenset(int(i) for i in eos_ids)
        self.bos_id = bos_id
        self.vocab_size = self._markup.get_vocab_size(with_added_tokens=True)
        self._added_ids = frozenset(added)
        self._pieces: str | None = None   #: how the vocabulary spells bytes (found on first use)

    def encode_markup(self, text: str) -> list[int]:
        return self._markup.encode(text, add_special_tokens=False).ids

    def encode_content(self, text: str) -> list[int]:
        return self._content.encode(text, add_special_tokens=False).ids

    def encode_segments(self, segments: Iterable[Segment]) -> list[int]:
        ids: list[int] = []
        for text, is_markup in segments:
            if text:
                ids.extend(self.encode_markup(text) if is_markup else self.encode_content(text))
        return ids

    def decode(self, ids: Iterable[int], *, skip_special: bool = False) -> str:
        return self._markup.decode(list(ids), skip_special_tokens=skip_special)

    def token_text(self, token_id: int) -> str:
        return self._markup.id_to_token(int(token_id)) or ""

    def decode_token_bytes(self, token_id: int) -> bytes:
        """A token's own bytes (as OpenAI's logprobs give them, and as the
        answer's text is made of): a byte-level BPE piece ("Ġthe") mapped back
        to its bytes (b" the"), a SentencePiece piece's "▁" as a space and a
        byte-fallback piece "<0x0A>" as that byte; an added token is its text."""
        piece = self._markup.id_to_token(int(token_id))
        if piece is None:
            return b""
        if int(token_id) in self._added_ids:
            return piece.encode("utf-8")
        kind = self._piece_kind()
        if kind == "byte_level":
            table = _bytes_of_chars()
            if all(c in table for c in piece):
                return bytes(table[c] for c in piece)
        elif kind == "metaspace":
            m = _BYTE_PIECE.fullmatch(piece)
            return bytes([int(m.group(1), 16)]) if m else piece.replace("▁", " ").encode("utf-8")
        return self._markup.decode([int(token_id)]).encode("utf-8")

    def _piece_kind(self) -> str:
        if self._pieces is None:
            try:
                decoder = json.loads(self._markup.to_str()).get("decoder") or {}
            except ValueError:
                decoder = {}
            spelled = json.dumps(decoder)
            self._pieces = ("byte_level" if "ByteLevel" in spelled else
                            "metaspace" if "Metaspace" in spelled or "ByteFallback" in spelled or "▁" in spelled
                            else "other")
        return self._pieces


_BYTE_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")


@lru_cache(maxsize=1)
def _bytes_of_chars() -> dict[str, int]:
    """Byte-level BPE's alphabet: the printable Latin-1 bytes stand for
    themselves, every other byte for the character 256 + its rank among them."""
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    others = [b for b in range(256) if b not in printable]
    table = {chr(b): b for b in printable}
    table.update({chr(256 + i): b for i, b in enumerate(others)})
    return table
