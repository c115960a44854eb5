"""Page 1: what Ferry does, what stays on this machine, what the user needs."""
from __future__ import annotations

from pathlib import Path

from PySide6.QtWidgets import QFrame, QPushButton, QVBoxLayout, QWizardPage

from app.ui.wizard import pending
from app.ui.wizard.common import esc, para

TEXT = """
<p>Ferry runs large language models on this computer. A model's always-needed
part stays in RAM; its <i>experts</i> (most of a mixture-of-experts model) are
read from the SSD as each word needs them, so a model far larger than your RAM
can still answer.</p>
<p><b>Everything stays on this machine:</b> the model, what you type, the
answers and the history. Nothing is uploaded, and converting needs no network.</p>
<p><b>What you need</b></p>
<ul>
<li>The model, already downloaded: a Hugging Face checkpoint folder
(<tt>config.json</tt>, the <tt>.safetensors</tt> shards and the tokenizer) or a
single GGUF file. Or let Ferry download one from the Hugging Face hub (it says
first whether it fits and how fast it will run; that download is the only time
Ferry uses the network). Or start with the small built-in demo model.</li>
<li>Free disk space about the size of the model, ideally on an internal SSD:
the disk's speed sets how fast the model answers.</li>
<li>Time: converting copies the whole model once. Ferry shows the estimate;
you can pause, close Ferry, and pick up where it stopped.</li>
</ul>
"""


class WelcomePage(QWizardPage):
    def __init__(self, state, parent=None):
        super().__init__(parent)
        self.state = state
        self.setTitle("Convert a model for Ferry")
        self.setSubTitle("A few checks, then one long copy that you can pause and resume.")
        lay = QVBoxLayout(self)
        lay.addWidget(para(TEXT))
        self.resume_box = QFrame()
        self.resume_box.setFrameShape(QFrame.Shape.StyledPanel)
        rl = QVBoxLayout(self.resume_box)
        self.resume_text = para()
        rl.addWidget(self.resume_text)
        self.resume_btn = QPushButton("Resume that conversion")
        self.resume_btn.setAccessibleName("Resume the unfinished conversion")
        self.resume_btn.clicked.connect(self.resume_pending)
        rl.addWidget(self.resume_btn)
        lay.addWidget(self.resume_box)
        lay.addStretch(1)
        self.pending = None

    def initializePage(self) -> None:
        self.pending = pending.load() if self.state.remember else None
        self.resume_box.setVisible(self.pending is not None)
        if self.pending:
            src, out = Path(self.pending["source"]), Path(self.pending["out"])
            self.resume_text.setText(
                f"<b>An earlier conversion did not finish:</b> {esc(src.name)} into {esc(out)}. "
                "What was converted is kept; resuming goes on from there.")

    def resume_pending(self) -> None:
        """Fill the next pages with the unfinished conversion and go on."""
        if not self.pending:
            return
        w = self.wizard()
        w.source_page.preset(self.pending["kind"], Path(self.pending["source"]),
                             self.pending.get("trunk_format") or "auto", self.pending.get("expert_format") or "auto")
        w.destination_page.preset(Path(self.pending["out"]))
        w.memory_page.preset(int(self.pending.get("budget") or 0))
        w.next()
