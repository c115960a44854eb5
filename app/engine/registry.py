"""One engine per model per machine: the registry of the models Ferry
processes hold open, and the machine-wide ledger of their RAM budgets.

The process that opens a model registers it: a record in the user's private
runtime folder (``platformdirs`` user runtime dir, or ``$FERRY_HOME/run``;
the folder 0700, the files 0600) with the model's identity (its container's
real path and a content id: a hash of its manifest), the owner's pid, the
loopback port and random key it serves the model on, its RAM budget and who
holds it (``ferry run``, the window...). Beside each record the owner holds
an exclusive ``flock`` on a lock file for as long as the model is open: the
kernel releases it when the process ends however it ends (``kill -9``
included), so a record whose lock can be taken, or whose pid is gone, is
stale and is removed by the next process that looks.

Another Ferry process asked for the same model gets the owner's record
(``Claim.held``) and attaches to it through the local API (the remote engine,
``app.engine.remote``); a different model is admitted only if the ledger —
every live record's budget plus the new one — fits the room the one budget
rule gives this machine (``app.memory.budget.ledger_room``); otherwise a
``LedgerFull`` names the holders. Claims and stale-record removal happen
under one ledger lock, so two processes opening at once cannot both pass.

Opens within one process are the process's own business (it knows what it
holds): a second open of a model this process already holds is neither
registered nor attached. ``FERRY_SHARE=0`` (or ``share=False`` to
``app.api.open_model``, ``--no-share`` on the command line) opts out.
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
import secrets
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

from app.units import size

RECORD_VERSION = 1
#: How long a process waits for another one that is still opening the model it wants.
OPENING_WAIT_SECONDS = 600.0
POLL_SECONDS = 0.2
#: How long an owner that closes waits for the answers other clients asked it for.
DRAIN_SECONDS = 300.0
#: How long a process waits for an owner that has opened its model to serve it.
SERVE_WAIT_SECONDS = 15.0


class LedgerFull(RuntimeError):
    """The model does not fit beside the ones other Ferry processes hold."""


def sharing_enabled(share: bool | None = None) -> bool:
    """``share`` if given, else ``FERRY_SHARE`` (default on)."""
    if share is not None:
        return bool(share)
    return os.environ.get("FERRY_SHARE", "1").strip().lower() not in ("0", "no", "false", "off")


def runtime_dir() -> Path:
    """The user's private runtime folder (created 0700)."""
    root = os.environ.get("FERRY_HOME")
    if root:
        path = Path(root) / "run"
    else:
        import warnings

        import platformdirs

        with warnings.catch_warnings():     # no XDG_RUNTIME_DIR: platformdirs falls back to /tmp/runtime-UID
            warnings.simplefilter("ignore")
            path = Path(platformdirs.user_runtime_dir("ferry", appauthor=False))
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(path, 0o700)
    return path


@dataclass(frozen=True)
class Identity:
    path: str           #: the container's real path
    content_id: str     #: a hash of its manifest

    @property
    def slot(self) -> str:
        return hashlib.sha256(f"{self.path}\0{self.content_id}".encode()).hexdigest()[:24]


def identity(container: str | os.PathLike) -> Identity:
    real = os.path.realpath(container)
    try:
        manifest = (Path(real) / "manifest.json").read_bytes()
    except OSError:
        manifest = b""
    return Identity(real, hashlib.sha256(manifest).hexdigest()[:32])


@dataclass(frozen=True)
class Record:
    path: str
    content_id: str
    pid: int
    budget: int
    holder: str             #: who holds it, in words ("ferry run", "the Ferry window")
    name: str = ""          #: the model id its server answers to
    port: int = 0           #: 0 while the model opens (or when its owner does not serve it)
    key: str = ""
    started: float = 0.0
    state: str = "opening"  #: "opening", "open" (not served), "serving", "closing"
    version: int = RECORD_VERSION

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def describe(self) -> str:
        return f"{Path(self.path).name} ({size(self.budget)}, held by {self.holder}, pid {self.pid})"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _write_private(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)
    os.replace(tmp, path)


