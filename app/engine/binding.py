"""Python face of the C core: Engine (a loaded container) and Session (one
timeline of tokens). No Qt here; the GUI and the CLI both use this module.

Every C call that can fail returns a status and fills a caller-owned error;
here that becomes a :class:`FerryError` carrying the code name and message.
"""
from __future__ import annotations

import os
import weakref
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from app.engine._ferry_c import ffi, lib
# How matrix products treat their inputs (``Engine(activations=...)``): the
# choices and THE default are defined once, in app.activations.
from app.activations import ACTIVATION_CHOICES, DEFAULT_ACTIVATIONS, canonical  # noqa: F401

#: Called with (stage, pos, hidden[n_tokens, dim]) during an evaluation.
StageObserver = Callable[[int, int, np.ndarray], None]


class FerryError(RuntimeError):
    """An error reported by the C core: ``code`` is e.g. ``"FERRY_E_FORMAT"``."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


class Cancelled(FerryError):
    """An evaluation stopped by :meth:`Session.cancel`."""


def _check(status: int, err) -> None:
    if status != lib.FERRY_OK:
        code = ffi.string(lib.ferry_status_name(status)).decode()
        message = ffi.string(err.message).decode("utf-8", "replace")
        cls = Cancelled if status == lib.FERRY_E_CANCELLED else FerryError
        raise cls(code, message)


@dataclass(frozen=True)
class ModelInfo:
    arch: str
    n_layers: int
    dim: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    vocab: int
    max_ctx: int
    n_moe_layers: int
    n_experts: int
    top_k: int
    trunk_bytes: int
    expert_bytes: int
    n_threads: int
    direct_io: int
    io_note: str
    cache_slots: int
    ram_budget: int
    kernels: str  # the kernel set matrix products use: "scalar", "avx2" or "neon"; in the q8 mode its integer set's (e.g. "avx512vnni")
    activations: str = "f32"  # the path that runs: "f32" (exact) or "q8" (8-bit activations; app.activations)
    prompt_chunk: int = 32  # tokens a prompt's forward pass evaluates together (Engine's prompt_chunk)


#: Kernel sets an engine can be opened with (``Engine(kernels=...)``).
#: "avx512vnni": AVX2's exact kernels with AVX-512 VNNI integer products in the
#: q8 mode (what "auto" takes there on a CPU that has them).
KERNEL_CHOICES = ("auto", "scalar", "avx2", "avx512vnni", "neon")

#: Reader threads an engine reads expert records with when ``readers`` is 0 (the
#: core's queue depth; the disk probe, app.memory.disk_probe, reads with as many).
DEFAULT_READERS = int(lib.FERRY_DEFAULT_READERS)


def default_kernels() -> str:
    """The kernel set engines open with when none is given: the environment
    variable ``FERRY_KERNELS`` (``scalar``, ``avx2``, ``avx512vnni``, ``neon``), else ``auto``
    (the best this CPU supports). Read here, at each open; the C core reads
    no environment."""
    return os.environ.get("FERRY_KERNELS", "").strip() or "auto"


@dataclass(frozen=True)
class MemoryPlan:
    trunk_bytes: int
    state_bytes: int
    scratch_bytes: int
    expert_bytes: int
    policy_bytes: int        #: the cache policy's own state over those records
    total_bytes: int
    floor_bytes: int
    record_bytes: int
    token_set_bytes: int
    policy_floor_bytes: int  #: of floor_bytes, the policy state for the minimum cache
    q8_bytes: int = 0        #: scratch 8-bit activations add (in scratch_bytes when the engine uses them;
    #  0 for a model without weights they apply to)
    n_ctx: int = 0           #: the context planned for (the model's trained length when asked for 0 or more)


@dataclass(frozen=True)
class Stats:
    prompt_tokens: int = 0
    decode_tokens: int = 0
    prompt_seconds: float = 0.0
    decode_seconds: float = 0.0
    expert_reads: int = 0
    bytes_read: int = 0
    read_seconds: float = 0.0
    compute_seconds: float = 0.0
    hits: int = 0
    misses: int = 0
    decode_hits: int = 0
    decode_misses: int = 0
    prefetch_issued: int = 0
    prefetch_used: int = 0
    prefetch_wasted: int = 0
    lookahead_predicted: int = 0
    lookahead_correct: int = 0
    stall_seconds: float = 0.0
    routed_choices: int = 0
    routed_swaps: int = 0
    prefetch_gated: int = 0  #: predictions not in RAM left unread: their layer and rank predicted poorly
    lookahead_skipped: int = 0  #: layer steps whose lookahead did not run: it had nothing to read lately

    def as_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.decode_tokens

    def per_mode(self) -> dict:
        """The figures that compare routing modes: bytes read per token, the
        cache's hit rate, the lookahead's accuracy (None before it predicted
        anything), seconds the compute waited for reads, and the share of
        expert choices cache-aware routing moved to an expert in RAM."""
        uses = self.hits + self.misses
        return {
            "tokens": self.tokens,
            "bytes_per_token": self.bytes_read / self.tokens if self.tokens else None,
            "hit_rate": self.hits / uses if uses else None,
            "lookahead_accuracy": (self.lookahead_correct / self.lookahead_predicted
                                   if self.lookahead_predicted else None),
            "prefetch_used": self.prefetch_used,
            "stall_seconds": self.stall_seconds,
            "swap_rate": self.routed_swaps / self.routed_choices if self.routed_choices else None,
        }


@dataclass(frozen=True)
class WeightFormat:
    """One weight format of the C core's table (``ferry_formats``): the
    container's code byte, the manifest name and the block geometry."""
    code: int
    name: str
    block_elems: int            #: values per block (1 for the plain floats)
    block_bytes: int            #: bytes per block

    @property
    def bits_per_weight(self) -> float:
        return self.block_bytes * 8 / self.block_elems

    def row_bytes(self, cols: int) -> int:
        """Bytes of one row of ``cols`` values (0 for none); ValueError when
        ``cols`` is not a whole number of blocks."""
        if cols < 0 or cols % self.block_elems:
            raise ValueError(f"a row of {cols} values is not a whole number of {self.name} blocks")
        return cols // self.block_elems * self.block_bytes


