"""The one byte formatter, for the CLI and the window alike (no Qt).

Binary units throughout (KiB, MiB, GiB, TiB: RAM is binary, and one size
must read the same everywhere it is shown), three significant figures."""
from __future__ import annotations

GIB = 1 << 30


def size(n: float) -> str:
    """Bytes for people: '512 bytes', '1.50 KiB', '23.4 MiB', '118 GiB', '2.00 TiB'."""
    n = float(n)
    if abs(n) < 1024:
        return f"{int(n)} bytes"
    for unit in ("KiB", "MiB", "GiB", "TiB", "PiB"):
        n /= 1024
        if abs(n) < 1024 or unit == "PiB":
            return f"{n:.2f} {unit}" if abs(n) < 10 else f"{n:.1f} {unit}" if abs(n) < 100 else f"{n:.0f} {unit}"
    return f"{n:.0f} PiB"


def budget_problem(budget: int, floor: int, recommended: int) -> str:
    """Why a RAM budget of ``budget`` bytes cannot run a model whose floor is ``floor`` ("" when it can;
    0 means the recommended budget, which always can)."""
    if budget <= 0 or budget >= floor:
        return ""
    return (f"{size(budget)} is below this model's floor of {size(floor)}, the least it runs in at this context; "
            f"the recommended budget is {size(recommended)}. Choose at least {size(floor)}, or Recommended.")
