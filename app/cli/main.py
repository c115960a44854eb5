"""``ferry``: the command-line client. Every command is a thin call into the
public Python API (``app.api``) the window and the server use: one chat
format, one turn pipeline, one engine service."""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Sequence

import numpy as np

from app.api import (FerryError, ImageProgress, ModelError, ModelHeld, PromptProgress, Reasoning, RemoteError, Text, ToolCallMade, TurnDone,
                     DEFAULT_CONTEXT, TurnError, TurnRequest, describe_activations, log_softmax, logprobs_content,
                     session_context, verify)
from app.cli.common import (PromptMeter, Turns, UsageError, add_images, add_logprobs, add_model_options, add_routing,
                            add_sampling, add_server_model, image_parts, logprobs_problem, open_from_args, parse_size,
                            progress_printer, resolve_model, turn_request, number_argument_problem)
from app.convert.convert import ConvertError, convert
from app.convert.errors import SourceError
from app.convert.format_choices import RECOMMENDED
from app.convert.layout import FORMAT_CHOICES
from app.vision.image import DEFAULT_PATCH_BUDGET, MAX_PATCH_BUDGET, MIN_PATCH_BUDGET, with_images
from app.chat.summary import summarise_to_fit
from app.memory.plan import describe, plan_container
from app.text_input import not_text, text_argument_problem, tolerant_stdin

#: Arguments that are text for the model (paths may hold any bytes; these may not).
TEXT_ARGUMENTS = ("prompt", "system", "question")


def _messages(args, prompt: str) -> list[dict]:
    return ([{"role": "system", "content": args.system}] if getattr(args, "system", None) else []) + \
        [{"role": "user", "content": prompt}]


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


def _trunk_class_arg(text: str) -> tuple[str, str]:
    """CLASS=F for --trunk-class, checked against app.convert.layout.TRUNK_CLASSES and ENCODABLE."""
    from app.convert.layout import ENCODABLE, TRUNK_CLASSES

    cls, _, fmt = text.partition("=")
    if cls not in TRUNK_CLASSES or fmt not in ENCODABLE:
        raise argparse.ArgumentTypeError(f"'{text}': expected CLASS=F with CLASS one of {', '.join(TRUNK_CLASSES)} "
                                         f"and F one of {', '.join(ENCODABLE)}")
    return cls, fmt


def cmd_convert(args) -> int:
    trunk_format, expert_format = _resolve_formats(args)
    out = convert(args.source, args.out, trunk_format=trunk_format, expert_format=expert_format,
                  trunk_classes=dict(args.trunk_class or []),
                  progress=None if args.quiet else progress_printer(), threads=args.threads)
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
    if report.layout is not None and (v := report.layout.model.get("vision")):
        print(f"images: a vision tower of {v['layers']} blocks (width {v['hidden']}), kept in the container as "
              "released (bf16, or the float trunk format asked for); in RAM only while images are used")
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
            per_token += f", ~{c.tok_per_s:.1f} tok/s in RAM" if c.tok_per_s else ""
            print(f" {'*' if c.format == chosen else ' '} {c.format:6s} {c.label:30s} "
                  f"{c.bits_per_weight:5.2f} bits/weight, error {c.weight_error:14s} {size(c.nbytes):>8s}{per_token}"
                  + ("  (recommended)" if c.recommended else ""))
        best = next(c for c in choices if c.recommended)
        print(f"  recommended: --{'trunk' if role == 'trunk' else 'expert'}-format {best.format}, "
              f"because {why(best, dense)}")
    return 0


