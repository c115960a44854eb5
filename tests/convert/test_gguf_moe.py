"""Converting a mixture-of-experts GGUF, whose experts are stacked in 3-D
tensors (qwen3moe, written by bench/make_gguf_moe.py as llama.cpp stores
it): each expert is read on its own, never the whole stack again per expert
(issue 31: a 5.6 GB file took 3 min 40 s, nearly all of it copying stacks),
and the container is byte for byte what reading whole stacks and slicing
them wrote before."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from app.convert import errors, gguf_file
from app.convert.convert import convert
from app.convert.gguf_file import GGUFFile
from tests.conftest import REPO

sys.path.insert(0, str(REPO))
from bench import make_gguf_moe  # noqa: E402


def tree_bytes(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module", params=["q4_0", "q4_k_m"])
def moe_gguf(request, tmp_path_factory, demo_gguf) -> Path:
    """A tiny qwen3moe GGUF: 2 layers of 16 experts, rows of 256."""
    path = tmp_path_factory.mktemp(f"gguf_moe_{request.param}") / f"tiny-{request.param}.gguf"
    return make_gguf_moe.write(path, request.param, size="tiny")


def _whole_stack_slice(self: GGUFFile, name: str, index: int) -> np.ndarray:
    """How the converter read one expert before: the whole stacked tensor, then a slice of it."""
    raw = self.read_raw(name)
    per = raw.size // int(self.info(name).dims[-1])
    return raw[index * per:(index + 1) * per]


def test_same_container_as_whole_stack_reads(moe_gguf, tmp_path, monkeypatch):
    now = tree_bytes(convert(moe_gguf, tmp_path / "now.ferry"))
    with monkeypatch.context() as m:
        m.setattr(GGUFFile, "read_slice", _whole_stack_slice)
        before = tree_bytes(convert(moe_gguf, tmp_path / "before.ferry"))
    assert now.keys() == before.keys()
    assert [k for k in now if now[k] != before[k]] == []
    # and the experts are the GGUF's own blocks, where the format says
    g = GGUFFile(moe_gguf)
    manifest = json.loads(now["manifest.json"])
    bank = manifest["expert_banks"][1]
    rec = now[bank["file"]]
    for expert in (0, 7, bank["n_experts"] - 1):
        start = 4096 + expert * bank["record_size"]
        for part in ("gate", "up", "down"):
            info = g.info(f"blk.1.ffn_{part}_exps.weight")
            per = info.nbytes // bank["n_experts"]
            stored = rec[start + bank[part]["offset"]:start + bank[part]["offset"] + bank[part]["nbytes"]]
            assert stored == moe_gguf.read_bytes()[info.offset + expert * per:info.offset + (expert + 1) * per]


def test_reads_each_source_byte_once(moe_gguf, tmp_path, monkeypatch):
    read = []
    real = errors.read_file_range

    def counting(path, offset, nbytes):
        read.append(nbytes)
        return real(path, offset, nbytes)

    monkeypatch.setattr(errors, "read_file_range", counting)
    monkeypatch.setattr(gguf_file, "read_file_range", counting)
    convert(moe_gguf, tmp_path / "c.ferry")
    tensor_bytes = sum(t.nbytes for t in GGUFFile(moe_gguf).tensors.values())
    assert sum(read) == tensor_bytes  # (the old reader read each whole stack once per expert)


def test_read_slice_checks_the_index(moe_gguf):
    g = GGUFFile(moe_gguf)
    with pytest.raises(errors.SourceError, match="has 16 slices, no slice 16"):
        g.read_slice("blk.0.ffn_up_exps.weight", 16)
    assert g.read_slice("blk.0.ffn_up_exps.weight", 15).size == g.info("blk.0.ffn_up_exps.weight").nbytes // 16


def test_synthetic_moe_gguf_is_deterministic_and_runs(moe_gguf, tmp_path):
    from app.engine.binding import Engine

    qtype = moe_gguf.stem.split("-", 1)[1]
    again = make_gguf_moe.write(tmp_path / "again.gguf", qtype, size="tiny")
    assert again.read_bytes() == moe_gguf.read_bytes()
    g = GGUFFile(moe_gguf)
    assert g.metadata["general.architecture"] == "qwen3moe"
    assert g.info("blk.0.ffn_gate_exps.weight").dims == (256, 256, 16)   # ne0 = dim, ne1 = ffn, ne2 = experts
    types = {t.type_name for n, t in g.tensors.items() if "exps" in n}
    assert types == ({"Q4_0"} if qtype == "q4_0" else {"Q4_K", "Q6_K"})
    out = convert(moe_gguf, tmp_path / "tiny.ferry")
    with Engine(out, threads=2) as eng:
        assert eng.info.n_experts == 16
        s = eng.session(64)
        first = s.eval([5, 6, 7, 8])
        second = s.eval([9])
        assert np.isfinite(first).all() and first.std() > 0 and not np.allclose(first, second)
        s.close()
