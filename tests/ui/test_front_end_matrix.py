"""One conversation, every model family, every front end: the window (driven
with pytest-qt), the CLI (`ferry run`), the server (through the `openai`
client, over loopback HTTP) and `ferry docs ask` give the same prompt token
ids, the same generated ids, and the same split of those ids into thinking,
answer and tool calls, because all of them go through the one turn
pipeline. Kimi K3 with thinking on shows its trace in the window's thinking
panel; the window on a remote engine (pointed at a Ferry server) gives the
same turn as on the local engine; the CLI, the server, the remote engine and
the window (local and remote) give the same per-token logprobs; a seed gives
the same sampled answer in the CLI, the server, the remote engine and the
window; `ferry docs ask` on a server's URL gives the local answer, logprobs
included; a note attached in the window (local or remote engine) gives `docs
ask`'s turn. The table of features by front end: docs/FRONTENDS.md."""
from __future__ import annotations

import json
from contextlib import contextmanager
from pathlib import Path

import openai
import pytest

from app.cli import main as ferry
from app.convert.convert import convert
from app.documents.prompt import Passage, passages_message
from app.events import TurnDone
from app.model import LoadedModel
from app.server import Server
from app.ui.worker import load_options
from tests.ui.conftest import on_gui, quick_settings

QUESTION = "What colour is the boathouse door?"
NOTE = "The boathouse door is painted green and the key hangs inside the shed."
N = 10
LONG = 120_000
#: A ChatML-like template (Kimi-Linear's tiny stand-in) and one whose generation
#: prompt opens <think> (DeepSeek-V3's R1-style stand-in).
PLAIN_CHAT = ("{% for m in messages %}<|im_{{ m.role }}|> {{ m.content }} <|im_end|> {% endfor %}"
              "{% if add_generation_prompt %}<|im_assistant|> {% endif %}")
THINK_CHAT = ("{% for m in messages %}<｜{{ m.role }}｜> {{ m.content }} {% endfor %}"
              "{% if add_generation_prompt %}<｜Assistant｜> <think> {% endif %}")
FAMILIES = ["demo", "k3", "kimi_linear", "deepseek"]
CTX = {"demo": 1024, "k3": 1024, "kimi_linear": 256, "deepseek": 256}
_built: dict[str, Path] = {}


def _tiny_kimi(kind: str, root: Path, template: str) -> Path:
    from tests.kimi.tiny_kimi import build

    build(kind, root / "ckpt")
    cfg = root / "ckpt" / "tokenizer_config.json"
    cfg.write_text(json.dumps({**json.loads(cfg.read_text()), "chat_template": template}))
    return convert(root / "ckpt", root / f"{kind}.ferry", trunk_format="f32", expert_format="f32")


@pytest.fixture
def container(request, tmp_path_factory) -> tuple[str, Path]:
    family = request.param
    if family not in _built:
        root = tmp_path_factory.mktemp(family)
        if family == "demo":
            _built[family] = request.getfixturevalue("demo_container")
        elif family == "k3":
            from tests.kimi import tiny_k3

            tiny_k3.build(root / "ckpt")
            _built[family] = convert(root / "ckpt", root / "k3.ferry", trunk_format="f32", expert_format="f32")
        else:
            _built[family] = _tiny_kimi(family, root, PLAIN_CHAT if family == "kimi_linear" else THINK_CHAT)
    return family, _built[family]


def _cli_json(capsys, *argv: str) -> dict:
    capsys.readouterr()
    code = ferry(list(argv))
    out = capsys.readouterr().out
    assert code == 0, out
    return json.loads(out)


def _window_turn(qtbot, w, text: str) -> tuple[TurnDone, object]:
    done: list[TurnDone] = []
    on_gui(w.worker.worker.turn_done, done.append)
    with qtbot.waitSignal(w.answer_finished, timeout=LONG):
        w.send_text(text)
    qtbot.waitUntil(lambda: bool(done), timeout=10000)
    return done[-1], w.chat.visible()[-1]