def _core_formats() -> dict[str, WeightFormat]:
    n = lib.ferry_formats(ffi.NULL, 0)
    rows = ffi.new("ferry_format_record[]", n)
    lib.ferry_formats(rows, n)
    return {f.name: f for f in (WeightFormat(int(r.code), ffi.string(r.name).decode(), int(r.block_elems),
                                             int(r.block_bytes)) for r in rows)}


#: THE table of weight formats, by name in code order, read once from the C
#: core (its only copy is core_c/src/formats.c); every other module takes
#: format facts (codes, block sizes, bits per weight) from here.
FORMATS: dict[str, WeightFormat] = _core_formats()
#: Names of the weight formats by code.
_FORMAT_NAMES = tuple(FORMATS)


def _profile_part(c) -> dict:
    """One ferry_profile_part as a dict: matrix products by format name, the
    other stages, and ``other_seconds`` (total minus every counted stage;
    expert_seconds includes the experts' own products, so it is not
    subtracted twice). expert_seconds less the router's products splits into
    expert_ffn_seconds, expert_wait_seconds and dispatch_seconds (the
    dispatch's own work); ``moe_layers`` counts MoE layer passes, so
    dispatch_seconds / moe_layers is the dispatch per layer and pass."""
    matmul = {}
    for code, name in enumerate(_FORMAT_NAMES):
        if c.matmul_calls[code]:
            matmul[name] = {"seconds": c.matmul_seconds[code], "calls": int(c.matmul_calls[code]),
                            "bytes": int(c.matmul_bytes[code])}
    stages = {k: getattr(c, k) for k in ("attention_seconds", "norm_seconds", "elementwise_seconds",
                                         "expert_seconds", "expert_ffn_seconds", "expert_wait_seconds",
                                         "dispatch_seconds", "pool_wait_seconds")}
    counted = sum(m["seconds"] for m in matmul.values()) + stages["attention_seconds"] + \
        stages["norm_seconds"] + stages["elementwise_seconds"]
    return {"evals": int(c.evals), "tokens": int(c.tokens), "total_seconds": c.total_seconds,
            "matmul": matmul, **stages, "pool_jobs": int(c.pool_jobs), "moe_layers": int(c.moe_layers),
            "pool_spin_jobs": int(c.pool_spin_jobs), "pool_backoffs": int(c.pool_backoffs),
            "other_seconds": max(0.0, c.total_seconds - counted)}


