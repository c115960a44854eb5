"""Names and text that come from outside Ferry (a hub's file list, a shard
index, a mirror's error message, a model's metadata), made safe to use.

One rule for every such name: it is joined to a folder only after it is
proven to stay inside it -- a relative path (no absolute path, no drive, no
``..`` component, no backslash, no NUL or control character), which still
lies inside the folder once the links already on disk are followed
(:func:`join_inside`). One rule for every such text shown to a person: control
characters (ESC sequences, BEL, carriage returns, the C1 range), Unicode
format characters (bidirectional overrides) and separators are written as
visible escapes (:func:`shown`), so a name cannot move the cursor, retitle
the terminal or reorder what is printed around it. No Qt here: the window
escapes HTML on top of this (app/ui/wizard/common.esc).
"""
from __future__ import annotations

import ipaddress
import json
import os
import unicodedata
from pathlib import Path, PurePosixPath, PureWindowsPath

#: Longest name taken from outside (bytes of UTF-8) and longest component.
MAX_NAME_BYTES = 1024
MAX_COMPONENT_BYTES = 255


class UnsafeName(ValueError):
    """A name from outside that would leave its folder or cannot be a file name."""


def _char_escape(ch: str) -> str:
    o = ord(ch)
    return f"\\x{o:02x}" if o < 0x100 else (f"\\u{o:04x}" if o < 0x10000 else f"\\U{o:08x}")


def _unsafe_char(ch: str) -> bool:
    o = ord(ch)
    if o < 0x20 or 0x7F <= o <= 0x9F:
        return True
    if o < 0xA0:
        return False
    return unicodedata.category(ch) in ("Cf", "Cs", "Co", "Cn", "Zl", "Zp")


def shown(text: object, *, newlines: bool = False) -> str:
    """``text`` with every control, format or separator character written as a
    visible escape (``\\x1b``, ``\\u202e``); ``newlines`` keeps line breaks."""
    s = str(text)
    if all(" " <= c < "\x7f" for c in s):           # the common case: plain ASCII
        return s
    return "".join(c if (newlines and c == "\n") or not _unsafe_char(c) else _char_escape(c) for c in s)


def check_name(name: object, what: str) -> str:
    """``name`` if it is a relative path made of plain components (see the
    module); otherwise :class:`UnsafeName` saying why, ``what`` naming where
    the name came from (e.g. "the hub's file list")."""
    if not isinstance(name, str) or not name:
        raise UnsafeName(f"{what} gives a file name that is not a non-empty string ({shown(repr(name))[:80]})")
    show = shown(name)[:200]
    if len(name.encode("utf-8", "surrogatepass")) > MAX_NAME_BYTES:
        raise UnsafeName(f"{what} gives a file name longer than {MAX_NAME_BYTES} bytes ({show}...)")
    if any(_unsafe_char(c) for c in name):
        raise UnsafeName(f"{what} gives a file name with control or invisible characters ({show})")
    posix, win = PurePosixPath(name), PureWindowsPath(name)
    if name.startswith(("/", "\\")) or posix.is_absolute() or win.is_absolute() or win.drive:
        raise UnsafeName(f"{what} gives an absolute path ({show}): only names inside the folder are taken")
    if "\\" in name or ":" in name:
        raise UnsafeName(f"{what} gives a file name with a backslash or a colon ({show})")
    parts = name.split("/")
    if ".." in parts:
        raise UnsafeName(f"{what} gives a name that climbs out of the folder with '..' ({show})")
    if any(len(p.encode("utf-8", "surrogatepass")) > MAX_COMPONENT_BYTES for p in parts):
        raise UnsafeName(f"{what} gives a name with a component longer than {MAX_COMPONENT_BYTES} bytes ({show})")
    if all(p in ("", ".") for p in parts):
        raise UnsafeName(f"{what} gives a name that is the folder itself ({show})")
    return name


def join_inside(folder: str | os.PathLike, name: object, what: str) -> Path:
    """``folder / name`` once ``name`` passes :func:`check_name` and the path,
    following every link that exists on disk, still lies inside ``folder``.
    Raises :class:`UnsafeName` otherwise. The path returned is the plain join
    (``folder / name``), so it names the file the way the caller expects."""
    name = check_name(name, what)
    folder = Path(folder)
    root = folder.resolve()
    try:
        real = (root / name).resolve()
    except (OSError, RuntimeError) as exc:          # a link loop, a name too long for the system
        raise UnsafeName(f"{what}: {shown(name)} cannot be resolved inside {shown(folder)}: {exc}") from None
    if real == root or root not in real.parents:
        raise UnsafeName(f"{what} gives {shown(name)}, which leads out of {shown(folder)} through a link")
    return folder / name


# ----------------------------------------------------------------- JSON

#: Deepest nesting accepted in JSON from outside (real configs and indexes nest 3 to 5 levels).
MAX_JSON_DEPTH = 64


class BadData(ValueError):
    """Data from outside that cannot be taken as it is (the message says which limit or key)."""


def _no_duplicates(pairs: list) -> dict:
    out: dict = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate key {shown(repr(key))[:80]}")
        out[key] = value
    return out


def _no_constant(name: str):
    raise ValueError(f"{name} is not a JSON number")


def json_depth_ok(value, max_depth: int) -> bool:
    """Whether ``value`` (parsed JSON) nests at most ``max_depth`` levels (walked without recursion)."""
    stack = [(value, 1)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, dict):
            v = v.values()
        elif not isinstance(v, list):
            continue
        if d > max_depth:
            return False
        stack.extend((x, d + 1) for x in v if isinstance(x, (dict, list)))
    return True


def parse_json(data: bytes | str, what: str, *, max_bytes: int, max_depth: int = MAX_JSON_DEPTH):
    """Untrusted UTF-8 JSON: at most ``max_bytes``, ``max_depth`` levels, no
    repeated key, no NaN or Infinity. :class:`BadData` naming ``what`` otherwise."""
    if len(data) > max_bytes:
        raise BadData(f"{what} has {len(data)} bytes, more than the {max_bytes} Ferry reads")
    if isinstance(data, bytes):
        try:
            data = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise BadData(f"{what} is not valid UTF-8 (byte {exc.start})") from None
    try:
        value = json.loads(data, object_pairs_hook=_no_duplicates, parse_constant=_no_constant)
    except RecursionError:
        value = None
        deep = True
    except ValueError as exc:
        raise BadData(f"{what} is not valid JSON: {shown(exc)}") from None
    else:
        deep = not json_depth_ok(value, max_depth)
    if deep:
        raise BadData(f"{what} is nested too deeply (more than {max_depth} levels)")
    return value


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a name or an address, IPv6 in brackets or not) is this computer: ``localhost``
    or a loopback address. The server's rule for whom it serves without a key, and the MCP client's for
    a plain-http server."""
    host = host.strip("[]")
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
