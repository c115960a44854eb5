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
    d.field.setText("tractor violet harbour sonnet")
    d.confirm.setText("tractor violet harbour sonnet")
    d._ok()
    assert d.result() == d.DialogCode.Accepted and d.passphrase() == "tractor violet harbour sonnet"
