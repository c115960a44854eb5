"""The RAM plan of a container and the budget to open it with: what
`ferry plan` prints and what the CLI and the app use when no budget is given."""
from __future__ import annotations

import os
from dataclasses import asdict, dataclass, replace

from app.memory.budget import BudgetChoice, MachineMemory, auto_budget, machine_memory
from app.units import size
from app.activations import is_exact
from app.engine.binding import MemoryPlan, container_plan


@dataclass(frozen=True)
class Plan:
    n_ctx: int
    floor: int            #: the least budget that runs
    trunk: int
    state: int
    scratch: int
    min_cache: int
    policy: int           #: the cache policy's state at the floor (in floor)
    record: int           #: one expert record
    token_set: int        #: one token's expert working set
    everything: int       #: a budget that caches every expert
    recommended: int      #: what Ferry would choose on this machine
    reason: str
    machine: MachineMemory

    def as_dict(self) -> dict:
        d = asdict(self)
        d["machine"] = asdict(self.machine)
        return d


def min_cache_bytes(p: MemoryPlan) -> int:
    """The floor's expert records: what is left of it after every other part."""
    return p.floor_bytes - p.trunk_bytes - p.state_bytes - p.scratch_bytes - p.policy_floor_bytes


def everything_bytes(p: MemoryPlan) -> int:
    """A budget that caches every expert (plus the top-k read buffers), with
    the cache policy's state over all of them."""
    top_k_records = min_cache_bytes(p) // p.record_bytes if p.record_bytes else 0
    return (p.trunk_bytes + p.state_bytes + p.scratch_bytes + p.expert_bytes + p.policy_bytes
            + top_k_records * p.record_bytes)


def recommend(p: MemoryPlan, memory: MachineMemory | None = None) -> BudgetChoice:
    """THE budget rule: the budget Ferry opens a model with when the user names
    none, and the one the RAM gauge marks as recommended."""
    return auto_budget(p.floor_bytes, p.token_set_bytes, everything_bytes(p), memory or machine_memory())


def plan_container(path: str | os.PathLike, n_ctx: int, memory: MachineMemory | None = None, *,
                   activations: str | None = None) -> Plan:
    """The plan of a container from its manifest, for the engine opened with
    these ``activations`` (None: the default; 8-bit activations add a little
    scratch, none for a model without weights they apply to)."""
    p: MemoryPlan = container_plan(path, n_ctx)
    if not is_exact(activations):
        p = replace(p, scratch_bytes=p.scratch_bytes + p.q8_bytes, total_bytes=p.total_bytes + p.q8_bytes,
                    floor_bytes=p.floor_bytes + p.q8_bytes)
    min_cache = min_cache_bytes(p)
    everything = everything_bytes(p)
    memory = memory or machine_memory()
    choice: BudgetChoice = recommend(p, memory)
    return Plan(n_ctx=int(p.n_ctx), floor=p.floor_bytes, trunk=p.trunk_bytes, state=p.state_bytes, scratch=p.scratch_bytes,
                min_cache=min_cache, policy=p.policy_floor_bytes, record=p.record_bytes, token_set=p.token_set_bytes, everything=everything,
                recommended=choice.budget, reason=choice.reason, machine=memory)


def describe(plan: Plan, budget: int | None = None) -> str:
    lines = [
        f"floor at a {plan.n_ctx}-token context: {size(plan.floor)}",
        f"  trunk {size(plan.trunk)}, attention state {size(plan.state)}, scratch {size(plan.scratch)}, "
        f"minimum expert cache {size(plan.min_cache)}, cache policy state {size(plan.policy)}",
    ]
    if plan.record:
        lines.append(f"expert record {size(plan.record)}; one token's working set {size(plan.token_set)}; "
                     f"caching every expert needs {size(plan.everything)}")
    lines.append(f"recommended budget: {size(plan.recommended)} ({plan.reason})")
    lines.append(f"machine: {size(plan.machine.total)} RAM, {size(plan.machine.usable)} usable "
                 f"({plan.machine.source})")
    if budget is not None:
        verdict = "runs" if budget >= plan.floor else "is below the floor and will be refused"
        lines.append(f"a budget of {size(budget)} {verdict}")
    return "\n".join(lines)

