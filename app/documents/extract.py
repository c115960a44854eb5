"""Text out of a user's file: plain text, Markdown, PDF (per page), HTML and
Word. Each file becomes pages (PDF) or one page (the rest) of *blocks*:
headings and paragraphs. A page's text is its blocks joined by blank lines,
and every passage Ferry cites is an exact slice of that text.

Nothing here touches the network or writes anything: parsers read the bytes
they are given (external entities, images and links are never fetched).
"""
from __future__ import annotations

import io
import os
import re
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator

#: suffix -> kind
SUFFIXES = {".txt": "text", ".text": "text", ".md": "markdown", ".markdown": "markdown",
            ".pdf": "pdf", ".html": "html", ".htm": "html", ".xhtml": "html", ".docx": "docx"}
#: Largest file read (bytes); bigger ones are reported, not read.
MAX_FILE_BYTES = 200 * 2**20


class ExtractError(ValueError):
    """A file that cannot be read; the message says why (the caller adds the name)."""


@dataclass(frozen=True)
class Block:
    kind: str          #: "heading" or "para"
    text: str
    level: int = 0     #: heading level (1 = top)


@dataclass
class Page:
    number: int | None             #: 1-based page number (PDF), None for files without pages
    blocks: list[Block] = field(default_factory=list)

    @property
    def text(self) -> str:
        return "\n\n".join(b.text for b in self.blocks)


@dataclass
class Extracted:
    path: Path
    kind: str
    pages: list[Page]

    @property
    def chars(self) -> int:
        return sum(len(p.text) for p in self.pages)


def kind_of(path: Path) -> str | None:
    return SUFFIXES.get(path.suffix.lower())


_SURROGATE = re.compile("[\ud800-\udfff]")


def _clean(text: str) -> str:
    # A lone surrogate (a broken PDF text map can yield one) is not text: U+FFFD, the defined replacement.
    text = _SURROGATE.sub("\ufffd", text)
    text = unicodedata.normalize("NFC", text).replace("\r\n", "\n").replace("\r", "\n")
    text = text.replace("\u00ad", "").replace("\x00", "")
    return re.sub(r"[ \t\f\v\u00a0]+", " ", text)


def _paragraphs(text: str) -> Iterator[str]:
    for part in re.split(r"\n\s*\n", text):
        para = " ".join(line.strip() for line in part.split("\n") if line.strip())
        if para:
            yield para


def _decode(data: bytes) -> str:
    if b"\x00" in data[:8192] and not data.startswith((b"\xff\xfe", b"\xfe\xff")):
        raise ExtractError("this is not a text file (it holds binary data)")
    for enc in ("utf-8-sig", "utf-16") if data.startswith((b"\xff\xfe", b"\xfe\xff")) else ("utf-8-sig",):
        try:
            return data.decode(enc)
        except UnicodeDecodeError:
            pass
    return data.decode("cp1252", errors="replace")


def _text_blocks(text: str, markdown: bool) -> list[Block]:
    blocks: list[Block] = []
    text = _clean(text)
    if markdown:
        text = re.sub(r"(?m)^```.*$", "", text)   # fences: keep the code as text
    for para in re.split(r"\n\s*\n", text):
        lines = [ln.rstrip() for ln in para.split("\n") if ln.strip()]
        buf: list[str] = []

        def flush():
            if buf:
                blocks.append(Block("para", " ".join(s.strip() for s in buf)))
                buf.clear()

        for ln in lines:
            m = re.match(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$", ln) if markdown else None
            if m and m.group(2):
                flush()
                blocks.append(Block("heading", m.group(2), len(m.group(1))))
            elif not markdown and len(lines) == 1 and _looks_like_heading(ln):
                blocks.append(Block("heading", ln.strip(), 2))
            elif markdown and re.match(r"^\s*([-*+]|\d+[.)])\s+", ln):
                flush()
                buf.append(re.sub(r"^\s*[-*+]\s+", "", ln))
            else:
                buf.append(ln)
        flush()
    if markdown:
        blocks = [Block(b.kind, _strip_md_inline(b.text), b.level) for b in blocks]
    return [b for b in blocks if b.text]


def _looks_like_heading(line: str) -> bool:
    """A plain-text heading: a short line of its own in capitals ("DIAGNOSES")."""
    words = line.split()
    return 0 < len(words) <= 8 and line.isupper() and not line.rstrip().endswith((".", ",", ";"))


def _strip_md_inline(text: str) -> str:
    text = re.sub(r"!\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = re.sub(r"\[([^\]]+)\]\([^)]*\)", r"\1", text)
    text = re.sub(r"(\*\*|__)(.+?)\1", r"\2", text)
    text = re.sub(r"(?<![\w*])\*(?!\s)(.+?)(?<!\s)\*(?![\w*])", r"\1", text)
    return text.replace("`", "").strip()


def _extract_pdf(data: bytes) -> list[Page]:
    try:
        from pypdf import PdfReader
        from pypdf.errors import PdfReadError
    except ImportError as exc:  # pragma: no cover - a dependency
        raise ExtractError("PDF support is not installed (pypdf)") from exc
    try:
        reader = PdfReader(io.BytesIO(data), strict=False)
        if reader.is_encrypted:
            try:
                if not reader.decrypt(""):
                    raise ExtractError("the PDF is password-protected")
            except ExtractError:
                raise
            except Exception as exc:
                raise ExtractError("the PDF is password-protected") from exc
        pages = []
        for i, page in enumerate(reader.pages, start=1):
            text = _clean(page.extract_text() or "")
            pages.append(Page(i, [Block("para", p) for p in _paragraphs(text)]))
    except ExtractError:
        raise
    except (PdfReadError, Exception) as exc:
        raise ExtractError(f"the PDF cannot be read ({type(exc).__name__}: {exc})") from exc
    if not any(p.blocks for p in pages):
        raise ExtractError("the PDF has no text (a scan? text recognition is not supported)")
    return pages


