"""The encrypted document store: adding with progress, re-adding, search,
nothing in plaintext on disk, wrong keys refused."""
from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import pytest

from app import paths
from app.documents.retrieve import search
from app.documents.store import DocumentError, DocumentStore, conversation_collection
from app.store.crypto import EphemeralKeys, KeychainKeys, PassphraseKeys, WrongKey
from app.store.history import HistoryStore

PLANTED = "Zanzibar-quokka-7731 vault code"


def scan_for(root: Path, needles: list[str]) -> list[str]:
    """Every file under root (SQLite -wal/-journal/-shm too) that holds a needle."""
    found = []
    forms = []
    for n in needles:
        for variant in {n, n.lower(), n.upper()}:
            forms += [variant.encode("utf-8"), variant.encode("utf-16-le"), variant.encode("utf-16-be")]
    for f in root.rglob("*"):
        if f.is_file():
            data = f.read_bytes()
            found += [f"{f.relative_to(root)}: {form!r}" for form in forms if form in data]
    return found


def test_add_search_and_no_plaintext_on_disk(kr, home, corpus_dir, tmp_path):
    docs = tmp_path / "mine"
    shutil.copytree(corpus_dir, docs)
    secret = docs / "secret.md"
    secret.write_text(f"# Notes\n\nThe safe deposit box at Harbour Mutual is opened with the {PLANTED} "
                      "written on the back of the photograph.\n", encoding="utf-8")
    store = DocumentStore(keys=KeychainKeys())
    assert store.path == paths.data_dir() / "ferry.db"
    events = []
    report = store.add("household", [docs], progress=events.append)
    assert sorted(p.name for p in report.added) == sorted(["lease.md", "discharge.txt", "statement.html",
                                                           "manual.pdf", "policy.docx", "secret.md"])
    assert not report.failed and report.chunks > 40
    stages = [e.stage for e in events]
    assert stages.count("reading") == 6 and stages.count("indexed") == 6 and stages[-1] == "done"
    assert [e.done for e in events if e.stage == "indexed"] == [1, 2, 3, 4, 5, 6]

    hits = search(store.index("household"), "what opens the safe deposit box?", k=3)
    assert hits[0].chunk.file_name == "secret.md" and PLANTED in hits[0].chunk.text
    hits = search(store.index("household"), "how many litres does the water tank hold", k=3)
    assert hits[0].chunk.file_name == "manual.pdf" and hits[0].chunk.page == 2
    page = store.page_text(hits[0].chunk.file_id, 2)
    assert page[hits[0].chunk.start:hits[0].chunk.end] == hits[0].chunk.text

    # the history still opens with the same key, and documents live in its file, with their
    # full-text index; the file is encrypted page by page (plain SQLite cannot read it)
    HistoryStore(store.path, KeychainKeys()).close()
    tables = {r[0] for r in store.db.execute("SELECT name FROM sqlite_master")}
    assert {"docs_chunks", "docs_files", "docs_pages", "docs_collections", "messages"} <= tables
    assert any(t.startswith("docs_fts_w_") for t in tables)
    with pytest.raises(sqlite3.DatabaseError):
        sqlite3.connect(store.path).execute("SELECT name FROM sqlite_master").fetchall()
    for f in home.iterdir():         # the database, its WAL and shared memory, the key side file
        assert f.stat().st_mode & 0o077 == 0, f
    assert {"ferry.db", "ferry.db-wal", "ferry.db.keys"} <= {f.name for f in home.iterdir()}

    needles = [PLANTED, "Zanzibar-quokka", "safe deposit box at Harbour", "secret.md", "household",
               "Monthly rent is $1,850.00", str(docs)]
    assert scan_for(home, needles) == []        # while open: the WAL holds the writes
    store.close()
    assert scan_for(home, needles) == []
    assert len(kr.items) == 1

    # re-adding: unchanged files are skipped, a changed one is read again
    store = DocumentStore(keys=KeychainKeys())
    secret.write_text(secret.read_text() + "\nA second line about the garden shed key.\n")
    report = store.add("household", [docs])
    assert [p.name for p in report.added] == ["secret.md"] and len(report.unchanged) == 5
    assert len(store.files("household")) == 6
    assert any("garden shed" in c.text for c in store.chunks("household"))
    states = home / "documents" / "states"
    states.mkdir(parents=True)
    (states / "0123.fxds").write_bytes(b"a saved prefix state that read secret.md")
    assert store.remove_file("household", secret) and len(store.files("household")) == 5
    assert not (states / "0123.fxds").exists()        # a removed file does not live on in a saved state
    assert not any(PLANTED in c.text for c in store.chunks("household"))
    store.close()
    assert scan_for(home, needles) == []


def test_collections_budget_and_errors(kr, home, corpus_dir):
    store = DocumentStore(keys=KeychainKeys())
    with pytest.raises(DocumentError, match="no collection 'nope'"):
        store.index("nope")
    name = conversation_collection(17)
    store.add(name, [corpus_dir / "lease.md"])
    assert [c.name for c in store.collections()] == [name]
    assert store.collection(name).budget == 1024
    store.set_budget(name, 300)
    assert store.collection(name).budget == 300
    with pytest.raises(DocumentError):
        store.set_budget(name, 10)
    store.delete_collection(name)
    assert store.collections() == []
    store.close()


def test_wrong_key_or_passphrase_is_refused(home, corpus_dir):
    store = DocumentStore(keys=PassphraseKeys("correct horse"))
    store.add("c", [corpus_dir / "lease.md"])
    store.close()
    with pytest.raises(WrongKey):
        DocumentStore(keys=PassphraseKeys("wrong horse"))
    with pytest.raises(WrongKey):
        DocumentStore(keys=EphemeralKeys())
    store = DocumentStore(keys=PassphraseKeys("correct horse"))
    assert len(store.chunks("c")) > 5
    store.close()
    # a damaged page is refused, not read
    data = bytearray(store.path.read_bytes())
    for i in range(4096 + 100, 4096 + 140):
        data[i] ^= 0xFF
    store.path.write_bytes(bytes(data))
    with pytest.raises(Exception, match="not a database|damaged|does not open|malformed"):
        s2 = DocumentStore(keys=PassphraseKeys("correct horse"))
        s2.chunks("c")
