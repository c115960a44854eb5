"""``ferry convert``: a source checkpoint into a Ferry container.

The conversion streams one tensor at a time, writes into ``OUT.partial`` next
to the destination, records each finished unit (a trunk segment, an expert
bank) in a journal, and publishes by renaming the finished directory to OUT.
Killed at any point, running it again resumes after the last finished unit
and produces the same bytes as an uninterrupted run.
"""
from __future__ import annotations

import errno
import json
import os
import shutil
import struct
import time
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from app.convert import tokenizer_files
from app.convert.errors import SourceError
from app.convert.layout import (BANK_HEADER_BYTES, FORMAT_CODES, FORMAT_VERSION, RECORD_HEADER_BYTES,
                                BankLayout, Layout, encode, plan_layout)
from app.convert.sources import Source, open_source

JOURNAL = "journal.json"
#: Room kept free beyond the container itself, for the manifest and tokenizer.
SPACE_MARGIN = 16 << 20


@dataclass
class Progress:
    """What a progress callback receives."""

    done_bytes: int
    total_bytes: int
    stage: str          #: e.g. "trunk layer 3 of 30" or "experts of layer 5"
    elapsed: float      #: seconds since this run started


ProgressFn = Callable[[Progress], None]


class ConvertError(RuntimeError):
    """A conversion that cannot go on; the message says why and what to do."""


def partial_dir(out: Path) -> Path:
    return out.with_name(out.name + ".partial")


# --------------------------------------------------------------- journal

class Journal:
    """The finished units of one conversion, stored atomically beside its output."""

    def __init__(self, root: Path, digest: str):
        self.path = root / JOURNAL
        self.digest = digest
        self.done: list[str] = []
        if self.path.exists():
            try:
                data = json.loads(self.path.read_text())
            except ValueError:
                data = {}
            if data.get("digest") == digest:
                self.done = list(data.get("done", []))

    def has(self, unit: str) -> bool:
        return unit in self.done

    def mark(self, unit: str) -> None:
        self.done.append(unit)
        tmp = self.path.with_suffix(".tmp")
        with open(tmp, "w") as f:
            json.dump({"digest": self.digest, "done": self.done}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)


# --------------------------------------------------------------- records

def bank_header(b: BankLayout) -> bytes:
    """The 4 KiB header of an expert bank file (see docs/FORMAT.md)."""
    p = [b.parts[k] for k in ("gate", "up", "down")]
    head = b"FERRYBNK" + struct.pack("<IIIIQQI", FORMAT_VERSION, b.layer, b.n_experts, RECORD_HEADER_BYTES,
                                     b.record_size, BANK_HEADER_BYTES, b.payload_size)
    head += bytes([FORMAT_CODES[x["dtype"]] for x in p]) + b"\0"
    head += struct.pack("<3I", *[x["shape"][0] for x in p]) + struct.pack("<3I", *[x["shape"][1] for x in p])
    head += struct.pack("<3I", *[x["offset"] for x in p]) + struct.pack("<3I", *[x["nbytes"] for x in p])
    assert len(head) == 96
    head += struct.pack("<I", zlib.crc32(head))
    return head.ljust(BANK_HEADER_BYTES, b"\0")


def expert_record(b: BankLayout, expert: int, payloads: dict[str, np.ndarray]) -> bytes:
    """One expert's record: 64-byte header, gate/up/down at their offsets, padded."""
    rec = bytearray(b.record_size)
    for part, info in b.parts.items():
        data = payloads[part]
        if data.size != info["nbytes"]:
            raise SourceError(part, f"expert {expert} of layer {b.layer} has {data.size} bytes, "
                                    f"expected {info['nbytes']}")
        rec[info["offset"]:info["offset"] + info["nbytes"]] = data.tobytes()
    payload = bytes(rec[RECORD_HEADER_BYTES:RECORD_HEADER_BYTES + b.payload_size])
    p = [b.parts[k] for k in ("gate", "up", "down")]
    head = b"FXPR" + struct.pack("<HHII", FORMAT_VERSION, RECORD_HEADER_BYTES, b.layer, expert)
    head += bytes([FORMAT_CODES[x["dtype"]] for x in p]) + b"\0"
    head += struct.pack("<III", p[2]["shape"][0], p[0]["shape"][0], b.payload_size)
    head += struct.pack("<3I", *[x["offset"] for x in p]) + struct.pack("<3I", *[x["nbytes"] for x in p])
    head += struct.pack("<II", zlib.crc32(payload), 0)
    assert len(head) == RECORD_HEADER_BYTES
    rec[:RECORD_HEADER_BYTES] = head
    return bytes(rec)


# --------------------------------------------------------------- writing

