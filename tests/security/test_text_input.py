"""Issue 18, item 3: invalid UTF-8 and lone surrogates on every input path
get a clear error, never a traceback: the server (a 400 error object), the
CLI's arguments and `ferry chat`'s input."""
from __future__ import annotations

import os
import subprocess
import sys

import httpx
import pytest

from app.model import LoadedModel
from app.server import Limits, Server
from tests.conftest import REPO


@pytest.fixture(scope="module")
def server(tiny_chat):
    model = LoadedModel(tiny_chat)
    s = Server(model, model.new_session(256), port=0, limits=Limits(max_tokens=8)).start()
    yield s
    s.stop()
    model.close()


def _post(server, content: bytes):
    return httpx.post(server.url + "/chat/completions", content=content, timeout=60,
                      headers={"content-type": "application/json"})


def _error(r, status, code=None):
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    assert code is None or err["code"] == code, err
    return err


def _body(server, content_json: str) -> bytes:
    return ('{"model": "%s", "max_tokens": 2, "messages": [{"role": "user", "content": %s}]}'
            % (server.model_id, content_json)).encode()


def test_a_lone_surrogate_gets_a_400_naming_the_field(server):
    err = _error(_post(server, _body(server, '"hi \\ud800"')), 400, "invalid_unicode")
    assert err["param"] == "messages[0].content" and "surrogate" in err["message"]
    _error(_post(server, _body(server, '"\\udfff tail"')), 400, "invalid_unicode")
    stop = (b'{"model": "%s", "max_tokens": 2, "stop": ["\\ud83d"], "messages": [{"role": "user", "content": "x"}]}'
            % server.model_id.encode())
    assert _error(_post(server, stop), 400, "invalid_unicode")["param"] == "stop[0]"


def test_invalid_utf8_bytes_in_a_body_get_a_400(server):
    latin1 = _body(server, '"caf\u00e9"').replace("café".encode(), b"caf\xe9 \xff")
    assert b"caf\xe9 \xff" in latin1
    _error(_post(server, latin1), 400)


def test_a_proper_pair_and_the_server_afterwards_are_fine(server):
    r = _post(server, _body(server, '"w5 \\ud83d\\ude00 w6"'))
    assert r.status_code == 200, r.text


def _ferry(args: list[bytes], stdin: bytes = b"") -> subprocess.CompletedProcess:
    env = {**os.environ, "LC_ALL": "C.UTF-8", "PYTHONUTF8": "1"}
    return subprocess.run([sys.executable.encode(), b"-m", b"app.cli", *args], input=stdin, cwd=REPO, env=env,
                          capture_output=True, timeout=120)


def test_invalid_utf8_on_the_command_line_is_a_clear_error(tiny_chat):
    res = _ferry([b"run", os.fsencode(tiny_chat), b"w5 \xff\xfe w6", b"-n", b"2", b"--ctx", b"128"])
    assert res.returncode == 2, res.stderr
    err = res.stderr.decode("utf-8", "replace")
    assert "Traceback" not in err and "not valid UTF-8" in err and "0xff" in err
    res = _ferry([b"run", os.fsencode(tiny_chat), b"w5", b"--system", b"\xc3(", b"-n", b"2", b"--ctx", b"128"])
    assert res.returncode == 2 and b"--system is not valid UTF-8" in res.stderr


def test_invalid_utf8_typed_into_ferry_chat_is_refused_and_the_chat_goes_on(tiny_chat):
    res = _ferry([b"chat", os.fsencode(tiny_chat), b"-n", b"3", b"--ctx", b"128"],
                 stdin=b"w5 \xff w6\nw5 w6\n\n")
    err = res.stderr.decode("utf-8", "replace")
    assert res.returncode == 0, err
    assert "Traceback" not in err and "not valid UTF-8" in err
    assert "tokens" in err    # the next, valid line was answered


def test_invalid_utf8_in_a_docs_question_is_a_clear_error(tmp_path):
    env = {**os.environ, "FERRY_HOME": str(tmp_path / "home"), "FERRY_PASSPHRASE": "tractor violet harbour sonnet",
           "PYTHON_KEYRING_BACKEND": "keyring.backends.null.Keyring"}
    res = subprocess.run([sys.executable.encode(), b"-m", b"app.cli", b"docs", b"search", b"notes", b"boiler \xff?"],
                         cwd=REPO, env=env, capture_output=True, timeout=120)
    assert res.returncode == 2 and b"Traceback" not in res.stderr
    assert b"the question is not valid UTF-8 text: byte 0xff" in res.stderr