def cmd_info(args) -> int:
    model = open_from_args(args)
    info = model.engine.info
    plan = model.engine.plan(args.ctx)
    doc = {"path": str(model.path), "name": model.name, "converted_from": model.source_name,
           "model": model.manifest["model"],
           "info": info.__dict__, "activations_note": describe_activations(info.activations, model.engine.activations),
           "plan": {"n_ctx": args.ctx or info.max_ctx, **plan.__dict__},
           "files": model.manifest.get("files", []), "tokenizer": model.manifest.get("tokenizer")}
    if args.json:
        print(json.dumps(doc, indent=1))
        return 0
    m = doc["model"]
    print(f"{model.name}  ({m.get('source_arch')}, {info.n_layers} layers, dim {info.dim}, vocab {info.vocab}; "
          f"converted from {model.source_name})")
    print(f"  attention: {info.n_heads} heads, {info.n_kv_heads} KV heads of {info.head_dim}; "
          f"context {info.max_ctx}")
    if info.n_moe_layers:
        print(f"  experts: {info.n_moe_layers} MoE layers x {info.n_experts} experts, top {info.top_k}; "
              f"record {info.expert_bytes} bytes")
        print(f"  cache: {info.cache_slots} expert records; direct I/O "
              + ("on" if info.direct_io else f"off ({info.io_note})"))
    print(f"  compute: {info.n_threads} threads, {info.kernels} kernels, "
          + describe_activations(info.activations, model.engine.activations))
    print(f"  trunk: {plan.trunk_bytes / 2**20:.1f} MiB resident; session of {doc['plan']['n_ctx']} tokens "
          f"needs {plan.total_bytes / 2**20:.1f} MiB in all")
    if (v := m.get("vision")):
        tower = sum(t["nbytes"] for t in model.manifest.get("tensors", []) if t["name"].startswith(("v.", "mm.")))
        print(f"  images: vision tower of {v['layers']} blocks, width {v['hidden']}, patch {v['patch_size']}; "
              f"{tower / 2**20:.1f} MiB, in RAM only while images are used (--image FILE)")
    return 0


def _answer(turns: Turns, request: TurnRequest, *, show: bool) -> TurnDone:
    """One turn: the answer to stdout as it comes (the thinking trace to stderr)."""
    end = None
    thinking = False
    meter = PromptMeter() if show else None
    stream, cancel = turns.stream(request)
    try:
        for ev in stream:
            if isinstance(ev, ImageProgress) and meter is not None:
                meter.image(ev.label)
            elif isinstance(ev, PromptProgress) and meter is not None:
                meter.update(ev.done, ev.total)
            elif isinstance(ev, (Reasoning, Text, ToolCallMade, TurnDone)) and meter is not None:
                meter.clear()   # the answer begins where the progress line was
            if isinstance(ev, Reasoning) and show:
                if not thinking:
                    print("[thinking] ", end="", file=sys.stderr)
                    thinking = True
                print(ev.text, end="", file=sys.stderr, flush=True)
            elif isinstance(ev, Text) and show:
                if thinking:
                    print("\n[/thinking]", file=sys.stderr, flush=True)
                    thinking = False
                print(ev.text, end="", flush=True)
            elif isinstance(ev, ToolCallMade) and show:
                print(f"\n[tool call] {ev.call.name}({ev.call.arguments})", flush=True)
            elif isinstance(ev, TurnDone):
                end = ev
    except KeyboardInterrupt:
        cancel()
        end = TurnDone("cancelled")
    if meter is not None:
        meter.clear()
    if show:
        print()
    return end


