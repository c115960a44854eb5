"""How much RAM Ferry may use on this machine, and the budget to open a
model with when the user names none.

Usable memory is the smallest of what the machine has and what this process
is allowed: a cgroup v2 ``memory.max`` or v1 ``memory.limit_in_bytes`` (in
containers and under systemd), ``MemAvailable`` on Linux, ``hw.memsize`` on
macOS. The automatic budget keeps a margin for the app, the OS and the page
cache; all of the rest goes to the expert cache. (It once stepped down to whole
multiples of one token's expert working set, the records of top-k experts in
every MoE layer: for Kimi K3 on a 64 GB Mac that set is 17.5 GiB against 16.3
GiB of room above the floor, so the default gave K3 no cache at all. A cache
smaller than one token's set still hits: the public streaming engine measures
38 % with 17.6 GB.)
"""
from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from app.units import size

#: Left for the app itself, Python, Qt and the OS.
APP_RESERVE = 1 << 30
#: Of the usable memory, the share Ferry takes by default.
DEFAULT_SHARE = 0.75


@dataclass(frozen=True)
class MachineMemory:
    total: int          #: physical RAM
    usable: int         #: what this process may use now
    source: str         #: where `usable` came from


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    if not text or text == "max":
        return None
    try:
        return int(text)
    except ValueError:
        return None


def _cgroup_limit() -> tuple[int | None, str]:
    """The memory limit of this process's cgroup (v2, then v1), if any."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None, ""
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        controllers, rel = parts[1], parts[2].lstrip("/")
        if controllers == "":  # v2 unified hierarchy
            for base in (Path("/sys/fs/cgroup") / rel, Path("/sys/fs/cgroup")):
                limit = _read_int(base / "memory.max")
                if limit:
                    return limit, f"cgroup v2 {base / 'memory.max'}"
        elif "memory" in controllers.split(","):
            for base in (Path("/sys/fs/cgroup/memory") / rel, Path("/sys/fs/cgroup/memory")):
                limit = _read_int(base / "memory.limit_in_bytes")
                if limit and limit < (1 << 60):  # v1 writes a huge number for "no limit"
                    return limit, f"cgroup v1 {base / 'memory.limit_in_bytes'}"
    return None, ""


def _meminfo() -> dict[str, int]:
    out = {}
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            key, _, rest = line.partition(":")
            fields = rest.split()
            if fields:
                out[key] = int(fields[0]) * 1024
    except (OSError, ValueError):
        pass
    return out


def machine_memory() -> MachineMemory:
    if sys.platform == "darwin":
        try:
            total = int(subprocess.run(["sysctl", "-n", "hw.memsize"], capture_output=True, text=True,
                                       check=True).stdout)
        except (OSError, ValueError, subprocess.CalledProcessError):
            total = 8 << 30
        # macOS compresses and swaps freely; physical RAM is the honest ceiling.
        return MachineMemory(total, total, "sysctl hw.memsize")
    info = _meminfo()
    total = info.get("MemTotal", 0) or os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    usable, source = info.get("MemAvailable", total), "/proc/meminfo MemAvailable"
    limit, where = _cgroup_limit()
    if limit and limit < usable:
        usable, source = limit, where
    return MachineMemory(total, usable, source)


def model_room(usable: int) -> int:
    """What the models may take of ``usable`` bytes: a share of it, less the app's reserve."""
    return int(max(0, usable - APP_RESERVE) * DEFAULT_SHARE)


def ledger_room(memory: MachineMemory | None = None) -> int:
    """What all of Ferry's engines on this machine may take together (the registry's ledger,
    ``app.engine.registry``): the same share as one model's budget, of the machine's memory as if
    no Ferry engine ran: RAM, or this process's memory limit where one applies (not what is
    available now, which the engines already open have lowered)."""
    memory = memory or machine_memory()
    limit, _ = _cgroup_limit() if sys.platform != "darwin" else (None, "")
    return model_room(min(memory.total, limit) if limit else memory.total)


@dataclass(frozen=True)
class BudgetChoice:
    budget: int
    reason: str


def auto_budget(floor: int, token_set: int, wanted_max: int, memory: MachineMemory | None = None) -> BudgetChoice:
    """A safe budget: a share of usable memory, at most what the model can use (``wanted_max``),
    never below the floor. ``token_set`` (one token's expert working set) only words the reason:
    the cache takes all the room there is, whole tokens' worth or not."""
    memory = memory or machine_memory()
    room = model_room(memory.usable)
    target = min(room, wanted_max)
    if target < floor:
        return BudgetChoice(floor, f"{size(memory.usable)} usable ({memory.source}) leaves less than the floor "
                                   f"{size(floor)}; using the floor")
    sets = f"; the expert cache holds {(target - floor) / token_set:.1f} tokens' working sets" if token_set > 0 else ""
    why = ("the whole model fits" if target >= wanted_max else
           f"{DEFAULT_SHARE:.0%} of {size(memory.usable)} usable ({memory.source}) less {size(APP_RESERVE)} "
           f"for the app{sets}")
    return BudgetChoice(target, why)


