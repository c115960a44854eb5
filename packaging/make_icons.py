"""Draw Ferry's icons with Qt and write every file Briefcase looks for.

    python packaging/make_icons.py

Writes into resources/:
  ferry.png             1024x1024 master (the app icon)
  ferry-<N>.png         16..1024: the Linux icon sizes Briefcase installs
  ferry.icns            the macOS icon (PNG-backed icns entries, 16..1024)
  ferry-document.*      the same set for the document types Ferry opens
Runs headless (QT_QPA_PLATFORM=offscreen is set if nothing else is).
"""
from __future__ import annotations

import os
import struct
import sys
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from PySide6.QtCore import QBuffer, QByteArray, QIODevice, QPointF, QRectF, Qt  # noqa: E402
from PySide6.QtGui import (QColor, QGuiApplication, QImage, QLinearGradient, QPainter,  # noqa: E402
                           QPainterPath, QPen)

RESOURCES = Path(__file__).resolve().parents[1] / "resources"
SIZES = (16, 32, 64, 128, 256, 512, 1024)
#: icns entry type -> pixel size of its PNG (the retina "@2x" entries included).
_APP = None
ICNS_TYPES = (("icp4", 16), ("icp5", 32), ("ic11", 32), ("icp6", 64), ("ic12", 64), ("ic07", 128),
              ("ic08", 256), ("ic13", 256), ("ic09", 512), ("ic14", 512), ("ic10", 1024))


def _squircle(s: float, inset: float) -> QPainterPath:
    """A rounded square in the proportions of a macOS app icon."""
    path = QPainterPath()
    r = QRectF(inset, inset, s - 2 * inset, s - 2 * inset)
    path.addRoundedRect(r, r.width() * 0.225, r.width() * 0.225)
    return path


def _wave(s: float, y: float, amp: float, phase: float) -> QPainterPath:
    path = QPainterPath(QPointF(0, y))
    n = 8
    for i in range(n):
        x0, x1 = s * i / n, s * (i + 1) / n
        up = amp if (i + phase) % 2 else -amp
        path.quadTo(QPointF((x0 + x1) / 2, y + up), QPointF(x1, y))
    path.lineTo(s, s)
    path.lineTo(0, s)
    path.closeSubpath()
    return path


def draw_app(size: int) -> QImage:
    img = QImage(size, size, QImage.Format.Format_ARGB32_Premultiplied)
    img.fill(Qt.GlobalColor.transparent)
    s = float(size)
    p = QPainter(img)
    p.setRenderHint(QPainter.RenderHint.Antialiasing)
    tile = _squircle(s, s * 0.09)
    sky = QLinearGradient(0, s * 0.1, 0, s * 0.9)
    sky.setColorAt(0.0, QColor("#1d3f8f"))
    sky.setColorAt(1.0, QColor("#0c8f9a"))
    p.fillPath(tile, sky)
    p.setClipPath(tile)
    # The sun: a warm disc behind the boat.
    p.setPen(Qt.PenStyle.NoPen)
    p.setBrush(QColor("#ffcf5c"))
    p.drawEllipse(QPointF(s * 0.68, s * 0.34), s * 0.11, s * 0.11)
    # The ferry: cabin, funnel, hull.
    p.setBrush(QColor("#f5f7fb"))
    p.drawRoundedRect(QRectF(s * 0.33, s * 0.42, s * 0.30, s * 0.12), s * 0.02, s * 0.02)
    p.setBrush(QColor("#e8505b"))
    p.drawRoundedRect(QRectF(s * 0.52, s * 0.33, s * 0.07, s * 0.11), s * 0.012, s * 0.012)
    p.setBrush(QColor("#1d3f8f"))
    for i in range(3):
        p.drawEllipse(QPointF(s * (0.39 + 0.07 * i), s * 0.48), s * 0.018, s * 0.018)
    hull = QPainterPath(QPointF(s * 0.20, s * 0.55))
    hull.lineTo(s * 0.80, s * 0.55)
    hull.lineTo(s * 0.70, s * 0.66)
    hull.lineTo(s * 0.28, s * 0.66)
    hull.closeSubpath()
    p.fillPath(hull, QColor("#ffffff"))
    # Water in front of the hull.
    p.fillPath(_wave(s, s * 0.66, s * 0.025, 0), QColor(255, 255, 255, 90))
    p.fillPath(_wave(s, s * 0.74, s * 0.03, 1), QColor(255, 255, 255, 140))
    p.fillPath(_wave(s, s * 0.83, s * 0.03, 0), QColor("#0a5f78"))
    p.setClipping(False)
    if size >= 64:  # a fine rim keeps the tile readable on light and dark docks
        p.setPen(QPen(QColor(255, 255, 255, 60), max(1.0, s / 256)))
        p.setBrush(Qt.BrushStyle.NoBrush)
        p.drawPath(tile)
    p.end()
    return img