def cmd_run(args) -> int:
    if (bad := logprobs_problem(args)):
        print(bad, file=sys.stderr)
        return 2
    messages = _messages(args, args.prompt)
    messages[-1] = with_images(messages[-1], image_parts(args.image))
    request = turn_request(args, messages, raw=args.raw)   # bad options and images: before loading
    turns = Turns(args)
    try:
        end = _answer(turns, request, show=not args.json)
    finally:
        turns.close()
    info = turns.model.engine.info if turns.model is not None else None
    if end.reason == "error":
        print(f"ferry: error: {end.error}", file=sys.stderr)
    if args.json:
        c = end.counters
        decode_s, prompt_s = c.get("decode_seconds", 0), c.get("prompt_seconds", 0)
        hits, misses = c.get("hits", 0), c.get("misses", 0)
        print(json.dumps({
            "text": end.content, "reasoning": end.reasoning,
            "tool_calls": [{"name": t.name, "arguments": t.arguments} for t in end.tool_calls],
            "tokens": len(end.token_ids), "token_ids": end.token_ids, "prompt_ids": end.prompt_ids,
            "finish_reason": end.reason, "prompt_tokens": end.prompt_tokens - end.reused_tokens,
            "seconds": round(end.seconds, 6), "ttft_s": end.ttft_s,
            "tok_per_s": round(c.get("decode_tokens", 0) / decode_s, 3) if decode_s > 0 else None,
            "prompt_tok_per_s": round(c.get("prompt_tokens", 0) / prompt_s, 3) if prompt_s > 0 else None,
            "bytes_read": int(c.get("bytes_read", 0)), "hits": int(hits), "misses": int(misses),
            "expert_reads": int(c.get("expert_reads", 0)),
            "hit_rate": hits / (hits + misses) if hits + misses else None,
            "read_seconds": c.get("read_seconds", 0.0), "stall_seconds": c.get("stall_seconds", 0.0),
            "lookahead_accuracy": (c["lookahead_correct"] / c["lookahead_predicted"]
                                   if c.get("lookahead_predicted") else None),
            "prefetch_used": int(c.get("prefetch_used", 0)), "prefetch_wasted": int(c.get("prefetch_wasted", 0)),
            "prefetch_gated": int(c.get("prefetch_gated", 0)),
            "ram_budget": info.ram_budget if info else None, "direct_io": bool(info.direct_io) if info else None,
            "activations": info.activations if info else None,
            "activations_note": describe_activations(info.activations, turns.model.engine.activations)
            if info else None, "model": turns.name,
            **({"server": turns.remote.url} if turns.remote is not None else {}),
            **({"logprobs": logprobs_content(end.logprobs, turns.model.tokenizer if turns.model else None)}
               if args.logprobs is not None else {}),
            "error": end.error}))
    return 1 if end.reason == "error" else 0


def _mcp_specs(args) -> list:
    """The MCP servers `--mcp` names (UsageError for one that cannot be), before anything is opened."""
    from app.tools.mcp import McpError, parse_server

    try:
        return [parse_server(text) for text in args.mcp]
    except McpError as exc:
        raise UsageError(f"--mcp: {exc}") from None


def _tool_hub(args, turns: Turns, specs: list):
    """The MCP servers, connected (None without any); UsageError if one cannot be used."""
    if not specs:
        return None
    from app.api import ChatFormat
    from app.tools.mcp import ToolHub

    if turns.model is not None and not ChatFormat(turns.model).takes_tools:
        raise UsageError(f"--mcp: {turns.name}'s chat format takes no tools, so it cannot call them")
    hub = ToolHub(specs)
    problems = hub.start()
    if problems:
        hub.close()
        raise UsageError("--mcp: " + "; ".join(problems))
    print(f"Tools: {', '.join(t.name for t in hub.tools) or 'none'}"
          f"{' (trusted: calls run without asking)' if args.trust_tools else ''}.", file=sys.stderr)
    return hub


def _approver(args):
    """Asks on the terminal before each tool call: yes, no, or always for that tool (this chat)."""
    trusted: set[str] = set()

    def approve(name: str, arguments: str) -> bool:
        if args.trust_tools or name in trusted:
            return True
        print(f"  Run the tool {name} with {arguments}? [y]es, [n]o, [a]lways for this tool: ",
              end="", file=sys.stderr, flush=True)
        try:
            answer = input().strip().lower()
        except (EOFError, KeyboardInterrupt):
            print(file=sys.stderr)
            return False
        if answer in ("a", "always"):
            trusted.add(name)
        return answer in ("y", "yes", "a", "always")

    return approve


