"""The settings switch serves the window's loaded model on loopback."""
from __future__ import annotations

import dataclasses
import socket

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_settings_switch_serves_the_loaded_model(qtbot, make_window, demo_container):
    w = make_window(demo_container)
    port = free_port()
    new = dataclasses.replace(w.settings, serve_local=True, serve_port=port)
    with qtbot.waitSignal(w.worker.worker.serving, timeout=30000) as sig:
        w.apply_settings(new)
    url, error = sig.args
    assert error == "" and url.startswith("http://127.0.0.1:")
    models = httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=10).json()
    assert models["data"] and models["data"][0]["id"]
    with qtbot.waitSignal(w.worker.worker.serving, timeout=30000) as sig:
        w.apply_settings(dataclasses.replace(new, serve_local=False))
    assert sig.args[0] == ""
