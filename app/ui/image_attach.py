"""Images for the next message, in the window: the composer's "Attach image…"
button (a file dialog), an image file dropped on the window or the message
box, an image pasted from the clipboard. Each goes to the controller
(``ChatController.attach_image``: checked as the pipeline will check it) and
shows as a thumbnail above the message box with its cost (size, patches,
prompt positions) and a remove button. A model without a vision tower: the
button is disabled and its tooltip says why. A refused image: its one-line
error in the status bar, nothing else. While an image goes through the
vision tower, the composer's progress line says which block it is at. The
patch budget (Settings → Answers → Images) sets each image's cost; the
pending images' costs follow it. ``MainWindow`` owns one."""
from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QBuffer, QByteArray, QEvent, QIODevice, QObject, Qt
from PySide6.QtGui import QKeySequence, QPixmap
from PySide6.QtWidgets import QApplication, QFileDialog, QFrame, QHBoxLayout, QLabel, QToolButton, QVBoxLayout

from app.chat.conversation import ChatError
from app.vision.image import FORMATS, ImageError, read_file

#: The file dialog's filter and what a drop takes: the image formats the pipeline reads.
EXTENSIONS = tuple(e for exts in FORMATS.values() for e in exts)
THUMB = 56


def dropped_images(event) -> list[Path]:
    """The local image files a drag carries (by extension; their content is checked when attached)."""
    urls = event.mimeData().urls() if event.mimeData().hasUrls() else []
    return [Path(u.toLocalFile()) for u in urls if u.isLocalFile() and Path(u.toLocalFile()).suffix.lower()
            in EXTENSIONS]