def _show_call(record) -> None:
    result = record.result.text if len(record.result.text) <= 400 else record.result.text[:400] + " ..."
    print(f"[tool result{' (error)' if record.result.is_error else ''}] {result}", flush=True)


def cmd_chat(args) -> int:
    import dataclasses

    turn_request(args, [])   # bad options are refused before the model loads
    specs = _mcp_specs(args)
    turns = Turns(args)
    try:
        hub = _tool_hub(args, turns, specs)
    except BaseException:
        turns.close()
        raise
    tools = hub.openai_tools() if hub is not None else None
    if hub is not None:
        from app.tools.mcp import MAX_ROUNDS as MAX_TOOL_ROUNDS, tool_round   # asyncio, ssl: only with --mcp
    approve = _approver(args)
    messages: list[dict] = [{"role": "system", "content": args.system}] if args.system else []
    note = ""   #: the summary that stands for the turns taken out of ``messages`` (--context summarise)
    where = f" on {turns.remote.url}" if turns.remote is not None else ""
    pending = image_parts(args.image)   # --image: attached to the first message
    print(f"Chatting with {turns.name}{where}. Empty line, /quit or Ctrl-D to quit; /new starts over; "
          "/image FILE attaches an image to the next message.", file=sys.stderr)
    tolerant_stdin()
    asked = 0
    try:
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
            if not line.strip() or line.strip() in ("/quit", "/exit"):
                return 0
            if line.strip() == "/new":
                messages, note = messages[:1] if args.system else [], ""
                pending = []
                continue
            if line.strip().startswith("/image"):
                path = line.strip()[len("/image"):].strip()
                try:
                    if not path:
                        raise UsageError("/image needs a file: /image FILE")
                    pending += image_parts([path])
                    print(f"  [{os.path.basename(path)} will go with your next message{_image_cost(turns, args, path)}]",
                          file=sys.stderr)
                except UsageError as exc:
                    print(f"ferry: {exc}", file=sys.stderr)
                continue
            before = len(messages)
            messages.append(with_images({"role": "user", "content": line}, pending))
            asked += 1
            rounds = 0
            while True:   # until an answer calls no tool (each round's calls and results join the conversation)
                try:
                    policy = args.context if turns.model is not None else "drop_oldest"   # summaries: a local model
                    request = dataclasses.replace(turn_request(args, list(messages), context=policy), tools=tools,
                                                  context_note=note)
                    if turns.model is not None:
                        request, summary = summarise_to_fit(turns.engine, request)
                        if summary is not None:    # the oldest turns become the note, from now on
                            first = 1 if args.system else 0
                            messages, note = messages[:first] + messages[first + summary.covered:], summary.text
                            before = max(first, before - summary.covered)
                            print(f"  [the oldest {summary.covered} messages were summarised: {note}]",
                                  file=sys.stderr)
                    end = _answer(turns, request, show=True)
                except TurnError as exc:
                    end = TurnDone("error", error=exc.message)
                if hub is None or not end.tool_calls or end.reason in ("error", "cancelled"):
                    break
                if rounds == MAX_TOOL_ROUNDS:
                    print(f"  [the model asked for tools {rounds} times in a row; its calls were not run]",
                          file=sys.stderr)
                    break
                rounds += 1
                more, _ = tool_round(hub, end, f"{asked}r{rounds}", approve, on_call=_show_call)
                messages += more
            if end.reason in ("error", "cancelled"):
                if end.error:
                    print(f"ferry: {end.error}", file=sys.stderr)
                del messages[before:]
                continue
            pending = []
            messages.append({"role": "assistant", "content": end.content,
                             **({"reasoning_content": end.reasoning} if end.reasoning else {})})
            if end.dropped_messages:   # a chat never dead-ends: the oldest turns were left out of this prompt
                print(f"  [earlier turns are outside the model's memory: the oldest {end.dropped_messages} "
                      "messages were left out]", file=sys.stderr)
            if end.context_full:
                print("  [context full: the answer stopped where the context ended]", file=sys.stderr)
            n = len(end.token_ids)
            print(f"  [{n} tokens, {end.prompt_tokens - end.reused_tokens} prompt tokens evaluated, "
                  f"{end.reused_tokens} reused, {n / max(end.seconds, 1e-9):.1f} tok/s]", file=sys.stderr)
    finally:
        if hub is not None:
            hub.close()
        turns.close()


