"""How to store a model: the choices for its resident trunk and for its
experts, what each costs and loses, and the ones Ferry recommends on this
machine.

* **Trunk.** It stays in RAM, so its size comes off the expert cache: the
  recommendation is the most accurate choice whose trunk (with the session's
  attention state and scratch) leaves at least half of the usable RAM to the
  expert cache (a dense model: that fits in the usable RAM), else the
  smallest. The 4-bit trunk choice is iq4_xs (4.25 bits/weight; a matrix
  whose rows are not a multiple of 256 values is stored q4_0): smaller than
  q4_0 and more accurate on every measured set (bench/iq4xs_quality.py:
  weight error 0.068 vs 0.087 on the real demo weights, 0.075 vs 0.088 on
  the MXFP4 K3 stand-in): listed before q4_0, it is the one chosen wherever
  a 4-bit trunk is (q4_0 stays one choice away). Kimi
  K3's 56.7 G trunk weights are 62 GB at q8_0 (the `auto` of a float trunk,
  with the f32 routers and norms) but about 31 GB at iq4_xs, so on a 64 GB
  Mac it is iq4_xs.
* **Experts.** Every token reads its experts that are not cached, so their
  bits set the speed of a model that does not fit in RAM, and its accuracy.
  When the whole model fits in the usable RAM in some choice, the
  recommendation is the fastest of those that fit whose measured weight
  error is at most a 4-bit format's (QUALITY_BOUND: q8_0 and q4_0 qualify,
  3-bit does not), by the decode speed estimated from this machine's
  measured kernels (app.engine.speed, in the default arithmetic); a choice
  within SPEED_MARGIN of the fastest but more accurate wins, so noise in the
  measurement does not flip it. The exact choice (`--expert-format auto`)
  stays one flag away. When none fits, the one that reads the fewest bytes
  per token (then the disk sets the speed, and a 3-bit code reads 2.7×
  fewer bytes than 8 bits). The trunk keeps its rule (its `auto`, q8_0
  for a float source, is within the bound and among the fastest; a
  quantized source's own formats are not rounded again for speed).
* **Two bits, offered, never chosen.** The 2-bit q2_vq reads 26 % fewer
  bytes per token than q3_nl at about 1.4-1.6x its error. It is listed
  only when no choice fits in RAM (the model streams, and the disk sets the
  speed), and never recommended: the "smallest" rule considers only choices
  within STREAM_BOUND (a 3-bit format's error). The user asks for it with
  `--expert-format q2_vq`; `ferry check` says what it would save.

No Qt here: the wizard's Source page and `ferry check` show the same lists.
The error figures are the measured mean relative weight errors of
docs/bench-log/2026-12-03.md ("Three-bit experts: quality": real SmolLM2 weights and
MXFP4-sourced K3-shaped ones).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Callable

from app.convert import iq4xs, quant2, quant3
from app.convert.layout import plan_layout
from app.convert.sources import Source

#: `--trunk-format` / `--expert-format` value meaning "what this module recommends"
RECOMMENDED = "recommended"

#: The choices, from the most accurate to the smallest ("auto" is described
#: by what it resolves to).
EXPERT_CANDIDATES = ("auto", "q8_0", "q4_0", quant3.NAME, quant2.NAME)
TRUNK_CANDIDATES = ("auto", iq4xs.NAME, "q4_0")
#: Each lossy format's label, its measured typical relative weight error as
#: text, and as a number (the upper end) for the quality bound.
LOSSY = {"q8_0": ("8-bit (q8_0)", "about 0.6 %", 0.006), "q4_0": ("4-bit (q4_0)", "about 9 %", 0.09),
         "q4_1": ("4-bit (q4_1)", "about 10 %", 0.10), iq4xs.NAME: ("4-bit (iq4_xs)", "about 7-8 %", 0.075),
         quant3.NAME: ("3-bit (q3_nl)", "about 18-22 %", 0.22),
         quant2.NAME: ("2-bit (q2_vq)", "about 29-30 %", 0.30)}
#: The speed rule's quality bound: a 4-bit (q4_0 / q4_1 / q4_k class) format's measured weight error.
QUALITY_BOUND = 0.10
#: A faster choice must beat a more accurate one by more than this fraction of its speed to be recommended
#: (the kernel measurement varies by about ±20 % on a loaded machine).
SPEED_MARGIN = 0.15
#: When nothing fits in RAM, the smallest choice whose error is at most this (a 3-bit format's) is
#: recommended; larger errors (2-bit) are offered, never chosen for the user.
STREAM_BOUND = 0.22
#: Offered only when no other choice fits in RAM (they would never be picked otherwise).
STREAM_ONLY = (quant2.NAME,)


@dataclass(frozen=True)
class FormatChoice:
    role: str                   #: "trunk" or "experts"
    format: str                 #: the --trunk-format / --expert-format value
    stored: str                 #: what the matrices are stored as (e.g. "bf16" for auto), "+" joined when mixed
    label: str
    exact: bool                 #: no loss against the source's values
    weight_error: str           #: the measured typical relative weight error, as text
    bits_per_weight: float      #: all-in, over the role's matrix weights
    nbytes: int                 #: the trunk, or all expert records
    container_bytes: int
    cold_bytes_per_token: int   #: one token's experts, none cached (0 for the trunk)
    fits_in_ram: bool           #: the recommendation's test (see the module's docstring)
    recommended: bool = False
    error: float = 0.0          #: weight_error as a number (the quality bound's test)
    tok_per_s: float | None = None   #: decode estimated from RAM (the whole model cached), measured kernels
    rule: str = ""              #: why the recommended one is: "speed", "accuracy" or "smallest"

    def as_dict(self) -> dict:
        return asdict(self)


def _count(shape) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def pick(fits: list[bool], sizes: list[int], speeds: list[float | None] | None = None,
         errors: list[float] | None = None) -> tuple[int, str]:
    """THE rule of both recommendations, on choices listed from the most
    accurate: (index, rule). When some fit and ``speeds`` (estimated tok/s)
    are known: among those that fit with an error (``errors``) at most
    QUALITY_BOUND, the fastest, a more accurate one within SPEED_MARGIN of it
    preferred ("speed"); else the first that fits ("accuracy"); when none
    fits, the smallest ("smallest") of those with an error at most
    STREAM_BOUND when ``errors`` are given and any is. `ferry plan --config`
    (app.convert.plan_config) applies it to sizes costed from a bare config,
    so its formats are the ones a conversion will be recommended."""
    if not any(fits):
        pool = [i for i in range(len(sizes)) if errors is None or errors[i] <= STREAM_BOUND] or range(len(sizes))
        return min(pool, key=sizes.__getitem__), "smallest"
    if speeds is not None and errors is not None:
        ok = [i for i, f in enumerate(fits) if f and errors[i] <= QUALITY_BOUND]
        if ok and all(speeds[i] for i in ok):
            best = max(speeds[i] for i in ok)
            return next(i for i in ok if speeds[i] * (1 + SPEED_MARGIN) >= best), "speed"
    return next(i for i, f in enumerate(fits) if f), "accuracy"


def default_speed(fmt: str) -> float | None:
    """Weight bytes per second this machine's kernels go through in ``fmt``,
    in the default arithmetic (measured once per process, app.engine.speed)."""
    from app.engine.speed import kernel_bytes_per_s

    return kernel_bytes_per_s(fmt)


def decode_tok_per_s(parts: list[tuple[int, str]], speed: Callable[[str], float | None]) -> float | None:
    """Decode tokens per second from RAM: each (bytes per token, format)
    through the kernels measured by ``speed`` (None when one is unknown)."""
    seconds = 0.0
    for nbytes, fmt in parts:
        if nbytes:
            bps = speed(fmt)
            if not bps:
                return None
            seconds += nbytes / bps
    return 1.0 / seconds if seconds > 0 else None


def trunk_fits(trunk_bytes: int, working_bytes: int, usable_bytes: int, moe: bool) -> bool:
    """The trunk test: a MoE model's trunk (with the session's state and
    scratch) leaves at least half of the usable RAM to the expert cache; a
    dense model fits in it."""
    return trunk_bytes + working_bytes <= (usable_bytes // 2 if moe else usable_bytes)


def experts_fit(trunk_bytes: int, expert_bytes: int, working_bytes: int, usable_bytes: int) -> bool:
    """The expert test: the whole model fits in the usable RAM."""
    return trunk_bytes + expert_bytes + working_bytes <= usable_bytes


def _mark(made: list[FormatChoice], smallest: Callable[[FormatChoice], int], by_speed: bool = True
          ) -> list[FormatChoice]:
    i, rule = pick([c.fits_in_ram for c in made], [smallest(c) for c in made],
                   [c.tok_per_s for c in made] if by_speed else None, [c.error for c in made])
    return [FormatChoice(**{**c.as_dict(), "recommended": k == i, "rule": rule if k == i else ""})
            for k, c in enumerate(made)]


def _main_format(by_bytes: dict[str, int]) -> str:
    return max(by_bytes, key=by_bytes.get, default="f32")


def _trunk_parts(layout) -> list[tuple[int, str]]:
    """The trunk's matrices a token goes through (all but the embedding, read one row a token), by format."""
    by: dict[str, int] = {}
    for t in layout.trunk:
        if len(t.shape) > 1 and t.name != "token_embd":
            by[t.fmt] = by.get(t.fmt, 0) + t.nbytes
    return [(n, f) for f, n in by.items()]


