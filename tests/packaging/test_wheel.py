"""The Ferry wheel: what the app bundle installs (see packaging/README.md).

`pip wheel . --no-deps` of a clean copy of the sources must give one wheel
holding the `app` package and the compiled C core, and that extension must
load from the unpacked wheel on its own (not the checkout's in-place build).
The Briefcase configuration (from briefcase.toml) must point at files that exist.
"""
from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

from tests.conftest import REPO


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    src.mkdir()
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy(REPO / name, src / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.so", "*.pyd", "*.o")
    for name in ("app", "core_c"):
        shutil.copytree(REPO / name, src / name, ignore=ignore)
    res = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(tmp / "dist"),
                          str(src)], capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stdout + res.stderr
    wheels = list((tmp / "dist").glob("ferry-*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


@pytest.mark.slow
def test_wheel_holds_the_compiled_core(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    ext = [n for n in names if n.startswith("app/engine/_ferry_c") and n.endswith((".so", ".pyd"))]
    assert ext, f"no compiled C core in {wheel.name}"
    assert "app/__main__.py" in names and "app/engine/binding.py" in names
    assert "app/library.py" in names and "app/chat/export.py" in names and "app/ui/library_dialog.py" in names
    assert not any(n.startswith(("tests/", "core_c/", "bench/")) for n in names)
    # A platform wheel, not py3-none-any: it carries machine code.
    assert not wheel.name.endswith("-none-any.whl"), wheel.name
    entry = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
    assert entry and "ferry = app.cli:main" in zipfile.ZipFile(wheel).read(entry[0]).decode()


@pytest.mark.slow
def test_extension_loads_from_the_wheel(wheel, tmp_path):
    zipfile.ZipFile(wheel).extractall(tmp_path / "site")
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import app.engine._ferry_c as c; "
            "assert c.__file__.startswith(sys.argv[1]), c.__file__; "
            "print(c.ffi.string(c.lib.ferry_status_name(0)).decode())")
    res = subprocess.run([sys.executable, "-c", code, str(tmp_path / "site")], capture_output=True, text=True,
                         cwd=tmp_path, timeout=120)
    assert res.returncode == 0 and res.stdout.strip() == "FERRY_OK", res.stdout + res.stderr


def test_briefcase_configuration_points_at_real_files():
    from tests.packaging.test_briefcase_config import bc

    conf = bc.tool_briefcase()        # what Briefcase is given, from briefcase.toml
    app = conf["app"]["ferry"]
    assert conf["version"] == tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    assert (REPO / bc.LAUNCHER / "__main__.py").is_file() and bc.LAUNCHER.name == "ferry"
    for icon in [app["icon"], *(d["icon"] for d in app["document_type"].values())]:
        assert (REPO / f"{icon}.png").is_file() and (REPO / f"{icon}.icns").is_file(), icon
        assert (REPO / f"{icon}.icns").read_bytes()[:4] == b"icns"
    for d in app["document_type"].values():
        assert d["extension"].isalnum() and d["url"].startswith("https://")
    master = (REPO / "resources" / "ferry.png").read_bytes()
    assert master[:8] == b"\x89PNG\r\n\x1a\n"
    assert int.from_bytes(master[16:20], "big") == 1024 and int.from_bytes(master[20:24], "big") == 1024
    assert "--no-index" in app["requirement_installer_args"]
