"""Test-only controlled generation. Tiny random models (and the small demo)
never write a tool call on their own, so tests that need one replace
``app.model``'s sampler with one that answers with a script's token ids,
then the end token, whatever the logits. The engine still prefills and
decodes every step (the sampler checks it was handed real logits); only the
choice of each token is scripted. In-process only: a ``ferry serve`` in
another process samples for real."""
from __future__ import annotations

import re

import app.model

#: Kimi K3's control tokens: in a K3 script they are written as markup.
K3_MARKERS = ("<|open|>", "<|close|>", "<|sep|>", "<|end_of_msg|>")


def script_ids(model, text: str, markers: tuple[str, ...] = K3_MARKERS) -> list[int]:
    """The ids of ``text`` as the model would write it: ``markers`` as their
    control tokens, everything else as ordinary text."""
    pattern = "(" + "|".join(map(re.escape, markers)) + ")"
    pieces = [p for p in re.split(pattern, text) if p] if markers else [text]
    ids = model.tokenizer.encode_segments([(p, p in markers) for p in pieces])
    assert ids and all(i >= 0 for i in ids)
    return ids


class Script:
    """What the scripted sampler answers next: set ``ids`` before a request
    (each new answer starts the script from its beginning), or ``queue`` the
    answers of several rounds."""

    def __init__(self, eos: int):
        self.ids: list[int] = []
        self.queue: list[list[int]] = []   #: answers to give first, one each, before ``ids``
        self.eos = eos
        self.answers = 0   #: how many answers used the script


def scripted_sampler(monkeypatch, eos: int) -> Script:
    script = Script(eos)

    class ScriptedSampler:
        def __init__(self, _params):
            self.left = list(script.queue.pop(0) if script.queue else script.ids)
            script.answers += 1

        def __call__(self, logits) -> int:
            assert logits is not None and len(logits) > max(self.left or [0])   # the engine really decoded
            return self.left.pop(0) if self.left else script.eos

    monkeypatch.setattr(app.model, "Sampler", ScriptedSampler)
    return script
