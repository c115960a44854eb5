"""Issue 18, item 1: a model folder is a closed container. Paths its manifest
names never reach outside it, never open a FIFO or a device, and are size
limited; its chat template renders under time, step and size limits."""
from __future__ import annotations

import json
import os
import shutil
import time

import pytest

from app.chat.template import MAX_OUTPUT_CHARS, ChatTemplate, TemplateRenderError
from app.engine.container_files import (MAX_TEMPLATE_BYTES, ContainerFileError, contained_file,
                                        read_contained_text)
from app.model import LoadedModel, ModelError
from tests.conftest import run_ferry


@pytest.fixture
def chat_copy(tiny_chat, tmp_path):
    dst = tmp_path / "chat.ferry"
    shutil.copytree(tiny_chat, dst)
    return dst


def _set_tokenizer(container, **fields):
    doc = json.loads((container / "manifest.json").read_text())
    doc["tokenizer"].update(fields)
    (container / "manifest.json").write_text(json.dumps(doc))
    return doc


def _refused(container, *words):
    with pytest.raises(ModelError) as info:
        LoadedModel(container)
    for w in words:
        assert w in str(info.value), str(info.value)
    return str(info.value)


@pytest.mark.parametrize("field", ["chat_template", "file"])
@pytest.mark.parametrize("name, words", [
    ("/etc/hostname", ["absolute path"]),
    ("../../../../etc/hostname", ["'..'"]),
    ("sub/../../outside.txt", ["'..'"]),
    ("C:\\Windows\\win.ini", ["absolute path"]),
])
def test_manifest_paths_outside_the_container_are_refused(chat_copy, field, name, words):
    _set_tokenizer(chat_copy, **{field: name})
    _refused(chat_copy, f"tokenizer.{field}", *words)


def test_a_symlink_out_of_the_container_is_refused(chat_copy, tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("{{ 'host secret' }}")
    (chat_copy / "link.jinja").symlink_to(secret)
    _set_tokenizer(chat_copy, chat_template="link.jinja")
    _refused(chat_copy, "outside the model folder")


def test_a_symlink_inside_the_container_is_fine(chat_copy):
    doc = json.loads((chat_copy / "manifest.json").read_text())
    (chat_copy / "alias.jinja").symlink_to(chat_copy / doc["tokenizer"]["chat_template"])
    _set_tokenizer(chat_copy, chat_template="alias.jinja")
    model = LoadedModel(chat_copy)
    assert model.template is not None
    model.close()


@pytest.mark.parametrize("field", ["chat_template", "file"])
def test_dev_zero_and_fifos_are_never_opened(chat_copy, field):
    (chat_copy / "zero").symlink_to("/dev/zero")
    _set_tokenizer(chat_copy, **{field: "zero"})
    t0 = time.monotonic()
    _refused(chat_copy, "outside the model folder")
    os.mkfifo(chat_copy / "pipe")
    _set_tokenizer(chat_copy, **{field: "pipe"})
    _refused(chat_copy, "not a regular file")
    assert time.monotonic() - t0 < 20


def test_oversized_template_is_refused(chat_copy):
    (chat_copy / "big.jinja").write_text("x" * (MAX_TEMPLATE_BYTES + 1))
    _set_tokenizer(chat_copy, chat_template="big.jinja")
    _refused(chat_copy, "tokenizer.chat_template", "bytes")


def test_contained_file_rules(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "t.txt").write_text("hello")
    assert contained_file(tmp_path, "a/t.txt", "f", 10) == (tmp_path / "a" / "t.txt").resolve()
    assert read_contained_text(tmp_path, "a/t.txt", "f", 10) == "hello"
    for bad in ["", None, 3, "a/\x00", "/a/t.txt", "..", "a/../../x", "\\\\server\\share", "missing"]:
        with pytest.raises(ContainerFileError):
            contained_file(tmp_path, bad, "f", 10)
    with pytest.raises(ContainerFileError, match="most Ferry reads"):
        contained_file(tmp_path, "a/t.txt", "f", 4)
    (tmp_path / "bad.txt").write_bytes(b"\xff\xfe")
    with pytest.raises(ContainerFileError, match="not UTF-8"):
        read_contained_text(tmp_path, "bad.txt", "f", 10)


def test_cli_names_the_problem_without_a_traceback(chat_copy):
    _set_tokenizer(chat_copy, chat_template="../../../../etc/hostname")
    res = run_ferry("run", str(chat_copy), "w5 w6", "-n", "2", "--ctx", "128", check=False)
    assert res.returncode == 1
    assert "Traceback" not in res.stderr and "'..'" in res.stderr


# ---- the template sandbox

MESSAGES = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize("source, words", [
    ("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", ["steps"]),
    ("{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}", ["steps"]),
    ("{% for i in range(3000) %}{{ 'y' * 4000 }}{% endfor %}", ["characters"]),
    ("{{ 'x' * 100000000 }}", ["characters"]),
    ("{{ [1] * 100000000 }}", ["characters"]),
    ("{{ 10 ** 1000000 }}", ["power"]),
    ("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", ["template"]),
    ("{{ ''.__class__.__mro__[1].__subclasses__() }}", ["template"]),
])
def test_hostile_templates_fail_quickly_with_a_clear_error(source, words):
    t0 = time.monotonic()
    with pytest.raises(TemplateRenderError) as info:
        ChatTemplate(source).render(MESSAGES)
    assert time.monotonic() - t0 < 15
    for w in words:
        assert w in str(info.value)


def test_output_limit_is_generous_for_real_conversations():
    t = ChatTemplate("{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% endfor %}")
    long = [{"role": "user", "content": "y" * (MAX_OUTPUT_CHARS * 2)}] * 3
    segments = t.render(long)
    assert sum(len(s) for s, markup in segments if not markup) == 6 * MAX_OUTPUT_CHARS


def test_a_hostile_template_does_not_hang_ferry_run(chat_copy):
    doc = json.loads((chat_copy / "manifest.json").read_text())
    (chat_copy / doc["tokenizer"]["chat_template"]).write_text(
        "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}")
    t0 = time.monotonic()
    res = run_ferry("run", str(chat_copy), "w5 w6", "-n", "2", "--ctx", "128", check=False, timeout=120)
    assert res.returncode == 1, res.stderr
    assert "Traceback" not in res.stderr and "chat template" in res.stderr
    assert time.monotonic() - t0 < 60


def test_a_checkpoint_whose_tokenizer_is_dev_zero_or_a_fifo_is_refused(tmp_path):
    from app.convert.convert import convert
    from app.convert.errors import SourceError
    from tests.tiny_models import build

    ckpt = tmp_path / "ckpt"
    build("llama", ckpt, seed=1)
    (ckpt / "tokenizer.json").unlink()
    (ckpt / "tokenizer.json").symlink_to("/dev/zero")
    with pytest.raises(SourceError, match="not a regular file"):
        convert(ckpt, tmp_path / "out.ferry")
    (ckpt / "tokenizer.json").unlink()
    os.mkfifo(ckpt / "tokenizer.json")
    with pytest.raises(SourceError, match="not a regular file"):
        convert(ckpt, tmp_path / "out2.ferry")
