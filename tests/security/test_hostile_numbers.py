"""Issue 32: every number from outside is checked against what takes it. The server's
``logit_bias`` keys must be token ids of the model's vocabulary (a 400 in OpenAI's error shape,
never a 500 or a silently ignored key); every number on the command line is checked against
what the core takes, with a one-line error instead of a traceback."""
from __future__ import annotations

import httpx
import pytest

from app.model import LoadedModel
from app.sampling import SamplingParams
from app.server import Limits, Server
from tests.conftest import run_ferry


@pytest.fixture(scope="module")
def server(tiny_chat):
    model = LoadedModel(tiny_chat)
    s = Server(model, model.new_session(256), port=0, limits=Limits(max_tokens=4)).start()
    yield s, model.engine.info.vocab
    s.stop()
    model.close()


def _ask(server, bias):
    s, _ = server
    return httpx.post(s.url + "/chat/completions", timeout=60, json={
        "model": s.model_id, "max_tokens": 2, "logit_bias": bias, "messages": [{"role": "user", "content": "w5"}]})


def _error(r):
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["param"] == "logit_bias", err
    return err["message"]


@pytest.mark.parametrize("key", ["1" + "0" * 30, "9" * 5000, "2147483648", "-1", "x", "1.5", "١٢", ""])
def test_logit_bias_keys_that_are_not_token_ids_get_a_400(server, key):
    _error(_ask(server, {key: 5}))


def test_logit_bias_keys_past_the_vocabulary_get_a_400_naming_it(server):
    _, vocab = server
    assert f"0 to {vocab - 1}" in _error(_ask(server, {str(vocab): 5}))
    assert _ask(server, {str(vocab - 1): 5}).status_code == 200


@pytest.mark.parametrize("value", [100.5, -101, 1e300])
def test_logit_bias_values_outside_plus_minus_100_get_a_400(server, value):
    assert _ask(server, {"3": value}).status_code == 400


def test_non_finite_sampling_values_are_refused_where_every_front_end_builds_them():
    for bad in ({"temperature": float("nan")}, {"top_p": float("nan")}, {"frequency_penalty": float("inf")},
                {"seed": -1}, {"seed": 2**64}):
        with pytest.raises(ValueError):
            SamplingParams(**bad)


@pytest.mark.parametrize("args, words", [
    (["--ctx", "1099511627776"], "--ctx is 1099511627776"),
    (["-n", "-3"], "-n is -3"),
    (["-n", "99999999999999999999"], "-n is"),
    (["--threads", "1099511627776"], "--threads is"),
    (["--threads", "-1"], "--threads is -1"),
    (["--top-k", "1099511627776"], "--top-k is"),
    (["--seed", "-1"], "--seed is -1"),
    (["--temp", "nan"], "--temp must be a finite number"),
    (["--top-p", "inf"], "--top-p must be a finite number"),
    (["--cache-aware", "-1"], "--cache-aware must be at least 0"),
    (["--experts-per-token", "0"], "--experts-per-token is 0"),
    (["--budget", "99999999999999999999999"], "larger than any machine's memory"),
])
def test_cli_numbers_outside_what_the_core_takes_are_one_line_errors(tiny_chat, args, words):
    res = run_ferry("run", str(tiny_chat), "w5", *args, check=False, timeout=120)
    assert res.returncode == 2, res.stderr
    assert "Traceback" not in res.stderr and words in res.stderr, res.stderr
    assert len(res.stderr.strip().splitlines()) == 1, res.stderr


@pytest.mark.parametrize("args", [["docs", "search", "c", "q", "-k", "0"], ["docs", "budget", "c", "1099511627776"],
                                  ["serve", "demo", "--port", "70000"], ["plan", "demo", "--ctx", "-2"]])
def test_other_commands_check_their_numbers_too(args, tmp_path):
    res = run_ferry(*args, check=False, timeout=60, env={"FERRY_HOME": str(tmp_path)})
    assert res.returncode == 2 and "Traceback" not in res.stderr and "must be between" in res.stderr, res.stderr
