"""The settings switch serves the window's loaded model on loopback, with the key kept in the
keychain; the gauges count the requests of other clients."""
from __future__ import annotations

import contextlib
import dataclasses
import socket

import httpx
import pytest


@contextlib.contextmanager
def held_model(container, monkeypatch):
    """Another Ferry process holding ``container`` (tests/engine/test_registry.py's holder), with
    sharing on; yields (process, its registry record), and closes the model at the end if the
    test has not."""
    from tests.engine.test_registry import _holder, _wait_serving

    monkeypatch.setenv("FERRY_SHARE", "1")
    holder = _holder(container)
    try:
        yield holder, _wait_serving(container, holder)
    finally:
        if holder.poll() is None:
            holder.stdin.close()
            holder.wait(timeout=60)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_settings_switch_serves_the_loaded_model(qtbot, make_window, demo_container, memory_keyring):
    from app.store.settings import KEYCHAIN_SERVICE, SERVED_KEY_USER

    w = make_window(demo_container)
    port = free_port()
    new = dataclasses.replace(w.settings, serve_local=True, serve_port=port)
    with qtbot.waitSignal(w.worker.worker.serving, timeout=30000) as sig:
        w.apply_settings(new)
    url, error = sig.args
    assert error == "" and url.startswith("http://127.0.0.1:")
    key = memory_keyring.items[(KEYCHAIN_SERVICE, SERVED_KEY_USER)]     # made on first use, kept there
    assert httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=10).status_code == 401
    auth = {"Authorization": f"Bearer {key}"}
    models = httpx.get(f"http://127.0.0.1:{port}/v1/models", headers=auth, timeout=10).json()
    assert models["data"] and models["data"][0]["id"]
    assert not w.gauges.clients.isVisible() or not w.gauges.clients.text()
    r = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", headers=auth, timeout=60,
                   json={"model": models["data"][0]["id"], "max_tokens": 3,
                         "messages": [{"role": "user", "content": "Hi"}]})
    assert r.status_code == 200
    qtbot.waitUntil(lambda: w.gauges.clients.text() == "Other clients: 1 answer", timeout=5000)
    with qtbot.waitSignal(w.worker.worker.serving, timeout=30000) as sig:
        w.apply_settings(dataclasses.replace(new, serve_local=False))
    assert sig.args[0] == ""


@pytest.mark.slow
def test_a_second_window_uses_the_engine_another_ferry_process_holds(qtbot, make_window, demo_container,
                                                                     monkeypatch):
    """One engine per model per machine (app/engine/registry.py): a window asked for a model another
    Ferry process holds attaches to that process's engine, and says so."""
    from tests.server.conftest import engine_answer

    with held_model(demo_container, monkeypatch) as (holder, owner):
        w = make_window(demo_container, max_tokens=6)
        info = w.models.info
        assert info.remote and info.url == owner.url
        assert info.note == f"using the model already open in Ferry (pid {holder.pid}, the Ferry window)"
        assert w.statusBar().currentMessage().startswith("Using the model already open in Ferry")
        with qtbot.waitSignal(w.answer_finished, timeout=120000) as blocker:
            w.send_text("Name a colour.")
        assert blocker.args[0] in ("stop", "length")
        first = w.chat.visible()[-1].content
        assert first == engine_answer(demo_container, [{"role": "user", "content": "Name a colour."}], 6)
        holder.stdin.close()       # the holder closes the model: the window opens it itself for its next turn
        holder.wait(timeout=60)
        with qtbot.waitSignal(w.answer_finished, timeout=120000) as blocker:
            w.send_text("Name a colour.")
        assert blocker.args[0] in ("stop", "length")
        assert not w.models.info.remote and w.chat.visible()[-1].content


@pytest.mark.slow
def test_a_window_whose_holder_closes_as_it_asks_still_answers(qtbot, make_window, demo_container, monkeypatch):
    """The race of a window that checked its holder just before that process closed the model: the
    question goes out to a server that has stopped, and is answered by the model the window opens
    itself (``AttachedStream``), with no error shown."""
    from tests.server.conftest import engine_answer

    with held_model(demo_container, monkeypatch) as (holder, _):
        w = make_window(demo_container, max_tokens=6)
        assert w.models.info.remote
        holder.stdin.close()       # the holder closes the model and ends ...
        holder.wait(timeout=60)
        worker = w.worker.worker   # ... after the window's last look at it (the check before a turn)
        monkeypatch.setattr(worker, "_holder_left", lambda: False)
        errors = []
        worker.error.connect(errors.append)
        with qtbot.waitSignal(w.answer_finished, timeout=120000) as blocker:
            w.send_text("Name a colour.")
        assert blocker.args[0] in ("stop", "length") and errors == []
        assert not w.models.info.remote
        assert w.chat.visible()[-1].content == engine_answer(demo_container,
                                                             [{"role": "user", "content": "Name a colour."}], 6)


@pytest.mark.slow
def test_ferry_run_uses_the_windows_engine_and_the_gauges_count_it(qtbot, make_window, demo_container, monkeypatch):
    """The window holds the model it opened (app/engine/registry.py): `ferry run` on the same
    container answers through the window's engine, and the window's gauges count that request."""
    import json
    import subprocess
    import sys

    from tests.conftest import REPO
    from tests.server.conftest import engine_answer

    monkeypatch.setenv("FERRY_SHARE", "1")
    w = make_window(demo_container)
    qtbot.waitUntil(lambda: w.worker.worker.clients() is not None, timeout=10000)
    res = subprocess.run([sys.executable, "-m", "app.cli", "run", str(demo_container), "-n", "6", "--json",
                          "Name a colour."], capture_output=True, text=True, timeout=300, cwd=REPO)
    assert res.returncode == 0, res.stderr
    assert "using the model already open in Ferry" in res.stderr and "the Ferry window" in res.stderr
    assert json.loads(res.stdout)["text"] == engine_answer(demo_container,
                                                           [{"role": "user", "content": "Name a colour."}], 6)
    qtbot.waitUntil(lambda: w.gauges.clients.text() == "Other clients: 1 answer", timeout=5000)


def test_the_windows_own_answers_are_not_counted_as_another_clients():
    """The gauges' "Other clients" line leaves out the window's own requests (its controller asks as
    WINDOW_CLIENT); before, its own answer showed as "Other clients: 0 answers · answering one now"."""
    from app.controller.chat_controller import WINDOW_CLIENT
    from app.ui.gauges import clients_summary

    own = {"answered": {WINDOW_CLIENT: 3}, "waiting": {}, "running": WINDOW_CLIENT}
    assert clients_summary(own) == ""
    other = {"answered": {WINDOW_CLIENT: 3, "127.0.0.1:5123": 2}, "waiting": {"k": 1}, "running": "k"}
    assert clients_summary(other) == "Other clients: 2 answers · answering one now · 1 waiting"
