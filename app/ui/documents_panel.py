"""Documents in the app: attach files or folders to a conversation (or a named
collection), watch them being read in the background, set the passage
budget, and open a citation with its passage highlighted in its page.

The main window needs only these calls (see docs/DOCUMENTS.md):

* ``open_documents_panel(parent, store, collection)`` — the "Attach…" dialog;
* ``PassageSearch(store, collection, model_path, question)`` — sent with a
  turn to the engine thread, which searches there (through a connection of
  its own) and calls ``attach_passages(request, store, collection,
  model_path, question)``: the best passages go into the request's messages
  (as content) and the citations for that answer come back; the GUI thread
  never waits for a search;
* ``link_markers(text, citations)`` — the answer's ``[n]`` markers as
  ``cite:n`` links, and ``show_citation(parent, store, citation)`` when one
  is clicked.

Indexing runs on its own QThread with its own connection to the store; the
GUI thread never waits for it.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from PySide6.QtCore import QObject, Qt, QThread, Signal, Slot
from PySide6.QtGui import QColor, QTextCharFormat, QTextCursor
from PySide6.QtWidgets import (QDialog, QDialogButtonBox, QFileDialog, QHBoxLayout, QLabel, QListWidget,
                               QProgressBar, QPushButton, QSpinBox, QTextEdit, QVBoxLayout, QWidget)

from app.api import TurnRequest
from app.documents.library import count
from app.documents.ask import Citation, _citation, cite
from app.documents.prompt import EstimatedTokens, passages_message, select_passages
from app.documents.store import DocumentError, DocumentStore
from app.documents.extract import SUFFIXES
from app.documents.walk import display_name

FILE_FILTER = "Documents (" + " ".join(f"*{s}" for s in sorted(SUFFIXES)) + ")"


class _AddWorker(QObject):
    progress = Signal(int, int, str, str, str)     #: done, total, file name, stage, message
    summary = Signal(str)                          #: files, MB, passages, time left (AddProgress.summary)
    finished = Signal(object)                      #: AddReport.as_dict()

    def __init__(self, store: DocumentStore, collection: str, paths: list[str] | None, watch: bool | None = None):
        super().__init__()
        self._store, self._collection, self._paths, self._watch = store, collection, paths, watch
        self._cancel = False

    def cancel(self) -> None:
        self._cancel = True

    @Slot()
    def run(self) -> None:
        store = self._store.clone()     # a connection of this thread's own
        try:
            def progress(p):
                self.progress.emit(p.done, p.total, display_name(p.path.name), p.stage, p.message)
                self.summary.emit(p.summary())

            if self._paths is None:         # re-index: bring the collection up to date with its sources
                report = store.rescan(self._collection, cancelled=lambda: self._cancel, progress=progress)
            else:
                report = store.add(self._collection, self._paths, cancelled=lambda: self._cancel,
                                   progress=progress, watch=self._watch)
            self.finished.emit(report.as_dict())
        except Exception as exc:  # report, never crash the window
            self.finished.emit({"added": [], "unchanged": [], "failed": [{"path": "", "name": "",
                                                                          "error": str(exc)}],
                                "chunks": 0, "cancelled": False})
        finally:
            store.close()


class AddRunner(QObject):
    """One add or re-index at a time on a QThread of its own (the GUI thread never waits)."""

    progress = Signal(int, int, str, str, str)
    summary = Signal(str)
    finished = Signal(object)

    def __init__(self, parent: QObject):
        super().__init__(parent)
        self._thread: QThread | None = None
        self._worker: _AddWorker | None = None

    @property
    def busy(self) -> bool:
        return self._thread is not None

    def start(self, store: DocumentStore, collection: str, paths: list[str] | None, watch: bool | None = None) -> bool:
        if self._thread is not None:
            return False
        self._thread = QThread(self)
        self._worker = _AddWorker(store, collection, paths, watch)
        self._worker.moveToThread(self._thread)
        self._thread.started.connect(self._worker.run)
        self._worker.progress.connect(self.progress)
        self._worker.summary.connect(self.summary)
        self._worker.finished.connect(self._done)
        self._thread.start()
        return True

    def cancel(self) -> None:
        if self._worker is not None:
            self._worker.cancel()

    def _done(self, report: dict) -> None:
        self._thread.quit()
        self._thread.wait()
        self._worker.deleteLater()
        self._thread.deleteLater()
        self._thread = self._worker = None
        self.finished.emit(report)

    def stop(self) -> None:
        """Cancel and wait (a closing dialog)."""
        if self._worker is not None:
            self._worker.cancel()
            self._thread.quit()
            self._thread.wait(10000)


def progress_widgets(lay: QVBoxLayout) -> tuple[QProgressBar, QLabel]:
    bar = QProgressBar()
    bar.setAccessibleName("Indexing progress")
    bar.hide()
    status = QLabel("")
    status.setWordWrap(True)
    lay.addWidget(bar)
    lay.addWidget(status)
    return bar, status


class DocumentsPanel(QDialog):
    """The files of one collection, "Add files…"/"Add folder…", progress,
    the files that could not be read (by name), and the passage budget."""

    indexing_finished = Signal(object)   #: the AddReport as a dict

    def __init__(self, store: DocumentStore, collection: str, parent: QWidget | None = None,
                 title: str | None = None):
        super().__init__(parent)
        self.store, self.collection = store, collection
        self.setWindowTitle(f"Documents — {title or collection}")
        self.setAccessibleName("Documents")
        self.resize(560, 460)
        lay = QVBoxLayout(self)
        lay.addWidget(QLabel("Files are read and indexed on this computer; nothing leaves it. "
                             "The index is encrypted with your history's key."))
        self.files_list = QListWidget()
        self.files_list.setAccessibleName("Attached files")
        lay.addWidget(self.files_list, 1)
        row = QHBoxLayout()
        self.add_files_btn = QPushButton("Add files…")
        self.add_files_btn.clicked.connect(self._pick_files)
        self.add_folder_btn = QPushButton("Add folder…")
        self.add_folder_btn.clicked.connect(self._pick_folder)
        row.addWidget(self.add_files_btn)
        row.addWidget(self.add_folder_btn)
        row.addStretch(1)
        row.addWidget(QLabel("Passages in each prompt, up to"))
        self.budget = QSpinBox()
        self.budget.setRange(64, 32768)
        self.budget.setSingleStep(128)
        self.budget.setSuffix(" tokens")
        self.budget.setAccessibleName("Passage token budget")
        self.budget.valueChanged.connect(self._budget_changed)
        row.addWidget(self.budget)
        lay.addLayout(row)
        self.progress, self.status = progress_widgets(lay)
        self.errors = QListWidget()
        self.errors.setAccessibleName("Files that could not be read")
        self.errors.hide()
        lay.addWidget(self.errors)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        buttons.rejected.connect(self.close)
        lay.addWidget(buttons)
        self._runner = AddRunner(self)
        self._runner.progress.connect(self._on_progress)
        self._runner.finished.connect(self._on_finished)
        self.refresh()

    # ---- state

    def refresh(self) -> None:
        self.files_list.clear()
        try:
            coll = self.store.collection(self.collection)
        except DocumentError:
            self.budget.blockSignals(True)
            self.budget.setValue(1024)
            self.budget.blockSignals(False)
            self.status.setText("No files yet: add files or a folder.")
            return
        self.budget.blockSignals(True)
        self.budget.setValue(coll.budget)
        self.budget.blockSignals(False)
        for f in self.store.files(self.collection):
            if f.status != "indexed":
                continue            # listed under "could not be read" while adding, and on the documents page
            pages = f"{count(f.pages, 'page')}, " if f.kind == "pdf" else ""
            self.files_list.addItem(f"{f.name}  —  {f.kind}, {pages}{count(f.chunks, 'passage')}")

    def _budget_changed(self, value: int) -> None:
        try:
            self.store.set_budget(self.collection, value)
        except DocumentError:
            pass  # no collection yet: it gets the default

    # ---- adding

    def _pick_files(self) -> None:
        names, _ = QFileDialog.getOpenFileNames(self, "Attach files", str(Path.home()), FILE_FILTER)
        if names:
            self.add_paths(names)

    def _pick_folder(self) -> None:
        folder = QFileDialog.getExistingDirectory(self, "Attach a folder", str(Path.home()))
        if folder:
            self.add_paths([folder])

    def add_paths(self, paths: list[str]) -> None:
        """Read and index files/folders in the background."""
        if self._runner.busy:
            return
        self.errors.clear()
        self.errors.hide()
        self.progress.setRange(0, 0)
        self.progress.show()
        self.status.setText("Reading…")
        self.add_files_btn.setEnabled(False)
        self.add_folder_btn.setEnabled(False)
        self._runner.start(self.store, self.collection, [str(p) for p in paths])

    @property
    def busy(self) -> bool:
        return self._runner.busy

    def _on_progress(self, done: int, total: int, name: str, stage: str, message: str) -> None:
        if total:
            self.progress.setRange(0, total)
            self.progress.setValue(done)
        if stage == "failed":
            self.errors.show()
            self.errors.addItem(f"{name}: {message}")
        elif stage == "reading":
            self.status.setText(f"Reading {name} ({done + 1} of {total})…")

    def _on_finished(self, report: dict) -> None:
        self.progress.hide()
        self.add_files_btn.setEnabled(True)
        self.add_folder_btn.setEnabled(True)
        failed = report.get("failed", [])
        for f in failed:
            if not f.get("name"):
                self.errors.show()
                self.errors.addItem(f["error"])
        self.status.setText(f"{len(report['added'])} added ({count(report['chunks'], 'passage')}), "
                            f"{len(report['unchanged'])} unchanged, {len(failed)} could not be read.")
        self.refresh()
        self.indexing_finished.emit(report)

    def closeEvent(self, event) -> None:
        self._runner.stop()
        super().closeEvent(event)


class CitationDialog(QDialog):
    """A cited passage in its page, highlighted and scrolled into view."""

    def __init__(self, page_text: str, citation: Citation, parent: QWidget | None = None):
        super().__init__(parent)
        where = citation.file + (f", page {citation.page}" if citation.page is not None else "")
        self.setWindowTitle(f"[{citation.n}] {where}")
        self.setAccessibleName("Cited passage")
        self.resize(620, 480)
        lay = QVBoxLayout(self)
        head = QLabel(f"<b>[{citation.n}]</b> {where}" + (f" — {citation.heading}" if citation.heading else ""))
        head.setTextFormat(Qt.TextFormat.RichText)
        lay.addWidget(head)
        path = QLabel(citation.path)
        path.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        lay.addWidget(path)
        self.text = QTextEdit()
        self.text.setReadOnly(True)
        self.text.setAccessibleName("Page text")
        self.text.setPlainText(page_text)
        start, end = citation.start, citation.end
        if page_text[start:end] != citation.passage:     # the file changed since: find the passage
            at = page_text.find(citation.passage)
            start, end = (at, at + len(citation.passage)) if at >= 0 else (0, 0)
        self.highlight = (start, end)
        if end > start:
            cursor = QTextCursor(self.text.document())
            cursor.setPosition(start)
            cursor.setPosition(end, QTextCursor.MoveMode.KeepAnchor)
            fmt = QTextCharFormat()
            fmt.setBackground(QColor("#ffe58a"))
            fmt.setForeground(QColor("#000000"))
            sel = QTextEdit.ExtraSelection()
            sel.cursor, sel.format = cursor, fmt
            self.text.setExtraSelections([sel])
            view = QTextCursor(self.text.document())
            view.setPosition(end)
            self.text.setTextCursor(view)
            view.setPosition(start)
            self.text.setTextCursor(view)
            self.text.ensureCursorVisible()
        lay.addWidget(self.text, 1)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        buttons.rejected.connect(self.close)
        lay.addWidget(buttons)

    def highlighted_text(self) -> str:
        sels = self.text.extraSelections()
        return sels[0].cursor.selectedText().replace("\u2029", "\n") if sels else ""


# ---------------------------------------------------------------- the main window's calls

def open_documents_panel(parent: QWidget | None, store: DocumentStore, collection: str,
                         title: str | None = None) -> DocumentsPanel:
    """``title``: what the dialog is called after (the chat's name), instead of the collection's id."""
    panel = DocumentsPanel(store, collection, parent, title)
    panel.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
    panel.show()
    return panel


def show_citation(parent: QWidget | None, store: DocumentStore, citation: Citation) -> CitationDialog:
    try:
        page = store.page_text(citation.file_id, citation.page)
    except DocumentError:
        page = citation.passage
    dialog = CitationDialog(page, citation, parent)
    dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
    dialog.show()
    return dialog


class _TokenCounter:
    """The model's tokenizer, for counting passage tokens on the GUI thread
    (an estimate for a remote engine, which has no local container)."""

    def __init__(self, model_path: str | Path):
        from app.chat.hf_tokenizer import HFTokenizer
        from app.engine.container_files import (MAX_TOKENIZER_BYTES, ContainerFileError, contained_file,
                                                read_manifest)
        from app.model import TiktokenContainerTokenizer

        if not (Path(model_path) / "manifest.json").exists():
            self.tokenizer = EstimatedTokens()
            return
        try:    # read as the model reads it: a regular file inside the folder, never a FIFO
            tok = read_manifest(model_path).get("tokenizer") or {}
            tok = tok if isinstance(tok, dict) else {}
            cls = TiktokenContainerTokenizer if tok.get("kind") == "tiktoken" else HFTokenizer
            path = contained_file(model_path, tok.get("file"), "tokenizer.file", MAX_TOKENIZER_BYTES)
        except ContainerFileError:   # the model itself refuses to open; counting is only an estimate then
            self.tokenizer = EstimatedTokens()
            return
        self.tokenizer = cls(path)


_COUNTERS: dict[str, _TokenCounter] = {}


@dataclass(frozen=True)
class PassageSearch:
    """A turn's documents, searched on the engine's thread (``EngineWorker.generate``) rather than the
    window's: ``store`` is the window's store (its file and key); the search runs through a clone of it
    that the engine thread keeps (its page cache stays warm from one question to the next)."""

    store: DocumentStore
    collection: str
    model_path: str
    question: str

    def attach(self, request: TurnRequest, store: DocumentStore) -> list[Citation]:
        return attach_passages(request, store, self.collection, self.model_path, self.question)


def attach_passages(request: TurnRequest, store: DocumentStore, collection: str, model_path: str | Path,
                    question: str) -> list[Citation]:
    """Put the collection's best passages for ``question`` into ``request.messages``
    (in the system message, as content), within the collection's token budget;
    returns the numbered passages, for :func:`link_markers` and citations."""
    try:
        coll = store.collection(collection)
    except DocumentError:
        return []
    counter = _COUNTERS.setdefault(str(model_path), _TokenCounter(model_path))
    chosen, _whole, _used = select_passages(counter, store.index(collection), question, coll.budget)
    if not chosen:
        return []
    from app.documents.prompt import Passage

    passages = [Passage(i + 1, c, s, 0) for i, (c, s) in enumerate(chosen)]
    block = passages_message(passages)   # the same system message as `ferry docs ask`
    messages = [dict(m) for m in request.messages]
    if messages and messages[0].get("role") == "system":
        messages[0]["content"] = f"{messages[0]['content']}\n\n{block}"
    else:
        messages.insert(0, {"role": "system", "content": block})
    request.messages = messages
    return [_citation(p) for p in passages]


def link_markers(text: str, citations: list[Citation]) -> tuple[str, list[Citation]]:
    """The answer (Markdown) with its ``[n]`` markers as ``cite:n`` links
    (markers added where a sentence matches a passage), and the citations used."""
    from app.documents.prompt import Passage
    from app.documents.index import IndexedChunk

    passages = [Passage(c.n, IndexedChunk(c.chunk_id, c.file_id, c.file, c.path, c.page, c.heading, c.start, c.end,
                                          c.passage, 0), 0.0, 0) for c in citations]
    marked, used = cite(text, passages)
    valid = {c.n for c in citations}
    linked = re.sub(r"\[(\d{1,3})\]", lambda m: f"[\\[{m.group(1)}\\]](cite:{m.group(1)})"
                    if int(m.group(1)) in valid else m.group(0), marked)
    return linked, used
