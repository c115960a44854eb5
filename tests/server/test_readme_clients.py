"""The README's two client examples (an OpenAI-style and a Claude-style `python -c` line) run as
written against `ferry serve demo`, only the port changed: the model id they name is the one the
server lists, and both print the demo's answer (issue 35: the docs show real clients)."""
from __future__ import annotations

import re
import shlex
import subprocess
import sys

import pytest

from tests.conftest import REPO
from tests.server.conftest import start_ferry_serve

pytestmark = pytest.mark.slow


def readme_examples() -> list[str]:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    return [line for line in text.splitlines() if line.startswith("python -c '") and "127.0.0.1:8000" in line]


def test_the_readme_names_both_clients():
    lines = readme_examples()
    assert len(lines) == 2 and any("openai" in x for x in lines) and any("anthropic" in x for x in lines)


def test_the_readme_client_examples_answer(tmp_path):
    served = start_ferry_serve("demo", tmp_path)
    try:
        port = re.search(r":(\d+)/", served.url).group(1)
        for line in readme_examples():
            assert f'model="{served.model}"' in line, f"the README names another model than {served.model}"
            argv = shlex.split(line.replace("127.0.0.1:8000", f"127.0.0.1:{port}"))
            res = subprocess.run([sys.executable, *argv[1:]], capture_output=True, text=True, timeout=300)
            assert res.returncode == 0, res.stderr[-2000:]
            assert "Paris" in res.stdout, (line[:60], res.stdout)
    finally:
        served.stop()