class Registry:
    """The records in one runtime folder."""

    def __init__(self, folder: Path | None = None):
        self.dir = folder or runtime_dir()

    # ---- the ledger lock (held briefly: claims, releases, stale removal)

    def _ledger(self):
        return _FileLock(self.dir / "ledger.lock")

    def _read(self, slot: str) -> Record | None:
        try:
            doc = json.loads((self.dir / f"{slot}.json").read_text())
            return Record(**{k: doc[k] for k in Record.__dataclass_fields__ if k in doc})
        except (OSError, ValueError, TypeError, KeyError):
            return None

    def _live(self, slot: str, record: Record | None) -> bool:
        """The record's owner still holds its lock (and its pid exists)."""
        if record is None or not _pid_alive(record.pid):
            return False
        if record.pid == os.getpid():
            return slot in _OWN
        try:
            fd = os.open(self.dir / f"{slot}.lock", os.O_RDWR)
        except OSError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        except OSError:
            return False
        finally:
            os.close(fd)   # also drops a lock this probe took
        return False

    def _remove(self, slot: str) -> None:
        for suffix in (".json", ".lock"):
            try:
                (self.dir / f"{slot}{suffix}").unlink()
            except OSError:
                pass

    def records(self, *, clean: bool = False) -> list[Record]:
        """The live records (``clean``: stale ones are removed; the caller holds the ledger lock)."""
        out = []
        for entry in sorted(self.dir.glob("*.json")):
            slot = entry.stem
            record = self._read(slot)
            if self._live(slot, record):
                out.append(record)
            elif clean:
                self._remove(slot)
        return out

    def find(self, ident: Identity) -> Record | None:
        record = self._read(ident.slot)
        return record if self._live(ident.slot, record) else None

    # ---- claiming

    def claim(self, ident: Identity, budget: int, *, holder: str, room: int) -> "Claim":
        """Hold ``ident`` with ``budget`` (``Claim.holding``), or learn who holds it (``Claim.held``).
        Raises ``LedgerFull`` when the budgets of every live record and this one exceed ``room``
        (the caller's ``app.memory.budget.ledger_room()``: the engine imports nothing of the memory
        package above it)."""
        if ident.slot in _OWN:
            return Claim(None, None)        # this process holds it already: its own second open
        with self._ledger():
            live = self.records(clean=True)
            mine = next((r for r in live if (r.path, r.content_id) == (ident.path, ident.content_id)), None)
            if mine is not None:
                return Claim(None, mine)
            used = sum(r.budget for r in live)
            if live and used + budget > room:
                held = "; ".join(r.describe() for r in live)
                raise LedgerFull(
                    f"{Path(ident.path).name} needs a RAM budget of {size(budget)}, and other Ferry engines "
                    f"already hold {size(used)} of the {size(room)} this machine has for models: {held}. "
                    f"Close {'that' if len(live) == 1 else 'one of them'} (or choose a smaller budget) first")
            return Claim(Holding(self, ident, budget, holder), None)

    def wait_ready(self, record: Record, timeout: float = OPENING_WAIT_SECONDS,
                   progress: Callable[[Record], None] | None = None) -> Record | None:
        """The record once its owner serves it (or has it open without serving it for a while: it
        will not share it); None when the owner is gone (open it then): an owner that is closing
        is waited for.
        Raises ``TimeoutError`` when it still opens after ``timeout`` seconds."""
        ident = Identity(record.path, record.content_id)
        start = time.monotonic()
        open_since = None
        told = False
        while True:
            current = self.find(ident)
            if current is None:
                return None
            if current.state == "serving" and current.port:
                return current
            now = time.monotonic()
            if current.state == "open":     # opened; its service starts right after, or never (ferry eval)
                open_since = open_since or now
                if now - open_since > SERVE_WAIT_SECONDS:
                    return current
            if progress is not None and not told:
                progress(current)
                told = True
            if now - start > timeout:
                raise TimeoutError(f"Ferry (pid {current.pid}, {current.holder}) is still opening "
                                   f"{Path(current.path).name}; try again when it is open")
            time.sleep(POLL_SECONDS)


