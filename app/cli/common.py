"""What ``ferry`` and ``ferry docs`` share: sizes and budgets, opening a
model, the model and sampling options, and a turn request from them."""
from __future__ import annotations

import argparse
import os
import re
import sys
import time
from pathlib import Path

from app.api import (ACTIVATION_CHOICES, DEFAULT_ACTIVATIONS, DEFAULT_CONTEXT, KERNEL_CHOICES, LoadedModel, ModelHeld,
                     SamplingParams, TurnRequest, open_model, session_context)
from app.convert.convert import Progress

DEMO = "demo"
#: No machine has more memory than this (2^62 bytes, 4 EiB): a larger size is a typo.
MAX_SIZE = 1 << 62


class UsageError(ValueError):
    pass


#: The largest count the core takes (a C int).
INT_MAX = 2**31 - 1
#: Every number an option of `ferry` or `ferry docs` takes, by its argparse dest: (the option as
#: typed, smallest, largest); a float must be finite and at least its smallest (None: any), its
#: other limits are checked where it is used (SamplingParams, routing). Counts the core takes
#: (contexts, tokens) are C ints.
NUMBER_OPTIONS: dict[str, tuple[str, int | None, int | None]] = {
    "ctx": ("--ctx", 0, INT_MAX), "n": ("-n", 0, INT_MAX), "threads": ("--threads", 0, 1024),
    "top_k": ("--top-k", 0, INT_MAX), "seed": ("--seed", 0, 2**64 - 1),
    "experts_per_token": ("--experts-per-token", 1, INT_MAX), "top": ("--top", 1, INT_MAX),
    "max_tokens": ("--max-tokens", 1, INT_MAX), "port": ("--port", 0, 65535), "queue": ("--queue", 1, 1_000_000),
    "k": ("-k", 1, 10_000), "context_tokens": ("--context-tokens", 1, INT_MAX), "tokens": ("tokens", 1, INT_MAX),
    "temp": ("--temp", None, None), "top_p": ("--top-p", None, None), "min_p": ("--min-p", None, None),
    "frequency_penalty": ("--frequency-penalty", None, None), "presence_penalty": ("--presence-penalty", None, None),
    "cache_aware": ("--cache-aware", 0, None),
}


def number_argument_problem(args) -> str | None:
    """The first number on the command line outside what it may be (one line), or None: the
    options of every command through this one table, before anything is opened."""
    import math

    for dest, (option, lo, hi) in NUMBER_OPTIONS.items():
        value = getattr(args, dest, None)
        if isinstance(value, float):
            if not math.isfinite(value):
                return f"{option} must be a finite number, not {value}"
            if lo is not None and value < lo:
                return f"{option} must be at least {lo}"
        elif isinstance(value, int) and not isinstance(value, bool) and lo is not None and not lo <= value <= hi:
            return f"{option} is {value}; it must be between {lo} and {hi}"
    return None


