"""A chat never dead-ends when its context is full (issue 34): the window's and
`ferry chat`'s turns leave the oldest turns out ("drop_oldest"), keep the
system prompt and the newest question, and say "context full" when the
context stopped an answer; the server's requests stay explicit ("error").
Driven on the demo model at a 512-token context."""
from __future__ import annotations

import dataclasses

import pytest

from app.api import EngineService, Text, TurnDone, TurnError, TurnRequest, open_model
from app.chat.summary import summarise_to_fit
from app.chat.turn import NOTE_HEADING, ChatFormat
from app.controller.chat_controller import (CONTEXT_DROPPED, CONTEXT_FULL, SUMMARY, ChatController, latest_summary,
                                            memory_start)
from app.store.crypto import KeychainKeys
from app.store.history import HistoryStore
from app.store.settings import Settings

N_CTX = 512


@pytest.fixture(scope="module")
def demo(demo_container):
    model = open_model(demo_container)
    yield model
    model.close()


def _history(turns: int) -> list[dict]:
    msgs = [{"role": "system", "content": "You are a helpful assistant."}]
    for i in range(turns):
        msgs += [{"role": "user", "content": f"Question {i}: tell me about the number {i} in a few sentences."},
                 {"role": "assistant", "content": f"The number {i} is a number. " * 12}]
    return msgs + [{"role": "user", "content": "And the last question?"}]


def test_drop_oldest_keeps_the_system_prompt_and_the_newest_question(demo):
    fmt = ChatFormat(demo)
    msgs = _history(12)
    with pytest.raises(TurnError, match="context holds 512"):
        fmt.prepare(TurnRequest(msgs, max_tokens=64), n_ctx=N_CTX)            # the server's: refused
    p = fmt.prepare(TurnRequest(msgs, max_tokens=64, context="drop_oldest"), n_ctx=N_CTX)
    assert p.dropped > 0 and p.dropped % 2 == 0                         # whole turns (question and answer)
    assert len(p.prompt) <= N_CTX // 2                                  # room for the next few turns too
    kept = msgs[:1] + msgs[1 + p.dropped:]
    assert p.prompt == fmt.prepare(TurnRequest(kept, max_tokens=64), n_ctx=N_CTX).prompt
    text = demo.tokenizer.decode(p.prompt)
    assert "You are a helpful assistant." in text and "And the last question?" in text
    assert "Question 0:" not in text
    # a short chat is left as it is
    short = fmt.prepare(TurnRequest(_history(1), max_tokens=64, context="drop_oldest"), n_ctx=N_CTX)
    assert short.dropped == 0 and short.prompt == fmt.prepare(TurnRequest(_history(1), max_tokens=64),
                                                              n_ctx=N_CTX).prompt
    with pytest.raises(TurnError, match="context must be"):
        fmt.prepare(TurnRequest(msgs, context="later"), n_ctx=N_CTX)


def test_a_question_longer_than_the_context_is_still_refused_in_words(demo):
    long = [{"role": "user", "content": "word " * 2000}]
    with pytest.raises(TurnError, match="context holds 512"):
        ChatFormat(demo).prepare(TurnRequest(long, context="drop_oldest"), n_ctx=N_CTX)


def _turn(c: ChatController, service: EngineService, text: str, *, no_end: tuple[int, ...] = (), seen=None):
    """One turn through the controller, as the window's worker runs it (the "summarise" policy's summary
    first); ``no_end``: end-of-turn tokens the answer may not choose, so that only the context can stop it
    (whatever the arithmetic makes of a near-tie); ``seen``: a list the requests sent are added to."""
    request, _ = c.turn_request(c.send(text))
    c.started(1)
    request, summary = summarise_to_fit(service, request)
    if summary is not None:
        c.on_summary(1, summary)
    if seen is not None:
        seen.append((request, summary))
    if no_end:
        request.sampling = dataclasses.replace(
            request.sampling, logit_bias=tuple(request.sampling.logit_bias) + tuple((i, -100.0) for i in no_end))
    done = None
    for ev in service.submit(request):
        if isinstance(ev, Text):
            c.on_text("response", ev.text)
        elif isinstance(ev, TurnDone):
            done = ev
            c.on_turn_done(ev)
    return c.finish(done.reason, done.content, done.reasoning), done


