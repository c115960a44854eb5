"""GUI test fixtures: offscreen Qt, an in-memory keychain, windows on real
engines (the demo model and tiny converted models)."""
from __future__ import annotations

import gc
import json
import os

os.environ["QT_QPA_PLATFORM"] = "offscreen"

from pathlib import Path

import pytest

from app.convert.convert import convert
from app.model import Finished, LoadedModel, Token
from app.sampling import SamplingParams
from app.store.crypto import KeychainKeys
from app.store.history import HistoryStore
from app.store.settings import Settings
from tests.tiny_models import build

THINK_TEMPLATE = ("{% for m in messages %}{% if m.role == 'user' %}w3 {{ m.content }} w4 "
                  "{% else %}w5 {{ m.content }} w6 {% endif %}{% endfor %}"
                  "{% if add_generation_prompt %}w5 <think>{% endif %}")
THINK_PROMPT = "w10 w11 w12"




def _word_tokenizer(ckpt: Path, renames: dict[int, str]) -> None:
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers

    vocab = {f"w{i}": i for i in range(96)}
    for i, word in renames.items():
        del vocab[f"w{i}"]
        vocab[word] = i
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_tokens([AddedToken(w, special=False, normalized=False) for w in renames.values()])
    tok.save(str(ckpt / "tokenizer.json"))
    (ckpt / "tokenizer_config.json").write_text(json.dumps(
        {"add_bos_token": False, "eos_token": "w2", "chat_template": THINK_TEMPLATE}))


@pytest.fixture(scope="session")
def tiny_chat(tmp_path_factory) -> Path:
    """A tiny random llama with a chat template (fast: for UI plumbing tests)."""
    root = tmp_path_factory.mktemp("tiny_chat")
    build("llama", root / "ckpt", seed=3)
    _word_tokenizer(root / "ckpt", {90: "<think>"})
    return convert(root / "ckpt", root / "chat.ferry")


@pytest.fixture(scope="session")
def thinking_model(tmp_path_factory, tiny_chat) -> tuple[Path, int]:
    """A tiny model whose generation prompt opens <think> and whose greedy
    answer to THINK_PROMPT contains </think> after a few tokens.

    The random model's greedy token ids do not depend on the tokenizer's
    spelling, so we run it once, pick a token it writes at position >= 6 that it
    has not written before, and respell that id as "</think>". Returns the
    container and how many tokens come before the </think>."""
    model = LoadedModel(tiny_chat)
    ids = model.encode_chat([{"role": "user", "content": THINK_PROMPT}])
    end = None
    for ev in model.generate(model.new_session(256), ids, SamplingParams(), max_tokens=60):
        if isinstance(ev, Finished):
            end = ev
    model.close()
    out = end.tokens
    pick = next(i for i in range(6, len(out)) if out[i] not in out[:i] and out[i] not in ids and out[i] != 90)
    root = tmp_path_factory.mktemp("thinking")
    build("llama", root / "ckpt", seed=3)
    _word_tokenizer(root / "ckpt", {90: "<think>", out[pick]: "</think>"})
    return convert(root / "ckpt", root / "think.ferry"), pick


_relays: list = []


def on_gui(signal, fn) -> None:
    from app.ui.worker import on_gui as relay

    _relays.append(relay(signal, fn))


def drop(target, path, at=(200, 200)):
    """Drag ``path`` over ``target`` and drop it there (as the platform's drag and drop delivers it);
    the drop event, or the drag-enter one when that was refused."""
    from PySide6.QtCore import QMimeData, QPoint, QPointF, Qt, QUrl
    from PySide6.QtGui import QDragEnterEvent, QDropEvent
    from PySide6.QtWidgets import QApplication

    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(str(path))])
    args = (Qt.DropAction.CopyAction, mime, Qt.MouseButton.LeftButton, Qt.KeyboardModifier.NoModifier)
    enter = QDragEnterEvent(QPoint(*at), *args)
    QApplication.sendEvent(target, enter)
    if not enter.isAccepted():
        return enter
    ev = QDropEvent(QPointF(*at), *args)
    QApplication.sendEvent(target, ev)
    return ev


def quick_settings(**kw) -> Settings:
    return Settings(**{"temperature": 0.0, "max_tokens": 12, "context_length": 2048, **kw})


@pytest.fixture
def make_window(qtbot, tmp_path, memory_keyring):
    """make_window(model, db=None, **settings) -> a loaded MainWindow."""
    from app.ui.main_window import MainWindow

    made = []

    def make(model: Path | None, db: Path | None = None, **settings):
        store = HistoryStore(db or tmp_path / "history.sqlite3", KeychainKeys())
        w = MainWindow(store, quick_settings(**settings), persist_settings=False)
        w.resize(1100, 760)
        w.show()
        made.append(w)
        if model is not None:
            with qtbot.waitSignal(w.model_loaded, timeout=60000):
                w.load_model(model)
        return w

    yield make
    for w in made:
        close_window(w)


def close_window(w) -> None:
    """Delete the window on the GUI thread now. (Left to Python's garbage
    collector, a widget could be destroyed on the engine's thread.)"""
    from PySide6.QtCore import QCoreApplication, QEvent
    from shiboken6 import isValid

    if not isValid(w):
        return
    w.shutdown()
    w.store.close()
    w.hide()
    w.deleteLater()
    QCoreApplication.sendPostedEvents(None, QEvent.Type.DeferredDelete)
    gc.collect()


def reference_answer(container: Path, messages: list[dict], max_tokens: int) -> tuple[str, list[str]]:
    """What the engine itself answers (greedy): the whole text and its token pieces."""
    model = LoadedModel(container)
    pieces, end = [], None
    from app.chat.turn import ChatFormat, TurnRequest

    ids = ChatFormat(model).prepare(TurnRequest(messages), n_ctx=model.engine.info.max_ctx).prompt
    for ev in model.generate(model.new_session(2048 if model.engine.info.max_ctx >= 2048 else 0), ids,
                             SamplingParams(), max_tokens=max_tokens):
        if isinstance(ev, Token):
            pieces.append(ev.text)
        elif isinstance(ev, Finished):
            end = ev
    model.close()
    return end.text, pieces