def parse_size(text: str) -> int:
    """'24G', '512MiB', '1.5GB', '1000000' -> bytes (K/M/G/T are binary)."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([kmgtpe]?)(i?b)?\s*", text.lower())
    if not m:
        raise UsageError(f"'{text}' is not a size (examples: 24G, 512M, 1000000)")
    scale = {"": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40, "p": 2**50, "e": 2**60}[m.group(2)]
    value = float(m.group(1)) * scale
    if value > MAX_SIZE:
        raise UsageError(f"'{text}' is larger than any machine's memory (at most {MAX_SIZE} bytes)")
    return int(value)


def check_budget(budget: int, memory=None) -> str | None:
    """Refuse a budget above the machine's RAM (UsageError, with the numbers);
    a warning (text) for one above the memory usable now; else None."""
    from app.memory.budget import machine_memory
    from app.units import size

    memory = memory or machine_memory()
    if budget > memory.total:
        raise UsageError(f"a RAM budget of {size(budget)} is more than this machine has ({size(memory.total)} "
                         f"of RAM, {size(memory.usable)} usable now from {memory.source}); leave --budget out "
                         f"for the recommended one")
    if budget > memory.usable:
        return (f"a RAM budget of {size(budget)} is more than the {size(memory.usable)} usable now "
                f"({memory.source}); the system may swap")
    return None


def resolve_model(name: str) -> Path:
    if name == DEMO:
        from app.demo import ensure_demo

        return ensure_demo(progress=progress_printer())
    from app.library import Library

    return Library().resolve(name)   # a container path or name; else says what to do (LibraryError)


def progress_printer():
    last = [-1.0]

    def show(p: Progress) -> None:
        pct = 100.0 * p.done_bytes / max(1, p.total_bytes)
        if pct - last[0] >= 5 or p.stage == "done":
            last[0] = pct
            rate = p.done_bytes / max(p.elapsed, 1e-9) / 2**20
            print(f"  {pct:5.1f}%  {p.done_bytes / 2**20:8.1f} of {p.total_bytes / 2**20:.1f} MiB  "
                  f"{rate:6.1f} MiB/s  {p.stage}", file=sys.stderr, flush=True)

    return show



def _serve_shared(model, service, key: str):
    """``app.server.serve_shared``, imported when a model is first shared (the server's web stack is
    not loaded before)."""
    from app.server import serve_shared

    return serve_shared(model, service, key)


def open_from_args(args) -> LoadedModel:
    """The model named on the command line, with its --budget (or the recommended one).
    Raises ``ModelHeld`` when another Ferry process has it open (``attach``)."""
    from app.units import size

    quiet = getattr(args, "json", False)
    if is_server_url(args.model):
        raise UsageError(f"{args.model} is a server's URL: `ferry run`, `ferry chat` and `ferry docs ask` can use "
                         f"a server; this command needs a model on this computer")
    if args.budget:   # checked before anything is loaded
        budget = parse_size(args.budget)
        warning = check_budget(budget)
        if warning and not quiet:
            print(f"ferry: warning: {warning}", file=sys.stderr)
    path = resolve_model(args.model)
    asked = session_context(args.ctx, 0)   # (the model's length is known once it is open)
    if not args.budget:
        from app.memory.plan import plan_container

        plan = plan_container(path, asked, activations=getattr(args, "activations", None))
        budget = plan.recommended
    model = open_model(path, ram_budget=budget, threads=args.threads, n_ctx=asked,
                      kernels=getattr(args, "kernels", None), verify_reads=bool(getattr(args, "verify_reads", False)),
                      activations=getattr(args, "activations", None) or DEFAULT_ACTIVATIONS,
                      share=False if getattr(args, "no_share", False) else None,
                      holder=getattr(args, "holder", None) or f"`ferry {args.command}`", serve=_serve_shared)
    args.ctx = session_context(args.ctx, model.engine.info.max_ctx)   # the session every command opens on it
    if not args.budget and not quiet:   # said once it is this process's budget (not when it attaches)
        print(f"ferry: RAM budget {size(budget)} ({plan.reason})", file=sys.stderr)
    return model


def attach(held: ModelHeld):
    """The engine of the Ferry process that holds the model (``open_from_args`` raised ``held``),
    said on stderr: one engine per model per machine (``app.engine.registry``)."""
    engine = held.attach()
    print(f"ferry: {held.notice}", file=sys.stderr, flush=True)
    return engine


def is_server_url(model: str) -> bool:
    """MODEL names an OpenAI-compatible server (another Ferry, vLLM, llama.cpp...)."""
    return model.startswith(("http://", "https://"))


class PromptMeter:
    """A long prompt's progress on a terminal's stderr, one line rewritten in
    place ("Reading the prompt: 96 of 480 tokens, about 12 s left", the
    window's words; before it an image's blocks in the vision tower,
    "Reading the image: block 12 of 27") and erased when the answer starts. Silent when stderr is
    not a terminal (a pipe, a log) or the prompt is read in one chunk."""

    def __init__(self, passages: int = 0, stream=None):
        self.stream = stream or sys.stderr
        self.on = bool(getattr(self.stream, "isatty", lambda: False)())
        self.passages = passages
        self.t0 = time.monotonic()
        self.shown = False

    def update(self, done: int, total: int) -> None:
        from app.documents.library import reading_label

        if not self.on or (not self.shown and done >= total):
            return
        self.stream.write("\r\033[K[" + reading_label(self.passages, done, total, time.monotonic() - self.t0) + "]")
        self.stream.flush()
        self.shown = True
        if done >= total:
            self.clear()

    def image(self, line: str) -> None:
        """An image in the vision tower ("Reading the image: block 12 of 27", ``ImageProgress.label``)."""
        if self.on:
            self.stream.write(f"\r\033[K[{line}]")
            self.stream.flush()
            self.shown = True

    def clear(self) -> None:
        if self.shown:
            self.stream.write("\r\033[K")
            self.stream.flush()
            self.shown = False


class Turns:
    """Where `ferry run`, `ferry chat` and `ferry docs ask` send their turns (``engine``, the one door):
    a model on this computer (the engine service on one session; ``states``: its saved prefix
    states), or, when MODEL is a server's URL, that server through the window's remote engine
    (``app.engine.remote``: the same events, the API key the window keeps for that URL in the
    keychain)."""

    def __init__(self, args, *, states=None):
        self.model = self.remote = self.held = None
        self.states = states
        if is_server_url(args.model):
            local = [flag for flag, used in (("--budget", args.budget), ("--kernels", getattr(args, "kernels", None)),
                                             ("--threads", args.threads), ("--ctx", args.ctx is not None),
                                             ("--activations",
                                              getattr(args, "activations", None) not in (None, DEFAULT_ACTIVATIONS)),
                                             ("--verify-reads", getattr(args, "verify_reads", False))) if used]
            if local:
                raise UsageError(f"{', '.join(local)} set{'s' if len(local) == 1 else ''} up a model on this "
                                 f"computer; {args.model} is a server, which chooses its own")
            from app.api import RemoteEngine
            from app.store.settings import remote_api_key

            self.remote = RemoteEngine(args.model, getattr(args, "server_model", None) or "",
                                       remote_api_key(args.model))
            self.remote.check()                     # RemoteError: unreachable, wrong key, unknown model
            self.engine = self.remote
            self.name = self.engine.name
        else:
            self._open(args)

    def _open(self, args) -> None:
        from app.api import EngineService

        self.args, self.held = args, None
        try:
            self.model = open_from_args(args)
        except ModelHeld as held:     # another Ferry process has it open: its engine answers
            self.remote, self.held = attach(held), held
            self.engine = self.remote
            self.name = self.remote.model
            return
        self.engine = EngineService(self.model, self.model.new_session(args.ctx), states=self.states)
        self.name = self.engine.name

    def stream(self, request: TurnRequest):
        """(the turn's events, a function that cancels it). A `ferry chat` whose model's holder
        has closed it opens it again (itself, or through the process that holds it now); so does a
        turn whose holder closes the model just as it is sent (``AttachedStream``)."""
        from app.api import AttachedStream, holder_left

        if self.held is not None and holder_left(self.held.record):
            self._reopen()
        if self.held is not None:
            stream = AttachedStream(self.engine, request, self.held.record, self._reopen)
        else:
            stream = self.engine.submit(request)
        return stream, stream.cancel

    def _reopen(self):
        """The model opened again after its holder let go of it: the engine turns now go to."""
        self.remote.close()
        self.remote = None
        self._open(self.args)
        return self.engine

    def close(self) -> None:
        self.engine.close()
        if self.model is not None:
            self.model.close()


def add_model_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="a converted model: its folder, its name in the models folder, or 'demo' for the "
                                 "built-in demo model (`run`, `chat` and `docs ask`: or an OpenAI-compatible "
                                 "server's URL)")
    p.add_argument("--budget", help="RAM budget for the core, e.g. 4G (default: chosen for this machine and model, "
                                    "as `ferry plan` prints it)")
    p.add_argument("--threads", type=int, default=0, help="compute threads (default: one per CPU)")
    p.add_argument("--kernels", choices=KERNEL_CHOICES, default=None,
                   help="matrix-product kernels: auto (the best this CPU supports), scalar, avx2, avx512vnni (q8 mode) or neon "
                        "(default: $FERRY_KERNELS, else auto)")
    p.add_argument("--activations", choices=ACTIVATION_CHOICES, default=DEFAULT_ACTIVATIONS,
                   help="auto (default): each token's input is rounded to 8 bits (per 32 values; per 256 for K-quant "
                        "weights) and multiplied with integer dot products where the weights are q8_0, q4_0, q4_1, "
                        "q4_k, q5_k, q6_k, q3_nl or iq4_xs, as llama.cpp does (other weights stay exact; on Kimi-Linear and K3 "
                        "only the parts measured safe): faster, and the next-token "
                        "distribution moves far less than the weights' own quantization moves it "
                        "(docs/QUANTIZATION.md; `ferry eval --compare FILE` measures it); exact (alias f32): exact "
                        "f32 matrix products, for verification; q8: as auto, refused by a kernel set without "
                        "integer products")
    p.add_argument("--ctx", type=int, default=None,
                   help=f"context length of the session in tokens, 0 for the model's whole context (default "
                        f"{DEFAULT_CONTEXT}, or the model's trained length when that is shorter)")
    p.add_argument("--no-share", action="store_true",
                   help="open the model in this process even when another Ferry process has it open, and do not "
                        "share it with others (default: one engine per model per machine: docs/SERVER.md; "
                        "FERRY_SHARE=0 does the same)")
    p.add_argument("--verify-reads", action="store_true",
                   help="check each expert record's CRC32 when it is first read from disk; a damaged record "
                        "ends that answer with an error naming it (costs CPU per GB read: docs/bench-log/2026-12-03.md)")


def add_server_model(p) -> None:
    p.add_argument("--server-model", metavar="NAME", help="when MODEL is a server's URL: the model it serves to use "
                                                           "(default: the first it lists)")


def add_logprobs(p: argparse.ArgumentParser) -> None:
    from app.api import MAX_TOP_LOGPROBS

    p.add_argument("--logprobs", type=int, default=None, metavar="N", choices=range(0, MAX_TOP_LOGPROBS + 1),
                   help="with --json: each generated token's log-probability and the N (0-20) most likely "
                        "alternatives, as the server's logprobs")


def logprobs_problem(args) -> str | None:
    """Why the command line's --logprobs cannot be honoured (None: it can)."""
    if getattr(args, "logprobs", None) is not None and not args.json:
        return "ferry: --logprobs needs --json (they are printed in the JSON answer)"
    return None


def add_routing(p: argparse.ArgumentParser) -> None:
    p.add_argument("--experts-per-token", type=int, default=None, metavar="N",
                   help="experts each token visits (opt-in, inexact; default: the model's own)")
    p.add_argument("--cache-aware", type=float, default=0.0, metavar="M",
                   help="prefer cached experts whose router score is within M of the chosen ones "
                        "(opt-in, inexact; default 0: off)")


def add_sampling(p: argparse.ArgumentParser, *, system: bool = True) -> None:
    """The options of one answer (`run`, `chat`, `docs ask`; ``system``: a
    --system prompt, which `docs ask` does not take: its system message is the passages)."""
    p.add_argument("-n", type=int, default=256, help="most tokens to generate")
    p.add_argument("--temp", type=float, default=0.0, help="temperature; 0 is greedy (default)")
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--min-p", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=None, help="the sampler's seed: the same seed and options give the "
                                                           "same answer (default: a fresh one)")
    p.add_argument("--frequency-penalty", type=float, default=0.0, metavar="F",
                   help="-2 to 2: lower a token's chances by F for each time it was already written (default 0)")
    p.add_argument("--presence-penalty", type=float, default=0.0, metavar="F",
                   help="-2 to 2: lower the chances of any token already written by F (default 0)")
    p.add_argument("--stop", action="append", default=None, metavar="S",
                   help="end the answer before the text S (repeatable, at most 4; the thinking trace is not cut)")
    if system:
        p.add_argument("--system", help="a system prompt")
    p.add_argument("--no-think", action="store_true", help="turn the model's thinking off (where it has it)")
    add_routing(p)


