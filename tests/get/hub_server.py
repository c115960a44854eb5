"""A hub on 127.0.0.1 with the URL layout and headers the huggingface_hub
client uses: ``GET /api/models/{repo}[/revision/{rev}]?blobs=true`` (the
file list with sizes and LFS sha256), ``HEAD``/``GET
/{repo}/resolve/{rev}/{file}`` (X-Repo-Commit, ETag / X-Linked-Etag,
Content-Length, Range requests answered 206). Repositories are folders of
real files. It can ask for a token, refuse one (401), forbid (403), say a
repo is gated, throttle, and serve a damaged copy of a file a given number
of times; it logs every request.

It can also be hostile (tests/security/test_hostile_hub.py): list files
under names of its choosing (``listed``: name -> bytes, e.g. ``../x.gguf``)
and misbehave on a path (``behave``: "api" for the file list, or a file
name -> "silent" (accept, say nothing), "loris-headers" (a header byte now
and then), "loris-body" (a body byte now and then), "forever" (ignore Range
and stream without end), "huge" (a listed small file streamed far past its
size)). ``sent`` counts the bytes each hostile answer wrote."""
from __future__ import annotations

import hashlib
import json
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

LFS_SUFFIXES = (".safetensors", ".gguf", ".bin")


@dataclass
class HostedRepo:
    folder: Path
    commit: str = "0123456789abcdef0123456789abcdef01234567"
    token: str | None = None        #: required bearer token
    forbidden: bool = False
    gated: bool = False
    #: file name -> how many more times to serve it damaged ("truncate" or "flip")
    damage: dict[str, list] = field(default_factory=dict)
    #: extra files listed and served under any name (hostile names)
    listed: dict[str, bytes] = field(default_factory=dict)
    #: "api" or a file name -> a hostile behaviour (see the module)
    behave: dict[str, str] = field(default_factory=dict)

    def files(self) -> list[str]:
        return sorted(str(p.relative_to(self.folder)) for p in self.folder.rglob("*") if p.is_file())


