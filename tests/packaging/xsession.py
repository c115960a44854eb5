"""A bare X display driven by real input, for the package test (issue 37).

``XSession`` starts its own Xvfb (no window manager, like a kiosk session),
sends real input with ``xdotool`` (XTEST: the server cannot tell it from a
keyboard and a mouse; never XSendEvent, which Qt ignores), finds windows by
their titles, and grabs the screen with Pillow (through the X server's XCB
interface). Nothing here knows Ferry: the test says what to click and type.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

from PIL import Image, ImageChops, ImageGrab

SIZE = (1280, 800)


def missing_tools() -> list[str]:
    return [t for t in ("Xvfb", "xdotool") if not shutil.which(t)]


class XSession:
    def __init__(self, shots: Path):
        self.shots = shots
        self.shots.mkdir(parents=True, exist_ok=True)
        r, w = os.pipe()
        # -displayfd: the server picks a free display and writes its number.
        self.server = subprocess.Popen(["Xvfb", "-displayfd", str(w), "-screen", "0", f"{SIZE[0]}x{SIZE[1]}x24",
                                        "-nolisten", "tcp"], pass_fds=(w,), stdout=subprocess.DEVNULL,
                                       stderr=subprocess.DEVNULL)
        os.close(w)
        with os.fdopen(r) as f:
            number = f.readline().strip()
        if not number:
            self.server.kill()
            raise RuntimeError("Xvfb did not start")
        self.display = f":{number}"
        self.env = dict(os.environ, DISPLAY=self.display)
        self.taken: list[str] = []
        self.titles_seen: set[str] = set()

    def close(self) -> None:
        self.server.terminate()
        try:
            self.server.wait(10)
        except subprocess.TimeoutExpired:
            self.server.kill()

    # ------------------------------------------------------------ input

    def xdotool(self, *args: str) -> str:
        res = subprocess.run(["xdotool", *args], capture_output=True, text=True, env=self.env, timeout=60)
        if res.returncode != 0 and args[0] != "search":
            raise RuntimeError(f"xdotool {' '.join(args)}: {res.stderr.strip()}")
        return res.stdout.strip()

    def click(self, x: int, y: int) -> None:
        self.xdotool("mousemove", "--sync", str(x), str(y))
        time.sleep(0.2)
        self.xdotool("click", "1")

    def key(self, *keys: str) -> None:
        for k in keys:
            self.xdotool("key", "--delay", "80", k)
            time.sleep(0.15)

    def type(self, text: str) -> None:
        self.xdotool("type", "--delay", "40", text)

    # ------------------------------------------------------------ windows

    def window(self, title: str) -> str | None:
        """The visible top-level window with exactly this title, or None."""
        ids = self.xdotool("search", "--onlyvisible", "--name", f"^{title}$").split()
        return ids[-1] if ids else None

    def visible_titles(self) -> set[str]:
        ids = self.xdotool("search", "--onlyvisible", "--name", ".").split()
        return {self.xdotool("getwindowname", i) for i in ids}

    def wait_window(self, title: str, timeout: float, alive=None) -> str:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            wid = self.window(title)
            if wid:
                return wid
            if alive is not None and not alive():
                raise AssertionError(f"the app exited before showing “{title}”")
            time.sleep(0.3)
        raise AssertionError(f"no window “{title}” after {timeout:.0f} s")

    def wait_gone(self, title: str, timeout: float) -> None:
        end = time.monotonic() + timeout
        while self.window(title) and time.monotonic() < end:
            time.sleep(0.3)
        assert not self.window(title), f"“{title}” is still open after {timeout:.0f} s"

    def press_until_gone(self, title: str, key: str, timeout: float) -> None:
        """Press ``key`` until the window closes (its default button may be
        enabled only once a check in the background is done)."""
        end = time.monotonic() + timeout
        while self.window(title):
            assert time.monotonic() < end, f"“{title}” is still open after {timeout:.0f} s of pressing {key}"
            self.key(key)
            stop = time.monotonic() + 5
            while self.window(title) and time.monotonic() < stop:
                time.sleep(0.25)

    def geometry(self, wid: str) -> tuple[int, int, int, int]:
        """x, y, width, height of a window on the screen."""
        vals = dict(line.split("=", 1) for line in self.xdotool("getwindowgeometry", "--shell", wid).split())
        return int(vals["X"]), int(vals["Y"]), int(vals["WIDTH"]), int(vals["HEIGHT"])

    def focus(self, wid: str) -> None:
        """Give a window the keyboard as a window manager would (no WM here):
        the pointer over it and the X input focus on it."""
        x, y, w, h = self.geometry(wid)
        self.xdotool("mousemove", "--sync", str(x + w // 2), str(y + 2))
        self.xdotool("windowfocus", "--sync", wid)

    # ------------------------------------------------------------ the screen

    def grab(self, wid: str | None = None) -> Image.Image:
        """The screen, or one window's part of it."""
        if wid is None:
            return ImageGrab.grab(xdisplay=self.display)
        x, y, w, h = self.geometry(wid)
        return ImageGrab.grab(bbox=(x, y, x + w, y + h), xdisplay=self.display)

    def changes(self, wid: str, *keys: str, retry: bool = False, timeout: float = 120) -> None:
        """Press ``keys`` and wait until the window shows something else (the
        next page). ``retry``: press them again while nothing changes, for a
        button that is enabled only once a check in the background is done."""
        before = self.grab(wid)
        end = time.monotonic() + timeout
        while True:
            self.key(*keys)
            pressed = time.monotonic()
            while time.monotonic() < min(end, pressed + (5 if retry else timeout)):
                time.sleep(0.25)
                if not self.similar(self.grab(wid), before):
                    return
            if not retry or time.monotonic() >= end:
                raise AssertionError(f"pressing {' '.join(keys)} changed nothing in {timeout:.0f} s")

    def settle(self, quiet: float = 1.5, timeout: float = 60) -> Image.Image:
        """Wait until the screen has not changed for ``quiet`` seconds (a text
        cursor's blinking aside: its few pixels are ignored)."""
        end = time.monotonic() + timeout
        last, since = self.grab(), time.monotonic()
        while time.monotonic() < end:
            time.sleep(0.25)
            now = self.grab()
            if self.similar(now, last):
                if time.monotonic() - since >= quiet:
                    return now
            else:
                last, since = now, time.monotonic()
        return self.grab()

    def shot(self, name: str, quiet: float = 1.5) -> Path:
        """Wait for the screen to be still, save it, and note the windows then open."""
        path = self.shots / f"{name}.png"
        self.settle(quiet).save(path)
        self.taken.append(name)
        self.titles_seen |= self.visible_titles()
        return path

    @staticmethod
    def similar(a: Image.Image, b: Image.Image) -> bool:
        """The same picture, but for a blinking text cursor's few pixels."""
        box = ImageChops.difference(a, b).getbbox()
        return box is None or (box[2] - box[0]) * (box[3] - box[1]) <= 4 * 24

    def wait_for(self, done, timeout: float, what: str) -> None:
        end = time.monotonic() + timeout
        while not done():
            assert time.monotonic() < end, f"{what} (after {timeout:.0f} s)"
            time.sleep(0.25)

    def until(self, done, key: str, *, what: str, timeout: float = 120) -> None:
        """Press ``key``, and again every few seconds, until ``done()``."""
        end = time.monotonic() + timeout
        while True:
            self.key(key)
            stop = time.monotonic() + 4
            while time.monotonic() < stop:
                time.sleep(0.25)
                if done():
                    return
            assert time.monotonic() < end, f"{what} (pressed {key} for {timeout:.0f} s)"
