"""The optional fields real OpenAI clients send, honoured on the demo model
through the `openai` client over loopback HTTP: logit_bias, the frequency and
presence penalties (OpenAI's formula), logprobs/top_logprobs (equal to
`ferry eval`'s), n, user; and prefix reuse kept per client."""
from __future__ import annotations

import json

import numpy as np
import openai
import pytest

from app.chat.turn import token_bytes
from app.cli import main as ferry
from app.model import LoadedModel
from app.sampling import Sampler, SamplingParams
from app.server import Server

PROMPT = "Name three colours."
ASK = [{"role": "user", "content": PROMPT}]
CTX = 1024


@pytest.fixture(scope="module")
def demo_server(demo_container):
    model = LoadedModel(demo_container, threads=2, n_ctx=CTX)
    server = Server(model, model.new_session(CTX), host="127.0.0.1", port=0).start()
    yield model, server
    server.stop()
    model.close()


def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0)


def reference(model: LoadedModel, n: int, frequency: float = 0.0, presence: float = 0.0) -> list[int]:
    """Greedy ids with OpenAI's penalty formula applied here, step by step with numpy."""
    ids = model.encode_chat(ASK)
    session = model.new_session(CTX)
    logits = session.eval(ids).astype(np.float64)
    out: list[int] = []
    counts: dict[int, int] = {}
    for _ in range(n):
        z = logits.copy()
        for tok, c in counts.items():
            z[tok] -= c * frequency + (1.0 if c > 0 else 0.0) * presence
        tok = int(np.argmax(z))
        if tok in model.tokenizer.eos_ids:
            break
        out.append(tok)
        counts[tok] = counts.get(tok, 0) + 1
        logits = session.eval([tok]).astype(np.float64)
    session.close()
    return out


def tokens_of(r) -> list[str]:
    return [t.token for t in r.choices[0].logprobs.content]


def test_penalties_follow_openais_formula():
    logits = np.array([0.0, 1.0, 0.9, 0.5], dtype=np.float32)
    s = Sampler(SamplingParams(frequency_penalty=0.5, presence_penalty=0.3))
    assert s(logits) == 1
    assert s.adjust(logits)[1] == pytest.approx(1.0 - (1 * 0.5 + 0.3))
    assert s(logits) == 2                       # 1 is now below 2
    assert s(logits) == 3                       # 0.5 beats 1.0 - 0.8 = 0.2 and 0.9 - 0.8 = 0.1
    s.counts[1] = 3
    assert s.adjust(logits)[1] == pytest.approx(1.0 - (3 * 0.5 + 0.3))
    biased = Sampler(SamplingParams(logit_bias=((1, -100.0), (0, 5.0))))
    assert biased(logits) == 0
    with pytest.raises(ValueError):
        SamplingParams(frequency_penalty=2.5)
    with pytest.raises(ValueError):
        SamplingParams(logit_bias=((3, 101.0),))


def test_penalised_answers_are_the_formulas(demo_server):
    model, server = demo_server
    c = client(server)
    plain = reference(model, 16)
    penalised = reference(model, 16, frequency=1.5, presence=0.5)
    assert plain != penalised, "the prompt must repeat a token for the penalty to matter"
    r = c.chat.completions.create(model=server.model_id, messages=ASK, max_tokens=16, temperature=0, logprobs=True,
                                  frequency_penalty=1.5, presence_penalty=0.5)
    assert tokens_of(r) == [token_bytes(model.tokenizer, i).decode("utf-8", "replace") for i in penalised]
    assert r.choices[0].message.content == model.tokenizer.decode(penalised)


def test_logit_bias_changes_the_greedy_token(demo_server):
    model, server = demo_server
    c = client(server)
    greedy = reference(model, 1)[0]
    first = c.chat.completions.create(model=server.model_id, messages=ASK, max_tokens=1, temperature=0,
                                      logprobs=True, top_logprobs=2)
    top = first.choices[0].logprobs.content[0]
    assert top.token == token_bytes(model.tokenizer, greedy).decode("utf-8", "replace") == top.top_logprobs[0].token
    banned = c.chat.completions.create(model=server.model_id, messages=ASK, max_tokens=1, temperature=0,
                                       logprobs=True, logit_bias={str(greedy): -100})
    assert tokens_of(banned) == [top.top_logprobs[1].token]
    with pytest.raises(openai.BadRequestError) as info:
        c.chat.completions.create(model=server.model_id, messages=ASK, max_tokens=1, logit_bias={"the": 1})
    assert info.value.body["param"] == "logit_bias"


def test_top_logprobs_equal_ferry_eval(demo_server, demo_container, capsys):
    _model, server = demo_server
    r = client(server).chat.completions.create(model=server.model_id, messages=ASK, max_tokens=1, temperature=0,
                                               logprobs=True, top_logprobs=5)
    capsys.readouterr()
    assert ferry(["eval", str(demo_container), PROMPT, "--chat", "--top", "5", "--json", "--ctx", str(CTX),
                  "--threads", "2"]) == 0
    rows = json.loads(capsys.readouterr().out)["top"]
    first = r.choices[0].logprobs.content[0]
    assert [(t.token, t.logprob) for t in first.top_logprobs] == [(row["token"], row["logprob"]) for row in rows]
    assert first.logprob == rows[0]["logprob"] and first.bytes == list(first.token.encode())


