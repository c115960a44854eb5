"""One engine per model per machine (app/engine/registry.py), with real processes:
two `ferry run` on one container share one engine; a window-like holder serves
`ferry run` and `ferry serve`; a holder killed with -9 leaves a record the next
open recovers from; two models whose budgets do not fit together are refused
with the holder named. The conftest turns sharing off for the rest of the suite
(FERRY_SHARE=0); these tests turn it on for their processes."""
from __future__ import annotations

import json
import re
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from app.engine import registry
from tests.conftest import REPO

SHARED = {"FERRY_SHARE": "1"}

#: A process that holds a model as the window's worker does (open_model, then an engine service on it),
#: until its stdin closes; argv: container, budget (0: recommended).
HOLDER = """
import sys
from app.api import EngineService, open_model
from app.server import serve_shared
model = open_model(sys.argv[1], ram_budget=int(sys.argv[2]), holder="the Ferry window", serve=serve_shared)
service = EngineService(model, model.new_session(2048))
print("ready", flush=True)
sys.stdin.read()
service.close()
model.close()
print("closed", flush=True)
"""


def _env(**extra) -> dict:
    return {**os.environ, "PYTHONPATH": str(REPO), **SHARED, **extra}


def _ferry(*args: str, timeout: float = 300, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "app.cli", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO, env=_env(**(env or {})))


def _records() -> list[registry.Record]:
    return registry.Registry().records()


def _wait_serving(path: Path, proc: subprocess.Popen | None = None, timeout: float = 120) -> registry.Record:
    ident = registry.identity(path)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        record = registry.Registry().find(ident)
        if record is not None and record.state == "serving":
            return record
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"the holder ended: {proc.communicate()}")
        time.sleep(0.1)
    raise AssertionError("the model was never served")


def _holder(path: Path, budget: int = 0) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(path), str(budget)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO, env=_env())
    assert proc.stdout.readline().strip() == "ready", proc.stderr.read()
    return proc


