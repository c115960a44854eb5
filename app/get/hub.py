"""The hub, through its own client library (``huggingface_hub``): a
repository's file list with sizes and hashes, its small files, the header of
each safetensors shard (two ranged reads), and whole files with progress,
pause, cancel and resume.

The endpoint is ``HF_ENDPOINT`` (a mirror, an internal hub) read at each
call, the proxies those of the environment (``HTTPS_PROXY``, ``NO_PROXY``:
the hub client's HTTP library honours them). The access token comes from the
OS keychain (``ferry get --login`` puts it there) and is never written to a
file by Ferry; without one, the library's own setting (``HF_TOKEN`` or a
``huggingface-cli login``) is used. Every failure is turned into a
:class:`GetError` whose message says what happened and what to do.

The hub (or whatever HF_ENDPOINT names) is treated as hostile: the requests
are Ferry's own, on the client's session, with a deadline on every wait
(:data:`CONNECT_S`...) and a size limit on every answer taken from what was
asked; every name in the file list must stay inside the folder it is joined
to (:func:`inside`, app.untrusted). See docs/SECURITY.md, section 6.
"""
from __future__ import annotations

import hashlib
import os
import re
import shutil
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable
from urllib.parse import quote

from app.store.private import private_dir
from app.untrusted import BadData, UnsafeName, check_name, join_inside, parse_json, shown

KEYCHAIN_SERVICE = "ferry"
KEYCHAIN_USER = "huggingface-token"
DEFAULT_ENDPOINT = "https://huggingface.co"
#: Files other than weights that a conversion may read (config, index, tokenizer, template).
SMALL_SUFFIXES = (".json", ".jinja", ".model", ".tiktoken", ".txt")
SMALL_LIMIT = 64 << 20
WEIGHT_SUFFIXES = (".safetensors", ".gguf", ".bin", ".pt", ".pth", ".ckpt", ".h5", ".msgpack", ".onnx")
#: Bytes between two progress reports of a weight download.
PROGRESS_CHUNK = 1 << 20
#: Largest file list (the JSON of a repository with its files) read from the hub.
LISTING_LIMIT = 32 << 20
#: Largest error body read (the hub's JSON error message).
ERROR_BODY_LIMIT = 64 << 10
#: Largest size a hub may list for one file (1 PiB): anything above is a hostile or broken listing.
MAX_FILE_SIZE = 1 << 50
#: Seconds allowed to connect, to wait for the answer's first byte or the next one, and for a whole small
#: request (the file list, a config, a header: plus one second per MIN_SMALL_RATE bytes asked).
#: FERRY_NET_TIMEOUTS="connect,read,total" changes them (the tests use fractions of a second).
CONNECT_S, READ_S, SMALL_TOTAL_S = 20.0, 60.0, 120.0
MIN_SMALL_RATE = 256 << 10


class GetError(RuntimeError):
    """A plan or a download that cannot go on; the message says why and what to
    do, on one line, anything the hub said in it escaped (app.untrusted.shown)."""

    def __init__(self, message: object = "", *, transient: bool = False):
        super().__init__(shown(message))
        self.transient = transient          #: a network failure that trying again may get past