class Hub:
    def __init__(self, rate: float | None = None):
        self.repos: dict[str, HostedRepo] = {}
        self.log: list[tuple[str, str, str]] = []     #: (method, path, Range header)
        self.rate = rate                               #: bytes per second per response, None: as fast as possible
        self._sha: dict[Path, str] = {}
        self.stop = threading.Event()
        self.sent: dict[str, int] = {}                 #: bytes written by each hostile answer
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_HEAD(self):
                hub._serve(self, head=True)

            def do_GET(self):
                hub._serve(self, head=False)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> "Hub":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.server.shutdown()
        self.server.server_close()

    def add(self, repo_id: str, folder: Path, **kw) -> HostedRepo:
        self.repos[repo_id] = HostedRepo(Path(folder), **kw)
        return self.repos[repo_id]

    def sha256(self, path: Path) -> str:
        if path not in self._sha:
            self._sha[path] = hashlib.sha256(path.read_bytes()).hexdigest()
        return self._sha[path]

    # ------------------------------------------------------------ serving

    def _error(self, h, status: int, code: str | None = None, message: str | None = None) -> None:
        body = json.dumps({"error": message or code or str(status)}).encode()
        h.send_response(status)
        if code:
            h.send_header("X-Error-Code", code)
        if message:
            h.send_header("X-Error-Message", message)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        h.wfile.write(body)

    def _auth(self, h, repo: HostedRepo) -> bool:
        got = h.headers.get("Authorization", "")
        if repo.token is not None:
            if not got:
                self._error(h, 401, "RepoNotFound", "Repository not found")
                return False
            if got != f"Bearer {repo.token}":
                self._error(h, 401, None, "Invalid credentials in Authorization header")
                return False
        if repo.gated:
            self._error(h, 403, "GatedRepo", "Access to this model is restricted")
            return False
        if repo.forbidden:
            self._error(h, 403, None, "You do not have access")
            return False
        return True

    def _serve(self, h, head: bool) -> None:
        url = urllib.parse.urlsplit(h.path)
        path = urllib.parse.unquote(url.path)
        self.log.append((h.command, path, h.headers.get("Range", "")))
        parts = path.strip("/").split("/")
        if parts[:2] == ["api", "models"] and len(parts) >= 4:
            repo_id = "/".join(parts[2:4])
            repo = self.repos.get(repo_id)
            if repo is None:
                return self._error(h, 404, "RepoNotFound", "Repository not found")
            if not self._auth(h, repo):
                return
            if "api" in repo.behave:
                return self._hostile(h, repo.behave["api"], "api", b"{}")
            if len(parts) >= 6 and parts[4] == "revision" and parts[5] not in ("main", repo.commit):
                return self._error(h, 404, "RevisionNotFound", "Invalid rev id")
            return self._info(h, repo_id, repo)
        if len(parts) >= 5 and parts[2] == "resolve":
            repo_id, rev, name = "/".join(parts[:2]), parts[3], "/".join(parts[4:])
            repo = self.repos.get(repo_id)
            if repo is None:
                return self._error(h, 404, "RepoNotFound", "Repository not found")
            if not self._auth(h, repo):
                return
            if rev not in ("main", repo.commit):
                return self._error(h, 404, "RevisionNotFound", "Invalid rev id")
            if name in repo.behave and not head:
                data = repo.listed.get(name)
                if data is None and (repo.folder / name).is_file():
                    data = (repo.folder / name).read_bytes()
                return self._hostile(h, repo.behave[name], name, data or b"")
            if name in repo.listed:
                return self._bytes(h, repo, name, repo.listed[name], head)
            file = repo.folder / name
            if not file.is_file():
                return self._error(h, 404, "EntryNotFound", "Entry not found")
            return self._file(h, repo, name, file, head)
        return self._error(h, 404, None, "Not found")

    def _hostile(self, h, mode: str, key: str, data: bytes) -> None:
        """Misbehave as ``mode`` says until the client goes or the hub stops."""
        def write(b: bytes) -> bool:
            try:
                h.wfile.write(b)
                h.wfile.flush()
            except OSError:
                return False
            self.sent[key] = self.sent.get(key, 0) + len(b)
            return True

        h.close_connection = True
        if mode == "silent":
            self.stop.wait(120)
            return
        if mode == "loris-headers":
            write(b"HTTP/1.1 200 OK\r\n")
            while not self.stop.wait(0.05) and write(b"X"):
                pass
            return
        if mode == "loris-body":
            write(b"HTTP/1.1 200 OK\r\nContent-Length: 100000000\r\nX-Repo-Commit: %s\r\n\r\n"
                  % HostedRepo.commit.encode())
            while not self.stop.wait(0.05) and write(b"{"):
                pass
            return
        if mode in ("forever", "huge"):
            # a 200 whatever the Range asked, and far more bytes than listed
            write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nX-Repo-Commit: %s\r\n\r\n"
                  % (1 << 40, HostedRepo.commit.encode()))
            for i in range(0, len(data), 1 << 16):      # the file as it is, then zeros without end
                if not write(data[i:i + (1 << 16)]):
                    return
            block = b"\0" * (1 << 16)
            while not self.stop.is_set() and write(block):
                pass
            return
        raise ValueError(mode)

    def _bytes(self, h, repo: HostedRepo, name: str, data: bytes, head: bool) -> None:
        etag = hashlib.sha256(data).hexdigest()
        h.send_response(200)
        h.send_header("X-Repo-Commit", repo.commit)
        h.send_header("ETag", f'"{etag}"')
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        if not head:
            h.wfile.write(data)

    def _info(self, h, repo_id: str, repo: HostedRepo) -> None:
        siblings = []
        for name in repo.files():
            p = repo.folder / name
            entry = {"rfilename": name, "size": p.stat().st_size,
                     "blobId": hashlib.sha1(p.read_bytes()).hexdigest()}
            if name.endswith(LFS_SUFFIXES):
                entry["lfs"] = {"sha256": self.sha256(p), "size": p.stat().st_size, "pointerSize": 134}
            siblings.append(entry)
        for name, data in repo.listed.items():
            entry = {"rfilename": name, "size": len(data)}
            if name.endswith(LFS_SUFFIXES):
                entry["lfs"] = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data), "pointerSize": 134}
            siblings.append(entry)
        body = json.dumps({"id": repo_id, "modelId": repo_id, "sha": repo.commit, "private": repo.token is not None,
                           "gated": False, "disabled": False, "downloads": 0, "likes": 0, "tags": [],
                           "siblings": siblings}).encode()
        h.send_response(200)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        h.wfile.write(body)

    def _file(self, h, repo: HostedRepo, name: str, file: Path, head: bool) -> None:
        data = file.read_bytes()
        size = len(data)
        lfs = name.endswith(LFS_SUFFIXES)
        etag = self.sha256(file) if lfs else hashlib.sha1(data).hexdigest()
        start, end = 0, size - 1
        rng = h.headers.get("Range")
        if rng and rng.startswith("bytes="):
            a, _, b = rng[6:].partition("-")
            start = int(a) if a else 0
            end = min(int(b), size - 1) if b else size - 1
        body = data[start:end + 1]
        if not head and not rng and repo.damage.get(name):     # a whole-file download, damaged
            kind = repo.damage[name].pop(0)
            if kind == "flip" and body:
                mid = len(body) // 2
                body = body[:mid] + bytes([body[mid] ^ 0xFF]) + body[mid + 1:]
        h.send_response(206 if rng else 200)
        h.send_header("X-Repo-Commit", repo.commit)
        h.send_header("ETag", f'"{etag}"')
        if lfs:
            h.send_header("X-Linked-Etag", f'"{etag}"')
            h.send_header("X-Linked-Size", str(size))
        h.send_header("Accept-Ranges", "bytes")
        h.send_header("Content-Length", str(len(body)))
        if rng:
            h.send_header("Content-Range", f"bytes {start}-{end}/{size}")
        h.end_headers()
        if head:
            return
        step = 1 << 16
        for i in range(0, len(body), step):
            try:
                h.wfile.write(body[i:i + step])
            except (BrokenPipeError, ConnectionResetError):
                return
            if self.rate:
                time.sleep(step / self.rate)

    def shard_gets(self) -> list[tuple[str, str]]:
        """GET requests of weight files beyond a header read: (path, Range)."""
        out = []
        for method, path, rng in self.log:
            if method == "GET" and "/resolve/" in path and path.endswith(LFS_SUFFIXES):
                if rng:
                    a, _, b = rng[6:].partition("-")
                    if b and int(b) - int(a or 0) < (1 << 20) and int(a or 0) < (1 << 20):
                        continue            # a header read
                out.append((path, rng))
        return out
