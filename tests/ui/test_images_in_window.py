"""Images in the window (issue 38): Attach image…, a dropped image file, a pasted image; the pending
row with each image's cost and a remove button; the image in the sent message (a thumbnail) and in the
history; a refused image gets its one line in the status bar and nothing else; a model without a vision
tower has the button disabled, saying why."""
from __future__ import annotations

import io
import os

import pytest
from PIL import Image
from PySide6.QtCore import Qt
from PySide6.QtGui import QImage
from PySide6.QtWidgets import QApplication, QLabel, QToolButton

from tests.kimi import tiny_k3
from tests.ui.conftest import drop

LONG = 120_000


@pytest.fixture(scope="module")
def k3v(tmp_path_factory):
    from app.convert.convert import convert

    root = tmp_path_factory.mktemp("k3win")
    tiny_k3.build(root / "ckpt", vision=True)
    return convert(root / "ckpt", root / "k3.ferry")


def png_file(path, w=50, h=30, color=(200, 30, 10)):
    Image.new("RGB", (w, h), color).save(path, "PNG")
    return path


def test_attach_drop_paste_send_and_the_thumbnail(qtbot, make_window, k3v, tmp_path):
    w = make_window(k3v, max_tokens=4)
    bar = w.composer_bar
    assert bar.image_btn.isEnabled() and not bar.images_row.isVisible()
    red = png_file(tmp_path / "red.png")
    assert w.images.add_file(red)
    pending = w.controller.pending_images
    assert len(pending) == 1 and bar.images_row.isVisible()
    costs = [lb.text() for lb in bar.images_row.findChildren(QLabel) if lb.accessibleName() == "Image cost"]
    assert costs == [pending[0].cost] and f"{pending[0].grid.positions} prompt positions" in costs[0]

    # hostile: the one line in the status bar, nothing else
    bad = tmp_path / "bad.png"
    bad.write_bytes(b"hello, not an image")
    assert not w.images.add_file(bad)
    assert w.statusBar().currentMessage() == "bad.png: not an image Ferry reads (PNG, JPEG, GIF, WEBP, BMP, TIFF)"
    assert len(w.controller.pending_images) == 1

    # dropped on the window and on the message box; a text file is not taken as an image
    assert drop(w, png_file(tmp_path / "blue.png", 40, 40, (0, 90, 250))).isAccepted()
    assert drop(bar.editor.viewport(), png_file(tmp_path / "green.png", 30, 30, (0, 200, 0))).isAccepted()
    notes = tmp_path / "notes.txt"
    notes.write_text("hi")
    assert not drop(w, notes).isAccepted()
    assert [p.name for p in w.controller.pending_images] == ["red.png", "blue.png", "green.png"]
    # removed with its button
    next(b for b in bar.images_row.findChildren(QToolButton) if b.accessibleName() == "Remove green.png").click()
    assert [p.name for p in w.controller.pending_images] == ["red.png", "blue.png"]

    # pasted from the clipboard (an image), and text still pastes as text
    QApplication.clipboard().setImage(QImage(24, 16, QImage.Format.Format_RGB32))
    bar.editor.setFocus()
    qtbot.keyClick(bar.editor, Qt.Key.Key_V, Qt.KeyboardModifier.ControlModifier)
    assert [p.name for p in w.controller.pending_images][-1] == "pasted image 3.png"
    w.controller.remove_image(2)
    QApplication.clipboard().setText("What is this?")
    qtbot.keyClick(bar.editor, Qt.Key.Key_V, Qt.KeyboardModifier.ControlModifier)
    assert bar.editor.toPlainText() == "What is this?" and len(w.controller.pending_images) == 2

    with qtbot.waitSignal(w.answer_finished, timeout=LONG):
        w.send()
    assert w.controller.pending_images == [] and not bar.images_row.isVisible()
    question = w.chat.visible()[0]
    assert [i["name"] for i in question.images] == ["red.png", "blue.png"]
    answer = w.chat.visible()[1]
    positions = sum(p.grid.positions for p in pending)
    assert answer.stats.get("turn_prompt_tokens", 0) > positions   # the images' positions were read
    # the sent message shows the images as thumbnails
    bubble = next(m for m in w.chat_view.findChildren(QLabel) if m.accessibleName() == "Image red.png")
    assert not bubble.pixmap().isNull() and bubble.pixmap().width() > 0
    if os.environ.get("FERRY_SCREENSHOT_DIR"):     # docs/screenshots/image-message.png: sent and pending
        import numpy as np

        y, x = np.mgrid[0:300, 0:400]
        photo = np.stack([x * 255 // 400, y * 255 // 300, 255 - x * 255 // 400], -1).astype(np.uint8)
        Image.fromarray(photo).save(tmp_path / "photo.png")
        w.images.add_file(tmp_path / "photo.png")
        w.composer.setPlainText("And this one?")
        w.resize(1024, 700)
        qtbot.wait(300)
        w.grab().save(os.path.join(os.environ["FERRY_SCREENSHOT_DIR"], "image-message.png"))


def test_a_model_without_a_tower_disables_the_button(qtbot, make_window, tiny_chat, tmp_path):
    w = make_window(tiny_chat)
    btn = w.composer_bar.image_btn
    assert not btn.isEnabled() and "cannot see images (it has no vision tower" in btn.toolTip()
    assert not w.images.add_file(png_file(tmp_path / "red.png"))
    assert "cannot see images" in w.statusBar().currentMessage() and w.controller.pending_images == []
    # a dropped image is refused the same way
    drop(w, tmp_path / "red.png")
    assert w.controller.pending_images == []


@pytest.mark.slow
def test_an_image_to_the_engine_another_ferry_process_holds(qtbot, make_window, k3v, tmp_path, monkeypatch):
    """A window attached to the K3 engine another Ferry process holds (its loopback API) takes images too:
    the container's manifest says the model has a tower; the answer is the held engine's own."""
    from app.api import EngineService, TurnRequest, collect, open_model
    from app.vision.image import data_url
    from tests.engine.test_registry import _holder, _wait_serving

    monkeypatch.setenv("FERRY_SHARE", "1")
    holder = _holder(k3v)
    try:
        _wait_serving(k3v, holder)
        w = make_window(k3v, max_tokens=4)
        assert w.models.info.remote and w.composer_bar.image_btn.isEnabled()
        red = png_file(tmp_path / "red.png")
        assert w.images.add_file(red)
        with qtbot.waitSignal(w.answer_finished, timeout=LONG) as blocker:
            w.send_text("What is this?")
        assert blocker.args[0] in ("stop", "length"), w.statusBar().currentMessage()
        got = w.chat.visible()[-1]
    finally:
        holder.stdin.close()
        holder.wait(timeout=60)
    model = open_model(k3v, share=False)
    service = EngineService(model, model.new_session(2048))
    try:
        ref = collect(service.submit(TurnRequest([{"role": "user", "content": [
            {"type": "text", "text": "What is this?"},
            {"type": "image_url", "image_url": {"url": data_url(red.read_bytes())}}]}], max_tokens=4)))
    finally:
        service.close()
        model.close()
    assert ref.prompt_ids.count(tiny_k3.MEDIA_PAD) > 0
    assert (got.content, got.thinking) == (ref.content, ref.reasoning)


def test_the_patch_budget_setting_prices_the_image_and_the_tower_shows_its_blocks(qtbot, make_window, k3v,
                                                                                 tmp_path):
    """Settings → Answers → Images: the budget (default: the API's), kept in the settings; the pending
    image's cost follows it before sending; the request carries it; the tower's blocks show in the
    composer's progress line; a second question about the image resumes from the first prompt's state."""
    from app.store import settings as settings_mod
    from app.ui.image_budget import budget_note
    from app.vision.image import DEFAULT_PATCH_BUDGET, plan_grid

    w = make_window(k3v, max_tokens=3)
    assert w.settings.image_patch_budget == 0 and w.controller.image_budget() == DEFAULT_PATCH_BUDGET
    assert w.images.add_file(png_file(tmp_path / "photo.png", 400, 300))
    p = w.controller.pending_images[0]
    assert p.grid == plan_grid(400, 300, DEFAULT_PATCH_BUDGET, 4, 2)
    d = w.open_settings()
    box = d.image_budget
    assert box.value() == 0 and box.spin.text().startswith(f"Default ({DEFAULT_PATCH_BUDGET:,}")
    box.spin.stepBy(1)                              # the arrows double and halve, from the default
    assert box.value() == 2 * DEFAULT_PATCH_BUDGET
    box.spin.stepBy(-7)
    assert box.value() == 16
    box.spin.stepBy(-1)
    assert box.value() == 0 and box.note.text() == budget_note(0)
    box.spin.setValue(64)
    assert box.note.text() == budget_note(64) and "prompt positions" in box.note.text()
    d.accept()
    assert w.settings.image_patch_budget == 64 and w.controller.image_budget() == 64
    p = w.controller.pending_images[0]
    assert p.grid == plan_grid(400, 300, 64, 4, 2) and p.grid.patches < 64 + 32

    def costs():
        return [lb.text() for lb in w.composer_bar.images_row.findChildren(QLabel) if lb.accessibleName() == "Image cost"]
    qtbot.waitUntil(lambda: costs() == [p.cost])   # the old tile is gone once the event loop deletes it
    # kept like the other settings
    settings_mod.save(w.settings, tmp_path / "s.json")
    assert settings_mod.load(tmp_path / "s.json").image_patch_budget == 64
    assert settings_mod.Settings(image_patch_budget=-5).validated().image_patch_budget == 0

    blocks, shown = [], []
    w.worker.worker.image_progress.connect(lambda b, n, line: blocks.append((b, n, line)), Qt.DirectConnection)
    bar_progress = w.composer_bar.show_progress
    w.composer_bar.show_progress = lambda done, total, line: (shown.append(line), bar_progress(done, total, line))
    w.composer.setPlainText("What is this?")
    with qtbot.waitSignal(w.answer_finished, timeout=LONG):
        w.send()
    layers = int(tiny_k3.vision_config()["vt_num_hidden_layers"])
    assert [b for b, _, _ in blocks] == list(range(layers + 1))
    assert blocks[-1][2] == f"Reading the image: block {layers} of {layers}"
    first = w.chat.visible()[1].stats
    assert first["turn_prompt_tokens"] > p.grid.positions
    # the composer's progress line: the tower's blocks, then the prompt
    images = [line for line in shown if line.startswith("Reading the image")]
    assert images == [line for _, _, line in blocks] and shown.index(images[-1]) < len(shown) - 1
    w.composer.setPlainText("And its colour?")
    with qtbot.waitSignal(w.answer_finished, timeout=LONG):
        w.send()
    second = w.chat.visible()[3].stats
    # the follow-up starts from the state after the first prompt, the image's positions in it
    assert second["turn_reused_tokens"] >= first["turn_prompt_tokens"] > 0
