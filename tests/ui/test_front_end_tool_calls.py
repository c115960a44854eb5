"""A tool call through every front end. Tiny random models never write one,
so this test (and only this test) scripts the sampler: the engine still
prefills and decodes every token on the tiny Kimi K3, but the ids it picks
are those of a K3 answer that thinks, says a sentence and calls a tool. The
window (pytest-qt), `ferry run --json`, the server through the `openai`
client (streamed and not) and `ferry docs ask --json` (the AnswerBuilder
path it shares) must all split those ids the same way: the thinking trace,
the answer text and one `lookup` call with its JSON arguments."""
from __future__ import annotations

import json

import openai
import pytest

from app.cli import main as ferry
from app.convert.convert import convert
from app.model import LoadedModel
from app.server import Server
from tests.scripted import script_ids, scripted_sampler
from tests.ui.test_front_end_matrix import _cli_json, _split, _window_turn

QUESTION = "Where is the boathouse key?"
CTX = 1024
#: What the model "writes" after the generation prompt opened its thinking.
SCRIPT = ('Look it up.<|close|>think<|sep|><|open|>response<|sep|>Checking the notes.<|close|>response<|sep|>'
          '<|open|>tools<|sep|><|open|>call tool="lookup" index="1"<|sep|>'
          '<|open|>argument key="place" type="string"<|sep|>boathouse<|close|>argument<|sep|>'
          '<|close|>call<|sep|><|close|>tools<|sep|><|close|>message<|sep|><|end_of_msg|>')
EXPECTED = ("Checking the notes.", "Look it up.", [("lookup", json.dumps({"place": "boathouse"}))])


@pytest.fixture(scope="module")
def k3(tmp_path_factory):
    from tests.kimi import tiny_k3

    root = tmp_path_factory.mktemp("k3tools")
    tiny_k3.build(root / "ckpt")
    return convert(root / "ckpt", root / "k3.ferry", trunk_format="f32", expert_format="f32")


@pytest.fixture
def scripted(k3, monkeypatch):
    """``app.model``'s sampler replaced, for this test only, by one that
    answers with SCRIPT's token ids (then the end token), whatever the logits."""
    model = LoadedModel(k3, threads=1, n_ctx=CTX)
    try:
        ids = script_ids(model, SCRIPT)
        eos = min(model.tokenizer.eos_ids)
    finally:
        model.close()
    scripted_sampler(monkeypatch, eos).ids = ids
    return ids


@pytest.mark.slow
def test_a_tool_call_splits_the_same_in_every_front_end(k3, scripted, qtbot, make_window, capsys, tmp_path,
                                                        kr, monkeypatch):
    n = len(scripted) + 4
    monkeypatch.setenv("FERRY_HOME", str(tmp_path / "home"))
    messages = [{"role": "user", "content": QUESTION}]

    cli = _cli_json(capsys, "run", str(k3), QUESTION, "-n", str(n), "--ctx", str(CTX), "--threads", "2", "--json")
    assert cli["token_ids"] == scripted[:len(cli["token_ids"])]

    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "boathouse.txt").write_text("The boathouse key hangs inside the shed.\n")
    assert ferry(["docs", "add", "home", str(notes), "--json"]) == 0
    docs = _cli_json(capsys, "docs", "ask", str(k3), "home", QUESTION, "-n", str(n), "--ctx", str(CTX),
                     "--threads", "2", "--context-tokens", "900", "--json")

    model = LoadedModel(k3, threads=2, n_ctx=CTX)
    server = Server(model, model.new_session(CTX), host="127.0.0.1", port=0).start()
    try:
        client = openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0)
        r = client.chat.completions.create(model=server.model_id, messages=messages, max_tokens=n, temperature=0)
        chunks = list(client.chat.completions.create(model=server.model_id, messages=messages, max_tokens=n,
                                                     temperature=0, stream=True))
    finally:
        server.stop()
        model.close()
    msg = r.choices[0].message
    server_split = _split(msg.content or "", msg.model_extra.get("reasoning_content") or "",
                          [{"name": c.function.name, "arguments": c.function.arguments} for c in msg.tool_calls])
    deltas = [ch.choices[0].delta for ch in chunks if ch.choices]
    merged: dict[int, dict] = {}   # a call streams as its name, then pieces of its arguments (merged by index)
    for t in (t for d in deltas for t in d.tool_calls or []):
        slot = merged.setdefault(t.index, {"name": "", "arguments": ""})
        slot["name"] += t.function.name or ""
        slot["arguments"] += t.function.arguments or ""
    streamed_split = _split("".join(d.content or "" for d in deltas),
                            "".join((d.model_extra or {}).get("reasoning_content") or "" for d in deltas),
                            [merged[i] for i in sorted(merged)])

    w = make_window(k3, max_tokens=n, context_length=CTX)
    calls = []
    from tests.ui.conftest import on_gui

    on_gui(w.worker.worker.tool_call, calls.append)
    win, shown = _window_turn(qtbot, w, QUESTION)

    assert _split(cli["text"], cli["reasoning"], cli["tool_calls"]) == EXPECTED
    assert server_split == streamed_split == EXPECTED
    assert _split(win.content, win.reasoning, win.tool_calls) == EXPECTED
    assert _split(docs["model_text"], docs["reasoning"], docs["tool_calls"]) == EXPECTED
    assert r.choices[0].finish_reason == "tool_calls" and win.reason == "tool_calls" == docs["reason"]
    assert [(c.name, c.arguments) for c in calls] == EXPECTED[2]   # the window's tool_call signal
    assert (shown.content, shown.thinking) == (win.content, win.reasoning)
    # the window shows the call under the answer (no MCP server is connected: it is not run) and keeps it
    assert shown.stats["tool_calls"] == [{"name": name, "arguments": args} for name, args in EXPECTED[2]]
    view = w.chat_view.widgets[-1].calls
    assert view.isVisible() and [r.header.text() for r in view.rows] == ["Tool lookup — not run"]
    view.rows[0].header.click()   # it opens on its arguments
    assert view.rows[0].body.isVisible() and '"place": "boathouse"' in view.rows[0].body.text()
