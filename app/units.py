"""Byte counts for people, shared by the CLI and the GUI (no Qt)."""
from __future__ import annotations


def size(n: float) -> str:
    """Bytes for people: 1.42 TB style decimal units, as disks are sold."""
    n = float(n)
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(n) >= scale:
            v = n / scale
            return f"{v:.2f} {unit}" if v < 10 else f"{v:.1f} {unit}" if v < 100 else f"{v:.0f} {unit}"
    return f"{int(n)} bytes"
