"""What a repository on the hub needs on this machine, before its weights
move: `ferry get --plan` and the wizard's download page.

Only small files are fetched: the file list with sizes, config.json, the
shard index, the tokenizer files, and each safetensors shard's header (two
ranged reads of a few kB). From those the repository opens as a
:class:`~app.get.staged.StagedSource`, and the plan is the one `ferry check`
makes for a folder on disk (app.convert.validate.plan_report): the same
recommended formats, container size and RAM plan (floor, recommended
budget) that the conversion will then have. A GGUF repository is planned
from the chosen file's first megabytes (its metadata and tensor table).

On top of that: the disk needed at the peak of the download and conversion
(with --delete-source: the container plus the shards in flight, simulated
shard by shard in the order the converter reads them), a tok/s estimate from
this machine's measured disk read speed (app.memory.disk_probe) and kernel speed
(app.engine.speed), and a verdict: runs well, runs slowly, or does not fit.
"""
from __future__ import annotations

import json
import os
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from app.store.private import private_dir
from app.get import hub
from app.get.hub import GetError, Repo
from app.untrusted import shown

#: At or above this many tokens per second a model "runs well".
WELL_TOK_S = 4.0
#: Shards downloaded beyond the one the converter waits for (with --delete-source).
AHEAD = 1
#: The first bytes of a GGUF file fetched to plan it (grown when its metadata is longer).
GGUF_HEAD = 8 << 20
#: ... and never more than this (a real GGUF's metadata, vocabulary included, is a few tens of MB).
GGUF_HEAD_LIMIT = 256 << 20


@dataclass
class GetPlan:
    repo_id: str
    commit: str
    kind: str                               #: "hf" or "gguf"
    file: str | None = None                 #: the GGUF file planned
    ggufs: list[tuple[str, int]] = field(default_factory=list)   #: a GGUF repo's files with sizes
    architecture: str | None = None
    download_bytes: int = 0
    container_bytes: int = 0
    peak_disk_bytes: int = 0                #: download + container side by side
    peak_disk_delete_bytes: int = 0         #: with --delete-source
    free_disk_bytes: int | None = None
    trunk_format: str = "auto"
    expert_format: str = "auto"
    floor_bytes: int = 0
    recommended_budget: int = 0
    everything_bytes: int = 0               #: a budget that caches every expert
    usable_ram: int = 0
    total_ram: int = 0
    cold_bytes_per_token: int = 0           #: one token's experts, none cached
    record_bytes: int = 0                   #: one expert record
    n_records: int = 0                      #: expert records in all
    top_k: int = 0
    kernel_format: str = ""                 #: what the per-token matrices are stored as (the speed measured)
    trunk_kernel_format: str = ""           #: the trunk's matrices, by bytes (a MoE model's trunk speed)
    expected_read_per_token: int = 0        #: at the recommended budget (app.engine.speed.expected_hit_rate)
    compute_bytes_per_token: int = 0        #: weights the kernels go through per token
    disk_read_bytes_per_s: float | None = None
    kernel_bytes_per_s: float | None = None
    trunk_kernel_bytes_per_s: float | None = None   #: the trunk's kernels (None: kernel_bytes_per_s)
    tok_per_s: float | None = None
    verdict: str = ""                       #: "runs well" | "runs slowly" | "does not fit"
    reason: str = ""
    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    trunk_choices: list[dict] = field(default_factory=list)
    expert_choices: list[dict] = field(default_factory=list)
    shard_units: dict[str, list[str]] = field(default_factory=dict)   #: shard -> units that read it
    unit_order: list[str] = field(default_factory=list)
    unit_bytes: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for k in ("shard_units", "unit_order", "unit_bytes"):
            d.pop(k)
        return d


# ----------------------------------------------------------- the staged source

