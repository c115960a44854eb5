"""A generated archive of realistic text for the documents benchmark and the
scale tests: letters, statements, contracts and notes as Markdown and plain
text files of 8-160 KB, with headings, dates, amounts, names and account
numbers, and words drawn from a Zipf distribution over a vocabulary of
English words and a long tail of rarer made-up ones (names, places, terms).
Deterministic for a seed; nothing is downloaded.

    generate(folder, megabytes, seed=0) -> list of files written
    generate(folder, megabytes, seed=0, pdf=True): the same documents as PDF
        files (fpdf2, pages of about 2,500 characters), as most of a real
        archive is: for measuring extraction against the index
"""
from __future__ import annotations

import random
from pathlib import Path

_COMMON = """
the of and to a in that is was he for it with as his on be at by i this had not are but from or have an they
which one you were her all she there would their we him been has when who will more no if out so said what up
its about into than them can only other new some could time these two may then do first any my now such like
our over man me even most made after also did many before must through back years where much your way well
down should because each just those people how too little state good very make world still own see men work
long get here between both life being under never day same another know while last might us great old year off
come since against go came right used take three account payment balance statement letter contract tenant
landlord insurance policy premium claim doctor patient hospital treatment medication dose report office bank
transfer invoice amount due date notice period agreement clause party parties property address street house
flat rent deposit repair heating water electricity council tax school teacher child children family mother
father wife husband brother sister meeting appointment review result test blood pressure letterhead signature
signed witness employer employee salary pension benefit holiday leave sick annual monthly weekly quarterly
interest rate loan mortgage credit debit card number reference customer service complaint response reply
request information please regards sincerely enclosed attached copy original record records file
""".split()
_SYL = ["ka", "lo", "mi", "ran", "tes", "vor", "dun", "shi", "bel", "gra", "pet", "nor", "qui", "zel", "ham",
        "sto", "wil", "bra", "fen", "cor", "lu", "ost", "ing", "ald", "mer", "tho", "rix", "vel", "pan", "dor"]
_KINDS = ["Letter", "Statement", "Contract", "Notes", "Report", "Invoice", "Minutes", "Policy schedule"]
_MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
           "November", "December"]


def _vocabulary(rng: random.Random, tail: int = 40000) -> list[str]:
    made = set()
    while len(made) < tail:
        made.add("".join(rng.choice(_SYL) for _ in range(rng.randint(2, 4))))
    return _COMMON + sorted(made)


class _Writer:
    def __init__(self, seed: int):
        self.rng = random.Random(seed)
        self.vocab = _vocabulary(self.rng)
        n = len(self.vocab)
        # Zipf weights (s = 1.07), cumulative for bisect sampling
        weights = [1.0 / (i + 1) ** 1.07 for i in range(n)]
        self.cum = []
        self._buf: list[str] = []
        self._at = 0
        total = 0.0
        for w in weights:
            total += w
            self.cum.append(total)

    def words(self, k: int) -> list[str]:
        if self._at + k > len(self._buf):
            self._buf, self._at = self.rng.choices(self.vocab, cum_weights=self.cum, k=200_000), 0
        self._at += k
        return self._buf[self._at - k:self._at]

    def sentence(self) -> str:
        r = self.rng
        w = self.words(r.randint(7, 24))
        if r.random() < 0.25:
            w.insert(r.randrange(len(w)), f"£{r.randint(10, 9999)}.{r.randint(0, 99):02d}")
        if r.random() < 0.2:
            w.insert(r.randrange(len(w)), f"{r.randint(1, 28)} {r.choice(_MONTHS)} {r.randint(1995, 2026)}")
        if r.random() < 0.1:
            w.insert(r.randrange(len(w)), f"{r.randint(10, 99)}-{r.randint(1000, 9999)}-{r.randint(100, 999)}")
        if r.random() < 0.15:
            w.insert(r.randrange(len(w)), self.rng.choice(self.vocab[len(_COMMON):]).capitalize())
        s = " ".join(w)
        return s[0].upper() + s[1:] + r.choice([".", ".", ".", "?", "!"])

    def document(self, target: int, markdown: bool) -> str:
        r = self.rng
        kind = r.choice(_KINDS)
        title = f"{kind} {r.randint(1, 9999)} — {' '.join(self.words(3)).title()}"
        out = [f"# {title}" if markdown else title.upper(), ""]
        size = 0
        while size < target:
            if r.random() < 0.2:
                head = " ".join(self.words(r.randint(2, 5))).capitalize()
                out += [f"## {head}" if markdown else head.upper(), ""]
            para = " ".join(self.sentence() for _ in range(r.randint(2, 7)))
            out += [para, ""]
            size += len(para) + 1
        return "\n".join(out)


