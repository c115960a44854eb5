"""The Linux package's cache key: a hash of every input of the package.

    python packaging/package_key.py ROOT BRIEFCASE_VERSION TEMPLATE_ID GGUF COMPRESSOR

prints 16 hex digits. build_linux.sh reuses a cached .deb whose key matches.
Runs in the packaging virtual environment, which does not have Ferry: standard
library only.

Every input is hashed by its content, never by its modification time: a clean
clone (CI) checks the sources out, and a fresh virtual environment installs the
demo model, with new mtimes but the same bytes. Keying on the demo model's
mtime and path rebuilt the package cold in every CI run (about 5 minutes).
"""
from __future__ import annotations

import hashlib
import sys
from pathlib import Path

#: The package's inputs under the checkout: the application, the C core, the
#: build and packaging files.
INPUTS = ("app", "core_c", "setup.py", "pyproject.toml", "README.md", "briefcase.toml", "resources",
          "packaging/briefcase", "packaging/briefcase_config.py", "packaging/build_wheels.sh",
          "packaging/build_linux.sh", "packaging/package_key.py")
#: Build products and caches that sit among the inputs in a working checkout
#: but not in a clean clone.
SKIP_DIRS = {"__pycache__", "build"}
SKIP_SUFFIXES = (".so", ".o", ".pyc", ".pyd")


def _file_digest(path: Path) -> bytes:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.digest()


def package_key(root: Path, briefcase_version: str, template_id: str, gguf: Path, compressor: str) -> str:
    # Not the demo model's path either: a clean clone's virtual environment is
    # somewhere else.
    h = hashlib.sha256("\0".join((briefcase_version, template_id, compressor)).encode())
    h.update(_file_digest(gguf))
    for name in INPUTS:
        p = root / name
        if p.is_file():
            files = [p]
        else:
            files = sorted(f for f in p.rglob("*") if f.is_file()
                           and not SKIP_DIRS & set(f.relative_to(root).parts)
                           and f.suffix not in SKIP_SUFFIXES)
        for f in files:
            h.update(str(f.relative_to(root)).encode() + b"\0" + _file_digest(f))
    return h.hexdigest()[:16]


def main(argv: list[str]) -> int:
    if len(argv) != 5:
        print("usage: package_key.py ROOT BRIEFCASE_VERSION TEMPLATE_ID GGUF COMPRESSOR", file=sys.stderr)
        return 2
    root, version, template, gguf, compressor = argv
    print(package_key(Path(root), version, template, Path(gguf), compressor))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
