"""How fast a disk gives Ferry its expert records: a short measurement the
wizard runs on the destination before hours are spent converting onto it.

It writes a temporary file (256 MiB by default, less on a nearly full disk)
in the folder, syncs it, then reads it back in record-sized blocks in random
order with the page cache bypassed (``O_DIRECT`` on Linux, ``F_NOCACHE`` on
macOS), which is how the engine reads experts. The file is removed whatever
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
ALIGN = 4096
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
    block: int
    bytes_read: int
    seconds: float
    device: str = ""             #: e.g. "usb" when the folder's disk hangs off USB (Linux)

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


def probe(folder: str | os.PathLike, size: int = DEFAULT_BYTES, block: int = DEFAULT_BLOCK,
          progress: Callable[[float], None] | None = None, cancel: threading.Event | None = None,
          max_seconds: float = 20.0) -> DiskSpeed:
    """Measure the read (and write) bandwidth of the disk holding ``folder``.

    ``block`` is the read size (use the model's expert record size); ``progress``
    gets 0..1; ``cancel`` stops it (ProbeCancelled). Raises OSError when the
    folder cannot be written."""
    folder = Path(folder)
    block = _align(block)
    free = os.statvfs(folder).f_bavail * os.statvfs(folder).f_frsize if hasattr(os, "statvfs") else size * 4
    size = min(size, free // 4)
    if size < MIN_BYTES:
        raise OSError(28, f"only {free / 2**20:.0f} MiB free in {folder}: too little to measure")
    n_blocks = max(1, size // block)
    size = n_blocks * block
    path = folder / f".ferry-disk-probe-{os.getpid()}-{threading.get_ident()}.tmp"
    deadline = time.monotonic() + max_seconds
    buf = mmap.mmap(-1, block)
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
        # Read: record-sized direct reads in random order, as the engine does.
        fd, direct, note = _direct_fd(path)
        order = list(range(n_blocks))
        random.Random(7).shuffle(order)
        done = 0
        t0 = time.perf_counter()
        try:
            for k, i in enumerate(order):
                if cancel is not None and cancel.is_set():
                    raise ProbeCancelled()
                got = os.preadv(fd, [buf], i * block)
                if got <= 0:
                    raise OSError(5, f"short read from {path}")
                done += got
                if progress:
                    progress(0.5 + 0.5 * (k + 1) / n_blocks)
                if time.monotonic() > deadline and k >= 8:
                    break
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
                     direct=direct, note=note, block=block, bytes_read=done, seconds=write_s + read_s,
                     device=device_kind(folder))
