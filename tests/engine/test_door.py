"""The one door (app.engine.door): both engines implement it, and the local engine's saved prefix
states (a request that keeps its prefix) are held only for the client that left them."""
from __future__ import annotations

import pytest

from app.api import EngineService, RemoteEngine, StateCache, TurnEngine, TurnRequest, TurnStream, collect
from app.model import LoadedModel

PASSAGES = ("Answer using only the numbered passages below. Cite them like [1].\n\nPassages:\n\n"
            "[1] (house.md) The water tank in the attic holds 3.5 litres and was replaced in 2021.\n\n"
            "[2] (house.md) The boiler was last serviced by Aldous in March.")


@pytest.fixture(scope="module")
def demo(demo_container):
    model = LoadedModel(demo_container, n_ctx=1024)
    yield model
    model.close()


def test_both_engines_are_behind_the_door(demo):
    service = EngineService(demo, demo.new_session(256))
    remote = RemoteEngine("http://127.0.0.1:9")     # nothing is sent before a turn is read
    try:
        assert isinstance(service, TurnEngine) and isinstance(remote, TurnEngine)
        assert (service.kind, remote.kind) == ("local", "remote")
        assert service.tokenizer is demo.tokenizer and remote.tokenizer is None
        stream = service.submit(TurnRequest([{"role": "user", "content": "Hi"}], max_tokens=2))
        assert isinstance(stream, TurnStream) and isinstance(remote.submit(TurnRequest([])), TurnStream)
        assert collect(stream).reason in ("stop", "length")
    finally:
        service.close()
        remote.close()


def test_a_kept_prefix_is_held_only_for_the_client_that_left_it(demo, tmp_path):
    service = EngineService(demo, demo.new_session(), states=StateCache(b"k" * 32, root=tmp_path / "states"))

    def ask(question: str, client: str = "documents", keep: bool = True):
        return collect(service.submit(TurnRequest([{"role": "system", "content": PASSAGES},
                                                   {"role": "user", "content": question}],
                                                  max_tokens=4, keep_prefix=keep, client=client)))

    try:
        prefix = service.prepare(TurnRequest([{"role": "system", "content": PASSAGES},
                                              {"role": "user", "content": "How big is the tank?"}],
                                             keep_prefix=True)).prefix_len
        assert prefix > 16
        first = ask("How big is the tank?")
        assert first.prefix_state == "saved" and first.reused_tokens == 0
        assert ask("Who serviced the boiler?").prefix_state == "held"
        # another client leaves the same prefix in the session (a request that does not keep its prefix
        # neither saves nor restores one): it is not reused from there, but restored from the saved state
        other = ask("Who serviced the boiler?", client="cli", keep=False)
        assert other.prefix_state == "" and other.reused_tokens == 0
        again = ask("How big is the tank?")
        assert again.prefix_state == "restored" and again.reused_tokens == prefix
        assert again.token_ids == first.token_ids and again.content == first.content
    finally:
        service.close()
        service.session.close()