def holder_left(record: Record, registry: Registry | None = None) -> bool:
    """The process of ``record`` no longer serves that model (it closed it, is closing it, or died):
    a process attached to it opens the model again."""
    now = (registry or Registry()).find(Identity(record.path, record.content_id))
    return now is None or now.pid != record.pid or now.state != "serving"


@dataclass(frozen=True)
class Claim:
    holding: "Holding | None"       #: this process now holds the model: open it, then serve it
    held: Record | None             #: another process holds it: attach to it


#: The slots this process holds (a second open in the same process is its own business).
_OWN: dict[str, "Holding"] = {}
_OWN_LOCK = threading.Lock()


class Holding:
    """This process's hold on a model: the lock, the record, and the server that shares it."""

    def __init__(self, registry: Registry, ident: Identity, budget: int, holder: str):
        self.registry = registry
        self.ident = ident
        self.budget = budget
        self.holder = holder
        self.key = secrets.token_urlsafe(32)
        self.server = None                 #: the loopback server while one of the model's services runs
        self.serve: Callable[[object, str], object] | None = None   #: (service, key) -> a started Server
        self._service = None
        slot = ident.slot
        self._lock_fd = os.open(registry.dir / f"{slot}.lock", os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(self._lock_fd, fcntl.LOCK_EX)   # under the ledger lock: free but for a probe's instant
        with _OWN_LOCK:
            _OWN[slot] = self
        self._write()

    def opened(self) -> None:
        """The model is open (not served until an engine service runs on it)."""
        if self._lock_fd >= 0 and self._service is None:
            self._write(state="open")

    @property
    def record(self) -> Record | None:
        return self.registry._read(self.ident.slot)

    def _write(self, *, port: int = 0, name: str = "", state: str = "opening") -> None:
        record = Record(self.ident.path, self.ident.content_id, os.getpid(), self.budget, self.holder, name=name,
                        port=port, key=self.key if port else "", started=time.time(), state=state)
        _write_private(self.registry.dir / f"{self.ident.slot}.json", json.dumps(asdict(record)))

    def service_started(self, service) -> None:
        """An engine service runs on the model: serve it on loopback with the key (the first one)."""
        if self._service is not None or self.serve is None or self._lock_fd < 0:
            return
        self._service = service
        try:
            self.server = self.serve(service, self.key)
        except Exception:   # noqa: BLE001 - no free port: the model stays private to this process
            self.server = None
            return
        self._write(port=self.server.port, name=self.server.model_id, state="serving")

    def service_closed(self, service, drain: float = DRAIN_SECONDS) -> None:
        """The service is closing: new clients are turned away (they open the model themselves once
        this process lets go of it); the answers other clients already asked for are finished first
        (up to ``drain`` seconds), then the server stops."""
        if service is not self._service:
            return
        server = self.server
        if self._lock_fd >= 0:
            self._write(state="closing")
        if server is not None:
            deadline = time.monotonic() + drain
            while time.monotonic() < deadline:
                status = service.status()
                if not status["busy"] and not status["waiting"]:
                    break
                time.sleep(POLL_SECONDS)
            server.stop()
        self._service = self.server = None

    def release(self) -> None:
        """The model is closed: stop serving, remove the record, let go of the lock."""
        if self._service is not None:
            self.service_closed(self._service)
        with _OWN_LOCK:
            if _OWN.get(self.ident.slot) is self:
                del _OWN[self.ident.slot]
        if self._lock_fd < 0:
            return
        with self.registry._ledger():
            self.registry._remove(self.ident.slot)
            os.close(self._lock_fd)
            self._lock_fd = -1


class _FileLock:
    def __init__(self, path: Path):
        self.path = path
        self.fd = -1

    def __enter__(self):
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc):
        os.close(self.fd)
        self.fd = -1
