"""An image file or data URL to the tower's input, as the release's processor
prepares it (facts from the K2.5/K3 processors, docs/KIMI.md "Images"):

* decode to RGB (Pillow), refusing anything hostile with one clear line:
  more bytes than MAX_FILE_BYTES, more pixels than MAX_PIXELS (checked from
  the header, before any pixel is decoded: decompression bombs), a side over
  MAX_SIDE, truncated or corrupt data, a format that is not an image we
  read, a file whose extension names another image format;
* resize (bicubic) so that the patch grid fits the patch budget and 512
  patches a side (the release's ``navit_resize_image``: scale =
  min(1, sqrt(budget / ((w // p) (h // p))), 512 p / w, 512 p / h), sides
  truncated), then pad right and bottom with black to multiples of
  patch x merge (28 px);
* normalise: x / 255, minus 0.5, over 0.5, per channel;
* cut into patches [gh * gw, 3 * p * p], row-major over the grid, each patch
  channel-major, then pixel rows, then columns.

An image costs (gh / 2) * (gw / 2) prompt positions."""
from __future__ import annotations

import base64
import binascii
import hashlib
import io
import math
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

#: Largest image file or decoded data URL read.
MAX_FILE_BYTES = 40 << 20
#: Most pixels an image may declare (a 10,000 x 8,000 photo): more is refused unread.
MAX_PIXELS = 80_000_000
#: Longest side in pixels.
MAX_SIDE = 30_000
#: The image formats read, by Pillow's name -> the file extensions that name them.
FORMATS = {"PNG": (".png",), "JPEG": (".jpg", ".jpeg", ".jpe", ".jfif"), "GIF": (".gif",), "WEBP": (".webp",),
           "BMP": (".bmp",), "TIFF": (".tif", ".tiff")}
#: Normalisation of the release's processor (image_mean, image_std).
MEAN, STD = 0.5, 0.5
#: Patches a side at most (the release's patch_limit_on_one_side).
SIDE_PATCHES = 512
#: The default patch budget of every front end (the API, ferry run/chat/serve
#: --image-budget, the window's setting): 1,024 patches, about 256 prompt
#: positions an image (a 4:3 photo: 38 x 28 patches after padding, 266
#: positions). See docs/KIMI.md for what one costs here and the projection for a Mac.
DEFAULT_PATCH_BUDGET = 1024
#: The budget's range.
MIN_PATCH_BUDGET, MAX_PATCH_BUDGET = 16, 65536


class ImageError(ValueError):
    """An image that cannot be used; the message is one line naming it."""


