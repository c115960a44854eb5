"""``ferry convert``: a source checkpoint into a Ferry container.

The conversion streams the source (trunk tensors one at a time; expert records
read and encoded on one thread per core, written in order), writes into
``OUT.partial`` next to the destination, records each finished unit (a trunk
segment, an expert bank) in a journal, and publishes by renaming the finished
directory to OUT.
Killed at any point, running it again resumes after the last finished unit
and produces the same bytes as an uninterrupted run.

A GUI drives a conversion through a :class:`ConvertControl` (pause, resume,
cancel from any thread; checked before every expert record and every trunk
tensor). A cancelled run raises :class:`ConvertCancelled` and keeps its
journal, so the next run resumes; so does a disk that fills up mid-write
(:class:`ConvertError`). Inside a bank, the records written so far are
synced and noted in the journal every ``SYNC_EVERY`` bytes and whenever the
run pauses or stops, so a resume does not redo a whole bank.
"""
from __future__ import annotations

import errno
import collections
import json
import mmap
import os
import queue
import shutil
import struct
import threading
import time
import zlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from app.store.private import private_dir
from app.units import size
from app.convert import tokenizer_files
from app.convert.errors import SourceError
from app.convert.layout import (BANK_HEADER_BYTES, FORMAT_CODES, FORMAT_VERSION, RECORD_HEADER_BYTES,
                                BankLayout, Layout, encode, plan_layout)
from app.convert.quant3 import NAME as Q3
from app.convert.quant3 import default_threads  # noqa: F401  (bench/convert.py takes it from here)
from app.convert.sources import Source, open_source

JOURNAL = "journal.json"
#: Room kept free beyond the container itself, for the manifest and tokenizer.
SPACE_MARGIN = 16 << 20
#: Inside a bank, sync the records written and note them in the journal this often.
SYNC_EVERY = 1 << 30
#: Expert records read and encoded ahead of the one being written.
PREFETCH = 3
#: Expert records being written at once (a queue depth of 2 keeps an SSD busy).
WRITERS = 2
#: Threads each expert record's encoder splits a tensor's rows over (records
#: are encoded in parallel already: see convert(threads=)).
ROW_THREADS = 1


@dataclass
class Progress:
    """What a progress callback receives: after every trunk tensor and every
    expert record, and when the run pauses."""

    done_bytes: int
    total_bytes: int
    stage: str          #: e.g. "trunk layer 3 of 30" or "experts of layer 5 of 30: 120 of 896"
    elapsed: float      #: seconds since this run started
    layer: int | None = None    #: the layer being written (0-based); None for the embeddings and the head
    n_layers: int = 0
    start_bytes: int = 0        #: what was already done when this run started (a resume)
    paused: bool = False

    @property
    def rate(self) -> float:
        """Bytes per second written by this run."""
        return (self.done_bytes - self.start_bytes) / self.elapsed if self.elapsed > 0 else 0.0


ProgressFn = Callable[[Progress], None]


class ConvertError(RuntimeError):
    """A conversion that cannot go on; the message says why and what to do."""


class ConvertCancelled(ConvertError):
    """The run was cancelled through its :class:`ConvertControl`; what was
    written is kept and the same conversion resumes from there."""


