"""What the gauges show, computed from the engine's counters. No Qt here.

The worker samples ``Session.stats()`` (cumulative counters, from the turn's
``LiveStats`` and ``TurnDone`` events) a few times a second and sends each as
a ``StatsSample``, tagged with the phase it was taken in ("prefill" while
the prompt is processed, "decode" while the answer is written); the last one
of a turn carries the turn's own ``TurnFigures``. ``StatsView``
turns the samples into rates over a short window, hit rates split by phase
(recent and since the view started), and a bounded history per gauge for the
sparklines. A counter that goes down means a new session: the view re-bases.

Also here: the machine's usable RAM and the memory split for the RAM bar.
"""
from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Mapping


COUNTERS = ("prompt_tokens", "decode_tokens", "prompt_seconds", "decode_seconds", "expert_reads",
            "bytes_read", "read_seconds", "compute_seconds", "hits", "misses", "decode_hits", "decode_misses")
GAUGES = ("decode_tps", "prompt_tps", "read_mbps", "hit_decode", "hit_prefill")
PHASES = ("prefill", "decode")


@dataclass(frozen=True)
class TurnFigures:
    """One answer's own figures, from its ``TurnDone`` (the same numbers
    ``ferry run --json`` prints and the server's ``ferry`` field carries)."""

    prompt_tokens: int          #: prompt tokens this turn had to read
    reused_tokens: int          #: prompt tokens the session (or the server) already held
    tokens: int                 #: generated tokens
    seconds: float              #: the whole turn
    ttft_s: float | None = None  #: time to the first generated token

    @classmethod
    def of(cls, done: Any) -> "TurnFigures":
        """From an ``app.events.TurnDone``."""
        return cls(prompt_tokens=done.prompt_tokens - done.reused_tokens, reused_tokens=done.reused_tokens,
                   tokens=len(done.token_ids), seconds=done.seconds, ttft_s=done.ttft_s)

    def record(self) -> dict[str, float]:
        """As kept with the answer in the history (``Message.stats``: ``turn_*`` keys
        and ``ttft_s``; ``chat_view.turn_figures`` and the export read them)."""
        d = {"turn_prompt_tokens": self.prompt_tokens, "turn_reused_tokens": self.reused_tokens,
             "turn_tokens": self.tokens, "turn_seconds": self.seconds}
        return d if self.ttft_s is None else {**d, "ttft_s": self.ttft_s}


@dataclass(frozen=True)
class StatsSample:
    """One sample of the engine's counters, as the window's worker sends it to
    the gauges: immutable, so the window cannot change what the worker holds.

    ``counters`` are cumulative, with ``Session.stats()``'s names: a local
    session's running totals, or a remote answer's counters."""

    counters: Mapping[str, float]
    phase: str = "decode"                #: "prefill" or "decode"
    t: float = 0.0                       #: time.monotonic() when taken
    final: bool = False                  #: the turn's last sample
    turn: TurnFigures | None = None      #: the turn's own figures (a final sample of a finished turn)

    def __post_init__(self) -> None:
        object.__setattr__(self, "counters", MappingProxyType(dict(self.counters)))


@dataclass
class GaugeValues:
    decode_tps: float | None = None       #: answer tokens per second (recent)
    prompt_tps: float | None = None       #: prompt tokens per second (recent)
    read_mbps: float | None = None        #: disk read throughput, MB/s of wall time (recent)
    hit_decode: float | None = None       #: expert cache hit rate while decoding, recent window
    hit_decode_total: float | None = None  #: ... since the view started
    hit_prefill: float | None = None
    hit_prefill_total: float | None = None
    bytes_read_total: int = 0
    expert_reads_total: int = 0
    active: bool = False                  #: the engine did work inside the window


@dataclass
class _Sample:
    t: float
    phase: str
    counters: dict[str, float]
    delta: dict[str, float]
    by_phase: dict[str, tuple[float, float]]  #: phase -> (hits, misses) in this sample