def test_many_turns_at_a_512_token_context_stay_usable(demo, tmp_path, memory_keyring):
    store = HistoryStore(tmp_path / "h.sqlite3", KeychainKeys())
    settings = Settings(temperature=0.0, max_tokens=96, system_prompt="Answer briefly.")
    c = ChatController(store, lambda: settings)
    session = demo.new_session(N_CTX)
    service = EngineService(demo, session)
    try:
        statuses, dropped = [], []
        for i in range(10):
            m, done = _turn(c, service, f"Tell me a fact about the number {i + 2}, then one about cats.")
            statuses.append(m.status)
            dropped.append(m.stats.get(CONTEXT_DROPPED, 0))
            assert done.prompt_tokens < N_CTX and m.content
        assert "error" not in statuses, statuses
        assert any(dropped), dropped            # the context filled up and the oldest turns were left out
        boundary = memory_start(c.chat.visible())
        assert boundary is not None and c.chat.visible()[boundary].role == "user"
        # an answer the context stops says so ("context full"), and the next question still gets an answer
        settings.max_tokens = 4096
        m, done = _turn(c, service, "Count from 1 to 500, separated by commas, and do not stop.",
                        no_end=tuple(sorted(demo.tokenizer.eos_ids)))
        assert done.reason == "length" and done.context_full and m.status == CONTEXT_FULL
        assert c.status_line(m.status, m).startswith(f"{len(done.token_ids)} tokens")
        settings.max_tokens = 32
        m, done = _turn(c, service, "What is the capital of France?")
        assert m.status in ("stop", "length") and m.stats[CONTEXT_DROPPED] > 0 and m.content
    finally:
        service.close()
        session.close()
        store.close()


@pytest.mark.slow      # about a minute and a half on two shared cores: nine turns and the summaries
def test_summarise_keeps_a_note_of_the_oldest_turns_at_a_512_token_context(demo, tmp_path, memory_keyring):
    """The "summarise" policy: when the next turn would not fit, the model summarises the oldest turns into
    a short note kept after the system prompt; the next turns send the note instead of those turns, and
    summarise again (the old note included) when the context fills up again. No turn fails."""
    store = HistoryStore(tmp_path / "h.sqlite3", KeychainKeys())
    settings = Settings(temperature=0.0, max_tokens=64, system_prompt="Answer briefly.", context_policy="summarise")
    c = ChatController(store, lambda: settings)
    session = demo.new_session(N_CTX)
    service = EngineService(demo, session)
    fmt = ChatFormat(demo)
    seen: list = []
    try:
        c.send("My name is Ada and my cat is called Turing.")
        c.finish("stop", "Nice to meet you, Ada. Turing is a fine name for a cat.")
        answers = []
        for i in range(9):
            m, done = _turn(c, service, f"Tell me a fact about the number {i + 2}, then one about cats.", seen=seen)
            answers.append(m)
            assert m.status in ("stop", "length") and m.content and done.prompt_tokens < N_CTX
        written = [(r, s) for r, s in seen if s is not None]
        print("summaries:", [(s.covered, s.text) for _r, s in written])
        assert written, "the context filled up but nothing was summarised"
        first_req, first = written[0]
        assert first.text and first.covered > 0 and first.covered % 2 == 0       # whole turns
        assert first_req.context_note == first.text and first_req.context == "drop_oldest"
        prompt = demo.tokenizer.decode(fmt.prepare(first_req, n_ctx=N_CTX).prompt)
        assert NOTE_HEADING in prompt and "Answer briefly." in prompt and first.text[:20] in prompt
        assert "My name is Ada" not in prompt                  # the turn itself is no longer sent...
        # ... the note stands for it, kept with the answer, and the next turn sends it again without
        # the model writing it again (it summarises again only when the context fills up again)
        at = next(i for i, (_r, s) in enumerate(seen) if s is first)
        kept = answers[at].stats[SUMMARY]
        assert kept == {"text": first.text, "covered": first.covered}
        if at + 1 < len(seen):
            nxt, again = seen[at + 1]
            assert nxt.context_note == (again.text if again else first.text)
        path = c.chat.visible()
        assert latest_summary(path)["covered"] <= memory_start(path) and path[memory_start(path)].role == "user"
        assert max(s.covered for _r, s in written) >= first.covered
    finally:
        service.close()
        session.close()
        store.close()
