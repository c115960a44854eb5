"""The app's remote engine against `ferry serve`: the same chat window,
streaming, stop, history and the thinking panel, with the answers computed on
the server; the engine settings and the API key in the keychain; and the
app's switch that serves the loaded model."""
from __future__ import annotations

import json
import re
import socket
import time

import openai
import pytest

from app.chat.turn import TurnRequest
from app.engine.remote import FERRY_FIGURES, MEASURED_FIGURES, RemoteEngine, RemoteError, normalise_url
from app.engine.remote import _logprobs as remote_logprobs
from app.engine.service import EngineService
from app.events import Logprob, Reasoning, Text, TokenLogprob, TurnDone
from app.model import LoadedModel
from app.sampling import SamplingParams
from app.server import Limits, Server
from app.store.settings import Settings, remote_api_key
from app.ui.worker import load_options
from tests.server.conftest import engine_answer
from tests.ui.conftest import THINK_PROMPT, on_gui, quick_settings

LONG = 120_000


def remote_window(qtbot, make_window, url: str, model: str = "", key: str | None = None, db=None, **settings):
    w = make_window(None, db=db, **settings)
    s = quick_settings(engine="remote", remote_url=url, remote_model=model, **settings)
    with qtbot.waitSignal(w.model_loaded, timeout=60000):
        w.worker.load("remote", load_options(s, api_key_lookup=lambda _url: key))
    return w


def send(qtbot, w, text: str) -> str:
    with qtbot.waitSignal(w.answer_finished, timeout=LONG) as blocker:
        w.send_text(text)
    return blocker.args[0]


def test_urls_are_normalised():
    assert normalise_url("gpu-box:8000") == "http://gpu-box:8000/v1"
    assert normalise_url("https://h.example/v1/") == "https://h.example/v1"
    assert normalise_url("http://h:1/openai/v1") == "http://h:1/openai/v1"
    with pytest.raises(RemoteError):
        normalise_url("ftp://h")


def test_remote_engine_events_match_the_local_engine(served, demo_container):
    remote = RemoteEngine(served.url)
    card = remote.check()
    assert remote.model == served.model == card["id"] and remote.is_ferry and remote.n_ctx == 2048
    messages = [{"role": "user", "content": "Name three colours."}]
    events = list(remote.generate(TurnRequest(messages, SamplingParams(), max_tokens=10)))
    end = events[-1]
    assert isinstance(end, TurnDone) and end.reason in ("stop", "length")
    assert "".join(e.text for e in events if isinstance(e, Text)) == end.content == engine_answer(
        demo_container, messages, 10)
    assert end.counters["decode_tokens"] == len(end.token_ids) and end.counters["prompt_tokens"] >= 0
    assert end.ttft_s is not None and 0 < end.ttft_s <= end.seconds
    with pytest.raises(RemoteError, match="does not serve"):
        RemoteEngine(served.url, "gpt-4o").check()
    with pytest.raises(RemoteError, match="cannot reach"):
        RemoteEngine("http://127.0.0.1:9", timeout=2).check()


def test_remote_logprobs_equal_the_local_engine(served, demo_container):
    """Logprobs asked over a remote engine (a real `ferry serve` on loopback)
    come back as the local pipeline's own ``Logprob`` events: the same token
    ids, the same values to the bit, the same alternatives, each before the
    text of its token, and all of them in ``TurnDone.logprobs``."""
    messages = [{"role": "user", "content": "Name three colours."}]
    request = TurnRequest(messages, SamplingParams(), max_tokens=8, top_logprobs=3)
    model = LoadedModel(demo_container)
    try:
        service = EngineService(model, model.new_session(2048))
        local = list(service.submit(request))
        service.close()
    finally:
        model.close()
    remote = RemoteEngine(served.url)
    remote.check()
    events = list(remote.generate(request))
    mine = [e for e in local if isinstance(e, Logprob)]
    theirs = [e for e in events if isinstance(e, Logprob)]
    assert len(mine) == local[-1].completion_tokens == 8 and all(len(e.value.top) == 3 for e in mine)
    assert theirs == mine
    assert events[-1].logprobs == local[-1].logprobs == [(e.token, e.value) for e in mine]
    assert [e.token for e in theirs] == local[-1].token_ids == events[-1].token_ids
    first_text = next(i for i, e in enumerate(events) if isinstance(e, Text))
    assert isinstance(events[first_text - 1], Logprob)   # a token's logprob comes before its text
    # Not asked for: none.
    plain = list(remote.generate(TurnRequest(messages, SamplingParams(), max_tokens=4)))
    assert not any(isinstance(e, Logprob) for e in plain) and plain[-1].logprobs == []
    assert plain[-1].token_ids == [-1] * plain[-1].completion_tokens   # ids unknown without logprobs
    remote.close()


