"""Text out of a user's file: plain text, Markdown, PDF (per page), HTML and
Word. Each file becomes pages (PDF) or one page (the rest) of *blocks*:
headings and paragraphs. A page's text is its blocks joined by blank lines,
and every passage Ferry cites is an exact slice of that text.

Nothing here touches the network or writes anything: parsers read the bytes
they are given (external entities, images and links are never fetched).
"""
from __future__ import annotations

import io
import itertools
import os
import re
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

# the files read (their kinds, the size limit) and how they are read are the walk's policy, one floor below
from app.documents.walk import MAX_FILE_BYTES, SUFFIXES, ExtractError, kind_of, read_document_bytes

# Limits against hostile files: a few bytes on disk that would take hours or gigabytes to read.
# Each is far above what real documents need (docs/SECURITY.md); a file past one is refused
# with a message naming it, and the rest of the batch goes on.
#: PDF: pages, and the decompressed bytes of the pages' content streams (a stream that many pages
#: share counts for each of them) -- at most this many times the file's size, or PDF_MIN_CONTENT
#: when that is more; and the content operations read (Form XObjects included): one per
#: PDF_BYTES_PER_OPERATION bytes of that budget (pypdf reads ~40,000 a second)
MAX_PDF_PAGES = 20_000
PDF_CONTENT_RATIO = 20
PDF_MIN_CONTENT = 2 << 20
PDF_BYTES_PER_OPERATION = 8
#: Word (zip): entries, their total uncompressed size, and how much larger than the file that may
#: be (a total under ZIP_MIN_EXPANDED is always fine)
MAX_ZIP_ENTRIES = 10_000
MAX_ZIP_EXPANDED = 128 << 20
ZIP_RATIO = 100
ZIP_MIN_EXPANDED = 16 << 20
#: HTML: elements, their nesting depth, and the elements visited while taking the text of the
#: blocks (nested lists and headings visit their inner elements again): a multiple of the elements
MAX_HTML_ELEMENTS = 300_000
MAX_HTML_DEPTH = 1_000
HTML_VISITS_PER_NODE = 16


def _size(n: int) -> str:
    return f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n / 2**10:.0f} KiB" if n >= 2**10 else f"{n} bytes"


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


class _PdfTooMuchWork(BaseException):
    """Raised from inside pypdf's text extraction (a BaseException: pypdf catches Exception)."""


def _pdf_limits(reader, file_bytes: int):
    """Refuse a PDF whose pages or decompressed page contents are past the limits (ExtractError),
    and give the operation counter to pass to ``extract_text``, which stops it past its limit."""
    n_pages = len(reader.pages)
    if n_pages > MAX_PDF_PAGES:
        raise ExtractError(f"refused: the PDF has {n_pages} pages, more than the {MAX_PDF_PAGES} Ferry reads "
                           "(a limit against hostile files)")
    budget = max(PDF_MIN_CONTENT, PDF_CONTENT_RATIO * file_bytes)
    decoded: dict[tuple[int, int], int] = {}    # decompressed size of each stream, decompressed once
    total = 0
    for page in reader.pages:
        raw = page.raw_get("/Contents") if "/Contents" in page else None    # not resolved: its object number
        target = raw.get_object() if raw is not None else None
        refs = list(target) if isinstance(target, list) else [raw] if raw is not None else []
        for ref in refs:
            key = (getattr(ref, "idnum", id(ref)), getattr(ref, "generation", 0))
            if key not in decoded:
                try:
                    decoded[key] = len(ref.get_object().get_data())
                except Exception:   # a damaged stream: extract_text says so, or skips it
                    decoded[key] = 0
            total += decoded[key]
        if total > budget:
            raise ExtractError(f"refused: the PDF's pages decompress to more than {_size(budget)} of content "
                               f"(the limit for a file of {_size(file_bytes)}: {PDF_CONTENT_RATIO} times its size, "
                               f"at least {_size(PDF_MIN_CONTENT)}); a hostile or broken file")
    limit = budget // PDF_BYTES_PER_OPERATION
    done = [0]

    def count(*_):
        done[0] += 1
        if done[0] > limit:
            raise _PdfTooMuchWork(f"refused: reading the PDF's text took more than {limit} content operations "
                                  f"(the limit for a file of {_size(file_bytes)}); a hostile or broken file")

    return count


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
        count = _pdf_limits(reader, len(data))
        pages = []
        for i, page in enumerate(reader.pages, start=1):
            text = _clean(page.extract_text(visitor_operand_before=count) or "")
            pages.append(Page(i, [Block("para", p) for p in _paragraphs(text)]))
    except _PdfTooMuchWork as exc:
        raise ExtractError(str(exc)) from None
    except ExtractError:
        raise
    except (PdfReadError, Exception) as exc:
        raise ExtractError(f"the PDF cannot be read ({type(exc).__name__}: {exc})") from exc
    if not any(p.blocks for p in pages):
        raise ExtractError("the PDF has no text (a scan? text recognition is not supported)")
    return pages


_HTML_BLOCKS = {"p", "li", "tr", "pre", "blockquote", "dd", "dt", "figcaption", "caption", "address"}