def endpoint() -> str:
    return (os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")


def deadlines() -> tuple[float, float, float]:
    """(connect, read, total) seconds: see CONNECT_S."""
    raw = os.environ.get("FERRY_NET_TIMEOUTS", "")
    try:
        c, r, t = (float(x) for x in raw.split(","))
        if min(c, r, t) > 0:
            return c, r, t
    except ValueError:
        pass
    return CONNECT_S, READ_S, SMALL_TOTAL_S


# ----------------------------------------------------------------- token

def keychain_token() -> str | None:
    """The hub token kept in the OS keychain, or None."""
    try:
        import keyring
        return keyring.get_password(KEYCHAIN_SERVICE, KEYCHAIN_USER) or None
    except Exception:       # no backend, a locked keychain: as if there were no token
        return None


def store_token(token: str) -> None:
    """Keep ``token`` in the OS keychain (refused when there is none: never a plain file)."""
    from app.store.crypto import keychain_problem

    problem = keychain_problem()
    if problem:
        raise GetError(f"cannot keep the token: {problem}. Set HF_TOKEN for this session instead.")
    import keyring
    keyring.set_password(KEYCHAIN_SERVICE, KEYCHAIN_USER, token.strip())


def forget_token() -> None:
    try:
        import keyring
        keyring.delete_password(KEYCHAIN_SERVICE, KEYCHAIN_USER)
    except Exception:
        pass


def _token() -> str | None:
    return keychain_token()      # None: the library's own (HF_TOKEN, its login)


# ----------------------------------------------------------------- errors

def explain(exc: BaseException, repo_id: str, what: str = "") -> GetError:
    """A hub client exception as a GetError that says what to do."""
    from huggingface_hub import errors

    where = shown(f"{repo_id}{' ' + what if what else ''}")
    host = shown(endpoint())
    first = shown(str(exc).strip().splitlines()[0] if str(exc).strip() else "")
    if isinstance(exc, errors.GatedRepoError):
        return GetError(f"{repo_id} is gated: accept its terms on {host}/{repo_id} with your account, then "
                        f"give Ferry a token of that account (`ferry get --login`)")
    if isinstance(exc, errors.RevisionNotFoundError):
        return GetError(f"{repo_id} has no revision of that name (a branch, tag or commit); check --revision")
    if isinstance(exc, errors.RemoteEntryNotFoundError):
        return GetError(f"{where}: the file is not in the repository")
    if isinstance(exc, errors.RepositoryNotFoundError):
        return GetError(f"{repo_id} was not found on {host}: check the name (owner/name); a private repository "
                        f"also needs a token that may read it (`ferry get --login`)")
    if isinstance(exc, errors.HfHubHTTPError):
        status = getattr(exc.response, "status_code", None)
        if status == 401:
            return GetError(f"{host} refused the token (401 Unauthorized) for {repo_id}: it is wrong or expired; "
                            f"store a new one with `ferry get --login`")
        if status == 403:
            return GetError(f"{host} does not allow this account to read {repo_id} (403 Forbidden): request access "
                            f"on its page, or use a token with read permission (`ferry get --login`)")
        if status == 404:
            return GetError(f"{where} was not found on {host} (404)")
        if status == 429:
            return GetError(f"{host} is limiting requests (429): wait a few minutes and run the same command again "
                            f"(what was downloaded is kept)")
        return GetError(f"{host} answered {status} for {where}: {first}")
    offline = getattr(errors, "OfflineModeIsEnabled", None)
    if offline is not None and isinstance(exc, offline):
        return GetError("HF_HUB_OFFLINE is set: unset it to download")
    name = type(exc).__name__
    if name in ("ReadTimeout", "WriteTimeout"):
        return GetError(f"{host} stopped answering for {deadlines()[1]:g} s ({where}); check the connection, "
                        f"or set HF_ENDPOINT to another mirror. What was downloaded is kept.", transient=True)
    if any(w in name for w in ("Connect", "Timeout", "Network", "Protocol", "ReadError", "WriteError")):
        return GetError(f"cannot reach {host} ({name}: {first}); check the connection or the proxy "
                        f"(HTTPS_PROXY), or set HF_ENDPOINT to a mirror. What was downloaded is kept.",
                        transient=True)
    if isinstance(exc, OSError):
        return GetError(f"{where}: {first}")
    return GetError(f"{where}: {name}: {first}")


# ----------------------------------------------------------------- files

@dataclass(frozen=True)
class RepoFile:
    name: str
    size: int
    sha256: str | None      #: of the content, for LFS files (weights); None for small git files

    @property
    def is_weight(self) -> bool:
        return self.name.lower().endswith(WEIGHT_SUFFIXES)

    @property
    def is_small(self) -> bool:
        return ("/" not in self.name and self.name.lower().endswith(SMALL_SUFFIXES)
                and self.size <= SMALL_LIMIT)


@dataclass
class Repo:
    repo_id: str
    commit: str                     #: the revision resolved to a commit: every file comes from it
    files: list[RepoFile] = field(default_factory=list)
    gated: bool = False

    def file(self, name: str) -> RepoFile:
        for f in self.files:
            if f.name == name:
                return f
        raise GetError(f"{self.repo_id} has no file {name}")

    @property
    def shards(self) -> list[RepoFile]:
        return [f for f in self.files if "/" not in f.name and f.name.endswith(".safetensors")]

    @property
    def ggufs(self) -> list[RepoFile]:
        return [f for f in self.files if f.name.lower().endswith(".gguf")]

    @property
    def small(self) -> list[RepoFile]:
        return [f for f in self.files if f.is_small]

    @property
    def name(self) -> str:
        return self.repo_id.rstrip("/").split("/")[-1]


def _listing_name(repo_id: str) -> str:
    return f"{endpoint()}'s file list of {repo_id}"


def open_repo(repo_id: str, revision: str | None = None) -> Repo:
    """The repository's file list (sizes, hashes) at ``revision`` (default:
    main). Every name in it must be a plain relative name (app.untrusted):
    a hub or mirror listing ``/abs.gguf`` or ``../x`` is refused whole."""
    from huggingface_hub.utils import build_hf_headers

    check_repo_id(repo_id)
    url = f"{endpoint()}/api/models/{repo_id}"
    if revision is not None:
        url += f"/revision/{quote(revision, safe='')}"
    body = _get_small(url, build_hf_headers(token=_token()), LISTING_LIMIT, repo_id, "the file list",
                      params={"blobs": "true"}, over="error")
    return parse_listing(body, repo_id)


def parse_listing(body: bytes, repo_id: str) -> Repo:
    """The hub's answer to /api/models/REPO?blobs=true as a Repo, every name,
    size, hash and the commit checked; GetError otherwise."""
    what = shown(_listing_name(repo_id))
    try:
        info = parse_json(body, what, max_bytes=LISTING_LIMIT)
    except BadData as exc:
        raise GetError(str(exc)) from None
    if not isinstance(info, dict):
        raise GetError(f"{what} is not a JSON object")
    siblings = info.get("siblings") or []
    if not isinstance(siblings, list):
        raise GetError(f"{what}: 'siblings' is not a list")
    files, seen = [], set()
    for s in siblings:
        if not isinstance(s, dict):
            raise GetError(f"{what}: an entry of 'siblings' is not an object")
        try:
            name = check_name(s.get("rfilename"), what)
        except UnsafeName as exc:
            raise GetError(f"{exc}: refused (a hostile or broken hub or mirror? nothing was written)") from None
        if name in seen:
            raise GetError(f"{what} lists {shown(name)} twice")
        seen.add(name)
        lfs = s.get("lfs")
        lfs = lfs if isinstance(lfs, dict) else {}
        sha, size = lfs.get("sha256"), s.get("size") if s.get("size") is not None else lfs.get("size")
        if sha is not None and not (isinstance(sha, str) and re.fullmatch(r"[0-9a-f]{64}", sha)):
            raise GetError(f"{what}: the sha256 of {shown(name)} is not 64 hex digits")
        if size is None:
            size = 0
        if not isinstance(size, int) or isinstance(size, bool) or not 0 <= size <= MAX_FILE_SIZE:
            raise GetError(f"{what}: the size of {shown(name)} ({shown(repr(size))[:40]}) is not a byte count")
        files.append(RepoFile(name, size, sha))
    commit = info.get("sha")
    if not isinstance(commit, str) or not re.fullmatch(r"[0-9a-f]{40}", commit):
        raise GetError(f"{shown(endpoint())} did not say which commit {shown(repo_id)} is at "
                       f"(a 40-hex-digit 'sha')")
    return Repo(repo_id, commit, files, bool(info.get("gated")))


def check_repo_id(repo_id: str) -> str:
    """``repo_id`` if it is ``owner/name`` of plain names (it names folders in --into)."""
    parts = repo_id.split("/") if isinstance(repo_id, str) else []
    try:
        if len(parts) != 2 or any(p in ("", ".", "..") for p in parts):
            raise UnsafeName("")
        check_name(repo_id, "the repository name")
    except UnsafeName:
        raise GetError(f"'{shown(repo_id)}' is not a repository name: write it as owner/name "
                       f"(e.g. moonshotai/Kimi-K2)") from None
    return repo_id


def inside(folder: Path, name: str, repo: Repo | None = None) -> Path:
    """``folder / name`` for a name the hub gave, proven to stay inside
    ``folder`` (app.untrusted.join_inside); GetError otherwise."""
    try:
        return join_inside(folder, name, _listing_name(repo.repo_id) if repo else "the hub")
    except UnsafeName as exc:
        raise GetError(f"{exc}: refused, nothing written there") from None


# ----------------------------------------------------------------- requests with deadlines

def _timeout(session):
    c, r, _ = deadlines()
    return type(session.timeout)(connect=c, read=r, write=r, pool=c)


def _send(url: str, headers: dict, repo_id: str, what: str, params: dict | None = None):
    """A streamed GET whose status and headers arrive within the total
    deadline (a server that accepts and says nothing, or sends its headers a
    byte at a time, is given up on). The body is read by the caller."""
    from huggingface_hub.utils import get_session

    session = get_session()
    total = deadlines()[2]
    box: dict = {}
    done = threading.Event()

    def run():
        try:
            request = session.build_request("GET", url, headers=headers, params=params, timeout=_timeout(session))
            r = session.send(request, stream=True, follow_redirects=True)
            if box.get("abandoned"):
                r.close()
            else:
                box["r"] = r
        except BaseException as exc:        # handed to the caller
            box["e"] = exc
        finally:
            done.set()

    threading.Thread(target=run, name="ferry-get-request", daemon=True).start()
    if not done.wait(total):
        box["abandoned"] = True
        if "r" in box:
            box["r"].close()
        raise GetError(f"{shown(endpoint())} did not answer within {total:g} s ({shown(repo_id)} {shown(what)}); "
                       f"check the connection, or set HF_ENDPOINT to another mirror. What was downloaded is kept.",
                       transient=True)
    if "e" in box:
        raise explain(box["e"], repo_id, what) from box["e"]
    return box["r"]


def _raise_for_status(r, repo_id: str, what: str) -> None:
    """An error answer (its body read up to ERROR_BODY_LIMIT) as a GetError."""
    from huggingface_hub.utils import hf_raise_for_status

    if r.status_code < 400:
        return
    try:
        body = _read_body(r, ERROR_BODY_LIMIT, True, repo_id, what, over="stop")
    finally:
        r.close()
    answer = type(r)(r.status_code, headers=r.headers, content=body, request=r.request)
    try:
        hf_raise_for_status(answer)
    except Exception as exc:
        raise explain(exc, repo_id, what) from exc
    raise GetError(f"{shown(endpoint())} answered {r.status_code} for {shown(repo_id)} {shown(what)}")


def _read_body(r, limit: int, timed: bool, repo_id: str, what: str, *, over: str,
               sink=None, chunk_size: int | None = None) -> bytes:
    """At most ``limit`` bytes of ``r``'s body (kept, or handed to ``sink``),
    each within the read timeout; ``timed``: all within the total deadline
    plus one second per MIN_SMALL_RATE bytes received (so a hub that sends
    a byte now and then is given up on, a large listing on a slow line is
    not). More than
    ``limit``: ``over="stop"`` keeps the first ``limit`` and drops the
    connection, ``over="error"`` refuses. The body is read as sent: a server
    that compresses it although Ferry asked for identity is refused."""
    enc = r.headers.get("Content-Encoding", "identity").strip().lower()
    if enc not in ("", "identity"):
        r.close()
        raise GetError(f"{shown(endpoint())} sent {shown(repo_id)} {shown(what)} compressed ({shown(enc)}) although "
                       f"Ferry asked for it as it is: refused")
    out: list[bytes] = []
    got = 0
    start, total = time.monotonic(), deadlines()[2]
    try:
        for chunk in r.iter_raw(chunk_size):
            if got + len(chunk) > limit:
                if over == "error":
                    raise GetError(f"{shown(endpoint())} sent more than the {limit} bytes of {shown(repo_id)} "
                                   f"{shown(what)} it listed: refused (a hostile or broken hub or mirror?)")
                chunk = chunk[:limit - got]
            got += len(chunk)
            if sink is not None:
                sink(chunk)
            else:
                out.append(chunk)
            if got >= limit and over == "stop":
                break
            if timed and time.monotonic() > start + total + got / MIN_SMALL_RATE:
                raise GetError(f"{shown(endpoint())} took too long to send {shown(repo_id)} {shown(what)} "
                               f"({got} bytes in {time.monotonic() - start:.0f} s): a stalled or hostile hub? "
                               f"Try again, or set HF_ENDPOINT to another mirror.", transient=True)
    except GetError:
        raise
    except Exception as exc:
        if type(exc).__name__ == "ConvertCancelled":
            raise
        raise explain(exc, repo_id, what) from exc
    finally:
        r.close()
    return b"".join(out)


def _get_small(url: str, headers: dict, limit: int, repo_id: str, what: str, *, params: dict | None = None,
               over: str = "error") -> bytes:
    """The body of a small GET, bounded in bytes and in time (see _read_body)."""
    headers = {**headers, "Accept-Encoding": "identity"}
    r = _send(url, headers, repo_id, what, params)
    _raise_for_status(r, repo_id, what)
    return _read_body(r, limit, True, repo_id, what, over=over)


def _file_url(repo: Repo, name: str) -> str:
    from huggingface_hub import hf_hub_url
    return hf_hub_url(repo.repo_id, name, revision=repo.commit, endpoint=endpoint())


def download(repo: Repo, name: str, folder: Path, on_bytes: Callable[[int], None] | None = None,
             force: bool = False) -> Path:
    """A small file (config, tokenizer, index) at the repo's commit into
    ``folder``: at most the size the hub lists, within the small-request
    deadline, written whole or not at all. ``force`` is accepted for
    symmetry with weights (a small file is always fetched whole)."""
    from huggingface_hub.utils import build_hf_headers

    f = repo.file(name)
    if f.size > SMALL_LIMIT:
        raise GetError(f"{shown(repo.repo_id)} {shown(name)} is listed with {f.size} bytes, more than the "
                       f"{SMALL_LIMIT} a small file may have")
    final = inside(folder, name, repo)
    private_dir(final.parent)
    data = _get_small(_file_url(repo, name), build_hf_headers(token=_token()), f.size, repo.repo_id, name)
    if len(data) != f.size:
        raise GetError(f"{shown(repo.repo_id)} {shown(name)}: received {len(data)} bytes, the hub lists {f.size}")
    if on_bytes is not None:
        on_bytes(len(data))
    tmp = final.with_name(final.name + ".ferry-tmp")
    tmp.write_bytes(data)
    os.replace(tmp, final)
    return final


#: Network errors a weight download resumes after (within one run), at most this many times in a row.
RETRIES = 5


def _part(folder: Path, name: str) -> Path:
    return inside(folder / ".cache" / "ferry", f"{name}.part")


def download_weights(repo: Repo, f: RepoFile, folder: Path,
                     on_bytes: Callable[[int], None] | None = None) -> tuple[Path, str]:
    """A weight file (a shard, a GGUF) into ``folder``, resumable across runs
    and kills: it streams into ``folder/.cache/ferry/NAME.part`` and a later
    call asks only for the rest (a Range request), then moves it into place.
    The hub client's URL, headers (token, user agent), session (proxies,
    HF_ENDPOINT) and errors are used; its own download is not, because it
    discards a partial file when it is interrupted (huggingface_hub 2.4,
    `_download_to_tmp_and_move`), which would lose up to a whole shard (tens of
    GB) at every stop or crash.

    Every wait has a deadline (the answer's headers within the total of a
    small request, each later byte within the read timeout) and no more than
    the bytes still missing are taken: a hub that streams past the listed
    size is cut off there (and the result checked against the hash).

    Returns the path and the sha256 of the bytes written, computed as they
    arrive (a resumed part is hashed first), so no second read is needed."""
    from huggingface_hub.utils import build_hf_headers

    final, part = inside(folder, f.name, repo), _part(folder, f.name)
    private_dir(final.parent)
    private_dir(part.parent)
    url = _file_url(repo, f.name)
    failures = 0
    digest, hashed = hashlib.sha256(), 0
    while True:
        have = part.stat().st_size if part.exists() else 0
        if have > f.size:
            part.unlink()
            have = 0
        if hashed != have:                   # a part from an earlier run (or a restart): hash what is there
            digest, hashed = hashlib.sha256(), 0
            if have:
                with open(part, "rb") as src:
                    while hashed < have and (chunk := src.read(min(8 << 20, have - hashed))):
                        digest.update(chunk)
                        hashed += len(chunk)
        if have == f.size:
            break
        headers = build_hf_headers(token=_token())
        headers["Accept-Encoding"] = "identity"
        if have:
            headers["Range"] = f"bytes={have}-"
        try:
            r = _send(url, headers, repo.repo_id, f.name)
            _raise_for_status(r, repo.repo_id, f.name)
            if have and r.status_code != 206:      # the server ignored the Range: start over
                have, digest, hashed = 0, hashlib.sha256(), 0
            with open(part, "r+b" if have else "wb") as out:
                out.seek(have)
                out.truncate()

                def sink(chunk: bytes) -> None:
                    nonlocal hashed, failures
                    out.write(chunk)
                    digest.update(chunk)
                    hashed += len(chunk)
                    failures = 0
                    if on_bytes is not None:
                        on_bytes(len(chunk))

                _read_body(r, f.size - have, False, repo.repo_id, f.name, over="stop", sink=sink,
                           chunk_size=PROGRESS_CHUNK)
        except GetError as exc:
            failures += 1
            if not exc.transient or failures > RETRIES:
                raise
            continue
        except Exception as exc:
            if type(exc).__name__ == "ConvertCancelled":
                raise
            raise explain(exc, repo.repo_id, f.name) from exc
        if part.stat().st_size < f.size and failures < RETRIES:   # the connection ended early: go on
            failures += 1
            continue
        break
    if part.stat().st_size != f.size:
        raise GetError(f"{shown(repo.repo_id)} {shown(f.name)}: received {part.stat().st_size} bytes, the hub "
                       f"lists {f.size}")
    os.replace(part, final)
    return final, digest.hexdigest()


def fetch_range(repo: Repo, name: str, start: int, length: int) -> bytes:
    """Bytes ``start .. start+length-1`` of a file (a safetensors header, a
    GGUF head). A server that ignores the Range is read only up to the end of
    what was asked, then the connection is dropped."""
    from huggingface_hub.utils import build_hf_headers

    headers = build_hf_headers(token=_token())
    headers["Range"] = f"bytes={start}-{start + length - 1}"
    what = f"{name} (bytes {start}-{start + length - 1})"
    r = _send(_file_url(repo, name), {**headers, "Accept-Encoding": "identity"}, repo.repo_id, what)
    _raise_for_status(r, repo.repo_id, what)
    whole = r.status_code == 200          # a server that ignores Range: read up to the end asked, then drop
    limit = start + length if whole else length
    data = _read_body(r, limit, True, repo.repo_id, what, over="stop" if whole else "error")
    if whole:
        data = data[start:start + length]
    if len(data) != length:
        raise GetError(f"{shown(repo.repo_id)} {shown(name)}: asked for {length} bytes at {start}, got {len(data)}")
    return data


def fetch_safetensors_header(repo: Repo, name: str) -> bytes:
    """The first 8 + N bytes of a safetensors file: its length and JSON header."""
    from app.convert.safetensors_file import MAX_HEADER_BYTES

    head = fetch_range(repo, name, 0, 8)
    n = int.from_bytes(head, "little")
    if n > MAX_HEADER_BYTES or 8 + n > repo.file(name).size:
        raise GetError(f"{shown(repo.repo_id)} {shown(name)}: the header length {n} does not fit the file: "
                       f"not safetensors?")
    return head + fetch_range(repo, name, 8, n)


def sha256_of(path: Path, on_bytes: Callable[[int], None] | None = None) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(8 << 20):
            h.update(chunk)
            if on_bytes is not None:
                on_bytes(len(chunk))
    return h.hexdigest()


def forget_partial(folder: Path, f: RepoFile) -> None:
    """Remove a downloaded file and its partial copy (so it is fetched again)."""
    for p in (inside(folder, f.name), _part(folder, f.name)):
        try:
            p.unlink()
        except FileNotFoundError:
            pass


def partial_size(folder: Path, f: RepoFile) -> int:
    """Bytes of ``f`` kept from an interrupted download."""
    part = _part(folder, f.name)
    return part.stat().st_size if part.exists() else 0


def free_bytes(folder: Path) -> int:
    return shutil.disk_usage(folder).free
