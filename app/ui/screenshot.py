"""``--screenshot DIR``: drive the real window through its main states on a
real model and save one PNG per state, then the conversion wizard's pages on
the demo model (converted into a temporary folder). Used for the docs and by
a test."""
from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

from PySide6.QtCore import QObject, QTimer
from PySide6.QtWidgets import QApplication

TIMEOUT_S = 300
STREAM_CHARS = 160   #: grab the streaming state once this much text is on screen
#: the files attached in the documents shots (written to a throw-away folder)
SAMPLE_DOCUMENTS = {
    "Kettle manual.md": "# Kettle manual\n\nThe water tank of the kettle holds 1.7 litres; never fill it above the "
                        "MAX mark. Descale it every month with white vinegar: half a tank, boil, leave for an hour, "
                        "rinse twice.\n\n# Warranty\n\nThe warranty lasts two years from the date of purchase "
                        "and covers the heating element and the switch.\n",
    "Boiler service.txt": "Boiler service report, 14 March 2026.\n\nThe boiler was serviced by Aldous Heating. "
                          "Pressure 1.4 bar, flue gas within limits, the condensate trap cleaned. Next service due "
                          "in March 2027. Invoice 2,400 (paid by card).\n",
}


class ScreenshotRun(QObject):
    def __init__(self, window, out: Path, model: str | None, prompt: str):
        super().__init__(window)
        self.w = window
        self.out = out
        self.model = model
        self.prompt = prompt
        self.ok = False
        self.saved: list[Path] = []
        self.t0 = time.monotonic()
        self._stream_grabbed = False
        self._poll = QTimer(self)
        self._poll.setInterval(40)
        self._poll.timeout.connect(self._watch_stream)
        self._deadline = QTimer(self)
        self._deadline.setSingleShot(True)
        self._deadline.timeout.connect(self._timed_out)

    def start(self) -> None:
        self._deadline.start(TIMEOUT_S * 1000)
        self.w.model_loaded.connect(self._loaded)
        self.w.worker.worker.load_failed.connect(self._load_failed)
        self.w.stack.setCurrentWidget(self.w.welcome)
        QTimer.singleShot(300, self._welcome)

    def _welcome(self) -> None:
        self._grab("01-welcome")
        if self.model:
            self.w.load_model(self.model)
        else:
            self.w.welcome.start_demo()
            if self.w.welcome.task is not None:
                self.w.welcome.task.failed.connect(self._demo_failed)

    # bound methods, so that signals from other threads are queued to this one
    def _load_failed(self, message: str) -> None:
        self._fail(f"the model did not open: {message}")

    def _demo_failed(self, message: str) -> None:
        self._fail(f"the demo model is unavailable: {message}")

    def _loaded(self, _info: dict) -> None:
        QTimer.singleShot(300, self._empty)

    def _empty(self) -> None:
        self._grab("02-empty-chat")
        self.w.answer_finished.connect(self._finished)
        self.w.send_text(self.prompt)
        self._poll.start()

    def _watch_stream(self) -> None:
        if self._stream_grabbed or not self.w.chat.busy:
            return
        m = self.w.chat.tree.by_id.get(self.w.chat.streaming_id)
        if m is None:
            return
        thinking_open = bool(m.thinking) and not m.content and len(m.thinking) >= STREAM_CHARS
        if thinking_open or len(m.content) >= STREAM_CHARS:
            self.w.chat_view.refresh_streaming()
            self._stream_grabbed = True
            self._grab("03-streaming")

    def _finished(self, reason: str) -> None:
        self._poll.stop()
        if not self._stream_grabbed:  # a very quick answer: show what the stream left
            self._stream_grabbed = True
            self._grab("03-streaming")
        QTimer.singleShot(400, self._after_finish)

    def _after_finish(self) -> None:
        self._grab("04-finished")
        self._grab("05-gauges", self.w.gauge_scroll)
        panel = self.w.chat_view.widgets[-1].probs if self.w.chat_view.widgets else None
        if panel is not None and panel.tokens:   # the token probabilities open, the least likely token chosen
            panel.toggle.setChecked(True)
            panel.select(min(range(len(panel.tokens)), key=lambda i: panel.tokens[i].logprob))
            QTimer.singleShot(300, self._token_probs)
        else:
            self._token_probs()

    def _token_probs(self) -> None:
        self.w.chat_view.scroll_to_end()
        self._grab("04a-token-probabilities")
        d = self.w.open_settings()
        QTimer.singleShot(300, lambda: self._settings(d))

    def _settings(self, dialog) -> None:
        self._grab("06-settings", dialog)
        dialog.pages.setCurrentIndex(1)
        QTimer.singleShot(200, lambda: self._settings_answers(dialog))

    def _settings_answers(self, dialog) -> None:
        self._grab("06d-settings-answers", dialog)
        dialog.reject()
        QTimer.singleShot(100, self._library)

    # ---- the model library, the switcher, and a long prompt being read

    def _library(self) -> None:
        d = self.w.models.open_library()
        QTimer.singleShot(300, lambda: self._library_shot(d))

    def _library_shot(self, dialog) -> None:
        self._grab("06a-library", dialog)
        dialog.reject()
        menu = self.w.model_menu
        self.w.models.fill()
        menu.popup(self.w.mapToGlobal(self.w.menuBar().geometry().bottomLeft()))
        QTimer.singleShot(300, lambda: self._switcher_shot(menu))

    def _switcher_shot(self, menu) -> None:
        self._grab("06b-switcher", menu)
        menu.hide()
        self._progress_grabbed = False
        self.w.answer_finished.disconnect(self._finished)
        self.w.answer_finished.connect(self._long_prompt_done)
        self.w.settings.max_tokens = 4
        self.w.send_text("Summarise this report in one line: " +
                         "The harbour opened at dawn and the ferries left on time. " * 60)
        self._wait(self._reading_midway, self._progress_shot, "the prompt being read", delay_ms=0)

    def _reading_midway(self) -> bool:
        bar = self.w.prompt_bar
        return self._progress_grabbed or not self.w.chat.busy or (
            self.w.prompt_row.isVisible() and bar.maximum() > 0 and 0 < bar.value() < bar.maximum())

    def _progress_shot(self) -> None:
        if not self._progress_grabbed:
            self._progress_grabbed = True
            self._grab("06c-prompt-progress")

    def _long_prompt_done(self, _reason: str) -> None:
        if not self._progress_grabbed:   # read too fast to catch midway: show the state it ended in
            self._progress_shot()
        self.w.answer_finished.disconnect(self._long_prompt_done)
        QTimer.singleShot(200, self._documents_start)

    # ---- documents: two files attached to a new chat, a question answered from them, the documents page

    def _documents_start(self) -> None:
        self._docs = tempfile.TemporaryDirectory(prefix="ferry-shot-docs-")
        for name, text in SAMPLE_DOCUMENTS.items():
            (Path(self._docs.name) / name).write_text(text, encoding="utf-8")
        self.w.new_chat()
        self.w.settings.max_tokens = 60
        self.panel = self.w.open_documents()
        self.panel.indexing_finished.connect(lambda _report: QTimer.singleShot(300, self._attached))
        self.panel.add_paths([str(p) for p in sorted(Path(self._docs.name).iterdir())])

    def _attached(self) -> None:
        self._grab("06e-attach", self.panel)
        self.panel.close()
        self.w.answer_finished.connect(self._documents_answered)
        self.w.send_text("How much water does the kettle's tank hold?")

    def _documents_answered(self, _reason: str) -> None:
        self.w.answer_finished.disconnect(self._documents_answered)
        QTimer.singleShot(300, self._documents_answer)

    def _documents_answer(self) -> None:
        self._grab("06f-documents-answer")
        page = self.w.open_documents_page()
        QTimer.singleShot(300, lambda: self._documents_page(page))

    def _documents_page(self, page) -> None:
        self._grab("06g-documents-page", page)
        page.close()
        self._docs.cleanup()
        QTimer.singleShot(200, self._wizard_start)

    # ---- the conversion wizard, on the demo model, into a throw-away folder

    def _wizard_start(self) -> None:
        from app.ui.wizard import ConvertWizard

        self._tmp = tempfile.TemporaryDirectory(prefix="ferry-shot-convert-")
        self.wiz = ConvertWizard(self.w, remember=False)
        self.wiz.show()
        QTimer.singleShot(300, self._wizard_welcome)

    def _wait(self, ready, then, what: str, timeout_s: float = 120, delay_ms: int = 300) -> None:
        t_end = time.monotonic() + timeout_s

        def tick():
            if ready():
                QTimer.singleShot(delay_ms, then)
            elif time.monotonic() > t_end:
                self._fail(f"the wizard did not get {what}")
            else:
                QTimer.singleShot(20, tick)
        tick()

    def _wizard_welcome(self) -> None:
        self._grab("07-wizard-welcome", self.wiz)
        self.wiz.next()
        self.wiz.source_page.choose("demo")
        self._wait(self.wiz.source_page.isComplete, self._wizard_source, "the demo model checked")

    def _wizard_source(self) -> None:
        self._grab("08-wizard-source", self.wiz)
        self.wiz.next()
        self.wiz.destination_page.set_folder(self._tmp.name)
        self._wait(self.wiz.destination_page.isComplete, self._wizard_destination, "the disk measured")

    def _wizard_destination(self) -> None:
        self._grab("09-wizard-destination", self.wiz)
        self.wiz.next()
        QTimer.singleShot(300, self._wizard_memory)

    def _wizard_memory(self) -> None:
        self._grab("10-wizard-memory", self.wiz)
        page = self.wiz.convert_page
        self.wiz.next()

        def midway():
            p = page.latest
            return page.state.result is not None or (p is not None and p.done_bytes >= 0.3 * p.total_bytes)

        def pause():    # hold it midway, so the shot shows the bytes, the rate and the layer
            if page.running():
                page.toggle_pause()
            QTimer.singleShot(400, shot)

        def shot():
            self._grab("11-wizard-convert", self.wiz)
            if page.running() and page.control.paused:
                page.toggle_pause()
            self._wait(lambda: self.wiz.finish_page.isComplete(), self._wizard_finish, "the model verified")

        self._wait(midway, pause, "halfway through converting", delay_ms=0)

    def _wizard_finish(self) -> None:
        self._grab("12-wizard-finish", self.wiz)
        self.wiz.shutdown()
        self.wiz.hide()
        self._tmp.cleanup()
        self.ok = True
        print("\n".join(str(p) for p in self.saved))
        QApplication.instance().quit()

    def _grab(self, name: str, widget=None) -> None:
        QApplication.processEvents()
        target = widget or self.w
        path = self.out / f"{name}.png"
        if not target.grab().save(str(path), "PNG"):
            self._fail(f"could not write {path}")
            return
        self.saved.append(path)

    def _timed_out(self) -> None:
        self._fail(f"timed out after {TIMEOUT_S} s")

    def _fail(self, message: str) -> None:
        if self.ok:
            return
        print(f"ferry: screenshot run failed: {message}", file=sys.stderr)
        QApplication.instance().exit(1)
