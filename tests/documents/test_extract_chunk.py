"""Extraction of each format, and chunks that are exact slices of their page,
never cross a heading, and overlap."""
from __future__ import annotations

from pathlib import Path

import pytest

from app.documents.chunk import chunk_document, sentence_spans
from app.documents.extract import ExtractError, Extracted, Page, Block, extract
from app.documents.walk import expand


def _page(doc, number):
    return next(p for p in doc.pages if p.number == number)


def test_every_format_extracts_with_structure(corpus_dir):
    md = extract(corpus_dir / "lease.md")
    assert md.kind == "markdown" and md.pages[0].number is None
    headings = [b.text for b in md.pages[0].blocks if b.kind == "heading"]
    assert headings[:3] == ["Residential Lease Agreement", "1. Term", "2. Rent"]
    assert "##" not in md.pages[0].text

    pdf = extract(corpus_dir / "manual.pdf")
    assert pdf.kind == "pdf" and [p.number for p in pdf.pages] == [1, 2, 3, 4]
    assert "The tank holds 3.5 litres" in _page(pdf, 2).text
    assert "guaranteed for 24 months" in _page(pdf, 4).text

    html = extract(corpus_dir / "statement.html")
    text = html.pages[0].text
    assert "never runs" not in text and "border-collapse" not in text     # no script, no style
    assert "12 Oct | Salary, Calder & Finch Engineering Ltd | 5,980.00" in text
    assert [b.text for b in html.pages[0].blocks if b.kind == "heading"][:2] == ["Harbour Mutual Bank", "Summary"]

    docx = extract(corpus_dir / "policy.docx")
    assert docx.kind == "docx"
    assert "Contents | $40,000 | $250" in docx.pages[0].text
    assert ("heading", "Making a claim") in [(b.kind, b.text) for b in docx.pages[0].blocks]

    txt = extract(corpus_dir / "discharge.txt")
    assert ("heading", "MEDICATIONS AT DISCHARGE") in [(b.kind, b.text) for b in txt.pages[0].blocks]


def test_chunks_are_exact_slices_within_one_section(corpus_dir):
    for f in sorted(corpus_dir.iterdir()):
        doc = extract(f)
        chunks = chunk_document(doc)
        assert chunks, f
        for c in chunks:
            page = _page(doc, c.page)
            assert page.text[c.start:c.end] == c.text
            assert len(c.text.split()) <= 110
            # a chunk holds no heading of another section
            for b in page.blocks:
                if b.kind == "heading":
                    assert f"\n\n{b.text}\n\n" not in c.text
    lease = chunk_document(extract(corpus_dir / "lease.md"))
    rent = [c for c in lease if "Monthly rent is $1,850.00" in c.text]
    assert len(rent) == 1 and rent[0].heading == "Residential Lease Agreement > 2. Rent"
    assert all(c.page in (1, 2, 3, 4) for c in chunk_document(extract(corpus_dir / "manual.pdf")))


def test_long_sections_overlap_by_whole_sentences():
    sentences = [f"Sentence number {i} says that clause {i} applies to the tenant in every month of the year."
                 for i in range(30)]
    doc = Extracted(Path("x.txt"), "text", [Page(None, [Block("heading", "Terms", 1), Block("para", " ".join(sentences))])])
    chunks = chunk_document(doc, max_words=60, overlap_words=20)
    assert len(chunks) > 5
    for a, b in zip(chunks, chunks[1:]):
        assert a.start < b.start < a.end              # overlap
        assert b.text.startswith("Sentence number")   # at a sentence boundary
        assert a.text.endswith(".")
    assert chunks[-1].text.endswith("month of the year.") and "29" in chunks[-1].text


def test_sentences_respect_abbreviations_and_numbers():
    text = "Dr. Lindqvist saw her at 10.30 a.m. on Monday. Take 2.5 mg daily. Call e.g. the nurse! Done"
    spans = [text[a:b] for a, b in sentence_spans(text)]
    assert spans == ["Dr. Lindqvist saw her at 10.30 a.m. on Monday.", "Take 2.5 mg daily.",
                     "Call e.g. the nurse!", "Done"]


def test_unreadable_files_are_named_and_skipped(tmp_path):
    (tmp_path / "ok.txt").write_text("A perfectly fine note about the boiler service.")
    (tmp_path / "broken.pdf").write_bytes(b"%PDF-1.7\nthis is not really a pdf")
    (tmp_path / "binary.txt").write_bytes(b"\x00\x01\x02\x03" * 100)
    (tmp_path / "fake.docx").write_bytes(b"not a zip")
    (tmp_path / "photo.jpg").write_bytes(b"\xff\xd8\xff")
    (tmp_path / ".hidden.txt").write_text("hidden")
    files, skipped = expand([tmp_path, tmp_path / "missing.md"])
    assert sorted(f.name for f in files) == ["binary.txt", "broken.pdf", "fake.docx", "ok.txt"]
    assert {p.name: why for p, why in skipped} == {"photo.jpg": "unsupported file type '.jpg'",
                                                 "missing.md": "no such file or folder"}
    for name, why in (("broken.pdf", "PDF"), ("binary.txt", "binary"), ("fake.docx", "Word")):
        with pytest.raises(ExtractError, match=why):
            extract(tmp_path / name)
    assert extract(tmp_path / "ok.txt").chars > 10
