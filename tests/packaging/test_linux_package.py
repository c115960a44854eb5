"""The Linux package, built by Briefcase and started as a user would (issue 37).

packaging/build_linux.sh builds the .deb (or reuses the one built from the same
sources: its cache is keyed on their hash, so a session builds it once); the
test installs it with dpkg and starts the installed launcher /usr/bin/ferry the
way a user's desktop does -- no option -- as an unprivileged user with an empty
home, on a bare X display (Xvfb, no window manager), in a network namespace
with no network at all (`unshare -n`). It is driven by real input (xdotool:
XTEST key presses, typing and clicks, the same events a keyboard and mouse
make): the passphrase for the history (an empty home has no keychain), the
conversion wizard that opens by itself on a first run (Next, the built-in demo
model chosen with the arrow keys, the destination and memory pages as they
come, the conversion and its check, *Open a chat*), a question typed into the
chat, and Ctrl+Q. A screenshot is taken at each step. The answer is read back
from the encrypted history with the passphrase the test typed: it comes from
the demo model the package carries, converted into the user's data folder.
Then it purges the package and checks that nothing of it is left, and that
everything the app wrote is in the user's data and config folders.

Needs root (or passwordless sudo), dpkg, Xvfb and xdotool (installed with
apt-get when missing and root), unshare/setpriv, the system Python with venv
and headers, the package registry or a warm pip cache, and Briefcase's app
template: FERRY_BRIEFCASE_TEMPLATE, the default copy under the packaging cache,
or GitHub (which CI machines cannot reach: the test then skips, saying so).
FERRY_PACKAGE_SHOTS=DIR keeps the screenshots.
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

from app.store.crypto import PassphraseKeys
from app.store.history import HistoryStore
from tests.conftest import REPO
from tests.packaging.xsession import XSession, missing_tools

pytestmark = pytest.mark.slow

TEMPLATE_REPO = "https://github.com/beeware/briefcase-linux-system-template.git"
SNAPSHOT_ROOTS = ("/usr", "/etc", "/var", "/opt")
DEMO_CONTAINER = "smollm2-135m-instruct.ferry"
PASSPHRASE = "a first run of Ferry, offline"        # what the user types (strong enough for a new history)
QUESTION = "What is the capital of France? Answer in one sentence."
QUESTION_AGAIN = "What is the capital of Italy? Answer in one sentence."


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


def _install_x_tools() -> str | None:
    """Xvfb and xdotool, installed the one way the project installs the tests'
    system packages (scripts/common.sh, as scripts/test.sh does) when missing:
    None when they are there, else why not."""
    if not missing_tools():
        return None
    if os.geteuid() == 0 and shutil.which("apt-get"):
        subprocess.run(["bash", "-c", f'source "{REPO}/scripts/common.sh" && ensure_system_packages'],
                       capture_output=True, timeout=900, stdin=subprocess.DEVNULL)
    still = missing_tools()
    return (f"{' and '.join(still)} missing (Debian: apt-get install xvfb xdotool, as scripts/test.sh does as "
            "root): the app is driven by real X input") if still else None


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
    for tool in ("dpkg", "dpkg-deb", "unshare", "setpriv"):
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
    problem = _install_x_tools()
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


def _first_run(x: XSession, app: subprocess.Popen, data: Path) -> None:
    """What a new user does on the first start, by keyboard and mouse."""
    alive = lambda: app.poll() is None   # noqa: E731

    # No keychain in an empty home: the history asks for a passphrase, twice.
    dialog = x.wait_window("Protect your history", 120, alive=alive)
    x.focus(dialog)
    x.type(PASSPHRASE)
    x.key("Tab")
    x.type(PASSPHRASE)
    x.shot("01-passphrase")
    x.key("Return")                                                  # OK
    x.wait_gone("Protect your history", 60)

    # No model yet: the conversion wizard opens by itself over the window.
    wizard = x.wait_window("Convert a model", 120, alive=alive)
    x.focus(wizard)
    x.shot("02-wizard-welcome")
    x.changes(wizard, "alt+n")                                       # Next >
    x.shot("03-wizard-source")
    # The first choice (a checkpoint folder) has the focus; the demo is the fourth.
    x.changes(wizard, "Down", "Down", "Down")
    x.shot("04-wizard-demo", quiet=3)       # "Everything needed is there", read from the package's GGUF
    x.changes(wizard, "alt+n", retry=True)  # Next is enabled once the demo is checked
    x.shot("05-wizard-destination", quiet=3)
    x.changes(wizard, "alt+n", retry=True)
    x.shot("06-wizard-memory")
    x.changes(wizard, "alt+n", retry=True)  # converts, then reads every record back
    end = time.monotonic() + 300
    while not (data / "models" / DEMO_CONTAINER / "manifest.json").is_file():
        assert alive() and time.monotonic() < end, "the demo model was not converted into the data folder"
        time.sleep(0.5)
    x.shot("07-wizard-ready", quiet=3)
    x.press_until_gone("Convert a model", "Return", 120)           # Open a chat

    _ask_and_quit(x, app, QUESTION, "09-question", "10-answer", ready="08-chat-ready")


def _second_start(x: XSession, app: subprocess.Popen) -> None:
    """The next start: the passphrase once, then straight to the demo model (no wizard)."""
    alive = lambda: app.poll() is None   # noqa: E731
    x.titles_seen.clear()
    dialog = x.wait_window("Unlock your history", 120, alive=alive)
    x.focus(dialog)
    x.type(PASSPHRASE)
    x.key("Return")
    x.wait_gone("Unlock your history", 60)
    _ask_and_quit(x, app, QUESTION_AGAIN, None, "12-second-answer", ready="11-second-start")
    assert "Convert a model" not in x.titles_seen, "the wizard opened again on the second start"


def _ask_and_quit(x: XSession, app: subprocess.Popen, question: str, typed: str | None, answered: str, *,
                  ready: str) -> None:
    """In the chat: once the window is still (the model opened), click into
    the message box, type, Enter sends; then Ctrl+Q."""
    window = x.wait_window("Ferry", 60, alive=lambda: app.poll() is None)
    x.shot(ready, quiet=3)
    wx, wy, ww, wh = x.geometry(window)
    box = (wx + int(ww * 0.22), wy + wh - 128, wx + int(ww * 0.62), wy + wh - 34)   # inside the message box
    x.click(wx + int(ww * 0.4), wy + wh - 60)
    time.sleep(0.5)
    empty = x.grab().crop(box)
    x.type(question)
    x.wait_for(lambda: not x.similar(x.grab().crop(box), empty), 30, "typing into the message box showed nothing")
    if typed:
        x.shot(typed, quiet=1)
    # Enter sends: the text leaves the box. (Pressed again if the model was still opening:
    # then the draft stays, as it does for a user who presses Enter too early.)
    x.until(lambda: x.similar(x.grab().crop(box), empty), "Return", what="the question was not sent")
    x.shot(answered, quiet=5)               # the answer streamed and the gauges are still
    x.focus(window)
    x.key("ctrl+q")
    try:
        app.wait(60)
    except subprocess.TimeoutExpired:
        raise AssertionError("Ctrl+Q did not close Ferry within 60 s") from None


def _answers(data: Path) -> list[tuple[str, str]]:
    """(question, answer) pairs in the history, opened with the passphrase the user typed."""
    store = HistoryStore(data / "ferry.db", PassphraseKeys(PASSPHRASE))
    try:
        pairs = []
        for conv in store.conversations():
            msgs = store.messages(conv.id, images=False)
            pairs += [(q.content, a.content) for q, a in zip(msgs, msgs[1:])
                      if q.role == "user" and a.role == "assistant"]
        return pairs
    finally:
        store.close()


def test_install_start_offline_answer_and_uninstall(deb):
    sudo = _root_prefix()
    assert _control(deb, "Package") == "ferry"
    names = subprocess.run(["dpkg-deb", "-c", str(deb)], capture_output=True, text=True, check=True).stdout
    assert "./usr/lib/ferry/app/ferry/resources/SmolLM2-135M-Instruct.Q4_1.gguf" in names   # offline from the start
    assert "./usr/lib/ferry/app_packages/app/engine/_ferry_c" in names                      # the compiled core
    assert "/app_packages/pip/" not in names                                               # nothing to install with
    # The user's home and the screenshots: in a folder the unprivileged user can reach
    # (pytest's tmp_path is under a 0700 folder of root's); removed in the `finally` below.
    base = Path(tempfile.mkdtemp(prefix="ferry-package-"))
    base.chmod(0o755)

    before = _snapshot()
    t0 = time.monotonic()
    res = subprocess.run([*sudo, "dpkg", "-i", str(deb)], capture_output=True, text=True, timeout=600)
    installed_files: list[str] = []
    x = None
    try:
        assert res.returncode == 0, f"dpkg -i failed (a missing dependency?):\n{res.stdout[-2000:]}{res.stderr[-2000:]}"
        installed_files = subprocess.run(["dpkg", "-L", "ferry"], capture_output=True, text=True,
                                         check=True).stdout.split()
        t_install = time.monotonic() - t0

        # An unprivileged user (nobody, or this user under sudo) with an empty home, no network.
        uid, gid = (65534, 65534) if os.geteuid() == 0 else (os.getuid(), os.getgid())
        home = base / "home"
        home.mkdir()
        if os.geteuid() == 0:
            os.chown(home, uid, gid)
        x = XSession(base / "shots")
        # The X server's socket is a file (/tmp/.X11-unix): reachable from the empty network namespace.
        cmd = [*sudo, "unshare", "-n", "setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups",
               "env", "-i", f"HOME={home}", "PATH=/usr/bin:/bin", "LANG=C.UTF-8", f"DISPLAY={x.display}",
               "/usr/bin/ferry"]
        log = base / "ferry.log"
        data = home / ".local" / "share" / "Ferry"
        times = []
        for start in (lambda x, app: _first_run(x, app, data), _second_start):
            t1 = time.monotonic()
            with open(log, "w") as out:
                app = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd="/")
            try:
                start(x, app)
            except BaseException as exc:
                x.grab().save(x.shots / "failed.png")
                raise AssertionError(f"{exc}\n(FERRY_PACKAGE_SHOTS=DIR keeps the screenshots; the app said:\n"
                                     f"{log.read_text()[-3000:]})") from exc
            finally:
                if app.poll() is None:
                    app.kill()
                    app.wait(30)
                if os.environ.get("FERRY_PACKAGE_SHOTS"):
                    shutil.copytree(x.shots, os.environ["FERRY_PACKAGE_SHOTS"], dirs_exist_ok=True)
            times.append(time.monotonic() - t1)
            assert app.returncode == 0, f"Ferry exited with {app.returncode}:\n{log.read_text()[-3000:]}"
        for png in x.taken:
            assert (x.shots / f"{png}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", png
        # The answer came from the demo model the package carries (greedy for a small model).
        answers = dict(_answers(data))
        assert sorted(answers) == sorted([QUESTION, QUESTION_AGAIN]), answers
        assert "Paris" in answers[QUESTION], f"the demo model's answer: {answers[QUESTION]!r}"
        assert "Rome" in answers[QUESTION_AGAIN], f"the demo model's answer: {answers[QUESTION_AGAIN]!r}"
        # The demo came from the package, converted into the user's data folder (platformdirs),
        assert (data / "models" / DEMO_CONTAINER / "manifest.json").is_file()
        # and nothing was written anywhere else in the home.
        written = [p for p in home.rglob("*") if p.is_file()]
        outside = [str(p) for p in written if not (p.is_relative_to(data) or p.is_relative_to(home / ".config" / "Ferry"))]
        assert not outside, f"written outside Ferry's data and config folders: {outside}"
    finally:
        if x is not None:
            x.close()
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
    print(f"dpkg -i {t_install:.0f} s, first run by keyboard and mouse {times[0]:.0f} s, second start "
          f"{times[1]:.0f} s, dpkg --purge {t_purge:.0f} s")