def stage_hf(repo: Repo, folder: Path, state: Path, wait=None):
    """Download the small files into ``folder``, the shard headers into
    ``state``; return the StagedSource and the tokenizer section."""
    from app.convert import tokenizer_files
    from app.convert.config_check import load_config
    from app.get.staged import StagedSource

    private_dir(folder)
    private_dir(state)
    for f in repo.small:
        path = hub.inside(folder, f.name, repo)
        if not path.is_file() or path.stat().st_size != f.size:
            hub.download(repo, f.name, folder)
    if not (folder / "config.json").is_file():
        raise GetError(f"{repo.repo_id} has no config.json: not a Hugging Face checkpoint"
                       + (" (it has GGUF files: choose one)" if repo.ggufs else ""))
    heads = {}
    for f in repo.shards:
        cached = hub.inside(state, f"{f.name}.head", repo)
        if not cached.is_file():
            data = hub.fetch_safetensors_header(repo, f.name)
            tmp = cached.with_suffix(".tmp")
            tmp.write_bytes(data)
            os.replace(tmp, cached)
        heads[f.name] = (cached.read_bytes(), f.size)
    if not heads:
        raise GetError(f"{repo.repo_id} has no .safetensors files" + (" (it has GGUF files)" if repo.ggufs else ""))
    identity = {"kind": "hub", "repo": repo.repo_id, "commit": repo.commit,
                "files": [[f.name, f.size, f.sha256] for f in repo.shards]}
    kwargs = {"wait": wait} if wait is not None else {}
    src = StagedSource(folder, heads, identity, **kwargs)
    config = load_config(folder / "config.json")
    tok = tokenizer_files.from_hf(folder, config)[0]
    return src, tok


def unit_map(src, layout) -> tuple[list[str], dict[str, set[str]], dict[str, int]]:
    """The converter's units in the order it writes them, the shards each one
    reads, and each unit's bytes in the container."""
    where = {n: src.ckpt.info(n).path.name for n in src.ckpt.tensor_names()}

    def shards_of(name: str) -> set[str]:
        base = name.partition("@")[0]
        stem = base[:-len(".weight")] if base.endswith(".weight") else base
        return {where[n] for n in (base, stem + ".weight_packed", stem + ".weight_scale",
                                   base + "_scale_inv", stem + ".weight_scale_inv") if n in where}

    order, reads, size = [], {}, {}
    banks = {b.layer: b for b in layout.banks}
    segments = sorted({t.layer for t in layout.trunk})
    ends = dict(zip(segments, layout.segment_ends))
    prev = 0
    for seg in segments:
        unit = f"trunk:{seg}"
        order.append(unit)
        reads[unit] = set().union(*[shards_of(t.source) for t in layout.trunk if t.layer == seg])
        size[unit] = ends[seg] - prev
        prev = ends[seg]
        if seg in banks:
            b = banks.pop(seg)
            unit = f"bank:{seg}"
            order.append(unit)
            reads[unit] = set().union(*[shards_of(p) for parts in src.spec.experts[seg] for p in parts.values()])
            size[unit] = b.file_size
    return order, reads, size


def shard_order(order: list[str], reads: dict[str, set[str]]) -> list[str]:
    """Shards in the order the converter first needs them."""
    out: list[str] = []
    for u in order:
        for s in sorted(reads[u]):
            if s not in out:
                out.append(s)
    return out


def simulate_peak(order, reads, unit_bytes, shard_bytes: dict[str, int], ahead: int = AHEAD,
                  delete: bool = True) -> int:
    """The most bytes on disk at once (container so far + shards present),
    downloading ``ahead`` shards beyond the one the converter waits for and
    deleting a shard once every unit reading it is written."""
    seq = shard_order(order, reads)
    seq += [s for s in shard_bytes if s not in seq]
    if not delete:
        return sum(shard_bytes.values()) + sum(unit_bytes.values())
    left = {s: sum(1 for u in order if s in reads[u]) for s in seq}
    present: set[str] = set()
    fetched = 0
    written = peak = 0
    for u in order:
        need = max((seq.index(s) for s in reads[u]), default=-1)
        while fetched < len(seq) and fetched <= need + ahead:
            present.add(seq[fetched])
            fetched += 1
            peak = max(peak, written + sum(shard_bytes[s] for s in present))
        written += unit_bytes[u]
        peak = max(peak, written + sum(shard_bytes[s] for s in present))
        for s in reads[u]:
            left[s] -= 1
            if left[s] == 0:
                present.discard(s)
    # shards no unit reads (a vision tower) are downloaded too, one at a time, then deleted
    extra = max((shard_bytes[s] for s in seq if left.get(s, 0) == 0 and not any(s in reads[u] for u in order)),
                default=0)
    return max(peak, written + extra)


# ----------------------------------------------------------- the estimate

