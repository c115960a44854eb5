"""bench/make_gguf_llama.py writes GGUF files that convert with their K-quant
and Q8_0 blocks kept as they are and that the core runs: the synthetic
files bench/vs_llamacpp.py measures are real models to both engines."""
from __future__ import annotations

import json
import sys

import numpy as np
import pytest

from tests.conftest import REPO

sys.path.insert(0, str(REPO))
from bench import make_gguf_llama  # noqa: E402


@pytest.mark.parametrize("qtype, formats", [("q4_k_m", {"q4_k", "q6_k"}), ("q8_0", {"q8_0"})])
def test_synthetic_gguf_converts_and_runs(tmp_path, demo_gguf, qtype, formats):
    from app.convert.convert import convert
    from app.engine.binding import Engine

    path = make_gguf_llama.write(tmp_path / f"tiny-{qtype}.gguf", "tiny", qtype)
    again = make_gguf_llama.write(tmp_path / "again.gguf", "tiny", qtype)
    assert path.read_bytes() == again.read_bytes()  # deterministic
    out = convert(path, tmp_path / "tiny.ferry")
    manifest = json.loads((out / "manifest.json").read_text())
    stored = {t["dtype"] for t in manifest["tensors"] if len(t["shape"]) == 2}
    assert stored == formats  # the blocks kept, nothing widened
    with Engine(out, threads=2) as eng:
        s = eng.session(64)
        logits = s.eval([5, 6, 7, 8])
        assert logits.shape == (eng.info.vocab,) and np.isfinite(logits).all() and logits.std() > 0
        s.close()
