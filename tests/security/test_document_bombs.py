"""Issue 32: hostile documents -- a few bytes on disk that would take hours or gigabytes to read --
are refused by a limit that names itself, in bounded time and memory, and the rest of the batch
goes on. Every bomb is generated here (small on disk, except the spaceless text, which is its
point); the end-to-end test runs `ferry docs add` on all of them in a process whose memory is
measured: none may pass 2 GB. The limits' values: app/documents/extract.py, docs/SECURITY.md."""
from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import time
import zipfile
import zlib

import pytest

from app.documents import chunk as chunking
from app.documents import extract as ex
from app.documents.terms import MAX_TOKEN_CHARS, raw_words, terms_for
from tests.conftest import REPO


def pdf(pages: int, content: bytes, compress: bool = True) -> bytes:
    """A PDF whose pages all share one content stream."""
    body = zlib.compress(content, 9) if compress else content
    objs = [b"<< /Type /Catalog /Pages 2 0 R >>",
            b"<< /Type /Pages /Kids [" + b" ".join(b"%d 0 R" % (5 + i) for i in range(pages)) + b"] /Count %d >>"
            % pages,
            b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
            b"<< /Length %d %s>>\nstream\n" % (len(body), b"/Filter /FlateDecode " if compress else b"") + body
            + b"\nendstream"]
    objs += [b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Resources << /Font << /F1 3 0 R >> >> "
             b"/Contents 4 0 R >>"] * pages
    out = io.BytesIO()
    out.write(b"%PDF-1.4\n")
    offsets = []
    for n, obj in enumerate(objs, start=1):
        offsets.append(out.tell())
        out.write(b"%d 0 obj\n" % n + obj + b"\nendobj\n")
    xref = out.tell()
    out.write(b"xref\n0 %d\n0000000000 65535 f \n" % (len(objs) + 1) + b"".join(b"%010d 00000 n \n" % o
                                                                               for o in offsets))
    out.write(b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objs) + 1, xref))
    return out.getvalue()


TEXT_OP = b"BT /F1 12 Tf 72 720 Td (lorem ipsum dolor) Tj ET\n"


