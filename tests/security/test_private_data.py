"""Issue 18, items 2 and 7: data at rest on a shared machine. What Ferry
writes is private to the user from its creation; a new passphrase must be
hard to guess; user text in the settings is encrypted like the history;
FERRY_PASSPHRASE works whatever the keyring backend."""
from __future__ import annotations

import json
import os
import stat
import subprocess
import sys

import keyring
import pytest
from keyring.backends import null

from app.store import settings as settings_mod
from app.store.crypto import EphemeralKeys, KeychainKeys, PassphraseKeys, keychain_problem
from app.store.history import HistoryStore, stored_key_kind
from app.store.passphrase import LOST_PASSPHRASE_WARNING, passphrase_problem
from app.store.private import is_private, private_dir, private_file, private_models_dir, private_umask, write_private
from tests.conftest import REPO

STRONG = "tractor violet harbour sonnet"


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.fixture
def open_umask():
    old = os.umask(0o022)   # what most desktops use: 0644 files, 0755 folders
    yield
    os.umask(old)


def test_private_helpers(tmp_path, open_umask):
    d = private_dir(tmp_path / "a" / "b")
    assert mode(d) == 0o700 and mode(d.parent) == 0o700
    with private_file(d / "f.txt") as f:
        # Private before the first byte is written, not fixed up afterwards.
        assert mode(d / "f.txt") == 0o600
        f.write("x")
    write_private(d / "g.json", "{}")
    assert mode(d / "g.json") == 0o600 and (d / "g.json").read_text() == "{}"
    with private_umask():
        (d / "lib.txt").write_text("a library's own file")
    assert mode(d / "lib.txt") == 0o600
    (d / "old.txt").write_text("made before")
    os.chmod(d / "old.txt", 0o644)
    with private_file(d / "old.txt", "a") as f:
        f.write("more")
    assert mode(d / "old.txt") == 0o600 and is_private(d / "old.txt")
    assert os.umask(0o022) == 0o022      # the umask is restored


def test_only_ferrys_own_existing_folders_are_narrowed(tmp_path, open_umask):
    from app import paths

    mine = tmp_path / "my documents"
    mine.mkdir()
    os.chmod(mine, 0o755)
    private_dir(mine)
    assert mode(mine) == 0o755           # a folder of the user's keeps its mode
    data = paths.data_dir()
    data.mkdir(parents=True, exist_ok=True)
    os.chmod(data, 0o755)                # as an older Ferry left it
    private_dir(data / "states")
    private_dir(data)
    assert mode(data) == 0o700 and mode(data / "states") == 0o700


def test_history_documents_and_settings_are_private(tmp_path, open_umask, kr):
    from app.documents.store import DocumentStore

    home = tmp_path / "home" / "Ferry"
    store = HistoryStore(home / "history.sqlite3", KeychainKeys())
    cid = store.create_conversation("secret title")
    store.add_message(cid, None, "user", "a private question")
    docs = DocumentStore(home / "history.sqlite3", KeychainKeys())
    note = tmp_path / "n.txt"
    note.write_text("The boiler was serviced in March by Anna.")
    docs.add("home", [note])
    settings_mod.save(settings_mod.Settings(system_prompt="be brief"), home / "config" / "settings.json",
                      cipher=store.cipher)
    for p in home.rglob("*"):
        assert mode(p) & 0o077 == 0, (p, oct(mode(p)))
    assert mode(home) == 0o700
    assert any(p.name.endswith("-wal") for p in home.iterdir())   # SQLite's own files are covered too
    docs.close()
    store.close()


def test_existing_world_readable_history_is_narrowed(tmp_path, open_umask):
    path = tmp_path / "h.sqlite3"
    HistoryStore(path, EphemeralKeys()).close()
    os.chmod(path, 0o644)
    os.chmod(tmp_path, 0o755)
    keys = PassphraseKeys(STRONG)
    HistoryStore(tmp_path / "p.sqlite3", keys).close()
    os.chmod(tmp_path / "p.sqlite3", 0o644)
    HistoryStore(tmp_path / "p.sqlite3", keys).close()
    assert mode(tmp_path / "p.sqlite3") == 0o600


@pytest.mark.parametrize("weak", ["1234", "password1", "ferry2026", "qwertyuiop", "Anna1985", "aaaaaaaaaaaa"])
def test_weak_passphrases_are_refused_with_an_explanation(weak):
    why = passphrase_problem(weak)
    assert why and "guess" in why and "10 billion" in why


@pytest.mark.parametrize("strong", [STRONG, "K7#q!vZ2p@Lm9$wX"])
def test_strong_passphrases_are_accepted(strong):
    assert passphrase_problem(strong) is None


def test_unlock_refuses_a_weak_new_passphrase_and_warns(tmp_path, monkeypatch):
    from app.ui.unlock import open_history

    monkeypatch.setattr(keyring, "get_keyring", lambda: null.Keyring())
    asked = []

    def prompt(mode, message):
        asked.append((mode, message))
        return "1234" if len(asked) == 1 else STRONG

    store = open_history(tmp_path / "h.sqlite3", prompt=prompt)
    store.close()
    assert LOST_PASSPHRASE_WARNING in asked[0][1]
    assert "too easy to guess" in asked[1][1]
    assert stored_key_kind(tmp_path / "h.sqlite3") == "passphrase"


def test_the_dialog_refuses_a_weak_passphrase(qtbot):
    from app.ui.unlock import PassphraseDialog

    d = PassphraseDialog("new", "Choose a passphrase. " + LOST_PASSPHRASE_WARNING)
    qtbot.addWidget(d)
    d.field.setText("1234")
    d.confirm.setText("1234")
    d._ok()
    assert d.error.isVisibleTo(d) and "too easy to guess" in d.error.text()
    assert d.result() != d.DialogCode.Accepted
    d.field.setText(STRONG)
    d.confirm.setText(STRONG)
    d._ok()
    assert d.result() == d.DialogCode.Accepted


