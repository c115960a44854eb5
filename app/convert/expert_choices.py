"""How to store a mixture-of-experts model's experts: the choices, what each
costs (container size, bytes a token reads when none of its experts is in
RAM) and what it loses, and the one Ferry recommends on this machine.

Every token reads its experts that are not cached, so the bits per expert
weight set the speed of a model that does not fit in RAM, and they set its
accuracy. The rule: **the most accurate choice whose whole model fits in the
RAM that is usable; when none fits, the one that reads the fewest bytes per
token** (then the disk sets the speed, and a 3-bit code reads 2.7× fewer
bytes than 8 bits). A model that fits is never made lossy for speed.

No Qt here: the wizard's Source page and `ferry check` show the same list.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

from app.convert import quant3
from app.convert.layout import Layout, plan_layout
from app.convert.sources import Source

#: Candidates from the most accurate to the smallest. The error figures are
#: the measured mean relative weight errors of docs/BENCHMARKS.md ("Three-bit
#: experts: quality": real SmolLM2 weights / MXFP4-sourced K3-shaped ones).
CANDIDATES: tuple[tuple[str, str, str], ...] = (
    ("auto", "exact", "none"),
    ("q8_0", "8-bit (q8_0)", "about 0.6 %"),
    ("q4_0", "4-bit (q4_0)", "about 9 %"),
    (quant3.NAME, "3-bit (q3_nl)", "about 18-22 %"),
)


@dataclass(frozen=True)
class ExpertChoice:
    format: str                 #: the --expert-format value
    stored: str                 #: what the experts are stored as (e.g. "bf16" for auto), "+" joined when mixed
    label: str
    exact: bool                 #: no loss against the source's values
    weight_error: str           #: the measured typical relative weight error, as text
    bits_per_weight: float      #: all-in, over every expert weight
    expert_bytes: int           #: all expert records
    container_bytes: int
    cold_bytes_per_token: int   #: one token's experts, none cached
    fits_in_ram: bool           #: the whole model (and its working memory) fits in the usable RAM
    recommended: bool = False

    def as_dict(self) -> dict:
        return asdict(self)


def _stored(layout: Layout) -> str:
    kinds = sorted({p["dtype"] for b in layout.banks for p in b.parts.values()})
    return "+".join(kinds)


def _n_weights(layout: Layout) -> int:
    total = 0
    for b in layout.banks:
        for p in b.parts.values():
            n = 1
            for d in p["shape"]:
                n *= int(d)
            total += n * b.n_experts
    return total


def expert_choices(src: Source, trunk_format: str, top_k: int, working_bytes: int,
                   usable_bytes: int) -> list[ExpertChoice]:
    """The choices for ``src`` (empty for a dense model). ``working_bytes`` is
    what a session needs besides the weights (attention state, scratch: the
    plan's, which do not depend on the expert format); ``usable_bytes`` the
    RAM usable on this machine."""
    base = plan_layout(src, trunk_format, "auto")
    if not base.banks:
        return []
    n_weights = _n_weights(base)
    made: list[ExpertChoice] = []
    for fmt, label, error in CANDIDATES:
        layout = base if fmt == "auto" else plan_layout(src, trunk_format, fmt)
        stored = _stored(layout)
        if fmt != "auto" and fmt not in stored.split("+"):
            continue            # no matrix has rows this format can hold: it would change nothing
        expert_bytes = sum(b.n_experts * b.record_size for b in layout.banks)
        cold = sum(b.record_size for b in layout.banks) * top_k
        if made and cold >= made[0].cold_bytes_per_token:
            continue            # no smaller than keeping the source's values: only a loss
        fits = layout.trunk_size + expert_bytes + working_bytes <= usable_bytes
        made.append(ExpertChoice(
            format=fmt, stored=stored, label=label if fmt != "auto" else f"Exact ({stored}, no loss)",
            exact=fmt == "auto", weight_error=error, bits_per_weight=expert_bytes * 8 / max(1, n_weights),
            expert_bytes=expert_bytes, container_bytes=layout.total_bytes(), cold_bytes_per_token=cold,
            fits_in_ram=fits))
    pick = next((c for c in made if c.fits_in_ram), None) or min(made, key=lambda c: c.cold_bytes_per_token)
    return [ExpertChoice(**{**c.as_dict(), "recommended": c is pick}) for c in made]


def recommended(choices: list[ExpertChoice]) -> str:
    """The --expert-format value to use: the recommended choice's, or auto."""
    return next((c.format for c in choices if c.recommended), "auto")


def why(choice: ExpertChoice) -> str:
    """One line on why a choice is (or would be) the recommended one."""
    if choice.fits_in_ram:
        return "it is the most accurate choice whose whole model fits in this computer's RAM"
    return ("no choice fits in this computer's RAM, so each token reads its uncached experts from the disk, "
            "and this one reads the fewest bytes per token")
