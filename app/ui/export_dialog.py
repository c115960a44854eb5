"""Export…'s save dialog: where to write the conversation and as what (Markdown
or JSON), opening in the folder used last."""
from __future__ import annotations

from pathlib import Path

from PySide6.QtWidgets import QFileDialog, QWidget

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