def test_n_user_and_usage_in_a_stream(demo_server):
    _model, server = demo_server
    c = client(server)
    ok = c.chat.completions.create(model=server.model_id, messages=ASK, max_tokens=2, n=1, user="someone")
    assert len(ok.choices) == 1 and ok.choices[0].logprobs is None
    with pytest.raises(openai.BadRequestError) as info:
        c.chat.completions.create(model=server.model_id, messages=ASK, max_tokens=2, n=2)
    assert info.value.body["param"] == "n" and "n must be 1" in info.value.body["message"]
    with pytest.raises(openai.BadRequestError) as info:
        c.chat.completions.create(model=server.model_id, messages=ASK, max_tokens=2, top_logprobs=2)
    assert info.value.body["param"] == "top_logprobs"
    chunks = list(c.chat.completions.create(model=server.model_id, messages=ASK, max_tokens=3, temperature=0,
                                            stream=True, stream_options={"include_usage": True}, logprobs=True))
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 3
    streamed = [t.token for ch in chunks for choice in ch.choices if choice.logprobs
                for t in choice.logprobs.content]
    assert len(streamed) == 3


def test_prefix_reuse_is_kept_per_client(demo_server):
    """Without an API key each connection is its own client: one client's
    cached_tokens never count a prompt another client sent."""
    model, server = demo_server
    alice, bob = client(server), client(server)
    secret = [{"role": "user", "content": "My bank PIN is 4417. What is a PIN?"}]
    first = alice.chat.completions.create(model=server.model_id, messages=secret, max_tokens=2, temperature=0)
    again = alice.chat.completions.create(model=server.model_id, messages=secret, max_tokens=2, temperature=0)
    assert again.usage.prompt_tokens_details.cached_tokens == again.usage.prompt_tokens - 1   # her own prompt
    probe = bob.chat.completions.create(model=server.model_id, messages=secret, max_tokens=2, temperature=0)
    assert probe.usage.prompt_tokens_details.cached_tokens == 0
    assert probe.choices[0].message.content == first.choices[0].message.content   # reuse never changes output
    mine = bob.chat.completions.create(model=server.model_id, messages=secret, max_tokens=2, temperature=0)
    assert mine.usage.prompt_tokens_details.cached_tokens == mine.usage.prompt_tokens - 1
    # with an API key, the key holder is the one client, whatever the connection
    keyed = Server(model, model.new_session(CTX), host="127.0.0.1", port=0, api_key="k3y").start()
    try:
        a = openai.OpenAI(base_url=keyed.url, api_key="k3y", max_retries=0)
        b = openai.OpenAI(base_url=keyed.url, api_key="k3y", max_retries=0)
        a.chat.completions.create(model=keyed.model_id, messages=secret, max_tokens=2, temperature=0)
        same = b.chat.completions.create(model=keyed.model_id, messages=secret, max_tokens=2, temperature=0)
        assert same.usage.prompt_tokens_details.cached_tokens == same.usage.prompt_tokens - 1
    finally:
        keyed.stop()


def _entries(content) -> list[tuple]:
    return [(t.token, t.logprob, t.bytes, [(a.token, a.logprob, a.bytes) for a in t.top_logprobs]) for t in content]


@pytest.mark.parametrize("sampling", [{"temperature": 0}, {"temperature": 0.9, "seed": 7}], ids=["greedy", "seeded"])
def test_streamed_logprobs_ride_with_their_chunks(demo_server, sampling):
    """Each streamed chunk carries the logprobs of the tokens whose text it
    sends, as OpenAI does; their concatenation is the non-streamed answer's."""
    model, server = demo_server
    c = client(server)
    ask = dict(model=server.model_id, messages=ASK, max_tokens=12, logprobs=True, top_logprobs=3, **sampling)
    whole = c.chat.completions.create(**ask)
    chunks = list(c.chat.completions.create(stream=True, **ask))
    carried = [ch.choices[0] for ch in chunks if ch.choices and ch.choices[0].logprobs is not None]
    streamed = [t for choice in carried for t in choice.logprobs.content]
    assert _entries(streamed) == _entries(whole.choices[0].logprobs.content)
    assert len(streamed) == whole.usage.completion_tokens == 12
    with_text = [ch.choices[0] for ch in chunks if ch.choices and ch.choices[0].delta.content]
    assert len(with_text) > 1, "the answer must come in several chunks for this test to mean anything"
    assert all(choice.logprobs is not None for choice in with_text)   # each text chunk brings its own
    for choice in with_text:   # and exactly the tokens of that text (the demo's answer is plain ASCII)
        ids = [t.model_extra["id"] for t in choice.logprobs.content]
        assert model.tokenizer.decode(ids) == choice.delta.content
        assert "".join(t.token for t in choice.logprobs.content) == choice.delta.content   # the tokens' own text
    assert "".join(choice.delta.content for choice in with_text) == whole.choices[0].message.content


def test_continue_final_message_writes_on_from_the_given_answer(demo_server):
    """vLLM's continue_final_message (what the window's Continue sends to a remote engine): the answer
    cut at 6 tokens, continued, is the greedy answer written in one go."""
    _, server = demo_server
    c = client(server)
    once = c.chat.completions.create(model=server.model_id, messages=ASK, max_tokens=14, temperature=0).choices[0]
    part = c.chat.completions.create(model=server.model_id, messages=ASK, max_tokens=6, temperature=0).choices[0]
    assert part.finish_reason == "length" and once.message.content.startswith(part.message.content)
    rest = c.chat.completions.create(
        model=server.model_id, max_tokens=8, temperature=0,
        messages=ASK + [{"role": "assistant", "content": part.message.content}],
        extra_body={"continue_final_message": True, "add_generation_prompt": False}).choices[0]
    assert part.message.content + rest.message.content == once.message.content
    with pytest.raises(openai.BadRequestError, match="add_generation_prompt"):
        c.chat.completions.create(model=server.model_id, messages=ASK, max_tokens=2, extra_body={"add_generation_prompt": False})
    with pytest.raises(openai.BadRequestError, match="continue_final"):
        c.chat.completions.create(model=server.model_id, messages=ASK, max_tokens=2, extra_body={"continue_final_message": True})