def test_logprobs_of_servers_that_do_not_give_token_ids():
    """Other servers' OpenAI logprobs: vLLM's `token_id:N` tokens give the id,
    a plain OpenAI entry gives -1 with its value; malformed entries are skipped."""
    chunk = {"content": [
        {"token": "token_id:42", "logprob": -0.5, "top_logprobs": [{"token": "token_id:42", "logprob": -0.5},
                                                                   {"token": "Hi", "logprob": -1.25}]},
        {"token": "there", "logprob": -2.0, "bytes": [116], "top_logprobs": []},
        {"token": "x", "logprob": "bad"}, "junk", {"id": True, "token": "y", "logprob": -3}]}
    got = list(remote_logprobs(chunk))
    assert got == [(42, TokenLogprob(-0.5, ((42, -0.5), (-1, -1.25)))),
                   (-1, TokenLogprob(-2.0, ())), (-1, TokenLogprob(-3.0, ()))]
    assert [(lp.token_bytes, lp.top_bytes) for _, lp in got] == [(b"token_id:42", (b"token_id:42", b"Hi")),
                                                                 (b"t", ()), (b"y", ())]
    assert list(remote_logprobs(None)) == list(remote_logprobs({"content": None})) == []


def test_the_cli_runs_and_chats_on_a_server(served, demo_container, monkeypatch, capsys, memory_keyring):
    """`ferry run URL` and `ferry chat URL`: the window's remote engine in the
    CLI, with the same answer, ids and logprobs as the engine itself; what
    sets up a local model is refused, and so is an unreachable server."""
    import io

    from app.cli import main as ferry

    messages = [{"role": "user", "content": "Name three colours."}]
    capsys.readouterr()
    assert ferry(["run", served.url, messages[0]["content"], "-n", "10", "--json", "--logprobs", "2"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["text"] == engine_answer(demo_container, messages, 10)
    assert doc["model"] == served.model and doc["server"] == served.url and doc["ram_budget"] is None
    assert [e["id"] for e in doc["logprobs"]] == doc["token_ids"] and -1 not in doc["token_ids"]
    assert all(len(e["top_logprobs"]) == 2 for e in doc["logprobs"]) and doc["tokens"] == 10
    capsys.readouterr()
    assert ferry(["run", str(demo_container), messages[0]["content"], "-n", "10", "--json", "--logprobs", "2"]) == 0
    local = json.loads(capsys.readouterr().out)
    assert doc["logprobs"] == local["logprobs"]      # token text and bytes too: the server's, as given

    monkeypatch.setattr("sys.stdin", io.StringIO("Name three colours.\nAnd three fruits?\n/quit\n"))
    assert ferry(["chat", served.url, "-n", "8", "--server-model", served.model]) == 0
    out, err = capsys.readouterr()
    assert f"Chatting with {served.model} on {served.url}" in err and out.count("> ") == 3
    assert engine_answer(demo_container, messages, 8) in out
    reused = [int(m) for m in re.findall(r"prompt tokens evaluated, (\d+) reused", err)]
    assert len(reused) == 2 and reused[1] > 10          # the server kept the first turn's prefix

    assert ferry(["run", served.url, "hi", "--budget", "1G", "--activations", "q8"]) == 2
    assert "--budget, --activations set up a model on this computer" in capsys.readouterr().err
    assert ferry(["run", "http://127.0.0.1:9", "hi"]) == 1
    err = capsys.readouterr().err
    assert "cannot reach" in err and "Traceback" not in err
    assert ferry(["run", served.url, "hi", "--server-model", "gpt-4o"]) == 1
    assert "does not serve 'gpt-4o'" in capsys.readouterr().err
    assert ferry(["info", served.url]) == 2
    assert "this command needs a model on this computer" in capsys.readouterr().err


def test_send_streams_into_the_window_and_the_history(qtbot, make_window, served, demo_container):
    w = remote_window(qtbot, make_window, served.url, max_tokens=16)
    assert w.model_info.engine == "remote" and w.model_info.name == served.model
    chunks: list[str] = []
    on_gui(w.worker.worker.response_text, chunks.append)
    snaps: list = []
    on_gui(w.worker.worker.stats, snaps.append)
    reason = send(qtbot, w, "Name three colours.")
    expected = engine_answer(demo_container, [{"role": "user", "content": "Name three colours."}], 16)
    assert reason in ("stop", "length")
    assert "".join(chunks) == expected
    shown = w.chat.visible()
    assert [m.role for m in shown] == ["user", "assistant"] and shown[1].content == expected
    assert w.store.messages(w.chat.id)[-1].content == expected
    # the gauges: the Ferry server's own figures; memory is on the server
    assert snaps[-1].final and w.model_info.remote and snaps[-1].counters["decode_tokens"] >= 1
    assert w.stats_view.values.decode_tps and w.stats_view.values.decode_tps > 0
    assert w.gauges.remote_note.isVisible() and "Ferry server" in w.gauges.remote_note.text()
    assert not w.gauges.ram.isVisible() and "not reported" in w.gauges.ram_note.text()
    # a follow-up turn: the whole history goes to the server, which reuses the prefix it holds
    send(qtbot, w, "And three fruits?")
    assert [m.role for m in w.chat.visible()] == ["user", "assistant"] * 2
    assert w.last_stats.turn.reused_tokens > 10


def test_stop_mid_answer_cancels_on_the_server(qtbot, make_window, served):
    w = remote_window(qtbot, make_window, served.url, max_tokens=400)
    before = served.status()["cancelled"]
    got: list[str] = []

    def first(text):
        got.append(text)
        if len(got) == 2:
            w.stop()

    on_gui(w.worker.worker.response_text, first)
    assert send(qtbot, w, "Tell me a long story about a lighthouse keeper.") == "cancelled"
    m = w.chat.visible()[-1]
    assert m.status == "cancelled" and m.content == "".join(got) and m.content
    deadline = time.monotonic() + 10
    while served.status()["cancelled"] == before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert served.status()["cancelled"] == before + 1    # the server stopped generating too
    w.settings.max_tokens = 4
    assert send(qtbot, w, "Thanks.") in ("stop", "length")


def test_history_survives_a_restart_with_the_remote_engine(qtbot, make_window, served, tmp_path):
    from tests.ui.conftest import close_window

    db = tmp_path / "remote.sqlite3"
    w1 = make_window(None, db=db)
    with qtbot.waitSignal(w1.model_loaded, timeout=60000):
        w1.worker.load("remote", load_options(quick_settings(engine="remote", remote_url=served.url, max_tokens=4),
                                              api_key_lookup=lambda _u: None))
    send(qtbot, w1, "Hello there.")
    before = [(m.role, m.content) for m in w1.chat.visible()]
    close_window(w1)
    w2 = remote_window(qtbot, make_window, served.url, db=db)
    w2.conv_list.itemClicked.emit(w2.conv_list.item(0))
    assert [(m.role, m.content) for m in w2.chat.visible()] == before


def test_the_thinking_panel_with_a_remote_thinking_model(qtbot, make_window, thinking_model):
    container, before_close = thinking_model
    model = LoadedModel(container)
    server = Server(model, model.new_session(256), port=0, limits=Limits(max_tokens=40)).start()
    try:
        # the API: reasoning in its own field, never in the content
        client = openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0)
        r = client.chat.completions.create(model=server.model_id, messages=[{"role": "user", "content": THINK_PROMPT}],
                                           max_tokens=12, temperature=0)
        msg = r.choices[0].message
        assert msg.model_extra["reasoning_content"] and "</think>" not in (msg.content or "")
        # the trace's tokens (the one that closes it may carry its last text)
        assert before_close <= r.usage.completion_tokens_details.reasoning_tokens <= before_close + 1
        chunks = list(client.chat.completions.create(model=server.model_id, max_tokens=12, temperature=0,
                                                     messages=[{"role": "user", "content": THINK_PROMPT}],
                                                     stream=True))
        streamed = "".join(c.choices[0].delta.model_extra.get("reasoning_content") or "" for c in chunks
                           if c.choices)
        assert streamed == msg.model_extra["reasoning_content"]
        # the window: the trace goes to the thinking panel
        w = remote_window(qtbot, make_window, server.url, max_tokens=12)
        thinking: list[str] = []
        on_gui(w.worker.worker.thinking_text, thinking.append)
        send(qtbot, w, THINK_PROMPT)
        answer = w.chat.visible()[-1]
        assert "".join(thinking) == answer.thinking == msg.model_extra["reasoning_content"]
        assert answer.content == (msg.content or "")
    finally:
        server.stop()
        model.close()


def test_thinking_is_controllable_per_request(tmp_path, thinking_model):
    from tests.server.conftest import copy_with_template
    from tests.ui.conftest import THINK_TEMPLATE

    container, _ = thinking_model
    template = THINK_TEMPLATE.replace("w5 <think>", "w5 {% if enable_thinking %}<think>{% endif %}")
    copy = copy_with_template(container, tmp_path / "switch.ferry", template)
    model = LoadedModel(copy)
    server = Server(model, model.new_session(256), port=0, limits=Limits(max_tokens=20)).start()
    try:
        client = openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0)
        ask = dict(model=server.model_id, messages=[{"role": "user", "content": THINK_PROMPT}], max_tokens=8,
                   temperature=0)
        thinks = client.chat.completions.create(**ask).choices[0].message
        plain = client.chat.completions.create(**ask, reasoning_effort="none").choices[0].message
        vllm_style = client.chat.completions.create(
            **ask, extra_body={"chat_template_kwargs": {"enable_thinking": False}}).choices[0].message
        assert thinks.model_extra.get("reasoning_content")
        assert not plain.model_extra.get("reasoning_content") and plain.content
        assert vllm_style.content == plain.content
        # the remote engine's thinking switch is the vLLM-style one
        remote = RemoteEngine(server.url)
        remote.check()
        events = list(remote.generate(TurnRequest(ask["messages"], SamplingParams(), max_tokens=8, thinking=False)))
        assert not any(isinstance(e, Reasoning) for e in events) and events[-1].content == plain.content
    finally:
        server.stop()
        model.close()


