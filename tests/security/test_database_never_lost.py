"""Issue 32: the database never loses a history silently. A 0-byte or damaged ``ferry.db`` (a
history was made: its key file holds a check value) is kept aside under a dated name and
reported with what to do -- never replaced by an empty history; a damaged page gives a one-line
message, not a traceback; two processes creating the same collection both succeed."""
from __future__ import annotations

import json
import multiprocessing
import os
import subprocess
import sys
import time

import pytest

from app.documents.store import DocumentStore
from app.store.crypto import PassphraseKeys
from app.store.database import DatabaseDamaged, database_problem
from tests.conftest import REPO

PASSPHRASE = "a long test passphrase"


def _ferry(home, *args, timeout=300):
    env = {**os.environ, "FERRY_HOME": str(home), "FERRY_PASSPHRASE": PASSPHRASE,
           "PYTHON_KEYRING_BACKEND": "keyring.backends.fail.Keyring"}
    return subprocess.run([sys.executable, "-m", "app.cli", *args], capture_output=True, text=True, cwd=REPO,
                          env=env, timeout=timeout)


@pytest.fixture
def history(tmp_path):
    """A data folder with a collection of two documents, closed (the write-ahead log folded in)."""
    home = tmp_path / "home"
    docs = tmp_path / "docs"
    docs.mkdir()
    for i in range(2):
        (docs / f"note{i}.txt").write_text(f"Note {i}: the spare key of shed {i} is under the blue pot.\n" * 50)
    res = _ferry(home, "docs", "add", "notes", str(docs))
    assert res.returncode == 0, res.stderr
    db = home / "ferry.db"
    assert db.stat().st_size > 0 and not (home / "ferry.db-wal").exists()
    return home, db


def _aside(home, tag):
    return sorted(p for p in home.iterdir() if p.name.startswith(f"ferry.db.{tag}-") and not p.name.endswith(".keys"))


def test_a_zero_byte_database_is_kept_aside_and_reported_never_silently_replaced(history):
    home, db = history
    db.write_bytes(b"")
    res = _ferry(home, "docs", "list", "--json")
    assert res.returncode == 1 and "Traceback" not in res.stderr, res.stderr
    assert "is empty (0 bytes)" in res.stderr and "restore a backup" in res.stderr, res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and res.stdout == ""
    kept = _aside(home, "empty")
    assert len(kept) == 1 and kept[0].stat().st_size == 0 and kept[0].with_name(kept[0].name + ".keys").exists()
    # the user was told; the next start begins a new history, and the empty one stays where it was put
    res = _ferry(home, "docs", "list", "--json")
    assert res.returncode == 0 and json.loads(res.stdout) == [], res.stderr
    assert _aside(home, "empty") == kept


def test_a_damaged_first_page_is_kept_aside_with_its_key_file(history):
    home, db = history
    data = bytearray(db.read_bytes())
    data[100:200] = bytes(100)
    db.write_bytes(bytes(data))
    res = _ferry(home, "docs", "search", "notes", "spare key")
    assert res.returncode == 1 and "Traceback" not in res.stderr, res.stderr
    assert "is damaged" in res.stderr and "kept as ferry.db.damaged-" in res.stderr, res.stderr
    kept = _aside(home, "damaged")
    assert len(kept) == 1 and kept[0].read_bytes() == bytes(data)
    # with its key file, the set-aside copy is what it was: renaming it back gives the same error
    assert kept[0].with_name(kept[0].name + ".keys").read_bytes() == (home / "ferry.db.keys").read_bytes()


@pytest.mark.parametrize("command", [["docs", "list"], ["docs", "search", "notes", "spare key"],
                                     ["docs", "add", "notes", "MORE"]])
def test_damaged_pages_give_a_one_line_message(history, tmp_path, command):
    home, db = history
    store = DocumentStore(db, PassphraseKeys(PASSPHRASE))
    root = store.db.execute("SELECT rootpage FROM sqlite_master WHERE name = 'docs_files'").fetchone()[0]
    page = store.db.execute("PRAGMA page_size").fetchone()[0]
    store.close()
    data = bytearray(db.read_bytes())
    at = (int(root) - 1) * int(page)
    data[at + 40:at + 60] = bytes(20)     # the files table's first page
    db.write_bytes(bytes(data))
    more = tmp_path / "more.txt"
    more.write_text("Another note about the shed.\n")
    res = _ferry(home, *[str(more) if a == "MORE" else a for a in command])
    assert res.returncode == 1 and "Traceback" not in res.stderr, res.stderr
    assert "damaged" in res.stderr and "restore it from a backup" in res.stderr, res.stderr
    assert len(res.stderr.strip().splitlines()) == 1, res.stderr
    after = db.read_bytes()                        # left where it is, damage and all: nothing replaced
    assert len(after) >= len(data) and after[at + 40:at + 60] == bytes(20)
    assert not _aside(home, "damaged")