def _struct_to(cls, cdata):
    return cls(**{f.name: getattr(cdata, f.name) for f in fields(cls) if f.name != "arch"})


class Engine:
    """A container opened by the C core. Close it (or use ``with``) to free RAM."""

    def __init__(self, path: str | os.PathLike, *, ram_budget: int = 0, threads: int = 0,
                 verify_reads: bool = False, n_ctx: int = 0, cache_slots: int = 0, readers: int = 0,
                 direct_io: bool = True, overlap: bool = True, lookahead: bool = True, cache: bool = True,
                 lookahead_gate: bool = True, embedding_reads: bool = True, fill: bool = True,
                 usage_counts: np.ndarray | None = None, kernels: str | None = None, trunk_check: bool = True,
                 policy_state: bytes | bytearray | None = None, activations: str = DEFAULT_ACTIVATIONS,
                 prompt_chunk: int = 0):
        """Open a container. ``n_ctx`` is the context the RAM budget must leave
        room for; the switches exist to measure each mechanism (they change
        speed, never output; ``trunk_check=False`` skips the trunk's CRC check
        on open, for measuring its cost only; ``lookahead_gate=False`` reads
        every lookahead prediction however often its layer's predictions
        miss, for measuring the gate only; ``embedding_reads=False`` keeps
        an untied token embedding table in RAM instead of reading each
        token's row from trunk.bin, the same output; ``fill=False`` reads each
        expert on its first use instead of streaming every expert into a
        cache that holds them all right after opening). ``verify_reads`` checks each
        expert record's CRC32 as its read completes. ``kernels`` is one of :data:`KERNEL_CHOICES`
        (None: :func:`default_kernels`); a set this CPU cannot run raises
        FerryError (``FERRY_E_UNSUPPORTED``). ``policy_state`` is what
        :meth:`policy_state` returned in an earlier run of this model (the
        expert cache then starts from what that run learned); one that does
        not fit raises FerryError (``FERRY_E_ARG``). ``activations`` is one of
        :data:`ACTIVATION_CHOICES` (default "auto": 8-bit activations on quantized weights;
        "exact" for exact products; ``info.activations`` says which path runs). ``prompt_chunk``: tokens of
        a prompt one forward pass evaluates together (0: the core's choice, 128 on a model with experts,
        32 otherwise; ``info.prompt_chunk`` says what is in force); it changes speed and scratch RAM, never
        output."""
        self.path = Path(path)
        opts = ffi.new("ferry_open_options *")
        lib.ferry_open_options_init(opts)
        opts.ram_budget = int(ram_budget)
        opts.n_threads = int(threads)
        opts.verify_reads = int(verify_reads)
        opts.n_ctx = int(n_ctx)
        opts.cache_slots = int(cache_slots)
        opts.n_readers = int(readers)
        opts.prompt_chunk = int(prompt_chunk)
        opts.flags = ((0 if direct_io else lib.FERRY_NO_DIRECT_IO) | (0 if overlap else lib.FERRY_NO_OVERLAP)
                      | (0 if lookahead else lib.FERRY_NO_LOOKAHEAD) | (0 if cache else lib.FERRY_NO_CACHE)
                      | (0 if trunk_check else lib.FERRY_NO_TRUNK_CHECK)
                      | (0 if lookahead_gate else lib.FERRY_NO_LOOKAHEAD_GATE)
                      | (0 if embedding_reads else lib.FERRY_NO_EMBEDDING_READS)
                      | (0 if fill else lib.FERRY_NO_FILL))
        counts = None
        if usage_counts is not None:
            counts = np.ascontiguousarray(usage_counts, dtype=np.uint32)
            opts.usage_counts = ffi.from_buffer("uint32_t[]", counts)
            opts.n_usage_counts = counts.size
        state = None
        if policy_state is not None:
            state = ffi.from_buffer("char[]", policy_state)
            opts.policy_state = state
            opts.n_policy_state = len(policy_state)
        kernel_name = ffi.new("char[]", (default_kernels() if kernels is None else kernels).encode())
        opts.kernels = kernel_name
        self.activations = canonical(activations)   # what was asked; self.info.activations: what runs
        activation_name = ffi.new("char[]", self.activations.encode())
        opts.activations = activation_name
        out = ffi.new("ferry_engine **")
        err = ffi.new("ferry_error *")
        _check(lib.ferry_engine_open(os.fsencode(self.path), opts, out, err), err)
        self._ptr = out[0]
        self._sessions: weakref.WeakSet[Session] = weakref.WeakSet()
        self.ram_budget = int(ram_budget)
        c = ffi.new("ferry_model_info *")
        lib.ferry_engine_info(self._ptr, c)
        text = {name: ffi.string(getattr(c, name)).decode() for name in ("arch", "io_note", "kernels", "activations")}
        self.info = ModelInfo(**text, **{f.name: getattr(c, f.name) for f in fields(ModelInfo) if f.name not in text})

    def usage(self) -> np.ndarray:
        """Expert usage counts [n_layers, n_experts] (the hot list to save)."""
        n = self.info.n_layers * self.info.n_experts
        out = np.zeros(n, dtype=np.uint32)
        err = ffi.new("ferry_error *")
        _check(lib.ferry_engine_usage(self._live(), ffi.from_buffer("uint32_t[]", out), n, err), err)
        return out.reshape(self.info.n_layers, self.info.n_experts)

    def lookahead_gate(self) -> np.ndarray:
        """The lookahead gate [n_layers, top_k]: per layer and rank of the
        lookahead's prediction, the running share of its predictions not in
        RAM that the real router then chose. A prediction is read only while
        this is at least 0.5 (it starts at 0.4, closed until right twice
        running; layers the lookahead never predicts keep that)."""
        n = self.info.n_layers * self.info.top_k
        out = np.zeros(n, dtype=np.float32)
        err = ffi.new("ferry_error *")
        _check(lib.ferry_engine_lookahead_gate(self._live(), ffi.from_buffer("float[]", out), n, err), err)
        return out.reshape(self.info.n_layers, self.info.top_k)

    def policy_state(self) -> bytearray:
        """The expert-cache policy's learned state, to save and pass back as
        ``policy_state`` next time (docs/CACHE_POLICY.md, "Learned state
        across sessions"; about 150 MB for K3, so it is not copied again)."""
        size = ffi.new("size_t *")
        err = ffi.new("ferry_error *")
        _check(lib.ferry_engine_policy_state(self._live(), ffi.NULL, 0, size, err), err)
        out = bytearray(size[0])
        _check(lib.ferry_engine_policy_state(self._live(), ffi.from_buffer(out), len(out), size, err), err)
        return out

    def plan(self, n_ctx: int = 0) -> MemoryPlan:
        c = ffi.new("ferry_memory_plan *")
        lib.ferry_engine_plan(self._live(), int(n_ctx), c)
        return _struct_to(MemoryPlan, c)

    def session(self, n_ctx: int = 0) -> "Session":
        return Session(self, n_ctx)

    def _live(self):
        if self._ptr is None:
            raise FerryError("FERRY_E_ARG", "the engine is closed")
        return self._ptr

    def close(self) -> None:
        """Free the engine; its sessions are closed first (they borrow it)."""
        if getattr(self, "_ptr", None) is not None:
            for session in list(self._sessions):
                session.close()
            lib.ferry_engine_close(self._ptr)
            self._ptr = None

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        self.close()


