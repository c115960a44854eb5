"""Export…'s save dialog: where to write the conversation and as what (Markdown
or JSON), opening in the folder used last."""
from __future__ import annotations

from pathlib import Path

from PySide6.QtWidgets import QFileDialog, QMessageBox, QWidget

from app.chat import export


def ask_export_path(parent: QWidget, title: str, folder: str = "") -> tuple[str, str | None]:
    """The path chosen (its suffix added from the chosen format) and the format; ("", None) on Cancel."""
    safe = "".join(ch if ch.isalnum() or ch in " -_" else "_" for ch in title).strip() or "chat"
    start = Path(folder) if folder and Path(folder).is_dir() else Path.home()
    path, chosen = QFileDialog.getSaveFileName(parent, f"Export “{title}”", str(start / f"{safe}.md"),
                                               ";;".join(export.FORMATS.values()))
    if not path:
        return "", None
    fmt = next((k for k, v in export.FORMATS.items() if v == chosen), None)
    if fmt and Path(path).suffix.lower() != f".{fmt}":
        path = f"{path}.{fmt}"
    return path, fmt


def export_chat(window, path: str | Path | None = None, fmt: str | None = None) -> Path | None:
    """Export… in ``window`` (the main window): its conversation as Markdown or JSON, written by its
    controller. Without ``path`` a save dialog asks, opening in the folder used last."""
    if not window.chat.visible():
        window.statusBar().showMessage("Nothing to export yet", 3000)
        return None
    if path is None:
        path, fmt = ask_export_path(window, window.chat.title, window.settings.export_folder)
        if not path:
            return None
        window.settings.export_folder = str(Path(path).parent)   # the next export opens there
        window._save_settings()
    try:
        out = window.controller.export(path, fmt)
    except (OSError, ValueError) as exc:
        QMessageBox.warning(window, "Could not export", str(exc))
        return None
    window.statusBar().showMessage(f"Exported to {out}", 4000)
    return out