class ConvertControl:
    """Pause, resume or cancel a running conversion from another thread (a GUI).

    The converter calls :meth:`checkpoint` before every expert record and
    every trunk tensor: it blocks while paused and raises ConvertCancelled
    once cancelled."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._paused = False
        self._cancelled = False

    def pause(self) -> None:
        with self._cond:
            self._paused = True

    def resume(self) -> None:
        with self._cond:
            self._paused = False
            self._cond.notify_all()

    def cancel(self) -> None:
        with self._cond:
            self._cancelled = True
            self._cond.notify_all()

    @property
    def paused(self) -> bool:
        return self._paused and not self._cancelled

    @property
    def cancelled(self) -> bool:
        return self._cancelled

    def checkpoint(self, on_hold: Callable[[], None] | None = None) -> None:
        """Return at once when running; wait while paused; raise when cancelled.
        ``on_hold`` runs (once, unlocked) before waiting or raising, to make the
        work so far durable."""
        if not (self._paused or self._cancelled):
            return
        if on_hold is not None:
            on_hold()
        with self._cond:
            while self._paused and not self._cancelled:
                self._cond.wait()
            if self._cancelled:
                raise ConvertCancelled("the conversion was cancelled; what was converted is kept, and running "
                                       "the same conversion again resumes from there")


def partial_dir(out: Path) -> Path:
    return out.with_name(out.name + ".partial")


# --------------------------------------------------------------- journal

class Journal:
    """The finished units of one conversion, stored atomically beside its output."""

    def __init__(self, root: Path, digest: str):
        self.path = root / JOURNAL
        self.digest = digest
        self.done: list[str] = []
        #: unit -> records of that bank already synced in its .tmp file
        self.partial: dict[str, int] = {}
        if self.path.exists():
            try:
                data = json.loads(self.path.read_text())
            except ValueError:
                data = {}
            if isinstance(data, dict) and data.get("digest") == digest:
                self.done = list(data.get("done", []))
                partial = data.get("partial") or {}
                if isinstance(partial, dict):
                    self.partial = {str(k): int(v) for k, v in partial.items() if isinstance(v, int) and v >= 0}

    def has(self, unit: str) -> bool:
        return unit in self.done

    def mark(self, unit: str) -> None:
        self.done.append(unit)
        self.partial.pop(unit, None)
        self._save()

    def mark_partial(self, unit: str, records: int) -> None:
        self.partial[unit] = records
        self._save()

    def _save(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        doc = {"digest": self.digest, "done": self.done}
        if self.partial:
            doc["partial"] = self.partial
        with open(tmp, "w") as f:
            json.dump(doc, f)
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
    return bytes(_record_into(bytearray(b.record_size), b, expert, payloads))


def _record_into(rec, b: BankLayout, expert: int, payloads: dict[str, np.ndarray]) -> bytearray:
    """expert_record() built in ``rec`` (record_size bytes, reused between
    records: every byte is rewritten, the padding zeroed)."""
    view = memoryview(rec)
    end = RECORD_HEADER_BYTES
    for part in sorted(b.parts, key=lambda k: b.parts[k]["offset"]):
        info = b.parts[part]
        data = payloads[part]
        if data.size != info["nbytes"]:
            raise SourceError(part, f"expert {expert} of layer {b.layer} has {data.size} bytes, "
                                    f"expected {info['nbytes']}")
        if info["offset"] > end:
            view[end:info["offset"]] = bytes(info["offset"] - end)
        if not _is_at(data, rec, info["offset"]):    # (encoded in place: nothing to copy)
            view[info["offset"]:info["offset"] + info["nbytes"]] = memoryview(np.ascontiguousarray(data)).cast("B")
        end = info["offset"] + info["nbytes"]
    if end < b.record_size:
        view[end:] = bytes(b.record_size - end)
    crc = zlib.crc32(view[RECORD_HEADER_BYTES:RECORD_HEADER_BYTES + b.payload_size])
    p = [b.parts[k] for k in ("gate", "up", "down")]
    head = b"FXPR" + struct.pack("<HHII", FORMAT_VERSION, RECORD_HEADER_BYTES, b.layer, expert)
    head += bytes([FORMAT_CODES[x["dtype"]] for x in p]) + b"\0"
    head += struct.pack("<III", p[2]["shape"][0], p[0]["shape"][0], b.payload_size)
    head += struct.pack("<3I", *[x["offset"] for x in p]) + struct.pack("<3I", *[x["nbytes"] for x in p])
    head += struct.pack("<II", crc, 0)
    assert len(head) == RECORD_HEADER_BYTES
    view[:RECORD_HEADER_BYTES] = head
    return rec


def _is_at(data: np.ndarray, rec, offset: int) -> bool:
    """True when ``data`` already is rec[offset:offset + data.size]."""
    if not isinstance(rec, mmap.mmap) or not data.flags.c_contiguous:
        return False
    return np.frombuffer(rec, np.uint8, count=1, offset=offset).ctypes.data == data.ctypes.data


def _part_view(rec, info: dict) -> np.ndarray:
    """Record bytes of one part, for an encoder to write into."""
    return np.frombuffer(rec, np.uint8, count=info["nbytes"], offset=info["offset"])


# --------------------------------------------------------------- writing

def _pwrite_all(fd: int, data, offset: int) -> None:
    view = memoryview(data).cast("B")
    while view:
        n = os.pwrite(fd, view, offset)
        if n <= 0:  # pragma: no cover - pwrite raises rather than returning 0
            raise OSError(errno.EIO, "short write")
        view, offset = view[n:], offset + n


def _open_direct(path: Path) -> int | None:
    """A second descriptor on ``path`` that bypasses the page cache (O_DIRECT on
    Linux, F_NOCACHE on macOS), or None where the filesystem refuses it. Bank
    records are 4 KiB multiples at 4 KiB offsets, as direct I/O needs; the
    writes then neither wait on the kernel's dirty-page throttling nor push the
    rest of the machine out of RAM."""
    if os.environ.get("FERRY_NO_DIRECT_IO"):
        return None
    flag = getattr(os, "O_DIRECT", 0)
    try:
        fd = os.open(path, os.O_WRONLY | flag)
    except OSError:
        return None
    if not flag:
        try:
            import fcntl
            fcntl.fcntl(fd, getattr(fcntl, "F_NOCACHE", 48), 1)
        except (ImportError, OSError):
            os.close(fd)
            return None
    return fd


class _RecordWriter:
    """Writes whole records at 4 KiB-aligned offsets through direct I/O when the
    filesystem allows it, buffered otherwise (same bytes either way)."""

    def __init__(self, fd: int, path: Path):
        self.fd = fd
        self.direct = _open_direct(path)
        self.lock = threading.Lock()

    def write(self, buf, offset: int) -> None:
        direct = self.direct
        if direct is not None:
            try:
                _pwrite_all(direct, buf, offset)
                return
            except OSError as exc:
                if exc.errno != errno.EINVAL:
                    raise
                with self.lock:   # refused after all: buffered from now on
                    if self.direct is not None:
                        os.close(self.direct)
                        self.direct = None
        _pwrite_all(self.fd, buf, offset)

    def close(self) -> None:
        if self.direct is not None:
            os.close(self.direct)
            self.direct = None


class _Prefetch:
    """Reads and encodes records on ``threads`` threads into page-aligned
    buffers that the writer hands back, and gives them to the writer in order
    (the source is read and encoded while the previous records are written).
    Each thread takes a free buffer, then the next record: at most ``threads +
    PREFETCH + WRITERS`` buffers exist, so memory stays bounded however far the
    encoders could run ahead, and the record the writer waits for is always
    held by a thread that is working on it."""

    def __init__(self, make: Callable[[int, mmap.mmap], None], items: range, size: int, threads: int = 1):
        self.free: queue.Queue = queue.Queue()
        for _ in range(threads + PREFETCH + WRITERS):
            self.free.put(mmap.mmap(-1, size))
        self.items = iter(items)
        self.lock = threading.Lock()
        self.cond = threading.Condition()
        self.finished: dict[int, tuple] = {}
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._run, args=(make,), name=f"ferry-convert-encode-{i}",
                                         daemon=True) for i in range(threads)]
        for t in self.threads:
            t.start()

    def _run(self, make) -> None:
        while True:
            buf = self.free.get()
            if self.stop.is_set():
                return
            with self.lock:
                item = next(self.items, None)
            if item is None:
                self.free.put(buf)
                return
            exc = None
            try:
                make(item, buf)
            except BaseException as e:   # handed to the writer, raised there in order
                exc = e
                self.stop.set()          # no new records; those before this one finish
            with self.cond:
                self.finished[item] = (buf, exc)
                self.cond.notify_all()
            if exc is not None:
                return

    def next(self, item: int) -> mmap.mmap:
        """Record ``item``'s buffer, once encoded (records come in order)."""
        with self.cond:
            while item not in self.finished:
                self.cond.wait()
            buf, exc = self.finished.pop(item)
        if exc is not None:
            raise exc
        return buf

    def give_back(self, buf: mmap.mmap) -> None:
        self.free.put(buf)

    def close(self) -> None:
        self.stop.set()
        for _ in self.threads:
            self.free.put(mmap.mmap(-1, 1))   # wakes a thread waiting for a buffer
        for t in self.threads:
            t.join()


