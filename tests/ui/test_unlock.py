"""No usable keychain: the app asks for a passphrase and refuses a wrong one."""
from __future__ import annotations

import keyring
import pytest
from keyring.backends import fail

from app.store.crypto import KeyUnavailable, WrongKey
from app.store.history import HistoryStore, stored_key_kind
from app.store.crypto import PassphraseKeys
from app.ui.unlock import HistoryLocked, PassphraseDialog, open_history


@pytest.fixture
def no_keychain():
    before = keyring.get_keyring()
    keyring.set_keyring(fail.Keyring())
    yield
    keyring.set_keyring(before)


def test_no_keychain_asks_for_a_passphrase(no_keychain, tmp_path):
    db = tmp_path / "h.sqlite3"
    asked = []

    def prompt(mode, message):
        asked.append((mode, message))
        return "tractor violet harbour sonnet"

    store = open_history(db, prompt)
    assert asked and asked[0][0] == "new" and "keychain" in asked[0][1] and "passphrase" in asked[0][1]
    cid = store.create_conversation("secret plans")
    store.close()
    assert stored_key_kind(db) == "passphrase"

    answers = iter(["wrong one", "tractor violet harbour sonnet"])
    asked.clear()

    def prompt2(mode, message):
        asked.append((mode, message))
        return next(answers)

    store = open_history(db, prompt2)
    assert [a[0] for a in asked] == ["unlock", "unlock"]
    assert "does not open" in asked[1][1]            # the wrong passphrase was refused
    assert store.conversation(cid).title == "secret plans"
    store.close()


def test_giving_up_keeps_it_locked(no_keychain, tmp_path):
    db = tmp_path / "h.sqlite3"
    open_history(db, lambda m, t: "tractor violet harbour sonnet").close()
    with pytest.raises(HistoryLocked):
        open_history(db, lambda m, t: None)
    with pytest.raises(HistoryLocked):
        open_history(db, lambda m, t: "nope", max_tries=2)


def test_keychain_history_without_keychain_is_not_opened(tmp_path, memory_keyring):
    db = tmp_path / "h.sqlite3"
    open_history(db, lambda m, t: pytest.fail("should use the keychain")).close()
    assert stored_key_kind(db) == "keychain"
    keyring.set_keyring(fail.Keyring())
    with pytest.raises(KeyUnavailable):
        open_history(db, lambda m, t: "pw")
    with pytest.raises(WrongKey):
        HistoryStore(db, PassphraseKeys("pw"))


def test_passphrase_dialog(qtbot):
    d = PassphraseDialog("new", "choose one")
    qtbot.addWidget(d)
    d.show()
    assert d.confirm.isVisible() and d.field.accessibleName() == "Passphrase"
    qtbot.keyClicks(d.field, "abc")
    qtbot.keyClicks(d.confirm, "abd")
    d._ok()
    assert d.error.isVisible() and "differ" in d.error.text() and d.result() == 0
    d.confirm.setText("abc")
    d._ok()
    assert "too easy to guess" in d.error.text() and d.result() == 0   # the strength rule
    # the complaint never covers the fields, and goes once the passphrase changes (issue 34)
    assert d.error.geometry().top() >= d.confirm.geometry().bottom()
    assert d.error.height() >= d.error.heightForWidth(d.error.width())
    d.field.setText("tractor violet harbour sonnet")
    assert not d.error.isVisible()
    d.confirm.setText("tractor violet harbour sonnet")
    d._ok()
    assert d.result() == d.DialogCode.Accepted and d.passphrase() == "tractor violet harbour sonnet"


STRONG = "tractor violet harbour sonnet"


def _no_prompt(mode, message):
    pytest.fail(f"asked for a passphrase ({mode}) although FERRY_PASSPHRASE is set")


@pytest.mark.parametrize("keychain", ["memory", "none"])
def test_the_window_honours_ferry_passphrase_as_the_cli_does(keychain, tmp_path, monkeypatch, memory_keyring):
    """FERRY_PASSPHRASE makes a new history a passphrase one whatever the
    keychain, with nothing asked, in the window as in the CLI (one function):
    a history either one made, the other opens."""
    if keychain == "none":
        keyring.set_keyring(fail.Keyring())
    from app.cli.docs import key_provider

    db = tmp_path / "h.sqlite3"
    env = {"FERRY_PASSPHRASE": STRONG}
    store = open_history(db, _no_prompt, environ=env)
    cid = store.create_conversation("made in the window")
    store.close()
    assert stored_key_kind(db) == "passphrase"
    monkeypatch.setenv("FERRY_PASSPHRASE", STRONG)
    store = HistoryStore(db, key_provider(db))            # the CLI's key opens the window's history
    assert store.conversation(cid).title == "made in the window"
    store.close()

    db2 = tmp_path / "cli.sqlite3"
    store = HistoryStore(db2, key_provider(db2))          # and the window opens the CLI's
    cid = store.create_conversation("made by the CLI")
    store.close()
    store = open_history(db2, _no_prompt, environ=env)
    assert store.conversation(cid).title == "made by the CLI"
    store.close()


def test_the_window_refuses_what_the_cli_refuses(tmp_path, monkeypatch, memory_keyring):
    from app.cli.docs import key_provider

    db = tmp_path / "h.sqlite3"
    # a weak passphrase cannot protect a new history: the same words, and nothing is created
    with pytest.raises(KeyUnavailable, match="FERRY_PASSPHRASE cannot protect a new history.*too easy") as window:
        open_history(db, _no_prompt, environ={"FERRY_PASSPHRASE": "1234"})
    monkeypatch.setenv("FERRY_PASSPHRASE", "1234")
    with pytest.raises(KeyUnavailable) as cli:
        key_provider(db)
    assert str(window.value) == str(cli.value) and not db.exists()

    # a wrong one does not open a passphrase history, and is not taken for a reason to ask
    open_history(db, _no_prompt, environ={"FERRY_PASSPHRASE": STRONG}).close()
    with pytest.raises(KeyUnavailable, match="does not open the history.*FERRY_PASSPHRASE is set"):
        open_history(db, _no_prompt, environ={"FERRY_PASSPHRASE": STRONG + " x"})
    # unset: the dialog asks, as before
    asked = []
    open_history(db, lambda m, t: asked.append(m) or STRONG, environ={}).close()
    assert asked == ["unlock"]

    # a throw-away-key history: refused by both, nothing asked
    from app.store.crypto import EphemeralKeys

    eph = tmp_path / "eph.sqlite3"
    HistoryStore(eph, EphemeralKeys()).close()
    with pytest.raises(KeyUnavailable, match="throw-away"):
        open_history(eph, _no_prompt, environ={})
    with pytest.raises(KeyUnavailable, match="throw-away"):
        key_provider(eph)


def test_a_keychain_history_ignores_ferry_passphrase(tmp_path, monkeypatch, memory_keyring):
    """The variable is no key for a history made with the keychain: both front
    ends open it with the keychain."""
    from app.cli.docs import key_provider

    db = tmp_path / "h.sqlite3"
    open_history(db, _no_prompt, environ={}).close()
    assert stored_key_kind(db) == "keychain"
    open_history(db, _no_prompt, environ={"FERRY_PASSPHRASE": STRONG}).close()
    monkeypatch.setenv("FERRY_PASSPHRASE", STRONG)
    assert key_provider(db).kind == "keychain"