def estimate(plan: GetPlan, budget: int, everything: int, record: int, top_k: int, n_records: int,
             disk_bps: float | None, kernel_bps: float | None, trunk_kernel_bps: float | None = None) -> None:
    """Expected read per token and tok/s at ``budget``: the cache holds
    (budget - floor) / record + top_k records of n_records, and hits at the
    rate real routing gives that many (app.engine.speed.expected_hit_rate:
    the engine's policy on a real routing trace, by the cache's size in
    token working sets); each token computes over the trunk and its experts
    and reads its misses from disk, the reads overlapped with the experts'
    compute (app.engine.speed.token_seconds, the speed model checked on K3's
    real expert shape); the trunk at ``trunk_kernel_bps`` (default the
    experts' ``kernel_bps``)."""
    from app.engine.speed import expected_hit_rate, token_seconds

    moe_layers = round(plan.cold_bytes_per_token / (top_k * record)) if top_k and record else 0   # a token visits each
    if n_records and record:
        cached = min(n_records, max(0, (budget - plan.floor_bytes) // record + top_k))
        hit = expected_hit_rate(cached, top_k, moe_layers, n_records) if budget < everything else 1.0
        plan.expected_read_per_token = int(plan.cold_bytes_per_token * (1 - hit))
    experts = min(plan.cold_bytes_per_token, plan.compute_bytes_per_token)
    seconds = token_seconds(plan.compute_bytes_per_token - experts, experts, plan.expected_read_per_token,
                            kernel_bps, disk_bps, trunk_kernel_bps=trunk_kernel_bps, record_bytes=record,
                            layers=moe_layers)
    if seconds:
        plan.tok_per_s = 1.0 / seconds


def judge(plan: GetPlan, delete_source: bool | None = None) -> None:
    """The verdict and its reason, in words for people."""
    from app.units import size

    if plan.problems:
        plan.verdict, plan.reason = "does not fit", "; ".join(plan.problems)
        return
    if plan.floor_bytes > plan.usable_ram:
        plan.verdict = "does not fit"
        plan.reason = (f"it needs at least {size(plan.floor_bytes)} of RAM (trunk, state and one layer of experts); "
                       f"this machine has {size(plan.usable_ram)} usable")
        return
    free = plan.free_disk_bytes
    if free is not None and plan.peak_disk_delete_bytes > free:
        plan.verdict = "does not fit"
        plan.reason = (f"the download and conversion need {size(plan.peak_disk_delete_bytes)} of disk at the peak "
                       f"even deleting each shard once converted; {size(free)} is free")
        return
    disk_note = ""
    if free is not None and plan.peak_disk_bytes > free:
        disk_note = (f"; the disk is too small for the download and the container side by side "
                     f"({size(plan.peak_disk_bytes)}, {size(free)} free): use --delete-source "
                     f"(peak {size(plan.peak_disk_delete_bytes)})")
    tps = plan.tok_per_s
    speed = f"about {tps:.1f} tokens per second" if tps else "speed unknown"
    if tps is not None and tps >= WELL_TOK_S:
        plan.verdict = "runs well"
        where = "from RAM" if not plan.expected_read_per_token else "streaming experts from the disk"
        plan.reason = f"{speed} {where}" + disk_note
    else:
        plan.verdict = "runs slowly"
        plan.reason = (f"{speed}: each token reads about {size(plan.expected_read_per_token)} of experts from a "
                       f"disk that gives {size(plan.disk_read_bytes_per_s or 0)}/s" if plan.expected_read_per_token
                       else f"{speed}: the kernels are the limit") + disk_note


# ----------------------------------------------------------- entry point

def plan_repo(repo_id: str, revision: str | None = None, into: str | os.PathLike | None = None, *,
              trunk_format: str = "recommended", expert_format: str = "recommended", file: str | None = None,
              memory=None, disk_bps: float | None = None, kernel_bps: float | None = None,
              repo: Repo | None = None, work: Path | None = None, speed=None) -> GetPlan:
    """The plan of ``repo_id`` on this machine. ``into``: where it would go
    (its free space counts; default: the models folder). ``work``: where the
    small files and headers go (default: a temporary folder, removed).
    ``disk_bps`` / ``kernel_bps``: measured here when not given; ``speed``:
    the kernels' bytes per second by format for the recommendation's speed
    rule (app.convert.format_choices; default measured here)."""
    repo = repo or hub.open_repo(repo_id, revision)
    if work is None:
        with tempfile.TemporaryDirectory(prefix="ferry-get-plan-") as tmp:
            return plan_repo(repo_id, revision, into, trunk_format=trunk_format, expert_format=expert_format,
                             file=file, memory=memory, disk_bps=disk_bps, kernel_bps=kernel_bps, repo=repo,
                             work=Path(tmp), speed=speed)
    into = Path(into) if into is not None else _default_into()
    if repo.shards and (repo.small and any(f.name == "config.json" for f in repo.small)):
        plan = _plan_hf(repo, work, trunk_format, expert_format, memory, speed)
    elif repo.ggufs:
        plan = _plan_gguf(repo, work, file, trunk_format, expert_format, memory, speed)
    else:
        raise GetError(f"{repo.repo_id} has neither a safetensors checkpoint (config.json and .safetensors) "
                       f"nor a GGUF file")
    existing = into if into.exists() else next((p for p in into.parents if p.exists()), None)
    plan.free_disk_bytes = hub.free_bytes(existing) if existing is not None else None
    if not plan.problems:
        if disk_bps is None:
            disk_bps = _measure_disk(existing)
        if kernel_bps is None:
            from app.convert.format_choices import default_speed
            kernel_bps = (speed or default_speed)(plan.kernel_format)
            if plan.trunk_kernel_format and plan.trunk_kernel_format != plan.kernel_format:
                plan.trunk_kernel_bytes_per_s = (speed or default_speed)(plan.trunk_kernel_format)
        plan.disk_read_bytes_per_s, plan.kernel_bytes_per_s = disk_bps, kernel_bps
        finish_estimate(plan)
    judge(plan)
    return plan


def _default_into() -> Path:
    from app.paths import models_dir
    return models_dir()


def _measure_disk(folder: Path | None) -> float | None:
    if folder is None:
        return None
    from app.memory.disk_probe import probe
    try:
        return probe(folder, size=64 << 20, max_seconds=5.0).read_bytes_per_s
    except OSError:
        return None


def _fill(plan: GetPlan, report, memory) -> None:
    """The figures of a validate.SourceReport into the plan."""
    plan.architecture = report.architecture
    plan.problems = [str(p) for p in report.problems]
    plan.warnings = list(report.warnings)
    if not report.ok:
        return
    p = report.plan
    plan.trunk_format, plan.expert_format = report.trunk_format, report.expert_format
    plan.container_bytes = report.container_bytes
    plan.floor_bytes, plan.recommended_budget, plan.everything_bytes = p.floor, p.recommended, p.everything
    plan.usable_ram, plan.total_ram = p.machine.usable, p.machine.total
    plan.cold_bytes_per_token = report.cold_bytes_per_token
    plan.trunk_choices = [c.as_dict() for c in report.trunk_choices]
    plan.expert_choices = [c.as_dict() for c in report.expert_choices]
    layout = report.layout
    embd = sum(t.nbytes for t in layout.trunk if t.name == "token_embd")
    plan.compute_bytes_per_token = layout.trunk_size - embd + report.cold_bytes_per_token
    plan.record_bytes, plan.top_k = report.record_bytes, report.top_k
    by: dict[str, int] = {}
    for t in layout.trunk:
        by[t.fmt] = by.get(t.fmt, 0) + t.nbytes
    plan.trunk_kernel_format = max(by, key=by.get) if by else ""
    plan.kernel_format = layout.banks[0].parts["gate"]["dtype"] if layout.banks else plan.trunk_kernel_format
    plan.n_records = sum(b.n_experts for b in layout.banks)


def _plan_hf(repo: Repo, work: Path, t: str, e: str, memory, speed=None) -> GetPlan:
    from app.convert.validate import SourceReport, plan_report

    folder, state = work / repo.name, work / f"{repo.name}.get"
    src, tok = stage_hf(repo, folder, state)
    report = plan_report(SourceReport(folder, kind="hf"), src, tok, t, e, memory=memory, speed=speed)
    plan = GetPlan(repo.repo_id, repo.commit, "hf")
    plan.download_bytes = sum(f.size for f in repo.shards) + sum(f.size for f in repo.small)
    _fill(plan, report, memory)
    if report.ok:
        order, reads, unit_bytes = unit_map(src, report.layout)
        shard_bytes = {f.name: f.size for f in repo.shards}
        plan.unit_order, plan.unit_bytes = order, unit_bytes
        plan.shard_units = {s: [u for u in order if s in reads[u]] for s in shard_bytes}
        small = sum(f.size for f in repo.small)
        plan.peak_disk_bytes = small + simulate_peak(order, reads, unit_bytes, shard_bytes, delete=False)
        plan.peak_disk_delete_bytes = small + simulate_peak(order, reads, unit_bytes, shard_bytes)
    return plan


def _plan_gguf(repo: Repo, work: Path, file: str | None, t: str, e: str, memory, speed=None) -> GetPlan:
    from app.convert.validate import validate_source

    plan = GetPlan(repo.repo_id, repo.commit, "gguf", ggufs=[(f.name, f.size) for f in repo.ggufs])
    if file is None:
        if len(repo.ggufs) > 1:
            plan.problems = ["this repository has several GGUF files (quantizations): choose one with --file"]
            return plan
        file = repo.ggufs[0].name
    f = repo.file(file)
    plan.file = file
    state = work / f"{repo.name}.get"
    private_dir(state)
    path = hub.inside(state, Path(file).name, repo)     # the header, the rest sparse: a plan-only copy
    head = GGUF_HEAD
    while True:
        data = hub.fetch_range(repo, file, 0, min(head, f.size))
        with open(path, "wb") as out:          # the header, the rest left sparse
            out.write(data)
            out.truncate(f.size)
        report = validate_source(path, t, e, memory=memory, speed=speed)
        short = any("ended after" in str(p) or "truncated" in str(p) for p in report.problems)
        if not short or head >= f.size:
            break
        if head >= GGUF_HEAD_LIMIT:
            plan.problems = [f"{shown(file)}: its metadata and tensor table do not end within the first "
                             f"{GGUF_HEAD_LIMIT >> 20} MiB: not a GGUF file Ferry can plan"]
            return plan
        head = min(head * 4, GGUF_HEAD_LIMIT)
    plan.download_bytes = f.size
    _fill(plan, report, memory)
    if report.ok:
        plan.peak_disk_bytes = plan.peak_disk_delete_bytes = f.size + plan.container_bytes
    return plan


def finish_estimate(plan: GetPlan) -> None:
    if plan.problems or not plan.floor_bytes:
        return
    estimate(plan, plan.recommended_budget, plan.everything_bytes, plan.record_bytes, plan.top_k,
             plan.n_records, plan.disk_read_bytes_per_s, plan.kernel_bytes_per_s, plan.trunk_kernel_bytes_per_s)


def describe(plan: GetPlan) -> str:
    """The plan in words, as `ferry get --plan` prints it."""
    from app.units import size

    lines = [f"{plan.repo_id} @ {plan.commit[:12]}" + (f" ({plan.file})" if plan.file else "")
             + (f": {plan.architecture}" if plan.architecture else "")]
    if plan.ggufs and (plan.file is None or len(plan.ggufs) > 1):
        lines.append("GGUF files (choose with --file):")
        lines += [f"  {'*' if n == plan.file else ' '} {n}  {size(s)}" for n, s in plan.ggufs]
    for p in plan.problems:
        lines.append(f"problem: {p}")
    for w in plan.warnings:
        lines.append(f"warning: {w}")
    if not plan.problems:
        lines += [
            f"download {size(plan.download_bytes)}; container {size(plan.container_bytes)} "
            f"(trunk {plan.trunk_format}, experts {plan.expert_format})",
            f"disk at the peak: {size(plan.peak_disk_bytes)} keeping the download, "
            f"{size(plan.peak_disk_delete_bytes)} with --delete-source"
            + (f"; {size(plan.free_disk_bytes)} free" if plan.free_disk_bytes is not None else ""),
            f"RAM: floor {size(plan.floor_bytes)}, recommended budget {size(plan.recommended_budget)} of "
            f"{size(plan.usable_ram)} usable",
        ]
        if plan.cold_bytes_per_token:
            lines.append(f"per token: {size(plan.cold_bytes_per_token)} of experts, about "
                         f"{size(plan.expected_read_per_token)} read from disk at the recommended budget")
        speeds = []
        if plan.disk_read_bytes_per_s:
            speeds.append(f"disk {size(plan.disk_read_bytes_per_s)}/s")
        if plan.kernel_bytes_per_s:
            speeds.append(f"kernels {size(plan.kernel_bytes_per_s)}/s")
        if speeds:
            lines.append("measured here: " + ", ".join(speeds))
    lines.append(f"verdict: {plan.verdict}: {plan.reason}")
    return "\n".join(shown(line) for line in lines)


def to_json(plan: GetPlan) -> str:
    return json.dumps(plan.as_dict(), indent=1)
