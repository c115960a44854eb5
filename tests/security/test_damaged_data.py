"""Issue 18, item 5: damaged data is never used silently. The trunk is
checked on open; with --verify-reads (or the setting) each expert record is
checked as it lands in the cache, and a damaged one ends that answer with an
error naming it while the session stays usable."""
from __future__ import annotations

import json
import shutil

import pytest

from app.model import Finished, LoadedModel
from app.sampling import SamplingParams
from app.store.settings import Settings
from app.ui.worker import load_options
from tests.conftest import run_ferry


@pytest.fixture
def damaged(tiny_moe, tmp_path):
    """The tiny MoE container with one byte flipped in every expert record of its first bank."""
    dst = tmp_path / "moe.ferry"
    shutil.copytree(tiny_moe[1], dst)
    bank = json.loads((dst / "manifest.json").read_text())["expert_banks"][0]
    path = dst / bank["file"]
    data = bytearray(path.read_bytes())
    for e in range(bank["n_experts"]):
        data[4096 + e * bank["record_size"] + bank["gate"]["offset"] + 5] ^= 0x10
    path.write_bytes(bytes(data))
    return dst, bank


def _answer(model, session, ids):
    return next(ev for ev in model.generate(session, ids, SamplingParams(), max_tokens=4) if isinstance(ev, Finished))


def test_a_damaged_record_ends_the_answer_with_its_name(damaged):
    container, bank = damaged
    model = LoadedModel(container, verify_reads=True)
    session = model.new_session(64)
    end = _answer(model, session, [5, 6, 7])
    assert end.reason == "error"
    assert bank["file"] in end.error and f"layer {bank['layer']} expert" in end.error and "damaged" in end.error
    # The session is still usable: it holds what it held, and the next answer gets the same clear error.
    assert session.position == 0
    again = _answer(model, session, [9, 10])
    assert again.reason == "error" and "damaged" in again.error
    model.close()


def test_without_verify_reads_the_damage_is_not_caught(damaged):
    container, _ = damaged
    model = LoadedModel(container)
    assert _answer(model, model.new_session(64), [5, 6, 7]).reason != "error"
    model.close()


def test_verify_reads_on_the_command_line(damaged):
    container, bank = damaged
    res = run_ferry("run", str(container), "w5 w6", "--raw", "-n", "3", "--ctx", "64", "--verify-reads",
                    check=False, timeout=120)
    assert res.returncode == 1 and "Traceback" not in res.stderr
    assert bank["file"] in res.stderr and "damaged" in res.stderr


def test_verify_reads_is_a_setting_the_window_passes_on(qtbot):
    from app.ui.settings_dialog import SettingsDialog

    assert load_options(Settings(verify_reads=True)).verify_reads is True
    assert Settings(verify_reads=1).validated().verify_reads is True
    d = SettingsDialog(Settings())
    qtbot.addWidget(d)
    assert not d.verify_reads.isChecked()
    d.verify_reads.setChecked(True)
    assert d.result_settings().verify_reads is True
