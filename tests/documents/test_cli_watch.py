"""`ferry docs reindex` and `ferry docs add --watch` through the real CLI in a child process:
a changed, a new and a deleted file are picked up; Ctrl-C stops the watch cleanly."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO

CLI = "import sys; from app.cli import main; sys.exit(main(sys.argv[1:]))"


def _env(home: Path) -> dict:
    return {**os.environ, "FERRY_HOME": str(home), "FERRY_PASSPHRASE": "a long test passphrase",
            "PYTHON_KEYRING_BACKEND": "keyring.backends.fail.Keyring", "PYTHONFAULTHANDLER": "1"}


def ferry(home: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", CLI, "docs", *args], capture_output=True, text=True, cwd=REPO,
                          env=_env(home), timeout=120)


def _names(home: Path) -> dict:
    res = ferry(home, "list", "notes", "--json")
    assert res.returncode == 0, res.stderr
    return {f["name"]: f["chunks"] for f in json.loads(res.stdout)}


def test_reindex_picks_up_new_changed_and_deleted_files(tmp_path):
    home, docs = tmp_path / "home", tmp_path / "docs"
    docs.mkdir()
    (docs / "a.txt").write_text("The boiler was serviced in March by Northgate Heating.\n")
    (docs / "b.txt").write_text("The tenancy deposit is held by the deposit protection scheme.\n")
    assert ferry(home, "add", "notes", str(docs), "--json").returncode == 0
    (docs / "a.txt").write_text("The boiler was replaced in October; the zebracorn valve was fitted.\n")
    (docs / "b.txt").unlink()
    (docs / "c.txt").write_text("Council tax is due on the first of each month.\n")
    res = ferry(home, "reindex", "notes", "--json")
    assert res.returncode == 0, res.stderr
    report = json.loads(res.stdout)
    assert sorted(Path(p).name for p in report["added"]) == ["a.txt", "c.txt"]
    assert sorted(_names(home)) == ["a.txt", "c.txt"]
    hits = json.loads(ferry(home, "search", "notes", "zebracorn", "--json").stdout)["results"]
    assert hits and "zebracorn" in hits[0]["text"]
    bad = ferry(home, "reindex", "nothing-here")
    assert bad.returncode == 1 and "no collection 'nothing-here'" in bad.stderr and "Traceback" not in bad.stderr


def test_add_watch_picks_up_a_changed_file_until_interrupted(tmp_path):
    home, docs = tmp_path / "home", tmp_path / "docs"
    docs.mkdir()
    (docs / "a.txt").write_text("The boiler was serviced in March by Northgate Heating.\n")
    proc = subprocess.Popen([sys.executable, "-c", CLI, "docs", "add", "notes", str(docs), "--watch", "--json",
                             "--interval", "0.2"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=REPO, env=_env(home),
                            # a suite started as a background job (`cmd &`) has SIGINT ignored, the
                            # child would inherit that and Python would install no Ctrl-C handler
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 60
        line = ""
        while "watching" not in line:           # the add is done and the watcher runs
            assert time.monotonic() < deadline and proc.poll() is None
            line = proc.stderr.readline()
        time.sleep(0.3)
        (docs / "a.txt").write_text("The boiler was replaced in October; the zebracorn valve was fitted.\n")
        (docs / "new.txt").write_text("Council tax is due on the first of each month.\n")
        seen: set[str] = set()
        buf = ""
        while seen != {"a.txt", "new.txt"}:
            assert time.monotonic() < deadline and proc.poll() is None, buf
            buf += proc.stdout.readline()
            try:
                report = json.loads(buf)
            except ValueError:
                continue
            buf = ""
            seen |= {Path(p).name for p in report.get("added", [])}
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            out, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            # say where it hangs (PYTHONFAULTHANDLER: SIGABRT prints every thread's stack to stderr)
            proc.send_signal(signal.SIGABRT)
            out, err = proc.communicate(timeout=30)
            pytest.fail(f"docs add --watch did not stop within 30 s of Ctrl-C; its threads:\n{err}")
    assert proc.returncode == 0, err
    assert "stopped watching" in err and "Traceback" not in err
    assert _names(home).keys() == {"a.txt", "new.txt"}
    hits = json.loads(ferry(home, "search", "notes", "zebracorn", "--json").stdout)["results"]
    assert hits and "zebracorn" in hits[0]["text"]