def _image_cost(turns: Turns, args, path: str) -> str:
    """": N prompt positions" for an image on a local model with a vision tower (what it will cost), else ""."""
    model = turns.model
    cfg = model.vision_config if model is not None else None
    if cfg is None:
        return ""
    from app.vision.image import ImageError, describe_cost, read_file

    try:
        img = model.prepare_image(read_file(path), os.path.basename(path), args.image_budget)
    except ImageError:
        return ""
    return ": " + describe_cost(img.grid)


def _eval_request(args, prompt: str) -> TurnRequest:
    return TurnRequest(messages=_messages(args, prompt), raw=not args.chat,
                       experts_per_token=args.experts_per_token, cache_aware_margin=args.cache_aware or 0.0)


def cmd_eval_compare(args) -> int:
    from app.api import ChatFormat
    from app.engine.compare import compare, read_prompts

    model = open_from_args(args)
    try:
        fmt = ChatFormat(model)
        ids = [fmt.prepare(_eval_request(args, p), n_ctx=args.ctx).prompt[:args.max_tokens]
               for p in read_prompts(args.compare)]
        budget = model.engine.info.ram_budget
    finally:
        model.close()  # the comparison opens the model afresh per mode
    report = compare(model.path, ids, experts_per_token=args.experts_per_token, cache_aware_margin=args.cache_aware,
                     activations=args.activations, ram_budget=budget, threads=args.threads,
                     kernels=getattr(args, "kernels", None))
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        ex, md = report["exact"], report["compared"]
        print(f"{report['positions']} positions of {report['prompts']} prompts: KL mean {report['kl_mean']:.4g}, "
              f"max {report['kl_max']:.4g}; top-1 agreement {report['top1_agreement']:.1%}")
        for name, m in (("exact", ex), ("mode", md)):
            print(f"  {name:5s}  {m['bytes_per_token'] or 0:14,.0f} bytes/token  hit rate {m['hit_rate'] or 0:.1%}  "
                  f"stall {m['stall_seconds']:.3f} s  {m['decode_tok_per_s'] or 0:.1f} tok/s")
    return 0


def cmd_eval(args) -> int:
    from app.api import ChatFormat
    from app.api import apply_routing

    if args.compare:
        return cmd_eval_compare(args)
    if args.prompt is None:
        raise UsageError("ferry eval needs a prompt (or --compare FILE)")
    model = open_from_args(args)
    session = model.new_session(args.ctx)
    prepared = ChatFormat(model).prepare(_eval_request(args, args.prompt), n_ctx=session.n_ctx)
    apply_routing(session, prepared)
    ids = prepared.prompt
    logp = log_softmax(session.eval(ids))
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
    plan = plan_container(resolve_model(args.model), session_context(args.ctx, 0))
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

    print(ensure_demo(progress=progress_printer()))
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
    if args.image_budget is not None and not MIN_PATCH_BUDGET <= args.image_budget <= MAX_PATCH_BUDGET:
        raise UsageError(f"--image-budget must be between {MIN_PATCH_BUDGET} and {MAX_PATCH_BUDGET}")
    try:
        model = open_from_args(args)
    except ModelHeld as held:       # another Ferry process has it open: serve its engine
        return _serve_held(args, held, key, warning)
    session = model.new_session(args.ctx)
    if (args.experts_per_token is not None or args.cache_aware) and not hasattr(session, "set_routing"):
        raise UsageError("this engine build does not support --experts-per-token / --cache-aware")
    server = Server(model, session, host=args.host, port=args.port, api_key=key,
                    limits=Limits(max_tokens=args.max_tokens, max_waiting=args.queue,
                                  experts_per_token=args.experts_per_token, cache_aware_margin=args.cache_aware,
                                  image_patch_budget=args.image_budget))
    if warning:
        print(f"ferry: {warning}", file=sys.stderr)
    print(f"ferry: serving {server.model_id} at {server.url} (Ctrl-C stops)", flush=True)
    try:
        server.run()
    except KeyboardInterrupt:   # Ctrl-C: uvicorn has shut down; no traceback
        pass
    finally:
        model.close()           # lets other Ferry processes open it (app.engine.registry)
    return 0