def test_gauges_say_what_a_generic_server_does_not_report(qtbot):
    from app.memory.stats import StatsView
    from app.ui.gauges import NOT_REPORTED, REMOTE_OTHER, GaugePanel

    g = GaugePanel()
    qtbot.addWidget(g)
    g.show()
    g.set_model(False, engine=_engine("remote", url="http://gpu:8000/v1", provides=tuple(sorted(MEASURED_FIGURES))))
    view = StatsView(window=600)
    view.push({"prompt_tokens": 20, "prompt_seconds": 0.5, "decode_tokens": 10, "decode_seconds": 1.0}, "decode", 1.0)
    g.show_values(view)
    g.show_memory(None)
    assert g.remote_note.text() == REMOTE_OTHER and g.remote_note.isVisible()
    assert g.decode.value.text() == "10.0 tok/s" and "measured here" in g.decode.detail.text()
    for tile in (g.disk, g.hit_decode, g.hit_prefill):
        assert tile.value.text() == "—" and tile.detail.text() == NOT_REPORTED and not tile.isEnabled()
    assert not g.no_experts.isVisible() and not g.ram.isVisible() and NOT_REPORTED in g.ram_note.text()
    # a Ferry server reports everything but the memory
    g.set_model(True, engine=_engine("remote", url="u", provides=tuple(sorted(FERRY_FIGURES))))
    assert "Ferry server" in g.remote_note.text() and g.disk.isEnabled()
    # and back on this computer, nothing is said about a server
    g.set_model(True, engine=_engine("local"))
    g.show_memory(None)
    assert not g.remote_note.isVisible() and g.ram.isVisible()


