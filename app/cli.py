"""``ferry``: the command-line client. Every command is a thin call into the
same Python API the GUI uses (app.model, app.convert, app.engine)."""
from __future__ import annotations

import argparse
import json
import math
import re
import sys
from pathlib import Path
from typing import Sequence

import numpy as np

from app.convert.convert import ConvertError, Progress, convert
from app.convert.errors import SourceError
from app.convert.layout import FORMAT_CHOICES
from app.convert.format_choices import RECOMMENDED
from app.engine.binding import KERNEL_CHOICES, FerryError, verify
from app.model import Finished, LoadedModel, ModelError, PromptProgress, Token
from app.plan import describe, gib, plan_container
from app.sampling import SamplingParams
from app.text_input import not_text, text_argument_problem, tolerant_stdin

DEMO = "demo"


class UsageError(ValueError):
    pass


#: Arguments that are text for the model (paths may hold any bytes; these may not).
TEXT_ARGUMENTS = ("prompt", "system", "question")


def parse_size(text: str) -> int:
    """'24G', '512MiB', '1.5GB', '1000000' -> bytes (K/M/G/T are binary)."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([kmgt]?)(i?b)?\s*", text.lower())
    if not m:
        raise UsageError(f"'{text}' is not a size (examples: 24G, 512M, 1000000)")
    scale = {"": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}[m.group(2)]
    return int(float(m.group(1)) * scale)


def resolve_model(name: str) -> Path:
    if name == DEMO:
        from app.demo import ensure_demo

        return ensure_demo(progress=_progress_printer())
    return Path(name)


def _progress_printer():
    last = [-1.0]

    def show(p: Progress) -> None:
        pct = 100.0 * p.done_bytes / max(1, p.total_bytes)
        if pct - last[0] >= 5 or p.stage == "done":
            last[0] = pct
            rate = p.done_bytes / max(p.elapsed, 1e-9) / 2**20
            print(f"  {pct:5.1f}%  {p.done_bytes / 2**20:8.1f} of {p.total_bytes / 2**20:.1f} MiB  "
                  f"{rate:6.1f} MiB/s  {p.stage}", file=sys.stderr, flush=True)

    return show


def _open(args) -> LoadedModel:
    path = resolve_model(args.model)
    if args.budget:
        budget = parse_size(args.budget)
    else:
        plan = plan_container(path, args.ctx)
        budget = plan.recommended
        if not getattr(args, "json", False):
            print(f"ferry: RAM budget {gib(budget)} ({plan.reason})", file=sys.stderr)
    return LoadedModel(path, ram_budget=budget, threads=args.threads, n_ctx=args.ctx, kernels=getattr(args, "kernels", None),
                       verify_reads=bool(getattr(args, "verify_reads", False)))


def _params(args) -> SamplingParams:
    return SamplingParams(temperature=args.temp, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p,
                          seed=args.seed)


def _prompt_ids(model: LoadedModel, prompt: str, raw: bool, system: str | None = None) -> list[int]:
    if raw or model.template is None:
        return model.encode_plain(prompt)
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
    return model.encode_chat(messages)


# ---------------------------------------------------------------- commands

def _resolve_formats(args) -> tuple[str, str]:
    """The trunk and expert formats to convert with, "recommended" resolved."""
    if RECOMMENDED not in (args.trunk_format, args.expert_format):
        return args.trunk_format, args.expert_format
    from app.convert.validate import validate_source

    report = validate_source(args.source, trunk_format=args.trunk_format, expert_format=args.expert_format)
    if not report.ok:
        raise SourceError(str(args.source), "; ".join(str(p) for p in report.problems))
    if not args.quiet:
        print(f"trunk: {report.trunk_format}, experts: {report.expert_format} "
              "(as asked, or recommended on this machine: see `ferry check`)", file=sys.stderr)
    return report.trunk_format, report.expert_format


def cmd_convert(args) -> int:
    trunk_format, expert_format = _resolve_formats(args)
    out = convert(args.source, args.out, trunk_format=trunk_format, expert_format=expert_format,
                  progress=None if args.quiet else _progress_printer(), threads=args.threads)
    print(out)
    return 0


def cmd_check(args) -> int:
    """What the wizard's Source page shows: every problem, or the sizes, the RAM
    plan and how the trunk and the experts could be stored."""
    from app.convert.format_choices import why
    from app.convert.validate import validate_source
    from app.units import size

    report = validate_source(args.source, trunk_format=args.trunk_format, expert_format=args.expert_format)
    if args.json:
        doc = {"ok": report.ok, "problems": [str(p) for p in report.problems], "warnings": report.warnings,
               "trunk_format": report.trunk_format, "trunk_choices": [c.as_dict() for c in report.trunk_choices],
               "architecture": report.architecture, "source_bytes": report.source_bytes,
               "container_bytes": report.container_bytes, "trunk_bytes": report.trunk_bytes,
               "n_experts": report.n_experts, "top_k": report.top_k,
               "cold_bytes_per_token": report.cold_bytes_per_token, "expert_format": report.expert_format,
               "plan": report.plan.as_dict() if report.plan is not None else None,
               "expert_choices": [c.as_dict() for c in report.expert_choices]}
        print(json.dumps(doc, indent=1))
        return 0 if report.ok else 1
    if not report.ok:
        for problem in report.problems:
            print(f"problem: {problem}")
        return 1
    print(f"{report.path}: {report.architecture}, {report.n_layers} layers; "
          f"source {size(report.source_bytes)}, container {size(report.container_bytes)}")
    for warning in report.warnings:
        print(f"warning: {warning}")
    print(describe(report.plan))
    dense = not report.expert_choices
    for role, choices in (("trunk", report.trunk_choices), ("experts", report.expert_choices)):
        if not choices:
            continue
        print("the trunk can be stored as:" if role == "trunk" else
              f"the experts ({report.n_experts} per MoE layer, {report.top_k} per token) can be stored as:")
        chosen = report.trunk_format if role == "trunk" else report.expert_format
        for c in choices:
            per_token = f", {size(c.cold_bytes_per_token)} per token cold" if role == "experts" else ""
            print(f" {'*' if c.format == chosen else ' '} {c.format:6s} {c.label:30s} "
                  f"{c.bits_per_weight:5.2f} bits/weight, error {c.weight_error:14s} {size(c.nbytes):>8s}{per_token}"
                  + ("  (recommended)" if c.recommended else ""))
        best = next(c for c in choices if c.recommended)
        print(f"  recommended: --{'trunk' if role == 'trunk' else 'expert'}-format {best.format}, "
              f"because {why(best, dense)}")
    return 0


def cmd_info(args) -> int:
    model = _open(args)
    info = model.engine.info
    plan = model.engine.plan(args.ctx)
    doc = {"path": str(model.path), "name": model.name, "model": model.manifest["model"],
           "info": info.__dict__, "plan": {"n_ctx": args.ctx or info.max_ctx, **plan.__dict__},
           "files": model.manifest.get("files", []), "tokenizer": model.manifest.get("tokenizer")}
    if args.json:
        print(json.dumps(doc, indent=1))
        return 0
    m = doc["model"]
    print(f"{model.name}  ({m.get('source_arch')}, {info.n_layers} layers, dim {info.dim}, vocab {info.vocab})")
    print(f"  attention: {info.n_heads} heads, {info.n_kv_heads} KV heads of {info.head_dim}; "
          f"context {info.max_ctx}")
    if info.n_moe_layers:
        print(f"  experts: {info.n_moe_layers} MoE layers x {info.n_experts} experts, top {info.top_k}; "
              f"record {info.expert_bytes} bytes")
        print(f"  cache: {info.cache_slots} expert records; direct I/O "
              + ("on" if info.direct_io else f"off ({info.io_note})"))
    print(f"  compute: {info.n_threads} threads, {info.kernels} kernels")
    print(f"  trunk: {plan.trunk_bytes / 2**20:.1f} MiB resident; session of {doc['plan']['n_ctx']} tokens "
          f"needs {plan.total_bytes / 2**20:.1f} MiB in all")
    return 0


def cmd_run(args) -> int:
    model = _open(args)
    session = model.new_session(args.ctx)
    ids = _prompt_ids(model, args.prompt, args.raw, args.system)
    stream = not args.json
    end: Finished | None = None
    for ev in model.generate(session, ids, _params(args), max_tokens=args.n):
        if isinstance(ev, Token) and stream:
            print(ev.text, end="", flush=True)
        elif isinstance(ev, Finished):
            end = ev
    assert end is not None
    if stream:
        print()
    if end.reason == "error":
        print(f"ferry: error: {end.error}", file=sys.stderr)
    if args.json:
        s = end.stats
        decode_s = s.decode_seconds
        print(json.dumps({
            "text": end.text, "tokens": len(end.tokens), "token_ids": end.tokens, "finish_reason": end.reason,
            "prompt_tokens": end.prompt_tokens, "seconds": round(end.seconds, 6),
            "tok_per_s": round(s.decode_tokens / decode_s, 3) if decode_s > 0 else None,
            "prompt_tok_per_s": round(s.prompt_tokens / s.prompt_seconds, 3) if s.prompt_seconds > 0 else None,
            "bytes_read": s.bytes_read, "hits": s.hits, "misses": s.misses, "expert_reads": s.expert_reads,
            "hit_rate": s.hits / (s.hits + s.misses) if s.hits + s.misses else None,
            "read_seconds": s.read_seconds, "stall_seconds": s.stall_seconds,
            "lookahead_accuracy": (s.lookahead_correct / s.lookahead_predicted if s.lookahead_predicted else None),
            "prefetch_used": s.prefetch_used, "prefetch_wasted": s.prefetch_wasted,
            "ram_budget": model.engine.info.ram_budget, "direct_io": bool(model.engine.info.direct_io),
            "error": end.error}))
    return 1 if end.reason == "error" else 0


def cmd_chat(args) -> int:
    model = _open(args)
    session = model.new_session(args.ctx)
    messages: list[dict] = [{"role": "system", "content": args.system}] if args.system else []
    print(f"Chatting with {model.name}. Empty line or Ctrl-D to quit; /new starts over.", file=sys.stderr)
    tolerant_stdin()
    while True:
        try:
            line = input("> ")
        except (EOFError, KeyboardInterrupt):
            print(file=sys.stderr)
            return 0
        if (bad := not_text(line)):
            print(f"ferry: that line is not valid UTF-8 text ({bad}); nothing was sent, type it again",
                  file=sys.stderr)
            continue
        if not line.strip():
            return 0
        if line.strip() == "/new":
            messages = messages[:1] if args.system else []
            continue
        messages.append({"role": "user", "content": line})
        end = None
        try:
            for ev in model.generate(session, model.encode_chat(messages), _params(args), max_tokens=args.n):
                if isinstance(ev, Token):
                    print(ev.text, end="", flush=True)
                elif isinstance(ev, Finished):
                    end = ev
        except KeyboardInterrupt:
            session.cancel()
        print()
        if end is None or end.reason in ("error", "cancelled"):
            if end is not None and end.error:
                print(f"ferry: {end.error}", file=sys.stderr)
            messages.pop()
            continue
        messages.append({"role": "assistant", "content": end.text})
        s = end.stats
        print(f"  [{len(end.tokens)} tokens, {end.prompt_tokens} prompt tokens evaluated, "
              f"{end.reused_tokens} reused, {len(end.tokens) / max(end.seconds, 1e-9):.1f} tok/s]",
              file=sys.stderr)


def cmd_eval(args) -> int:
    model = _open(args)
    session = model.new_session(args.ctx)
    ids = _prompt_ids(model, args.prompt, not args.chat)
    logits = session.eval(ids).astype(np.float64)
    logp = logits - (logits.max() + math.log(np.exp(logits - logits.max()).sum()))
    top = np.argsort(-logp, kind="stable")[:args.top]
    rows = [{"id": int(i), "token": model.tokenizer.token_text(int(i)),
             "text": model.tokenizer.decode([int(i)]), "logprob": float(logp[i])} for i in top]
    if args.json:
        print(json.dumps({"prompt_tokens": len(ids), "top": rows}, indent=1))
    else:
        for r in rows:
            print(f"{r['logprob']:10.4f}  {r['id']:7d}  {r['text']!r}")
    return 0


def cmd_plan(args) -> int:
    plan = plan_container(resolve_model(args.model), args.ctx)
    budget = parse_size(args.budget) if args.budget else None
    if args.json:
        doc = plan.as_dict()
        if budget is not None:
            doc["budget"] = budget
            doc["budget_ok"] = budget >= plan.floor
        print(json.dumps(doc, indent=1))
    else:
        print(describe(plan, budget))
    return 0 if budget is None or budget >= plan.floor else 1


def cmd_verify(args) -> int:
    path = resolve_model(args.model)
    state = {"last": 0}

    def progress(done: int, total: int):
        if not args.quiet and (done - state["last"] >= max(1, total // 20) or done == total):
            state["last"] = done
            print(f"  checked {done} of {total}", file=sys.stderr)

    verify(path, progress)
    print(f"{path}: every checksum matches")
    return 0


def cmd_demo(args) -> int:
    from app.demo import ensure_demo

    print(ensure_demo(progress=_progress_printer()))
    return 0


def cmd_render_chat(args) -> int:
    if args.format != "k3":
        raise UsageError(f"unknown chat format '{args.format}' (known: k3)")
    from app.chat.k3_format import render_chat_json

    print(render_chat_json(Path(args.request)))
    return 0


def cmd_serve(args) -> int:
    import os

    from app.server import Limits, Server, ServeError, check_binding

    key = args.api_key or os.environ.get("FERRY_API_KEY") or None
    try:
        warning = check_binding(args.host, key)
    except ServeError as exc:
        raise UsageError(str(exc)) from None
    model = _open(args)
    server = Server(model, model.new_session(args.ctx), host=args.host, port=args.port, api_key=key,
                    limits=Limits(max_tokens=args.max_tokens, max_waiting=args.queue))
    if warning:
        print(f"ferry: {warning}", file=sys.stderr)
    print(f"ferry: serving {server.model_id} at {server.url} (Ctrl-C stops)", flush=True)
    server.run()
    return 0


def cmd_cache_sim(argv: Sequence[str]) -> int:
    from app.engine.cachesim import main as cachesim_main

    return cachesim_main(list(argv))


# ---------------------------------------------------------------- parser

def _add_model_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="a container directory, or 'demo' for the built-in demo model")
    p.add_argument("--budget", help="RAM budget for the core, e.g. 4G (default: no limit)")
    p.add_argument("--threads", type=int, default=0, help="compute threads (default: one per CPU)")
    p.add_argument("--kernels", choices=KERNEL_CHOICES, default=None,
                   help="matrix-product kernels: auto (the best this CPU supports), scalar, avx2 or neon "
                        "(default: $FERRY_KERNELS, else auto)")
    p.add_argument("--ctx", type=int, default=4096, help="context length of the session (default 4096)")
    p.add_argument("--verify-reads", action="store_true",
                   help="check each expert record's CRC32 when it is first read from disk; a damaged record "
                        "ends that answer with an error naming it (costs CPU per GB read: docs/BENCHMARKS.md)")


def _add_sampling(p: argparse.ArgumentParser) -> None:
    p.add_argument("-n", type=int, default=256, help="most tokens to generate")
    p.add_argument("--temp", type=float, default=0.0, help="temperature; 0 is greedy (default)")
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--min-p", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--system", help="a system prompt")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="ferry", description="Run large mixture-of-experts models offline.")
    sub = ap.add_subparsers(dest="command", required=True)

    p = sub.add_parser("convert", help="convert a Hugging Face checkpoint folder or a GGUF file")
    p.add_argument("source")
    p.add_argument("out")
    p.add_argument("--trunk-format", choices=FORMAT_CHOICES + (RECOMMENDED,), default="auto",
                   help="how the resident (non-expert) matrices are stored; auto (default): q8_0 for a trunk "
                        "converted from floats (f32/f16/bf16), a quantized source's own formats otherwise "
                        "(a Q4_1 GGUF stays Q4_1); q4_0 for less memory; recommended: what `ferry check` "
                        "recommends on this machine. Norms and other vectors stay f32")
    p.add_argument("--expert-format", choices=FORMAT_CHOICES + (RECOMMENDED,), default="auto",
                   help="how expert matrices are stored; auto (default) keeps the source's values exactly "
                        "(its own format; MXFP4 as bf16; other formats the core lacks widened to f32); "
                        "recommended: what `ferry check` recommends on this machine")
    p.add_argument("--threads", type=int, default=None, metavar="N",
                   help="expert records read and encoded at once (default: one per core); "
                        "the container is the same whatever N")
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(fn=cmd_convert)

    p = sub.add_parser("check", help="check a source before converting it: problems, sizes, RAM plan, "
                                     "and how its trunk and experts could be stored")
    p.add_argument("source")
    p.add_argument("--trunk-format", choices=FORMAT_CHOICES + (RECOMMENDED,), default=RECOMMENDED,
                   help="the trunk format the sizes and plan are for (default: the recommended one)")
    p.add_argument("--expert-format", choices=FORMAT_CHOICES + (RECOMMENDED,), default=RECOMMENDED,
                   help="the expert format the sizes and plan are for (default: the recommended one)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(fn=cmd_check)

    p = sub.add_parser("info", help="describe a container")
    _add_model_options(p)
    p.add_argument("--json", action="store_true")
    p.set_defaults(fn=cmd_info)

    p = sub.add_parser("run", help="answer one prompt")
    _add_model_options(p)
    p.add_argument("prompt")
    _add_sampling(p)
    p.add_argument("--raw", action="store_true", help="do not apply the chat template")
    p.add_argument("--json", action="store_true")
    p.set_defaults(fn=cmd_run)

    p = sub.add_parser("chat", help="an interactive conversation")
    _add_model_options(p)
    _add_sampling(p)
    p.set_defaults(fn=cmd_chat)

    p = sub.add_parser("eval", help="next-token log-probabilities after a prompt")
    _add_model_options(p)
    p.add_argument("prompt")
    p.add_argument("--chat", action="store_true", help="apply the chat template to the prompt")
    p.add_argument("--top", type=int, default=20)
    p.add_argument("--json", action="store_true")
    p.set_defaults(fn=cmd_eval)

    p = sub.add_parser("plan", help="the RAM a model needs here, and the budget Ferry would choose")
    p.add_argument("model", help="a container, or use `ferry plan --config config.json` for a bare config")
    p.add_argument("--budget", help="check this budget against the floor")
    p.add_argument("--ctx", type=int, default=4096)
    p.add_argument("--json", action="store_true")
    p.set_defaults(fn=cmd_plan)

    p = sub.add_parser("verify", help="check every checksum of a container")
    p.add_argument("model")
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(fn=cmd_verify)

    p = sub.add_parser("demo", help="fetch and convert the built-in demo model; print its path")
    p.set_defaults(fn=cmd_demo)

    p = sub.add_parser("render-chat", help="render a chat request into markup/content segments")
    p.add_argument("--format", default="k3")
    p.add_argument("request")
    p.set_defaults(fn=cmd_render_chat)

    p = sub.add_parser("serve", help="an OpenAI-compatible API on the model (docs/SERVER.md)")
    _add_model_options(p)
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1; any other "
                   "needs an API key)")
    p.add_argument("--port", type=int, default=8000, help="port (default 8000; 0 picks a free one)")
    p.add_argument("--api-key", help="require 'Authorization: Bearer KEY' (or set FERRY_API_KEY)")
    p.add_argument("--max-tokens", type=int, default=2048, help="the most tokens one answer may ask for")
    p.add_argument("--queue", type=int, default=32, help="requests that may wait for the engine")
    p.set_defaults(fn=cmd_serve)

    sub.add_parser("cache-sim", help="simulate the expert cache on a routing trace", add_help=False)
    sub.add_parser("docs", help="ask about your own documents: add, search, ask (see `ferry docs -h`)", add_help=False)
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if argv[:1] == ["cache-sim"]:
            return cmd_cache_sim(argv[1:])
        if argv[:1] == ["docs"]:
            from app.documents.cli import main as documents_main
            return documents_main(argv[1:])
        if argv[:1] == ["plan"] and any(a == "--config" or a.startswith("--config=") for a in argv):
            from app.plan_config import main as plan_config_main

            return plan_config_main(argv[1:])
        args = build_parser().parse_args(argv)
        if (bad := text_argument_problem(args, TEXT_ARGUMENTS)):
            raise UsageError(bad)
        return args.fn(args)
    except (FerryError, SourceError, ConvertError, ModelError, UsageError, ValueError, OSError) as exc:
        print(f"ferry: error: {exc}", file=sys.stderr)
        return 2 if isinstance(exc, UsageError) else 1


if __name__ == "__main__":
    sys.exit(main())
