"""Fixtures for the documents tests: the corpus (the PDF and the Word file are
generated from text sources here, so no binaries are committed), an
in-memory keyring, and a document store in a fresh FERRY_HOME."""
from __future__ import annotations

from pathlib import Path

import keyring
import pytest
from keyring.backend import KeyringBackend

from corpus_tools import build_corpus


class MemoryKeyring(KeyringBackend):
    priority = 1

    def __init__(self):
        super().__init__()
        self.items = {}

    def get_password(self, service, username):
        return self.items.get((service, username))

    def set_password(self, service, username, password):
        self.items[(service, username)] = password

    def delete_password(self, service, username):
        self.items.pop((service, username), None)


@pytest.fixture
def kr():
    before = keyring.get_keyring()
    k = MemoryKeyring()
    keyring.set_keyring(k)
    yield k
    keyring.set_keyring(before)


@pytest.fixture(scope="session")
def corpus_dir(tmp_path_factory) -> Path:
    return build_corpus(tmp_path_factory.mktemp("corpus"))


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    """A fresh, empty Ferry data directory for one test."""
    h = tmp_path / "ferry-home"
    monkeypatch.setenv("FERRY_HOME", str(h))
    return h
