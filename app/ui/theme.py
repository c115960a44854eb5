"""Light and dark themes that follow the system's colour scheme."""
from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtGui import QColor, QGuiApplication, QPalette
from PySide6.QtWidgets import QApplication

from app.ui.markdown import Colors

#: segment colours of the RAM bar and the sparklines, readable on both themes
SERIES = {"trunk": "#4f7cff", "attention state": "#22a06b", "expert cache": "#e8912d", "cache policy": "#c9553f",
          "scratch": "#a15dd8", "free": "#9aa0a6"}


def is_dark() -> bool:
    app = QGuiApplication.instance()
    if app is None:
        return False
    scheme = app.styleHints().colorScheme()
    if scheme == Qt.ColorScheme.Dark:
        return True
    if scheme == Qt.ColorScheme.Light:
        return False
    return app.palette().color(QPalette.ColorRole.Window).lightness() < 128


def _dark_palette() -> QPalette:
    p = QPalette()
    base, window, text = QColor("#1e1f22"), QColor("#2b2d31"), QColor("#e6e6e6")
    for role, color in [
        (QPalette.ColorRole.Window, window), (QPalette.ColorRole.WindowText, text),
        (QPalette.ColorRole.Base, base), (QPalette.ColorRole.AlternateBase, QColor("#26282c")),
        (QPalette.ColorRole.ToolTipBase, window), (QPalette.ColorRole.ToolTipText, text),
        (QPalette.ColorRole.Text, text), (QPalette.ColorRole.Button, QColor("#35373c")),
        (QPalette.ColorRole.ButtonText, text), (QPalette.ColorRole.BrightText, QColor("#ff6b6b")),
        (QPalette.ColorRole.Link, QColor("#7aa2ff")), (QPalette.ColorRole.Highlight, QColor("#4f7cff")),
        (QPalette.ColorRole.HighlightedText, QColor("#ffffff")),
        (QPalette.ColorRole.PlaceholderText, QColor("#8b8e94")), (QPalette.ColorRole.Mid, QColor("#45474d")),
    ]:
        p.setColor(role, color)
    p.setColor(QPalette.ColorGroup.Disabled, QPalette.ColorRole.Text, QColor("#777a80"))
    p.setColor(QPalette.ColorGroup.Disabled, QPalette.ColorRole.ButtonText, QColor("#777a80"))
    return p


def _light_palette() -> QPalette:
    p = QApplication.style().standardPalette() if QApplication.style() else QPalette()
    p.setColor(QPalette.ColorRole.Window, QColor("#f5f6f8"))
    p.setColor(QPalette.ColorRole.Base, QColor("#ffffff"))
    p.setColor(QPalette.ColorRole.AlternateBase, QColor("#f0f1f4"))
    p.setColor(QPalette.ColorRole.Highlight, QColor("#4f7cff"))
    p.setColor(QPalette.ColorRole.Link, QColor("#2457d6"))
    return p


def apply(app: QApplication) -> None:
    """Fusion style with a palette matching the system scheme."""
    app.setStyle("Fusion")
    app.setPalette(_dark_palette() if is_dark() else _light_palette())


def markdown_colors() -> Colors:
    if is_dark():
        return Colors(code_bg="#17181b", code_border="#3a3c42", code_label="#9aa0a6", link="#7aa2ff")
    return Colors(code_bg="#f2f3f5", code_border="#d8dadf", code_label="#6b7280", link="#2457d6")


def bubble_colors() -> dict[str, str]:
    if is_dark():
        return {"user": "#2f3a52", "assistant": "#25272b", "border": "#3a3c42", "muted": "#9aa0a6",
                "thinking": "#222327"}
    return {"user": "#e8efff", "assistant": "#ffffff", "border": "#dde0e6", "muted": "#6b7280",
            "thinking": "#f6f7f9"}


def probability_colors() -> dict[str, str]:
    """Token shades by probability (``app.chat.token_probs.shade``): sure, likely, unsure, rare; and the text."""
    if is_dark():
        return {"sure": "#25272b", "likely": "#3b3a22", "unsure": "#4d3520", "rare": "#5a2626", "text": "#e6e6e6"}
    return {"sure": "#ffffff", "likely": "#fff6cc", "unsure": "#ffe0b8", "rare": "#ffc9c9", "text": "#1f2328"}


def window_stylesheet() -> str:
    """The main window's own styles (bubbles, labels, gauge tiles) in the current colours."""
    c = bubble_colors()
    return f"""
        QFrame#userBubble {{ background: {c['user']}; border: 1px solid {c['border']}; border-radius: 10px; }}
        QFrame#assistantBubble {{ background: {c['assistant']}; border: 1px solid {c['border']};
                                  border-radius: 10px; }}
        QFrame#thinkingPanel {{ background: {c['thinking']}; border: 1px solid {c['border']};
                                border-radius: 6px; }}
        QLabel#mutedLabel {{ color: {c['muted']}; }}
        QLabel#setupNote {{ color: {c['muted']}; background: {c['user']}; border: 1px solid {c['border']};
                            border-radius: 8px; padding: 2px 8px; }}
        QLabel#chatTitle {{ font-size: 13pt; font-weight: 600; }}
        QLabel#chatPlaceholder {{ color: {c['muted']}; font-size: 12pt; }}
        QLabel#gaugeValue {{ font-size: 15pt; font-weight: 600; }}
        QLabel#gaugeTitle {{ color: {c['muted']}; }}
        QFrame#gaugeTile {{ border: 1px solid {c['border']}; border-radius: 8px; }}
        QFrame#topBar, QFrame#composerBar {{ border: none; }}
    """