@contextmanager
def _served(path: Path, ctx: int):
    """`ferry serve`'s server on ``path`` (in this process, on loopback), and an openai client of it."""
    model = LoadedModel(path, threads=2, n_ctx=ctx)
    server = Server(model, model.new_session(ctx), host="127.0.0.1", port=0).start()
    try:
        yield server, openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0)
    finally:
        server.stop()
        model.close()


def _remote_window(qtbot, make_window, url: str, **settings):
    """A window whose engine is the server at ``url`` (no API key), with ``settings``."""
    w = make_window(None, **settings)
    with qtbot.waitSignal(w.model_loaded, timeout=60000):
        w.worker.load("remote", load_options(quick_settings(engine="remote", remote_url=url, **settings),
                                             api_key_lookup=lambda _url: None))
    return w


def _split(content: str, reasoning: str, calls) -> tuple[str, str, list]:
    return content, reasoning, [(c["name"], c["arguments"]) if isinstance(c, dict) else
                                (c.name, c.arguments) for c in calls]


@pytest.mark.slow
@pytest.mark.parametrize("container", FAMILIES, indirect=True)
def test_every_front_end_gives_the_same_turn(container, qtbot, make_window, capsys, tmp_path, kr, monkeypatch):
    family, path = container
    ctx = CTX[family]
    monkeypatch.setenv("FERRY_HOME", str(tmp_path / "home"))   # a store for this test's keychain
    # documents: one note, so the whole collection is the passage block
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "boathouse.txt").write_text(NOTE + "\n")
    assert ferry(["docs", "add", "home", str(notes), "--json"]) == 0
    docs = _cli_json(capsys, "docs", "ask", str(path), "home", QUESTION, "-n", str(N), "--ctx", str(ctx),
                     "--threads", "2", "--context-tokens", "900", "--json")
    assert docs["whole_collection"] and len(docs["passages"]) == 1
    # `docs ask` takes `run`'s sampling options: top-k 1 is greedy at any temperature
    top1 = _cli_json(capsys, "docs", "ask", str(path), "home", QUESTION, "-n", str(N), "--ctx", str(ctx),
                     "--threads", "2", "--context-tokens", "900", "--temp", "1.5", "--top-k", "1", "--seed", "7",
                     "--top-p", "0.9", "--min-p", "0.01", "--json")
    assert top1["tokens"] == docs["tokens"]
    from app.cli.docs import open_store

    with open_store() as store:
        chunks = store.index("home").head(None)
    system = passages_message([Passage(i + 1, c, 0.0, 0) for i, c in enumerate(chunks)])
    messages = [{"role": "system", "content": system}, {"role": "user", "content": QUESTION}]

    # the CLI
    cli = _cli_json(capsys, "run", str(path), QUESTION, "--system", system, "-n", str(N), "--ctx", str(ctx),
                    "--threads", "2", "--json")

    # the server, through the openai client over loopback HTTP
    model = LoadedModel(path, threads=2, n_ctx=ctx)
    server = Server(model, model.new_session(ctx), host="127.0.0.1", port=0).start()
    try:
        client = openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0)
        r = client.chat.completions.create(model=server.model_id, messages=messages, max_tokens=N, temperature=0)
        held = list(server.queue.session.tokens)
    finally:
        server.stop()
        model.close()
    msg = r.choices[0].message
    n_prompt = r.usage.prompt_tokens
    server_split = _split(msg.content or "", msg.model_extra.get("reasoning_content") or "",
                          [{"name": c.function.name, "arguments": c.function.arguments} for c in msg.tool_calls or []])

    # the window
    w = make_window(path, max_tokens=N, system_prompt=system, context_length=ctx)
    win, shown = _window_turn(qtbot, w, QUESTION)

    # the same prompt ids everywhere
    assert cli["prompt_ids"] == docs["prompt_ids"] == win.prompt_ids == held[:n_prompt]
    assert len(win.prompt_ids) == n_prompt
    # the same generated ids (greedy), and the same split of them
    assert cli["token_ids"] == docs["tokens"] == win.token_ids
    assert held[n_prompt:] == win.token_ids[:len(held) - n_prompt]
    assert r.usage.completion_tokens == len(win.token_ids)
    cli_split = _split(cli["text"], cli["reasoning"], cli["tool_calls"])
    docs_split = _split(docs["model_text"], docs["reasoning"], [])
    win_split = _split(win.content, win.reasoning, win.tool_calls)
    assert cli_split == server_split == win_split == docs_split
    # what the window shows is that split
    assert (shown.content, shown.thinking) == (win.content, win.reasoning)
    if family == "k3":   # thinking on: the trace is in the thinking panel, not the answer
        assert win.reasoning.strip(), "K3 wrote no thinking trace"
        w.chat_view.refresh_streaming()
        panel = w.chat_view.widgets[-1].thinking
        assert panel.isVisible()
        panel.toggle.click() if not panel.expanded else None
        assert panel.body.toPlainText().strip()
        assert "<|open|>" not in shown.content and "<|close|>" not in shown.content


