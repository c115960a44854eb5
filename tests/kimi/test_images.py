"""Images into a K3 conversation: preprocessing as the release's processor
does it (resize to the patch budget, padding, normalisation, patches),
hostile images refused with one line, and the tiny K3 with a tiny tower
answering about an image through the Python API (the chat format's image
block, the tower's rows at its positions, prefix keys per image)."""
from __future__ import annotations

import base64
import io
import struct
import zlib

import numpy as np
import pytest
from PIL import Image

from app.chat.turn import ChatFormat, TurnError, TurnRequest, collect, run_turn
from app.convert.convert import convert
from app.model import LoadedModel
from app.vision import image as vi
from tests.kimi import tiny_k3


def png(w=40, h=30, color=(200, 30, 10), mode="RGB") -> bytes:
    buf = io.BytesIO()
    Image.new(mode, (w, h), color).save(buf, "PNG")
    return buf.getvalue()


def noisy_png(w=64, h=48) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(1).integers(0, 256, (h, w, 3), dtype=np.uint8)).save(buf, "PNG")
    return buf.getvalue()


def png_header_only(w: int, h: int) -> bytes:
    """A PNG whose header declares w x h pixels, with a tiny (wrong) body: a bomb's shape."""
    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    ihdr = struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0" * 64)) + chunk(b"IEND", b"")