@ffi.def_extern()
def _ferry_stage_cb(user, stage, pos, n_tokens, dim, hidden):
    observer = ffi.from_handle(user)
    buf = ffi.buffer(hidden, n_tokens * dim * 4)
    observer(stage, pos, np.frombuffer(buf, dtype=np.float32).reshape(n_tokens, dim).copy())


@ffi.def_extern()
def _ferry_progress_cb(user, done, total):
    return 1 if ffi.from_handle(user)(done, total) is False else 0


@ffi.def_extern()
def _ferry_vision_cb(user, stage, rows, dim, data):
    observer = ffi.from_handle(user)
    values = np.frombuffer(ffi.buffer(data, rows * dim * 4), dtype=np.float32).reshape(rows, dim)
    return 1 if observer(stage, values) is False else 0


#: The manifest's ``model.vision`` keys, as ferry_vision_config fields.
VISION_FIELDS = ("patch_size", "hidden", "qkv_hidden", "heads", "layers", "intermediate", "pos_h", "pos_w",
                 "merge_h", "merge_w", "text_hidden", "norm_eps", "projector_eps")


class Vision:
    """Kimi K3's vision tower of a container (ferry_vision.h): one image's
    patches in, its prompt rows out. ``config`` is the manifest's
    ``model.vision`` section; the core checks every tensor against it."""

    def __init__(self, path: str | os.PathLike, config: dict, *, threads: int = 0):
        c = ffi.new("ferry_vision_config *")
        try:
            for name in VISION_FIELDS:
                setattr(c, name, float(config[name]) if name.endswith("eps") else int(config[name]))
        except (KeyError, TypeError, ValueError, OverflowError) as exc:
            raise FerryError("FERRY_E_FORMAT", f"manifest.json: the vision section is malformed ({exc})") from None
        out = ffi.new("ferry_vision **")
        err = ffi.new("ferry_error *")
        _check(lib.ferry_vision_open(os.fsencode(Path(path)), c, int(threads or os.cpu_count() or 1), out, err), err)
        self._ptr = out[0]
        info = ffi.new("ferry_vision_config *")
        lib.ferry_vision_info(self._ptr, info)
        self.config = {name: getattr(info, name) for name in VISION_FIELDS}
        self.weight_bytes = int(info.weight_bytes)

    def encode(self, patches: np.ndarray, gh: int, gw: int,
               observer: Callable[[int, np.ndarray], bool | None] | None = None) -> np.ndarray:
        """``patches`` [gh * gw, 3 * p * p] -> [gh * gw / merge, text_hidden].
        ``observer(stage, rows)`` sees every stage (ferry_vision.h); returning
        False stops the encode (:class:`Cancelled`)."""
        if self._ptr is None:
            raise FerryError("FERRY_E_ARG", "the vision tower is closed")
        c = self.config
        x = np.ascontiguousarray(patches, dtype=np.float32)
        if x.shape != (gh * gw, 3 * c["patch_size"] ** 2):
            raise ValueError(f"patches must be [{gh * gw}, {3 * c['patch_size'] ** 2}]")
        rows = max(0, gh // c["merge_h"]) * max(0, gw // c["merge_w"])
        out = np.empty((rows, c["text_hidden"]), dtype=np.float32)
        err = ffi.new("ferry_error *")
        handle = ffi.new_handle(observer) if observer is not None else None
        status = lib.ferry_vision_encode(self._ptr, ffi.from_buffer("float[]", x), int(gh), int(gw),
                                         ffi.from_buffer("float[]", out),
                                         lib._ferry_vision_cb if handle is not None else ffi.NULL,
                                         handle if handle is not None else ffi.NULL, err)
        _check(status, err)
        return out

    def close(self) -> None:
        if getattr(self, "_ptr", None) is not None:
            lib.ferry_vision_close(self._ptr)
            self._ptr = None

    def __enter__(self) -> "Vision":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        self.close()


class Session:
    """One timeline of tokens on an engine. Not thread-safe, except :meth:`cancel`."""

    def __init__(self, engine: Engine, n_ctx: int = 0):
        self.engine = engine  # keeps the engine alive as long as the session
        out = ffi.new("ferry_session **")
        err = ffi.new("ferry_error *")
        _check(lib.ferry_session_new(engine._live(), int(n_ctx), out, err), err)
        self._ptr = out[0]
        engine._sessions.add(self)
        self._observer_handle = None
        self.tokens: list[int] = []  # the tokens the session holds, in order
        self._cancel_asked = False   # cancel() seen by work outside the core's evaluation (the vision tower)
        #: (SessionState, last logits or None) a recurrent model keeps for the next turn to resume from
        #: (``app.model.LoadedModel.generate``: a state cannot rewind, so it is saved where a follow-up begins)
        self.resume_point = None

    @property
    def position(self) -> int:
        return lib.ferry_session_position(self._live())

    @property
    def n_ctx(self) -> int:
        return lib.ferry_session_context(self._live())

    @property
    def prompt_step(self) -> int:
        """Tokens to evaluate per call while processing a prompt (the progress granularity of the
        pipeline and the saved-prefix step): the core's prompt chunk, so each call is one forward pass
        (a model with experts multiplies each expert's tokens of a chunk together: 128 there)."""
        return self.engine.info.prompt_chunk

    def eval(self, tokens: Sequence[int], *, all_logits: bool = False, embeds: np.ndarray | None = None,
             use: Sequence[bool] | None = None, keys: Sequence[int] | None = None) -> np.ndarray:
        """Evaluate tokens after those held; returns the last token's logits
        (``[vocab]``) or every token's (``[n, vocab]``). With ``embeds``
        (``[n, dim]``) and ``use`` (n flags), the flagged positions take
        their row of ``embeds`` as input instead of their token's embedding
        (an image's positions); ``keys`` is what :attr:`tokens` records for
        the positions (default: the tokens), so :meth:`sync` tells two
        images apart."""
        toks = np.ascontiguousarray(np.asarray(tokens, dtype=np.int32).reshape(-1))
        n = int(toks.size)
        vocab = self.engine.info.vocab
        logits = np.empty((n, vocab) if all_logits else (vocab,), dtype=np.float32)
        err = ffi.new("ferry_error *")
        if embeds is None:
            status = lib.ferry_session_eval(self._live(), ffi.from_buffer("int32_t[]", toks), n,
                                            ffi.from_buffer("float[]", logits), int(all_logits), err)
        else:
            rows = np.ascontiguousarray(embeds, dtype=np.float32)
            flags = np.ascontiguousarray(np.asarray(use, dtype=np.uint8).reshape(-1))
            if rows.shape != (n, self.engine.info.dim) or flags.size != n:
                raise ValueError(f"embeds must be [{n}, {self.engine.info.dim}] with {n} use flags")
            status = lib.ferry_session_eval_embd(self._live(), ffi.from_buffer("int32_t[]", toks),
                                                 ffi.from_buffer("float[]", rows), ffi.from_buffer("uint8_t[]", flags),
                                                 n, ffi.from_buffer("float[]", logits), int(all_logits), err)
        self._cancel_asked = False   # an evaluation consumes a cancel request (the core's flag too)
        _check(status, err)
        if keys is not None and len(keys) != n:
            raise ValueError("keys must have one entry per token")
        self.tokens.extend(int(t) for t in (toks if keys is None else keys))
        return logits

    def sync(self, prefix: Sequence[int]) -> int:
        """Make the session hold a prefix of ``prefix`` that it already shares,
        dropping anything after the common part; returns how many tokens are
        kept. The caller then evaluates ``prefix[kept:]``. Reusing the shared
        part is what keeps a follow-up turn from re-reading the conversation."""
        keep = 0
        limit = min(len(prefix), len(self.tokens))
        while keep < limit and self.tokens[keep] == prefix[keep]:
            keep += 1
        # The last token must be evaluated again to produce logits.
        if keep == len(prefix) and keep > 0:
            keep -= 1
        self.truncate(keep)
        return keep

    def truncate(self, n_keep: int) -> None:
        err = ffi.new("ferry_error *")
        _check(lib.ferry_session_truncate(self._live(), int(n_keep), err), err)
        del self.tokens[n_keep:]

    def reset(self) -> None:
        lib.ferry_session_reset(self._live())
        self.tokens.clear()

    def cancel(self) -> None:
        """Stop a running (or the next) eval between layers. Any thread."""
        ptr = self._ptr
        self._cancel_asked = True
        if ptr is not None:
            lib.ferry_session_request_cancel(ptr)

    def clear_cancel(self) -> None:
        self._cancel_asked = False
        lib.ferry_session_clear_cancel(self._live())

    def take_cancel(self) -> bool:
        """Whether :meth:`cancel` was asked since the last evaluation, consuming
        the request as an evaluation would (for work that is not an
        evaluation, such as an image in the vision tower)."""
        if not self._cancel_asked:
            return False
        self.clear_cancel()
        return True

    def observe(self, observer: StageObserver | None) -> None:
        """Receive the residual stream after each stage (see ferry.h)."""
        if observer is None:
            lib.ferry_session_set_stage_callback(self._live(), ffi.NULL, ffi.NULL)
            self._observer_handle = None
            return
        self._observer_handle = ffi.new_handle(observer)
        lib.ferry_session_set_stage_callback(self._live(), lib._ferry_stage_cb, self._observer_handle)

    def export_state(self) -> "SessionState":
        """Everything the session holds (attention caches, position, tokens), to
        restore later into a session of the same engine."""
        size = lib.ferry_session_state_size(self._live())
        blob = bytearray(size)
        err = ffi.new("ferry_error *")
        _check(lib.ferry_session_export(self._ptr, ffi.from_buffer(blob), size, err), err)
        return SessionState(tokens=list(self.tokens), blob=bytes(blob))

    def import_state(self, state: "SessionState") -> None:
        """Continue from a saved state; a state from another model or a
        damaged one raises FerryError and leaves the session as it was."""
        err = ffi.new("ferry_error *")
        blob = state.blob
        _check(lib.ferry_session_import(self._live(), ffi.from_buffer(blob), len(blob), err), err)
        if self.position != len(state.tokens):
            raise FerryError("FERRY_E_FORMAT", "the saved token list does not match the saved state")
        self.tokens = list(state.tokens)

    def set_routing(self, experts_per_token: int | None = None, cache_aware_margin: float = 0.0) -> None:
        """Opt-in routing modes that read fewer experts, for later evaluations
        (see ferry_session_set_routing in ferry.h): route each token to its top
        ``experts_per_token`` experts instead of the model's k (None or the
        model's k = exact), and with ``cache_aware_margin`` > 0 prefer experts
        already in RAM among those scoring within the margin of the last
        choice. ``set_routing(None, 0.0)`` restores exact routing."""
        err = ffi.new("ferry_error *")
        n = 0 if experts_per_token is None else int(experts_per_token)
        if experts_per_token is not None and n < 1:
            raise FerryError("FERRY_E_ARG", "experts per token must be at least 1")
        _check(lib.ferry_session_set_routing(self._live(), n, float(cache_aware_margin), err), err)

    def stats(self) -> Stats:
        c = ffi.new("ferry_stats *")
        lib.ferry_session_stats(self._live(), c)
        return _struct_to(Stats, c)

    def set_profiling(self, on: bool = True) -> None:
        """Turn the core's per-stage timers on or off for this session (their
        counters restart either way). Off by default; results never change."""
        lib.ferry_session_set_profiling(self._live(), int(bool(on)))

    def profile(self) -> dict:
        """Where evaluation time went since profiling was turned on:
        ``{"decode": part, "prompt": part}``, each part as :func:`_profile_part`."""
        c = ffi.new("ferry_profile *")
        lib.ferry_session_profile(self._live(), c)
        return {"decode": _profile_part(c.decode), "prompt": _profile_part(c.prompt)}

    def _live(self):
        if self._ptr is None:
            raise FerryError("FERRY_E_ARG", "the session is closed")
        return self._ptr

    def close(self) -> None:
        if getattr(self, "_ptr", None) is not None:
            lib.ferry_session_free(self._ptr)
            self._ptr = None

    def __del__(self) -> None:
        self.close()


@dataclass(frozen=True)
class SessionState:
    """A saved timeline: its tokens and the core's state blob (see ferry.h)."""

    tokens: list[int]
    blob: bytes

    MAGIC = b"FXSS"

    def to_bytes(self) -> bytes:
        toks = np.asarray(self.tokens, dtype="<i4").tobytes()
        return self.MAGIC + len(self.tokens).to_bytes(4, "little") + toks + self.blob

    @classmethod
    def from_bytes(cls, data: bytes) -> "SessionState":
        if len(data) < 8 or data[:4] != cls.MAGIC:
            raise FerryError("FERRY_E_FORMAT", "this is not a saved Ferry session")
        n = int.from_bytes(data[4:8], "little")
        if len(data) < 8 + 4 * n:
            raise FerryError("FERRY_E_FORMAT", "the saved session is truncated")
        tokens = np.frombuffer(data[8:8 + 4 * n], dtype="<i4").tolist()
        return cls(tokens=tokens, blob=data[8 + 4 * n:])


def container_plan(path: str | os.PathLike, n_ctx: int = 0, threads: int = 0) -> MemoryPlan:
    """The RAM plan of a container from its manifest alone (nothing is loaded);
    ``expert_bytes`` is what caching every expert would take."""
    c = ffi.new("ferry_memory_plan *")
    err = ffi.new("ferry_error *")
    _check(lib.ferry_container_plan(os.fsencode(Path(path)), int(n_ctx), int(threads), c, err), err)
    return _struct_to(MemoryPlan, c)


def q8_buffer_bytes(formats: Sequence[str], cols: int, chunk: int) -> int:
    """The scratch a session's 8-bit activations (the default's, with this CPU's
    kernel set) take for matrices stored in ``formats`` whose widest input is
    ``cols`` values, at prompt chunks of ``chunk`` tokens: the engine's own rule
    (``ferry_q8_buffer_bytes``; 0 when no format has integer kernels)."""
    codes = [FORMATS[f].code for f in formats if f in FORMATS]
    return int(lib.ferry_q8_buffer_bytes(ffi.new("int[]", codes or [0]), len(codes), int(cols), int(chunk)))


def verify(path: str | os.PathLike, progress: Callable[[int, int], bool | None] | None = None) -> None:
    """Check every checksum of a container; raises FerryError naming the first bad item."""
    err = ffi.new("ferry_error *")
    if progress is None:
        status = lib.ferry_verify(os.fsencode(Path(path)), ffi.NULL, ffi.NULL, err)
    else:
        handle = ffi.new_handle(progress)
        status = lib.ferry_verify(os.fsencode(Path(path)), lib._ferry_progress_cb, handle, err)
    _check(status, err)
