"""Retrieval quality on the test corpus: recall@k and MRR of each mode.

    .venv/bin/python tests/documents/retrieval_eval.py      (prints JSON)

A question's relevant passages are the chunks of its file whose text holds
its answer (an exact sentence or phrase of the document)."""
from __future__ import annotations

import atexit
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from app.documents.index import FtsIndex  # noqa: E402
from app.documents.retrieve import search  # noqa: E402
from app.documents.store import DocumentStore  # noqa: E402
from app.store.crypto import EphemeralKeys  # noqa: E402

_OPEN: list = []     # the stores behind the indexes handed out (closed, and their folders removed, at exit)


@atexit.register
def _close_all() -> None:
    for store, tmp in _OPEN:
        store.close()
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


def corpus_index(folder: Path, *, db: Path | None = None, name: str = "eval") -> FtsIndex:
    """The corpus in a real (encrypted, throw-away key) store; ``db`` may hold other collections."""
    tmp = None
    if db is None:
        tmp = tempfile.mkdtemp(prefix="ferry-eval-")
        db = Path(tmp) / "ferry.db"
    store = DocumentStore(db, EphemeralKeys())
    store.add(name, [folder], workers=1)
    _OPEN.append((store, tmp))
    index = store.index(name)
    index.chunks = index.head(None)
    return index


def _norm(text: str) -> str:
    return " ".join(text.split())


def evaluate(index: FtsIndex, questions: list[dict], mode: str, k: int = 3, **kw) -> dict:
    hits_at_k = 0
    rr = 0.0
    misses = []
    for q in questions:
        ranked = search(index, q["q"], k=0, mode=mode, **kw)
        rank = next((i + 1 for i, h in enumerate(ranked)
                     if h.chunk.file_name == q["file"] and _norm(q["answer"]) in _norm(h.chunk.text)), None)
        assert any(c.file_name == q["file"] and _norm(q["answer"]) in _norm(c.text) for c in index.chunks), q
        if rank is not None and rank <= k:
            hits_at_k += 1
        else:
            misses.append((q["q"], rank))
        rr += 1.0 / rank if rank else 0.0
    n = len(questions)
    return {"mode": mode, f"recall@{k}": round(hits_at_k / n, 4), "mrr": round(rr / n, 4), "questions": n,
            "misses": misses}


def main() -> None:
    from corpus_tools import build_corpus, questions

    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        index = corpus_index(build_corpus(Path(tmp)))
        built = time.perf_counter() - t0
        qs = questions()
        out = {"chunks": len(index), "build_seconds": round(built, 3),
               "results": [evaluate(index, qs, m) for m in ("bm25", "ngram", "hybrid")]}
        for r in out["results"]:
            r["recall@1"] = evaluate(index, qs, r["mode"], k=1)["recall@1"]
            r["recall@5"] = evaluate(index, qs, r["mode"], k=5)["recall@5"]
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
