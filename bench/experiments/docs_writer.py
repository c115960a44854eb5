"""The writer's CPU during an add, and per statement inside insert_file (thread CPU of the adding thread).

    .venv/bin/python bench/experiments/docs_writer.py MEGABYTES [nograms]

Adds the cached generated corpus archive-<MB>-0 (~/.cache/ferry-bench, made by bench/docs_corpus.py
when missing) to a fresh encrypted store with 2 workers and prints JSON: wall time, the writer's and
the workers' CPU, the database size; then the costliest statements. "nograms" skips inserts into a
per-passage 4-gram FTS5 table (the layout before docs_gramvocab), to measure its share.
"""
from __future__ import annotations

import collections
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
from app.documents.store import DocumentStore  # noqa: E402
from app.store.crypto import PassphraseKeys  # noqa: E402

cpu = collections.Counter()
SKIP = {"grams": False}

class Timed:
    def __init__(self, db): self._db = db
    def __getattr__(self, k): return getattr(self._db, k)
    def _t(self, kind, sql, *a):
        key = kind + ":" + " ".join(sql.split()[:3])[:40]
        if "docs_fts_g_" in sql: key = "INSERT grams FTS"
        elif "docs_fts_w_" in sql: key = "INSERT words FTS"
        if SKIP["grams"] and "docs_fts_g_" in sql and sql.startswith("INSERT"):
            return None
        t0 = time.thread_time(); r = getattr(self._db, kind)(sql, *a); cpu[key] += time.thread_time() - t0; return r
    def executemany(self, sql, *a): return self._t("executemany", sql, *a)
    def execute(self, sql, *a): return self._t("execute", sql, *a)

orig = DocumentStore.insert_file
def insert_file(self, *a, **k):
    real = self._db; self._db = Timed(real)
    try: return orig(self, *a, **k)
    finally: self._db = real

def main():
    import docs_corpus
    mb = float(sys.argv[1]); SKIP["grams"] = len(sys.argv) > 2 and sys.argv[2] == "nograms"
    DocumentStore.insert_file = insert_file
    corpus = Path.home() / ".cache/ferry-bench" / f"archive-{mb:g}-0"
    if not corpus.is_dir():
        docs_corpus.generate(corpus, mb, 0)
    work = Path(tempfile.mkdtemp(prefix="ws-"))
    st = DocumentStore(work / "ferry.db", PassphraseKeys("x"))
    t0 = time.thread_time(); w0 = time.perf_counter()
    rep = st.add("a", [corpus], workers=2)
    tot = time.thread_time() - t0
    ch = os.times()
    print(json.dumps({"mb": mb, "nograms": SKIP["grams"], "wall_s": round(time.perf_counter() - w0, 1),
                      "writer_cpu_s": round(tot, 2), "workers_cpu_s": round(ch.children_user + ch.children_system, 2),
                      "db_mb": round(sum(p.stat().st_size for p in work.iterdir()) / 1e6, 1), "load": os.getloadavg()[0]}))
    for k, v in cpu.most_common(5): print(f"  {v:7.2f} s  {k}")
    st.close(); shutil.rmtree(work)

if __name__ == "__main__":
    main()