def _serve_held(args, held: ModelHeld, key: str | None, warning: str | None) -> int:
    """``ferry serve`` on a model another Ferry process holds: this address and key, its engine."""
    from app.server.run import ProxyServer

    if args.experts_per_token is not None or args.cache_aware:
        raise UsageError(f"--experts-per-token / --cache-aware set up an engine; Ferry (pid {held.record.pid}) "
                         f"already has the model open with its own (pass --no-share to open a second engine)")
    held.attach()      # it answers (ModelError otherwise)
    server = ProxyServer(held.record.url, held.record.key, held.record.name, host=args.host, port=args.port,
                         api_key=key)
    if warning:
        print(f"ferry: {warning}", file=sys.stderr)
    print(f"ferry: {held.notice}", file=sys.stderr)
    print(f"ferry: serving {server.model_id} at {server.url} (Ctrl-C stops)", flush=True)
    try:
        server.run()
    except KeyboardInterrupt:
        pass
    return 0


def cmd_cache_sim(argv: Sequence[str]) -> int:
    from app.engine.cachesim import main as cachesim_main

    return cachesim_main(list(argv))


# ---------------------------------------------------------------- parser

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
    p.add_argument("--trunk-class", type=_trunk_class_arg, action="append", metavar="CLASS=F",
                   help="store one class of trunk matrices in F instead of the trunk format (repeatable): "
                        "ffn (dense and shared-expert MLPs, K3's latent projections), attention (every "
                        "attention projection), head (the output head); e.g. ffn=q3_nl. Rows F cannot hold "
                        "keep the trunk's rule (docs/KIMI.md, 'K3's trunk by tensor class')")
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
    add_model_options(p)
    p.add_argument("--json", action="store_true")
    p.set_defaults(fn=cmd_info)

    p = sub.add_parser("run", help="answer one prompt")
    add_model_options(p)
    add_server_model(p)
    p.add_argument("prompt")
    add_sampling(p)
    p.add_argument("--raw", action="store_true", help="do not apply the chat template")
    p.add_argument("--json", action="store_true")
    add_logprobs(p)
    add_images(p)
    p.set_defaults(fn=cmd_run)

    p = sub.add_parser("chat", help="an interactive conversation")
    add_model_options(p)
    add_server_model(p)
    add_sampling(p)
    add_images(p)
    p.add_argument("--mcp", action="append", default=[], metavar="CMD",
                   help="an MCP server whose tools the model may call: a command that runs it over stdio "
                        "(quoted, e.g. 'npx -y @modelcontextprotocol/server-filesystem ~/notes'), or its "
                        "streamable-HTTP URL; repeatable. Each call is shown and asked for first")
    p.add_argument("--trust-tools", action="store_true",
                   help="run the --mcp tools' calls without asking (they are still shown)")
    p.add_argument("--context", choices=("drop_oldest", "summarise"), default="drop_oldest",
                   help="when the next turn would not fit the context: leave the oldest turns out (default), or "
                        "have the model summarise them into a short note it keeps (a model on this computer)")
    p.set_defaults(fn=cmd_chat)

    p = sub.add_parser("eval", help="next-token log-probabilities after a prompt")
    add_model_options(p)
    p.add_argument("prompt", nargs="?")
    p.add_argument("--chat", action="store_true", help="apply the chat template to the prompt")
    p.add_argument("--top", type=int, default=20)
    p.add_argument("--json", action="store_true")
    p.add_argument("--compare", metavar="FILE",
                   help="compare a mode (--experts-per-token/--cache-aware routing, --activations: by default "
                        "the default's 8-bit activations; --activations exact to compare routing alone) with "
                        "the exact engine over the prompts in FILE (text, one a line, or JSON Lines): KL, top-1 "
                        "agreement, bytes/token, decode tok/s")
    p.add_argument("--max-tokens", type=int, default=256, help="with --compare: tokens of each prompt evaluated")
    add_routing(p)
    p.set_defaults(fn=cmd_eval)

    p = sub.add_parser("plan", help="the RAM a model needs here, and the budget Ferry would choose")
    p.add_argument("model", help="a container, or use `ferry plan --config config.json` for a bare config")
    p.add_argument("--budget", help="check this budget against the floor")
    p.add_argument("--ctx", type=int, default=None,
                   help=f"context length in tokens, 0 for the model's whole context (default {DEFAULT_CONTEXT}, or "
                        f"the model's trained length when that is shorter)")
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

    p = sub.add_parser("serve", help="OpenAI's chat API and Anthropic's Messages API on the model "
                                     "(docs/SERVER.md)")
    add_model_options(p)
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1; any other "
                   "needs an API key)")
    p.add_argument("--port", type=int, default=8000, help="port (default 8000; 0 picks a free one)")
    p.add_argument("--api-key", help="require the key, as 'Authorization: Bearer KEY' or 'x-api-key: KEY' "
                   "(or set FERRY_API_KEY)")
    p.add_argument("--max-tokens", type=int, default=2048, help="the most tokens one answer may ask for (an "
                   "Anthropic request's required max_tokens is capped at it)")
    p.add_argument("--queue", type=int, default=32, help="requests that may wait for the engine")
    add_routing(p)
    p.add_argument("--image-budget", type=int, default=None, metavar="N",
                   help="patches a request's image may have (models with a vision tower; default "
                        f"{DEFAULT_PATCH_BUDGET})")
    p.set_defaults(fn=cmd_serve)

    sub.add_parser("cache-sim", help="simulate the expert cache on a routing trace", add_help=False)
    sub.add_parser("get", help="plan, download and convert a model from the Hugging Face hub "
                               "(the only command that uses the network; see `ferry get -h`)", add_help=False)
    sub.add_parser("docs", help="ask about your own documents: add, search, ask (see `ferry docs -h`)", add_help=False)
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if argv[:1] == ["cache-sim"]:
            return cmd_cache_sim(argv[1:])
        if argv[:1] == ["get"]:
            from app.get.cli import main as get_main
            return get_main(argv[1:])
        if argv[:1] == ["docs"]:
            from app.cli.docs import main as documents_main
            return documents_main(argv[1:])
        if argv[:1] == ["plan"] and any(a == "--config" or a.startswith("--config=") for a in argv):
            from app.convert.plan_config import main as plan_config_main

            return plan_config_main(argv[1:])
        args = build_parser().parse_args(argv)
        if (bad := text_argument_problem(args, TEXT_ARGUMENTS) or number_argument_problem(args)):
            raise UsageError(bad)
        return args.fn(args)
    except (FerryError, SourceError, ConvertError, ModelError, UsageError, ValueError, OSError, RemoteError) as exc:
        print(f"ferry: error: {exc}", file=sys.stderr)
        return 2 if isinstance(exc, UsageError) else 1


if __name__ == "__main__":
    sys.exit(main())
