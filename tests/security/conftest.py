"""Security fixtures: the tiny chat model (a real converted container with a
tokenizer and a Jinja chat template) from the UI fixtures, and ``evil``: the
loopback hub of tests/get with the environment pointed at it and short
network deadlines, to be made hostile by each test."""
import pytest

from tests.get.conftest import repos  # noqa: F401  (the hosted tiny repositories)
from tests.get.hub_server import Hub
from tests.ui.conftest import tiny_chat  # noqa: F401

#: connect, read, total seconds (FERRY_NET_TIMEOUTS): short, so each probe ends in seconds
TIMEOUTS = "0.5,0.5,2"


@pytest.fixture
def evil(repos, monkeypatch, tmp_path, memory_keyring):  # noqa: F811
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    monkeypatch.setenv("FERRY_NO_DIRECT_IO", "1")
    monkeypatch.setenv("FERRY_NET_TIMEOUTS", TIMEOUTS)
    with Hub() as h:
        monkeypatch.setenv("HF_ENDPOINT", h.url)
        yield h


def hub_env(hub) -> dict:
    """The environment of a `ferry` subprocess talking to ``hub``."""
    return {"HF_ENDPOINT": hub.url, "FERRY_NET_TIMEOUTS": TIMEOUTS, "NO_PROXY": "127.0.0.1",
            "HF_HUB_DISABLE_TELEMETRY": "1"}
