"""MCP tools (``app.tools.mcp``) with the official SDK on both sides: a small
file-reading server written for these tests (tests/tools/file_server.py,
confined to one folder) over stdio and over streamable HTTP, and `ferry chat
--mcp` as a user runs it: a real process on a terminal-like pipe, the model's
answers scripted (tests/tools/scripted_ferry.py) so it calls the tools, the
user approving or declining, the results going back into the prompt."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from app.tools.mcp import DECLINED, McpError, ToolHub, parse_server
from tests.scripted import script_ids

ROOT = Path(__file__).resolve().parents[2]
SERVER = ROOT / "tests" / "tools" / "file_server.py"


@pytest.fixture
def share(tmp_path) -> Path:
    folder = tmp_path / "share"
    folder.mkdir()
    (folder / "note.txt").write_text("The boathouse key hangs in the shed.\n")
    (tmp_path / "secret.txt").write_text("not for the model\n")
    return folder


def _server_cmd(folder: Path, *extra: str) -> str:
    return " ".join(map(str, (sys.executable, SERVER, folder, *extra)))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_servers_are_read_or_refused_in_one_line():
    assert parse_server(" python server.py ").kind == "stdio"
    assert parse_server("http://127.0.0.1:8000/mcp").kind == "url"
    assert parse_server("https://tools.example.com/mcp").kind == "url"
    for bad, why in (("", "empty"), ("http://tools.example.com/mcp", "plain http"), ("python 'unclosed", "cannot read"),
                     ("http:///mcp", "no host")):
        with pytest.raises(McpError, match=why):
            parse_server(bad)


@pytest.mark.slow
def test_a_hub_lists_and_calls_tools_and_every_failure_is_a_result(share, tmp_path):
    port = _free_port()
    http = subprocess.Popen([sys.executable, str(SERVER), str(share), "--http", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while True:   # the HTTP server is up once it accepts connections
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline and http.poll() is None
                time.sleep(0.2)
        specs = [parse_server(_server_cmd(share)), parse_server(f"http://127.0.0.1:{port}/mcp"),
                 parse_server("no-such-program-ferry-test"), parse_server(f"http://127.0.0.1:{_free_port()}/mcp")]
        hub = ToolHub(specs, call_timeout=2)
        problems = hub.start()
        try:
            assert len(problems) == 2 and "no-such-program-ferry-test" in problems[0] and "\n" not in problems[0]
            # two servers with the same tools: the second's are renamed, so the model can tell them apart
            names = [t.name for t in hub.tools]
            assert names == ["read_file", "list_files", "sleep", "fail",
                             "read_file_2", "list_files_2", "sleep_2", "fail_2"]
            tool = hub.openai_tools()[0]["function"]
            assert tool["name"] == "read_file" and tool["parameters"]["required"] == ["path"]
            for name in ("read_file", "read_file_2"):   # stdio, then HTTP
                ok = hub.call(name, '{"path": "note.txt"}')
                assert (ok.text, ok.is_error) == ("The boathouse key hangs in the shed.\n", False)
            outside = hub.call("read_file", {"path": "../secret.txt"})
            assert outside.is_error and "outside the shared folder" in outside.text
            assert "not for the model" not in outside.text
            for args, why in (("[1]", "JSON object"), ("{", "not JSON")):
                bad = hub.call("read_file", args)
                assert bad.is_error and why in bad.text
            unknown = hub.call("write_file", "{}")
            assert unknown.is_error and "no tool named 'write_file'" in unknown.text
            failed = hub.call("fail", "{}")
            assert failed.is_error and failed.text.startswith("Error")
            slow = hub.call("sleep", '{"seconds": 30}')
            assert slow.is_error and "did not answer within 2 s" in slow.text and slow.seconds < 10
            assert hub.call("list_files_2", None).text == "note.txt"   # the server still answers after that
        finally:
            hub.close()
        assert hub.call("read_file", '{"path": "note.txt"}').is_error   # closed: a result, not a crash
    finally:
        http.terminate()
        http.wait(timeout=30)


def _hermes(name, args):
    return f'<tool_call>\n{json.dumps({"name": name, "arguments": args})}\n</tool_call>'


def _k3(name, args):
    arg = "".join(f'<|open|>argument key="{k}" type="string"<|sep|>{v}<|close|>argument<|sep|>'
                  for k, v in args.items())
    return ('Let me look.<|close|>think<|sep|><|open|>tools<|sep|>'
            f'<|open|>call tool="{name}" index="1"<|sep|>{arg}<|close|>call<|sep|>'
            '<|close|>tools<|sep|><|close|>message<|sep|><|end_of_msg|>')


K3_ANSWER = ("Found it.<|close|>think<|sep|><|open|>response<|sep|>The key hangs in the shed."
             "<|close|>response<|sep|><|close|>message<|sep|><|end_of_msg|>")
K3_MARKERS = ("<|open|>", "<|close|>", "<|sep|>", "<|end_of_msg|>")


@pytest.mark.slow
@pytest.mark.parametrize("family", ["hermes", "k3"])
def test_ferry_chat_calls_mcp_tools_with_approval(family, share, tmp_path, tool_templates, tiny_k3):
    from app.model import LoadedModel

    container = tiny_k3 if family == "k3" else tool_templates["hermes"]
    write = _k3 if family == "k3" else _hermes
    texts = [write("read_file", {"path": "note.txt"}), write("read_file", {"path": "../secret.txt"}),
             K3_ANSWER if family == "k3" else "The key hangs in the shed.",
             write("list_files", {}), K3_ANSWER if family == "k3" else "The key hangs in the shed."]
    model = LoadedModel(container, threads=1, n_ctx=256)
    try:
        markers = K3_MARKERS if family == "k3" else ()
        answers = [script_ids(model, t, markers) for t in texts]
        eos = min(model.tokenizer.eos_ids)
    finally:
        model.close()
    log = tmp_path / "prompts.jsonl"
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"eos": eos, "answers": answers, "log": str(log)}))
    # The first call is approved for good ("a"), so the second (outside the folder) runs without asking;
    # in the next user turn list_files is asked about and declined.
    typed = "What does the note say?\na\nAnd the folder?\nn\n/quit\n"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "FERRY_HOME": str(tmp_path / "home")}
    run = subprocess.run([sys.executable, str(ROOT / "tests" / "tools" / "scripted_ferry.py"), str(script),
                          "chat", str(container), "--ctx", "2048", "-n", "200", "--threads", "2",
                          "--mcp", _server_cmd(share)],
                         input=typed, capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    out, err = run.stdout, run.stderr
    assert "Traceback" not in err
    assert "Tools: read_file, list_files, sleep, fail." in err
    assert err.count("Run the tool") == 2   # the first read_file and list_files; the second read_file was trusted
    assert "[tool result] The boathouse key hangs in the shed." in out
    assert "[tool result (error)]" in out and "outside the shared folder" in out
    assert f"[tool result (error)] {DECLINED}" in out
    assert out.count("The key hangs in the shed.") == 2
    prompts = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(prompts) == 5   # every answer was asked for with the results so far
    assert "The boathouse key hangs in the shed." in prompts[1] and "read_file" in prompts[0]
    assert "outside the shared folder" in prompts[2] and "not for the model" not in prompts[2]
    assert DECLINED in prompts[4] and "And the folder?" in prompts[4]


def test_ferry_chat_refuses_mcp_for_a_model_without_tools(demo_container, tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "FERRY_HOME": str(tmp_path / "home")}
    run = subprocess.run([sys.executable, "-m", "app.cli", "chat", str(demo_container), "--mcp", "python x.py"],
                         input="", capture_output=True, text=True, timeout=300, env=env)
    assert run.returncode == 2 and "chat format takes no tools" in run.stderr and "Traceback" not in run.stderr
    run = subprocess.run([sys.executable, "-m", "app.cli", "chat", "demo", "--mcp", "http://example.com/mcp"],
                         input="", capture_output=True, text=True, timeout=300, env=env)
    assert run.returncode == 2 and "plain http to another computer" in run.stderr
