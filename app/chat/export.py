"""Export a conversation (the branch on screen) as Markdown or JSON. No Qt.

The JSON holds what is needed to audit or reproduce an answer: every message
with its thinking, status, token counts and timing, the passages it could cite,
the model and the sampling settings."""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from app.chat import token_probs
from app.store.private import write_private

FORMAT_VERSION = 1
FORMATS = {"md": "Markdown (*.md)", "json": "JSON (*.json)"}


def _citation(c: Any) -> dict:
    return c.as_dict() if hasattr(c, "as_dict") else dict(c)


def as_dict(chat, *, model: str = "", sampling: dict | None = None,
            citations: dict[int, list] | None = None) -> dict:
    citations = citations or {}
    messages = []
    for m in chat.visible():
        d = {"id": m.id, "parent_id": m.parent_id, "role": m.role, "content": m.content,
             "created": m.created, "status": m.status}
        if m.thinking:
            d["thinking"] = m.thinking
            d["thinking_seconds"] = m.thinking_seconds
        stats = {k: v for k, v in (m.stats or {}).items() if k != "citations"}
        if stats:
            d["tokens"] = {"prompt": stats.get("turn_prompt_tokens"), "reused": stats.get("turn_reused_tokens"),
                           "answer": stats.get("turn_tokens")}
            d["seconds"] = stats.get("turn_seconds")
            if stats.get("ttft_s") is not None:
                d["time_to_first_token_s"] = stats["ttft_s"]
        kept = token_probs.from_stats(m.stats)
        if kept:   # as the API's logprobs.content (token texts and values)
            d["logprobs"] = [{"token": t.text, "logprob": t.logprob,
                              "top_logprobs": [{"token": a, "logprob": v} for a, v in t.alternatives]} for t in kept]
        if citations.get(m.id):
            d["citations"] = [_citation(c) for c in citations[m.id]]
        messages.append(d)
    return {"format": "ferry-chat", "version": FORMAT_VERSION, "title": chat.title,
            "model": model or chat.model_name, "sampling": dict(sampling or {}),
            "exported": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "messages": messages}


def to_json(chat, **kw) -> str:
    return json.dumps(as_dict(chat, **kw), indent=1, ensure_ascii=False) + "\n"


def to_markdown(chat, *, citations: dict[int, list] | None = None, **_kw) -> str:
    """``Chat.to_markdown`` with each answer's sources listed under it."""
    text = chat.to_markdown()
    cited = [(m, citations[m.id]) for m in chat.visible() if citations and citations.get(m.id)]
    if not cited:
        return text
    lines = [text.rstrip(), "", "## Sources", ""]
    for _m, cs in cited:
        for c in cs:
            d = _citation(c)
            where = d.get("file", "") + (f", page {d['page']}" if d.get("page") else "")
            lines.append(f"- [{d.get('n')}] {where}: {d.get('passage', '').strip()[:200]}")
    return "\n".join(lines) + "\n"


def write(chat, path: str | Path, fmt: str | None = None, **kw) -> Path:
    """Write the conversation to ``path`` as ``fmt`` ("md" or "json"; by default from the suffix)."""
    path = Path(path)
    fmt = fmt or ("json" if path.suffix.lower() == ".json" else "md")
    if fmt not in FORMATS:
        raise ValueError(f"unknown export format {fmt!r}: use md or json")
    text = to_json(chat, **kw) if fmt == "json" else to_markdown(chat, **kw)
    return write_private(path, text)   # a conversation in the clear: the user's eyes only
