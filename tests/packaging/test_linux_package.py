"""The Linux package, built by Briefcase and started as a user would (issue 37).

packaging/build_linux.sh builds the .deb (or reuses the one built from the same
sources: its cache is keyed on their hash); the test installs it with dpkg,
starts the installed launcher /usr/bin/ferry as an unprivileged user with an
empty home, under Xvfb, in a network namespace with no network at all
(`unshare -n`), in `--screenshot` mode: the first answer comes from the demo
model the package carries (converted into the user's data folder), then the
window's states and the conversion wizard's pages on the same demo model; the
run exits non-zero if any state fails. Then it purges the package and checks
that nothing of it is left, and that everything the app wrote is in the
user's data folder.

Needs root (or passwordless sudo), dpkg, Xvfb, unshare/setpriv, the system
Python with venv and headers, the package registry or a warm pip cache, and
Briefcase's app template: FERRY_BRIEFCASE_TEMPLATE, the default copy under the
packaging cache, or GitHub. FERRY_PACKAGE_SHOTS=DIR keeps the screenshots.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.slow

TEMPLATE_REPO = "https://github.com/beeware/briefcase-linux-system-template.git"
SNAPSHOT_ROOTS = ("/usr", "/etc", "/var", "/opt")
DEMO_CONTAINER = "smollm2-135m-instruct.ferry"


def _cache() -> Path:
    root = os.environ.get("FERRY_PACKAGING_CACHE")
    return Path(root) if root else Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "ferry-packaging"


def _root_prefix() -> list[str] | None:
    if os.geteuid() == 0:
        return []
    if shutil.which("sudo") and subprocess.run(["sudo", "-n", "true"], capture_output=True).returncode == 0:
        return ["sudo", "-n"]
    return None


def _briefcase_version() -> str:
    out = subprocess.run([sys.executable, str(REPO / "packaging" / "briefcase_config.py"), "--packaging-requirements"],
                         capture_output=True, text=True, check=True).stdout
    return next(r.split("==")[1] for r in out.split() if r.startswith("briefcase=="))


def _template_problem() -> str | None:
    env = os.environ.get("FERRY_BRIEFCASE_TEMPLATE")
    if env:
        return None if (Path(env) / "cookiecutter.json").is_file() else f"FERRY_BRIEFCASE_TEMPLATE={env} is not a template"
    if (_cache() / "briefcase-linux-system-template" / "cookiecutter.json").is_file():
        return None
    branch = f"v{_briefcase_version()}"
    try:
        ok = subprocess.run(["git", "ls-remote", "--exit-code", TEMPLATE_REPO, branch], capture_output=True,
                            timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        ok = False
    return None if ok else (f"no Briefcase template: GitHub is unreachable; set FERRY_BRIEFCASE_TEMPLATE to a checkout of "
                            f"{TEMPLATE_REPO} at branch {branch}")


def _snapshot() -> set[str]:
    seen = set()
    for top in SNAPSHOT_ROOTS:
        for dirpath, dirnames, filenames in os.walk(top):
            seen.update(os.path.join(dirpath, n) for n in dirnames + filenames)
    return seen


@pytest.fixture(scope="module")
def deb() -> Path:
    if not sys.platform.startswith("linux"):
        pytest.skip("a Debian package is built on Linux only")
    for tool in ("dpkg", "dpkg-deb", "xvfb-run", "Xvfb", "unshare", "setpriv"):
        if not shutil.which(tool):
            pytest.skip(f"{tool} is not installed")
    if not Path("/usr/bin/python3").exists():
        pytest.skip("no system Python (/usr/bin/python3): Briefcase's system package is built with it")
    if _root_prefix() is None:
        pytest.skip("installing a .deb needs root or passwordless sudo")
    if subprocess.run(["dpkg-query", "-W", "ferry"], capture_output=True).returncode == 0:
        pytest.skip("a package named ferry is already installed here; not replacing it")
    problem = _template_problem()
    if problem:
        pytest.skip(problem)
    t0 = time.monotonic()
    res = subprocess.run(["bash", str(REPO / "packaging" / "build_linux.sh")], capture_output=True, text=True,
                         timeout=2400)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    path = Path(res.stdout.strip().splitlines()[-1])
    assert path.is_file() and path.suffix == ".deb", res.stdout[-2000:]
    print(f"build_linux.sh: {time.monotonic() - t0:.0f} s")
    return path


def _control(deb: Path, field: str) -> str:
    return subprocess.run(["dpkg-deb", "-f", str(deb), field], capture_output=True, text=True, check=True).stdout.strip()


def test_install_start_offline_answer_and_uninstall(deb):
    sudo = _root_prefix()
    # The user's home and the screenshots: in a folder the unprivileged user can reach
    # (pytest's tmp_path is under a 0700 folder of root's).
    base = Path(tempfile.mkdtemp(prefix="ferry-package-"))
    base.chmod(0o755)
    assert _control(deb, "Package") == "ferry"
    names = subprocess.run(["dpkg-deb", "-c", str(deb)], capture_output=True, text=True, check=True).stdout
    assert "./usr/lib/ferry/app/ferry/resources/SmolLM2-135M-Instruct.Q4_1.gguf" in names   # offline from the start
    assert "./usr/lib/ferry/app_packages/app/engine/_ferry_c" in names                      # the compiled core
    assert "/app_packages/pip/" not in names                                               # nothing to install with

    before = _snapshot()
    t0 = time.monotonic()
    res = subprocess.run([*sudo, "dpkg", "-i", str(deb)], capture_output=True, text=True, timeout=600)
    installed_files: list[str] = []
    try:
        assert res.returncode == 0, f"dpkg -i failed (a missing dependency?):\n{res.stdout[-2000:]}{res.stderr[-2000:]}"
        installed_files = subprocess.run(["dpkg", "-L", "ferry"], capture_output=True, text=True,
                                         check=True).stdout.split()
        t_install = time.monotonic() - t0

        # An unprivileged user (nobody, or this user under sudo) with an empty home, no network.
        uid, gid = (65534, 65534) if os.geteuid() == 0 else (os.getuid(), os.getgid())
        home, shots = base / "home", base / "shots"
        for d in (home, shots):
            d.mkdir()
            if os.geteuid() == 0:
                os.chown(d, uid, gid)
        cmd = [*sudo, "unshare", "-n", "setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups",
               "env", "-i", f"HOME={home}", "PATH=/usr/bin:/bin", "LANG=C.UTF-8",
               "xvfb-run", "-a", "-s", "-screen 0 1280x800x24 -nolisten tcp",
               "/usr/bin/ferry", "--screenshot", str(shots)]
        t1 = time.monotonic()
        run = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd="/")
        t_run = time.monotonic() - t1
        if os.environ.get("FERRY_PACKAGE_SHOTS"):
            shutil.copytree(shots, os.environ["FERRY_PACKAGE_SHOTS"], dirs_exist_ok=True)
        assert run.returncode == 0, f"the installed app failed:\n{run.stdout[-3000:]}{run.stderr[-3000:]}"
        for shot in ("01-welcome", "02-empty-chat", "04-finished", "08-wizard-source", "12-wizard-finish"):
            png = shots / f"{shot}.png"
            assert png.is_file() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", shot
        # The demo came from the package, converted into the user's data folder (platformdirs),
        data = home / ".local" / "share" / "Ferry"
        assert (data / "models" / DEMO_CONTAINER / "manifest.json").is_file()
        # and nothing was written anywhere else in the home.
        written = [p for p in home.rglob("*") if p.is_file()]
        outside = [str(p) for p in written if not (p.is_relative_to(data) or p.is_relative_to(home / ".config" / "Ferry"))]
        assert not outside, f"written outside Ferry's data and config folders: {outside}"
    finally:
        t2 = time.monotonic()
        purge = subprocess.run([*sudo, "dpkg", "--purge", "ferry"], capture_output=True, text=True, timeout=600)
        t_purge = time.monotonic() - t2
        shutil.rmtree(base, ignore_errors=True)
    assert purge.returncode == 0, purge.stdout[-2000:] + purge.stderr[-2000:]
    assert subprocess.run(["dpkg-query", "-W", "ferry"], capture_output=True).returncode != 0
    # Nothing of the package is left: none of its files, no new path naming it.
    # (Compared by name over /usr, /etc, /var, /opt; other new paths are other
    # processes' on a shared machine.)
    after = _snapshot()
    under = tuple(f"{top}/" for top in SNAPSHOT_ROOTS)
    left = sorted({p for p in installed_files if p.startswith(under) and os.path.lexists(p) and p not in before}
                  | {p for p in after - before if "ferry" in p.lower()})
    assert not left, f"left behind after dpkg --purge: {left[:20]}"
    print(f"dpkg -i {t_install:.0f} s, first run {t_run:.0f} s, dpkg --purge {t_purge:.0f} s")