def pdf_bomb() -> bytes:
    """The probe: 2,000 pages sharing one 2 MB content stream (~2 h of CPU before the limits)."""
    return pdf(2000, TEXT_OP * ((2 << 20) // len(TEXT_OP)))


def docx_bomb(xml_bytes: int = 64 << 20) -> bytes:
    """A Word file whose document.xml expands ~1,000 times."""
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as z:
        z.writestr("[Content_Types].xml", '<?xml version="1.0"?><Types/>')
        with z.open("word/document.xml", "w") as f:
            para = b"<w:p><w:r><w:t>bomb</w:t></w:r></w:p>" * 1000
            for _ in range(xml_bytes // len(para)):
                f.write(para)
    return out.getvalue()


def html_bomb() -> bytes:
    return b"<b>" * 2_000_000          # the probe had 40 MB of these (90 s, 3.7 GB, MemoryError)


def _refused(name: str, data: bytes, *words: str) -> str:
    t0 = time.monotonic()
    with pytest.raises(ex.ExtractError) as info:
        ex.extract(name, data)
    msg = str(info.value)
    assert msg.startswith("refused: ") and "\n" not in msg, msg
    for w in words:
        assert w in msg, msg
    assert time.monotonic() - t0 < 60, msg
    return msg


def test_a_pdf_whose_pages_share_a_huge_stream_is_refused_at_once():
    _refused("bomb.pdf", pdf_bomb(), "decompress to more than", "20 times its size")


def test_a_pdf_with_too_many_pages_is_refused(monkeypatch):
    monkeypatch.setattr(ex, "MAX_PDF_PAGES", 100)     # 20,000 pages take a while to build and list
    _refused("pages.pdf", pdf(101, TEXT_OP), "101 pages, more than the 100")


def test_pdf_work_is_bounded_within_the_content_budget(monkeypatch):
    # Under the byte budget, the operations read are counted too (Form XObjects included)
    monkeypatch.setattr(ex, "PDF_BYTES_PER_OPERATION", 4096)
    _refused("ops.pdf", pdf(3, TEXT_OP * 4000), "content operations")


def test_a_docx_that_expands_a_thousand_times_is_refused():
    data = docx_bomb()
    assert len(data) < 1 << 20
    _refused("bomb.docx", data, "expands to 64.0 MiB", "100 times its size")


def test_a_docx_with_too_many_entries_is_refused():
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as z:
        for i in range(ex.MAX_ZIP_ENTRIES + 1):
            z.writestr(f"e{i}", b"")
    _refused("many.docx", out.getvalue(), f"{ex.MAX_ZIP_ENTRIES + 1} files")


def test_html_of_tiny_tags_is_refused_quickly():
    _refused("tags.html", html_bomb(), f"more than {ex.MAX_HTML_ELEMENTS} elements")


def test_html_nested_too_deep_is_refused():
    _refused("deep.html", b"<div>" * (ex.MAX_HTML_DEPTH + 5) + b"x", f"more than {ex.MAX_HTML_DEPTH} deep")


def test_html_whose_nested_lists_would_be_read_again_and_again_is_refused():
    # each list item's text holds the items inside it: 450 levels read ~450 times each
    _refused("lists.html", b"<ul><li>w " * 450 + b"</li></ul>" * 450, "would visit")


def test_ordinary_nesting_is_read_as_before():
    doc = ex.extract("ok.html", b"<ul><li>one<ul><li>two</li></ul></li><li>three</li></ul><p>a <b>b</b></p>")
    assert [b.text for b in doc.pages[0].blocks] == ["one two", "two", "three", "a b"]


def test_a_spaceless_file_becomes_bounded_passages_and_terms():
    text = "a" * (3 * 2**20)
    doc = ex.extract("spaceless.txt", text.encode())
    chunks = chunking.chunk_document(doc)
    assert max(len(c.text) for c in chunks) <= chunking.MAX_CHUNK_CHARS
    assert "".join(c.text for c in chunks[::1]).count("a") >= len(text)      # every character is in a passage
    words, n_words, grams, n_grams = terms_for("", chunks[0].text)
    assert n_words == 1 and len(words) == MAX_TOKEN_CHARS and n_grams == MAX_TOKEN_CHARS - 1
    assert raw_words("x" * 500 + " yes") == ["x" * MAX_TOKEN_CHARS, "yes"]


RUN = """
import resource, sys, time
sys.path.insert(0, {repo!r})
from app.cli import main
t = time.monotonic()
code = main(sys.argv[1:])
sys.stdout.flush()
print("USAGE", code, time.monotonic() - t, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
      resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr)
"""


@pytest.mark.slow      # ~30 s on an idle machine: 100 MB of text is indexed
def test_ferry_docs_add_refuses_every_bomb_in_bounded_memory_and_indexes_the_rest(tmp_path):
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "bomb.pdf").write_bytes(pdf_bomb())
    (docs / "bomb.docx").write_bytes(docx_bomb())
    (docs / "tags.html").write_bytes(html_bomb())
    (docs / "spaceless.txt").write_bytes(b"q" * (100 << 20))
    (docs / "good.md").write_text("# Boathouse\n\nThe spare key is taped under the drawer.\n")
    env = {**os.environ, "FERRY_HOME": str(tmp_path / "home"), "FERRY_PASSPHRASE": "a long test passphrase",
           "PYTHON_KEYRING_BACKEND": "keyring.backends.fail.Keyring"}

    def limit():   # a safety net for the machine; the assertion below is the 2 GB rule
        import resource
        resource.setrlimit(resource.RLIMIT_AS, (6 << 30, 6 << 30))

    res = subprocess.run([sys.executable, "-c", RUN.format(repo=str(REPO)), "docs", "add", "c", str(docs), "--json"],
                         capture_output=True, text=True, env=env, cwd=REPO, timeout=900, preexec_fn=limit)
    usage = [ln.split() for ln in res.stderr.splitlines() if ln.startswith("USAGE ")]
    assert usage, res.stderr
    _, code, seconds, self_kib, children_kib = usage[-1]
    report = json.loads(res.stdout)
    failed = {f["name"]: f["error"] for f in report["failed"]}
    assert set(failed) == {"bomb.pdf", "bomb.docx", "tags.html"}, report
    assert all("refused: " in e for e in failed.values()), failed
    assert sorted(os.path.basename(p) for p in report["added"]) == ["good.md", "spaceless.txt"]
    assert int(code) == 1 and "Traceback" not in res.stderr
    assert max(int(self_kib), int(children_kib)) < 2 << 20, usage      # KiB: under 2 GiB, every process
    assert float(seconds) < 600, usage
