"""What the integrity checks cost: the trunk's CRC32s checked on every open,
and ``--verify-reads`` (each expert record's CRC32 checked as it lands).

    python bench/integrity.py CONTAINER [CONTAINER...] [--rounds 5] [--tokens 24]

For each container, in interleaved rounds (so a noisy neighbour slows both
alike), with the files in the page cache after a first warm-up open:

* open: seconds to open the engine with the trunk check off and on; the
  difference, per GB of trunk, is the check's cost;
* verify_reads (MoE containers only): decoding the same tokens with the expert
  cache off (every expert use is a read) with the record check off and on;
  the difference, over the GB read, is the check's cost per GB.

Medians over the rounds. Prints one JSON object.
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

from app.engine.binding import Engine  # noqa: E402

GB = 1e9


def open_seconds(container: Path, trunk_check: bool) -> float:
    t0 = time.perf_counter()
    with Engine(container, trunk_check=trunk_check, n_ctx=64):
        seconds = time.perf_counter() - t0
    return seconds


def decode(container: Path, verify_reads: bool, tokens: list[int]) -> tuple[float, int]:
    with Engine(container, verify_reads=verify_reads, cache=False, lookahead=False, n_ctx=64) as engine:
        s = engine.session(64)
        t0 = time.perf_counter()
        for t in tokens:
            s.eval([t])
        return time.perf_counter() - t0, s.stats().bytes_read


def measure(container: Path, rounds: int, n_tokens: int) -> dict:
    open_seconds(container, True)   # warm the page cache
    with Engine(container, n_ctx=64) as e:
        info = e.info
    tokens = [(7 * i + 3) % info.vocab for i in range(n_tokens)]
    off, on, dec_off, dec_on, read = [], [], [], [], 0
    for _ in range(rounds):
        off.append(open_seconds(container, False))
        on.append(open_seconds(container, True))
        if info.n_moe_layers:
            s_off, read = decode(container, False, tokens)
            s_on, read_on = decode(container, True, tokens)
            assert read_on == read
            dec_off.append(s_off)
            dec_on.append(s_on)
    o_off, o_on = statistics.median(off), statistics.median(on)
    out = {"container": str(container), "trunk_bytes": info.trunk_bytes,
           "open_seconds_no_check": round(o_off, 4), "open_seconds_checked": round(o_on, 4),
           "trunk_check_seconds": round(o_on - o_off, 4),
           "trunk_check_seconds_per_gb": round((o_on - o_off) / (info.trunk_bytes / GB), 4),
           "open_ratio": round(o_on / o_off, 3)}
    if info.n_moe_layers:
        d_off, d_on = statistics.median(dec_off), statistics.median(dec_on)
        out.update({"decode_tokens": n_tokens, "expert_bytes_read": read,
                    "decode_seconds_no_verify": round(d_off, 4), "decode_seconds_verify": round(d_on, 4),
                    "verify_reads_seconds_per_gb": round((d_on - d_off) / (read / GB), 4),
                    "decode_ratio": round(d_on / d_off, 3)})
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("containers", nargs="+", type=Path)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=24)
    args = ap.parse_args(argv)
    results = [measure(c, args.rounds, args.tokens) for c in args.containers]
    print(json.dumps({"machine": platform.processor() or platform.machine(), "rounds": args.rounds,
                      "date": time.strftime("%Y-%m-%d"), "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