def draw_document(size: int) -> QImage:
    """A page with a folded corner and the app icon on it."""
    img = QImage(size, size, QImage.Format.Format_ARGB32_Premultiplied)
    img.fill(Qt.GlobalColor.transparent)
    s = float(size)
    p = QPainter(img)
    p.setRenderHint(QPainter.RenderHint.Antialiasing)
    fold = s * 0.2
    page = QPainterPath(QPointF(s * 0.16, s * 0.06))
    page.lineTo(s * 0.84 - fold, s * 0.06)
    page.lineTo(s * 0.84, s * 0.06 + fold)
    page.lineTo(s * 0.84, s * 0.94)
    page.lineTo(s * 0.16, s * 0.94)
    page.closeSubpath()
    p.fillPath(page, QColor("#ffffff"))
    p.setPen(QPen(QColor("#b8c2d6"), max(1.0, s / 128)))
    p.drawPath(page)
    corner = QPainterPath(QPointF(s * 0.84 - fold, s * 0.06))
    corner.lineTo(s * 0.84 - fold, s * 0.06 + fold)
    corner.lineTo(s * 0.84, s * 0.06 + fold)
    corner.closeSubpath()
    p.fillPath(corner, QColor("#dde3ee"))
    badge = draw_app(max(16, int(s * 0.5)))
    p.drawImage(QRectF(s * 0.25, s * 0.38, s * 0.5, s * 0.5), badge)
    p.end()
    return img


def png_bytes(img: QImage) -> bytes:
    data = QByteArray()
    buf = QBuffer(data)
    buf.open(QIODevice.OpenModeFlag.WriteOnly)
    img.save(buf, "PNG")
    buf.close()
    return bytes(data)


def icns(draw) -> bytes:
    """An .icns file whose entries are PNG images (what macOS 10.7+ reads)."""
    body = b""
    for kind, px in ICNS_TYPES:
        data = png_bytes(draw(px))
        body += kind.encode("ascii") + struct.pack(">I", 8 + len(data)) + data
    return b"icns" + struct.pack(">I", 8 + len(body)) + body


def main() -> int:
    global _APP  # kept alive until exit: Qt must outlive every image
    _APP = QGuiApplication.instance() or QGuiApplication(sys.argv[:1])
    RESOURCES.mkdir(exist_ok=True)
    for name, draw in (("ferry", draw_app), ("ferry-document", draw_document)):
        master = draw(1024)
        master.save(str(RESOURCES / f"{name}.png"), "PNG")
        for px in SIZES:
            (RESOURCES / f"{name}-{px}.png").write_bytes(png_bytes(draw(px)))
        (RESOURCES / f"{name}.icns").write_bytes(icns(draw))
    print(f"icons written to {RESOURCES}")
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    # PySide6 can abort while tearing down at interpreter exit (a refcount
    # error in its finaliser); everything is written by now, so skip teardown.
    os._exit(code)
