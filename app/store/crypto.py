"""Encryption at rest for the history: AES-GCM with a 256-bit key that comes
from a *key provider*. No Qt here.

* :class:`KeychainKeys` keeps a random key in the OS keychain (``keyring``).
* :class:`PassphraseKeys` derives the key from a passphrase with scrypt; the
  salt lives in the database, never the passphrase or the key.
* :class:`EphemeralKeys` is a random key that lives only in memory (for a
  throw-away history, e.g. the screenshot run).

There is no plaintext mode: a store without a key cannot be opened.
"""
from __future__ import annotations

import base64
import os
import secrets
from typing import Protocol

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.scrypt import Scrypt

KEY_BYTES = 32
NONCE_BYTES = 12
KEYCHAIN_SERVICE = "Ferry"
KEYCHAIN_USER = "history-key"
#: scrypt cost: 2**15 * 8 * 128 bytes = 32 MiB and about a tenth of a second.
SCRYPT_N, SCRYPT_R, SCRYPT_P = 2**15, 8, 1


class KeyUnavailable(RuntimeError):
    """The key cannot be had (no usable keychain, or its key is gone)."""


class WrongKey(ValueError):
    """The key (or passphrase) does not open this history."""


class Meta(Protocol):
    """The store's small key/value table, where a provider may keep a salt."""

    def get(self, key: str) -> bytes | None: ...

    def set(self, key: str, value: bytes) -> None: ...


class KeyProvider(Protocol):
    kind: str  #: recorded in the store so that the next start knows what to ask for

    def key(self, meta: Meta) -> bytes: ...


class Cipher:
    """AES-256-GCM; every value gets a fresh nonce and is bound to ``aad``
    (the row and column it belongs to), so values cannot be swapped around."""

    def __init__(self, key: bytes):
        if len(key) != KEY_BYTES:
            raise ValueError(f"the key must be {KEY_BYTES} bytes")
        self._aead = AESGCM(key)

    def encrypt(self, text: str, aad: str) -> bytes:
        nonce = os.urandom(NONCE_BYTES)
        return nonce + self._aead.encrypt(nonce, text.encode("utf-8"), aad.encode())

    def decrypt(self, blob: bytes, aad: str) -> str:
        try:
            return self._aead.decrypt(blob[:NONCE_BYTES], blob[NONCE_BYTES:], aad.encode()).decode("utf-8")
        except InvalidTag as exc:
            raise WrongKey("this value does not decrypt with the key") from exc


def keychain_problem() -> str | None:
    """Why the OS keychain cannot be used, or None when it can."""
    try:
        import keyring
        from keyring.backends import fail
    except Exception as exc:  # pragma: no cover - keyring is a dependency
        return f"the keyring module cannot be loaded ({exc})"
    try:
        backend = keyring.get_keyring()
    except Exception as exc:
        return f"the keychain cannot be reached ({exc})"
    if isinstance(backend, fail.Keyring):
        return "no keychain backend is available on this system"
    try:
        from keyring.backends import null

        if isinstance(backend, null.Keyring):
            return "the keychain backend in use (keyring's null backend) keeps nothing"
    except Exception:
        pass
    try:
        from keyring.backends import chainer

        if isinstance(backend, chainer.ChainerBackend) and not backend.backends:
            return "no keychain backend is available on this system"
    except Exception:
        pass
    return None


class KeychainKeys:
    """A random key kept in the OS keychain, created on first use."""

    kind = "keychain"

    def __init__(self, service: str = KEYCHAIN_SERVICE, user: str = KEYCHAIN_USER):
        self.service, self.user = service, user

    def key(self, meta: Meta) -> bytes:
        problem = keychain_problem()
        if problem:
            raise KeyUnavailable(problem)
        import keyring

        try:
            stored = keyring.get_password(self.service, self.user)
            if stored is None:
                if meta.get("check") is not None:
                    raise KeyUnavailable("the history was encrypted with a key that is no longer in the keychain")
                stored = base64.b64encode(secrets.token_bytes(KEY_BYTES)).decode()
                keyring.set_password(self.service, self.user, stored)
                if keyring.get_password(self.service, self.user) != stored:
                    raise KeyUnavailable("the keychain did not keep the key it was given")
        except KeyUnavailable:
            raise
        except Exception as exc:  # keyring backends raise many things
            raise KeyUnavailable(f"the keychain failed: {exc}") from exc
        try:
            key = base64.b64decode(stored, validate=True)
        except ValueError as exc:
            raise KeyUnavailable("the keychain entry for Ferry is not a key") from exc
        if len(key) != KEY_BYTES:
            raise KeyUnavailable("the keychain entry for Ferry is not a key")
        return key


class PassphraseKeys:
    """A key derived from a passphrase with scrypt and a random salt kept in the store."""

    kind = "passphrase"

    def __init__(self, passphrase: str):
        if not passphrase:
            raise ValueError("the passphrase is empty")
        self._passphrase = passphrase

    def key(self, meta: Meta) -> bytes:
        salt = meta.get("scrypt_salt")
        if salt is None:
            salt = secrets.token_bytes(16)
            meta.set("scrypt_salt", salt)
        kdf = Scrypt(salt=salt, length=KEY_BYTES, n=SCRYPT_N, r=SCRYPT_R, p=SCRYPT_P)
        return kdf.derive(self._passphrase.encode("utf-8"))


class EphemeralKeys:
    """A random key that is never stored: the history is unreadable once the process ends."""

    kind = "ephemeral"

    def __init__(self):
        self._key = secrets.token_bytes(KEY_BYTES)

    def key(self, meta: Meta) -> bytes:
        return self._key
