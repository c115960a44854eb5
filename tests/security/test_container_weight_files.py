"""Issue 32, item "the container's files are regular files inside the container": the trunk,
every expert bank and the manifest are opened without waiting on a FIFO, never as a device or
a folder, and never through a link out of the model folder -- in the C core (``ferry info``,
``verify``, ``run``, the engine) and in Python (LoadedModel), each with a one-line error."""
from __future__ import annotations

import json
import os
import shutil
import time

import pytest

from app.engine.binding import Engine, FerryError, verify
from app.model import LoadedModel, ModelError
from tests.conftest import run_ferry


@pytest.fixture
def moe_copy(tiny_moe, tmp_path):
    dst = tmp_path / "moe.ferry"
    shutil.copytree(tiny_moe[1], dst)
    return dst


def _bank(container) -> str:
    return json.loads((container / "manifest.json").read_text())["expert_banks"][0]["file"]


def _replace(container, name: str, how: str, tmp_path) -> None:
    """Make ``name`` in the container a FIFO, a folder, or a link to a copy of it outside the folder."""
    path = container / name
    if how == "fifo":
        path.unlink()
        os.mkfifo(path)
    elif how == "folder":
        path.unlink()
        path.mkdir()
    elif how == "link_out":
        outside = tmp_path / f"outside-{name.replace('/', '_')}"
        shutil.move(path, outside)
        path.symlink_to(outside)
    elif how == "device":
        path.unlink()
        path.symlink_to("/dev/zero")


CASES = [("fifo", "FIFO"), ("folder", "not a regular file"), ("link_out", "outside the model folder"),
         ("device", "outside the model folder")]


def _names(container):
    return ["trunk.bin", _bank(container)]


@pytest.mark.parametrize("how, words", CASES)
@pytest.mark.parametrize("which", [0, 1], ids=["trunk", "bank"])
def test_the_c_core_refuses_what_is_not_a_file_of_the_container(moe_copy, tmp_path, how, words, which):
    name = _names(moe_copy)[which]
    _replace(moe_copy, name, how, tmp_path)
    t0 = time.monotonic()
    for call in (lambda: Engine(moe_copy), lambda: verify(moe_copy)):
        with pytest.raises(FerryError) as info:
            call()
        assert name in str(info.value) and words in str(info.value), str(info.value)
    assert time.monotonic() - t0 < 20


@pytest.mark.parametrize("how, words", CASES)
@pytest.mark.parametrize("which", [0, 1], ids=["trunk", "bank"])
def test_python_refuses_them_naming_the_field(moe_copy, tmp_path, how, words, which):
    name = _names(moe_copy)[which]
    _replace(moe_copy, name, how, tmp_path)
    with pytest.raises(ModelError) as info:
        LoadedModel(moe_copy)
    msg = str(info.value)
    assert words in msg and ("trunk.bin" in msg if which == 0 else "expert_banks[0].file" in msg), msg


def test_a_fifo_manifest_is_refused_not_waited_on(moe_copy):
    (moe_copy / "manifest.json").unlink()
    os.mkfifo(moe_copy / "manifest.json")
    with pytest.raises(ModelError, match="manifest.json is not a regular file"):
        LoadedModel(moe_copy)
    with pytest.raises(FerryError, match="manifest.json is not a regular file"):
        verify(moe_copy)


def test_links_inside_the_container_are_fine(moe_copy):
    bank = moe_copy / _bank(moe_copy)
    (moe_copy / "real-trunk.bin").write_bytes((moe_copy / "trunk.bin").read_bytes())
    (moe_copy / "trunk.bin").unlink()
    (moe_copy / "trunk.bin").symlink_to("real-trunk.bin")
    shutil.move(bank, moe_copy / "bank-data.bin")
    bank.symlink_to(moe_copy / "bank-data.bin")
    verify(moe_copy)
    LoadedModel(moe_copy).close()


@pytest.mark.parametrize("command", ["info", "verify", "run"])
def test_ferry_commands_do_not_hang_on_a_fifo_bank(moe_copy, tmp_path, command):
    _replace(moe_copy, _bank(moe_copy), "fifo", tmp_path)
    args = [command, str(moe_copy)] + (["w5", "-n", "2", "--ctx", "64"] if command == "run" else [])
    res = run_ferry(*args, check=False, timeout=60)
    assert res.returncode != 0 and "Traceback" not in res.stderr, res.stderr
    assert "FIFO" in res.stderr and len(res.stderr.strip().splitlines()) == 1, res.stderr
