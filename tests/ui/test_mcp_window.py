"""MCP tools in the window (pytest-qt): Settings → Tools adds a server; the
window connects to it (the file-reading MCP server of tests/tools, over
stdio, confined to one folder); the model (Hermes-style and Llama 3.1
templates on the demo model, and the tiny Kimi K3 with its own tool-call
format; the sampler scripted by tests/scripted.py so it calls the tools) sees
the tools; each call waits at the approval bar unless the tool is trusted,
runs, is shown under the answer (name, arguments, result; collapsible) and
its result goes back into the prompt, until the model answers."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from app.tools.mcp import DECLINED
from app.ui.worker import on_gui
from tests.scripted import script_ids, scripted_sampler
from tests.server.conftest import tiny_k3, tool_templates  # noqa: F401 - the models with tool formats
from tests.tools.test_mcp import K3_ANSWER, K3_MARKERS, _k3

SERVER = Path(__file__).resolve().parents[1] / "tools" / "file_server.py"
LONG = 120_000


def _call(name, args):
    return f'<tool_call>\n{json.dumps({"name": name, "arguments": args})}\n</tool_call>'


def test_settings_tools_page_adds_and_removes_servers(qtbot, make_window):
    w = make_window(None, trusted_tools=["read_file (files)"])
    d = w.open_settings()
    page = d.tools_page
    d.pages.setCurrentWidget(page)
    page.entry.setText("http://example.com/mcp")
    page.add_btn.click()
    assert page.server_list() == [] and "plain http to another computer" in page.problem.text()
    for text in ("python server.py ~/notes", "http://127.0.0.1:3000/mcp"):
        page.entry.setText(text)
        page.add_btn.click()
    assert page.server_list() == ["python server.py ~/notes", "http://127.0.0.1:3000/mcp"] and not page.problem.text()
    page.servers.setCurrentRow(0)
    page.remove_btn.click()
    page.trusted.setCurrentRow(0)
    page.forget_btn.click()
    s = d.result_settings()
    assert s.mcp_servers == ["http://127.0.0.1:3000/mcp"] and s.trusted_tools == []
    d.reject()


@pytest.mark.slow
def test_the_window_runs_mcp_tools_with_approval(qtbot, make_window, tool_templates, tmp_path, monkeypatch):  # noqa: F811
    share = tmp_path / "share"
    share.mkdir()
    (share / "note.txt").write_text("The boathouse key hangs in the shed.\n")
    (tmp_path / "secret.txt").write_text("not for the model\n")
    command = f"{sys.executable} {SERVER} {share}"
    w = make_window(tool_templates["hermes"], mcp_servers=[command], max_tokens=200)
    qtbot.waitUntil(lambda: w.controller.tools.hub is not None, timeout=LONG)
    assert w.controller.tools.problems == [] and "read_file" in [t.name for t in w.controller.tools.hub.tools]
    model = w.worker.worker.model
    script = scripted_sampler(monkeypatch, min(model.tokenizer.eos_ids))
    script.queue = [script_ids(model, t, ()) for t in (
        "Let me look. " + _call("read_file", {"path": "note.txt"}), _call("read_file", {"path": "../secret.txt"}),
        "The key hangs in the shed.")]
    done = []
    on_gui(w.worker.worker.turn_done, done.append, w)

    w.send_text("Where is the key?")
    approval = w.tool_approval
    qtbot.waitUntil(approval.isVisible, timeout=LONG)   # the first call waits for the user
    assert "read_file" in approval.label.text() and '"path": "note.txt"' in approval.label.text()
    assert w.busy and len(done) == 1 and done[0].reason == "tool_calls"
    view = w.chat_view.widgets[-1].calls   # shown while it waits
    assert [r.header.text() for r in view.rows] == ["Tool read_file — waiting for your approval"]
    with qtbot.waitSignal(w.answer_finished, timeout=LONG):
        approval.always_btn.click()   # trusted from now on: the second call runs without asking
    assert not approval.isVisible() and len(done) == 3
    shown = w.chat.visible()[-1]
    assert shown.content == "Let me look.\n\nThe key hangs in the shed."
    calls = shown.stats["tool_calls"]
    assert [(c["name"], c["status"], c["is_error"]) for c in calls] == [("read_file", "done", False),
                                                                         ("read_file", "done", True)]
    assert calls[0]["result"] == "The boathouse key hangs in the shed.\n"
    assert "outside the shared folder" in calls[1]["result"] and calls[1]["trusted"]
    assert w.settings.trusted_tools == [w.controller.tools.trust_key("read_file")]
    prompt = model.tokenizer.decode(done[-1].prompt_ids)   # both results went back to the model
    assert "The boathouse key hangs in the shed." in prompt and "outside the shared folder" in prompt
    assert "not for the model" not in prompt and "list_files" in prompt   # the tools are in the prompt
    view = w.chat_view.widgets[-1].calls
    assert [r.header.text() for r in view.rows] == ["Tool read_file — done", "Tool read_file — failed"]
    view.rows[0].header.click()
    assert view.rows[0].body.isVisible() and "The boathouse key hangs in the shed." in view.rows[0].body.text()

    script.queue = [script_ids(model, t, ()) for t in (_call("list_files", {}), "I was not allowed to look.")]
    w.send_text("And what else is there?")
    qtbot.waitUntil(approval.isVisible, timeout=LONG)
    assert "list_files" in approval.label.text()
    with qtbot.waitSignal(w.answer_finished, timeout=LONG):
        approval.deny_btn.click()
    shown = w.chat.visible()[-1]
    assert shown.content == "I was not allowed to look."
    assert [(c["name"], c["status"], c["result"]) for c in shown.stats["tool_calls"]] == [
        ("list_files", "declined", DECLINED)]
    assert DECLINED in model.tokenizer.decode(done[-1].prompt_ids)

    # an answer stopped while a call waits: the call is declined, the answer kept
    script.queue = [script_ids(model, _call("list_files", {}), ())]
    w.send_text("Look again?")
    qtbot.waitUntil(approval.isVisible, timeout=LONG)
    with qtbot.waitSignal(w.answer_finished, timeout=LONG):
        w.stop()
    assert not approval.isVisible() and not w.busy
    assert w.chat.visible()[-1].stats["tool_calls"][0]["status"] == "declined"


@pytest.mark.slow
@pytest.mark.parametrize("family", ["k3", "llama31"])
def test_mcp_tools_in_the_window_in_k3s_and_llama31s_formats(family, qtbot, make_window, tool_templates,  # noqa: F811
                                                             tiny_k3, tmp_path, monkeypatch):  # noqa: F811
    """K3's own tool-call markup and Llama 3.1's JSON calls in the window: the call waits at the approval
    bar, runs once allowed (Allow is for this call only: the next one asks again), is shown under the
    answer, its result goes back to the model in the model's own format, and the answer follows; a
    denied call's refusal goes back the same way."""
    share = tmp_path / "share"
    share.mkdir()
    (share / "note.txt").write_text("The boathouse key hangs in the shed.\n")
    command = f"{sys.executable} {SERVER} {share}"
    w = make_window(tiny_k3 if family == "k3" else tool_templates["llama31"], mcp_servers=[command],
                    max_tokens=200, context_length=2048)
    qtbot.waitUntil(lambda: w.controller.tools.hub is not None, timeout=LONG)
    assert w.controller.tools.problems == []
    model = w.worker.worker.model
    script = scripted_sampler(monkeypatch, min(model.tokenizer.eos_ids))
    if family == "k3":
        call, answer, markers = _k3("read_file", {"path": "note.txt"}), K3_ANSWER, K3_MARKERS
    else:
        call, answer, markers = json.dumps({"name": "read_file", "parameters": {"path": "note.txt"}}), \
            "The key hangs in the shed.", ()
    script.queue = [script_ids(model, t, markers) for t in (call, answer, call, answer)]
    done = []
    on_gui(w.worker.worker.turn_done, done.append, w)

    w.send_text("Where is the key?")
    approval = w.tool_approval
    qtbot.waitUntil(approval.isVisible, timeout=LONG)
    assert "read_file" in approval.label.text() and '"path": "note.txt"' in approval.label.text()
    assert len(done) == 1 and done[0].reason == "tool_calls"
    with qtbot.waitSignal(w.answer_finished, timeout=LONG):
        approval.allow_btn.click()
    shown = w.chat.visible()[-1]
    assert shown.content == "The key hangs in the shed."
    calls = shown.stats["tool_calls"]
    assert [(c["name"], c["status"], c["is_error"], c["trusted"]) for c in calls] == [("read_file", "done", False,
                                                                                      False)]
    assert calls[0]["result"] == "The boathouse key hangs in the shed.\n"
    prompt = model.tokenizer.decode(done[-1].prompt_ids)
    assert "The boathouse key hangs in the shed." in prompt and "list_files" in prompt
    assert [r.header.text() for r in w.chat_view.widgets[-1].calls.rows] == ["Tool read_file — done"]
    assert w.settings.trusted_tools == []

    w.send_text("Look again?")
    qtbot.waitUntil(approval.isVisible, timeout=LONG)     # allowed once: asked again
    with qtbot.waitSignal(w.answer_finished, timeout=LONG):
        approval.deny_btn.click()
    shown = w.chat.visible()[-1]
    assert [(c["name"], c["status"]) for c in shown.stats["tool_calls"]] == [("read_file", "declined")]
    assert DECLINED in model.tokenizer.decode(done[-1].prompt_ids)
