"""Download a repository and convert it while it downloads, resumably.

Layout in the destination folder ``INTO`` for a repository ``owner/NAME``:

* ``INTO/NAME/``: the checkpoint as downloaded (small files first, then the
  shards; a partial shard is kept in ``INTO/NAME/.cache/ferry`` and resumed
  with a Range request: app.get.hub.download_weights);
* ``INTO/NAME.get/``: this download's state (``state.json``: the commit,
  the formats chosen at the start, the shards whose hash was checked) and
  the shard headers;
* ``INTO/NAME.ferry``: the container (``NAME.ferry.partial`` with its
  journal while converting, as `ferry convert` does).

The converter reads the repository as a StagedSource: reading a tensor waits
until its shard is downloaded and its sha256 checked. A downloader thread
fetches the shards in the order the converter first needs them; with
``delete_source`` it stays at most ``AHEAD`` shards ahead and a shard is
deleted as soon as every unit (trunk segment, expert bank) reading it is in
the journal, so the disk holds the container plus the shards in flight.
Killed at any point, the same call resumes: the journal skips what was
converted, the state skips hashing shards already checked, a partial shard
is resumed where it stopped, and the formats stay those of the first run.
"""
from __future__ import annotations

import json
import os
import shutil
import threading
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from app.store.private import private_dir
from app.convert.convert import ConvertCancelled, ConvertControl, Journal, Progress, convert, partial_dir
from app.convert.layout import plan_layout
from app.get import hub
from app.get.hub import GetError, Repo
from app.get.plan import AHEAD, GetPlan, plan_repo, shard_order, stage_hf, unit_map

STATE = "state.json"
#: Attempts at a file whose hash does not match before giving up.
ATTEMPTS = 3


@dataclass
class GetProgress:
    """What a progress callback receives (download and conversion at once)."""

    stage: str                  #: "plan", "download", "convert", "done"
    file: str = ""              #: the file being downloaded
    downloaded: int = 0         #: bytes of the download done (all files)
    download_total: int = 0
    rate: float = 0.0           #: download bytes per second, over the last seconds
    eta: float | None = None    #: seconds of download left at that rate
    converted: int = 0          #: container bytes written
    convert_total: int = 0
    convert_stage: str = ""
    paused: bool = False
    note: str = ""              #: e.g. "deleted model-00001-of-00003.safetensors (converted)"


ProgressFn = Callable[[GetProgress], None]


class _Rate:
    def __init__(self, window: float = 5.0):
        self.window = window
        self.samples: deque = deque()

    def add(self, total: int) -> float:
        now = time.monotonic()
        self.samples.append((now, total))
        while len(self.samples) > 2 and now - self.samples[0][0] > self.window:
            self.samples.popleft()
        t0, b0 = self.samples[0]
        return (total - b0) / (now - t0) if now > t0 else 0.0


class _State:
    """INTO/NAME.get/state.json, written atomically."""

    def __init__(self, folder: Path):
        self.path = folder / STATE
        try:
            self.data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            self.data = {}
        self.lock = threading.Lock()

    def save(self) -> None:
        with self.lock:
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(json.dumps(self.data))
            os.replace(tmp, self.path)

    def verified(self, path: Path, f: hub.RepoFile) -> bool:
        rec = self.data.get("verified", {}).get(f.name)
        try:
            st = path.stat()
        except FileNotFoundError:
            return False
        return rec == [st.st_size, st.st_mtime_ns] and st.st_size == f.size

    def mark_verified(self, path: Path, f: hub.RepoFile) -> None:
        st = path.stat()
        self.data.setdefault("verified", {})[f.name] = [st.st_size, st.st_mtime_ns]
        self.save()


