"""Ferry's one database file per data folder, encrypted page by page.

Everything Ferry keeps about a person — conversations, documents, their
passages and the full-text index over them — lives in one SQLite database
(``ferry.db``) opened through SQLCipher (the ``sqlcipher3`` binding): every
page of the file, index pages and the write-ahead log included, is
AES-256 encrypted and authenticated with HMAC-SHA512. No Qt here.

The key: the key provider (keychain, passphrase, ephemeral; see
:mod:`app.store.crypto`) gives Ferry's 256-bit key; SQLCipher is given a
subkey derived from it with HKDF, as a raw key (no second KDF). What the
provider needs before the database can be opened — its kind, the scrypt
salt, and a ``check`` value that tells a wrong key from a right one — lives
in a small side file ``ferry.db.keys`` (JSON, nothing secret in it).

Files are created private (mode 0600) before anything is written to them;
SQLite gives its -wal and -shm files the mode of the database.
``temp_store=MEMORY`` keeps temporary tables and sort spills in RAM, and
``secure_delete`` overwrites what is deleted.

A store of the previous layout (``history.sqlite3``: a plain SQLite file
whose values were AES-GCM blobs) is migrated on first open, see
:mod:`app.store.migrate`.
"""
from __future__ import annotations

import base64
import contextlib
import json
import os
import secrets
import sqlite3
from pathlib import Path

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from sqlcipher3 import dbapi2 as sqlcipher

from app import paths
from app.store.crypto import Cipher, KeyProvider, KeyUnavailable, WrongKey
from app.store.private import private_dir, private_umask, touch_private

FILE_NAME = "ferry.db"
LEGACY_NAME = "history.sqlite3"
CHECK_TEXT = "ferry history key check"
SQLITE_MAGIC = b"SQLite format 3\x00"
PRAGMAS = ("journal_mode=WAL", "synchronous=NORMAL", "foreign_keys=ON", "secure_delete=ON",
           "temp_store=MEMORY", "busy_timeout=30000")

DatabaseError = sqlcipher.DatabaseError
IntegrityError = sqlcipher.IntegrityError
Connection = sqlcipher.Connection


class DatabaseDamaged(KeyUnavailable):
    """The history database is empty or damaged although a history was made: it was set aside
    (renamed, never replaced or deleted) and the message says where and what to do."""


def set_aside(path: Path, tag: str, *, keys: bool = True) -> Path:
    """Rename the database at ``path`` and its SQLite side files to ``<name>.<tag>-<time>`` (the
    key side file is copied beside it, so the set-aside file can still be opened: ``keys``);
    returns the new name. Nothing is deleted."""
    import shutil
    import time

    path = Path(path)
    target = path.with_name(f"{path.name}.{tag}-{time.strftime('%Y%m%d-%H%M%S')}")
    while any(Path(str(target) + s).exists() for s in ("", ".keys")):
        target = target.with_name(target.name + "x")
    for suffix in ("", "-wal", "-shm", "-journal"):
        src = Path(str(path) + suffix)
        if src.exists():
            src.rename(Path(str(target) + suffix))
    if keys and Path(str(path) + ".keys").exists():
        shutil.copy2(str(path) + ".keys", str(target) + ".keys")
    return target


def database_problem(exc: Exception, path: Path | None = None) -> str:
    """One line saying what a database error means for the user and what to do."""
    name = str(path) if path is not None else FILE_NAME
    text = str(exc)
    if isinstance(exc, sqlcipher.IntegrityError):
        return (f"another Ferry process changed the same data at the same time ({text}); nothing was lost: "
                "run the command again")
    if isinstance(exc, sqlcipher.OperationalError) and "locked" in text:
        return f"the history {name} is busy in another Ferry process; try again when it has finished"
    if "malformed" in text or "not a database" in text or "corrupt" in text:
        return (f"the history {name} is damaged ({text}); Ferry leaves it as it is: restore it from a backup, "
                f"or move it aside (rename it) to start a new history")
    return f"the history {name} cannot be used: {text}"


def default_path() -> Path:
    return paths.data_dir() / FILE_NAME