def test_settings_keep_the_api_key_in_the_keychain_only(qtbot, memory_keyring, tmp_path):
    from app.store import settings as settings_mod
    from app.ui.settings_dialog import SettingsDialog

    d = SettingsDialog(Settings())
    qtbot.addWidget(d)
    assert not d.remote_url.isEnabled() and d.serve.isEnabled()
    d.engine.setCurrentIndex(1)
    assert d.remote_url.isEnabled() and not d.serve.isEnabled()
    d.remote_url.setText("http://gpu-box:8000/v1")
    d.remote_model.setText("kimi-k3")
    d.api_key.setText("sk-secret-123")
    d.accept()
    new = d.result_settings()
    assert (new.engine, new.remote_url, new.remote_model) == ("remote", "http://gpu-box:8000/v1", "kimi-k3")
    assert remote_api_key("http://gpu-box:8000/v1") == "sk-secret-123"
    assert remote_api_key("http://other:8000/v1") is None        # a key goes only to its own server
    path = settings_mod.save(new, tmp_path / "settings.json")
    assert "sk-secret" not in path.read_text() and json.loads(path.read_text())["engine"] == "remote"
    assert load_options(new).remote_api_key == "sk-secret-123"
    assert settings_mod.engine_changed(Settings(), new) and not settings_mod.engine_changed(new, new)
    # forgetting it removes it from the keychain
    d2 = SettingsDialog(new)
    qtbot.addWidget(d2)
    assert "keychain" in d2.api_key.placeholderText()
    d2.forget_key.click()
    d2.accept()
    assert remote_api_key("http://gpu-box:8000/v1") is None