@pytest.mark.slow
@pytest.mark.parametrize("container", FAMILIES, indirect=True)
def test_the_window_on_a_remote_engine_gives_the_same_turn(container, qtbot, make_window):
    """Each family on `ferry serve`'s engine (in this process, on loopback): the
    window's remote engine yields the same thinking, answer and figures as local."""
    family, path = container
    ctx = CTX[family]
    local = make_window(path, max_tokens=N, context_length=ctx)
    progress: list[tuple[int, int]] = []
    on_gui(local.worker.worker.prompt_progress, lambda d, t: progress.append((d, t)))
    stats: list = []
    on_gui(local.worker.worker.stats, stats.append)
    mine, _ = _window_turn(qtbot, local, QUESTION)
    assert stats[-1].final and stats[-1].turn.ttft_s == mine.ttft_s
    assert progress and progress[-1][0] == progress[-1][1] == len(mine.prompt_ids)
    from app.engine.binding import Engine
    with Engine(path, n_ctx=ctx, threads=1) as engine:
        chunk = engine.info.prompt_chunk                               # 128 with experts, else 32
    assert len(progress) == -(-len(mine.prompt_ids) // chunk)     # one event per prefill chunk
    assert mine.ttft_s is not None and 0 < mine.ttft_s <= mine.seconds

    model = LoadedModel(path, threads=2, n_ctx=ctx)
    server = Server(model, model.new_session(ctx), host="127.0.0.1", port=0).start()
    try:
        theirs, shown = _window_turn(qtbot, _remote_window(qtbot, make_window, server.url, max_tokens=N), QUESTION)
    finally:
        server.stop()
        model.close()
    assert (theirs.reason, theirs.content, theirs.reasoning, theirs.tool_calls) == \
        (mine.reason, mine.content, mine.reasoning, mine.tool_calls)
    assert theirs.prompt_tokens == len(mine.prompt_ids) and theirs.completion_tokens == len(mine.token_ids)
    assert theirs.ttft_s is not None and theirs.ttft_s > 0
    assert shown.thinking == mine.reasoning and shown.content == mine.content


@pytest.mark.slow
@pytest.mark.parametrize("container", FAMILIES, indirect=True)
def test_logprobs_are_the_same_in_every_front_end(container, capsys, qtbot, make_window):
    """Per-token logprobs (greedy, 3 alternatives) from `ferry run --json
    --logprobs`, the server (openai client, loopback), the remote engine
    pointed at that server, and the window (its token-probabilities setting) on
    the local engine and on that server: the same tokens, values and
    alternatives."""
    from app.chat.token_probs import STATS_KEY, compact
    from app.chat.turn import TurnRequest
    from app.engine.remote import RemoteEngine
    from app.events import Logprob, TokenLogprob
    from app.sampling import SamplingParams

    family, path = container
    ctx = CTX[family]
    cli = _cli_json(capsys, "run", str(path), QUESTION, "-n", str(N), "--ctx", str(ctx), "--threads", "2",
                    "--json", "--logprobs", "3")
    window = dict(max_tokens=N, token_probabilities=True, token_alternatives=3)
    local = make_window(path, context_length=ctx, **window)
    mine, shown_here = _window_turn(qtbot, local, QUESTION)
    messages = [{"role": "user", "content": QUESTION}]
    with _served(path, ctx) as (server, client):
        r = client.chat.completions.create(model=server.model_id, messages=messages, max_tokens=N, temperature=0,
                                           logprobs=True, top_logprobs=3)
        remote = RemoteEngine(server.url)
        remote.check()
        events = list(remote.generate(TurnRequest(messages, SamplingParams(), max_tokens=N, top_logprobs=3)))
        remote.close()
        theirs, shown_there = _window_turn(qtbot, _remote_window(qtbot, make_window, server.url, **window), QUESTION)
    assert len(cli["logprobs"]) == len(cli["token_ids"]) == r.usage.completion_tokens > 0
    assert [e["id"] for e in cli["logprobs"]] == cli["token_ids"]
    assert [c.model_dump() for c in r.choices[0].logprobs.content] == cli["logprobs"]
    expected = [(e["id"], TokenLogprob(e["logprob"], tuple((a["id"], a["logprob"]) for a in e["top_logprobs"])))
                for e in cli["logprobs"]]
    assert [(e.token, e.value) for e in events if isinstance(e, Logprob)] == expected == events[-1].logprobs
    assert all(len(e["top_logprobs"]) == 3 for e in cli["logprobs"])
    # the window keeps and shows the same tokens, values and alternatives, on either engine
    assert mine.logprobs == theirs.logprobs == expected
    assert shown_here.stats[STATS_KEY] == shown_there.stats[STATS_KEY] == compact(cli["logprobs"])
    panel = local.chat_view.widgets[-1].probs
    assert panel.isVisible() and panel.tokens_label.text().count("href='tok:") == len(cli["token_ids"])


#: Sampling at temperature 1 with nothing cut off: only the seed decides the draws.
SAMPLED = dict(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0)


@pytest.mark.slow
@pytest.mark.parametrize("container", FAMILIES, indirect=True)
def test_a_seed_gives_the_same_sampled_answer_in_every_front_end(container, capsys, qtbot, make_window):
    """`ferry run --temp 1 --seed 7`, the server (openai client, seed=7), the
    remote engine, and the window (its Seed setting) on the local engine and on
    that server draw the same tokens; Regenerate repeats them; other seeds draw
    otherwise."""
    from app.chat.turn import TurnRequest
    from app.engine.remote import RemoteEngine
    from app.sampling import SamplingParams

    family, path = container
    ctx = CTX[family]
    common = ("-n", str(N), "--ctx", str(ctx), "--threads", "2", "--temp", "1.0", "--json")
    cli = {seed: _cli_json(capsys, "run", str(path), QUESTION, *common, "--seed", str(seed))["token_ids"]
           for seed in (7, 8, 9)}
    assert cli[7] and (cli[8] != cli[7] or cli[9] != cli[7]), "the seed changes nothing"
    local = make_window(path, context_length=ctx, max_tokens=N, seed=7, **SAMPLED)
    mine, _ = _window_turn(qtbot, local, QUESTION)
    done: list = []
    on_gui(local.worker.worker.turn_done, done.append)
    with qtbot.waitSignal(local.answer_finished, timeout=LONG):
        local.regenerate(local.chat.visible()[-1].id)
    qtbot.waitUntil(lambda: bool(done), timeout=10000)
    messages = [{"role": "user", "content": QUESTION}]
    with _served(path, ctx) as (server, client):
        r = client.chat.completions.create(model=server.model_id, messages=messages, max_tokens=N, temperature=1.0,
                                           top_p=1.0, seed=7, logprobs=True, top_logprobs=0)
        remote = RemoteEngine(server.url)
        remote.check()
        end = list(remote.generate(TurnRequest(messages, SamplingParams(temperature=1.0, seed=7), max_tokens=N,
                                               top_logprobs=0)))[-1]
        remote.close()
        theirs, _ = _window_turn(qtbot, _remote_window(qtbot, make_window, server.url, max_tokens=N, seed=7,
                                                       **SAMPLED), QUESTION)
    assert mine.token_ids == done[-1].token_ids == cli[7]
    assert [c.model_extra["id"] for c in r.choices[0].logprobs.content] == cli[7]
    assert end.token_ids == cli[7]
    assert (theirs.content, theirs.reasoning, theirs.completion_tokens) == \
        (mine.content, mine.reasoning, len(mine.token_ids))


@pytest.mark.slow
@pytest.mark.parametrize("container", FAMILIES, indirect=True)
def test_docs_ask_on_a_server_gives_the_local_answer(container, capsys, tmp_path, kr, monkeypatch):
    """`ferry docs ask URL COLLECTION QUESTION`: retrieval on this machine, the
    answer from the server (loopback): the same passages, prompt, answer and
    citations as `ferry docs ask MODEL ...`; the flags that set up a local
    model are refused with a server."""
    family, path = container
    ctx = CTX[family]
    monkeypatch.setenv("FERRY_HOME", str(tmp_path / "home"))
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "boathouse.txt").write_text(NOTE + "\n")
    assert ferry(["docs", "add", "home", str(notes), "--json"]) == 0
    ask = ("home", QUESTION, "-n", str(N), "--context-tokens", "900", "--json", "--logprobs", "2")
    here = _cli_json(capsys, "docs", "ask", str(path), *ask, "--ctx", str(ctx), "--threads", "2")
    with _served(path, ctx) as (server, _client):
        there = _cli_json(capsys, "docs", "ask", server.url, *ask)
        held = list(server.queue.session.tokens)
        capsys.readouterr()
        assert ferry(["docs", "ask", server.url, *ask, "--threads", "2"]) == 1
        assert "is a server" in capsys.readouterr().err
    assert there["prefix_state"] == "remote" and there["whole_collection"]
    assert held[:len(here["prompt_ids"])] == here["prompt_ids"]     # the server read the local prompt
    assert held[len(here["prompt_ids"]):] == here["tokens"][:len(held) - len(here["prompt_ids"])]
    for key in ("text", "model_text", "reasoning", "citations", "passages", "reason", "tool_calls", "logprobs"):
        assert there[key] == here[key], key
    assert [e["id"] for e in here["logprobs"]] == here["tokens"] == there["tokens"]
    assert all(len(e["top_logprobs"]) == 2 for e in here["logprobs"])


