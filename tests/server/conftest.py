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


def start_ferry_serve(container: Path, tmp: Path, *args: str, env: dict | None = None) -> Served:
    """`ferry serve CONTAINER --port 0 ...`; waits for the line that names the URL."""
    log = tmp / "serve.log"
    cmd = [sys.executable, "-m", "app.cli", "serve", str(container), "--port", "0", "--ctx", "2048", *args]
    err = log.open("w")
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=err, text=True,
                            env={**os.environ, **(env or {})})
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
