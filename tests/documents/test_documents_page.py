"""The window's documents page (offscreen Qt): collections with counts, size and
last indexed; per-file status with the reason a file was skipped; add a
folder in the background, watch, remove a file, re-index, remove a collection."""
from __future__ import annotations

import os
import shutil

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import pytest

pytest.importorskip("pytestqt")

from app.documents.library import collection_rows, file_rows, reading_label, when
from app.documents.store import DocumentStore
from app.store.crypto import PassphraseKeys


def test_library_rows_without_qt(home, corpus_dir, tmp_path):
    folder = tmp_path / "box"
    shutil.copytree(corpus_dir, folder)
    (folder / "broken.pdf").write_bytes(b"%PDF-1.4 broken")
    (folder / "photo.jpg").write_bytes(b"\xff\xd8\xff")
    store = DocumentStore(keys=PassphraseKeys("pw"))
    store.add("box", [folder])
    [row] = collection_rows(store)
    assert (row.name, row.files, row.skipped, row.watched) == ("box", 5, 2, 0)
    assert row.size.endswith("KiB") and row.last_indexed == "just now" and row.sources == [str(folder)]
    files = file_rows(store, "box")
    assert [f.status for f in files[:2]] == ["skipped", "skipped"]           # what needs attention first
    assert {f.name: f.detail for f in files[:2]}["photo.jpg"].startswith("unsupported file type")
    assert "passages" in files[2].detail
    assert reading_label(6, 400, 1200, 10.0) == "Reading 6 passages: 400 of 1200 tokens, about 20 s left"
    assert reading_label(0, 0, 80, 0.0) == "Reading the prompt: 0 of 80 tokens"
    assert reading_label(1, 100, 10_100, 60.0).endswith("about 100 min left")
    assert when(None) == "never" and when(100.0, 160.0 + 3600) == "1 h ago"
    store.close()


def test_documents_page(qtbot, home, corpus_dir, tmp_path):
    from app.ui.documents_page import open_documents_page

    folder = tmp_path / "papers"
    shutil.copytree(corpus_dir, folder)
    (folder / "broken.pdf").write_bytes(b"%PDF-1.4 broken")
    store = DocumentStore(keys=PassphraseKeys("pw"))
    page = open_documents_page(None, store)
    qtbot.addWidget(page)
    assert page.collections.rowCount() == 0 and "No collections" in page.status.text()
    with qtbot.waitSignal(page.indexing_finished, timeout=60000) as sig:
        page.add_folder("papers", str(folder), watch=True)
        assert page.busy
    assert len(sig.args[0]["added"]) == 5
    assert page.collections.rowCount() == 1
    cells = [page.collections.item(0, j).text() for j in range(7)]
    assert cells[:4] == ["papers", "5", "1", cells[3]] and cells[5] == "just now" and cells[6] == "yes"
    assert page.files.rowCount() == 6
    assert (page.files.item(0, 0).text(), page.files.item(0, 1).text()) == ("broken.pdf", "skipped")
    assert page.watch_box.isChecked()
    page.set_watch(False)
    assert page.collections.item(0, 6).text() == "" and not page.watch_box.isChecked()

    # remove a file: its passages go; re-index: a changed file is read again, a deleted one removed
    page.remove_file(str(folder / "lease.md"))
    assert page.collections.item(0, 1).text() == "4"
    (folder / "discharge.txt").unlink()
    with qtbot.waitSignal(page.indexing_finished, timeout=60000) as sig:
        page.reindex()
    report = sig.args[0]
    assert [os.path.basename(p) for p in report["added"]] == ["lease.md"]       # it is still in the folder
    assert [os.path.basename(p) for p in report["removed"]] == ["discharge.txt"]
    assert page.collections.item(0, 1).text() == "4" and "1 removed" in page.status.text()
    page.grab().save(str(tmp_path / "documents-page.png"))
    page.remove_collection("papers")
    assert page.collections.rowCount() == 0 and store.collections() == []
    page.close()
    store.close()
