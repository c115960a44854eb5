"""The fast q3_nl conversion: bf16 and MXFP4 (compressed-tensors, as in Kimi
K3) source bytes go straight into the C quantizer, and expert records are
encoded on several threads. Neither may change a byte of the container: the
fast path against the float32 path, several encoder threads against one, and
a cancelled parallel run resumed."""
from __future__ import annotations

import mmap
import threading
from pathlib import Path

import numpy as np
import pytest

from app.convert import compressed, layout, quant, quant3
from app.convert.convert import ConvertCancelled, ConvertControl, Progress, _Prefetch, convert
from app.convert.errors import SourceError
from app.convert.sources import Source
from bench.make_synthetic import make, parse


def tree_bytes(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module", params=["bf16", "mxfp4"])
def checkpoint(request, tmp_path_factory) -> tuple[str, Path]:
    """A Qwen3-MoE checkpoint whose experts are bf16 or MXFP4 (3 layers of 12 experts, rows of 256)."""
    out = tmp_path_factory.mktemp(f"synth_{request.param}") / "ckpt"
    return request.param, make(parse(["--out", str(out), "--layers", "3", "--experts", "12", "--shards", "2",
                                      "--expert-dtype", request.param]))


@pytest.fixture(scope="module")
def f32_path_reference(checkpoint, tmp_path_factory) -> dict[str, bytes]:
    """The container as the converter wrote it before the fast path: float32 values, one encoder."""
    saved = layout.NATIVE_Q3
    layout.NATIVE_Q3 = False
    try:
        out = convert(checkpoint[1], tmp_path_factory.mktemp("ref") / "f32.ferry", expert_format="q3_nl",
                      threads=1)
    finally:
        layout.NATIVE_Q3 = saved
    return tree_bytes(out)


def test_fast_path_and_threads_write_the_bytes_of_the_f32_path(checkpoint, f32_path_reference, tmp_path,
                                                               monkeypatch):
    kind, ckpt = checkpoint
    calls = {"bf16": 0, "mxfp4": 0, "f32": 0}
    quantize, quantize_mxfp4 = quant3.quantize, quant3.quantize_mxfp4

    def spy(values, *a, **k):
        calls["bf16" if values.dtype == np.uint16 else "f32"] += 1
        return quantize(values, *a, **k)

    def spy_mx(*a, **k):
        calls["mxfp4"] += 1
        return quantize_mxfp4(*a, **k)

    monkeypatch.setattr(quant3, "quantize", spy)
    monkeypatch.setattr(quant3, "quantize_mxfp4", spy_mx)
    out = convert(ckpt, tmp_path / "fast.ferry", expert_format="q3_nl", threads=3)
    assert calls[kind] == 3 * 12 * 3 and calls["f32"] == 0, calls   # every expert matrix took the fast path
    assert tree_bytes(out) == f32_path_reference
    # one encoder thread, rows split over two: the same bytes again
    monkeypatch.setattr("app.convert.convert.ROW_THREADS", 2)
    assert tree_bytes(convert(ckpt, tmp_path / "one.ferry", expert_format="q3_nl", threads=1)) == f32_path_reference


def test_cancelled_parallel_run_resumes_to_the_same_bytes(checkpoint, f32_path_reference, tmp_path):
    ctl = ConvertControl()

    def progress(p: Progress) -> None:
        if p.stage == "experts of layer 2 of 3: 7 of 12":
            ctl.cancel()

    out = tmp_path / "cancelled.ferry"
    with pytest.raises(ConvertCancelled):
        convert(checkpoint[1], out, expert_format="q3_nl", progress=progress, control=ctl, threads=4)
    seen: list[Progress] = []
    convert(checkpoint[1], out, expert_format="q3_nl", progress=seen.append, threads=4)
    assert seen[0].start_bytes > 0 and tree_bytes(out) == f32_path_reference


class _Tensors(Source):
    """A source of named MXFP4 or bf16 matrices held in memory."""

    kind = "test"

    def __init__(self, mx: dict, bf: dict):
        self.mx, self.bf = mx, bf

    def shape(self, name):
        if name in self.mx:
            return (self.mx[name][0].shape[0], self.mx[name][0].shape[1] * 2)
        return self.bf[name].shape

    def stored_format(self, name):
        return compressed.MXFP4 if name in self.mx else "bf16"

    def read_raw(self, name):
        return self.bf[name].view(np.uint8).reshape(-1)

    def read_f32(self, name):
        if name in self.mx:
            return compressed.decode_mxfp4(*self.mx[name])
        return quant.bf16_bits_to_f32(self.bf[name])

    def q3_input(self, name):
        return ("mxfp4", *self.mx[name]) if name in self.mx else super().q3_input(name)


def _encode_both(src: Source, name: str):
    """encode() through the fast path, then through float32: (bytes or the error's message) each."""
    got = []
    for native in (True, False):
        layout.NATIVE_Q3 = native
        try:
            with np.errstate(over="ignore"):
                got.append(layout.encode(src, name, quant3.NAME, threads=1).tobytes())
        except SourceError as exc:
            got.append(str(exc))
        finally:
            layout.NATIVE_Q3 = True
    return got


def test_edge_values_give_the_same_bytes_or_the_same_error():
    """Every nibble (-0 too), E8M0 scales from 0 (2^-127, subnormal values) to 254 (overflow), NaN
    scales (255), and bf16 NaN / inf / subnormals: the fast path agrees with the float32 path."""
    rng = np.random.default_rng(11)
    rows, cols = 24, 512
    packed = rng.integers(0, 256, (rows, cols // 2), dtype=np.uint8)
    packed[0, :16] = np.arange(256, dtype=np.uint8)[::16] + np.arange(16, dtype=np.uint8)  # all 16 pairs
    packed[1] = 0x88                                                                      # -0 everywhere
    scales = rng.integers(100, 140, (rows, cols // 32), dtype=np.uint8)
    for r, s in enumerate((0, 1, 2, 3, 20, 60, 180, 230, 250, 253), start=2):
        scales[r] = s
    scales[13, ::2] = 0                       # neighbouring blocks 2^127 apart
    scales[14, 3] = 254
    scales[15, 5] = 255                       # NaN
    bits = rng.integers(0, 1 << 16, (rows, cols), dtype=np.uint16)
    bits = np.where((bits & 0x7F80) == 0x7F80, bits & 0x807F, bits).astype(np.uint16)   # finite
    bits[3] &= 0x807F                          # subnormals and zeros
    mx = {f"m{r}": (packed[r:r + 1].copy(), scales[r:r + 1].copy()) for r in range(rows)}
    mx["all"] = (packed[:13], scales[:13])
    bf = {"b": bits, "nan": bits.copy(), "inf": bits.copy()}
    bf["nan"][2, 7] = 0x7FC1
    bf["inf"][5, 9] = 0xFF80
    src = _Tensors(mx, bf)
    refused = set()
    for name in [*mx, *bf]:
        fast, slow = _encode_both(src, name)
        assert fast == slow, name
        if isinstance(fast, str):
            assert "non-finite" in fast
            refused.add(name)
    # 4 or 6 times 2^126 (scale 253) and 2^127 (254) overflow to inf, 255 is NaN; "all" holds m11
    assert refused == {"m11", "m14", "m15", "all", "nan", "inf"}


def test_records_come_in_order_and_an_error_after_the_records_before_it():
    seen = []

    def make(item: int, buf) -> None:
        if item == 9:
            raise SourceError("x", "unreadable")
        buf[:8] = item.to_bytes(8, "little")
        seen.append(threading.current_thread().name)

    ahead = _Prefetch(make, range(3, 20), mmap.PAGESIZE, threads=4)
    try:
        for e in range(3, 9):
            buf = ahead.next(e)
            assert int.from_bytes(buf[:8], "little") == e
            ahead.give_back(buf)
        with pytest.raises(SourceError, match="unreadable"):
            ahead.next(9)
    finally:
        ahead.close()
    assert len(ahead.threads) == 4 and not any(t.is_alive() for t in ahead.threads)
