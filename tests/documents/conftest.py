"""Fixtures for the documents tests: the corpus (the PDF and the Word file are
generated from text sources here, so no binaries are committed), an
in-memory keyring, and a document store in a fresh FERRY_HOME."""
from __future__ import annotations

from pathlib import Path

import pytest

from corpus_tools import build_corpus




@pytest.fixture(scope="session")
def corpus_dir(tmp_path_factory) -> Path:
    return build_corpus(tmp_path_factory.mktemp("corpus"))


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    """A fresh, empty Ferry data directory for one test."""
    h = tmp_path / "ferry-home"
    monkeypatch.setenv("FERRY_HOME", str(h))
    return h
