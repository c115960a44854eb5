"""Check a source before anything is written: what the wizard's Source page
shows. Every problem found is reported, each naming the file and what is wrong
with it; a source without problems also gets its sizes and the RAM plan of the
container it will become.

    report = validate_source("/models/Kimi-K2")
    if report.ok:
        print(report.container_bytes, report.plan.floor, report.plan.recommended)
    else:
        for p in report.problems: print(p)      # "model-00007-of-00064.safetensors: ..."
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from app.convert import tokenizer_files
from app.convert.arch import spec_from_hf
from app.convert.config_check import load_config
from app.convert.errors import SourceError, load_json_file
from app.convert.gguf_file import GGUFFile
from app.convert.layout import Layout, plan_layout
from app.convert.safetensors_file import INDEX_NAME, Checkpoint
from app.convert.sources import GGUFSource, HFSource, Source
from app.untrusted import shown

if TYPE_CHECKING:
    from app.memory.budget import MachineMemory
    from app.memory.plan import Plan

#: The context the plan is made for (the engine's default).
PLAN_CTX = 4096


@dataclass
class SourceReport:
    path: Path
    kind: str | None = None                 #: "hf" or "gguf"
    architecture: str | None = None         #: e.g. "DeepseekV3ForCausalLM", "gguf:llama"
    name: str = ""                          #: the model's name: the GGUF file's (without .gguf) or the folder's
    problems: list[SourceError] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    source_bytes: int = 0                   #: the source files on disk
    container_bytes: int = 0                #: what the container will take (trunk + banks)
    trunk_bytes: int = 0
    n_layers: int = 0
    n_moe_layers: int = 0
    n_experts: int = 0
    top_k: int = 0
    record_bytes: int = 0                   #: one expert record
    cold_bytes_per_token: int = 0           #: one token's experts, all read from disk
    plan: Any = None                        #: app.memory.plan.Plan of the container, when ok
    trunk_format: str = "auto"              #: the --trunk-format this report was made for ("recommended" resolved)
    expert_format: str = "auto"             #: the --expert-format this report was made for ("recommended" resolved)
    #: how the trunk / the experts could be stored (app.convert.format_choices), one of each marked
    #: recommended; no expert choices for a dense model
    trunk_choices: list = field(default_factory=list)
    expert_choices: list = field(default_factory=list)
    layout: Layout | None = None
    files: list[Path] = field(default_factory=list)   #: the source files read

    @property
    def ok(self) -> bool:
        return not self.problems and self.plan is not None

    def add(self, path: str | os.PathLike, problem: str) -> None:
        self.add_error(SourceError(path, problem))

    def add_error(self, err: SourceError) -> None:
        if not any(str(p) == str(err) for p in self.problems):
            self.problems.append(err)


def _guard(report: SourceReport, where: Path, fn, *args):
    """Run one check; its SourceError (or any other failure, named after
    ``where``) becomes a problem of the report. Returns None on failure."""
    try:
        return fn(*args)
    except SourceError as exc:
        report.add_error(exc)
    except (OSError, ValueError, KeyError, TypeError, IndexError, AttributeError, ArithmeticError) as exc:
        report.add(where, f"cannot be read: {shown(exc)}")
    return None


def validate_source(path: str | os.PathLike, trunk_format: str = "auto", expert_format: str = "auto",
                    n_ctx: int = PLAN_CTX, memory=None, speed=None) -> SourceReport:
    """Everything that would stop (or spoil) the conversion of ``path``. Either
    format may be "recommended": it is resolved (app.convert.format_choices)
    and the sizes and plan are those of the recommended container."""
    p = Path(path)
    report = SourceReport(p)
    if not p.exists():
        report.add(p, "does not exist")
        return report
    if p.is_dir():
        src, tokenizer = _check_hf(report, p)
    else:
        src, tokenizer = _check_gguf(report, p)
    if src is None or report.problems:
        return report
    return plan_report(report, src, tokenizer, trunk_format, expert_format, n_ctx, memory, speed)


def plan_report(report: SourceReport, src: Source, tokenizer: dict, trunk_format: str = "auto",
                expert_format: str = "auto", n_ctx: int = PLAN_CTX, memory=None, speed=None) -> SourceReport:
    """The sizes, the format choices and the RAM plan of an opened source
    (validate_source's second half; `ferry get --plan` gives it a source made
    of the repository's shard headers). ``speed``: the kernels' bytes per
    second by format for the speed rule (default: measured here)."""
    p = report.path
    from app.convert.format_choices import RECOMMENDED, expert_choices, recommended, trunk_choices

    t0 = "auto" if trunk_format == RECOMMENDED else trunk_format
    e0 = "auto" if expert_format == RECOMMENDED else expert_format
    layout = _guard(report, p, plan_layout, src, t0, e0)
    if layout is None:
        return report
    _describe(report, src, layout)
    plan = _guard(report, p, plan_source, src, layout, tokenizer, n_ctx, memory)
    if plan is None:
        return report
    working, usable = plan.state + plan.scratch, plan.machine.usable
    report.trunk_choices = _guard(report, p, trunk_choices, src, e0, working, usable) or []
    t = recommended(report.trunk_choices) if trunk_format == RECOMMENDED else trunk_format
    if layout.banks:
        report.expert_choices = _guard(report, p, expert_choices, src, t, report.top_k, working, usable,
                                       speed) or []
    e = recommended(report.expert_choices) if expert_format == RECOMMENDED else expert_format
    if (t, e) != (t0, e0):      # plan what will be converted: the recommended formats
        layout = _guard(report, p, plan_layout, src, t, e)
        if layout is None:
            return report
        _describe(report, src, layout)
        plan = _guard(report, p, plan_source, src, layout, tokenizer, n_ctx, memory)
    report.trunk_format, report.expert_format = t, e
    report.plan = plan
    return report


def _check_hf(report: SourceReport, d: Path) -> tuple[Source | None, dict | None]:
    report.kind = "hf"
    report.name = d.name
    config_path = d / "config.json"
    if not config_path.is_file():
        has_st = any(d.glob("*.safetensors"))
        report.add(config_path, "is missing: this folder is not a Hugging Face checkpoint" +
                   (" (it has .safetensors files, but every checkpoint also needs its config.json)" if has_st
                    else " (choose the folder that holds config.json and the .safetensors files)"))
        return None, None
    config = _guard(report, config_path, load_config, config_path)
    if isinstance(config, dict):
        archs = config.get("architectures") or []
        report.architecture = archs[0] if archs else None
        # "Not supported" first: the most useful thing to know about a download.
        _guard(report, config_path, spec_from_hf, config)
    elif config is not None:
        report.add(config_path, "is not a JSON object")
    for problem in Checkpoint.validate(d):
        report.add_error(problem)
    report.files = sorted(x for x in d.glob("*.safetensors") if x.is_file())
    report.source_bytes = sum(x.stat().st_size for x in report.files)
    if not isinstance(config, dict):
        return None, None
    tok = _guard(report, d, tokenizer_files.from_hf, d, config)
    if report.problems:
        return None, None
    ckpt = _guard(report, d, Checkpoint, d)
    if ckpt is None:
        return None, None
    _check_shard_sizes(report, ckpt, d)
    src = _guard(report, d, HFSource, d)
    return src, (tok[0] if tok else None)


def _check_shard_sizes(report: SourceReport, ckpt: Checkpoint, d: Path) -> None:
    """Each shard ends where its last tensor does; the index's total matches."""
    ends: dict[Path, int] = {}
    total = 0
    for name in ckpt.tensor_names():
        info = ckpt.info(name)
        ends[info.path] = max(ends.get(info.path, 0), info.offset + info.nbytes)
        total += info.nbytes
    for shard, end in ends.items():
        size = shard.stat().st_size
        if size > end:
            report.add(shard, f"is {size - end} bytes longer than its tensors: damaged, or from a different "
                              f"download than the rest (download it again)")
    index = d / INDEX_NAME
    if index.is_file():
        try:
            declared = (load_json_file(index).get("metadata") or {}).get("total_size")
        except (SourceError, AttributeError):
            declared = None
        if isinstance(declared, int) and declared != total and abs(declared - total) > 0.01 * total:
            report.warnings.append(f"{INDEX_NAME} says the weights take {declared} bytes; the shards hold "
                                   f"{total} (some releases count differently; the shards are what is converted)")


def _check_gguf(report: SourceReport, f: Path) -> tuple[Source | None, dict | None]:
    report.kind = "gguf"
    report.files = [f]
    report.source_bytes = f.stat().st_size
    try:
        with open(f, "rb") as fh:
            magic = fh.read(4)
    except OSError as exc:
        report.add(f, f"cannot be read: {exc.strerror or exc}")
        return None, None
    if magic != b"GGUF":
        report.add(f, "is neither a checkpoint folder nor a GGUF file (a GGUF file starts with 'GGUF'; for a "
                      "Hugging Face checkpoint choose its folder)")
        return None, None
    gguf = _guard(report, f, GGUFFile, f)
    if gguf is None:
        return None, None
    report.architecture = f"gguf:{gguf.metadata.get('general.architecture', '?')}"
    report.name = f.stem    # the file's name (a GGUF's general.name is often a converter's made-up one)
    src = _guard(report, f, GGUFSource, f)
    tok = _guard(report, f, tokenizer_files.from_gguf, gguf.metadata, f.name)
    if src is None or tok is None:
        return None, None
    return src, tok[0]


def _describe(report: SourceReport, src: Source, layout: Layout) -> None:
    model = layout.model
    report.layout = layout
    report.container_bytes = layout.total_bytes()
    report.trunk_bytes = layout.trunk_size
    report.n_layers = int(model["n_layers"])
    report.n_moe_layers = len(layout.banks)
    report.architecture = model.get("source_arch") or report.architecture
    moe = model.get("moe") or {}
    report.n_experts = int(moe.get("n_experts", 0) or 0)
    report.top_k = int(moe.get("top_k", 0) or 0)
    report.record_bytes = max((b.record_size for b in layout.banks), default=0)
    report.cold_bytes_per_token = layout.cold_bytes_per_token(report.top_k)


def plan_source(src, layout, tokenizer: dict, n_ctx: int = 4096, memory: MachineMemory | None = None) -> Plan:
    """The plan of the container a source *will* become, before converting: the
    C core plans a skeleton of it (the real manifest and bank headers, sparse
    files), so the floor and the recommendation are the ones `ferry plan` will
    print for the finished container."""
    import tempfile

    from app.convert.convert import write_skeleton
    from app.memory.plan import plan_container

    with tempfile.TemporaryDirectory(prefix="ferry-plan-") as tmp:
        root = write_skeleton(src, layout, tokenizer, Path(tmp) / "plan.ferry")
        return plan_container(root, n_ctx, memory)   # (the engine plans for at most the model's length)
