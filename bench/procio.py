"""What the kernel counts for this process, with nothing but the standard library.

Benchmark children that run in another interpreter (llama.cpp's in the bench
venv, which has none of Ferry's dependencies) import this instead of a bench
script that pulls in Ferry.
"""

from __future__ import annotations

from pathlib import Path


def io_read_bytes() -> int:
    """Bytes this process has made the disk read (/proc/self/io ``read_bytes``:
    page faults, readahead and direct reads alike); -1 where that file is missing."""
    try:
        for line in Path("/proc/self/io").read_text().splitlines():
            if line.startswith("read_bytes:"):
                return int(line.split()[1])
    except OSError:
        pass
    return -1