#: a Unicode TrueType font for the PDFs where the system has one (else the core Helvetica, with the
#: text folded to Latin-1: the few dashes and accents become "?")
PDF_FONTS = ("/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf", "/Library/Fonts/Arial Unicode.ttf",
             "/System/Library/Fonts/Supplemental/Arial Unicode.ttf")


def pdf_font() -> str | None:
    """The first of PDF_FONTS this system has, or None (the PDFs then use Helvetica)."""
    return next((f for f in PDF_FONTS if Path(f).is_file()), None)


def paragraphs(text: str) -> list[str]:
    """The paragraphs of ``text`` (separated by blank lines), each on one line."""
    return [" ".join(p.split()) for p in text.split("\n\n") if p.strip()]


def pdf_from_pages(pages: list[list[str]], out: Path, *, size: float = 10, line: float = 5, gap: float = 2,
                   page_break: bool = True, unicode: bool = True) -> Path:
    """A PDF with one page per item of ``pages`` (its paragraphs; with ``page_break`` a long one
    goes on over more pages): the one PDF writer of the benchmarks and the tests' corpus.
    ``unicode``: a TrueType font of PDF_FONTS where there is one, else the core Helvetica."""
    from fpdf import FPDF

    pdf = FPDF(format="A4")
    pdf.set_auto_page_break(page_break)
    font = pdf_font() if unicode else None
    if font:
        pdf.add_font("Body", "", font)
    for paras in pages:
        pdf.add_page()
        pdf.set_font("Body" if font else "Helvetica", size=size)
        for para in paras:
            pdf.multi_cell(0, line, para if font else para.encode("latin-1", "replace").decode("latin-1"))
            pdf.ln(gap)
    pdf.output(str(out))
    return out


def write_pdf(text: str, out: Path, page_chars: int = 2500) -> None:
    """``text`` (paragraphs separated by blank lines) as a PDF of pages of about ``page_chars``."""
    pages, cur, n = [], [], 0
    for para in paragraphs(text):
        cur.append(para)
        n += len(para)
        if n >= page_chars:
            pages.append(cur)
            cur, n = [], 0
    pdf_from_pages(pages + [cur], out)


def generate(folder: Path, megabytes: float, seed: int = 0, *, start: int = 0, pdf: bool = False) -> list[Path]:
    """Write about ``megabytes`` MB of documents into ``folder`` (in sub-folders of
    200 files; ``pdf``: as PDF files, the megabytes counting their text); returns the
    files written."""
    folder = Path(folder)
    w = _Writer(seed)
    written, total, i = [], 0, start
    goal = int(megabytes * 1e6)
    while total < goal:
        size = min(int(w.rng.lognormvariate(10.3, 0.8)), 160_000)
        size = max(size, 8_000)
        md = w.rng.random() < 0.5
        sub = folder / f"box{i // 200:04d}"
        sub.mkdir(parents=True, exist_ok=True)
        path = sub / f"doc{i:06d}.{'md' if md else 'txt'}"
        text = w.document(size, md)
        if pdf:
            path = path.with_suffix(".pdf")
            write_pdf(text, path)
        else:
            path.write_text(text, encoding="utf-8")
        written.append(path)
        total += len(text.encode("utf-8"))
        i += 1
    return written
