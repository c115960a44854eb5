"""How to store a model: the choices for its resident trunk and for its
experts, what each costs and loses, and the ones Ferry recommends on this
machine.

* **Trunk.** It stays in RAM, so its size comes off the expert cache: the
  recommendation is the most accurate choice whose trunk (with the session's
  attention state and scratch) leaves at least half of the usable RAM to the
  expert cache (a dense model: that fits in the usable RAM), else the
  smallest. Kimi K3's 56.7 G trunk weights are 62 GB at q8_0 (the `auto` of a
  float trunk, with the f32 routers and norms) but about 35 GB at q4_0, so on
  a 64 GB Mac it is q4_0.
* **Experts.** Every token reads its experts that are not cached, so their
  bits set the speed of a model that does not fit in RAM, and its accuracy.
  The recommendation is the most accurate choice whose whole model fits in
  the usable RAM; when none fits, the one that reads the fewest bytes per
  token (then the disk sets the speed, and a 3-bit code reads 2.7× fewer
  bytes than 8 bits). A model that fits is never made lossy for speed.

No Qt here: the wizard's Source page and `ferry check` show the same lists.
The error figures are the measured mean relative weight errors of
docs/bench-log/2026-12-03.md ("Three-bit experts: quality": real SmolLM2 weights and
MXFP4-sourced K3-shaped ones).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Callable

from app.convert import quant3
from app.convert.layout import plan_layout
from app.convert.sources import Source

#: `--trunk-format` / `--expert-format` value meaning "what this module recommends"
RECOMMENDED = "recommended"

#: The choices, from the most accurate to the smallest ("auto" is described
#: by what it resolves to).
EXPERT_CANDIDATES = ("auto", "q8_0", "q4_0", quant3.NAME)
TRUNK_CANDIDATES = ("auto", "q4_0")
#: Each lossy format's label and its measured typical relative weight error.
LOSSY = {"q8_0": ("8-bit (q8_0)", "about 0.6 %"), "q4_0": ("4-bit (q4_0)", "about 9 %"),
         "q4_1": ("4-bit (q4_1)", "about 10 %"), quant3.NAME: ("3-bit (q3_nl)", "about 18-22 %")}


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

    def as_dict(self) -> dict:
        return asdict(self)


def _count(shape) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def pick(fits: list[bool], sizes: list[int]) -> int:
    """The rule of both recommendations, on choices listed from the most
    accurate: the index of the first that fits, else of the smallest. `ferry
    plan --config` (app/plan_config.py) applies it to sizes costed from a bare
    config, so its formats are the ones a conversion will be recommended."""
    return next((i for i, f in enumerate(fits) if f), None) if any(fits) else min(range(len(sizes)),
                                                                                   key=sizes.__getitem__)


def trunk_fits(trunk_bytes: int, working_bytes: int, usable_bytes: int, moe: bool) -> bool:
    """The trunk test: a MoE model's trunk (with the session's state and
    scratch) leaves at least half of the usable RAM to the expert cache; a
    dense model fits in it."""
    return trunk_bytes + working_bytes <= (usable_bytes // 2 if moe else usable_bytes)


def experts_fit(trunk_bytes: int, expert_bytes: int, working_bytes: int, usable_bytes: int) -> bool:
    """The expert test: the whole model fits in the usable RAM."""
    return trunk_bytes + expert_bytes + working_bytes <= usable_bytes


def _mark(made: list[FormatChoice], smallest: Callable[[FormatChoice], int]) -> list[FormatChoice]:
    chosen = made[pick([c.fits_in_ram for c in made], [smallest(c) for c in made])]
    return [FormatChoice(**{**c.as_dict(), "recommended": c is chosen}) for c in made]


def expert_choices(src: Source, trunk_format: str, top_k: int, working_bytes: int,
                   usable_bytes: int) -> list[FormatChoice]:
    """The expert choices for ``src`` (empty for a dense model). ``working_bytes``
    is what a session needs besides the weights (attention state, scratch: the
    plan's, which do not depend on the formats); ``usable_bytes`` the RAM
    usable on this machine."""
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
        expert_bytes, cold = layout.expert_bytes(), layout.cold_bytes_per_token(top_k)
        if made and cold >= made[0].cold_bytes_per_token:
            continue            # no smaller than keeping the source's values: only a loss
        label, error = (f"Exact ({stored}, no loss)", "none") if fmt == "auto" else LOSSY[fmt]
        made.append(FormatChoice(
            role="experts", format=fmt, stored=stored, label=label, exact=fmt == "auto",
            weight_error=error, bits_per_weight=expert_bytes * 8 / max(1, n_weights), nbytes=expert_bytes,
            container_bytes=layout.total_bytes(), cold_bytes_per_token=cold,
            fits_in_ram=experts_fit(layout.trunk_size, expert_bytes, working_bytes, usable_bytes)))
    return _mark(made, lambda c: c.cold_bytes_per_token)


def trunk_choices(src: Source, expert_format: str, working_bytes: int, usable_bytes: int) -> list[FormatChoice]:
    """The trunk choices for ``src``: `auto` (q8_0 for a float trunk, a quantized
    source's own formats) and q4_0 when it is smaller."""
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
            label, error = f"As stored ({stored}, no loss)", "none"
        else:   # auto: what most of the trunk's bytes are stored as
            main = max(by_bytes, key=by_bytes.get, default="f32") if fmt == "auto" else fmt
            label, error = LOSSY.get(main, (main, ""))
        if made and layout.trunk_size >= made[0].nbytes:
            continue            # no smaller than auto: only a loss
        made.append(FormatChoice(
            role="trunk", format=fmt, stored=stored, label=label, exact=exact, weight_error=error,
            bits_per_weight=sum(t.nbytes for t in mats) * 8 / max(1, sum(_count(t.shape) for t in mats)),
            nbytes=layout.trunk_size, container_bytes=layout.total_bytes(), cold_bytes_per_token=0,
            fits_in_ram=trunk_fits(layout.trunk_size, working_bytes, usable_bytes, moe)))
    return _mark(made, lambda c: c.nbytes)


def recommended(choices: list[FormatChoice]) -> str:
    """The format value to use: the recommended choice's, or auto."""
    return next((c.format for c in choices if c.recommended), "auto")


def why(choice: FormatChoice, dense: bool = False) -> str:
    """Why a choice is (or would be) the recommended one."""
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