_HTML_BLOCKS = {"p", "li", "tr", "pre", "blockquote", "dd", "dt", "figcaption", "caption", "address"}


def _extract_html(data: bytes) -> list[Page]:
    from bs4 import BeautifulSoup

    soup = BeautifulSoup(data, "html.parser")
    for tag in soup(["script", "style", "noscript", "template", "head", "svg", "iframe", "object"]):
        tag.decompose()
    blocks: list[Block] = []
    title = soup.title.get_text(" ", strip=True) if soup.title else ""
    body = soup.body or soup
    for el in body.find_all(True):
        name = el.name.lower()
        if re.fullmatch(r"h[1-6]", name):
            text = " ".join(el.get_text(" ", strip=True).split())
            if text:
                blocks.append(Block("heading", text, int(name[1])))
        elif name in _HTML_BLOCKS:
            if el.find_parent(list(_HTML_BLOCKS)) is not None and name != "li":
                continue    # its text is in the enclosing block already
            if name == "li" and el.find_parent(["p", "td", "th", "blockquote"]) is not None:
                continue
            if name == "tr":
                cells = [" ".join(c.get_text(" ", strip=True).split()) for c in el.find_all(["td", "th"])]
                text = " | ".join(c for c in cells if c)
            else:
                text = " ".join(el.get_text(" ", strip=True).split())
            text = re.sub(r"\s+([.,;:!?])", r"\1", text)
            if text:
                blocks.append(Block("para", _clean(text)))
    if not blocks:   # no block markup at all: the visible text
        text = _clean(body.get_text("\n"))
        blocks = [Block("para", p) for p in _paragraphs(text)]
    if title and not any(b.kind == "heading" for b in blocks[:1]):
        blocks.insert(0, Block("heading", _clean(title), 1))
    return [Page(None, blocks)]


def _extract_docx(data: bytes) -> list[Page]:
    try:
        import docx
        from docx.table import Table
        from docx.text.paragraph import Paragraph
    except ImportError as exc:  # pragma: no cover - a dependency
        raise ExtractError("Word support is not installed (python-docx)") from exc
    try:
        document = docx.Document(io.BytesIO(data))
    except Exception as exc:
        raise ExtractError(f"the Word document cannot be read ({type(exc).__name__}: {exc})") from exc
    blocks: list[Block] = []
    for item in document.iter_inner_content():
        if isinstance(item, Paragraph):
            text = _clean(item.text).strip()
            if not text:
                continue
            style = (item.style.name if item.style is not None else "") or ""
            m = re.match(r"(?i)heading\s*(\d)", style)
            if m or style.lower() == "title":
                blocks.append(Block("heading", text, int(m.group(1)) if m else 1))
            else:
                blocks.append(Block("para", text))
        elif isinstance(item, Table):
            for row in item.rows:
                cells = []
                for cell in row.cells:
                    t = " ".join(_clean(cell.text).split())
                    if t and (not cells or cells[-1] != t):   # merged cells repeat
                        cells.append(t)
                if cells:
                    blocks.append(Block("para", " | ".join(cells)))
    return [Page(None, blocks)]


def extract(path: str | os.PathLike, data: bytes | None = None) -> Extracted:
    """Read one file (or its ``data`` when the caller has read it already);
    raises :class:`ExtractError` saying why it cannot be."""
    path = Path(path)
    kind = kind_of(path)
    if kind is None:
        raise ExtractError(f"unsupported file type '{path.suffix or '(none)'}' "
                           f"(supported: {', '.join(sorted(set(SUFFIXES)))})")
    if data is None:
        from app.documents.walk import read_document_bytes

        data = read_document_bytes(path, MAX_FILE_BYTES)   # never a FIFO, a device or an endless file
    if kind in ("text", "markdown"):
        pages = [Page(None, _text_blocks(_decode(data), kind == "markdown"))]
    elif kind == "pdf":
        if not data.startswith(b"%PDF"):
            raise ExtractError("this is not a PDF file")
        pages = _extract_pdf(data)
    elif kind == "html":
        pages = _extract_html(data)
    else:
        if not data.startswith(b"PK"):
            raise ExtractError("this is not a Word (.docx) file")
        pages = _extract_docx(data)
    doc = Extracted(path, kind, pages)
    if not doc.chars:
        raise ExtractError("the file has no text")
    return doc


def expand(paths: Iterable[str | os.PathLike]) -> tuple[list[Path], list[tuple[Path, str]]]:
    """Files to read from files and folders, and [(path, why it is skipped)]:
    the policy of :func:`app.documents.walk.iter_document_files`, collected."""
    from app.documents.walk import Skip, iter_document_files

    files: list[Path] = []
    skipped: list[tuple[Path, str]] = []
    for item in iter_document_files(paths):
        if isinstance(item, Skip):
            skipped.append((item.path, item.reason))
        else:
            files.append(item)
    return files, skipped
