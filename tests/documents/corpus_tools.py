"""The test corpus as a user would have it: the PDF and the Word file are
generated from text sources, so no binaries are committed."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

CORPUS = Path(__file__).parent / "corpus"


def make_pdf(pages: list[str], out: Path) -> Path:
    gen = load_corpus_generator()
    return gen.pdf_from_pages([gen.paragraphs(text) for text in pages], out, size=11, line=5.5, gap=3,
                              page_break=False, unicode=False)


def make_docx(source: str, out: Path) -> Path:
    import docx

    d = docx.Document()
    table = None
    for line in source.strip().split("\n"):
        if line.startswith("|"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if table is None:
                table = d.add_table(rows=0, cols=len(cells))
            row = table.add_row().cells
            for cell, text in zip(row, cells):
                cell.text = text
            continue
        table = None
        if line.startswith("## "):
            d.add_heading(line[3:], level=2)
        elif line.startswith("# "):
            d.add_heading(line[2:], level=1)
        elif line.strip():
            d.add_paragraph(line)
    d.save(str(out))
    return out


def build_corpus(dest: Path) -> Path:
    """The five test documents as a user would have them."""
    dest.mkdir(parents=True, exist_ok=True)
    for name in ("lease.md", "discharge.txt", "statement.html"):
        shutil.copy(CORPUS / name, dest / name)
    pages = (CORPUS / "manual.pages.txt").read_text(encoding="utf-8").split("\n\\f\n")
    make_pdf(pages, dest / "manual.pdf")
    make_docx((CORPUS / "policy.docx.txt").read_text(encoding="utf-8"), dest / "policy.docx")
    return dest


def questions() -> list[dict]:
    return json.loads((CORPUS / "questions.json").read_text(encoding="utf-8"))


def load_corpus_generator():
    """bench/docs_corpus.py, loaded by path: putting bench/ on sys.path could shadow packages
    (bench/kernels.py, now kernel_speed.py, once shadowed `kernels`, which transformers imports)."""
    import importlib.util

    path = Path(__file__).resolve().parents[2] / "bench" / "docs_corpus.py"
    spec = importlib.util.spec_from_file_location("docs_corpus", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
