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
"""
from __future__ import annotations

import hashlib
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

KEYCHAIN_SERVICE = "ferry"
KEYCHAIN_USER = "huggingface-token"
DEFAULT_ENDPOINT = "https://huggingface.co"
#: Files other than weights that a conversion may read (config, index, tokenizer, template).
SMALL_SUFFIXES = (".json", ".jinja", ".model", ".tiktoken", ".txt")
SMALL_LIMIT = 64 << 20
#: Bytes between two progress reports of a download.
PROGRESS_CHUNK = 1 << 20
WEIGHT_SUFFIXES = (".safetensors", ".gguf", ".bin", ".pt", ".pth", ".ckpt", ".h5", ".msgpack", ".onnx")


class GetError(RuntimeError):
    """A plan or a download that cannot go on; the message says why and what to do."""


def endpoint() -> str:
    return (os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")


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

    where = f"{repo_id}{' ' + what if what else ''}"
    host = endpoint()
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
        return GetError(f"{host} answered {status} for {where}: {exc}")
    offline = getattr(errors, "OfflineModeIsEnabled", None)
    if offline is not None and isinstance(exc, offline):
        return GetError("HF_HUB_OFFLINE is set: unset it to download")
    name = type(exc).__name__
    if "Connect" in name or "Timeout" in name or "Network" in name or "Protocol" in name:
        return GetError(f"cannot reach {host} ({name}: {exc}); check the connection or the proxy "
                        f"(HTTPS_PROXY), or set HF_ENDPOINT to a mirror. What was downloaded is kept.")
    if isinstance(exc, OSError):
        return GetError(f"{where}: {exc}")
    return GetError(f"{where}: {name}: {exc}")


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


def open_repo(repo_id: str, revision: str | None = None) -> Repo:
    """The repository's file list (sizes, hashes) at ``revision`` (default: main)."""
    from huggingface_hub import HfApi

    if repo_id.count("/") != 1 or any(not part or part in (".", "..") for part in repo_id.split("/")):
        raise GetError(f"'{repo_id}' is not a repository name: write it as owner/name (e.g. moonshotai/Kimi-K2)")
    try:
        info = HfApi(endpoint=endpoint(), token=_token()).model_info(repo_id, revision=revision,
                                                                    files_metadata=True)
    except Exception as exc:
        raise explain(exc, repo_id) from exc
    files = []
    for s in info.siblings or []:
        lfs = getattr(s, "lfs", None)
        sha = getattr(lfs, "sha256", None) if lfs is not None else None
        size = getattr(s, "size", None) or (getattr(lfs, "size", None) if lfs is not None else None) or 0
        files.append(RepoFile(s.rfilename, int(size), sha))
    if not info.sha:
        raise GetError(f"{endpoint()} did not say which commit {repo_id} is at")
    return Repo(repo_id, info.sha, files, bool(info.gated))


def _bar_class(on_bytes: Callable[[int], None]):
    """A progress-bar class for the hub client that forwards byte counts (and
    lets ``on_bytes`` pause, or cancel by raising)."""
    from huggingface_hub.utils import tqdm

    class Bar(tqdm):
        def __init__(self, *args, **kwargs):
            kwargs["disable"] = True
            super().__init__(*args, **kwargs)

        def update(self, n=1):
            on_bytes(int(n or 0))
            return super().update(n)

    return Bar


def download(repo: Repo, name: str, folder: Path, on_bytes: Callable[[int], None] | None = None,
             force: bool = False) -> Path:
    """``name`` at the repo's commit into ``folder`` (the hub client resumes a
    partial download kept in ``folder/.cache``)."""
    from huggingface_hub import constants, hf_hub_download

    # The client reports (and so can be paused or stopped) once per chunk it reads, 10 MB by default:
    # a slow connection would show no progress for many seconds.
    constants.DOWNLOAD_CHUNK_SIZE = min(constants.DOWNLOAD_CHUNK_SIZE, PROGRESS_CHUNK)
    kwargs = {}
    if on_bytes is not None:
        kwargs["tqdm_class"] = _bar_class(on_bytes)
    try:
        path = hf_hub_download(repo.repo_id, name, revision=repo.commit, local_dir=folder, token=_token(),
                               endpoint=endpoint(), force_download=force, **kwargs)
    except Exception as exc:
        if isinstance(exc, GetError) or type(exc).__name__ == "ConvertCancelled":
            raise
        raise explain(exc, repo.repo_id, name) from exc
    return Path(path)


#: Network errors a weight download resumes after (within one run), at most this many times in a row.
RETRIES = 5