def test_grid_follows_the_release_resize():
    g = vi.plan_grid(896, 896, 65536)            # no downscale: 64 x 64 patches, 1,024 positions
    assert (g.gh, g.gw, g.positions) == (64, 64, 1024)
    g = vi.plan_grid(4000, 3000, 1024)
    assert g.patches <= 1024 + 2 * 36 and g.gh % 2 == 0 and g.gw % 2 == 0 and g.positions <= 256 + 36
    s = (1024 / ((4000 // 14) * (3000 // 14))) ** 0.5
    assert (g.new_width, g.new_height) == (int(4000 * s), int(3000 * s))
    g = vi.plan_grid(100, 10000, 65536)          # 512 patches a side at most
    assert g.gh <= 512 and g.new_height == 512 * 14
    g = vi.plan_grid(10, 10, 1024)               # small images are padded, not enlarged
    assert (g.new_width, g.new_height, g.gh, g.gw) == (10, 10, 2, 2)


def test_patches_are_normalised_and_laid_out_as_the_processor_does():
    rng = np.random.default_rng(0)
    pix = rng.integers(0, 256, (16, 24, 3), dtype=np.uint8)
    g = vi.Grid(24, 16, 24, 16, 4, 6)
    p = vi.from_pixels(pix, g, "x", patch=4).patches
    assert p.shape == (24, 48)
    # patch (1, 2): channel-major, then rows, then columns
    want = (pix[4:8, 8:12].astype(np.float32) / 255 - 0.5) / 0.5
    assert np.allclose(p[1 * 6 + 2].reshape(3, 4, 4), want.transpose(2, 0, 1))


def test_prepare_pads_right_and_bottom_with_black():
    img = vi.prepare(png(30, 10, (255, 255, 255)), "w.png", patch_budget=64, patch=4, merge=2)
    assert (img.grid.new_width, img.grid.new_height, img.grid.gw, img.grid.gh) == (30, 10, 8, 4)
    x = img.patches.reshape(4, 8, 3, 4, 4).transpose(0, 3, 1, 4, 2).reshape(16, 32, 3)
    assert np.allclose(x[:10, :30], 1.0) and np.allclose(x[10:], -1.0) and np.allclose(x[:, 30:], -1.0)
    rgba = vi.prepare(png(8, 8, (0, 0, 0, 0), "RGBA"), "t.png", patch=4)   # transparency shows as white
    assert np.allclose(rgba.patches, 1.0)


@pytest.mark.parametrize("data, name, says", [
    (png_header_only(40000, 40000), "bomb.png", "than an image may have"),
    (png_header_only(31000, 10), "wide.png", "a side"),
    (noisy_png()[:2000], "cut.png", "damaged or truncated"),
    (b"hello, not an image", "note.png", "not an image Ferry reads"),
    (b"", "empty.png", "empty"),
])
def test_hostile_images_get_one_line(data, name, says):
    with pytest.raises(vi.ImageError, match=says) as exc:
        vi.prepare(data, name, patch=4)
    assert "\n" not in str(exc.value) and name in str(exc.value)


def test_wrong_extension_is_named():
    buf = io.BytesIO()
    Image.new("RGB", (20, 20)).save(buf, "JPEG")
    with pytest.raises(vi.ImageError, match="JPEG image but its name says PNG"):
        vi.prepare(buf.getvalue(), "photo.png", patch=4)
    assert vi.prepare(buf.getvalue(), "photo.dat", patch=4).grid.width == 20   # no claim: judged by content


def test_only_data_urls():
    assert vi.data_url_bytes(vi.data_url(png())) == png()
    for url, says in (("https://example.com/cat.png", "only data: URLs"), ("file:///etc/passwd", "only data"),
                      ("data:text/plain;base64,aGk=", "data:image"), ("data:image/png;base64,@@@", "malformed")):
        with pytest.raises(vi.ImageError, match=says):
            vi.data_url_bytes(url)


def ask(text, *images, budget=64):
    parts = [{"type": "text", "text": text}]
    parts += [{"type": "image_url", "image_url": {"url": vi.data_url(data)}} for data in images]
    return TurnRequest([{"role": "user", "content": parts}], image_patch_budget=budget, max_tokens=8)


def test_tiny_k3_answers_about_an_image(k3v):
    fmt = ChatFormat(k3v)
    p = fmt.prepare(ask("What is this?", png(50, 30)), n_ctx=512)
    assert len(p.images) == 1 and p.images[0].positions == 24
    tok = k3v.tokenizer._tok
    begin, content, end = (tok.special_tokens[f"<|media_{n}|>"] for n in ("begin", "content", "end"))
    pad = tiny_k3.MEDIA_PAD
    b, c, e = p.prompt.index(begin), p.prompt.index(content), p.prompt.index(end)
    assert k3v.tokenizer.decode(p.prompt[b + 1:c]) == "image 50x30"
    assert p.prompt[c + 1:e] == [pad] * 24 and p.prompt.count(pad) == 24
    done = collect(run_turn(k3v, k3v.new_session(512), p))
    assert done.error is None and done.completion_tokens > 0
    # another image: another answer (its rows enter the model), the same image: the same answer
    other = collect(run_turn(k3v, k3v.new_session(512), fmt.prepare(ask("What is this?", png(50, 30, (0, 90, 250))),
                                                                      n_ctx=512)))
    again = collect(run_turn(k3v, k3v.new_session(512), fmt.prepare(ask("What is this?", png(50, 30)), n_ctx=512)))
    assert again.token_ids == done.token_ids and other.token_ids != done.token_ids


def test_a_prompt_with_an_image_keeps_no_prefix(k3v):
    """The window keeps its document passages as a saved prefix (``keep_prefix``); the saved-prefix step
    reads tokens, not the tower's rows, so a conversation with an image keeps none (read as it is)."""
    fmt = ChatFormat(k3v)
    system = {"role": "system", "content": "Passages: the boiler is serviced in October. " * 4}
    looked = ask("What is this?", png(50, 30)).messages[0]
    plain = [system, {"role": "user", "content": "Hello"}, {"role": "assistant", "content": "Hi"},
             {"role": "user", "content": "When is the boiler serviced?"}]
    assert fmt.prepare(TurnRequest(plain, keep_prefix=True), n_ctx=512).prefix_len > 16
    with_image = [system, looked, {"role": "assistant", "content": "A red square."}, plain[-1]]
    p = fmt.prepare(TurnRequest(with_image, keep_prefix=True, image_patch_budget=64), n_ctx=512)
    assert len(p.images) == 1 and p.prefix_len == 0


def test_image_positions_are_keyed_by_the_image(k3v):
    fmt = ChatFormat(k3v)
    a = fmt.prepare(ask("x", png(50, 30)), n_ctx=512)
    b = fmt.prepare(ask("x", png(50, 30, (1, 2, 3))), n_ctx=512)
    ka, _ = k3v._image_positions(a.prompt, a.images)
    kb, _ = k3v._image_positions(b.prompt, b.images)
    first = a.prompt.index(tiny_k3.MEDIA_PAD)
    assert ka[:first] == kb[:first] and ka[first] != kb[first] and min(ka) < 0
    s = k3v.new_session(512)
    s.eval(a.prompt[:first + 4], keys=ka[:first + 4])
    assert s.sync(kb) == first and s.sync(ka) == first   # a different image is not reused


def test_images_are_refused_where_they_cannot_be_seen(k3v, tmp_path):
    with pytest.raises(TurnError, match="only data: URLs"):
        ChatFormat(k3v).prepare(TurnRequest([{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "https://example.com/x.png"}}]}]), n_ctx=512)
    with pytest.raises(TurnError, match="damaged or truncated"):
        ChatFormat(k3v).prepare(TurnRequest([{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,"
                                                   + base64.b64encode(noisy_png()[:2000]).decode()}}]}]), n_ctx=512)
    tiny_k3.build(tmp_path / "ckpt")
    plain = LoadedModel(convert(tmp_path / "ckpt", tmp_path / "k3.ferry"))
    try:
        with pytest.raises(TurnError, match="cannot see images"):
            ChatFormat(plain).prepare(ask("x", png()), n_ctx=512)
    finally:
        plain.close()