def test_a_wrong_key_or_url_is_reported_when_loading(qtbot, make_window, demo_container, tmp_path):
    from app.ui.worker import WorkerThread
    from tests.server.conftest import start_ferry_serve

    keyed = start_ferry_serve(demo_container, tmp_path, "--max-tokens", "4", env={"FERRY_API_KEY": "right"})
    worker = WorkerThread()     # (a window would show the failure in a modal message box)
    try:
        failures: list[str] = []
        on_gui(worker.worker.load_failed, failures.append)
        for key in ("wrong", None):
            worker.load("remote", load_options(quick_settings(engine="remote", remote_url=keyed.url),
                                               api_key_lookup=lambda _u, key=key: key))
        worker.load("remote", load_options(quick_settings(engine="remote", remote_url="http://127.0.0.1:9")))
        qtbot.waitUntil(lambda: len(failures) == 3, timeout=30000)
        assert all("401" in f and "API key" in f for f in failures[:2]) and "cannot reach" in failures[2]
        w = make_window(None, max_tokens=3)
        with qtbot.waitSignal(w.model_loaded, timeout=30000):
            w.worker.load("remote", load_options(quick_settings(engine="remote", remote_url=keyed.url),
                                                 api_key_lookup=lambda _u: "right"))
        assert send(qtbot, w, "Hi.") in ("stop", "length")
    finally:
        worker.close()
        keyed.stop()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_app_serves_its_loaded_model(qtbot, make_window, demo_container, memory_keyring):
    from app.store.settings import served_api_key

    port = _free_port()
    w = make_window(None, max_tokens=6)
    urls: list[tuple[str, str]] = []
    on_gui(w.worker.worker.serving, lambda url, err: urls.append((url, err)))
    with qtbot.waitSignal(w.model_loaded, timeout=60000):
        w.worker.load(str(demo_container), load_options(quick_settings(serve_local=True, serve_port=port)))
    qtbot.waitUntil(lambda: bool(urls), timeout=10000)
    assert urls[-1] == (f"http://127.0.0.1:{port}/v1", "")
    client = openai.OpenAI(base_url=urls[-1][0], api_key=served_api_key(), max_retries=0)
    messages = [{"role": "user", "content": "Name a colour."}]
    r = client.chat.completions.create(model=client.models.list().data[0].id, messages=messages, max_tokens=6,
                                       temperature=0)
    assert r.choices[0].message.content == engine_answer(demo_container, messages, 6)
    # the window's own chat still works on the same session, in turn with the server
    assert send(qtbot, w, "Name a colour.") in ("stop", "length")
    assert w.chat.visible()[-1].content == r.choices[0].message.content
    w.worker.set_serving(0)
    qtbot.waitUntil(lambda: urls[-1] == ("", ""), timeout=10000)
    with pytest.raises(openai.APIConnectionError):
        client.models.list()


