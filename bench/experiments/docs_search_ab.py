"""Search latency of this checkout against an earlier revision's, in one process on one database:

    .venv/bin/python bench/experiments/docs_search_ab.py --json KEPT_DIR/home/ferry.db --against REV [--rounds 4]

The earlier revision's ``app/documents/index.py`` (``git show REV:...``) is loaded beside this
checkout's, each on its own connection to the same database (the earlier one with SQLite's default
2 MB page cache, as it had). First every full ranking (every candidate, ids and scores, modes hybrid,
bm25 and ngram) of the bench's questions and the test corpus's 58 is compared: a speed change must
not change output. Then the questions are asked in shuffled order, the two versions alternating per
question, for ``--rounds`` rounds: p50 / p95 of wall time and of the process's CPU time (the search is
single-threaded, so CPU time is the figure a loaded machine disturbs least), and the mean ratio
new / old. The database must hold the collection "archive" (bench/docs_scale.py --keep / --measure).
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "tests" / "documents"))


def _old_index_module(rev: str, folder: Path):
    src = subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:app/documents/index.py"],
                         capture_output=True, text=True, check=True).stdout
    path = folder / "index_at_rev.py"
    path.write_text(src, encoding="utf-8")
    spec = importlib.util.spec_from_file_location("index_at_rev", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["index_at_rev"] = module        # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def run(db: Path, rev: str, rounds: int, seed: int) -> dict:
    from corpus_tools import questions
    from docs_scale import MULTI, PHRASES, SINGLE, _pct

    from app.documents.retrieve import search
    from app.documents.store import DocumentStore, fts_tables
    from app.store.crypto import PassphraseKeys

    kinds = {"single_word": SINGLE, "multi_word": MULTI, "phrase": PHRASES,
             "test_questions": [q["q"] for q in questions()]}
    store = DocumentStore(db, PassphraseKeys("bench passphrase"))
    with tempfile.TemporaryDirectory() as tmp:
        old_module = _old_index_module(rev, Path(tmp))
        new = store.index("archive")
        old_store = store.clone()
        try:
            old = old_module.FtsIndex(old_store.db, new.collection_id, *fts_tables(new.collection_id))
            old_store.db.execute("PRAGMA cache_size = -2000")
            load_before = os.getloadavg()
            checked = 0
            for qs in kinds.values():
                for q in qs:
                    for mode in ("hybrid", "bm25", "ngram"):
                        a = [(h.chunk.id, h.score, h.bm25, h.ngram) for h in search(old, q, k=0, mode=mode)]
                        b = [(h.chunk.id, h.score, h.bm25, h.ngram) for h in search(new, q, k=0, mode=mode)]
                        if a != b:
                            raise SystemExit(f"different rankings for {q!r} ({mode}): {rev} and this checkout")
                        checked += 1
            wall = {(v, k): [] for v in ("old", "new") for k in kinds}
            cpu = {(v, k): [] for v in ("old", "new") for k in kinds}
            rng = random.Random(seed)
            for r in range(rounds):
                order = [("old", old), ("new", new)] if r % 2 == 0 else [("new", new), ("old", old)]
                for kind, qs in kinds.items():
                    for q in rng.sample(qs, len(qs)):
                        for name, idx in order:
                            c0, t0 = time.process_time(), time.perf_counter()
                            search(idx, q, k=5)
                            wall[(name, kind)].append((time.perf_counter() - t0) * 1000)
                            cpu[(name, kind)].append((time.process_time() - c0) * 1000)
        finally:
            old_store.close()
            store.close()
    out = {}
    for kind in kinds:
        row = {}
        for what, data in (("wall", wall), ("cpu", cpu)):
            o, n = data[("old", kind)], data[("new", kind)]
            row[what] = {"old_p50_ms": round(_pct(o, 50), 1), "old_p95_ms": round(_pct(o, 95), 1),
                         "new_p50_ms": round(_pct(n, 50), 1), "new_p95_ms": round(_pct(n, 95), 1),
                         "mean_ratio": round(statistics.mean(n) / statistics.mean(o), 2)}
        out[kind] = row
    return {"against": rev, "passages": len(new), "identical_rankings": checked, "rounds": rounds,
            "load_before": [round(x, 1) for x in load_before], "load_after": [round(x, 1) for x in os.getloadavg()],
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "search": out}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("db", type=Path, help="a kept bench database (its ferry.db)")
    ap.add_argument("--against", required=True, help="the git revision to compare with")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    print(json.dumps(run(args.db, args.against, args.rounds, args.seed), indent=None if args.json else 1))


if __name__ == "__main__":
    main()