def test_system_prompt_is_encrypted_in_settings(tmp_path):
    store = HistoryStore(tmp_path / "h.sqlite3", EphemeralKeys())
    path = tmp_path / "settings.json"
    settings_mod.save(settings_mod.Settings(system_prompt="You are my lawyer; the case is Doe v. Roe",
                                            temperature=0.3), path, cipher=store.cipher)
    raw = path.read_text()
    assert "lawyer" not in raw and "Doe" not in raw
    assert json.loads(raw)["temperature"] == 0.3
    back = settings_mod.load(path, cipher=store.cipher)
    assert back.system_prompt == "You are my lawyer; the case is Doe v. Roe" and back.temperature == 0.3
    # Without the key the text is not readable, and saving keeps it as it was.
    assert settings_mod.load(path).system_prompt == ""
    settings_mod.save(settings_mod.Settings(temperature=0.9), path)
    assert settings_mod.load(path, cipher=store.cipher).system_prompt.startswith("You are my lawyer")
    # Another key cannot read it.
    other = HistoryStore(tmp_path / "o.sqlite3", EphemeralKeys())
    assert settings_mod.load(path, cipher=other.cipher).system_prompt == ""
    store.close()
    other.close()


def test_plain_system_prompt_from_an_older_file_is_sealed_on_save(tmp_path):
    store = HistoryStore(tmp_path / "h.sqlite3", EphemeralKeys())
    path = tmp_path / "settings.json"
    path.write_text(json.dumps({"system_prompt": "old plain text", "top_k": 7}))
    s = settings_mod.load(path, cipher=store.cipher)
    assert s.system_prompt == "old plain text" and s.top_k == 7
    settings_mod.save(s, path, cipher=store.cipher)
    assert "old plain text" not in path.read_text()
    store.close()


def test_null_keyring_is_a_keychain_problem(monkeypatch):
    monkeypatch.setattr(keyring, "get_keyring", lambda: null.Keyring())
    assert "null" in keychain_problem()


def _docs_list(env_extra: dict, tmp_path):
    env = {**os.environ, "FERRY_HOME": str(tmp_path / "home"), "PYTHON_KEYRING_BACKEND": "keyring.backends.null.Keyring",
           **env_extra}
    return subprocess.run([sys.executable, "-m", "app.cli", "docs", "list"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)


def test_ferry_passphrase_works_with_the_null_keyring(tmp_path):
    res = _docs_list({"FERRY_PASSPHRASE": STRONG}, tmp_path)
    assert res.returncode == 0, res.stderr
    assert stored_key_kind(tmp_path / "home" / "ferry.db") == "passphrase"
    again = _docs_list({"FERRY_PASSPHRASE": STRONG}, tmp_path)
    assert again.returncode == 0, again.stderr
    wrong = _docs_list({"FERRY_PASSPHRASE": STRONG + "x"}, tmp_path)
    assert wrong.returncode != 0 and "Traceback" not in wrong.stderr


def test_a_weak_ferry_passphrase_does_not_create_a_history(tmp_path):
    res = _docs_list({"FERRY_PASSPHRASE": "1234"}, tmp_path)
    assert res.returncode != 0 and "too easy to guess" in res.stderr and "Traceback" not in res.stderr
    assert not (tmp_path / "home" / "ferry.db").exists() and not (tmp_path / "home" / "history.sqlite3").exists()


def test_every_setting_that_can_hold_user_text_is_sealed_or_known_to_be_plain():
    """A new setting holding text (presets, per-model prompts...) must join
    settings.PRIVATE_FIELDS, or be added here with the reason it is not the
    user's own words."""
    import dataclasses
    import typing

    plain = {"model_folders": "folder paths", "model_path": "a path", "engine": "a fixed choice", "activations": "a fixed choice",
             "remote_url": "a server address", "remote_model": "a model name",
             "export_folder": "a folder path (as model_folders)", "models_defaulted": "model paths (as model_path)",
             "context_policy": "a fixed choice"}
    hints = typing.get_type_hints(settings_mod.Settings)
    for f in dataclasses.fields(settings_mod.Settings):
        holds_text = "str" in str(hints[f.name]) or "dict" in str(hints[f.name]) or "list" in str(hints[f.name])
        if holds_text:
            assert f.name in settings_mod.PRIVATE_FIELDS or f.name in plain, \
                f"settings.{f.name} may hold user text: add it to PRIVATE_FIELDS"


def test_the_models_folder_and_library_file_are_private(tmp_path, open_umask, monkeypatch):
    """docs/SECURITY.md: the models folder 0700 and library.json 0600 — created so by the wizard, the
    converter and `ferry get`, and an older 0755 folder is narrowed when the library lists it."""
    from app import paths
    from app.convert.convert import convert
    from app.library import Library
    from tests.tiny_models import build

    monkeypatch.setenv("FERRY_HOME", str(tmp_path / "home"))
    assert mode(private_models_dir()) == 0o700 and mode(paths.data_dir()) == 0o700
    build("llama", tmp_path / "ckpt", seed=5)
    out = convert(tmp_path / "ckpt", paths.models_dir() / "tiny")
    assert mode(out) == 0o700
    lib = Library()
    lib.mark_used(out)
    assert mode(lib.state_file) == 0o600
    os.chmod(paths.models_dir(), 0o755)          # as an older version left it
    os.chmod(paths.data_dir(), 0o755)
    assert [e.name for e in lib.entries()] == ["tiny"]
    assert mode(paths.models_dir()) == 0o700 and mode(paths.data_dir()) == 0o700
