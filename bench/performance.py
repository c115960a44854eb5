"""The page of current figures, docs/PERFORMANCE.md, made from the benches' JSON.

    python bench/vs_llamacpp.py --json ... | python bench/performance.py record vs_llamacpp --command "python bench/vs_llamacpp.py --json ..."
    python bench/performance.py render            # rewrite docs/PERFORMANCE.md
    python bench/performance.py check             # exit 1 if the page is not what render would write

Each maintained bench has one results file, ``bench/results/NAME.json``: the
latest run worth showing, with its command, machine, date and load. ``record``
stores a bench's JSON output there (the machine, date and load average are
read at that moment); ``render`` turns every results file into one section of
the page. A results file either holds the bench's own ``output`` (and the
page's rows are computed from it here, by the bench's extractor) or, for
figures measured before this page existed, ``rows`` transcribed from the
dated log with the entry they came from in ``source``. The dated notes,
negative results included, stay in docs/bench-log/.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
PAGE = ROOT / "docs" / "PERFORMANCE.md"

HEADER = """# Performance: how fast is Ferry now?

The current figure for each maintained benchmark: what was measured, the
command, the machine, the date and the machine's load. This page is written
by `python bench/performance.py render` from `bench/results/*.json`; do not
edit it by hand (record a new run instead, see the script). Every dated
measurement, negative results included, is in [bench-log/](bench-log/README.md).

Ratios are Ferry / peer from one run with the engines in interleaved rounds
(above 1: Ferry is faster). These machines are 2-core x86-64 VMs; Ferry's
users are on Apple Silicon, so the figures say how the code behaves, not how
fast a Mac will be.
"""


def machine() -> str:
    """One line naming this machine: CPU model, cores, memory, OS."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = ""
    try:
        kib = int(Path("/proc/meminfo").read_text().split()[1])
        mem = f", {kib / 2**20:.0f} GiB"
    except (OSError, ValueError, IndexError):
        pass
    return f"{cpu}, {os.cpu_count()} cores{mem}, {platform.system()} {platform.machine()}"


