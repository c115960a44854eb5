"""The documents panel (offscreen Qt): background indexing with progress and
unreadable files named; a citation opens with its passage highlighted; no
listening socket."""
from __future__ import annotations

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import psutil
import pytest

pytest.importorskip("pytestqt")

from app.documents.store import DocumentStore
from app.store.crypto import KeychainKeys


def test_attach_index_and_show_citation(qtbot, kr, home, corpus_dir, tmp_path, demo_container, monkeypatch):
    from app.api import TurnRequest
    from app.controller.passages import attach_passages, link_markers
    from app.ui.citation_dialog import show_citation
    from app.ui.documents_panel import open_documents_panel

    (tmp_path / "bad.pdf").write_bytes(b"%PDF-1.4 broken")
    store = DocumentStore(keys=KeychainKeys())
    panel = open_documents_panel(None, store, "conversation:1")
    qtbot.addWidget(panel)
    with qtbot.waitSignal(panel.indexing_finished, timeout=60000) as sig:
        panel.add_paths([str(corpus_dir), str(tmp_path / "bad.pdf")])
        assert panel.busy
    report = sig.args[0]
    assert len(report["added"]) == 5 and [f["name"] for f in report["failed"]] == ["bad.pdf"]
    assert panel.files_list.count() == 5
    assert panel.errors.isVisible() and "bad.pdf" in panel.errors.item(0).text()
    assert "could not be read" in panel.status.text()
    panel.budget.setValue(256)
    assert store.collection("conversation:1").budget == 256

    request = TurnRequest([{"role": "user", "content": "How many litres does the water tank hold?"}])
    from app.model import LoadedModel
    model = LoadedModel(demo_container)
    citations = attach_passages(request, store, "conversation:1", model,
                                "How many litres does the water tank hold?")
    assert request.messages[0]["role"] == "system" and "[1]" in request.messages[0]["content"]
    assert request.messages[1] == {"role": "user", "content": "How many litres does the water tank hold?"}
    tank = next(c for c in citations if "3.5 litres" in c.passage)
    md, used = link_markers(f"The tank holds 3.5 litres [{tank.n}].", citations)
    assert f"[\\[{tank.n}\\]](cite:{tank.n})" in md and used[0].n == tank.n

    dialog = show_citation(None, store, tank)
    qtbot.addWidget(dialog)
    assert dialog.highlighted_text() == tank.passage
    from PySide6.QtGui import QDesktopServices
    opened = []
    monkeypatch.setattr(QDesktopServices, "openUrl", lambda url: opened.append(url.toLocalFile()) or True)
    dialog.open_btn.click()                       # the cited file in its own application (issue 34)
    assert opened == [tank.path]
    assert "page 2" in dialog.windowTitle()
    listening = [c for c in psutil.Process().net_connections(kind="inet") if c.status == psutil.CONN_LISTEN]
    assert listening == []
    dialog.close()
    panel.close()
    store.close()
    model.close()