class Getter:
    """One `ferry get`: plan, download, convert. ``control`` pauses or
    cancels both the download and the conversion from another thread."""

    def __init__(self, repo_id: str, into: str | os.PathLike, *, revision: str | None = None,
                 trunk_format: str = "recommended", expert_format: str = "recommended", file: str | None = None,
                 delete_source: bool = False, progress: ProgressFn | None = None,
                 control: ConvertControl | None = None, threads: int | None = None, memory=None,
                 ahead: int = AHEAD):
        self.repo_id, self.revision = repo_id, revision
        self.into = Path(into).absolute()
        self.trunk_format, self.expert_format, self.file = trunk_format, expert_format, file
        self.delete_source, self.progress_fn = delete_source, progress
        self.control = control or ConvertControl()
        self.threads, self.memory, self.ahead = threads, memory, ahead
        self.name = repo_id.rstrip("/").split("/")[-1]
        self.folder = self.into / self.name
        self.statedir = self.into / f"{self.name}.get"
        self.out = self.into / f"{self.name}.ferry"
        self.status = GetProgress("plan")
        self._rate = _Rate()
        self._last_report = 0.0
        self.plan: GetPlan | None = None
        self.stopping = False

    # ------------------------------------------------------------ progress

    def _report(self, force: bool = False, **changes) -> None:
        for k, v in changes.items():
            setattr(self.status, k, v)
        now = time.monotonic()
        if self.progress_fn and (force or now - self._last_report >= 0.25):
            self._last_report = now
            self.progress_fn(GetProgress(**vars(self.status)))
            self.status.note = ""           # said once

    def _on_bytes(self, n: int) -> None:
        if self.stopping:
            raise ConvertCancelled("the download stopped with the conversion")
        self.control.checkpoint(lambda: self._report(True, paused=True))
        s = self.status
        s.paused = False
        s.downloaded += n
        s.rate = self._rate.add(s.downloaded)
        left = s.download_total - s.downloaded
        s.eta = left / s.rate if s.rate > 0 else None
        self._report()

    # ------------------------------------------------------------ files

    def _fetch(self, repo: Repo, f: hub.RepoFile) -> Path:
        """``f`` downloaded (or resumed) and its size and hash checked; a
        damaged copy is fetched again."""
        path = hub.inside(self.folder, f.name, repo)
        state = self._state
        if state.verified(path, f):
            self._report(True, downloaded=self.status.downloaded + f.size)
            return path
        for attempt in range(ATTEMPTS):
            self.control.checkpoint()
            self._report(True, file=f.name, downloaded=self.status.downloaded + hub.partial_size(self.folder, f))
            start = self.status.downloaded
            digest = None
            if f.is_weight:
                _, digest = hub.download_weights(repo, f, self.folder, self._on_bytes)
            else:
                hub.download(repo, f.name, self.folder, self._on_bytes, force=attempt > 0)
            if f.sha256 is not None and digest is None:
                digest = hub.sha256_of(path)
            if path.stat().st_size == f.size and (f.sha256 is None or digest == f.sha256):
                state.mark_verified(path, f)
                # a file the hub client found complete already: count it
                self._report(True, downloaded=max(self.status.downloaded, start + f.size - hub.partial_size(
                    self.folder, f)))
                return path
            self._report(True, note=f"{f.name} does not match its hash on the hub: fetching it again")
            self.status.downloaded -= min(self.status.downloaded, path.stat().st_size)
            hub.forget_partial(self.folder, f)
        raise GetError(f"{f.name} of {repo.repo_id} does not match its hash on the hub after {ATTEMPTS} downloads: "
                       f"the mirror or the connection damages it; try again later or another HF_ENDPOINT")

    # ------------------------------------------------------------ run

    def run(self) -> Path:
        """Plan, download and convert; returns the container. Raises GetError
        (with what to do) or ConvertCancelled (the same call resumes)."""
        hub.check_repo_id(self.repo_id)
        if self.out.exists():
            return self.out
        private_dir(self.into)
        self.statedir.mkdir(exist_ok=True)
        self._state = _State(self.statedir)
        st = self._state.data
        if st.get("repo") not in (None, self.repo_id):
            raise GetError(f"{self.statedir} belongs to a download of {st['repo']}: choose another folder")
        # The commit and formats of the first run, so a resume converts the same container.
        revision = st.get("commit") or self.revision
        repo = hub.open_repo(self.repo_id, revision)
        t, e = st.get("formats") or (self.trunk_format, self.expert_format)
        asked = (self.trunk_format, self.expert_format)
        stored = st.get("formats")
        if stored and any(a not in ("recommended", b) for a, b in zip(asked, stored)):
            raise GetError(f"this download was started with trunk {stored[0]} and experts {stored[1]}; run it "
                           f"with those formats to resume, or delete {self.statedir} and {partial_dir(self.out)} to start over")
        self.plan = plan = plan_repo(self.repo_id, into=self.into, trunk_format=t, expert_format=e, file=self.file,
                                     memory=self.memory, repo=repo, work=self.into, disk_bps=0.0,
                                     kernel_bps=0.0)
        if plan.problems:
            raise GetError("; ".join(plan.problems))
        if not st:
            free = plan.free_disk_bytes or 0
            need = plan.peak_disk_delete_bytes if self.delete_source else plan.peak_disk_bytes
            if need > free:
                from app.units import size
                hint = ("" if self.delete_source or plan.peak_disk_delete_bytes > free else
                        f"; with --delete-source it needs {size(plan.peak_disk_delete_bytes)}")
                raise GetError(f"not enough disk in {self.into}: the download and conversion need {size(need)} at "
                               f"the peak, {size(free)} is free{hint}")
        st.update(repo=self.repo_id, commit=repo.commit, formats=[plan.trunk_format, plan.expert_format],
                  file=plan.file)
        self._state.save()
        files = [f for f in repo.small]
        if plan.kind == "gguf":
            return self._run_gguf(repo, plan)
        return self._run_hf(repo, plan, files)

    def _run_gguf(self, repo: Repo, plan: GetPlan) -> Path:
        f = repo.file(plan.file)
        self.folder.mkdir(parents=True, exist_ok=True)
        self._report(True, stage="download", download_total=f.size)
        path = self._fetch(repo, f)
        self._report(True, stage="convert")
        out = convert(path, self.out, trunk_format=plan.trunk_format, expert_format=plan.expert_format,
                      control=self.control, threads=self.threads, progress=self._on_convert)
        if self.delete_source:
            shutil.rmtree(self.folder, ignore_errors=True)
        shutil.rmtree(self.statedir, ignore_errors=True)
        self._report(True, stage="done")
        return out

    def _on_convert(self, p: Progress) -> None:
        self._report(p.stage == "done", converted=p.done_bytes, convert_total=p.total_bytes, convert_stage=p.stage,
                     paused=p.paused)

    def _run_hf(self, repo: Repo, plan: GetPlan, small: list) -> Path:
        shards = {f.name: f for f in repo.shards}
        feed = _Feed(self, repo, shards)
        src, _ = stage_hf(repo, self.folder, self.statedir, wait=feed.wait)
        layout = plan_layout(src, plan.trunk_format, plan.expert_format)
        order, reads, _ = unit_map(src, layout)
        # What earlier runs converted (the journal), so their shards are neither fetched nor kept.
        journal = Journal(partial_dir(self.out), layout.digest(src.identity()))
        done = {u for u in order if journal.has(u)}
        feed.setup(order, reads, done)
        total = sum(shards[s].size for s in feed.sequence) + sum(f.size for f in small)
        self._report(True, stage="download", download_total=total, downloaded=sum(f.size for f in small))
        feed.start()
        try:
            out = convert(src, self.out, trunk_format=plan.trunk_format, expert_format=plan.expert_format,
                          control=self.control, threads=self.threads, progress=self._on_convert,
                          unit_done=feed.unit_done)
            if feed.thread is not None:
                feed.thread.join()          # the rest of a kept copy (shards no unit reads)
        finally:
            feed.stop()
        feed.raise_error()
        if self.delete_source:
            shutil.rmtree(self.folder, ignore_errors=True)
        shutil.rmtree(self.statedir, ignore_errors=True)
        self._report(True, stage="done")
        return out