def create_private(path: Path) -> None:
    """Create ``path`` empty with mode 0600 (owner only) if it does not exist,
    in a 0700 folder, and make an existing one private (app.store.private)."""
    private_dir(path.parent)
    touch_private(path)


def is_legacy(path: Path) -> bool:
    """A plain (not page-encrypted) SQLite file: the previous layout."""
    try:
        with open(path, "rb") as f:
            return f.read(16) == SQLITE_MAGIC
    except OSError:
        return False


class _DictMeta:
    """Key metadata held in memory (a legacy file's ``meta`` table), as :class:`app.store.crypto.Meta`."""

    def __init__(self, values: dict[str, bytes]):
        self.values = values

    def get(self, key: str) -> bytes | None:
        return self.values.get(key)

    def set(self, key: str, value: bytes) -> None:
        self.values[key] = bytes(value)


def legacy_source(path: Path) -> Path | None:
    """The old-layout file to migrate into ``path``, or None."""
    path = Path(path)
    if path.exists():
        return path if is_legacy(path) else None
    old = path.parent / LEGACY_NAME
    if path.name == FILE_NAME and old.exists() and is_legacy(old):
        return old
    return None


def read_meta(db: sqlite3.Connection) -> dict[str, bytes]:
    """A legacy file's ``meta`` rows (empty when it has none)."""
    try:
        return {k: bytes(v) for k, v in db.execute("SELECT key, value FROM meta")}
    except sqlite3.DatabaseError:
        return {}


def legacy_meta(legacy: Path) -> _DictMeta:
    db = sqlite3.connect(legacy)
    try:
        return _DictMeta(read_meta(db))
    finally:
        db.close()


class KeyFile:
    """The side file ``<db>.keys``: the provider's kind, salt and check value.
    Implements :class:`app.store.crypto.Meta` (values are bytes)."""

    def __init__(self, db_path: Path):
        self.path = Path(str(db_path) + ".keys")
        self._values: dict[str, bytes] = {}
        if self.path.exists():
            try:
                raw = json.loads(self.path.read_text(encoding="utf-8"))
                self._values = {k: base64.b64decode(v) for k, v in raw.items()}
            except (ValueError, OSError) as exc:
                raise WrongKey(f"{self.path.name} is damaged ({exc}); the database cannot be opened") from exc

    def get(self, key: str) -> bytes | None:
        return self._values.get(key)

    def set(self, key: str, value: bytes) -> None:
        self._values[key] = bytes(value)
        self.save()

    def save(self) -> None:
        # a name of this writer's own: two processes saving at once never rename each other's file
        tmp = self.path.with_name(f"{self.path.name}.{os.getpid()}-{secrets.token_hex(4)}.tmp")
        create_private(tmp)
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump({k: base64.b64encode(v).decode() for k, v in self._values.items()}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)


def stored_key_kind(path: str | Path) -> str | None:
    """Which key provider made the store at ``path`` ("keychain", "passphrase"...),
    or None when there is none yet (a legacy store is asked too)."""
    path = Path(path)
    kind = KeyFile(path).get("key_kind")
    if kind is not None:
        return kind.decode()
    legacy = legacy_source(path)
    if legacy is None:
        return None
    kind = legacy_meta(legacy).get("key_kind")
    return None if kind is None else kind.decode()


def sqlcipher_key(key: bytes) -> bytes:
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=b"ferry database v1 sqlcipher").derive(key)


def provider_key(meta, keys: KeyProvider) -> bytes:
    """The provider's key, checked against ``meta``'s check value (written
    when there is none yet); WrongKey when it does not match."""
    key = keys.key(meta)
    cipher = Cipher(key)
    check = meta.get("check")
    if check is None:
        meta.set("check", cipher.encrypt(CHECK_TEXT, "meta:check"))
        meta.set("key_kind", keys.kind.encode())
        return key
    try:
        ok = cipher.decrypt(check, "meta:check") == CHECK_TEXT
    except WrongKey:
        ok = False
    if not ok:
        raise WrongKey("this key or passphrase does not open the history")
    return key