def sampling(args) -> SamplingParams:
    return SamplingParams(temperature=args.temp, top_k=getattr(args, "top_k", 0), top_p=getattr(args, "top_p", 1.0),
                          min_p=getattr(args, "min_p", 0.0), seed=args.seed,
                          frequency_penalty=getattr(args, "frequency_penalty", 0.0),
                          presence_penalty=getattr(args, "presence_penalty", 0.0))


def add_images(p: argparse.ArgumentParser) -> None:
    """``--image FILE`` (repeatable) and ``--image-budget N``: images for a model with a vision tower."""
    from app.vision.image import DEFAULT_PATCH_BUDGET, MAX_PATCH_BUDGET, MIN_PATCH_BUDGET

    p.add_argument("--image", action="append", default=None, metavar="FILE",
                   help="an image to ask about (repeatable; models with a vision tower, e.g. Kimi K3)")
    p.add_argument("--image-budget", type=int, default=None, metavar="N",
                   help=f"patches an image may have ({MIN_PATCH_BUDGET}-{MAX_PATCH_BUDGET}, default "
                        f"{DEFAULT_PATCH_BUDGET}: at most {DEFAULT_PATCH_BUDGET // 4} prompt positions an image)")


def image_parts(paths) -> list[dict]:
    """The content parts of image files (data URLs), or a UsageError naming the bad one."""
    from app.vision.image import ImageError, data_url, read_file, url_part

    parts = []
    for path in paths or ():
        name = os.path.basename(path)
        try:
            parts.append(url_part(data_url(read_file(path), name), name))
        except ImageError as exc:
            raise UsageError(str(exc)) from None
    return parts


