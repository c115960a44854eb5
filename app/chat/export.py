"""Export a conversation (the branch on screen) as Markdown or JSON. No Qt.

The JSON holds what is needed to audit or reproduce an answer: every message
with its thinking, status, token counts and timing, the passages it could cite,
the model and the sampling settings. A question's images are written as files
beside the export (``<name>-<message id>-<n>.png``) and referenced by that
relative name from the Markdown and the JSON."""
from __future__ import annotations

import html
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


def _when(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(t)) if t else ""


def _shown(m, shown: dict | None) -> tuple[str, list]:
    """An answer as the user saw it: its text with the ``[n]`` markers the window showed, and the
    sources it cites (``shown``: message id -> (text, cited), from ``ChatController.shown``)."""
    text, cited = (shown or {}).get(m.id, (m.content, []))
    return text, list(cited)


#: An exported image's file extension by the data URL's type.
_IMAGE_EXT = {"png": ".png", "jpeg": ".jpg", "gif": ".gif", "webp": ".webp", "bmp": ".bmp", "tiff": ".tif"}


def image_files(chat, path: str | Path) -> dict[tuple[int, int], str]:
    """(message id, image index) -> the file name each image of the branch gets beside the export at
    ``path``: derived from the export's name, never from the image's own (which could name any place)."""
    stem = Path(path).stem
    names = {}
    for m in chat.visible():
        for i, img in enumerate(m.images):
            kind = str(img.get("url", ""))[len("data:image/"):].split(";", 1)[0].lower()
            names[(m.id, i)] = f"{stem}-{m.id}-{i + 1}{_IMAGE_EXT.get(kind, '.img')}"
    return names


def _images(m, files: dict | None) -> list[dict]:
    return [{"name": img.get("name", ""), **({"file": files[(m.id, i)]} if files and (m.id, i) in files else {})}
            for i, img in enumerate(m.images)]


def as_dict(chat, *, model: str = "", sampling: dict | None = None,
            citations: dict[int, list] | None = None, shown: dict | None = None,
            files: dict | None = None) -> dict:
    """``citations``: message id -> the passages its prompt held; ``shown``: see ``_shown``; ``files``:
    where the images were written (``image_files``)."""
    citations = citations or {}
    messages = []
    for m in chat.visible():
        text, cited = _shown(m, shown)
        d = {"id": m.id, "parent_id": m.parent_id, "role": m.role, "content": text,
             "created": m.created, "created_at": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(m.created)),
             "status": m.status}
        if m.images:                # the question's images: their names and the files beside the export
            d["images"] = _images(m, files)
        if text != m.content:       # markers the window added where a sentence matches a passage
            d["model_content"] = m.content
        if m.thinking:
            d["thinking"] = m.thinking
            d["thinking_seconds"] = m.thinking_seconds
        if (m.stats or {}).get("model"):      # what wrote this answer: model, format, sampling, routing
            d["model"] = m.stats["model"]
        stats = {k: v for k, v in (m.stats or {}).items() if k not in ("citations", "model")}
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
            d["passages"] = [_citation(c) for c in citations[m.id]]   # what its prompt held
        if cited:
            d["citations"] = [_citation(c) for c in cited]          # what it cites, in order of first mention
        messages.append(d)
    writers = [d["model"]["name"] for d in messages if (d.get("model") or {}).get("name")]
    return {"format": "ferry-chat", "version": FORMAT_VERSION, "title": chat.title,
            # the model that wrote the newest answer (each message says its own); the open one if none says
            "model": writers[-1] if writers else (model or chat.model_name),
            "models": sorted(set(writers)),
            "sampling": dict(sampling or {}),
            "exported": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "messages": messages}


def to_json(chat, **kw) -> str:
    return json.dumps(as_dict(chat, **kw), indent=1, ensure_ascii=False) + "\n"


#: How an answer that did not end normally is marked in the export.
STATUS_NOTE = {"cancelled": "stopped", "error": "ended by an error", "length": "cut off at the length limit",
               "context_full": "stopped: the context is full"}


def to_markdown(chat, *, shown: dict | None = None, files: dict | None = None, **_kw) -> str:
    """The branch on screen as Markdown: who wrote each message (and which model) and when, thinking
    (escaped) folded in ``<details>``, the text as shown with its ``[n]`` markers, and under each answer
    the sources it cites, each once."""
    lines = [f"# {chat.title}", "", f"*Exported {_when(time.time())}*", ""]
    for m in chat.visible():
        wrote = ((m.stats or {}).get("model") or {}).get("name")
        who = "You" if m.role == "user" else (f"Assistant ({wrote})" if wrote else "Assistant")
        lines += [f"## {who}" + (f" · {_when(m.created)}" if m.created else ""), ""]
        if m.thinking:
            secs = f" ({m.thinking_seconds:.0f} s)" if m.thinking_seconds else ""
            lines += [f"<details><summary>Thinking{secs}</summary>", "", "<pre>", html.escape(m.thinking.strip()),
                      "</pre>", "", "</details>", ""]
        for img in _images(m, files):     # a question's images, as the files beside the export
            alt = img["name"].replace("]", ")").replace("[", "(")
            lines += [f"![{alt}](<{img['file']}>)" if img.get("file") else f"*[image: {alt}]*", ""]
        text, cited = _shown(m, shown)
        lines += [text.strip() or ("" if m.images else "*(no answer)*"), ""]
        if m.status in STATUS_NOTE:
            lines += [f"*({STATUS_NOTE[m.status]})*", ""]
        if cited:
            lines += ["**Sources**", ""]
            seen = set()
            for c in cited:
                d = _citation(c)
                if d.get("n") in seen:
                    continue
                seen.add(d.get("n"))
                where = d.get("file", "") + (f", page {d['page']}" if d.get("page") else "")
                lines.append(f"- [{d.get('n')}] {where}: {d.get('passage', '').strip()[:200]}")
            lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def write(chat, path: str | Path, fmt: str | None = None, **kw) -> Path:
    """Write the conversation to ``path`` as ``fmt`` ("md" or "json"; by default from the suffix), its
    images as files beside it (``image_files``)."""
    from app.vision.image import ImageError, data_url_bytes

    path = Path(path)
    fmt = fmt or ("json" if path.suffix.lower() == ".json" else "md")
    if fmt not in FORMATS:
        raise ValueError(f"unknown export format {fmt!r}: use md or json")
    files = image_files(chat, path)
    for m in chat.visible():
        for i, img in enumerate(m.images):
            try:
                write_private(path.with_name(files[(m.id, i)]), data_url_bytes(img.get("url", ""), img.get("name")))
            except ImageError:       # kept by another version in a form we cannot read: named, not written
                files.pop((m.id, i))
    text = to_json(chat, files=files, **kw) if fmt == "json" else to_markdown(chat, files=files, **kw)
    return write_private(path, text)   # a conversation in the clear: the user's eyes only