class _Feed:
    """The downloader thread and the converter's wait for a shard."""

    def __init__(self, getter: Getter, repo: Repo, shards: dict[str, hub.RepoFile]):
        self.g, self.repo, self.shards = getter, repo, shards
        self.cond = threading.Condition()
        self.ready: set[str] = set()
        self.wanted = -1               #: the furthest shard (index in sequence) the converter has asked for
        self.error: BaseException | None = None
        self.stopping = False
        self.thread: threading.Thread | None = None
        self.sequence: list[str] = []
        self.left: dict[str, int] = {}

    def setup(self, order: list[str], reads: dict[str, set[str]], done: set[str]) -> None:
        pending = [u for u in order if u not in done]
        self.pending = set(pending)
        self.sequence = shard_order(pending, reads)
        if not self.g.delete_source:       # a full copy is kept: the shards no unit reads too (a vision tower)
            self.sequence += [s for s in self.shards if s not in self.sequence]
        self.left = {s: sum(1 for u in pending if s in reads[u]) for s in self.shards}
        self.reads = reads
        if self.g.delete_source:           # converted by an earlier run, still here: not needed
            for s, n in self.left.items():
                if n == 0:
                    self._delete(s)

    def start(self) -> None:
        self.thread = threading.Thread(target=self._run, name="ferry-get-download", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            for i, name in enumerate(self.sequence):
                with self.cond:
                    while self.g.delete_source and i > self.wanted + self.g.ahead and not self.stopping:
                        self.cond.wait(0.5)
                    if self.stopping:
                        return
                self.g._fetch(self.repo, self.shards[name])
                with self.cond:
                    self.ready.add(name)
                    self.cond.notify_all()
        except BaseException as exc:        # handed to the converter's wait
            with self.cond:
                self.error = exc
                self.cond.notify_all()

    def wait(self, path: Path) -> None:
        """Called by the converter before reading a tensor of ``path``."""
        name = path.name
        with self.cond:
            if name in self.sequence:
                self.wanted = max(self.wanted, self.sequence.index(name))
                self.cond.notify_all()
            elif name not in self.ready:   # needed after all (an earlier run's journal was lost): fetch it
                self.sequence.append(name)
                self.wanted = len(self.sequence) - 1
                self.cond.notify_all()
            while name not in self.ready:
                if self.error is not None:
                    raise self.error
                if self.thread is None or not self.thread.is_alive():
                    if name in self.ready:
                        break
                    raise GetError(f"{name} was not downloaded")
                self.cond.wait(0.5)
                self.g.control.checkpoint()

    def unit_done(self, unit: str) -> None:
        """A unit is in the container: a shard no pending unit reads is deleted (with delete_source)."""
        if unit not in self.pending:
            return
        self.pending.discard(unit)
        for s in self.reads.get(unit, ()):
            self.left[s] -= 1
            if self.left[s] == 0 and self.g.delete_source:
                self._delete(s)

    def _delete(self, name: str) -> None:
        path = hub.inside(self.g.folder, name, self.repo)
        if path.exists():
            path.unlink()
            self.g._report(True, note=f"deleted {name}: every tensor it holds is in the container")
        with self.cond:
            self.ready.discard(name)

    def stop(self) -> None:
        self.g.stopping = True
        with self.cond:
            self.stopping = True
            self.cond.notify_all()
        if self.thread is not None:
            self.thread.join()

    def raise_error(self) -> None:
        if self.error is not None and not isinstance(self.error, ConvertCancelled):
            raise self.error


def get(repo_id: str, into: str | os.PathLike, **kw) -> Path:
    """Download ``repo_id`` into ``into`` and convert it; the container's path."""
    return Getter(repo_id, into, **kw).run()