class _SlowLookup:
    """The store's connection, pausing after it looks a collection up: both processes look before
    either creates, every time (the window the real race hits 1 time in 5)."""

    def __init__(self, db):
        self._db = db

    def execute(self, sql, *args):
        cur = self._db.execute(sql, *args)
        if "FROM docs_collections WHERE name" in sql:
            time.sleep(0.5)
        return cur

    def __enter__(self):
        return self._db.__enter__()

    def __exit__(self, *exc):
        return self._db.__exit__(*exc)

    def __getattr__(self, name):
        return getattr(self._db, name)


def _create(path, name, barrier, out):
    store = DocumentStore(path, PassphraseKeys(PASSPHRASE))
    store._db = _SlowLookup(store._db)
    barrier.wait()
    try:
        out.put(("ok", store.collection(name, create=True).name))
    except Exception as exc:  # noqa: BLE001 - the test reports it
        out.put(("error", f"{type(exc).__name__}: {exc}"))
    finally:
        store.close()


def test_two_processes_creating_the_same_collection_both_succeed(tmp_path):
    ctx = multiprocessing.get_context("spawn")
    path = tmp_path / "ferry.db"
    DocumentStore(path, PassphraseKeys(PASSPHRASE)).close()
    for round_ in range(3):
        barrier, out = ctx.Barrier(2), ctx.Queue()
        procs = [ctx.Process(target=_create, args=(path, f"race{round_}", barrier, out)) for _ in range(2)]
        for p in procs:
            p.start()
        results = [out.get(timeout=120) for _ in procs]
        for p in procs:
            p.join(60)
        assert results == [("ok", f"race{round_}")] * 2, results
    store = DocumentStore(path, PassphraseKeys(PASSPHRASE))
    assert sorted(c.name for c in store.collections()) == [f"race{i}" for i in range(3)]
    store.close()


def test_two_ferry_docs_add_at_once_never_give_a_traceback(tmp_path):
    docs = tmp_path / "docs"
    docs.mkdir()
    for i in range(3):
        (docs / f"n{i}.txt").write_text(f"Note {i} about the garden.\n" * 20)
    env = {**os.environ, "FERRY_HOME": str(tmp_path / "home"), "FERRY_PASSPHRASE": PASSPHRASE,
           "PYTHON_KEYRING_BACKEND": "keyring.backends.fail.Keyring"}
    procs = [subprocess.Popen([sys.executable, "-m", "app.cli", "docs", "add", "garden", str(docs)], cwd=REPO,
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert "Traceback" not in err and (p.returncode == 0 or "run the command again" in err), err


def test_database_problem_says_what_to_do():
    from app.store.database import DatabaseError, IntegrityError

    assert "run the command again" in database_problem(IntegrityError("UNIQUE constraint failed"))
    assert "restore it from a backup" in database_problem(DatabaseError("database disk image is malformed"))
    assert issubclass(DatabaseDamaged, Exception)


def _open_new(path, start, out):
    from app.store.database import open_database

    start.wait()
    try:
        db, key = open_database(path, PassphraseKeys(PASSPHRASE))
        db.close()
        out.put(key.hex())
    except Exception as exc:      # the test reports what went wrong
        out.put(f"error: {type(exc).__name__}: {exc}")


def test_processes_creating_a_new_history_at_once_agree_on_its_key(tmp_path):
    """Four processes open a data folder with no history yet at the same moment: one makes the key
    (salt and check value), the others read it; none fails, every key is the same and opens the file
    afterwards. (Before the key was settled under a lock, two writers could rename each other's
    temporary key file away -- seen as 'No such file or directory: ferry.db.keys.tmp' -- or leave a
    check value of one key beside a database made with another.)"""
    from app.store.database import open_database

    path = tmp_path / "home" / "ferry.db"
    ctx = multiprocessing.get_context("spawn")
    start, out = ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=_open_new, args=(path, start, out)) for _ in range(4)]
    for p in procs:
        p.start()
    time.sleep(1.0)
    start.set()
    keys = [out.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    assert all(not k.startswith("error") for k in keys), keys
    assert len(set(keys)) == 1, keys
    db, key = open_database(path, PassphraseKeys(PASSPHRASE))
    db.close()
    assert key.hex() == keys[0]
    assert not list(path.parent.glob("*.tmp"))
