"""What the window's documents page shows, without Qt: one row per collection
(files, size, last indexed, watched folders) and one per file (indexed, or
skipped with why). The page (app/ui/documents_page.py) only renders these."""
from __future__ import annotations

import time
from dataclasses import dataclass

from app.documents.store import DocumentError, DocumentStore, conversation_collection
from app.units import size   # the one byte formatter


def when(t: float | None, now: float | None = None) -> str:
    if not t:
        return "never"
    age = (now or time.time()) - t
    if age < 60:
        return "just now"
    if age < 3600:
        return f"{age // 60:.0f} min ago"
    if age < 86400:
        return f"{age // 3600:.0f} h ago"
    return time.strftime("%Y-%m-%d", time.localtime(t))


@dataclass
class CollectionRow:
    name: str
    files: int
    skipped: int
    passages: int
    size: str
    last_indexed: str
    watched: int           #: watched folders
    sources: list[str]
    label: str = ""        #: what the page shows: the name, or for a chat's files "Chat “its title”"
    chats: int = 0         #: the chats it is attached to (besides its own chat's, for a chat's files)


def conversation_of(name: str) -> int | None:
    """The conversation whose attached files a collection holds (``conversation:12`` -> 12), or None."""
    prefix, _, rest = name.partition(":")
    return int(rest) if prefix == "conversation" and rest.isdigit() else None


def collection_label(name: str, titles: dict[int, str] | None = None) -> str:
    cid = conversation_of(name)
    if cid is None:
        return name
    title = (titles or {}).get(cid)
    return f"Chat “{title}”" if title else f"Chat {cid}"


def forget_conversation(store: DocumentStore, conversation_id: int) -> None:
    """A deleted chat's attached files go with it (SQLite may give a new chat the same id) — unless another
    chat (a fork) searches them too; the collections attached to it stay (they are not the chat's)."""
    store.detach(conversation_id)
    own = conversation_collection(conversation_id)
    try:
        if not store.attached_to(own):
            store.delete_collection(own)
    except DocumentError:       # nothing was attached
        pass


def drop_orphans(store: DocumentStore, conversation_ids: set[int]) -> list[str]:
    """Remove the attached files of chats that no longer exist (deleted by a version that kept them) and
    their attachments; returns the collections removed."""
    for name in {c.name for c in store.collections()}:
        for cid in store.attached_to(name):
            if cid not in conversation_ids:
                store.detach(cid, name)
    gone = [c.name for c in store.collections()
            if conversation_of(c.name) not in (None, *conversation_ids) and not store.attached_to(c.name)]
    for name in gone:
        store.delete_collection(name)
    return gone


@dataclass
class FileRow:
    name: str
    path: str
    status: str            #: "indexed" or "skipped"
    detail: str            #: "12 passages, 48 KB" or why it was skipped


def collection_rows(store: DocumentStore, titles: dict[int, str] | None = None) -> list[CollectionRow]:
    """``titles``: the chats' titles by id, for the collections of their attached files."""
    rows = []
    for c in store.collections():
        sources = store.sources(c.name)
        chats = len(store.attached_to(c.name))
        label = collection_label(c.name, titles)
        rows.append(CollectionRow(c.name, c.files, c.skipped, c.chunks, size(c.size), when(c.last_indexed),
                                  sum(s.watch for s in sources), [s.path for s in sources],
                                  f"{label} · in {count(chats, 'chat')}" if chats else label, chats))
    return rows


def count(n: int, noun: str) -> str:
    """'1 passage', '3 passages'."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def file_rows(store: DocumentStore, name: str) -> list[FileRow]:
    out = []
    for f in store.files(name):
        if f.status == "indexed":
            pages = f"{count(f.pages, 'page')}, " if f.kind == "pdf" else ""
            detail = f"{pages}{count(f.chunks, 'passage')}, {size(f.size)}"
        else:
            detail = f.reason
        out.append(FileRow(f.name, f.path, f.status, detail))
    out.sort(key=lambda r: (r.status != "skipped", r.path))     # what needs attention first
    return out


def reading_label(passages: int, done: int, total: int, seconds: float) -> str:
    """The window's line while a prompt is read: "Reading 6 passages: 412 of 1,090 tokens,
    about 12 s left" (no passages: the conversation; time left once there is a rate)."""
    what = f"Reading {count(passages, 'passage')}" if passages else "Reading the prompt"
    line = f"{what}: {done} of {total} tokens"
    if done > 0 and seconds > 0 and total > done:
        left = seconds * (total - done) / done
        line += f", about {left:.0f} s left" if left < 90 else f", about {left / 60:.0f} min left"
    return line
