"""The whole add -> search -> ask flow through `ferry docs`, in a process
where the network is impossible, and afterwards no file under the data
directory holds a planted string in plaintext."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from test_store import PLANTED, scan_for

from tests.conftest import REPO

RUNNER = Path(__file__).parent / "offline_runner.py"


def ferry_offline(home: Path, *args: str):
    env = {**os.environ, "FERRY_HOME": str(home), "FERRY_PASSPHRASE": "a long test passphrase",
           "PYTHON_KEYRING_BACKEND": "keyring.backends.fail.Keyring", "HF_HUB_OFFLINE": "1"}
    res = subprocess.run([sys.executable, str(RUNNER), *args], capture_output=True, text=True, cwd=REPO,
                         env=env, timeout=300)
    line = [ln for ln in res.stderr.splitlines() if ln.startswith("OFFLINE-RUNNER ")]
    assert line, f"{args}: {res.returncode}\n{res.stdout}\n{res.stderr}"
    report = json.loads(line[-1].split(" ", 1)[1])
    assert report["attempts"] == [], report          # nothing even tried to open a socket
    assert report["sockets"] == [], report           # and none is open (so none is listening)
    return res, report


def test_add_search_ask_offline_and_nothing_in_plaintext(demo_container, corpus_dir, tmp_path):
    home = tmp_path / "home"
    docs = tmp_path / "docs"
    shutil.copytree(corpus_dir, docs)
    (docs / "notes.txt").write_text(f"The spare key to the boathouse is taped under the {PLANTED} drawer.\n")
    (docs / "broken.pdf").write_bytes(b"%PDF-1.4 damaged")

    res, rep = ferry_offline(home, "docs", "add", "household", str(docs), "--json")
    assert rep["code"] == 1                                  # one file could not be read
    added = json.loads(res.stdout)
    assert len(added["added"]) == 6 and [f["name"] for f in added["failed"]] == ["broken.pdf"]
    assert "PDF" in added["failed"][0]["error"]

    res, _ = ferry_offline(home, "docs", "search", "household", "where is the spare boathouse key?", "-k", "3",
                           "--json")
    results = json.loads(res.stdout)["results"]
    assert len(results) == 3 and results[0]["file"] == "notes.txt" and PLANTED in results[0]["text"]
    res, _ = ferry_offline(home, "docs", "search", "household", "What is the excess for a contents claim?", "-k", "3",
                           "--json")
    assert any(r["file"] == "policy.docx" and "Contents | $40,000 | $250" in r["text"]
               for r in json.loads(res.stdout)["results"])
    res, _ = ferry_offline(home, "docs", "search", "household", "which error code means the humidity sensor failed",
                           "--json")
    top = json.loads(res.stdout)["results"][0]
    assert top["file"] == "manual.pdf" and top["page"] == 4

    res, rep = ferry_offline(home, "docs", "ask", str(demo_container), "household",
                             "How many litres does the water tank hold?", "--context-tokens", "200", "-n", "12",
                             "--json")
    assert rep["code"] == 0, res.stderr
    answer = json.loads(res.stdout)
    assert answer["prefix_state"] == "saved" and answer["passages"]
    for c in answer["passages"]:
        assert {"n", "file", "path", "page", "passage", "start", "end"} <= set(c)
    assert any("3.5 litres" in c["passage"] and c["page"] == 2 for c in answer["passages"])
    for c in answer["citations"]:
        assert f"[{c['n']}]" in answer["text"]

    assert scan_for(home, [PLANTED, "boathouse", "Monthly rent is $1,850.00", str(docs), "household"]) == []
    assert list((home / "documents" / "states").glob("*.fxds"))
