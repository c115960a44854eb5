"""``ferry`` in a real process whose sampler is scripted (the subprocess twin
of tests/scripted.py, for tests that drive the CLI through its terminal).
Usage: ``python tests/tools/scripted_ferry.py SCRIPT.json FERRY-ARGS...``;
SCRIPT.json is ``{"eos": id, "answers": [[ids], ...], "log": path}``: answer
n picks ``answers[n]`` (then the end token; the last list repeats), and each
prompt the engine is given is appended to ``log`` as one JSON line of its
text, so a test sees what went back to the model."""
from __future__ import annotations

import json
import sys

import app.model

spec = json.loads(open(sys.argv[1], encoding="utf-8").read())
answers: list[list[int]] = spec["answers"]
count = [0]


class ScriptedSampler:
    def __init__(self, _params):
        self.left = list(answers[min(count[0], len(answers) - 1)])
        count[0] += 1

    def __call__(self, logits) -> int:
        assert logits is not None and len(logits) > max(self.left or [0])   # the engine really decoded
        return self.left.pop(0) if self.left else spec["eos"]


generate = app.model.LoadedModel.generate


def logged(self, session, prompt, *args, **kw):
    with open(spec["log"], "a", encoding="utf-8") as f:
        f.write(json.dumps(self.tokenizer.decode(list(prompt))) + "\n")
    return generate(self, session, prompt, *args, **kw)


app.model.Sampler = ScriptedSampler
app.model.LoadedModel.generate = logged

if __name__ == "__main__":
    from app.cli import main

    sys.exit(main(sys.argv[2:]))
