"""How fast a disk gives Ferry its expert records: a short measurement the
wizard runs on the destination before hours are spent converting onto it
(and ``ferry get --plan`` and the catalogue take their disk rate from).

It writes a temporary file (256 MiB by default, less on a nearly full disk)
in the folder, syncs it, then reads it back the way the engine reads
experts: with the engine's number of reader threads (its queue depth,
:data:`app.engine.binding.DEFAULT_READERS`), each reading pieces of the file
in random order (4 MiB ones, the piece the engine's readers share a record
in, ``FE_IO_CHUNK`` in core_c/src/io.h; whole records when they are
smaller) with the page cache bypassed (``O_DIRECT`` on Linux, ``F_NOCACHE``
on macOS) into its own page-aligned private buffer, allocated as the
engine's are. A disk that needs a deep queue (an Apple SSD) gives one
reader far less than it gives the engine. The file is removed whatever
happens. A model's speed is bounded by ``read bandwidth / cold bytes per
token`` when every expert it needs has to come from the disk.
"""
from __future__ import annotations

import mmap
import os
import random
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

DEFAULT_BYTES = 256 << 20
MIN_BYTES = 16 << 20
DEFAULT_BLOCK = 4 << 20
#: The piece the engine's readers share a record in (FE_IO_CHUNK, core_c/src/io.h).
IO_PIECE = 4 << 20
ALIGN = 4096
#: Pieces read in all before the time limit may end the measurement.
MIN_PIECES = 8
#: Below this a disk is called slow (an external USB disk, a network share).
SLOW_BYTES_PER_S = 1.0e9


class ProbeCancelled(Exception):
    pass


@dataclass(frozen=True)
class DiskSpeed:
    read_bytes_per_s: float
    write_bytes_per_s: float     #: the temp file's write and sync
    direct: bool                 #: whether the reads bypassed the page cache
    note: str                    #: why not, when they did not
    block: int                   #: each read's size (a piece of a record)
    bytes_read: int
    seconds: float
    device: str = ""             #: e.g. "usb" when the folder's disk hangs off USB (Linux)
    readers: int = 1             #: reader threads the reads were issued from

    @property
    def slow(self) -> bool:
        return self.read_bytes_per_s < SLOW_BYTES_PER_S or self.device == "usb"


def tok_s_bound(read_bytes_per_s: float, cold_bytes_per_token: int) -> float | None:
    """The most tokens per second the disk allows when every expert is read cold
    (None for a model with no experts to stream)."""
    if cold_bytes_per_token <= 0:
        return None
    return read_bytes_per_s / cold_bytes_per_token


def _align(n: int, a: int = ALIGN) -> int:
    return max(a, (n + a - 1) // a * a)


def _direct_fd(path: Path) -> tuple[int, bool, str]:
    """A read descriptor that bypasses the page cache where possible."""
    flag = getattr(os, "O_DIRECT", 0)
    if flag:
        try:
            return os.open(path, os.O_RDONLY | flag), True, ""
        except OSError as exc:
            note = f"this filesystem refuses direct reads ({exc.strerror}); measured through the page cache"
    elif sys.platform == "darwin":
        fd = os.open(path, os.O_RDONLY)
        try:
            import fcntl
            fcntl.fcntl(fd, fcntl.F_NOCACHE, 1)
            return fd, True, ""
        except (ImportError, OSError, AttributeError) as exc:
            os.close(fd)
            note = f"F_NOCACHE failed ({exc}); measured through the page cache"
    else:
        note = "no direct I/O on this platform; measured through the page cache"
    fd = os.open(path, os.O_RDONLY)
    if hasattr(os, "posix_fadvise"):
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)   # at least start cold
    return fd, False, note


def device_kind(folder: Path) -> str:
    """'usb' when the folder's block device is attached through USB (Linux sysfs), else ''."""
    try:
        st = os.stat(folder)
        link = Path(f"/sys/dev/block/{os.major(st.st_dev)}:{os.minor(st.st_dev)}")
        if link.exists() and "/usb" in str(link.resolve()):
            return "usb"
    except (OSError, ValueError):
        pass
    return ""


def _buffer(n: int) -> mmap.mmap:
    """``n`` bytes of private anonymous memory, page-aligned as direct I/O needs:
    allocated like the engine's record buffers (not a shared mapping)."""
    flags = getattr(mmap, "MAP_PRIVATE", 0) | getattr(mmap, "MAP_ANONYMOUS", getattr(mmap, "MAP_ANON", 0))
    if not flags:   # no mmap flags on this platform (Windows): what mmap gives
        return mmap.mmap(-1, n)
    return mmap.mmap(-1, n, flags=flags, prot=mmap.PROT_READ | mmap.PROT_WRITE)