def _reference(path: Path, prompt: str | list, n: int, *, raw: bool = False) -> str:
    """The answer of an engine of this process's own (greedy, as `ferry run`) to a prompt (or messages)."""
    from app.api import EngineService, TurnRequest, collect, open_model

    model = open_model(path, share=False)
    service = EngineService(model, model.new_session(4096))
    try:
        return collect(service.submit(
            TurnRequest([{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt, max_tokens=n,
                        raw=raw))).content
    finally:
        service.close()
        model.close()


def _text(res: subprocess.CompletedProcess) -> str:
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)["text"]


# ---------------------------------------------------------------- the registry itself (one process)

def test_records_are_private_and_a_dead_owner_is_stale(tmp_path):
    reg = registry.Registry(tmp_path / "run")
    reg.dir.mkdir(mode=0o700)
    ident = registry.Identity("/models/a.ferry", "x" * 32)
    claim = reg.claim(ident, 1 << 20, holder="test", room=1 << 30)
    assert claim.held is None and claim.holding is not None
    files = list(reg.dir.glob(f"{ident.slot}.*"))
    assert files and all(f.stat().st_mode & 0o777 == 0o600 for f in files)
    assert [r.holder for r in reg.records()] == ["test"]
    claim.holding.release()
    assert reg.records() == [] and not list(reg.dir.glob(f"{ident.slot}.*"))
    # a record whose owner is gone (no lock held, pid of an ended process) is stale and cleaned away
    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    record = registry.Record(ident.path, ident.content_id, int(ended.stdout), 1 << 20, "gone", port=1, key="k",
                             state="serving")
    (reg.dir / f"{ident.slot}.json").write_text(json.dumps(record.__dict__))
    (reg.dir / f"{ident.slot}.lock").write_text("")
    assert reg.find(ident) is None
    claim = reg.claim(ident, 1 << 20, holder="again", room=1 << 30)
    assert claim.holding is not None
    claim.holding.release()


def test_the_ledger_refuses_what_does_not_fit(tmp_path):
    reg = registry.Registry(tmp_path)
    a = reg.claim(registry.Identity("/m/a.ferry", "a"), 600, holder="`ferry run`", room=1000).holding
    with pytest.raises(registry.LedgerFull) as err:
        reg.claim(registry.Identity("/m/b.ferry", "b"), 500, holder="`ferry chat`", room=1000)
    assert "a.ferry" in str(err.value) and f"pid {os.getpid()}" in str(err.value) and "Close" in str(err.value)
    b = reg.claim(registry.Identity("/m/b.ferry", "b"), 400, holder="`ferry chat`", room=1000).holding
    assert sorted(r.budget for r in reg.records()) == [400, 600]
    a.release()
    b.release()


# ---------------------------------------------------------------- real processes

@pytest.mark.slow
def test_two_ferry_runs_share_one_engine(demo_container):
    want_a = _reference(demo_container, "Once upon a time", 150, raw=True)   # long enough to overlap b
    want_b = _reference(demo_container, "Hi", 12)
    a = subprocess.Popen([sys.executable, "-m", "app.cli", "run", str(demo_container), "--raw", "-n", "150",
                          "--json", "Once upon a time"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         cwd=REPO, env=_env())
    owner = _wait_serving(demo_container, a)
    assert owner.pid == a.pid and owner.holder == "`ferry run`"
    b = _ferry("run", str(demo_container), "-n", "12", "--json", "Hi")
    out, err = a.communicate(timeout=300)
    assert a.returncode == 0, err
    assert f"using the model already open in Ferry (pid {a.pid}" in b.stderr
    assert json.loads(b.stdout)["server"] == owner.url      # its answer came from the owner's engine
    assert json.loads(out)["text"] == want_a and _text(b) == want_b
    assert _records() == []          # the owner let go when it ended


@pytest.mark.slow
def test_a_window_holder_serves_ferry_run_docs_ask_and_ferry_serve(demo_container, tmp_path):
    want = _reference(demo_container, "Hi", 12)
    holder = _holder(demo_container)
    try:
        owner = _wait_serving(demo_container, holder)
        assert owner.holder == "the Ferry window" and owner.key
        run = _ferry("run", str(demo_container), "-n", "12", "--json", "Hi")
        assert f"using the model already open in Ferry (pid {holder.pid}, the Ferry window)" in run.stderr
        assert _text(run) == want
        status = httpx.get(f"http://127.0.0.1:{owner.port}/ferry/status",
                           headers={"Authorization": f"Bearer {owner.key}"}).json()
        assert status["served"] == 1
        assert httpx.get(owner.url + "/models").status_code == 401     # the holder's API needs its key
        info = _ferry("info", str(demo_container))       # needs an engine of its own: refused, holder named
        assert info.returncode == 1 and f"already open in Ferry (pid {holder.pid}, the Ferry window)" in info.stderr
        assert "--no-share" in info.stderr and "Traceback" not in info.stderr
        # `ferry docs ask`: the search here, the answer from the holder's engine
        docs = tmp_path / "docs"
        docs.mkdir()
        (docs / "note.txt").write_text("The lighthouse keeper is named Ada Quill.")
        env = {"FERRY_PASSPHRASE": "tractor violet harbour sonnet"}
        assert _ferry("docs", "add", "notes", str(docs), env=env).returncode == 0
        ask = _ferry("docs", "ask", str(demo_container), "notes", "Who keeps the lighthouse?", "-n", "12", "--json",
                     env=env)
        assert ask.returncode == 0, ask.stderr
        assert f"using the model already open in Ferry (pid {holder.pid}" in ask.stderr
        assert json.loads(ask.stdout)["citations"]
        # `ferry serve` on the held model: the user's port and key, the holder's engine
        serve = subprocess.Popen([sys.executable, "-m", "app.cli", "serve", str(demo_container), "--port", "0",
                                  "--api-key", "user-key"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 text=True, cwd=REPO, env=_env())
        try:
            line = serve.stdout.readline()
            assert f"serving {owner.name} at http://127.0.0.1:" in line, line
            url = line.split(" at ")[1].split()[0]
            assert httpx.post(url + "/chat/completions", json={}).status_code == 401
            body = {"model": owner.name, "max_tokens": 12, "temperature": 0,
                    "messages": [{"role": "user", "content": "Hi"}]}
            r = httpx.post(url + "/chat/completions", json=body, headers={"Authorization": "Bearer user-key"},
                           timeout=120)
            assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == want
            with httpx.stream("POST", url + "/chat/completions", json={**body, "stream": True},
                              headers={"x-api-key": "user-key"}, timeout=120) as s:
                chunks = [json.loads(line[5:]) for line in s.iter_lines()
                          if line.startswith("data:") and line[5:].strip() != "[DONE]"]
            assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"]) == want
            assert len(_records()) == 1      # still the one engine
        finally:
            serve.send_signal(signal.SIGINT)
            serve.communicate(timeout=30)
    finally:
        holder.stdin.close()
        assert holder.stdout.readline().strip() == "closed"
        holder.wait(timeout=30)
    assert _records() == []


@pytest.mark.slow
def test_a_killed_holder_is_recovered_from(demo_container):
    want = _reference(demo_container, "Hi", 8)
    holder = _holder(demo_container)
    _wait_serving(demo_container, holder)
    holder.kill()        # SIGKILL: no clean-up ran
    holder.wait()
    slot = registry.identity(demo_container).slot
    assert (registry.runtime_dir() / f"{slot}.json").exists()     # the stale record is still there
    run = _ferry("run", str(demo_container), "-n", "8", "--json", "Hi")
    assert "using the model" not in run.stderr and _text(run) == want     # opened it itself
    assert _records() == [] and not (registry.runtime_dir() / f"{slot}.json").exists()


@pytest.mark.slow
def test_two_models_that_do_not_fit_together_are_refused(demo_container, tmp_path):
    from app.memory.budget import ledger_room

    other = shutil.copytree(demo_container, tmp_path / "other.ferry")
    budget = int(ledger_room() * 0.6)          # each fits alone, both do not (the core takes RAM as it needs it)
    holder = _holder(demo_container, budget)
    try:
        _wait_serving(demo_container, holder)
        run = _ferry("run", str(other), "--budget", str(budget), "-n", "4", "Hi")
        assert run.returncode == 1
        msg = run.stderr
        assert "other.ferry needs a RAM budget" in msg and f"pid {holder.pid}" in msg and "the Ferry window" in msg
        assert "Close that" in msg and "Traceback" not in msg
        small = _ferry("run", str(other), "-n", "4", "--json", "Hi")   # its recommended budget fits beside it
        assert small.returncode == 0, small.stderr
        assert "using the model" not in small.stderr
    finally:
        holder.stdin.close()
        holder.wait(timeout=60)


@pytest.mark.slow
def test_a_chat_goes_on_when_the_holder_closes(demo_container, monkeypatch, capsys):
    """`ferry chat` attached to a holder that closes the model between two turns opens it itself."""
    import io

    from app.cli import main as ferry

    monkeypatch.setenv("FERRY_SHARE", "1")
    holder = _holder(demo_container)
    _wait_serving(demo_container, holder)

    class Lines(io.StringIO):
        calls = 0

        def readline(self, *a):
            Lines.calls += 1
            if Lines.calls == 2:       # after the first answer: the holder closes the model
                holder.stdin.close()
                holder.wait(timeout=60)
            return super().readline(*a)

    monkeypatch.setattr("sys.stdin", Lines("Hi\nHi\n\n"))
    try:
        assert ferry(["chat", str(demo_container), "-n", "6"]) == 0
    finally:
        if holder.poll() is None:
            holder.kill()
    out, err = capsys.readouterr()
    assert f"using the model already open in Ferry (pid {holder.pid}" in err
    assert "ferry: RAM budget" in err        # the second turn: opened here
    assert len(re.findall(r"\[\d+ tokens, \d+ prompt tokens evaluated", err)) == 2
    answers = [a.strip() for a in out.split("> ") if a.strip()]
    assert len(answers) == 2 and answers[0] == _reference(demo_container, "Hi", 6)
    assert answers[1] == _reference(demo_container, [{"role": "user", "content": "Hi"},
                                                     {"role": "assistant", "content": answers[0]},
                                                     {"role": "user", "content": "Hi"}], 6)
    assert _records() == []


#: A holder as HOLDER whose close can be held open: once its stdin closes it closes its engine service
#: (the drain, then its server stops: state "closing"), says "drained", and lets go of the model (the
#: record goes) only once the file argv[3] exists.
SLOW_CLOSER = HOLDER.replace("service.close()\n", """service.close()
print("drained", flush=True)
import os, time
while not os.path.exists(sys.argv[3]):
    time.sleep(0.05)
""")

#: `ferry ARGS...` that stops just before its first turn goes out to the holder's engine (after it
#: attached and saw the holder serving): it writes argv[1] and waits for the file argv[2] (a client
#: that checked the record just before the holder closed).
PAUSED_CLIENT = """
import os, sys, time
from app.engine.remote import RemoteEngine
generate = RemoteEngine.generate
def paused(self, request):
    open(sys.argv[1], "w").close()
    while not os.path.exists(sys.argv[2]):
        time.sleep(0.05)
    yield from generate(self, request)
RemoteEngine.generate = paused
from app.cli import main
sys.exit(main(sys.argv[3:]))
"""


@pytest.mark.slow
def test_a_turn_sent_as_the_holder_closes_is_answered(demo_container, tmp_path):
    """The race of a client that attached just before its holder closed: the holder drains (nothing
    to wait for), stops its server and is about to let go when the client's turn goes out. The turn
    fails to reach it, so the client opens the model itself — waiting for the closing holder to let
    go first — and answers; no turn fails."""
    want = _reference(demo_container, "Hi", 8)
    release, attached, go = tmp_path / "release", tmp_path / "attached", tmp_path / "go"
    holder = subprocess.Popen([sys.executable, "-c", SLOW_CLOSER, str(demo_container), "0", str(release)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              cwd=REPO, env=_env())
    client = None
    try:
        assert holder.stdout.readline().strip() == "ready", holder.stderr.read()
        _wait_serving(demo_container, holder)
        client = subprocess.Popen([sys.executable, "-c", PAUSED_CLIENT, str(attached), str(go), "run",
                                   str(demo_container), "-n", "8", "--json", "Hi"], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True, cwd=REPO, env=_env())
        deadline = time.monotonic() + 120
        while not attached.exists():
            assert client.poll() is None and time.monotonic() < deadline, client.communicate()
            time.sleep(0.05)
        holder.stdin.close()                       # the holder closes: its drain ends at once, its server stops
        assert holder.stdout.readline().strip() == "drained"
        (record,) = _records()
        assert record.state == "closing" and record.pid == holder.pid
        go.touch()                                 # the client's turn goes out to the stopped server
        time.sleep(1.0)                            # ... and it waits for the closing holder to let go
        assert client.poll() is None and _records()[0].pid == holder.pid
        release.touch()
        out, err = client.communicate(timeout=300)
        assert client.returncode == 0, err
        assert f"using the model already open in Ferry (pid {holder.pid}" in err
        assert "Traceback" not in err and "error" not in err
        assert json.loads(out)["text"] == want and "server" not in json.loads(out)   # answered by its own engine
    finally:
        release.touch()
        if client is not None and client.poll() is None:
            client.kill()
        holder.wait(timeout=60)
    assert _records() == []


@pytest.mark.slow
def test_the_real_window_holds_the_model_for_ferry_run(demo_container, tmp_path, monkeypatch):
    """The app itself (`python -m app --model`, offscreen), opening the demo as a user would, holds the
    model: a `ferry run` on it uses the window's engine and answers as an engine of its own would."""
    want = _reference(demo_container, "Hi", 12)
    monkeypatch.setenv("FERRY_HOME", str(tmp_path / "home"))      # the window's history and settings: its own
    env = _env(FERRY_PASSPHRASE="tractor violet harbour sonnet", QT_QPA_PLATFORM="offscreen")
    window = subprocess.Popen([sys.executable, "-m", "app", "--model", str(demo_container)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, cwd=REPO, env=env)
    try:
        owner = _wait_serving(demo_container, window)
        assert owner.pid == window.pid and owner.holder == "the Ferry window"
        run = _ferry("run", str(demo_container), "-n", "12", "--json", "Hi")
        assert f"using the model already open in Ferry (pid {window.pid}, the Ferry window)" in run.stderr
        assert _text(run) == want and json.loads(run.stdout)["server"] == owner.url
        assert len(_records()) == 1        # still the one engine
    finally:
        window.terminate()
        window.communicate(timeout=60)
    assert _records() == []                # the window's record went with it (stale, cleaned away)
