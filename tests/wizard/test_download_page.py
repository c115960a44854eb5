"""The wizard's "Download a model": the catalogue, the plan of a repository
on a hub on loopback, the download converted while it arrives, pause, the
network banner, then the Finish page's verification; screenshot."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
from PySide6.QtWidgets import QWizard

from app.memory.budget import MachineMemory
from tests.get.conftest import hub, local_convert, repos, tree_bytes  # noqa: F401  (fixtures)
from tests.wizard.conftest import T

BIG = MachineMemory(64 << 30, 64 << 30, "test")
SHOTS = Path(os.environ.get("FERRY_SCREENSHOTS", "")) if os.environ.get("FERRY_SCREENSHOTS") else None


@pytest.mark.slow
def test_download_a_model_from_the_wizard(qtbot, wizard, hub, repos, tmp_path):  # noqa: F811
    wiz = wizard(remember=False)
    wiz.next()
    page = wiz.source_page
    assert "Download a model" in page.radios["download"].text()
    page.choose("download")
    assert page.isComplete() and not page.path_row.isVisible()
    dl = wiz.download_page
    dl.into = tmp_path / "models"
    dl.plan_kwargs = {"memory": BIG, "disk_bps": 2e9, "kernel_bps": 5e9}
    wiz.next()
    assert wiz.currentPage() is dl
    qtbot.waitUntil(lambda: dl.catalogue.count() >= 8, timeout=T)
    assert any("Kimi K3" in dl.catalogue.item(i).text() for i in range(dl.catalogue.count()))
    log_before = len(hub.log)
    assert log_before == 0                          # nothing asked of the network until a repository is
    dl.repo_edit.setText("moonshotai/Kimi-K3-tiny")
    dl.plan()
    qtbot.waitUntil(lambda: dl.current_plan is not None, timeout=T)
    assert "Runs well" in dl.plan_text.text() and dl.start_btn.isEnabled()
    assert hub.shard_gets() == []
    if SHOTS:
        dl.grab().save(str(SHOTS / "wizard-download-plan.png"))
    hub.rate = 250_000
    seen_banner = []
    dl.relay.progress.connect(lambda p: seen_banner.append(dl.network.text()))
    dl.start()
    assert "using the network" in dl.network.text()
    qtbot.waitUntil(lambda: "Downloaded" in dl.status.text(), timeout=T)
    dl.toggle_pause()
    assert dl.pause_btn.text() == "Resume"
    qtbot.wait(300)
    if SHOTS:
        wiz.grab().save(str(SHOTS / "wizard-download.png"))
    dl.toggle_pause()
    qtbot.waitUntil(dl.isComplete, timeout=T)
    assert dl.network.text() == "" and any("using the network" in t for t in seen_banner)
    out = wiz.state.result
    plan = dl.current_plan
    ref = local_convert(repos["k3"], tmp_path / "ref", "Kimi-K3-tiny", trunk_format=plan.trunk_format,
                        expert_format=plan.expert_format)
    assert tree_bytes(out) == tree_bytes(ref)
    wiz.next()
    assert wiz.currentPage() is wiz.finish_page
    qtbot.waitUntil(wiz.finish_page.isComplete, timeout=T)
    assert "The model is ready" in wiz.finish_page.message.text()
    with qtbot.waitSignal(wiz.model_ready, timeout=T) as ready:
        wiz.button(QWizard.WizardButton.FinishButton).click()
    assert ready.args == [str(out), 0]


def test_a_refused_repository_is_explained_on_the_page(qtbot, wizard, hub, tmp_path):  # noqa: F811
    hub.repos["meta/tiny-llama"].gated = True
    wiz = wizard(remember=False)
    wiz.next()
    wiz.source_page.choose("download")
    dl = wiz.download_page
    dl.into = tmp_path
    dl.plan_kwargs = {"memory": BIG, "disk_bps": 2e9, "kernel_bps": 5e9}
    wiz.next()
    dl.repo_edit.setText("meta/tiny-llama")
    dl.plan()
    qtbot.waitUntil(lambda: "cannot be downloaded" in dl.plan_text.text(), timeout=T)
    assert "gated" in dl.plan_text.text() and not dl.start_btn.isEnabled() and not dl.isComplete()