class _Writer:
    def __init__(self, src: Source, layout: Layout, root: Path, progress: ProgressFn | None,
                 control: ConvertControl | None = None, threads: int | None = None,
                 unit_done: Callable[[str], None] | None = None):
        self.src, self.layout, self.root, self.progress = src, layout, root, progress
        self.threads = max(1, threads or default_threads())
        self.row_threads = ROW_THREADS
        self.control = control or ConvertControl()
        self.unit_done = unit_done
        self.journal = Journal(root, layout.digest(src.identity()))
        self.trunk_bytes = 0                        #: trunk.bin written so far
        self.bank_bytes: dict[int, int] = {}        #: layer -> its bank file's bytes written so far
        self.start_bytes = 0
        self.t0 = time.monotonic()
        self.crcs: dict[str, int] = {}
        self.n_layers = int(layout.model["n_layers"])

    @property
    def done_bytes(self) -> int:
        return self.trunk_bytes + sum(self.bank_bytes.values())

    def report(self, stage: str, layer: int | None = None, paused: bool = False) -> None:
        if self.progress:
            self.progress(Progress(self.done_bytes, self.layout.total_bytes(), stage, time.monotonic() - self.t0,
                                   layer=layer, n_layers=self.n_layers, start_bytes=self.start_bytes,
                                   paused=paused))

    def hold(self, stage: str, layer: int | None, sync: Callable[[], None] | None = None) -> Callable[[], None]:
        """What to do when the control pauses or cancels: make the work durable, say so."""
        def on_hold() -> None:
            if sync is not None:
                sync()
            if self.control.paused:
                self.report(f"paused: {stage}", layer, paused=True)
        return on_hold

    def finished(self, unit: str) -> None:
        """``unit`` is in the container (written now or by an earlier run)."""
        if self.unit_done is not None:
            self.unit_done(unit)

    def resumed_bytes(self) -> int:
        """What earlier runs finished, as this run will count it."""
        lay = self.layout
        segments = sorted({t.layer for t in lay.trunk})
        done = 0
        for i, seg in enumerate(segments):
            if self.journal.has(f"trunk:{seg}"):
                done = lay.segment_ends[i]
        for b in lay.banks:
            unit, final = f"bank:{b.layer}", self.root / b.file
            if self.journal.has(unit) and final.exists():
                done += b.file_size
            elif self.journal.partial.get(unit) and final.with_suffix(".tmp").exists():
                done += BANK_HEADER_BYTES + min(self.journal.partial[unit], b.n_experts) * b.record_size
        return done

    def run(self) -> None:
        """Layer by layer: the trunk segment of a layer, then its expert bank
        (the bytes do not depend on the order; this one reads a sharded
        source shard after shard, so `ferry get` can convert each shard as
        it arrives and delete it once its layers are written)."""
        self.start_bytes = self.resumed_bytes()
        lay = self.layout
        banks = {b.layer: b for b in lay.banks}
        segments = sorted({t.layer for t in lay.trunk})
        fd = os.open(self.root / "trunk.bin", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            # Resume: keep the finished segments, cut off whatever came after them.
            keep = 0
            for i, seg in enumerate(segments):
                if self.journal.has(f"trunk:{seg}"):
                    keep = lay.segment_ends[i]
            os.ftruncate(fd, keep)
            self.trunk_bytes = keep
            for i, seg in enumerate(segments):
                self.write_segment(fd, i, seg)
                if seg in banks:
                    self.write_bank(banks.pop(seg))
        finally:
            os.close(fd)
        for bank in banks.values():      # (a bank without a trunk segment: none today)
            self.write_bank(bank)

    def write_segment(self, fd: int, i: int, seg: int) -> None:
        lay = self.layout
        entries = [t for t in lay.trunk if t.layer == seg]
        if self.journal.has(f"trunk:{seg}"):
            for t in entries:  # CRCs are recomputed from what is on disk
                self.crcs[t.name] = zlib.crc32(os.pread(fd, t.nbytes, t.offset)) if t.nbytes else 0
            self.finished(f"trunk:{seg}")
            return
        layer = seg if 0 <= seg < self.n_layers else None
        stage = self._segment_name(seg)
        for t in entries:
            self.control.checkpoint(self.hold(stage, layer))
            data = encode(self.src, t.source, t.fmt)
            if data.size != t.nbytes:
                raise SourceError(t.source, f"encodes to {data.size} bytes, expected {t.nbytes}")
            _pwrite_all(fd, data, t.offset)
            self.crcs[t.name] = zlib.crc32(data)
            self.trunk_bytes = t.offset + t.nbytes
            self.report(stage, layer)
        os.ftruncate(fd, lay.segment_ends[i])
        os.fsync(fd)
        self.trunk_bytes = lay.segment_ends[i]
        self.journal.mark(f"trunk:{seg}")
        self.report(stage, layer)
        self.finished(f"trunk:{seg}")

    def _segment_name(self, seg: int) -> str:
        n = self.n_layers
        if seg < 0:
            return "trunk: embeddings"
        if seg >= n:
            return "trunk: output head"
        return f"trunk layer {seg + 1} of {n}"

    def write_bank(self, bank: BankLayout) -> None:
        unit = f"bank:{bank.layer}"
        final = self.root / bank.file
        stage = f"experts of layer {bank.layer + 1} of {self.n_layers}"
        if self.journal.has(unit) and final.exists():
            self.bank_bytes[bank.layer] = bank.file_size
            self.finished(unit)
            return
        private_dir(final.parent)
        tmp = final.with_suffix(".tmp")
        experts = self.src.spec.experts[bank.layer]
        rs = bank.record_size
        # Resume inside the bank: the records synced before the last stop are kept.
        start = self.journal.partial.get(unit, 0) if tmp.exists() else 0
        if start and (start > bank.n_experts or tmp.stat().st_size < BANK_HEADER_BYTES + start * rs):
            start = 0
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT, 0o644)
        synced = [start]

        def sync(done: int) -> None:
            if done > synced[0]:
                os.fsync(fd)
                self.journal.mark_partial(unit, done)
                synced[0] = done

        def make(e: int, buf) -> None:
            parts = experts[e]
            payloads = {p: encode(self.src, parts[p], bank.parts[p]["dtype"], threads=self.row_threads,
                                  out=_part_view(buf, bank.parts[p]) if bank.parts[p]["dtype"] == Q3 else None)
                        for p in parts}
            _record_into(buf, bank, e, payloads)

        out = _RecordWriter(fd, tmp)
        ahead = None
        pool = ThreadPoolExecutor(WRITERS, thread_name_prefix="ferry-convert-write")
        inflight: collections.deque = collections.deque()

        def drain(keep: int) -> None:
            while len(inflight) > keep:
                fut, buf = inflight.popleft()
                fut.result()
                ahead.give_back(buf)

        try:
            os.ftruncate(fd, BANK_HEADER_BYTES + start * rs)
            # The header, also on a resume (the same bytes): this first write
            # settles whether direct I/O works before writes go in parallel.
            head = mmap.mmap(-1, BANK_HEADER_BYTES)
            head[:] = bank_header(bank)
            out.write(head, 0)
            self.bank_bytes[bank.layer] = BANK_HEADER_BYTES + start * rs
            ahead = _Prefetch(make, range(start, bank.n_experts), rs, self.threads)
            since_sync = 0
            for e in range(start, bank.n_experts):
                self.control.checkpoint(self.hold(f"{stage}: {e} of {bank.n_experts}", bank.layer,
                                                  lambda e=e: (drain(0), sync(e))))
                buf = ahead.next(e)
                inflight.append((pool.submit(out.write, buf, BANK_HEADER_BYTES + e * rs), buf))
                drain(WRITERS - 1)
                self.bank_bytes[bank.layer] += rs
                since_sync += rs
                if since_sync >= SYNC_EVERY and e + 1 < bank.n_experts:
                    drain(0)
                    sync(e + 1)
                    since_sync = 0
                self.report(f"{stage}: {e + 1} of {bank.n_experts}", bank.layer)
            drain(0)
            os.fsync(fd)
        finally:
            pool.shutdown(wait=True)   # no write may outlive its descriptor
            if ahead is not None:
                ahead.close()
            out.close()
            os.close(fd)
        os.replace(tmp, final)
        self.journal.mark(unit)
        self.report(stage, bank.layer)
        self.finished(unit)


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
            f"not enough free space in {probe}: the container needs {size(needed + SPACE_MARGIN)} more, "
            f"the disk has {size(usage.free)} free. Choose another destination or free some space.")