class ImageAttach(QObject):
    def __init__(self, window, page):
        super().__init__(window)
        self.w = window
        self.bar = page.composer
        self.row = QHBoxLayout(self.bar.images_row)
        self.row.setContentsMargins(0, 0, 0, 0)
        self.row.setSpacing(8)
        self.bar.image_btn.clicked.connect(lambda: self.choose())
        self.bar.cleared.connect(self.refresh)
        window.model_loaded.connect(lambda _info: self.model_changed())
        window.worker.worker.image_progress.connect(self.show_progress)   # an image in the vision tower
        window.installEventFilter(self)          # an image file dropped on the window (after the model drop)
        self.bar.editor.installEventFilter(self)  # an image pasted into the message box
        self.bar.editor.viewport().installEventFilter(self)   # ... or dropped on it
        self.model_changed()

    @property
    def controller(self):
        return self.w.controller

    def model_changed(self) -> None:
        """The attach button follows the open model; images pending for a model that cannot see them go."""
        why = self.controller.image_support()
        self.bar.image_btn.setEnabled(not why)
        self.bar.image_btn.setToolTip(why or "Attach an image to the next message (or drop or paste one)")
        if why and self.controller.pending_images:
            self.controller.pending_images = []
            self.w.statusBar().showMessage(f"The pending images were removed: {why}", 6000)
        self.refresh()

    def settings_changed(self) -> None:
        """The patch budget may have changed: the pending images show their cost under it."""
        self.controller.rebudget_images()
        self.refresh()

    def show_progress(self, block: int, blocks: int, line: str) -> None:
        """An image going through the vision tower: "Reading the image: block 12 of 27" with a bar, where
        the prompt's progress shows (which follows once the tower is done)."""
        if self.controller.on_screen:
            self.bar.show_progress(block, blocks + 1, line)

    # ---- adding

    def choose(self) -> None:
        exts = " ".join(f"*{e}" for e in EXTENSIONS)
        paths, _ = QFileDialog.getOpenFileNames(self.w, "Attach image", str(Path.home()), f"Images ({exts})")
        for p in paths:
            self.add_file(p)

    def add_file(self, path: str | Path) -> bool:
        try:
            return self.add(read_file(path), Path(path).name)
        except ImageError as exc:
            return self._refused(str(exc))

    def add(self, data: bytes, name: str) -> bool:
        """``data`` (an encoded image) goes with the next message; False (and the status bar says why) if not."""
        try:
            pending = self.controller.attach_image(data, name)
        except (ImageError, ChatError) as exc:
            return self._refused(str(exc))
        self.refresh()
        self.w.statusBar().showMessage(f"{pending.name} will go with your next message: {pending.cost}", 6000)
        return True

    def paste(self) -> bool:
        """An image on the clipboard becomes a pending image (as PNG); False when it holds none."""
        mime = QApplication.clipboard().mimeData()
        if mime is None or not mime.hasImage():
            return False
        image = QApplication.clipboard().image()
        if image.isNull():
            return False
        buf = QByteArray()
        dev = QBuffer(buf)
        dev.open(QIODevice.OpenModeFlag.WriteOnly)
        image.save(dev, "PNG")
        dev.close()
        self.add(bytes(buf.data()), f"pasted image {len(self.controller.pending_images) + 1}.png")
        return True

    def _refused(self, message: str) -> bool:
        self.w.statusBar().showMessage(message, 8000)
        return False

    # ---- the row

    def refresh(self) -> None:
        while self.row.count():
            item = self.row.takeAt(0)
            if item.widget() is not None:
                item.widget().deleteLater()
        for i, p in enumerate(self.controller.pending_images):
            self.row.addWidget(self._tile(i, p))
        self.row.addStretch(1)
        self.bar.images_row.setVisible(bool(self.controller.pending_images))

    def _tile(self, index: int, pending) -> QFrame:
        tile = QFrame(objectName="imageTile", accessibleName=f"Image {pending.name}")
        tile.setFrameShape(QFrame.Shape.StyledPanel)
        lay = QHBoxLayout(tile)
        lay.setContentsMargins(4, 4, 4, 4)
        thumb = QLabel(accessibleName="Thumbnail")
        pix = QPixmap()
        pix.loadFromData(pending.thumbnail_png, "PNG")
        thumb.setPixmap(pix.scaled(THUMB, THUMB, Qt.AspectRatioMode.KeepAspectRatio,
                                   Qt.TransformationMode.SmoothTransformation))
        lay.addWidget(thumb)
        text = QVBoxLayout()
        name = QLabel(pending.name)
        cost = QLabel(pending.cost, objectName="mutedLabel", accessibleName="Image cost")
        cost.setToolTip("What the image takes: its size, the patches the vision tower reads and the prompt "
                        "positions it fills (each costs about as much as a word of the prompt to read)")
        text.addWidget(name)
        text.addWidget(cost)
        lay.addLayout(text)
        remove = QToolButton(text="✕", accessibleName=f"Remove {pending.name}", toolTip="Remove this image")
        remove.clicked.connect(lambda: self._remove(index))
        lay.addWidget(remove, 0, Qt.AlignmentFlag.AlignTop)
        return tile

    def _remove(self, index: int) -> None:
        self.controller.remove_image(index)
        self.refresh()

    # ---- drops and paste

    def eventFilter(self, obj, event) -> bool:
        kind = event.type()
        if obj is self.bar.editor and kind == QEvent.Type.KeyPress and event.matches(QKeySequence.StandardKey.Paste):
            return self.paste()       # an image is attached; text pastes as before
        if kind not in (QEvent.Type.DragEnter, QEvent.Type.DragMove, QEvent.Type.Drop):
            return False
        if obj is not self.w and obj is not self.bar.editor.viewport():
            return False
        paths = dropped_images(event)
        if not paths:
            return False          # not images: the model drop (model_host.py) or the text box's own
        event.acceptProposedAction()
        if kind == QEvent.Type.Drop:
            for p in paths:
                self.add_file(p)
        return True


#: The longest side of an image shown in a sent message.
SHOWN = 160


def message_images(images: list[dict], parent=None) -> QFrame | None:
    """The thumbnails of a sent question's images (``MessageRecord.images``) for its bubble; None if it has
    none. An image that no longer decodes shows its name."""
    if not images:
        return None
    from app.vision.image import data_url_bytes

    strip = QFrame(parent, objectName="messageImages", accessibleName="Images")
    lay = QHBoxLayout(strip)
    lay.setContentsMargins(0, 2, 0, 2)
    lay.setSpacing(8)
    for img in images:
        name = img.get("name") or "image"
        label = QLabel(strip, accessibleName=f"Image {name}", toolTip=name)
        pix = QPixmap()
        try:
            ok = pix.loadFromData(data_url_bytes(img.get("url", ""), name))
        except ImageError:
            ok = False
        if ok and max(pix.width(), pix.height()) <= SHOWN:
            label.setPixmap(pix)          # a small image as it is, never enlarged
        elif ok:
            label.setPixmap(pix.scaled(SHOWN, SHOWN, Qt.AspectRatioMode.KeepAspectRatio,
                                       Qt.TransformationMode.SmoothTransformation))
        else:
            label.setText(f"[{name}]")
        lay.addWidget(label)
    lay.addStretch(1)
    return strip
