"""One conversation as the GUI sees it: a tree of messages kept in the
history store, the branch on screen, the answer being written, and the
prompt for the engine. No Qt here: the window renders a ``Chat`` and
forwards intent to it; tests drive it directly.

Branches: regenerating an answer adds a sibling assistant message under the
same question; editing a question adds a sibling user message (and a new
answer under it). ``switch_to`` shows another sibling; the conversation keeps
the leaf on screen so a restart opens the same branch.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable

from app.store.history import HistoryStore, MessageRecord

#: Save a streaming answer at least this often (seconds), and on finish.
SAVE_INTERVAL = 0.5
STREAMING = "streaming"
TITLE_WORDS = 8


class ChatError(RuntimeError):
    pass


class ConversationTree:
    """Messages by id with parent links; ``leaf_id`` is the branch on screen."""

    def __init__(self, messages: list[MessageRecord] = (), leaf_id: int | None = None):
        self.by_id: dict[int, MessageRecord] = {m.id: m for m in messages}
        self.leaf_id = leaf_id if leaf_id in self.by_id else None
        if self.leaf_id is None and self.by_id:
            self.leaf_id = self.deepest(max(self.by_id))

    def add(self, message: MessageRecord) -> None:
        self.by_id[message.id] = message

    def children(self, parent_id: int | None) -> list[MessageRecord]:
        return sorted((m for m in self.by_id.values() if m.parent_id == parent_id), key=lambda m: m.id)

    def siblings(self, message_id: int) -> list[MessageRecord]:
        """The message and its alternatives (same parent, same role), oldest first."""
        m = self.by_id[message_id]
        return [c for c in self.children(m.parent_id) if c.role == m.role]

    def path(self, leaf_id: int | None = None) -> list[MessageRecord]:
        """Root to ``leaf_id`` (default: the branch on screen)."""
        node = self.by_id.get(self.leaf_id if leaf_id is None else leaf_id)
        out: list[MessageRecord] = []
        seen: set[int] = set()
        while node is not None and node.id not in seen:
            seen.add(node.id)
            out.append(node)
            node = self.by_id.get(node.parent_id) if node.parent_id is not None else None
        return out[::-1]

    def deepest(self, message_id: int) -> int:
        """The leaf reached from ``message_id`` by always taking the newest child."""
        node = message_id
        while True:
            kids = self.children(node)
            if not kids:
                return node
            node = kids[-1].id


@dataclass
class TurnStart:
    """What the worker needs to write one answer."""

    assistant_id: int
    messages: list[dict[str, str]]   #: the conversation up to the answer, for the chat template
    continued: bool = False          #: the last message is the answer itself, to be continued


#: The statuses of an answer that stopped before its end: Continue picks it up where it stopped.
UNFINISHED = ("cancelled", "length", "context_full")


class Chat:
    """A conversation backed by the history store.

    A new ``Chat`` with no id is not stored until the first message is sent.
    ``clock`` is injectable for tests of the save interval.
    """

    def __init__(self, store: HistoryStore, conversation_id: int | None = None, *, model_name: str = "",
                 clock: Callable[[], float] = time.monotonic):
        self.store = store
        self.id = conversation_id
        self.model_name = model_name
        self.clock = clock
        self.title = "New chat"
        self.tree = ConversationTree()
        self.first_model = ""   #: the model the conversation was started with (as the history keeps it)
        if conversation_id is not None:
            info = store.conversation(conversation_id)
            self.title = info.title
            self.first_model = info.model
            self.tree = ConversationTree(store.messages(conversation_id), info.leaf_id)
        self.streaming_id: int | None = None
        self._last_save = 0.0
        self._dirty = False
        self._think_started: float | None = None
        self._think_ended: float | None = None
        self._prefix = ("", "")     #: the text and thinking a continued answer had before it went on

    # ---- what is on screen

    def visible(self) -> list[MessageRecord]:
        return self.tree.path()

    @property
    def busy(self) -> bool:
        return self.streaming_id is not None

    # ---- starting a turn

    def send(self, text: str, system_prompt: str = "", images: list[dict] | None = None) -> TurnStart:
        """A new question after the branch on screen, and an empty answer to fill. ``images``
        ({"name", "url"}: a data URL) go with the question: kept with it, in its prompt as image parts."""
        self._idle_check()
        text = text.strip()
        if not text and not images:
            raise ChatError("the message is empty")
        if self.id is None:
            self.title = _title_from(text) if text else images[0].get("name") or "Image"
            self.id = self.store.create_conversation(self.title, model=self.model_name)
            self.first_model = self.model_name
        parent = self.tree.leaf_id
        uid = self._add(parent, "user", text, images=images)
        return self._start_answer(uid, system_prompt)

    def regenerate(self, assistant_id: int, system_prompt: str = "") -> TurnStart:
        """Another answer to the same question, as a sibling of ``assistant_id``."""
        self._idle_check()
        m = self.tree.by_id[assistant_id]
        if m.role != "assistant" or m.parent_id is None:
            raise ChatError("only an answer can be regenerated")
        return self._start_answer(m.parent_id, system_prompt)

    def edit(self, user_id: int, new_text: str, system_prompt: str = "") -> TurnStart:
        """The question ``user_id`` asked differently: a sibling question and a new answer."""
        self._idle_check()
        m = self.tree.by_id[user_id]
        if m.role != "user":
            raise ChatError("only a question can be edited")
        new_text = new_text.strip()
        if not new_text and not m.images:
            raise ChatError("the message is empty")
        uid = self._add(m.parent_id, "user", new_text, images=m.images)   # the question's images stay with it
        return self._start_answer(uid, system_prompt)

    def continue_answer(self, assistant_id: int, system_prompt: str = "") -> TurnStart:
        """The answer ``assistant_id``, stopped or cut off, written on from where it stopped: the same
        message streams again; what comes is added to its text."""
        self._idle_check()
        m = self.tree.by_id[assistant_id]
        if m.role != "assistant" or m.status not in UNFINISHED or not m.content:
            raise ChatError("only an answer that stopped early (with some text) can be continued")
        messages = self.prompt_messages(assistant_id, system_prompt)
        self.tree.leaf_id = assistant_id
        if self.id is not None:
            self.store.set_leaf(self.id, assistant_id)
        self._prefix = (m.content, m.thinking)
        m.status = STREAMING
        self.store.update_message(m.id, status=STREAMING)
        self.streaming_id = assistant_id
        self._think_started = self._think_ended = None
        self._last_save = self.clock()
        return TurnStart(assistant_id, messages, continued=True)

    def switch_to(self, message_id: int) -> None:
        """Show the branch through ``message_id`` (e.g. another sibling)."""
        self._idle_check()
        self.tree.leaf_id = self.tree.deepest(message_id)
        if self.id is not None:
            self.store.set_leaf(self.id, self.tree.leaf_id)

    def fork(self, message_id: int) -> int:
        """Fork: a new conversation holding a copy of the turns from the first message to ``message_id``
        (text, thinking, status, a question's images and each answer's record: its figures, citations, what wrote it), titled
        after this one. Returns its id; this conversation is unchanged."""
        path = self.tree.path(message_id)
        if not path or path[-1].id != message_id or message_id == self.streaming_id:
            raise ChatError("only a saved message of this chat can start a fork")
        fid = self.store.create_conversation(f"{self.title} (fork)", model=self.first_model or self.model_name)
        parent = None
        for m in path:
            parent = self.store.add_message(fid, parent, m.role, m.content, thinking=m.thinking, status=m.status,
                                            images=m.images)
            if m.stats or m.thinking_seconds:
                self.store.update_message(parent, thinking_seconds=m.thinking_seconds, stats=m.stats or None)
        return fid

    def rename(self, title: str) -> None:
        title = title.strip() or "Untitled"
        self.title = title
        if self.id is not None:
            self.store.rename(self.id, title)

    # ---- the answer being written

    def append(self, channel: str, text: str) -> None:
        """More text for the answer being written (``channel`` is "thinking" or "response")."""
        m = self._streaming()
        now = self.clock()
        if channel == "thinking":
            if self._think_started is None:
                self._think_started = now
            m.thinking += text
        else:
            if self._think_started is not None and self._think_ended is None:
                self._think_ended = now
                m.thinking_seconds = now - self._think_started
            m.content += text
        self._dirty = True
        if now - self._last_save >= SAVE_INTERVAL:
            self.save()

    def thinking_seconds(self) -> float | None:
        """How long the answer has thought so far (still counting while it thinks)."""
        if self._think_started is None:
            m = self.tree.by_id.get(self.streaming_id) if self.streaming_id else None
            return m.thinking_seconds if m else None
        end = self._think_ended if self._think_ended is not None else self.clock()
        return end - self._think_started

    def save(self) -> None:
        """Write the answer so far to the store."""
        m = self._streaming()
        self.store.update_message(m.id, content=m.content, thinking=m.thinking,
                                  thinking_seconds=m.thinking_seconds)
        self._last_save = self.clock()
        self._dirty = False

    def finish(self, reason: str, text: str | None = None, thinking: str | None = None,
               stats: dict[str, Any] | None = None) -> MessageRecord:
        """The answer is over: ``reason`` is the engine's ("stop", "length",
        "cancelled", "error"); ``text``/``thinking`` are the complete channels."""
        m = self._streaming()
        before, thought = self._prefix      # a continued answer: what it had before
        if text is not None:
            m.content = before + text
        if thinking is not None:
            m.thinking = thought + thinking
        if m.thinking and self._think_started is not None and self._think_ended is None:
            m.thinking_seconds = self.clock() - self._think_started
        m.status = reason
        m.stats = dict(stats or {})
        self.store.update_message(m.id, content=m.content, thinking=m.thinking, status=m.status,
                                  thinking_seconds=m.thinking_seconds, stats=m.stats)
        self.streaming_id = None
        self._prefix = ("", "")
        return m

    # ---- output

    def prompt_messages(self, upto_id: int, system_prompt: str = "") -> list[dict[str, str]]:
        """The chat-template messages for the path ending at ``upto_id`` (a question's images as image
        parts after its text)."""
        from app.vision.image import url_part, with_images

        msgs = [{"role": "system", "content": system_prompt}] if system_prompt.strip() else []
        for m in self.tree.path(upto_id):
            if m.role in ("user", "assistant"):
                msgs.append(with_images({"role": m.role, "content": m.content},
                                        [url_part(i["url"], i.get("name", "")) for i in m.images]))
        return msgs

    def to_markdown(self) -> str:
        """The branch on screen as a Markdown document (``app.chat.export.to_markdown``)."""
        from app.chat.export import to_markdown

        return to_markdown(self)

    # ---- helpers

    def _start_answer(self, parent_id: int, system_prompt: str) -> TurnStart:
        messages = self.prompt_messages(parent_id, system_prompt)
        aid = self._add(parent_id, "assistant", "", status=STREAMING)
        self.streaming_id = aid
        self._prefix = ("", "")
        self._think_started = self._think_ended = None
        self._last_save = self.clock()
        return TurnStart(aid, messages)

    def _add(self, parent_id: int | None, role: str, text: str, status: str = "done",
             images: list[dict] | None = None) -> int:
        assert self.id is not None
        images = [{"name": i.get("name") or f"image {n + 1}", "url": i["url"]} for n, i in enumerate(images or ())]
        mid = self.store.add_message(self.id, parent_id, role, text, status=status, images=images)
        self.tree.add(MessageRecord(id=mid, conversation_id=self.id, parent_id=parent_id, role=role,
                                    content=text, status=status, created=time.time(), images=images))
        self.tree.leaf_id = mid
        return mid

    def _streaming(self) -> MessageRecord:
        if self.streaming_id is None:
            raise ChatError("no answer is being written")
        return self.tree.by_id[self.streaming_id]

    def _idle_check(self) -> None:
        if self.streaming_id is not None:
            raise ChatError("an answer is still being written")


def _title_from(text: str) -> str:
    words = text.split()
    title = " ".join(words[:TITLE_WORDS])
    return title + ("…" if len(words) > TITLE_WORDS else "")


def recover_interrupted(store: HistoryStore) -> int:
    """Answers left "streaming" by a crash become "cancelled" (their text is kept).
    Returns how many were fixed."""
    fixed = 0
    for info in store.conversations():
        for m in store.messages(info.id):
            if m.status == STREAMING:
                store.update_message(m.id, status="cancelled")
                fixed += 1
    return fixed