def _already_written(root: Path) -> int:
    if not root.exists():
        return 0
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


def convert(source: str | os.PathLike | Source, out: str | os.PathLike, *, trunk_format: str = "auto",
            expert_format: str = "auto", trunk_classes: dict[str, str] | None = None,
            progress: ProgressFn | None = None,
            control: ConvertControl | None = None, threads: int | None = None,
            unit_done: Callable[[str], None] | None = None) -> Path:
    """Convert ``source`` (a path, or an opened Source) into the container
    directory ``out`` and return its path.

    ``unit_done`` is called with each unit ("trunk:L", "bank:L") once it is
    in the container, by this run or an earlier one (app.get deletes a
    source shard once all the units reading it are done).

    ``trunk_classes``: {class: format} for trunk matrix classes stored apart
    from ``trunk_format`` (app.convert.layout.TRUNK_CLASSES).

    ``threads``: expert records read and encoded at once (default: one per
    core); the bytes written do not depend on it.

    ``control`` pauses or cancels the run from another thread (ConvertCancelled).
    Any stop (cancel, a full disk, a source that cannot be read, a kill) keeps
    what was finished in ``OUT.partial``; the same call again resumes."""
    out = Path(out).absolute()
    if out.exists():
        raise ConvertError(f"{out} already exists; remove it or choose another name")
    if not out.parent.is_dir():
        raise ConvertError(f"the destination folder {out.parent} does not exist")
    src = source if isinstance(source, Source) else open_source(source)
    layout = plan_layout(src, trunk_format, expert_format, trunk_classes)
    if src.kind == "hf":
        tok_section, tok_files = tokenizer_files.from_hf(src.path, src.config)
    else:
        tok_section, tok_files = tokenizer_files.from_gguf(src.gguf.metadata, src.path.name)
    root = partial_dir(out)
    check_space(out, layout.total_bytes() - _already_written(root))
    private_dir(root)     # the model's folder: 0700, as every folder Ferry writes
    writer = _Writer(src, layout, root, progress, control, threads, unit_done)
    try:
        writer.run()
        for name, data in tok_files.items():
            _write_file(root / name, data)
        doc = _json_safe(manifest(src, layout, writer.crcs, tok_section))
        _write_file(root / "manifest.json", json.dumps(doc, indent=1, sort_keys=False).encode("utf-8"))
    except SourceError as exc:
        raise ConvertError(
            f"reading the source failed: {exc}. What was converted so far is kept in {root}; once the source "
            f"reads again, run the same conversion to resume (a source file that changed starts it over).") from exc
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            left = size(max(0, layout.total_bytes() - writer.done_bytes) + SPACE_MARGIN)
            raise ConvertError(
                f"the disk filled up while writing {root} ({size(writer.done_bytes)} of "
                f"{size(layout.total_bytes())} done); what was finished is kept. Free at least {left} "
                f"and run the same conversion again to resume.") from exc
        raise ConvertError(f"writing {root} failed: {exc}; run the same conversion again to resume") from exc
    (root / JOURNAL).unlink()
    os.rename(root, out)
    writer.report("done")
    return out


def write_skeleton(src: Source, layout: Layout, tokenizer: dict, root: Path) -> Path:
    """A container with the real manifest and bank headers but no weights
    (sparse files of the right sizes): what the C core's plan reads, so the RAM
    plan of a source is known before hours of converting. Never opened for
    inference (its checksums are zero)."""
    root.mkdir(parents=True, exist_ok=True)
    with open(root / "trunk.bin", "wb") as f:
        f.truncate(layout.trunk_size)
    for b in layout.banks:
        path = root / b.file
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "wb") as f:
            f.write(bank_header(b))
            f.truncate(b.file_size)
    doc = _json_safe(manifest(src, layout, {t.name: 0 for t in layout.trunk}, tokenizer))
    (root / "manifest.json").write_text(json.dumps(doc))
    return root
