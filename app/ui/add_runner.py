"""Adding files to a document collection (or re-indexing it) on a QThread of
its own, with progress; the documents panel and the documents page use it."""
from __future__ import annotations

from PySide6.QtCore import QObject, QThread, Signal, Slot

from app.documents.store import DocumentStore
from app.documents.walk import display_name


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