def turn_request(args, messages: list[dict], *, raw: bool = False, client: str = "cli",
                 context: str = "error") -> TurnRequest:
    """The turn the options ask for; options out of range are a UsageError (before any model loads).
    ``context``: the context policy (``TurnRequest.context``; ``ferry chat`` drops the oldest turns)."""
    from app.api import MAX_STOP_CHARS, MAX_STOPS

    stops = list(getattr(args, "stop", None) or [])
    if len(stops) > MAX_STOPS or any(not s or len(s) > MAX_STOP_CHARS for s in stops):
        raise UsageError(f"--stop takes up to {MAX_STOPS} non-empty sequences of at most {MAX_STOP_CHARS} "
                         f"characters")
    try:
        params = sampling(args)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    from app.vision.image import MAX_PATCH_BUDGET, MIN_PATCH_BUDGET

    budget = getattr(args, "image_budget", None)
    if budget is not None and not MIN_PATCH_BUDGET <= budget <= MAX_PATCH_BUDGET:
        raise UsageError(f"--image-budget must be between {MIN_PATCH_BUDGET} and {MAX_PATCH_BUDGET}")
    return TurnRequest(messages=messages, sampling=params, max_tokens=args.n, image_patch_budget=budget,
                       thinking=not getattr(args, "no_think", False), raw=raw,
                       experts_per_token=getattr(args, "experts_per_token", None),
                       cache_aware_margin=getattr(args, "cache_aware", 0.0) or 0.0, client=client,
                       top_logprobs=getattr(args, "logprobs", None), stop=stops, context=context)