def _read_pieces(fd: int, path: Path, size: int, piece: int, readers: int, deadline: float,
                 progress: Callable[[float], None] | None, cancel: threading.Event | None) -> int:
    """Read ``size`` bytes of ``fd`` in ``piece``-sized reads at random aligned
    offsets from ``readers`` threads (each with its own buffer), until all are
    read or the deadline passes; returns the bytes read. Progress is reported
    from the calling thread; an error in any reader stops them all and is raised."""
    n_pieces = size // piece
    order = list(range(n_pieces))
    random.Random(7).shuffle(order)
    lock = threading.Lock()
    state = {"next": 0, "done": 0, "reads": 0}
    stop = threading.Event()
    errors: list[BaseException] = []

    def take() -> int | None:
        with lock:
            k = state["next"]
            if k >= n_pieces or (state["reads"] >= MIN_PIECES and time.monotonic() > deadline):
                return None
            state["next"] = k + 1
            return order[k]

    def work() -> None:
        try:
            buf = _buffer(piece)
        except BaseException as exc:   # noqa: BLE001 - raised again by the caller
            errors.append(exc)
            stop.set()
            return
        try:
            while not stop.is_set():
                if cancel is not None and cancel.is_set():
                    stop.set()
                    return
                i = take()
                if i is None:
                    return
                got = os.preadv(fd, [buf], i * piece)
                if got <= 0:
                    raise OSError(5, f"short read from {path}")
                with lock:
                    state["done"] += got
                    state["reads"] += 1
        except BaseException as exc:   # noqa: BLE001 - raised again by the caller
            errors.append(exc)
            stop.set()
        finally:
            buf.close()

    threads = [threading.Thread(target=work, name=f"ferry-disk-probe-{k}", daemon=True) for k in range(readers)]
    for t in threads:
        t.start()
    for t in threads:
        while t.is_alive():
            t.join(0.05)
            if progress:
                progress(0.5 + 0.5 * min(1.0, state["next"] / n_pieces))
    if errors:
        raise errors[0]
    if cancel is not None and cancel.is_set():
        raise ProbeCancelled()
    if progress:
        progress(1.0)
    return state["done"]


def probe(folder: str | os.PathLike, size: int = DEFAULT_BYTES, block: int = DEFAULT_BLOCK,
          progress: Callable[[float], None] | None = None, cancel: threading.Event | None = None,
          max_seconds: float = 20.0, readers: int | None = None) -> DiskSpeed:
    """Measure the read (and write) bandwidth of the disk holding ``folder``.

    ``block`` is the model's expert record size (the reads are pieces of at
    most :data:`IO_PIECE` of it); ``readers`` the reader threads (default:
    the engine's, :data:`app.engine.binding.DEFAULT_READERS`); ``progress``
    gets 0..1 on the calling thread; ``cancel`` stops it (ProbeCancelled).
    Raises OSError when the folder cannot be written."""
    if readers is None:
        from app.engine.binding import DEFAULT_READERS
        readers = DEFAULT_READERS
    readers = max(1, int(readers))
    folder = Path(folder)
    block = _align(block)
    # The engine's readers share a record in pieces; one reader reads it whole.
    piece = block if readers == 1 else min(block, IO_PIECE)
    free = os.statvfs(folder).f_bavail * os.statvfs(folder).f_frsize if hasattr(os, "statvfs") else size * 4
    size = min(size, free // 4)
    if size < MIN_BYTES:
        raise OSError(28, f"only {free / 2**20:.0f} MiB free in {folder}: too little to measure")
    n_blocks = max(1, size // block)
    size = n_blocks * block
    path = folder / f".ferry-disk-probe-{os.getpid()}-{threading.get_ident()}.tmp"
    deadline = time.monotonic() + max_seconds
    buf = _buffer(block)
    buf.write(os.urandom(block))   # incompressible: a compressing filesystem cannot cheat
    try:
        # Write: the temp file, synced (it is also what the conversion will do).
        t0 = time.perf_counter()
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            for i in range(n_blocks):
                if cancel is not None and cancel.is_set():
                    raise ProbeCancelled()
                buf[:8] = i.to_bytes(8, "little")     # no two blocks alike
                os.pwrite(fd, buf, i * block)
                if progress:
                    progress(0.5 * (i + 1) / n_blocks)
            os.fsync(fd)
        finally:
            os.close(fd)
        write_s = time.perf_counter() - t0
        # Read: random pieces, direct, from the engine's number of readers.
        fd, direct, note = _direct_fd(path)
        t0 = time.perf_counter()
        try:
            done = _read_pieces(fd, path, size, piece, readers, deadline, progress, cancel)
        finally:
            os.close(fd)
        read_s = time.perf_counter() - t0
    finally:
        buf.close()
        try:
            os.unlink(path)
        except OSError:
            pass
    return DiskSpeed(read_bytes_per_s=done / max(read_s, 1e-9), write_bytes_per_s=size / max(write_s, 1e-9),
                     direct=direct, note=note, block=piece, bytes_read=done, seconds=write_s + read_s,
                     device=device_kind(folder), readers=readers)