def expert_choices(src: Source, trunk_format: str, top_k: int, working_bytes: int,
                   usable_bytes: int, speed: Callable[[str], float | None] | None = None) -> list[FormatChoice]:
    """The expert choices for ``src`` (empty for a dense model). ``working_bytes``
    is what a session needs besides the weights (attention state, scratch: the
    plan's, which do not depend on the formats); ``usable_bytes`` the RAM
    usable on this machine; ``speed`` the kernels' bytes per second by format
    (default: measured here, :func:`default_speed`)."""
    speed = speed or default_speed
    base = plan_layout(src, trunk_format, "auto")
    if not base.banks:
        return []
    n_weights = sum(_count(p["shape"]) * b.n_experts for b in base.banks for p in b.parts.values())
    made: list[FormatChoice] = []
    for fmt in EXPERT_CANDIDATES:
        layout = base if fmt == "auto" else plan_layout(src, trunk_format, fmt)
        stored = "+".join(sorted({p["dtype"] for b in layout.banks for p in b.parts.values()}))
        if fmt != "auto" and fmt not in stored.split("+"):
            continue            # no matrix has rows this format can hold: it would change nothing
        if fmt in STREAM_ONLY and any(c.fits_in_ram for c in made):
            continue            # offered only to a model that streams
        expert_bytes, cold = layout.expert_bytes(), layout.cold_bytes_per_token(top_k)
        if made and cold >= made[0].cold_bytes_per_token:
            continue            # no smaller than keeping the source's values: only a loss
        label, error, err = (f"Exact ({stored}, no loss)", "none", 0.0) if fmt == "auto" else LOSSY[fmt]
        fits = experts_fit(layout.trunk_size, expert_bytes, working_bytes, usable_bytes)
        tps = decode_tok_per_s(_trunk_parts(layout) + [(cold, layout.banks[0].parts["gate"]["dtype"])], speed) \
            if fits else None   # estimated only where the speed rule can apply
        made.append(FormatChoice(
            role="experts", format=fmt, stored=stored, label=label, exact=fmt == "auto",
            weight_error=error, bits_per_weight=expert_bytes * 8 / max(1, n_weights), nbytes=expert_bytes,
            container_bytes=layout.total_bytes(), cold_bytes_per_token=cold, fits_in_ram=fits, error=err,
            tok_per_s=tps))
    return _mark(made, lambda c: c.cold_bytes_per_token)