def record(name: str, command: str, output: dict, title: str | None = None) -> Path:
    """Store one bench run as bench/results/NAME.json (replacing the previous one)."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    entry = {
        "bench": name,
        "title": title or TITLES.get(name, name),
        "command": command,
        "machine": machine(),
        "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "load": "%.1f / %.1f / %.1f (1 / 5 / 15 min)" % os.getloadavg(),
        "output": output,
    }
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(entry, indent=1) + "\n")
    return path


# ---------------------------------------------------------------- extractors

def _x(v: float) -> str:
    return f"{v:.2f}x"


def rows_vs_llamacpp(out: dict) -> list[dict]:
    """Ferry (its default) over llama.cpp per file, as bench/vs_llamacpp.py --json writes it (``files`` ->
    each file's ``median`` per engine and ``ferry_over_llama_cpp``): decode, prompt 128 and 1,024 with both
    engines' speeds, and the peak memory."""
    rows, rss = [], []
    metrics = ("decode_tok_s", "prompt128_tok_s", "prompt1024_tok_s")
    for file, result in out.get("files", {}).items():
        ratio, med = result.get("ferry_over_llama_cpp"), result.get("median", {})
        if not ratio:
            continue
        speeds = "".join(" (%s %s tok/s)" % (name, " / ".join(f"{med[eng][m]:.1f}" for m in metrics))
                         for eng, name in (("ferry", "Ferry"), ("llama_cpp", "llama.cpp")) if med.get(eng))
        rows.append({"figure": f"{file}: Ferry / llama.cpp, decode / prompt 128 / prompt 1,024",
                     "value": " / ".join(_x(ratio[m]) for m in metrics) + speeds})
        rss.append(f"{file} {ratio['peak_rss_bytes']:.2f}")
    if rss:
        rows.append({"figure": "peak RSS, Ferry / llama.cpp", "value": ", ".join(rss)})
    rows += rows_memory_bound(out)
    return rows


def rows_memory_bound(out: dict) -> list[dict]:
    """Decode's share of the memory-read bound per file (``files`` -> ``memory_bound``), Ferry / llama.cpp,
    and how the read was measured: since session 19 each round against the read probed beside it, the
    median over rounds (``decode_share_rounds``); before, the median decode against the best of the reads
    before and after the rounds."""
    shares, per_round = [], False
    for file, result in out.get("files", {}).items():
        mb = result.get("memory_bound") or {}
        share = mb.get("decode_share") or {}
        if "ferry" not in share:
            continue
        per_round = per_round or "decode_share_rounds" in mb
        both = " / ".join(f"{share[e]:.0%}" for e in ("ferry", "llama_cpp") if e in share)
        shares.append(f"{file} {both} ({mb['weight_bytes_per_token'] / 1e6:.0f} MB a token, "
                      f"{mb['memory_read_gb_s']:.1f} GB/s)")
    if not shares:
        return []
    read = out.get("memory_read_gb_s") or {}
    how = ("median over rounds of each round's decode against the read probed beside it"
           + (f" (probes {read['min']:.1f}-{read['max']:.1f} GB/s)" if "min" in read else "")
           if per_round else "median decode against the best of the reads before and after the rounds")
    return [{"figure": f"decode's share of the memory-read bound, Ferry / llama.cpp ({how})",
             "value": "; ".join(shares)}]


def rows_generic(out: dict, prefix: str = "") -> list[dict]:
    """Every number in the bench's JSON, by its key path (for benches without an extractor)."""
    rows = []
    for key, val in out.items():
        name = f"{prefix}{key}"
        if isinstance(val, dict):
            rows += rows_generic(val, name + ".")
        elif isinstance(val, (int, float)) and not isinstance(val, bool):
            rows.append({"figure": name, "value": f"{val:g}"})
    return rows


EXTRACTORS = {"vs_llamacpp": rows_vs_llamacpp}
TITLES = {"vs_llamacpp": "Dense models against llama.cpp (the same GGUF files, both at their defaults)"}


def rows_of(entry: dict) -> list[dict]:
    if "rows" in entry:
        return entry["rows"]
    return EXTRACTORS.get(entry["bench"], rows_generic)(entry.get("output", {}))


# ---------------------------------------------------------------- the page

def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def render(results: Path = RESULTS) -> str:
    entries = [json.loads(p.read_text()) for p in sorted(results.glob("*.json"))]
    entries.sort(key=lambda e: (e.get("order", 100), e["bench"]))
    parts = [HEADER]
    for e in entries:
        parts.append(f"\n## {e.get('title', e['bench'])}\n\n")
        parts.append(f"- command: `{e['command']}`\n")
        parts.append(f"- machine: {e['machine']}\n")
        parts.append(f"- date: {e['date']}; load: {e.get('load', 'not recorded')}\n")
        if e.get("source"):
            parts.append(f"- transcribed from: {e['source']}\n")
        if e.get("note"):
            parts.append(f"- {e['note']}\n")
        parts.append("\n| figure | value |\n| --- | --- |\n")
        for r in rows_of(e):
            parts.append(f"| {_cell(r['figure'])} | {_cell(r['value'])} |\n")
    return "".join(parts)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    rec = sub.add_parser("record", help="store a bench's JSON (standard input) as its current figure")
    rec.add_argument("name")
    rec.add_argument("--command", required=True, help="the command that printed the JSON")
    rec.add_argument("--title")
    rec.add_argument("--no-render", action="store_true")
    sub.add_parser("render", help="rewrite docs/PERFORMANCE.md")
    sub.add_parser("check", help="exit 1 when docs/PERFORMANCE.md is not what render writes")
    a = ap.parse_args(argv)
    if a.cmd == "record":
        text = sys.stdin.read().strip()
        try:
            output = json.loads(text.splitlines()[-1] if text else "")
        except (json.JSONDecodeError, IndexError):
            try:
                output = json.loads(text)
            except json.JSONDecodeError as e:
                print(f"performance: standard input is not a bench's JSON ({e})", file=sys.stderr)
                return 2
        print(record(a.name, a.command, output, a.title))
        if a.no_render:
            return 0
    if a.cmd in ("record", "render"):
        PAGE.write_text(render())
        print(PAGE)
        return 0
    if PAGE.read_text() != render():
        print("docs/PERFORMANCE.md is stale: run python bench/performance.py render", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
