"""atheris harness: the file names a manifest gives (tokenizer.file,
tokenizer.chat_template), as app/engine/container_files.py resolves them.

A scratch container holds a regular file, a file in a subfolder, a link
inside, links out (to a host file, to /dev/zero, to a folder outside), a
FIFO, a folder and an oversized file. The input is JSON -- a tokenizer
object whose "file" and "chat_template" are checked -- or, when it is not,
its bytes (undecodable ones kept as surrogate escapes, as a file name may
carry) are the name. contained_file may only raise ContainerFileError, and
what it returns must be a regular file inside the container and within the
limit; read_contained_text may add nothing but that error."""
from __future__ import annotations

import json
import os
import stat

from fuzzlib import allowed, atheris, main, scratch_dir

with atheris.instrument_imports(include=["app"]):
    from app.engine.container_files import ContainerFileError, contained_file, read_contained_text

LIMIT = 64
ROOT = scratch_dir() / "c.ferry"
OUTSIDE = ROOT.parent / "outside"


def _build() -> None:
    (ROOT / "sub").mkdir(parents=True)
    OUTSIDE.mkdir()
    (OUTSIDE / "secret.txt").write_text("host secret")
    (ROOT / "tokenizer.json").write_text("{}")
    (ROOT / "sub" / "chat.jinja").write_text("{{ messages }}")
    (ROOT / "latin1.txt").write_bytes(b"caf\xe9")
    (ROOT / "big.txt").write_text("x" * (LIMIT + 1))
    (ROOT / "inside").symlink_to(ROOT / "sub" / "chat.jinja")
    (ROOT / "out").symlink_to(OUTSIDE / "secret.txt")
    (ROOT / "outdir").symlink_to(OUTSIDE)
    (ROOT / "zero").symlink_to("/dev/zero")
    (ROOT / "loop").symlink_to(ROOT / "loop")
    os.mkfifo(ROOT / "pipe")


_build()
REAL_ROOT = ROOT.resolve()


def _names(data: bytes) -> list[object]:
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError):
        return [os.fsdecode(data.split(b"\0", 1)[0] or b".")]
    if isinstance(doc, dict):
        return [doc.get("file"), doc.get("chat_template")]
    return [doc]


def test_one(data: bytes) -> None:
    for name in _names(data):
        with allowed(ContainerFileError):
            path = contained_file(ROOT, name, "tokenizer.file", LIMIT)
            assert REAL_ROOT in path.parents, f"{name!r} resolved outside the container: {path}"
            st = path.stat()
            assert stat.S_ISREG(st.st_mode) and st.st_size <= LIMIT, f"{name!r}: {path} should be refused"
        with allowed(ContainerFileError):
            text = read_contained_text(ROOT, name, "tokenizer.chat_template", LIMIT)
            assert isinstance(text, str) and len(text) <= LIMIT


if __name__ == "__main__":
    main(test_one)