def trunk_choices(src: Source, expert_format: str, working_bytes: int, usable_bytes: int) -> list[FormatChoice]:
    """The trunk choices for ``src``: `auto` (q8_0 for a float trunk, a quantized
    source's own formats), iq4_xs and q4_0 when they are smaller."""
    base = plan_layout(src, "auto", expert_format)
    moe = bool(base.banks)
    made: list[FormatChoice] = []
    for fmt in TRUNK_CANDIDATES:
        layout = base if fmt == "auto" else plan_layout(src, fmt, expert_format)
        mats = [t for t in layout.trunk if len(t.shape) > 1]
        by_bytes: dict[str, int] = {}
        for t in mats:
            by_bytes[t.fmt] = by_bytes.get(t.fmt, 0) + t.nbytes
        stored = "+".join(sorted(by_bytes, key=lambda f: -by_bytes[f]))
        exact = all(t.fmt in ("f32", src.stored_format(t.source)) for t in mats)
        if fmt == "auto" and exact:
            label, error, err = f"As stored ({stored}, no loss)", "none", 0.0
        else:   # auto: what most of the trunk's bytes are stored as
            main = _main_format(by_bytes) if fmt == "auto" else fmt
            label, error, err = LOSSY.get(main, (main, "", 0.0))
        if made and layout.trunk_size >= made[0].nbytes:
            continue            # no smaller than auto: only a loss
        made.append(FormatChoice(
            role="trunk", format=fmt, stored=stored, label=label, exact=exact, weight_error=error,
            bits_per_weight=sum(t.nbytes for t in mats) * 8 / max(1, sum(_count(t.shape) for t in mats)),
            nbytes=layout.trunk_size, container_bytes=layout.total_bytes(), cold_bytes_per_token=0,
            fits_in_ram=trunk_fits(layout.trunk_size, working_bytes, usable_bytes, moe), error=err))
    return _mark(made, lambda c: c.nbytes, by_speed=False)


def recommended(choices: list[FormatChoice]) -> str:
    """The format value to use: the recommended choice's, or auto."""
    return next((c.format for c in choices if c.recommended), "auto")


def why(choice: FormatChoice, dense: bool = False) -> str:
    """Why a choice is (or would be) the recommended one."""
    if choice.rule == "speed":
        exact = "" if choice.exact else " (--expert-format auto keeps the exact values)"
        return (f"it is the fastest choice (about {choice.tok_per_s:.1f} tokens per second here, in RAM) whose "
                f"whole model fits in this computer's RAM with an error at most a 4-bit format's{exact}")
    if choice.role == "trunk":
        if dense:
            return ("it is the most accurate choice that fits in this computer's RAM" if choice.fits_in_ram else
                    "no choice fits in this computer's RAM, and this one is the smallest")
        if choice.fits_in_ram:
            return "it is the most accurate choice that leaves at least half of this computer's RAM to the expert cache"
        return "no choice leaves half of this computer's RAM to the expert cache, and this one is the smallest"
    if choice.fits_in_ram:
        return "it is the most accurate choice whose whole model fits in this computer's RAM"
    return ("no choice fits in this computer's RAM, so each token reads its uncached experts from the disk, "
            "and this one reads the fewest bytes per token")