class _Writer:
    def __init__(self, src: Source, layout: Layout, root: Path, progress: ProgressFn | None):
        self.src, self.layout, self.root, self.progress = src, layout, root, progress
        self.journal = Journal(root, layout.digest(src.identity()))
        self.done_bytes = 0
        self.t0 = time.monotonic()
        self.crcs: dict[str, int] = {}

    def report(self, stage: str) -> None:
        if self.progress:
            self.progress(Progress(self.done_bytes, self.layout.total_bytes(), stage, time.monotonic() - self.t0))

    def run(self) -> None:
        self.write_trunk()
        for bank in self.layout.banks:
            self.write_bank(bank)

    def write_trunk(self) -> None:
        lay = self.layout
        path = self.root / "trunk.bin"
        segments = sorted({t.layer for t in lay.trunk})
        # Resume: keep the finished segments, cut off whatever came after them.
        keep = 0
        for i, seg in enumerate(segments):
            if self.journal.has(f"trunk:{seg}"):
                keep = lay.segment_ends[i]
        mode = "r+b" if path.exists() else "wb"
        with open(path, mode) as f:
            f.truncate(keep)
            self.done_bytes = keep
            for i, seg in enumerate(segments):
                entries = [t for t in lay.trunk if t.layer == seg]
                if self.journal.has(f"trunk:{seg}"):
                    for t in entries:  # CRCs are recomputed from what is on disk
                        f.seek(t.offset)
                        self.crcs[t.name] = zlib.crc32(f.read(t.nbytes))
                    continue
                for t in entries:
                    data = encode(self.src, t.source, t.fmt)
                    if data.size != t.nbytes:
                        raise SourceError(t.source, f"encodes to {data.size} bytes, expected {t.nbytes}")
                    f.seek(t.offset)
                    f.write(data.tobytes())
                    self.crcs[t.name] = zlib.crc32(data.tobytes())
                f.truncate(lay.segment_ends[i])
                f.flush()
                os.fsync(f.fileno())
                self.done_bytes = lay.segment_ends[i]
                self.journal.mark(f"trunk:{seg}")
                self.report(self._segment_name(seg))

    def _segment_name(self, seg: int) -> str:
        n = self.layout.model["n_layers"]
        if seg < 0:
            return "trunk: embeddings"
        if seg >= n:
            return "trunk: output head"
        return f"trunk layer {seg + 1} of {n}"

    def write_bank(self, bank: BankLayout) -> None:
        unit = f"bank:{bank.layer}"
        final = self.root / bank.file
        if self.journal.has(unit) and final.exists():
            self.done_bytes += bank.file_size
            return
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = final.with_suffix(".tmp")
        experts = self.src.spec.experts[bank.layer]
        with open(tmp, "wb") as f:
            f.write(bank_header(bank))
            for e, parts in enumerate(experts):
                payloads = {p: encode(self.src, parts[p], bank.parts[p]["dtype"]) for p in parts}
                f.write(expert_record(bank, e, payloads))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, final)
        self.done_bytes += bank.file_size
        self.journal.mark(unit)
        self.report(f"experts of layer {bank.layer + 1} of {self.layout.model['n_layers']}")


# --------------------------------------------------------------- manifest

def manifest(src: Source, layout: Layout, crcs: dict[str, int], tokenizer: dict) -> dict:
    return {
        "format": "ferry",
        "version": FORMAT_VERSION,
        "model": layout.model,
        "source": {"kind": src.kind, "name": src.path.name, "config": src.config},
        "conversion": layout.options,
        "tokenizer": tokenizer,
        "files": [{"name": "trunk.bin", "size": layout.trunk_size}]
                 + [{"name": b.file, "size": b.file_size} for b in layout.banks],
        "tensors": [{"name": t.name, "file": "trunk.bin", "dtype": t.fmt, "shape": list(t.shape),
                     "offset": t.offset, "nbytes": t.nbytes, "crc32": crcs[t.name]} for t in layout.trunk],
        "expert_banks": [{"layer": b.layer, "file": b.file, "n_experts": b.n_experts,
                          "record_size": b.record_size, "payload_size": b.payload_size, **b.parts}
                         for b in layout.banks],
    }


def _json_safe(value):
    """GGUF metadata may hold bytes or numpy scalars; the manifest needs JSON."""
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, np.generic):
        return value.item()
    return value


def _write_file(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


# --------------------------------------------------------------- entry point

def check_space(out: Path, needed: int) -> None:
    """Refuse, before writing, a destination that cannot hold the container."""
    probe = out.parent
    usage = shutil.disk_usage(probe)
    if usage.free < needed + SPACE_MARGIN:
        raise ConvertError(
            f"not enough free space in {probe}: the container needs {_gib(needed + SPACE_MARGIN)} more, "
            f"the disk has {_gib(usage.free)} free. Choose another destination or free some space.")


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def _already_written(root: Path) -> int:
    if not root.exists():
        return 0
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


def convert(source: str | os.PathLike, out: str | os.PathLike, *, trunk_format: str = "auto",
            expert_format: str = "auto", progress: ProgressFn | None = None) -> Path:
    """Convert ``source`` into the container directory ``out`` and return its path."""
    out = Path(out).absolute()
    if out.exists():
        raise ConvertError(f"{out} already exists; remove it or choose another name")
    if not out.parent.is_dir():
        raise ConvertError(f"the destination folder {out.parent} does not exist")
    src = open_source(source)
    layout = plan_layout(src, trunk_format, expert_format)
    if src.kind == "hf":
        tok_section, tok_files = tokenizer_files.from_hf(src.path, src.config)
    else:
        tok_section, tok_files = tokenizer_files.from_gguf(src.gguf.metadata, src.path.name)
    root = partial_dir(out)
    check_space(out, layout.total_bytes() - _already_written(root))
    root.mkdir(exist_ok=True)
    writer = _Writer(src, layout, root, progress)
    try:
        writer.run()
        for name, data in tok_files.items():
            _write_file(root / name, data)
        doc = _json_safe(manifest(src, layout, writer.crcs, tok_section))
        _write_file(root / "manifest.json", json.dumps(doc, indent=1, sort_keys=False).encode("utf-8"))
    except OSError as exc:
        if exc.errno == errno.ENOSPC:
            raise ConvertError(
                f"the disk filled up while writing {root}; what was finished is kept. Free some space and "
                f"run the same conversion again to resume.") from exc
        raise ConvertError(f"writing {root} failed: {exc}; run the same conversion again to resume") from exc
    (root / JOURNAL).unlink()
    os.rename(root, out)
    writer.report("done")
    return out
