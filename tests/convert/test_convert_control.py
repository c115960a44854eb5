"""Pausing, cancelling and resuming a conversion from another thread (the
wizard's controls), a disk that fills up in the middle of a bank, and a source
that stops reading: each stop keeps what was done, and the resumed run writes
the same bytes as an uninterrupted one."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
import time
from pathlib import Path

import pytest

from app.convert.convert import (SPACE_MARGIN, ConvertCancelled, ConvertControl, ConvertError, Progress, convert,
                                 partial_dir)
from bench.make_synthetic import make, parse


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory) -> Path:
    """About 80 MB of bf16 Qwen3-MoE checkpoint in 3 shards (6 banks of 32 records)."""
    out = tmp_path_factory.mktemp("synth_ctl") / "ckpt"
    return make(parse(["--out", str(out), "--layers", "6", "--experts", "32", "--shards", "3"]))


@pytest.fixture(scope="module")
def reference(synthetic, tmp_path_factory) -> dict[str, bytes]:
    return tree_bytes(convert(synthetic, tmp_path_factory.mktemp("ref") / "whole.ferry"))


def tree_bytes(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def journal(out: Path) -> dict:
    return json.loads((partial_dir(out) / "journal.json").read_text())


def in_bank(p: Progress, layer: int, records: int) -> bool:
    """True once `records` expert records of bank `layer` are written."""
    return p.stage.startswith(f"experts of layer {layer + 1} ") and p.stage.endswith(f": {records} of 32")


def test_progress_after_every_record_and_tensor_with_the_layer(synthetic, tmp_path):
    seen: list[Progress] = []
    convert(synthetic, tmp_path / "p.ferry", progress=seen.append)
    records = [p for p in seen if p.stage.startswith("experts of layer") and " of 32" in p.stage]
    assert len(records) == 6 * 32
    assert {p.layer for p in records} == set(range(6)) and all(p.n_layers == 6 for p in seen)
    trunk = [p for p in seen if p.stage.startswith("trunk layer 3 ")]
    assert len(trunk) > 5 and all(p.layer == 2 for p in trunk)   # one per tensor, then the segment
    done = [p.done_bytes for p in seen]
    assert done == sorted(done) and done[-1] == seen[-1].total_bytes
    assert seen[0].start_bytes == 0 and seen[-1].rate > 0


def test_pause_holds_then_resume_finishes_identically(synthetic, reference, tmp_path):
    out = tmp_path / "paused.ferry"
    ctl = ConvertControl()
    seen: list[Progress] = []
    paused = threading.Event()

    def progress(p: Progress) -> None:
        seen.append(p)
        if in_bank(p, 1, 5) and not ctl.paused and not paused.is_set():
            ctl.pause()           # what the Pause button does, at an exact point
        if p.paused:
            paused.set()

    result: list = []
    t = threading.Thread(target=lambda: result.append(convert(synthetic, out, progress=progress, control=ctl)))
    t.start()
    assert paused.wait(30)
    n = len(seen)
    time.sleep(0.4)
    assert len(seen) == n and t.is_alive(), "the conversion went on while paused"
    # While paused, the records written so far are synced and in the journal.
    assert journal(out)["partial"] == {"bank:1": 5}
    ctl.resume()
    t.join(60)
    assert result and tree_bytes(out) == reference


def test_cancel_mid_bank_keeps_the_journal_and_resumes_identically(synthetic, reference, tmp_path):
    out = tmp_path / "cancelled.ferry"
    ctl = ConvertControl()

    def progress(p: Progress) -> None:
        if in_bank(p, 2, 17):
            ctl.cancel()

    with pytest.raises(ConvertCancelled, match="resumes"):
        convert(synthetic, out, progress=progress, control=ctl)
    assert not out.exists()
    j = journal(out)
    assert {"bank:0", "bank:1"} <= set(j["done"]) and j["partial"] == {"bank:2": 17}
    seen: list[Progress] = []
    convert(synthetic, out, progress=seen.append)
    assert tree_bytes(out) == reference and not partial_dir(out).exists()
    # The resumed run started inside bank 2, after its 17 records.
    assert seen[0].start_bytes > 0 and seen[0].stage.startswith("experts of layer 3 ")
    assert seen[0].stage.endswith(": 18 of 32")


@pytest.fixture
def tmpfs(tmp_path):
    mounts = []

    def mount(size: int) -> Path:
        mnt = tmp_path / f"tmpfs{len(mounts)}"
        mnt.mkdir()
        res = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mnt)], capture_output=True)
        if res.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here (needs root): {res.stderr.decode().strip()}")
        mounts.append(mnt)
        return mnt

    yield mount
    for m in mounts:
        subprocess.run(["umount", str(m)], check=False)


def _fill(path: Path) -> None:
    """Write until the disk is full."""
    chunk = b"\xab" * (1 << 20)
    with open(path, "wb", buffering=0) as f:
        try:
            while True:
                f.write(chunk)
        except OSError:
            pass


def test_disk_full_mid_bank_stops_clearly_and_resumes_identically(synthetic, reference, tmp_path, tmpfs):
    total = sum(len(b) for b in reference.values())
    mnt = tmpfs(total + SPACE_MARGIN + (8 << 20))    # passes the up-front check
    out = mnt / "full.ferry"
    filler = mnt / "someone-else.bin"

    def progress(p: Progress) -> None:
        if in_bank(p, 3, 9) and not filler.exists():
            _fill(filler)      # another program fills the disk after the check

    with pytest.raises(ConvertError, match="disk filled up") as info:
        convert(synthetic, out, progress=progress)
    assert "what was finished is kept" in str(info.value) and "resume" in str(info.value)
    assert not out.exists() and (partial_dir(out) / "journal.json").exists()
    assert {"bank:0", "bank:1", "bank:2"} <= set(journal(out)["done"])
    filler.unlink()
    seen: list[Progress] = []
    convert(synthetic, out, progress=seen.append)
    assert tree_bytes(out) == reference
    assert seen[0].start_bytes >= sum(len(v) for k, v in reference.items() if k < "experts/layer_003")


def test_source_read_error_names_the_file_keeps_the_work_and_resumes(synthetic, reference, tmp_path):
    src = tmp_path / "copy" / synthetic.name    # the same name: the manifest records it
    shutil.copytree(synthetic, src)
    shard = src / "model-00003-of-00003.safetensors"
    saved = shard.read_bytes()
    st = shard.stat()
    out = tmp_path / "unreadable.ferry"

    def progress(p: Progress) -> None:
        if in_bank(p, 0, 3) and shard.stat().st_size == len(saved):
            with open(shard, "r+b") as f:       # the external disk went away, say
                f.truncate(len(saved) // 2)

    with pytest.raises(ConvertError, match="model-00003-of-00003.safetensors") as info:
        convert(src, out, progress=progress)
    assert "kept" in str(info.value)
    assert "trunk:-1" in journal(out)["done"]
    shard.write_bytes(saved)
    os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns))   # the same file back
    seen: list[Progress] = []
    convert(src, out, progress=seen.append)
    assert tree_bytes(out) == reference and seen[0].start_bytes > 0