_LI_CONTAINERS = frozenset({"p", "td", "th", "blockquote"})


def _html_text_elements(soup, body) -> set[int]:
    """The ids of the elements whose text becomes a block: headings, and blocks not inside another
    block (a list item: not inside a paragraph, cell or quote), found in one pass over the tree
    (a search of each element's ancestors was quadratic in the nesting). Refuses (ExtractError) a
    tree nested past MAX_HTML_DEPTH, or one where taking those texts would visit more than
    HTML_VISITS_PER_NODE times its nodes (blocks nested in blocks are read again)."""
    from bs4 import Tag

    state = {id(soup): (0, False, False)}     # id -> (depth, inside a block, inside an li container)
    order = []
    for node in soup.descendants:
        depth, in_block, in_li = state[id(node.parent)]
        if isinstance(node, Tag):
            name = node.parent.name
            state[id(node)] = (depth + 1, in_block or name in _HTML_BLOCKS, in_li or name in _LI_CONTAINERS)
            if depth + 1 > MAX_HTML_DEPTH:
                raise ExtractError(f"refused: the HTML nests elements more than {MAX_HTML_DEPTH} deep "
                                   "(a limit against hostile files)")
        order.append(node)
    size: dict[int, int] = {}           # nodes in each element's subtree
    for node in reversed(order):
        size[id(node.parent)] = size.get(id(node.parent), 0) + size.get(id(node), 0) + 1
    # the body's descendants: the nodes after it in document order, as many as its subtree holds
    start = 0 if body is soup else next(i for i, node in enumerate(order) if node is body) + 1
    taken: set[int] = set()
    visits = 0
    for node in order[start:start + size.get(id(body), 0)]:
        if not isinstance(node, Tag):
            continue
        name = node.name.lower()
        _, in_block, in_li = state[id(node)]
        if re.fullmatch(r"h[1-6]", name) or (name in _HTML_BLOCKS and (not in_block or name == "li")
                                             and not (name == "li" and in_li)):
            taken.add(id(node))
            visits += size.get(id(node), 0)
    if visits > HTML_VISITS_PER_NODE * max(len(order), 10_000):
        raise ExtractError("refused: the HTML nests its blocks so that reading them would visit "
                           f"{visits} elements, more than {HTML_VISITS_PER_NODE} times its size "
                           "(a limit against hostile files)")
    return taken


def _extract_html(data: bytes) -> list[Page]:
    from bs4 import BeautifulSoup

    if sum(1 for _ in itertools.islice(re.finditer(rb"<[A-Za-z]", data), MAX_HTML_ELEMENTS + 1)) > MAX_HTML_ELEMENTS:
        raise ExtractError(f"refused: the HTML has more than {MAX_HTML_ELEMENTS} elements, the most Ferry reads "
                           "(a limit against hostile files)")
    soup = BeautifulSoup(data, "html.parser")
    for tag in soup(["script", "style", "noscript", "template", "head", "svg", "iframe", "object"]):
        tag.decompose()
    blocks: list[Block] = []
    title = soup.title.get_text(" ", strip=True) if soup.title else ""
    body = soup.body or soup
    taken = _html_text_elements(soup, body)
    for el in body.find_all(True):
        name = el.name.lower()
        if id(el) not in taken:
            continue    # not a heading or a block, or its text is in the enclosing block already
        if re.fullmatch(r"h[1-6]", name):
            text = " ".join(el.get_text(" ", strip=True).split())
            if text:
                blocks.append(Block("heading", text, int(name[1])))
        elif name in _HTML_BLOCKS:
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


def _zip_limits(data: bytes, what: str) -> None:
    """Refuse a zip-based document whose entries would expand past the limits (ExtractError). The
    sizes are the archive's own: Python's zipfile never returns more than an entry declares."""
    import zipfile

    try:
        with zipfile.ZipFile(io.BytesIO(data)) as z:
            entries = z.infolist()
    except (zipfile.BadZipFile, ValueError, OSError) as exc:
        raise ExtractError(f"the {what} cannot be read (it is not a valid zip archive: {exc})") from None
    if len(entries) > MAX_ZIP_ENTRIES:
        raise ExtractError(f"refused: the {what} holds {len(entries)} files, more than the {MAX_ZIP_ENTRIES} "
                           "Ferry reads (a limit against hostile files)")
    expanded = sum(e.file_size for e in entries)
    limit = min(MAX_ZIP_EXPANDED, max(ZIP_MIN_EXPANDED, ZIP_RATIO * len(data)))
    if expanded > limit:
        raise ExtractError(f"refused: the {what} expands to {_size(expanded)}, more than {_size(limit)} (the limit "
                           f"for a file of {_size(len(data))}: {ZIP_RATIO} times its size, at least "
                           f"{_size(ZIP_MIN_EXPANDED)}, at most {_size(MAX_ZIP_EXPANDED)}); a hostile or broken file")


def _extract_docx(data: bytes) -> list[Page]:
    try:
        import docx
        from docx.table import Table
        from docx.text.paragraph import Paragraph
    except ImportError as exc:  # pragma: no cover - a dependency
        raise ExtractError("Word support is not installed (python-docx)") from exc
    _zip_limits(data, "Word document")
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
