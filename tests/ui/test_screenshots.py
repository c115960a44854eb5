"""`python -m app --screenshot DIR` under a real X server, and the message
given when there is no display at all."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from PySide6.QtGui import QImage

REPO = Path(__file__).resolve().parents[2]
STATES = ["01-welcome", "02-empty-chat", "03-streaming", "04-finished", "04a-token-probabilities", "05-gauges",
          "06-settings", "06d-settings-answers", "06a-library", "06b-switcher", "06c-prompt-progress",
          "06e-attach", "06f-documents-answer", "06g-documents-page"]


def _free_display() -> int:
    for n in range(90, 200):
        if not Path(f"/tmp/.X11-unix/X{n}").exists() and not Path(f"/tmp/.X{n}-lock").exists():
            return n
    raise RuntimeError("no free X display number")


@pytest.fixture
def xvfb():
    exe = shutil.which("Xvfb")
    if exe is None:
        pytest.skip("Xvfb is not installed (apt-get install xvfb); the real-X screenshot test needs it")
    n = _free_display()
    proc = subprocess.Popen([exe, f":{n}", "-screen", "0", "1600x1000x24", "-nolisten", "tcp"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 10
    while not Path(f"/tmp/.X11-unix/X{n}").exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail("Xvfb did not start")
        time.sleep(0.05)
    yield f":{n}"
    proc.terminate()
    proc.wait(10)


def _colours(img: QImage, step: int = 3) -> int:
    seen = set()
    for y in range(0, img.height(), step):
        for x in range(0, img.width(), step):
            seen.add(img.pixel(x, y))
    return len(seen)


@pytest.mark.slow
def test_screenshots_under_xvfb(xvfb, demo_container, tmp_path):
    out = tmp_path / "shots"
    env = {k: v for k, v in os.environ.items() if k != "QT_QPA_PLATFORM"}
    env.update(DISPLAY=xvfb, QT_QPA_PLATFORM="xcb", FERRY_HOME=str(tmp_path / "home"))
    res = subprocess.run([sys.executable, "-m", "app", "--screenshot", str(out), "--model", str(demo_container),
                          "--size", "1200x780"], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    for name in STATES:
        p = out / f"{name}.png"
        assert p.exists(), f"{name}.png missing; stderr:\n{res.stderr[-2000:]}"
        img = QImage(str(p))
        assert not img.isNull()
        if name in ("05-gauges", "06-settings", "06d-settings-answers", "06a-library", "06e-attach",
                    "06g-documents-page"):
            assert img.width() > 250 and img.height() > 300
        elif name == "06b-switcher":          # the Model menu: library, the models, convert
            assert img.width() > 100 and img.height() > 60
        else:
            assert (img.width(), img.height()) == (1200, 780), name
        assert _colours(img) > 40, f"{name} looks blank"
    # the user's data was not touched: the screenshot run uses a throw-away history
    assert not (tmp_path / "home" / "history.sqlite3").exists() and not (tmp_path / "home" / "ferry.db").exists()


def test_no_display_gives_a_clear_message(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("QT_QPA_PLATFORM", "DISPLAY", "WAYLAND_DISPLAY")}
    res = subprocess.run([sys.executable, "-m", "app"], cwd=REPO, env=env, capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 2
    assert "QT_QPA_PLATFORM=offscreen" in res.stderr and "desktop session" in res.stderr
