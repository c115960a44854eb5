"""Opening the encrypted history: the OS keychain when there is one, a
passphrase when there is not (or when the history was made with one). The
history is never opened or written without a key.

``FERRY_PASSPHRASE`` is honoured as the CLI honours it, by the same function
(``app.store.passphrase.environment_keys``): when set, it is the passphrase
of a passphrase history or of a new one (whatever the keychain), nothing is
asked, and what the CLI refuses is refused here with the same words (a weak
passphrase for a new history, a wrong one, a throw-away-key history)."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Callable

from PySide6.QtWidgets import QDialog, QDialogButtonBox, QLabel, QLineEdit, QVBoxLayout

from app.documents.store import LEGACY_PARTS   # an older Ferry's documents move with its history
from app.store.crypto import KeychainKeys, KeyUnavailable, PassphraseKeys, WrongKey, keychain_problem
from app.store.history import HistoryStore, default_path, stored_key_kind
from app.store.passphrase import ENVIRONMENT, LOST_PASSPHRASE_WARNING, environment_keys, passphrase_problem

#: (mode, message) -> passphrase, or None when the user gives up.
#: mode is "new" (choose a passphrase) or "unlock" (type the existing one).
PassphrasePrompt = Callable[[str, str], "str | None"]


class PassphraseDialog(QDialog):
    def __init__(self, mode: str, message: str, parent=None):
        super().__init__(parent)
        self.mode = mode
        self.setWindowTitle("Unlock your history" if mode == "unlock" else "Protect your history")
        lay = QVBoxLayout(self)
        self.message = QLabel(message)
        self.message.setWordWrap(True)
        lay.addWidget(self.message)
        self.field = QLineEdit()
        self.field.setEchoMode(QLineEdit.EchoMode.Password)
        self.field.setAccessibleName("Passphrase")
        self.field.setPlaceholderText("Passphrase")
        lay.addWidget(self.field)
        self.confirm = QLineEdit()
        self.confirm.setEchoMode(QLineEdit.EchoMode.Password)
        self.confirm.setAccessibleName("Passphrase again")
        self.confirm.setPlaceholderText("The same passphrase again")
        self.confirm.setVisible(mode == "new")
        lay.addWidget(self.confirm)
        self.error = QLabel("")
        self.error.setStyleSheet("color: #d9534f;")
        self.error.setWordWrap(True)
        self.error.setFixedWidth(420)
        self.error.setVisible(False)
        lay.addWidget(self.error)
        for f in (self.field, self.confirm):    # a stale complaint goes as soon as the passphrase changes
            f.textChanged.connect(lambda _t: self._clear())
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel)
        buttons.accepted.connect(self._ok)
        buttons.rejected.connect(self.reject)
        lay.addWidget(buttons)
        # A word-wrapped label needs its width fixed before the dialog can
        # know its height; otherwise the message is clipped.
        self.message.setFixedWidth(420)
        self.message.setMinimumHeight(self.message.heightForWidth(420))
        self.adjustSize()

    def _ok(self) -> None:
        if not self.field.text():
            self._fail("Type a passphrase.")
        elif self.mode == "new" and self.field.text() != self.confirm.text():
            self._fail("The two passphrases differ.")
        elif self.mode == "new" and (problem := passphrase_problem(self.field.text())):
            self._fail(problem)
        else:
            self.accept()

    def _fail(self, text: str) -> None:
        self.error.setText(text)
        self.error.setMinimumHeight(self.error.heightForWidth(420))   # the dialog grows: never over the fields
        self.error.setVisible(True)
        self.adjustSize()

    def _clear(self) -> None:
        if self.error.isVisible():
            self.error.setVisible(False)
            self.adjustSize()

    def passphrase(self) -> str:
        return self.field.text()


def dialog_prompt(parent=None) -> PassphrasePrompt:
    def ask(mode: str, message: str) -> str | None:
        d = PassphraseDialog(mode, message, parent)
        return d.passphrase() if d.exec() == QDialog.DialogCode.Accepted else None
    return ask


class HistoryLocked(RuntimeError):
    """The user gave up on unlocking the history."""


def open_history(path: Path | None = None, prompt: PassphrasePrompt | None = None,
                 keychain: KeychainKeys | None = None, max_tries: int = 5, environ=None) -> HistoryStore:
    """Open the history at ``path`` (default: under the data dir): with
    ``FERRY_PASSPHRASE`` when it is set (``environ``, default the process's),
    else asking ``prompt`` for a passphrase when the keychain cannot be used."""
    path = Path(path) if path else default_path()
    keys = environment_keys(path, environ)    # raises KeyUnavailable for what it refuses
    if keys is not None:
        try:
            return HistoryStore(path, keys, legacy_parts=LEGACY_PARTS)
        except WrongKey as exc:
            raise KeyUnavailable(f"{str(exc).rstrip('.')} ({ENVIRONMENT} is set: set it to the passphrase of "
                                 f"{path}, or unset it to type the passphrase when Ferry starts).") from None
    prompt = prompt or dialog_prompt()
    kind = stored_key_kind(path)
    if kind in (None, "keychain"):
        problem = keychain_problem()
        if problem is None:
            try:
                return HistoryStore(path, keychain or KeychainKeys(), legacy_parts=LEGACY_PARTS)
            except KeyUnavailable as exc:
                problem = str(exc)
        if kind == "keychain":
            # The key is gone with the keychain: this history cannot be read any more.
            raise KeyUnavailable(f"Your history is locked with a key from the system keychain, but {problem}. "
                                 f"It stays in {path}; Ferry cannot read it without that key.")
        message = (f"Ferry keeps your conversations encrypted. It could not use the system keychain "
                   f"({problem}), so please choose a passphrase. You will need it each time Ferry starts. "
                   + LOST_PASSPHRASE_WARNING)
        mode = "new"
    else:
        message = "Your conversations are encrypted with a passphrase. Type it to open them."
        mode = "unlock"
    for _ in range(max_tries):
        secret = prompt(mode, message)
        if not secret:
            raise HistoryLocked("no passphrase was given; the history stays locked")
        if mode == "new" and (problem := passphrase_problem(secret)):
            message = problem
            continue
        try:
            return HistoryStore(path, PassphraseKeys(secret), legacy_parts=LEGACY_PARTS)
        except WrongKey:
            time.sleep(0.2)
            message = "That passphrase does not open your history. Try again."
    raise HistoryLocked("too many wrong passphrases")


def move_aside(path: Path | None = None) -> Path:
    """Rename an unreadable history so a new one can start; returns the new name."""
    from app.store.database import set_aside

    return set_aside(Path(path) if path else default_path(), "locked", keys=False)
