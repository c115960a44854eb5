"""Token embeddings read per token from trunk.bin instead of held in RAM
(FERRY_NO_EMBEDDING_READS keeps them resident): every family's output is
bit-identical either way, the resident trunk shrinks by the table (unless the
output head shares it), and a damaged table is still caught on open."""
from __future__ import annotations

import json

import numpy as np
import pytest

from app.convert.convert import convert
from app.engine.binding import Engine, FerryError, container_plan
from tests.kimi import tiny_k3, tiny_kimi
from tests.tiny_models import build

PROMPT, DECODE = 9, 4


def _logits(container, embedding_reads: bool) -> tuple[np.ndarray, int, int]:
    with Engine(container, threads=2, embedding_reads=embedding_reads) as engine:
        session = engine.session(64)
        rng = np.random.default_rng(2)
        tokens = [int(t) for t in rng.integers(3, 90, PROMPT + DECODE)]
        out = [session.eval(tokens[:PROMPT], all_logits=True)]
        out += [session.eval([t])[None] for t in tokens[PROMPT:]]
        session.close()
        return np.concatenate(out), engine.info.trunk_bytes, engine.plan(64).trunk_bytes


def _embedding(container) -> dict:
    m = json.loads((container / "manifest.json").read_text())
    return next(t for t in m["tensors"] if t["name"] == "token_embd")


def _span(t: dict) -> int:
    lo, hi = -(-t["offset"] // 64) * 64, (t["offset"] + t["nbytes"]) // 64 * 64
    return max(0, hi - lo)


def _build(kind: str, root):
    if kind == "k3":
        tiny_k3.build(root / "ckpt")
    elif kind in ("deepseek", "kimi_linear"):
        tiny_kimi.build(kind, root / "ckpt")
    else:
        build(kind, root / "ckpt")
    return root / "ckpt"


@pytest.mark.parametrize("kind,trunk", [("llama", "q4_0"), ("llama_tied_bias", "q8_0"), ("qwen3moe", "f32"),
                                        ("mixtral", "q8_0"), ("deepseek", "q4_0"), ("kimi_linear", "bf16"),
                                        ("k3", "f32"), ("k3", "q4_0")])
def test_output_is_bit_identical_and_the_table_leaves_ram(kind, trunk, tmp_path):
    ckpt = _build(kind, tmp_path)
    out = convert(ckpt, tmp_path / "m.ferry", trunk_format=trunk, expert_format="f32")
    on_disk, trunk_read, plan_read = _logits(out, True)
    resident, trunk_all, plan_all = _logits(out, False)
    assert np.array_equal(on_disk, resident), f"{kind}: embeddings read per token changed the output"
    tied = json.loads((out / "manifest.json").read_text())["model"]["tied_embeddings"]
    saved = 0 if tied else _span(_embedding(out))
    assert trunk_all == plan_all == (out / "trunk.bin").stat().st_size
    assert trunk_read == plan_read == trunk_all - saved
    assert container_plan(out, 64).trunk_bytes == trunk_all - saved   # what `ferry plan MODEL` reports
    if not tied:
        assert saved > 0.9 * _embedding(out)["nbytes"]


def test_a_damaged_row_of_the_table_on_disk_is_caught_on_open(tmp_path):
    ckpt = _build("llama", tmp_path)
    out = convert(ckpt, tmp_path / "m.ferry", trunk_format="q8_0")
    t = _embedding(out)
    with open(out / "trunk.bin", "r+b") as f:
        f.seek(t["offset"] + t["nbytes"] // 2)
        b = f.read(1)
        f.seek(t["offset"] + t["nbytes"] // 2)
        f.write(bytes([b[0] ^ 0x40]))
    for reads in (True, False):
        with pytest.raises(FerryError, match="token_embd"):
            Engine(out, threads=2, embedding_reads=reads)


def test_a_failed_row_read_fails_the_eval_and_leaves_the_session_usable(tmp_path):
    # trunk.bin cut short after open: the next token's row cannot be read; the
    # eval fails with an I/O error naming trunk.bin, nothing is evaluated (the
    # K3 recurrent state stays whole), and once the file is back the same
    # token gives the logits of an uninterrupted run.
    ckpt = _build("k3", tmp_path)
    out = convert(ckpt, tmp_path / "m.ferry", trunk_format="q8_0", expert_format="f32")
    want = _logits(out, True)[0]
    rng = np.random.default_rng(2)
    tokens = [int(t) for t in rng.integers(3, 90, PROMPT + DECODE)]
    data = (out / "trunk.bin").read_bytes()
    with Engine(out, threads=2) as engine:
        session = engine.session(64)
        got = [session.eval(tokens[:PROMPT], all_logits=True)]
        with open(out / "trunk.bin", "r+b") as f:
            f.truncate(0)
        with pytest.raises(FerryError, match="trunk.bin"):
            session.eval([tokens[PROMPT]])
        (out / "trunk.bin").write_bytes(data)
        got += [session.eval([t])[None] for t in tokens[PROMPT:]]
        session.close()
    assert np.array_equal(np.concatenate(got), want)