def _engine(engine: str, **fields):
    """A loaded-model report as the worker gives it, blank but for ``fields``."""
    from app.api import ModelLoaded
    from app.engine.binding import MemoryPlan, ModelInfo
    from app.ui.worker import _blank

    return ModelLoaded(path="m", name="m", n_ctx=0, info=_blank(ModelInfo), plan=_blank(MemoryPlan),
                       has_experts=True, chat_format="remote" if engine == "remote" else "jinja", engine=engine,
                       **fields)


def test_a_remote_turn_carries_the_summary_note_and_continue():
    """What the window's summarise policy and Continue send to a server: the note in the system message
    (as the local pipeline puts it) and vLLM's continue_final_message pair."""
    r = RemoteEngine("http://127.0.0.1:9/v1", "m")
    body = r.request_body(TurnRequest([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "q"},
                                       {"role": "assistant", "content": "The"}],
                                      context_note="Ada has a cat called Turing.", continue_final=True))
    assert body["messages"][0]["content"].startswith("Be brief.\n\nSummary of the earlier conversation")
    assert body["messages"][0]["content"].endswith("Ada has a cat called Turing.") and len(body["messages"]) == 3
    assert body["continue_final_message"] is True and body["add_generation_prompt"] is False
    plain = r.request_body(TurnRequest([{"role": "user", "content": "q"}]))
    assert "continue_final_message" not in plain and plain["messages"] == [{"role": "user", "content": "q"}]


def test_a_ferry_server_says_whether_its_model_takes_tools(demo_container, tool_templates):
    """The model card lists "tool_use" (LM Studio's word) when the chat format takes tools, so the window
    offers its MCP tools to a remote Ferry model that can call them, and not to one that cannot."""
    from app.api import RemoteEngine
    from tests.server.conftest import Live

    for container, takes in ((tool_templates["hermes"], True), (demo_container, False)):
        live = Live(container)
        try:
            remote = RemoteEngine(live.url, "", live.key)
            card = remote.check()
            assert remote.takes_tools is takes and ("tool_use" in card["capabilities"]) is takes
            remote.close()
        finally:
            live.close()


def test_image_parts_go_to_a_server_in_openais_shape():
    """The front ends name their image parts (the file's name, for their own messages); a server gets
    OpenAI's shape, as a strict one (Ferry's own) refuses keys it does not know."""
    r = RemoteEngine("http://127.0.0.1:9/v1", "m")
    part = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    body = r.request_body(TurnRequest([{"role": "user", "content": [
        {"type": "text", "text": "q"}, {**part, "name": "red.png"}]}]))
    assert body["messages"] == [{"role": "user", "content": [{"type": "text", "text": "q"}, part]}]
