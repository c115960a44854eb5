"""A container's ``tokenizer.json`` through the ``tokenizers`` library, with
markup/content separation: markup may contain special tokens, content never
becomes one (``encode_special_tokens`` makes the library treat the literal
text of a special token as ordinary text)."""
from __future__ import annotations

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
