"""Faults seen from the window: a disk error mid-answer ends that answer and
keeps the app, the conversation and the history; killing the app mid-answer
loses nothing that was already shown."""
from __future__ import annotations

import ast
import json
import os
import shutil
import signal
import subprocess
import sys
import time

from app.engine.binding import container_plan
from app.store.crypto import KeychainKeys
from app.store.history import HistoryStore
from tests.conftest import REPO
from tests.ui.conftest import on_gui
from tests.ui.test_chat_window import send


def test_disk_error_mid_answer_keeps_the_chat(qtbot, make_window, tiny_moe, tmp_path):
    container = tmp_path / "moe.ferry"
    # A cold copy (no hot list an earlier test saved) and a cache that holds
    # half of the experts, so the answer must keep reading layer 2's bank.
    shutil.copytree(tiny_moe[1], container, ignore=shutil.ignore_patterns("usage.u32*", "usage.state"))
    bank = container / "experts" / "layer_002.bin"
    whole = bank.read_bytes()
    plan = container_plan(container, 2048)  # the window's context (quick_settings)
    w = make_window(container, max_tokens=40, ram_budget=plan.floor_bytes + plan.expert_bytes // 2)
    errors: list[str] = []
    on_gui(w.worker.worker.error, errors.append)
    # The first tokens stream, then the disk loses the bank's tail.
    cut = []

    def first_token(_text):
        if not cut:
            cut.append(1)
            with open(bank, "r+b") as f:
                f.truncate(4096 + 100)

    # Connected directly, so it runs on the engine's thread at the first token's
    # flush, before the next token is computed (a queued slot could run after a
    # fast answer had already ended).
    from PySide6.QtCore import Qt

    w.worker.worker.response_text.connect(first_token, Qt.ConnectionType.DirectConnection)
    reason = send(qtbot, w, "w5 w6 w7 w8")
    assert reason == "error"
    assert errors and "layer_002.bin" in errors[-1]
    assert "Error" in w.statusBar().currentMessage()
    shown = w.chat.visible()
    assert [m.role for m in shown] == ["user", "assistant"]
    stored = w.store.messages(w.chat.id)
    assert stored[0].content == "w5 w6 w7 w8" and stored[-1].content == shown[-1].content
    # The disk comes back: the same window answers the next question.
    bank.write_bytes(whole)
    assert send(qtbot, w, "w9 w10") in ("stop", "length")
    assert [m.role for m in w.chat.visible()] == ["user", "assistant", "user", "assistant"]


def test_killing_the_app_mid_answer_loses_nothing_shown(demo_container, tmp_path):
    """The real app, killed with SIGKILL while it streams; restarted, the
    history holds the question and what had been shown of the answer."""
    home = tmp_path / "home"
    env = {**os.environ, "FERRY_HOME": str(home), "QT_QPA_PLATFORM": "offscreen"}
    driver = tmp_path / "drive.py"
    driver.write_text(f'''
import os, sys, time
os.environ["QT_QPA_PLATFORM"] = "offscreen"
import keyring
from keyring.backend import KeyringBackend
class FileKeyring(KeyringBackend):
    priority = 1
    path = {str(tmp_path / "keys.json")!r}
    def _load(self):
        import json
        return json.load(open(self.path)) if os.path.exists(self.path) else {{}}
    def get_password(self, s, u):
        return self._load().get(s + "/" + u)
    def set_password(self, s, u, p):
        import json
        d = self._load(); d[s + "/" + u] = p; json.dump(d, open(self.path, "w"))
    def delete_password(self, s, u):
        pass
keyring.set_keyring(FileKeyring())
from PySide6.QtWidgets import QApplication
from app.engine.binding import container_plan
from app.store.crypto import KeychainKeys
from app.store.history import HistoryStore
from app.store.settings import Settings
from app.ui.main_window import MainWindow
app = QApplication([])
store = HistoryStore({str(tmp_path / "history.sqlite3")!r}, KeychainKeys())
w = MainWindow(store, Settings(temperature=0.0, max_tokens=400, context_length=2048), persist_settings=False)
w.show()
shown = []
def on_text(t):
    shown.append(t)
    if sum(len(x) for x in shown) > 40:
        print("SHOWN", repr("".join(shown)), flush=True)
w.worker.worker.response_text.connect(on_text)
w.model_loaded.connect(lambda _i: w.send_text("Write a long story about a lighthouse keeper."))
w.load_model({str(demo_container)!r})
app.exec()
''')
    proc = subprocess.Popen([sys.executable, str(driver)], cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    shown = None
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if line.startswith("SHOWN"):
            shown = ast.literal_eval(line.split(" ", 1)[1])
            time.sleep(0.6)                         # the window saves at least every 0.5 s
            break
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert shown, "the app never showed an answer"
    # Restart: open the same history with the same key.
    import keyring

    keys = json.loads((tmp_path / "keys.json").read_text())
    from keyring.backend import KeyringBackend

    class Saved(KeyringBackend):
        priority = 1

        def get_password(self, s, u):
            return keys.get(s + "/" + u)

        def set_password(self, s, u, p):
            keys[s + "/" + u] = p

        def delete_password(self, s, u):
            pass

    before = keyring.get_keyring()
    keyring.set_keyring(Saved())
    try:
        store = HistoryStore(tmp_path / "history.sqlite3", KeychainKeys())
        conv = store.conversations()[0]
        messages = store.messages(conv.id)
        store.close()
    finally:
        keyring.set_keyring(before)
    assert messages[0].content == "Write a long story about a lighthouse keeper."
    assert messages[-1].role == "assistant"
    kept = messages[-1].content
    # Everything shown up to half a second before the kill was saved.
    assert len(kept) >= 20 and shown.startswith(kept[:20])
