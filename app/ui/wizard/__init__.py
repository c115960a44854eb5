"""The first-run wizard: from a downloaded model (or the demo) to a chat on it,
through source checks, a destination with room and a measured disk, the RAM
budget, a resumable conversion and a full verification. See docs/WIZARD.md."""
from app.ui.wizard.wizard import ConvertWizard

__all__ = ["ConvertWizard"]
