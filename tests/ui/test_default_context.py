"""The context a session opens with when nobody asks for one: 4096 tokens, or the
model's trained length when that is shorter (``app.context.session_context``, the
one rule). A model trained for 256 tokens (the tiny Kimi-Linear) opens and answers
at its defaults in every front end: `ferry run`, `ferry docs ask`, `ferry info`,
`ferry plan`, `ferry serve` (through the openai client) and the window; a context
the user asks for beyond the model's length is refused with a clear message."""
from __future__ import annotations

import json

import pytest

from app.cli import main as ferry
from app.context import DEFAULT_CONTEXT, session_context
from app.convert.convert import convert
from app.engine.binding import container_plan
from app.memory.plan import plan_container
from tests.ui.test_front_end_matrix import PLAIN_CHAT

TRAINED = 256      #: tests/kimi/tiny_kimi.py's max_position_embeddings


def test_the_rule():
    assert session_context(None, 256) == 256                     # not asked for: the model's shorter length
    assert session_context(None, 131072) == DEFAULT_CONTEXT      # or the default
    assert session_context(None, 0) == DEFAULT_CONTEXT           # (length not known yet: the default)
    assert session_context(0, 256) == 256                        # 0: the whole context
    assert session_context(0, 0) == 0                            # (left to the engine)
    assert session_context(1024, 256) == 1024                    # asked for: passed on, for the engine to refuse
    assert session_context(512, 131072) == 512


@pytest.fixture(scope="module")
def short_model(tmp_path_factory):
    """The tiny Kimi-Linear (trained length 256), with a plain chat template."""
    from tests.kimi.tiny_kimi import build

    root = tmp_path_factory.mktemp("short")
    build("kimi_linear", root / "ckpt")
    cfg = root / "ckpt" / "tokenizer_config.json"
    cfg.write_text(json.dumps({**json.loads(cfg.read_text()), "chat_template": PLAIN_CHAT}))
    return convert(root / "ckpt", root / "short.ferry", trunk_format="f32", expert_format="f32")


def _json(capsys, *argv: str) -> dict:
    capsys.readouterr()
    code = ferry(list(argv))
    out, err = capsys.readouterr()
    assert code == 0, err
    return json.loads(out)


def test_the_plan_is_for_the_context_the_model_has(short_model):
    assert container_plan(short_model, DEFAULT_CONTEXT).n_ctx == TRAINED   # the engine says what it planned for
    assert plan_container(short_model, DEFAULT_CONTEXT).n_ctx == TRAINED
    assert plan_container(short_model, 0).n_ctx == TRAINED
    assert plan_container(short_model, 128).n_ctx == 128


@pytest.mark.slow
def test_every_front_end_opens_a_short_model_at_its_defaults(short_model, capsys, tmp_path, monkeypatch, kr,
                                                             qtbot, make_window):
    monkeypatch.setenv("FERRY_HOME", str(tmp_path / "home"))
    path = str(short_model)
    assert _json(capsys, "plan", path, "--json")["n_ctx"] == TRAINED
    assert _json(capsys, "info", path, "--json", "--threads", "2")["plan"]["n_ctx"] == TRAINED
    run = _json(capsys, "run", path, "Hello there", "-n", "3", "--threads", "2", "--json")
    assert run["tokens"] == 3 and run["prompt_ids"]
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "door.txt").write_text("The boathouse door is green.\n")
    assert ferry(["docs", "add", "home", str(notes), "--json"]) == 0
    docs = _json(capsys, "docs", "ask", path, "home", "What colour is the door?", "-n", "3", "--threads", "2",
                 "--context-tokens", "100", "--json")
    assert len(docs["tokens"]) == 3
    # asked for beyond the model's length: a clear error, no traceback
    capsys.readouterr()
    assert ferry(["run", path, "Hello", "-n", "1", "--ctx", "4096", "--threads", "2"]) != 0
    err = capsys.readouterr().err
    assert "4096" in err and "256" in err and "Traceback" not in err

    # the server, at its defaults, through the openai client
    from tests.server.conftest import start_ferry_serve

    served = start_ferry_serve(short_model, tmp_path, "--threads", "2", "--max-tokens", "3", ctx=None,
                               env={"FERRY_HOME": str(tmp_path / "home"), "FERRY_SHARE": "0"})
    try:
        client = served.client()
        card = client.models.list().data[0]
        assert card.model_extra["max_model_len"] == TRAINED
        r = client.chat.completions.create(model=card.id, messages=[{"role": "user", "content": "Hello"}],
                                           max_tokens=3, temperature=0)
        assert r.usage.completion_tokens == 3
    finally:
        served.stop()

    # the window, at its default context setting
    w = make_window(short_model, context_length=DEFAULT_CONTEXT)
    assert w.worker.worker.service.session.n_ctx == TRAINED
