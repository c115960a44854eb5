"""The wizard itself: six pages over one WizardState, and the download page
(Source -> Download -> Finish when a model is to be downloaded)."""
from __future__ import annotations

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QWizard

from app.ui.wizard.common import WizardState
from app.ui.wizard.convert_page import ConvertPage
from app.ui.wizard.destination_page import DestinationPage
from app.ui.wizard.download_page import DownloadPage
from app.ui.wizard.finish_page import FinishPage
from app.ui.wizard.memory_page import MemoryPage
from app.ui.wizard.source_page import SourcePage
from app.ui.wizard.welcome_page import WelcomePage


class ConvertWizard(QWizard):
    #: the verified container and the RAM budget chosen (bytes; 0 when it is the recommended one)
    model_ready = Signal(str, int)

    def __init__(self, parent=None, *, remember: bool = True):
        """``remember=False`` leaves no note of an unfinished conversion (screenshots, tests)."""
        super().__init__(parent)
        self.setWindowTitle("Convert a model")
        self.setAccessibleName("Convert a model")
        self.setWizardStyle(QWizard.WizardStyle.ModernStyle)
        self.setOption(QWizard.WizardOption.NoBackButtonOnLastPage, True)
        self.setButtonText(QWizard.WizardButton.FinishButton, "Open a chat")
        self.setButtonText(QWizard.WizardButton.CancelButton, "Close")
        self.resize(760, 560)
        self.state = WizardState(remember=remember)
        self.welcome_page = WelcomePage(self.state)
        self.source_page = SourcePage(self.state)
        self.destination_page = DestinationPage(self.state)
        self.memory_page = MemoryPage(self.state)
        self.convert_page = ConvertPage(self.state)
        self.finish_page = FinishPage(self.state)
        self.download_page = DownloadPage(self.state)
        for page in (self.welcome_page, self.source_page, self.destination_page, self.memory_page,
                     self.convert_page, self.finish_page):
            self.addPage(page)
        # "Download a model": Source -> Download (plans, downloads and converts) -> Finish.
        self.finish_id = self.pageIds()[-1]
        self.destination_id = self.pageIds()[2]
        self.download_id = self.addPage(self.download_page)
        self.convert_page.setCommitPage(True)     # once converted there is no going back
        self.setButtonText(QWizard.WizardButton.CommitButton, "Next")

    def accept(self) -> None:
        if self.state.result is not None and self.finish_page.verified:
            plan = self.state.report.plan if self.state.report is not None else None
            budget = 0 if plan is not None and self.state.budget == plan.recommended else int(self.state.budget)
            self.model_ready.emit(str(self.state.result), budget)
        super().accept()

    def reject(self) -> None:
        """Close: a running conversion stops, keeping its work (offered again next time)."""
        self.shutdown()
        super().reject()

    def shutdown(self) -> None:
        self.convert_page.stop_and_wait()
        self.download_page.stop_and_wait()
        self.destination_page.cleanupPage()

    def closeEvent(self, event) -> None:
        self.shutdown()
        super().closeEvent(event)