@dataclass(frozen=True)
class Grid:
    """Where an image of width x height goes under a patch budget."""

    width: int          #: original size
    height: int
    new_width: int      #: resized (before padding)
    new_height: int
    gh: int             #: patch grid after padding
    gw: int

    @property
    def patches(self) -> int:
        return self.gh * self.gw

    @property
    def positions(self) -> int:
        """Prompt positions the image takes (2 x 2 patches merge into one)."""
        return (self.gh // 2) * (self.gw // 2)


def plan_grid(width: int, height: int, patch_budget: int = DEFAULT_PATCH_BUDGET, patch: int = 14,
              merge: int = 2) -> Grid:
    """The release's navit_resize_image with ``in_patch_limit`` = the budget."""
    if width < 1 or height < 1:
        raise ImageError(f"an image of {width} x {height} pixels is empty")
    budget = max(MIN_PATCH_BUDGET, min(MAX_PATCH_BUDGET, int(patch_budget)))
    s1 = math.sqrt(budget / (max(1.0, width // patch) * max(1.0, height // patch)))
    scale = min(1.0, s1, SIDE_PATCHES * patch / width, SIDE_PATCHES * patch / height)
    nw = min(max(1, int(width * scale)), SIDE_PATCHES * patch)
    nh = min(max(1, int(height * scale)), SIDE_PATCHES * patch)
    f = merge * patch
    pw, ph = nw + (f - nw % f) % f, nh + (f - nh % f) % f
    return Grid(width, height, nw, nh, ph // patch, pw // patch)


@dataclass
class PreparedImage:
    """One image ready for the tower."""

    name: str                      #: what the user called it (a file name, "image 1")
    grid: Grid
    patches: np.ndarray            #: [gh * gw, 3 p p] float32
    key: str                       #: sha256 of the decoded pixels and the grid: the image's identity
    thumbnail_png: bytes = field(default=b"", repr=False)  #: a small PNG for a front end to show

    @property
    def positions(self) -> int:
        return self.grid.positions


def _check_extension(name: str, fmt: str) -> None:
    ext = Path(name).suffix.lower()
    for other, exts in FORMATS.items():
        if ext in exts and other != fmt:
            raise ImageError(f"{name}: the file is a {fmt} image but its name says {other}; rename or convert it")


def decode(data: bytes, name: str = "image"):
    """RGB PIL image from encoded bytes, or ImageError (one line, naming ``name``)."""
    from PIL import Image, UnidentifiedImageError

    if len(data) > MAX_FILE_BYTES:
        raise ImageError(f"{name}: {len(data) / 2**20:.0f} MiB is more than the {MAX_FILE_BYTES >> 20} MiB an "
                         "image may have")
    if not data:
        raise ImageError(f"{name}: the file is empty")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            img = Image.open(io.BytesIO(data), formats=list(FORMATS))
            fmt = img.format or "?"
            w, h = img.size
            if w * h > MAX_PIXELS or max(w, h) > MAX_SIDE:
                raise ImageError(f"{name}: {w} x {h} pixels is more than an image may have "
                                 f"({MAX_PIXELS // 1_000_000} million pixels, {MAX_SIDE} a side)")
            _check_extension(name, fmt)
            img.seek(0)
            img.load()
            rgb = _to_rgb(img)
    except ImageError:
        raise
    except (UnidentifiedImageError, Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        if isinstance(exc, UnidentifiedImageError):
            raise ImageError(f"{name}: not an image Ferry reads ({', '.join(FORMATS)})") from None
        raise ImageError(f"{name}: the image declares more pixels than an image may have "
                         f"({MAX_PIXELS // 1_000_000} million; a decompression bomb?)") from None
    except (OSError, SyntaxError, ValueError, EOFError, MemoryError) as exc:
        detail = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ImageError(f"{name}: the image is damaged or truncated ({detail})") from None
    return rgb


def _to_rgb(img):
    """RGB, with transparency composited on white (as a viewer shows it)."""
    from PIL import Image

    if img.mode in ("RGBA", "LA") or (img.mode == "P" and "transparency" in img.info):
        rgba = img.convert("RGBA")
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(white, rgba).convert("RGB")
    return img.convert("RGB")


def read_file(path: str | Path) -> bytes:
    """An image file's bytes, refusing what is not a regular file or is too large."""
    p = Path(path)
    try:
        st = p.stat()
    except OSError as exc:
        raise ImageError(f"{p.name}: cannot read it ({exc.strerror or exc})") from None
    import stat as _stat

    if not _stat.S_ISREG(st.st_mode):
        raise ImageError(f"{p.name}: not a regular file")
    if st.st_size > MAX_FILE_BYTES:
        raise ImageError(f"{p.name}: {st.st_size / 2**20:.0f} MiB is more than the {MAX_FILE_BYTES >> 20} MiB an "
                         "image may have")
    try:
        with open(p, "rb") as f:
            return f.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise ImageError(f"{p.name}: cannot read it ({exc.strerror or exc})") from None


def data_url_bytes(url: str, name: str = "image") -> bytes:
    """The bytes of a ``data:image/...;base64,`` URL. Any other URL is refused:
    nothing is ever fetched."""
    if not isinstance(url, str):
        raise ImageError(f"{name}: the image URL must be a string")
    if not url.startswith("data:"):
        scheme = url.split(":", 1)[0][:16] if ":" in url else "a bare path"
        raise ImageError(f"{name}: only data: URLs are accepted (got {scheme}); Ferry fetches nothing from the "
                         "network")
    head, sep, body = url.partition(",")
    if not sep or not head.endswith(";base64") or not head[5:].lower().startswith("image/"):
        raise ImageError(f"{name}: a data URL must be data:image/...;base64,...")
    if len(body) > MAX_FILE_BYTES * 4 // 3 + 8:
        raise ImageError(f"{name}: the image is more than the {MAX_FILE_BYTES >> 20} MiB an image may have")
    try:
        return base64.b64decode(body, validate=True)
    except (binascii.Error, ValueError):
        raise ImageError(f"{name}: the data URL's base64 is malformed") from None


def prepare(data: bytes, name: str = "image", *, patch_budget: int = DEFAULT_PATCH_BUDGET, patch: int = 14,
            merge: int = 2, thumbnail: int = 0) -> PreparedImage:
    """Encoded image bytes -> the tower's patches (see the module's doc)."""
    from PIL import Image

    img = decode(data, name)
    g = plan_grid(img.width, img.height, patch_budget, patch, merge)
    resized = img.resize((g.new_width, g.new_height), resample=Image.Resampling.BICUBIC)
    pixels = np.zeros((g.gh * patch, g.gw * patch, 3), dtype=np.uint8)
    pixels[:g.new_height, :g.new_width] = np.asarray(resized, dtype=np.uint8)
    return from_pixels(pixels, g, name, patch=patch, thumb=_thumbnail(img, thumbnail) if thumbnail else b"")


def from_pixels(pixels: np.ndarray, grid: Grid, name: str, *, patch: int = 14, thumb: bytes = b"") -> PreparedImage:
    """Padded uint8 pixels [gh p, gw p, 3] -> normalised patches."""
    x = (pixels.astype(np.float32) / 255.0 - MEAN) / STD
    gh, gw = grid.gh, grid.gw
    patches = x.reshape(gh, patch, gw, patch, 3).transpose(0, 2, 4, 1, 3).reshape(gh * gw, 3 * patch * patch)
    key = hashlib.sha256(np.ascontiguousarray(pixels).tobytes() + f"{gh}x{gw}".encode()).hexdigest()
    return PreparedImage(name=name, grid=grid, patches=np.ascontiguousarray(patches), key=key, thumbnail_png=thumb)


def preview(data: bytes, name: str = "image", *, patch_budget: int = DEFAULT_PATCH_BUDGET, patch: int = 14,
            merge: int = 2, thumbnail: int = 96) -> tuple[Grid, bytes]:
    """What an image will cost before it is sent (its grid under the budget) and a small PNG of it;
    ImageError (one line) for an image the pipeline would refuse."""
    img = decode(data, name)
    return plan_grid(img.width, img.height, patch_budget, patch, merge), _thumbnail(img, thumbnail)


def describe_cost(grid: Grid) -> str:
    """"800 x 600 px, 1,008 patches, 252 prompt positions": what an image costs, as front ends say it."""
    return f"{grid.width} x {grid.height} px, {grid.patches:,} patches, {grid.positions:,} prompt positions"


def _thumbnail(img, side: int) -> bytes:
    t = img.copy()
    t.thumbnail((side, side))
    buf = io.BytesIO()
    t.save(buf, format="PNG")
    return buf.getvalue()


def image_markup(image: PreparedImage) -> str:
    """The image's block in a K3 prompt (one markup segment: the chat format's
    ``image_prompts`` entry): ``<|media_begin|>image WxH<|media_content|>``, one
    ``<|kimi_image_placeholder|>`` (media_placeholder_token_id) per position,
    ``<|media_end|>``; W x H the original size, as the release's processor writes it."""
    g = image.grid
    return (f"<|media_begin|>image {g.width}x{g.height}<|media_content|>"
            + "<|kimi_image_placeholder|>" * g.positions + "<|media_end|>")


def image_parts(messages) -> list[tuple[int, int, dict]]:
    """(message index, part index, part) of every image part, in prompt order."""
    found = []
    for i, m in enumerate(messages or ()):
        content = m.get("content") if isinstance(m, dict) else None
        if isinstance(content, list):
            for j, part in enumerate(content):
                if isinstance(part, dict) and part.get("type") in ("image_url", "image"):
                    found.append((i, j, part))
    return found


def part_url(part: dict) -> str:
    """The URL of an image part (OpenAI's ``image_url`` as an object or a string)."""
    value = part.get("image_url") if part.get("type") == "image_url" else part.get("image")
    if isinstance(value, dict):
        value = value.get("url")
    return value if isinstance(value, str) else ""


def with_images(message: dict, parts: list[dict]) -> dict:
    """A user message with image parts (``{"type": "image_url", "image_url": {"url": ...}}``) after its
    text: the one shape every front end hands a turn its images in."""
    if not parts:
        return message
    return {**message, "content": [{"type": "text", "text": message["content"]}, *parts]}


def url_part(url: str, name: str = "") -> dict:
    """The content part of an image's data URL (``name``: what the user called it)."""
    part = {"type": "image_url", "image_url": {"url": url}}
    return {**part, "name": name} if name else part


def data_url(data: bytes, name: str = "image") -> str:
    """A data URL of image bytes (the one way a front end hands an image to a turn)."""
    from PIL import Image, UnidentifiedImageError

    try:
        fmt = Image.open(io.BytesIO(data), formats=list(FORMATS)).format or "PNG"
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError):
        raise ImageError(f"{name}: not an image Ferry reads ({', '.join(FORMATS)})") from None
    return f"data:image/{fmt.lower()};base64," + base64.b64encode(data).decode("ascii")
