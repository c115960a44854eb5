"""The Linux package's cache key (packaging/package_key.py) depends on what the
package is made of, not on where or when a checkout or a virtual environment was
made: CI's clean clone must reuse a package built from the same sources."""
from __future__ import annotations

import importlib.util
import os
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _module():
    spec = importlib.util.spec_from_file_location("package_key", ROOT / "packaging" / "package_key.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _tree(where: Path) -> tuple[Path, Path]:
    root = where / "checkout"
    (root / "app" / "engine").mkdir(parents=True)
    (root / "app" / "engine" / "x.py").write_text("print('x')\n")
    (root / "core_c" / "src").mkdir(parents=True)
    (root / "core_c" / "src" / "y.c").write_text("int y;\n")
    (root / "README.md").write_text("# readme\n")
    gguf = where / "venv" / "demo.gguf"
    gguf.parent.mkdir()
    gguf.write_bytes(b"GGUF" + bytes(range(200)))
    return root, gguf


def test_key_ignores_paths_mtimes_and_build_products(tmp_path):
    key = _module().package_key
    root, gguf = _tree(tmp_path / "a")
    first = key(root, "0.3.20", "github:v0.3.20", gguf, "zstd")
    # The same sources and demo model elsewhere, made later (a clean clone and a fresh venv).
    other = tmp_path / "b"
    shutil.copytree(tmp_path / "a", other)
    root2, gguf2 = other / "checkout", other / "venv" / "demo.gguf"
    for f in [gguf2, *root2.rglob("*")]:
        os.utime(f, (1_000_000_000, 1_000_000_000))
    # Build products and caches a working checkout has and a clean clone lacks.
    (root2 / "app" / "engine" / "_ferry_c.abi3.so").write_bytes(b"\x7fELF")
    (root2 / "app" / "__pycache__").mkdir()
    (root2 / "app" / "__pycache__" / "x.cpython-311.pyc").write_bytes(b"pyc")
    assert key(root2, "0.3.20", "github:v0.3.20", gguf2, "zstd") == first


def test_key_follows_every_input(tmp_path):
    key = _module().package_key
    root, gguf = _tree(tmp_path)
    first = key(root, "0.3.20", "github:v0.3.20", gguf, "zstd")
    gguf.write_bytes(gguf.read_bytes()[:-1] + b"\x00")
    changed_model = key(root, "0.3.20", "github:v0.3.20", gguf, "zstd")
    assert changed_model != first
    (root / "core_c" / "src" / "y.c").write_text("int y = 1;\n")
    changed_source = key(root, "0.3.20", "github:v0.3.20", gguf, "zstd")
    assert changed_source not in (first, changed_model)
    assert key(root, "0.3.21", "github:v0.3.21", gguf, "zstd") != changed_source
    assert key(root, "0.3.20", "github:v0.3.20", gguf, "xz") != changed_source


def test_build_script_uses_the_key_module():
    script = (ROOT / "packaging" / "build_linux.sh").read_text()
    assert "packaging/package_key.py" in script
    assert "st_mtime" not in script