def connect(path: Path, raw_key: bytes, *, timeout: float = 30.0) -> Connection:
    """A connection to the encrypted database at ``path`` (created private if
    missing) with Ferry's pragmas; WrongKey when the key does not open it."""
    path = Path(path)
    create_private(path)
    with private_umask():   # SQLite's own side files (journal, WAL, shm) private from creation too
        db = sqlcipher.connect(str(path), timeout=timeout, check_same_thread=True)
    try:
        db.execute("PRAGMA cipher_log_level = NONE")    # errors are raised, never printed
        db.execute(f"PRAGMA key = \"x'{raw_key.hex()}'\"")
        try:
            db.execute("SELECT count(*) FROM sqlite_master").fetchone()
        except sqlcipher.DatabaseError as exc:
            raise WrongKey(f"{path.name} does not open with this key (or it is damaged): {exc}") from exc
        for pragma in PRAGMAS:
            db.execute(f"PRAGMA {pragma}")
    except BaseException:
        db.close()
        raise
    return db


def open_database(path: str | Path | None, keys: KeyProvider, *, migrate=None) -> tuple[Connection, bytes]:
    """Open (creating, or migrating from the previous layout with ``migrate(legacy, path, keys) -> key``:
    ``app.store.migrate`` with the parts its caller knows) the database at ``path``: (connection, the
    provider's key). Raises WrongKey / KeyUnavailable."""
    path = Path(path) if path is not None else default_path()
    private_dir(path.parent)
    # Two Ferry processes starting on a new data folder at once (the window and `ferry docs add`)
    # would each make a key and a check value; the second would overwrite the first's. The key is
    # settled under a lock, so the second reads what the first wrote.
    with _key_lock(path):
        legacy = legacy_source(path)
        if legacy is not None:
            if migrate is None:
                raise ValueError(f"{legacy} is a history of an older Ferry; it is moved into {FILE_NAME} when the "
                                 "history is opened (app.store.history.HistoryStore)")
            key = migrate(legacy, path, keys)
        else:
            meta = KeyFile(path)
            _refuse_empty(path, meta)
            if meta.get("check") is None and path.exists() and path.stat().st_size > 0:
                # the side file is gone: a key that opens the database is taken, and the check written again
                key = keys.key(meta)
                connect(path, sqlcipher_key(key)).close()
            key = provider_key(meta, keys)
        # Connecting writes a new database's first page (its WAL mode), still under the lock: a second
        # process must never find a check value beside a 0-byte file and take the live history for an
        # emptied one.
        try:
            return connect(path, sqlcipher_key(key)), key
        except WrongKey as exc:
            # the key is right (its check value matched above), so the file is what is wrong
            if legacy is None and meta.get("check") is not None and path.exists():
                aside = set_aside(path, "damaged")
                raise DatabaseDamaged(
                    f"the history {path} is damaged and cannot be opened ({exc.__cause__ or exc}). It was kept "
                    f"as {aside.name} (with its key file): restore a backup of {FILE_NAME}, or start Ferry again "
                    "to begin a new, empty history.") from None
            raise


@contextlib.contextmanager
def _key_lock(path: Path):
    """An exclusive lock on ``<db>.lock`` (an empty private file) while the key is settled; held by
    the open file, so a process that dies releases it. Where there is no flock (Windows), no lock."""
    try:
        import fcntl
    except ImportError:     # pragma: no cover - not a platform Ferry ships for
        yield
        return
    lock = Path(str(path) + ".lock")
    create_private(lock)
    with open(lock, "rb") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def _refuse_empty(path: Path, meta: KeyFile) -> None:
    """A history was made here (the key file has its check value) but its database is empty: a 0-byte
    file (and no write-ahead log) is never taken for a new history. It is set aside and reported."""
    wal = Path(str(path) + "-wal")
    if (meta.get("check") is None or not path.exists() or path.stat().st_size > 0
            or (wal.exists() and wal.stat().st_size > 0)):
        return
    aside = set_aside(path, "empty")
    raise DatabaseDamaged(
        f"the history {path} is empty (0 bytes) although a history was made with this data folder: it was "
        f"emptied or cut short outside Ferry. It was kept as {aside.name}: restore a backup of {FILE_NAME}, or "
        "start Ferry again to begin a new, empty history.")