@pytest.mark.slow
@pytest.mark.parametrize("container", FAMILIES, indirect=True)
def test_a_stop_sequence_ends_the_answer_in_every_front_end(container, capsys, qtbot, make_window, tmp_path, kr,
                                                            monkeypatch):
    """A stop sequence taken from the middle of the greedy answer ends it just
    before that text in `ferry run --stop`, the server (openai client, stop=),
    the window's Stop-at setting on the local engine and on that server, and
    `ferry docs ask --stop` (the same on a server's URL). A family whose answer
    here is all thinking gets a stop from its trace, which must not cut it."""
    family, path = container
    ctx = CTX[family]
    n = 16
    run = ("-n", str(n), "--ctx", str(ctx), "--threads", "2", "--no-think", "--json")
    base = _cli_json(capsys, "run", str(path), QUESTION, *run)
    cut = len(base["text"].strip()) >= 4
    source = base["text"] if cut else base["reasoning"]
    assert len(source) >= 4, f"{family} wrote nothing to stop at"
    stop = source[len(source) // 2:len(source) // 2 + 3]
    want = (source[:source.find(stop)], base["reasoning"]) if cut else (base["text"], base["reasoning"])
    cli = _cli_json(capsys, "run", str(path), QUESTION, *run, "--stop", stop, "--stop", "never written")
    assert (cli["text"], cli["reasoning"]) == want
    window = dict(max_tokens=n, thinking=False, stop=[stop, "never written"])
    local, _ = _window_turn(qtbot, make_window(path, context_length=ctx, **window), QUESTION)
    with _served(path, ctx) as (server, client):
        r = client.chat.completions.create(model=server.model_id, messages=[{"role": "user", "content": QUESTION}],
                                           max_tokens=n, temperature=0, stop=[stop, "never written"],
                                           extra_body={"chat_template_kwargs": {"enable_thinking": False}})
        there, _ = _window_turn(qtbot, _remote_window(qtbot, make_window, server.url, **window), QUESTION)
    msg = r.choices[0].message
    assert (msg.content or "", msg.model_extra.get("reasoning_content") or "") == want
    assert (local.content, local.reasoning) == (there.content, there.reasoning) == want
    assert local.token_ids == cli["token_ids"] and len(cli["token_ids"]) <= len(base["token_ids"])
    if cut:
        assert r.choices[0].finish_reason == "stop" and len(cli["token_ids"]) < n
    # `docs ask` takes the same option
    monkeypatch.setenv("FERRY_HOME", str(tmp_path / "home"))
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "boathouse.txt").write_text(NOTE + "\n")
    assert ferry(["docs", "add", "home", str(notes), "--json"]) == 0
    ask = ("docs", "ask", str(path), "home", QUESTION, "-n", str(n), "--ctx", str(ctx), "--threads", "2",
           "--no-think", "--json")
    docs = _cli_json(capsys, *ask)
    if docs["model_text"].strip():
        stop = docs["model_text"][len(docs["model_text"]) // 2:][:3]
        stopped = _cli_json(capsys, *ask, "--stop", stop)
        assert stopped["model_text"] == docs["model_text"][:docs["model_text"].find(stop)]


@pytest.mark.slow
@pytest.mark.parametrize("container", FAMILIES, indirect=True)
def test_repetition_penalties_are_the_same_in_every_front_end(container, capsys, qtbot, make_window):
    """Frequency and presence penalties (greedy): `ferry run`, the server
    (openai client), and the window's Repetition settings on the local engine
    and on that server write the same tokens; on a family whose plain answer
    repeats a token, the penalties change it."""
    family, path = container
    ctx = CTX[family]
    run = ("-n", str(N), "--ctx", str(ctx), "--threads", "2", "--json")
    plain = _cli_json(capsys, "run", str(path), QUESTION, *run)["token_ids"]
    cli = _cli_json(capsys, "run", str(path), QUESTION, *run, "--frequency-penalty", "1.5",
                    "--presence-penalty", "1.0")
    window = dict(max_tokens=N, frequency_penalty=1.5, presence_penalty=1.0)
    mine, _ = _window_turn(qtbot, make_window(path, context_length=ctx, **window), QUESTION)
    with _served(path, ctx) as (server, client):
        r = client.chat.completions.create(model=server.model_id, messages=[{"role": "user", "content": QUESTION}],
                                           max_tokens=N, temperature=0, frequency_penalty=1.5, presence_penalty=1.0,
                                           logprobs=True, top_logprobs=0)
        theirs, _ = _window_turn(qtbot, _remote_window(qtbot, make_window, server.url, **window), QUESTION)
    assert mine.token_ids == cli["token_ids"] == [c.model_extra["id"] for c in r.choices[0].logprobs.content]
    assert (theirs.content, theirs.reasoning) == (mine.content, mine.reasoning) == (cli["text"], cli["reasoning"])
    if len(set(plain)) < len(plain):
        assert cli["token_ids"] != plain, "the penalties changed nothing"


def _attach(qtbot, w, path: Path) -> None:
    """Attach ``path`` to the window's conversation (the documents panel, indexing in the background)."""
    panel = w.open_documents()
    qtbot.addWidget(panel)
    with qtbot.waitSignal(panel.indexing_finished, timeout=LONG):
        panel.add_paths([str(path)])
    panel.close()


@pytest.mark.slow
@pytest.mark.parametrize("container", FAMILIES, indirect=True)
def test_attached_documents_give_docs_asks_turn(container, capsys, qtbot, make_window, tmp_path, kr, monkeypatch):
    """A note attached in the window (Attach…) and the same note asked about
    with `ferry docs ask`: the same prompt ids and answer, the window restoring
    the passages' state `docs ask` saved; and the window on a
    remote engine (a Ferry server) with the note attached gives that answer
    too (its passages chosen here, sent to the server)."""
    family, path = container
    ctx = CTX[family]
    monkeypatch.setenv("FERRY_HOME", str(tmp_path / "home"))
    note = tmp_path / "notes" / "boathouse.txt"
    note.parent.mkdir()
    note.write_text(NOTE + "\n")
    assert ferry(["docs", "add", "home", str(note.parent), "--json"]) == 0
    docs = _cli_json(capsys, "docs", "ask", str(path), "home", QUESTION, "-n", str(N), "--ctx", str(ctx),
                     "--threads", "2", "--json")
    w = make_window(path, tmp_path / "local.sqlite3", max_tokens=N, context_length=ctx)
    _attach(qtbot, w, note)
    mine, _ = _window_turn(qtbot, w, QUESTION)
    assert [c.passage for c in w.controller.citations[w.chat.visible()[-1].id]] == [p["passage"] for p in docs["passages"]]
    assert mine.prompt_ids == docs["prompt_ids"] and mine.token_ids == docs["tokens"]
    assert (mine.content, mine.reasoning) == (docs["model_text"], docs["reasoning"])
    # the one prefill path: the window restored the passages `docs ask` read and saved
    assert docs["prefix_state"] == "saved" and mine.prefix_state == "restored"
    with _served(path, ctx) as (server, _client):
        there = _remote_window(qtbot, make_window, server.url, max_tokens=N)
        _attach(qtbot, there, note)
        theirs, _ = _window_turn(qtbot, there, QUESTION)
        held = list(server.queue.session.tokens)
    assert held[:len(docs["prompt_ids"])] == docs["prompt_ids"]      # the server read the same prompt
    assert (theirs.content, theirs.reasoning) == (docs["model_text"], docs["reasoning"])


def test_cli_logprobs_need_json(capsys, tmp_path):
    assert ferry(["run", str(tmp_path / "no-model"), QUESTION, "--logprobs", "2"]) == 2
    assert "--logprobs needs --json" in capsys.readouterr().err
    assert ferry(["docs", "ask", str(tmp_path / "no-model"), "home", QUESTION, "--logprobs", "2"]) == 2
    assert "--logprobs needs --json" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        ferry(["run", str(tmp_path / "no-model"), QUESTION, "--json", "--logprobs", "21"])


def test_cli_refuses_bad_sampling_options_before_loading(capsys, tmp_path):
    """Out-of-range --stop and penalties are refused (exit 2) before any model is opened: the model here does not
    exist, so reaching it would be another error."""
    missing = str(tmp_path / "no-model")
    stops = [a for s in "abcde" for a in ("--stop", s)]
    for argv in (["run", missing, QUESTION, *stops], ["run", missing, QUESTION, "--stop", ""],
                 ["run", missing, QUESTION, "--presence-penalty", "3"], ["chat", missing, "--frequency-penalty", "-9"]):
        capsys.readouterr()
        assert ferry(argv) == 2, argv
        err = capsys.readouterr().err
        assert "--stop takes up to 4" in err or "must be between -2 and 2" in err, err


def test_the_cli_shows_a_long_prompts_progress_on_a_terminal_only():
    """`ferry run`, `chat` and `docs ask` rewrite one stderr line while a long prompt is read (a terminal only)."""
    import io

    from app.cli.common import PromptMeter

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    from app.api import ImageProgress

    tty, pipe = Terminal(), io.StringIO()
    for stream in (tty, pipe):
        meter = PromptMeter(stream=stream)
        meter.image(ImageProgress(1, 1, 12, 27).label)   # an image in the vision tower first
        for done in (32, 64, 96):
            meter.update(done, 96)
    assert pipe.getvalue() == ""
    out = tty.getvalue()
    assert out.startswith("\r\x1b[K[Reading the image: block 12 of 27]")
    assert "[Reading the prompt: 32 of 96 tokens" in out and "64 of 96" in out and out.endswith("\r\x1b[K")
    short = Terminal()
    PromptMeter(stream=short).update(20, 20)        # read in one chunk: nothing shown
    assert short.getvalue() == ""