def _part(folder: Path, name: str) -> Path:
    return folder / ".cache" / "ferry" / f"{name}.part"


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

    Returns the path and the sha256 of the bytes written, computed as they
    arrive (a resumed part is hashed first), so no second read is needed."""
    from huggingface_hub import hf_hub_url
    from huggingface_hub.utils import build_hf_headers, get_session, hf_raise_for_status

    final, part = folder / f.name, _part(folder, f.name)
    part.parent.mkdir(parents=True, exist_ok=True)
    url = hf_hub_url(repo.repo_id, f.name, revision=repo.commit, endpoint=endpoint())
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
            with get_session().stream("GET", url, headers=headers, follow_redirects=True, timeout=60) as r:
                if r.status_code >= 400:
                    r.read()
                    hf_raise_for_status(r)
                if have and r.status_code != 206:      # the server ignored the Range: start over
                    have, digest, hashed = 0, hashlib.sha256(), 0
                with open(part, "r+b" if have else "wb") as out:
                    out.seek(have)
                    out.truncate()
                    for chunk in r.iter_bytes(PROGRESS_CHUNK):
                        out.write(chunk)
                        digest.update(chunk)
                        hashed += len(chunk)
                        failures = 0
                        if on_bytes is not None:
                            on_bytes(len(chunk))
        except Exception as exc:
            if type(exc).__name__ == "ConvertCancelled" or isinstance(exc, GetError):
                raise
            name = type(exc).__name__
            transient = any(w in name for w in ("Connect", "Timeout", "Protocol", "ReadError", "Network"))
            failures += 1
            if not transient or failures > RETRIES:
                raise explain(exc, repo.repo_id, f.name) from exc
            continue
        if part.stat().st_size < f.size and failures < RETRIES:   # the connection ended early: go on
            failures += 1
            continue
        break
    if part.stat().st_size != f.size:
        raise GetError(f"{repo.repo_id} {f.name}: received {part.stat().st_size} bytes, the hub lists {f.size}")
    os.replace(part, final)
    return final, digest.hexdigest()



def fetch_range(repo: Repo, name: str, start: int, length: int) -> bytes:
    """Bytes ``start .. start+length-1`` of a file (a safetensors header)."""
    from huggingface_hub import hf_hub_url
    from huggingface_hub.utils import build_hf_headers, get_session

    url = hf_hub_url(repo.repo_id, name, revision=repo.commit, endpoint=endpoint())
    headers = build_hf_headers(token=_token())
    headers["Range"] = f"bytes={start}-{start + length - 1}"
    headers["Accept-Encoding"] = "identity"
    try:
        r = get_session().get(url, headers=headers, follow_redirects=True)
        from huggingface_hub.utils import hf_raise_for_status
        hf_raise_for_status(r)
    except Exception as exc:
        raise explain(exc, repo.repo_id, name) from exc
    data = r.content
    if r.status_code == 200:          # a server that ignores Range: take the slice
        data = data[start:start + length]
    if len(data) != length:
        raise GetError(f"{repo.repo_id} {name}: asked for {length} bytes at {start}, got {len(data)}")
    return data


def fetch_safetensors_header(repo: Repo, name: str) -> bytes:
    """The first 8 + N bytes of a safetensors file: its length and JSON header."""
    from app.convert.safetensors_file import MAX_HEADER_BYTES

    head = fetch_range(repo, name, 0, 8)
    n = int.from_bytes(head, "little")
    if n > MAX_HEADER_BYTES or 8 + n > repo.file(name).size:
        raise GetError(f"{repo.repo_id} {name}: the header length {n} does not fit the file: not safetensors?")
    return head + fetch_range(repo, name, 8, n)


def sha256_of(path: Path, on_bytes: Callable[[int], None] | None = None) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(8 << 20):
            h.update(chunk)
            if on_bytes is not None:
                on_bytes(len(chunk))
    return h.hexdigest()


def _incomplete(folder: Path, f: RepoFile) -> list[Path]:
    """The hub client's partial files of ``f`` (named after its etag, the sha256 of a weight file)."""
    d = folder / ".cache" / "huggingface" / "download"
    if not d.is_dir() or not f.sha256:
        return []
    return list(d.glob(f"*.{f.sha256}.incomplete"))


def forget_partial(folder: Path, f: RepoFile) -> None:
    """Remove a downloaded file and the hub client's record of it (so it is fetched again)."""
    for p in (folder / f.name, folder / ".cache" / "huggingface" / "download" / f"{f.name}.metadata",
              _part(folder, f.name), *_incomplete(folder, f)):
        try:
            p.unlink()
        except FileNotFoundError:
            pass


def partial_size(folder: Path, f: RepoFile) -> int:
    """Bytes of ``f`` kept from an interrupted download."""
    part = _part(folder, f.name)
    return (part.stat().st_size if part.exists() else 0) + sum(p.stat().st_size for p in _incomplete(folder, f))


def free_bytes(folder: Path) -> int:
    return shutil.disk_usage(folder).free
