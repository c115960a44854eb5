"""atheris harness: a hub's file list (the JSON of /api/models/REPO?blobs=true)
as `ferry get` reads it from a hub or a mirror (app/get/hub.py parse_listing).

The input is the answer's body. parse_listing may only raise GetError; every
file it accepts must have a size within the limit and a name that
app.untrusted.join_inside keeps inside a scratch folder -- which holds a link
out (to a folder outside), so a name through it must be refused there -- and
a message must never carry a raw control character."""
from __future__ import annotations

import os

from fuzzlib import allowed, atheris, main, scratch_dir

with atheris.instrument_imports(include=["app"]):
    from app.get.hub import MAX_FILE_SIZE, GetError, inside, parse_listing

ROOT = scratch_dir() / "into"
OUTSIDE = ROOT.parent / "outside"
ROOT.mkdir()
OUTSIDE.mkdir()
(ROOT / "out").symlink_to(OUTSIDE)
REAL_ROOT = ROOT.resolve()


def _clean(message: str) -> None:
    assert not any(ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F for c in message), repr(message)


def test_one(data: bytes) -> None:
    try:
        repo = parse_listing(data, "fuzz/repo")
    except GetError as exc:
        _clean(str(exc))
        return
    assert len(repo.commit) == 40
    for f in repo.files:
        assert 0 <= f.size <= MAX_FILE_SIZE
        with allowed(GetError):
            try:
                path = inside(ROOT, f.name, repo)
            except GetError as exc:
                _clean(str(exc))
                raise
            real = os.path.realpath(path)
            assert real.startswith(str(REAL_ROOT) + os.sep), (f.name, real)


if __name__ == "__main__":
    main(test_one)
