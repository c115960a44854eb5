"""Replay expert-routing traces through the C expert-cache simulator.

A thin layer over ``core_c/include/ferry_cachesim.h``: the C side owns the
cache model, the policies and Belady's optimum; this module reads trace
files, computes hot-list counts and formats results. Every function that
calls C takes ``lib``, an ``(ffi, lib)`` pair of a compiled module exposing
that header; ``None`` means the core, ``app.engine._ferry_c``.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Sequence

import numpy as np

POLICY_PREFIX = "FERRY_CACHE_POLICY_"
ENGINE = "engine"
_ERR_LEN = 256


def load_trace(path: str | Path) -> np.ndarray:
    """Reads a JSON-lines routing trace into int32 [tokens, layers, top_k].

    Each line is ``{"tok": t, "layers": [[ids of layer 0], ...]}``; every
    line must have the shape of the first. Raises ValueError naming the
    line on bad JSON or shape.
    """
    rows: list[list[list[int]]] = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{number}: not JSON ({e.msg})") from None
            layers = record.get("layers") if isinstance(record, dict) else None
            problem = _shape_problem(layers, rows[0] if rows else None)
            if problem:
                raise ValueError(f"{path}:{number}: {problem}")
            rows.append(layers)
    if not rows:
        raise ValueError(f"{path}: no tokens")
    return np.array(rows, dtype=np.int32)


def _shape_problem(layers, first) -> str | None:
    """Why `layers` is not a [layers][top_k] int list like `first`, or None."""
    if not isinstance(layers, list) or not layers:
        return "'layers' must be a non-empty list of expert-id lists"
    for i, ids in enumerate(layers):
        if not isinstance(ids, list) or not ids:
            return f"layer {i} must be a non-empty list of expert ids"
        if not all(type(e) is int and 0 <= e < 2**31 for e in ids):
            return f"layer {i}: expert ids must be non-negative integers"
    if len({len(ids) for ids in layers}) != 1:
        return "every layer must list the same number of experts"
    if first is not None and (len(layers), len(layers[0])) != (len(first), len(first[0])):
        return (f"shape {len(layers)}x{len(layers[0])} differs from the first line's "
                f"{len(first)}x{len(first[0])}")
    return None


def usage_counts(trace: np.ndarray, experts_per_layer: int) -> np.ndarray:
    """The hot list the engine would save after running `trace`: uint32
    request counts indexed layer * experts_per_layer + expert."""
    trace = _as_trace(trace)
    if trace.min() < 0 or trace.max() >= experts_per_layer:
        raise ValueError(f"expert ids must be in [0, {experts_per_layer})")
    n_layers = trace.shape[1]
    keys = np.arange(n_layers, dtype=np.int64)[None, :, None] * experts_per_layer + trace
    return np.bincount(keys.ravel(), minlength=n_layers * experts_per_layer).astype(np.uint32)


def policy_names(lib=None) -> dict[str, int]:
    """Policy name (lower case, 'engine' included) -> FERRY_CACHE_POLICY_* value."""
    _, c = _resolve(lib)
    names = {n[len(POLICY_PREFIX):].lower(): getattr(c, n)
             for n in dir(c) if n.startswith(POLICY_PREFIX) and not n.endswith("_COUNT")}
    return dict(sorted(names.items(), key=lambda item: (item[1], item[0] == ENGINE)))


def policy_bytes(n_layers: int, experts_per_layer: int, slots: int, policy: str = ENGINE, lib=None) -> int:
    """RAM the policy's own state takes over a ``slots``-record cache of a model
    with ``n_layers`` layer indices (the engine's policy spans every layer)
    and ``experts_per_layer`` experts: the C core's own count, the one the
    engine's budget subtracts (ferry_cache_policy_bytes). 0 without experts."""
    if n_layers < 1 or experts_per_layer < 1 or slots < 1:
        return 0
    pair = _resolve(lib)
    names = policy_names(pair)
    if policy not in names:
        raise ValueError(f"unknown policy '{policy}' (choose from {', '.join(names)})")
    return int(pair[1].ferry_cache_policy_bytes(names[policy], n_layers, experts_per_layer, slots))


def simulate(trace: np.ndarray, experts_per_layer: int, slots: int, policy: str = ENGINE,
             prior: np.ndarray | None = None, lib=None, learn_tokens: int = 0) -> dict:
    """Replays `trace` ([tokens, layers, top_k] ids) through a `slots`-record
    cache under `policy`, LRU and OPT. `prior` is an optional hot list
    (see usage_counts) the policy starts from. With `learn_tokens` > 0 the
    policy first learns from the first learn_tokens tokens (an earlier
    session), then replays the rest with an empty cache and that learned
    state (the policy's whole learned state, not only the hot list: see
    ferry_cache_simulate_learned); every figure is then for the rest only.
    Returns a dict of hit_rate,
    lru_hit_rate, opt_hit_rate, hits, misses, requests, policy (the
    canonical name, e.g. 'transit' for 'engine'), slots and ratio_to_opt.
    Raises ValueError with the C side's message on bad arguments."""
    pair = _resolve(lib)
    names = policy_names(pair)
    if policy not in names:
        raise ValueError(f"unknown policy '{policy}' (choose from {', '.join(names)})")
    trace = _as_trace(trace)
    if learn_tokens and prior is not None:
        raise ValueError("give either a prior hot list or learn_tokens, not both")
    if learn_tokens and not 0 < learn_tokens < trace.shape[0]:
        raise ValueError(f"learn_tokens must be in [1, {trace.shape[0]}), got {learn_tokens}")
    chosen = _run(pair, trace, experts_per_layer, slots, names[policy], prior, learn_tokens)
    rest = trace[learn_tokens:]
    lru = _run(pair, rest, experts_per_layer, slots, names["lru"], None)
    opt = _run(pair, rest, experts_per_layer, slots, None, None)
    canonical = next(n for n, v in names.items() if v == names[policy] and n != ENGINE)
    return {
        "policy": canonical,
        "slots": slots,
        "hit_rate": chosen["hit_rate"],
        "lru_hit_rate": lru["hit_rate"],
        "opt_hit_rate": opt["hit_rate"],
        "ratio_to_opt": chosen["hit_rate"] / opt["hit_rate"] if opt["hit_rate"] > 0 else None,
        "hits": chosen["hits"],
        "misses": chosen["misses"],
        "requests": chosen["requests"],
    }


def _resolve(lib):
    if lib is not None:
        return lib
    from app.engine.binding import ffi, lib   # the compiled core only through its binding

    return ffi, lib


def _as_trace(trace) -> np.ndarray:
    trace = np.ascontiguousarray(trace, dtype=np.int32)
    if trace.ndim != 3 or 0 in trace.shape:
        raise ValueError(f"trace must be a non-empty [tokens, layers, top_k] array, got shape {trace.shape}")
    return trace


def _run(pair, trace: np.ndarray, experts_per_layer: int, slots: int, policy: int | None,
         prior: np.ndarray | None, learn_tokens: int = 0) -> dict:
    """One C replay; policy None means OPT."""
    ffi, c = pair
    n_tokens, n_layers, top_k = trace.shape
    out = ffi.new("ferry_cachesim_result *")
    err = ffi.new("char[]", _ERR_LEN)
    ids = ffi.cast("const int32_t *", ffi.from_buffer(trace))
    if policy is None:
        status = c.ferry_cache_simulate_opt(ids, n_tokens, n_layers, top_k, experts_per_layer,
                                            slots, out, err, _ERR_LEN)
    elif learn_tokens:
        status = c.ferry_cache_simulate_learned(ids, n_tokens, n_layers, top_k, experts_per_layer,
                                                slots, policy, learn_tokens, out, err, _ERR_LEN)
    else:
        counts = ffi.NULL
        if prior is not None:
            prior = np.ascontiguousarray(prior, dtype=np.uint32).ravel()
            if prior.size != n_layers * experts_per_layer:
                raise ValueError(f"prior must hold {n_layers} x {experts_per_layer} counts, "
                                 f"got {prior.size}")
            counts = ffi.cast("const uint32_t *", ffi.from_buffer(prior))
        status = c.ferry_cache_simulate(ids, n_tokens, n_layers, top_k, experts_per_layer, slots,
                                        policy, counts, out, err, _ERR_LEN)
    if status != c.FERRY_CACHE_OK:
        raise ValueError(ffi.string(err).decode("utf-8", "replace"))
    return {"hits": out.hits, "misses": out.misses, "requests": out.requests,
            "hit_rate": out.hit_rate}


def _describe(result: dict, prior_tokens: int, learned: bool = False) -> str:
    ratio = result["ratio_to_opt"]
    what = "learned state" if learned else "hot list"
    warm = f", warm ({what}) from the first {prior_tokens} tokens" if prior_tokens else ", cold"
    return (f"{result['policy']} with {result['slots']} slots{warm}: "
            f"hit rate {100 * result['hit_rate']:.1f}% "
            f"(LRU {100 * result['lru_hit_rate']:.1f}%, OPT {100 * result['opt_hit_rate']:.1f}%"
            + (f", {ratio:.3f} of OPT" if ratio is not None else "")
            + f") over {result['requests']} requests")


def main(argv: Sequence[str] | None = None, lib=None) -> int:
    """``ferry cache-sim``: replay a trace file and print the hit rates."""
    parser = argparse.ArgumentParser(
        prog="ferry cache-sim",
        description="Replay an expert-routing trace through the expert cache and compare "
                    "the policy with LRU and Belady's optimum (OPT).")
    parser.add_argument("--trace", required=True, help="JSON-lines routing trace")
    parser.add_argument("--experts-per-layer", type=int, required=True, metavar="E")
    parser.add_argument("--slots", type=int, required=True, metavar="N",
                        help="cache size in expert records, across all layers")
    parser.add_argument("--policy", default=ENGINE,
                        help="engine (default), lru, lfu, lfu_lru, lfu_aging, lru2, twoq, arc, "
                             "layer_lru, gdsf, reuse, echo or transit")
    parser.add_argument("--prior-tokens", type=int, default=0, metavar="M",
                        help="warm start: learn the hot list from the first M tokens and "
                             "replay only the rest")
    parser.add_argument("--learned", action="store_true",
                        help="with --prior-tokens: the first M tokens teach the policy's whole "
                             "learned state (what the engine saves between sessions), not only "
                             "the hot list; the rest is replayed with an empty cache")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    try:
        trace = load_trace(args.trace)
        if not 0 <= args.prior_tokens < trace.shape[0]:
            raise ValueError(f"--prior-tokens must be in [0, {trace.shape[0]})")
        if args.learned and not args.prior_tokens:
            raise ValueError("--learned needs --prior-tokens M")
        if args.learned:
            result = simulate(trace, args.experts_per_layer, args.slots, args.policy, lib=lib,
                              learn_tokens=args.prior_tokens)
        else:
            prior = (usage_counts(trace[:args.prior_tokens], args.experts_per_layer)
                     if args.prior_tokens else None)
            result = simulate(trace[args.prior_tokens:], args.experts_per_layer, args.slots,
                              args.policy, prior, lib)
    except (OSError, ValueError) as e:
        print(f"ferry cache-sim: error: {e}", file=sys.stderr)
        return 2
    result["prior_tokens"] = args.prior_tokens
    result["learned"] = args.learned
    print(json.dumps(result) if args.json else _describe(result, args.prior_tokens, args.learned))
    return 0


if __name__ == "__main__":
    sys.exit(main())
