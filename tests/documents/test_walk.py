"""Issue 18, item 4: a hostile document folder. FIFOs, devices, sockets,
links to them, files over the size limit and names that are not UTF-8 are
skipped, each named with its reason, and the rest is added."""
from __future__ import annotations

import json
import os
import socket
import time

import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")   # the panel test's window

from app.documents.extract import ExtractError
from app.documents.walk import Skip, display_name, iter_document_files, read_document_bytes
from tests.conftest import run_ferry

NOTE = "The boiler in the cellar was serviced in March; the next service is due in September."


@pytest.fixture
def hostile(tmp_path):
    d = tmp_path / "docs"
    (d / "sub").mkdir(parents=True)
    (d / "ok.txt").write_text(NOTE)
    (d / "sub" / "also ok.md").write_text("# Heating\n\n" + NOTE)
    os.mkfifo(d / "pipe.txt")
    (d / "zero.txt").symlink_to("/dev/zero")
    (d / "null.md").symlink_to("/dev/null")
    (d / "broken.txt").symlink_to(d / "nowhere.txt")
    (d / "big.txt").write_bytes(b"a" * 5000)
    bad = os.fsencode(str(d)) + b"/caf\xe9.txt"      # Latin-1, not UTF-8
    with open(bad, "wb") as f:
        f.write(NOTE.encode())
    (d / "linked-folder").symlink_to(d / "sub")
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(d / "s.txt"))
    yield d
    sock.close()


def test_walk_names_every_skip_with_its_reason(hostile):
    items = list(iter_document_files([hostile], max_bytes=4096))
    files = sorted(p.name for p in items if not isinstance(p, Skip))
    skips = {display_name(s.path.name): s.reason for s in items if isinstance(s, Skip)}
    assert files == ["also ok.md", "ok.txt"]
    assert skips["pipe.txt"] == "a FIFO (named pipe), not a file"
    assert skips["zero.txt"] == "a link to a device"
    assert skips["null.md"] == "a link to a device"
    assert skips["broken.txt"] == "a broken link"
    assert skips["s.txt"] == "a socket, not a file"
    assert skips["big.txt"].startswith("larger than the limit")
    assert skips["caf\ufffd.txt"] == "its name is not valid UTF-8 text"
    assert skips["linked-folder"] == "a link to a folder (not followed)"


def test_named_devices_and_fifos_are_skipped_too(hostile):
    items = list(iter_document_files(["/dev/zero", hostile / "pipe.txt", hostile / "missing.txt"]))
    assert [(s.path.name, s.reason) for s in items] == [
        ("zero", "a device, not a file"), ("pipe.txt", "a FIFO (named pipe), not a file"),
        ("missing.txt", "no such file or folder")]


def test_reading_never_blocks_on_a_fifo_or_reads_past_the_limit(hostile):
    t0 = time.monotonic()
    with pytest.raises(ExtractError, match="FIFO"):
        read_document_bytes(hostile / "pipe.txt")
    with pytest.raises(ExtractError, match="device"):
        read_document_bytes("/dev/zero")
    with pytest.raises(ExtractError, match="limit"):
        read_document_bytes(hostile / "big.txt", max_bytes=100)
    assert time.monotonic() - t0 < 5
    assert read_document_bytes(hostile / "ok.txt") == NOTE.encode()


def test_docs_add_skips_the_hostile_files_and_adds_the_rest(hostile, tmp_path):
    env = {"FERRY_HOME": str(tmp_path / "home"), "FERRY_PASSPHRASE": "tractor violet harbour sonnet",
           "PYTHON_KEYRING_BACKEND": "keyring.backends.null.Keyring"}
    res = run_ferry("docs", "add", "house", str(hostile), "--json", check=False, timeout=120, env=env)
    assert "Traceback" not in res.stderr, res.stderr
    report = json.loads(res.stdout)
    assert sorted(os.path.basename(p) for p in report["added"]) == ["also ok.md", "big.txt", "ok.txt"]
    reasons = {f["name"]: f["error"] for f in report["failed"]}
    assert set(reasons) == {"pipe.txt", "zero.txt", "null.md", "broken.txt", "s.txt", "caf\ufffd.txt",
                            "linked-folder"}
    assert res.returncode == 1   # something was skipped: said, not hidden
    text = run_ferry("docs", "add", "house", str(hostile), check=False, timeout=120, env=env)
    assert "skipped" in text.stdout and "caf\ufffd.txt" in text.stdout and "Traceback" not in text.stderr


def test_the_documents_panel_names_the_skips_and_adds_the_rest(qtbot, kr, hostile, tmp_path):
    from app.documents.store import DocumentStore
    from app.store.crypto import KeychainKeys
    from app.ui.documents_panel import open_documents_panel

    store = DocumentStore(tmp_path / "h.sqlite3", keys=KeychainKeys())
    panel = open_documents_panel(None, store, "conversation:1")
    qtbot.addWidget(panel)
    with qtbot.waitSignal(panel.indexing_finished, timeout=60000) as sig:
        panel.add_paths([str(hostile)])
    report = sig.args[0]
    assert len(report["added"]) == 3
    shown = [panel.errors.item(i).text() for i in range(panel.errors.count())]
    assert any(t.startswith("pipe.txt: a FIFO") for t in shown)
    assert any(t.startswith("caf\ufffd.txt: its name is not valid UTF-8") for t in shown)
    panel.close()
    store.close()


def test_lone_surrogates_in_extracted_text_become_the_replacement_character(tmp_path, kr, monkeypatch):
    from app.documents import extract as ex
    from app.documents.store import DocumentStore
    from app.store.crypto import KeychainKeys

    assert ex._clean("a\ud800b \udfff") == "a\ufffdb \ufffd"
    f = tmp_path / "broken.pdf"
    f.write_bytes(b"%PDF-1.4 stand-in")
    # What pypdf can return for a page with a broken text map.
    monkeypatch.setattr(ex, "_extract_pdf",
                        lambda data: [ex.Page(1, [ex.Block("para", ex._clean("page text \ud835 " + NOTE))])])
    store = DocumentStore(tmp_path / "h.sqlite3", keys=KeychainKeys())
    report = store.add("c", [f])
    assert [p.name for p in report.added] == ["broken.pdf"] and not report.failed
    store.close()
