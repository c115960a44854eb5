"""iq4_xs against llama.cpp itself: a tiny Llama GGUF whose every matrix is
IQ4_XS (bench/make_gguf_llama.py --size tiny --type iq4_xs: random blocks,
the demo tokenizer), converted by `ferry convert` (IQ4_XS kept byte for
byte), greedy-decoded by Ferry and by llama-cpp-python (the bench venv of
bench/vs_llamacpp.py) from the same prompt; reports both token lists and the
relative L2 distance of the last prompt position's logits.

    python bench/iq4xs_vs_llamacpp.py [--venv .bench-venv] [--tokens 24] [--json]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
sys.path.insert(0, str(_HERE.parent))

CHILD = """
import json, sys
import numpy as np
import llama_cpp
from llama_cpp import Llama
model, prompt, n = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
llm = Llama(model_path=model, n_ctx=256, n_threads=2, n_threads_batch=2, verbose=False, logits_all=False)
vocab = llm.n_vocab()
def run(tokens):
    llm.eval(tokens)
    return np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm._ctx.ctx, -1), shape=(vocab,)).copy()
first = run(prompt)
toks = [int(first.argmax())]
for _ in range(n - 1):
    toks.append(int(run([toks[-1]]).argmax()))
print(json.dumps({"tokens": toks, "logits": first.tolist()}))
"""


def ferry_greedy(container: Path, prompt: list[int], n: int, activations: str) -> tuple[list[int], np.ndarray]:
    from app.engine.binding import Engine
    with Engine(container, threads=2, activations=activations) as eng:
        s = eng.session(256)
        first = s.eval(prompt)
        toks = [int(np.argmax(first))]
        for _ in range(n - 1):
            toks.append(int(np.argmax(s.eval([toks[-1]]))))
    return toks, np.asarray(first, dtype=np.float64)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--venv", type=Path, default=_HERE.parent / ".bench-venv")
    ap.add_argument("--tokens", type=int, default=24)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    import importlib.util
    spec = importlib.util.spec_from_file_location("make_gguf_llama", _HERE / "make_gguf_llama.py")
    mk = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mk)
    from app.convert.convert import convert
    python = a.venv / "bin" / "python"
    with tempfile.TemporaryDirectory() as tmp:
        gguf = mk.write(Path(tmp) / "tiny-iq4_xs.gguf", "tiny", "iq4_xs")
        container = convert(gguf, Path(tmp) / "tiny.ferry")
        dtypes = sorted({t["dtype"] for t in json.loads((container / "manifest.json").read_text())["tensors"]
                         if len(t["shape"]) > 1})
        rng = np.random.default_rng(1)
        prompt = [int(t) for t in rng.integers(100, 49000, 16)]
        res = subprocess.run([str(python), "-c", CHILD, str(gguf), json.dumps(prompt), str(a.tokens)],
                             capture_output=True, text=True, check=True)
        ll = json.loads(res.stdout.strip().splitlines()[-1])
        out = {"stored_formats": dtypes, "prompt": prompt, "llama_cpp": ll["tokens"]}
        ll_logits = np.asarray(ll["logits"], dtype=np.float64)
        for act in ("exact", "auto"):
            toks, logits = ferry_greedy(container, prompt, a.tokens, act)
            out[f"ferry_{act}"] = toks
            out[f"ferry_{act}_same_tokens"] = sum(x == y for x, y in zip(toks, ll["tokens"]))
            out[f"ferry_{act}_first_logits_rel_l2"] = float(np.linalg.norm(logits - ll_logits) / np.linalg.norm(ll_logits))
    print(json.dumps(out, indent=None if a.json else 1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
