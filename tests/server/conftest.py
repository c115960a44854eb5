"""Server fixtures: `ferry serve` in a subprocess on a free loopback port, and
in-process servers on tiny models (thinking, tools)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from app.model import Finished, LoadedModel
from app.sampling import SamplingParams
from tests.conftest import REPO
# The GUI fixtures (offscreen Qt, in-memory keychain, windows, tiny models) for the remote-engine tests.
from tests.ui.conftest import make_window, thinking_model, tiny_chat  # noqa: F401


class Served:
    """A running `ferry serve`: its base URL, model id and process."""

    def __init__(self, proc: subprocess.Popen, url: str, model: str, log: Path):
        self.proc, self.url, self.model, self.log = proc, url, model, log

    def client(self, **kw):
        import openai

        return openai.OpenAI(base_url=self.url, api_key=kw.pop("api_key", "unused"), max_retries=0, **kw)

    def status(self) -> dict:
        key = getattr(self, "key", None)
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        return httpx.get(self.url.removesuffix("/v1") + "/ferry/status", headers=headers, timeout=10).json()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def start_ferry_serve(container: Path, tmp: Path, *args: str, env: dict | None = None,
                      script: Path | None = None, ctx: int | None = 2048) -> Served:
    """`ferry serve CONTAINER --port 0 --ctx CTX ...` (``ctx`` None: no --ctx, the default); waits for the
    line that names the URL. With ``script`` (tests/tools/scripted_ferry.py's SCRIPT.json) its sampler
    answers the script's ids."""
    log = tmp / "serve.log"
    launch = [str(REPO / "tests" / "tools" / "scripted_ferry.py"), str(script)] if script else ["-m", "app.cli"]
    cmd = [sys.executable, *launch, "serve", str(container), "--port", "0",
                                *([] if ctx is None else ["--ctx", str(ctx)]), *args]
    err = log.open("w")
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=err, text=True,
                            env={**os.environ, **({"PYTHONPATH": str(REPO)} if script else {}), **(env or {})})
    line = proc.stdout.readline()
    if " at http://" not in line:
        proc.kill()
        raise AssertionError(f"ferry serve did not start: {line!r}\n{log.read_text()}")
    url = line.split(" at ", 1)[1].split()[0]
    model = line.split("serving ", 1)[1].split(" at ", 1)[0]
    served = Served(proc, url, model, log)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if httpx.get(url.removesuffix("/v1") + "/openapi.json", timeout=2).status_code == 200:
                return served
        except httpx.HTTPError:
            time.sleep(0.1)
    served.stop()
    raise AssertionError("ferry serve did not answer")


@pytest.fixture(scope="module")
def served(demo_container, tmp_path_factory):
    s = start_ferry_serve(demo_container, tmp_path_factory.mktemp("serve"), "--max-tokens", "400")
    yield s
    s.stop()


def engine_answer(container: Path, messages: list[dict], max_tokens: int) -> str:
    """What the engine itself answers greedily (the reference for the server)."""
    model = LoadedModel(container)
    ids = model.encode_chat(messages)
    end = None
    for ev in model.generate(model.new_session(2048), ids, SamplingParams(), max_tokens=max_tokens):
        if isinstance(ev, Finished):
            end = ev
    model.close()
    return end.text


def copy_with_template(container: Path, dest: Path, template: str) -> Path:
    """A copy of a container with another chat template."""
    shutil.copytree(container, dest)
    import json

    manifest = json.loads((dest / "manifest.json").read_text())
    (dest / manifest["tokenizer"]["chat_template"]).write_text(template)
    return dest


@pytest.fixture(scope="session")
def tool_templates(demo_container, tmp_path_factory) -> dict[str, Path]:
    """The demo model with each tool template of ``tests/server/tool_templates.py``."""
    from tests.server import tool_templates as t

    root = tmp_path_factory.mktemp("tool_templates")
    return {name: copy_with_template(demo_container, root / f"{name}.ferry", source)
            for name, source in (("hermes", t.HERMES), ("llama31", t.LLAMA31), ("lists_tools", t.LISTS_TOOLS))}


@pytest.fixture(scope="session")
def tiny_k3(tmp_path_factory) -> Path:
    """The tiny random Kimi K3 (its own chat format: thinking, tools)."""
    from app.convert.convert import convert
    from tests.kimi import tiny_k3 as build_k3

    root = tmp_path_factory.mktemp("k3_server")
    build_k3.build(root / "ckpt")
    return convert(root / "ckpt", root / "k3.ferry", trunk_format="f32", expert_format="f32")


class Live:
    """A model served in this process (``app.server.Server`` on a free loopback
    port) with both official clients, so tests can script its sampler."""

    def __init__(self, container: Path, *, api_key: str | None = None, ctx: int = 2048):
        from app.server import Server

        self.model = LoadedModel(container, threads=2, n_ctx=ctx)
        self.server = Server(self.model, self.model.new_session(ctx), host="127.0.0.1", port=0,
                             api_key=api_key).start()
        self.key = api_key or "unused"
        self.id = self.server.model_id
        self.url = self.server.url

    def openai(self, **kw):
        import openai

        return openai.OpenAI(base_url=self.url, api_key=kw.pop("api_key", self.key), max_retries=0, **kw)

    def anthropic(self, **kw):
        import anthropic

        return anthropic.Anthropic(base_url=self.url.removesuffix("/v1"), api_key=kw.pop("api_key", self.key),
                                   max_retries=0, **kw)

    def close(self) -> None:
        self.server.stop()
        self.model.close()


@pytest.fixture
def live():
    """``live(container, api_key=None)``: a Live server, stopped after the test."""
    made: list[Live] = []

    def start(container: Path, **kw) -> Live:
        made.append(Live(container, **kw))
        return made[-1]

    yield start
    for s in made:
        s.close()
