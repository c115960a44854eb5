"""Markdown to the HTML subset QTextBrowser draws, with a "Copy" link on
every code block. Raw HTML in the text is shown as text, never interpreted."""
from __future__ import annotations

import html
from dataclasses import dataclass

from markdown_it import MarkdownIt


@dataclass
class Colors:
    code_bg: str = "#f2f3f5"
    code_border: str = "#d8dadf"
    code_label: str = "#6b7280"
    link: str = "#2563eb"


@dataclass
class Rendered:
    html: str
    code_blocks: list[str]   #: the text behind each "copy:N" link


def _parser() -> MarkdownIt:
    md = MarkdownIt("commonmark", {"html": False, "breaks": True})
    md.enable(["table", "strikethrough"])
    return md


_MD = _parser()


def render(text: str, colors: Colors | None = None) -> Rendered:
    colors = colors or Colors()
    blocks: list[str] = []
    tokens = _MD.parse(text)
    out: list[str] = []
    pending: list = []

    def flush() -> None:
        if pending:
            out.append(_MD.renderer.render(pending, _MD.options, {}))
            pending.clear()

    for tok in tokens:
        if tok.type in ("fence", "code_block"):
            flush()
            blocks.append(tok.content.rstrip("\n"))
            lang = (tok.info or "").split()[0] if tok.type == "fence" and tok.info else ""
            out.append(_code_html(len(blocks) - 1, tok.content.rstrip("\n"), lang, colors))
        else:
            pending.append(tok)
    flush()
    body = "".join(out)
    style = (f"<style>a {{ color: {colors.link}; }} code {{ background-color: {colors.code_bg}; "
             f"font-family: monospace; }} p {{ margin-top: 4px; margin-bottom: 4px; }}"
             f"table {{ border-collapse: collapse; }} th, td {{ padding: 3px 6px; }}</style>")
    return Rendered(style + body, blocks)


def _code_html(index: int, code: str, lang: str, c: Colors) -> str:
    label = html.escape(lang) if lang else "code"
    return (f'<table width="100%" cellspacing="0" cellpadding="6" style="margin-top:6px; margin-bottom:6px;" '
            f'bgcolor="{c.code_bg}" border="0">'
            f'<tr><td><span style="color:{c.code_label}; font-size:small;">{label}</span></td>'
            f'<td align="right"><a href="copy:{index}" style="font-size:small;">Copy</a></td></tr>'
            f'<tr><td colspan="2"><pre style="font-family:monospace; margin:0;">{html.escape(code)}</pre>'
            f'</td></tr></table>')