class StatsView:
    def __init__(self, window: float = 3.0, history: int = 120):
        self.window = window
        self.history: dict[str, deque[float]] = {g: deque(maxlen=history) for g in GAUGES}
        self._samples: deque[_Sample] = deque()
        self._last: dict[str, float] | None = None
        self._totals = {p: [0, 0] for p in PHASES}  # phase -> [hits, misses]
        self._bytes_total = 0
        self._reads_total = 0
        self._shown = GaugeValues()
        self.samples_seen = 0

    def push(self, stats: Mapping[str, Any], phase: str = "decode", t: float | None = None) -> GaugeValues:
        """Take one sample of the cumulative counters; returns what to show now."""
        t = time.monotonic() if t is None else t
        cur = {k: float(stats.get(k, 0) or 0) for k in COUNTERS}
        if self._last is None or any(cur[k] < self._last[k] for k in COUNTERS):
            self._last = {k: 0.0 for k in COUNTERS}  # first sample, or a new session: counted from zero
        delta = {k: cur[k] - self._last[k] for k in COUNTERS}
        self._last = cur
        self.samples_seen += 1
        if "decode_hits" in stats:  # the engine splits hits itself: trust it over the sample's phase
            dec = (delta["decode_hits"], delta["decode_misses"])
            by_phase = {"decode": dec, "prefill": (delta["hits"] - dec[0], delta["misses"] - dec[1])}
        else:
            by_phase = {p: ((delta["hits"], delta["misses"]) if p == phase else (0.0, 0.0)) for p in PHASES}
        for p, (h, m) in by_phase.items():
            self._totals[p][0] += int(h)
            self._totals[p][1] += int(m)
        self._bytes_total += int(delta["bytes_read"])
        self._reads_total += int(delta["expert_reads"])
        self._samples.append(_Sample(t, phase, cur, delta, by_phase))
        while self._samples and self._samples[0].t < t - self.window:
            self._samples.popleft()
        self._shown = self._compute(t)
        for g in GAUGES:
            v = getattr(self._shown, g)
            self.history[g].append(0.0 if v is None else float(v))
        return self._shown

    def push_sample(self, sample: StatsSample) -> GaugeValues:
        """Take the worker's ``StatsSample``."""
        return self.push(sample.counters, sample.phase, sample.t)

    @property
    def values(self) -> GaugeValues:
        return self._shown

    def _compute(self, t: float) -> GaugeValues:
        win = list(self._samples)
        s = {k: sum(x.delta[k] for x in win) for k in COUNTERS}
        prev = self._shown
        v = GaugeValues(bytes_read_total=self._bytes_total, expert_reads_total=self._reads_total)
        v.active = (s["prompt_tokens"] + s["decode_tokens"]) > 0
        v.decode_tps = s["decode_tokens"] / s["decode_seconds"] if s["decode_seconds"] > 0 else prev.decode_tps
        v.prompt_tps = s["prompt_tokens"] / s["prompt_seconds"] if s["prompt_seconds"] > 0 else prev.prompt_tps
        span = (win[-1].t - win[0].t) if len(win) > 1 else 0.0
        # the first sample in the window carries work done before it: count its time too
        if len(win) > 1:
            busy = s["prompt_seconds"] + s["decode_seconds"]
            span = max(span, busy)
        elif win:
            span = win[0].delta["prompt_seconds"] + win[0].delta["decode_seconds"]
        if span > 0 and v.active:
            v.read_mbps = s["bytes_read"] / span / 1e6
        else:
            v.read_mbps = 0.0 if prev.read_mbps is not None else None
        for phase in PHASES:
            h = sum(x.by_phase[phase][0] for x in win)
            m = sum(x.by_phase[phase][1] for x in win)
            recent = h / (h + m) if h + m > 0 else getattr(prev, f"hit_{phase}")
            th, tm = self._totals[phase]
            setattr(v, f"hit_{phase}", recent)
            setattr(v, f"hit_{phase}_total", th / (th + tm) if th + tm > 0 else None)
        return v


# ---------------------------------------------------------------- memory

def usable_ram() -> int:
    """Bytes of RAM this process can use now (``app.memory.budget.machine_memory``)."""
    from app.memory.budget import machine_memory

    return machine_memory().usable


@dataclass
class MemorySplit:
    """The RAM bar: what the core uses, part by part, against what the machine has."""

    trunk: int
    state: int
    scratch: int
    expert_cache: int      #: expert read buffers plus the cache the budget leaves room for
    usable: int
    floor: int             #: the least the model can run in at this context
    recommended: int
    budget: int            #: what the core was given (0 = no limit)
    policy: int = 0        #: the expert cache's replacement-policy state
    parts: list[tuple[str, int]] = field(default_factory=list)

    @property
    def total(self) -> int:
        return self.trunk + self.state + self.scratch + self.expert_cache + self.policy


def expert_total_bytes(info: Any) -> int:
    """Bytes of all expert records of a model (``ModelInfo``)."""
    return int(info.n_moe_layers) * int(info.n_experts) * int(info.expert_bytes)


def plan_floor(plan: Any) -> int:
    """The least budget the model runs in (older plans had no separate floor)."""
    return int(getattr(plan, "floor_bytes", 0) or plan.total_bytes)


def recommended_budget(plan: Any, usable: int) -> int:
    """The budget Ferry recommends for ``plan`` (an engine ``MemoryPlan``) with
    ``usable`` bytes free: the one rule of ``app.memory.plan.recommend``."""
    from app.memory.budget import MachineMemory
    from app.memory.plan import recommend

    return recommend(plan, MachineMemory(max(usable, 0), usable, "given")).budget


def memory_split(plan: Any, info: Any, budget: int, usable: int | None = None,
                 recommended: int | None = None) -> MemorySplit:
    """The plan in force: trunk, attention state, the expert cache (with its
    prefetch buffers), the cache policy's state and scratch. ``recommended``: the budget the model was
    recommended when it was opened (else computed by the same rule)."""
    usable = usable_ram() if usable is None else usable
    split = MemorySplit(trunk=int(plan.trunk_bytes), state=int(plan.state_bytes), scratch=int(plan.scratch_bytes),
                        expert_cache=int(plan.expert_bytes), usable=usable, floor=plan_floor(plan),
                        recommended=recommended if recommended else recommended_budget(plan, usable),
                        budget=budget, policy=int(plan.policy_bytes))
    split.parts = [("trunk", split.trunk), ("attention state", split.state),
                   ("expert cache", split.expert_cache), ("cache policy", split.policy), ("scratch", split.scratch)]
    return split