def test_ferry_run_and_chat_take_images(k3v, tmp_path, monkeypatch, capsys):
    import json as _json
    import re

    from app.cli import main as ferry

    red, blue, bad = tmp_path / "red.png", tmp_path / "blue.jpg", tmp_path / "bad.png"
    red.write_bytes(png(50, 30))
    Image.new("RGB", (40, 40), (0, 10, 200)).save(blue)
    bad.write_bytes(b"not an image at all")
    model = str(k3v.path)
    assert ferry(["run", model, "What is it?", "--image", str(red), "--image", str(blue), "--image-budget", "64",
                  "-n", "4", "--threads", "2", "--json"]) == 0
    out = _json.loads(capsys.readouterr().out)
    # two images of 24 and 16 positions, each in its block, in the prompt ids
    assert out["prompt_ids"].count(tiny_k3.MEDIA_PAD) == 24 + 16 and out["error"] is None
    for args, says in (([str(bad)], "bad.png: not an image Ferry reads"), ([str(tmp_path / "no.png")], "no.png")):
        assert ferry(["run", model, "x", "--image", *args]) == 2
        err = capsys.readouterr().err
        assert says in err and err.count("\n") == 1
    monkeypatch.setattr("sys.stdin", io.StringIO(f"/image {red}\nWhat is it?\n/image {bad}\nAnd now?\n\n"))
    assert ferry(["chat", model, "-n", "3", "--threads", "2", "--image-budget", "64"]) == 0
    err = capsys.readouterr().err
    assert "red.png will go with your next message: 50 x 30 px, 96 patches, 24 prompt positions" in err
    assert "bad.png: not an image Ferry reads" in err
    evaluated = [int(m) for m in re.findall(r"(\d+) prompt tokens evaluated", err)]
    assert len(evaluated) == 2 and evaluated[0] > 24   # the first turn carried the image


def test_a_cancel_stops_the_tower_and_is_consumed(k3v):
    from app.model import Finished

    p = ChatFormat(k3v).prepare(ask("Look", png(60, 60, (9, 9, 9))), n_ctx=512)
    first = p.prompt.index(tiny_k3.MEDIA_PAD)
    k3v.__dict__.get("_image_rows", {}).clear()
    s = k3v.new_session(512)
    s.eval(p.prompt[:first])                # the text before the image is held: the next chunk starts at the image
    s.cancel()
    end = [ev for ev in k3v.generate(s, p.prompt, max_tokens=2, images=p.images) if isinstance(ev, Finished)][-1]
    assert end.reason == "cancelled" and p.images[0].key not in k3v._image_rows
    end = [ev for ev in k3v.generate(s, p.prompt, max_tokens=2, images=p.images) if isinstance(ev, Finished)][-1]
    assert end.reason == "length" and p.images[0].key in k3v._image_rows
