"""What the chat window does, without Qt: the conversation on screen, each
turn's request (from the settings in effect), its documents, and the record
kept with each answer, built from the engine worker's typed events.

The window (app/ui/main_window.py) forwards the user's intent here and the
worker's events as they arrive::

    start = controller.send(text)                    # or regenerate / edit
    request, search = controller.turn_request(start)
    controller.started(worker.generate(request, search))
    ... controller.on_text("response", text) ...     # as the answer streams
    controller.on_turn_done(done)                    # the pipeline's TurnDone
    record = controller.finish(reason, text, thinking)
    status = controller.status_line(reason, record)

Tests drive it with plain pytest (tests/controller/test_chat_controller.py).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from app.api import SamplingParams, TurnDone, TurnRequest
from app.chat import export, token_probs
from app.chat.conversation import Chat, ChatError, TurnStart, _title_from, recover_interrupted
from app.controller.passages import PassageSearch, link_markers, mark_citations
from app.controller.tools import ToolSession
from app.documents.ask import Citation
from app.documents.library import drop_orphans, forget_conversation, reading_label
from app.documents.store import DocumentError, DocumentStore, conversation_collection
from app.memory.stats import TurnFigures
from app.store.history import HistoryStore, MessageRecord
from app.store.settings import Settings


#: An answer's status when the context, not the longest-answer setting, stopped it.
CONTEXT_FULL = "context_full"
#: Its record's count of the oldest messages the context policy left out of its prompt.
CONTEXT_DROPPED = "context_dropped"
#: Its record's description of what wrote it (``writer``): model, format, sampling, routing.
WRITER = "model"


def writer(model, s: Settings) -> dict:
    """What writes an answer, kept with it (the header and exports show it, whatever model is open
    later): ``model`` is the worker's ``ModelLoaded`` (None: unknown), ``s`` the settings in effect."""
    out: dict = {}
    if model is not None:
        out = {"name": model.name, "path": str(model.path), "engine": model.engine, "chat_format": model.chat_format,
               "arch": model.info.arch, "activations": model.info.activations or "f32"}
    out["sampling"] = {"temperature": s.temperature, "top_p": s.top_p, "top_k": s.top_k, "min_p": s.min_p,
                       "seed": s.seed, "frequency_penalty": s.frequency_penalty,
                       "presence_penalty": s.presence_penalty, "max_tokens": s.max_tokens, "thinking": s.thinking}
    out["routing"] = ({"experts_per_token": s.experts_per_token, "cache_aware_margin": s.cache_aware_margin}
                      if s.experts_per_token or s.cache_aware_margin else "exact")
    return out


def describe_writer(w: dict) -> str:
    """One line: "smollm2 · jinja · temperature 0.7, top-p 0.95, top-k 40, min-p 0.05 · exact routing"."""
    if not w:
        return ""
    sm = w.get("sampling") or {}
    parts = [w.get("name", ""), w.get("chat_format", "")]
    if sm:
        if not sm.get("temperature"):
            parts.append("greedy")
        else:
            parts.append(f"temperature {sm['temperature']:g}, top-p {sm.get('top_p', 1):g}, "
                         f"top-k {sm.get('top_k', 0)}, "
                         f"min-p {sm.get('min_p', 0):g}")
        pens = [f"{k.split('_')[0]} penalty {sm[k]:g}" for k in ("frequency_penalty", "presence_penalty") if sm.get(k)]
        parts += pens
        if sm.get("seed") is not None:
            parts.append(f"seed {sm['seed']}")
    routing = w.get("routing")
    if routing:
        parts.append("exact routing" if routing == "exact" else
                     f"routing: {routing.get('experts_per_token') or 'all'} experts/token, cache-aware margin "
                     f"{routing.get('cache_aware_margin') or 0:g}")
    if w.get("activations") == "q8":
        parts.append("8-bit activations")
    return " · ".join(p for p in parts if p)


def memory_start(records: list[MessageRecord]) -> int | None:
    """Where the model's memory begins on the branch ``records`` (root first): the index of the first message
    the newest answer's prompt still held, when the context policy left older ones out; else None."""
    for i in range(len(records) - 1, -1, -1):
        dropped = (records[i].stats or {}).get(CONTEXT_DROPPED) if records[i].role == "assistant" else None
        if dropped:
            return min(int(dropped), i)
    return None


@dataclass
class TurnState:
    """The answer being written: what comes back besides its text."""

    gen_id: int = 0
    citations: list[Citation] = field(default_factory=list)   #: the passages its prompt holds
    writer: dict = field(default_factory=dict)          #: what writes it (``writer``)
    token_probs: list = field(default_factory=list)   #: its token probabilities (compact), when asked
    done: TurnDone | None = None                        #: the pipeline's end of turn
    error: str = ""                                     #: the engine's message, when it failed
    started: float = 0.0


class ChatController:
    """``settings()``: the settings in effect for the open model (its own values over the general ones)."""

    def __init__(self, store: HistoryStore, settings: Callable[[], Settings], *,
                 clock: Callable[[], float] = time.monotonic):
        self.store = store
        recover_interrupted(store)
        self.settings = settings
        self.clock = clock
        self.model_name = ""
        self.model = None       #: the open model's ModelLoaded (what writes the next answer)
        self.chat = Chat(store)
        self.citations: dict[int, list[Citation]] = {}   #: answer message id -> the passages it may cite
        self.turn = TurnState()
        self.tools = ToolSession()   #: MCP tools: the servers the window connected, trust, this answer's rounds
        self._documents: DocumentStore | None = None
        self._watcher = None

    # ------------------------------------------------------------ conversations

    @property
    def busy(self) -> bool:
        return self.chat.busy

    def set_model(self, name: str, model=None) -> None:
        """The model that writes the next answers (``model``: its ``ModelLoaded``)."""
        self.model_name = self.chat.model_name = name
        self.model = model

    def new_chat(self) -> None:
        self._idle()
        self.chat = Chat(self.store, model_name=self.model_name)

    def open(self, conversation_id: int) -> None:
        self._idle()
        self.chat = Chat(self.store, conversation_id, model_name=self.model_name)
        self.load_citations()

    def rename(self, conversation_id: int | None, title: str) -> None:
        cid = conversation_id if conversation_id is not None else self.chat.id
        if cid == self.chat.id:
            self.chat.rename(title)
        elif cid is not None:
            self.store.rename(cid, title.strip() or "Untitled")

    def delete(self, conversation_id: int) -> str:
        """Delete a conversation and its attached files; returns a warning to show ("" if none)."""
        if self.busy and conversation_id == self.chat.id:
            return "Stop the answer first (Esc)"
        warning = ""
        try:        # its attached files go with it
            forget_conversation(self.documents(), conversation_id)
        except Exception as exc:  # noqa: BLE001 - said; they are removed at the next open (drop_orphans)
            warning = f"The chat's documents could not be removed now: {exc}"
        self.store.delete_conversation(conversation_id)
        if conversation_id == self.chat.id:
            self.chat = Chat(self.store, model_name=self.model_name)
        return warning

    def ensure_saved(self) -> bool:
        """A new chat is stored (e.g. to attach files before the first question); True if it was new."""
        if self.chat.id is not None:
            return False
        self.chat.id = self.store.create_conversation(self.chat.title or "New chat", model=self.chat.model_name)
        return True

    def titles(self) -> dict[int, str]:
        return {c.id: c.title for c in self.store.conversations()}

    # ------------------------------------------------------------ starting a turn

    def send(self, text: str) -> TurnStart:
        untitled = self.chat.id is not None and not self.chat.visible()   # saved by Attach… before any question
        start = self.chat.send(text, self.settings().system_prompt)
        if untitled:
            self.chat.rename(_title_from(text))
        return start

    def regenerate(self, assistant_id: int) -> TurnStart:
        return self.chat.regenerate(assistant_id, self.settings().system_prompt)

    def edit(self, user_id: int, text: str) -> TurnStart:
        return self.chat.edit(user_id, text, self.settings().system_prompt)

    def request(self, start: TurnStart) -> TurnRequest:
        s = self.settings()
        return TurnRequest(messages=list(start.messages), max_tokens=int(s.max_tokens), thinking=bool(s.thinking),
                           sampling=SamplingParams(temperature=s.temperature, top_p=s.top_p, top_k=s.top_k,
                                                   min_p=s.min_p, seed=s.seed, frequency_penalty=s.frequency_penalty,
                                                   presence_penalty=s.presence_penalty),
                           top_logprobs=int(s.token_alternatives) if s.token_probabilities else None,
                           stop=list(s.stop),
                           # issue 17's opt-in routing modes (None / 0: exact, the default)
                           experts_per_token=s.experts_per_token,
                           cache_aware_margin=float(s.cache_aware_margin or 0.0), client="window",
                           context="drop_oldest",   # a full context leaves the oldest turns out, never dead-ends
                           tools=self.tools.tools() if getattr(self.model, "takes_tools", False) else None)

    def turn_request(self, start: TurnStart) -> tuple[TurnRequest, PassageSearch | None]:
        """The request for ``start`` and, when the chat has documents, the search the engine's thread
        runs before it (its best passages go into the prompt; ``on_citations`` says which)."""
        self.turn = TurnState(started=self.clock(), writer=writer(self.model, self.settings()))
        self.tools.start_answer(start.messages)
        search = None
        if self.chat.id is not None and self.has_documents():
            search = PassageSearch(self.documents(), self.collection(), start.messages[-1]["content"])
        return self.request(start), search

    def tool_request(self) -> TurnRequest:
        """The request that continues the answer after a tool round (the calls and their results added)."""
        m = self.chat.tree.by_id[self.chat.streaming_id]
        for channel, text in (("response", m.content), ("thinking", m.thinking)):
            if text and not text.endswith("\n"):   # the next round's text starts a paragraph of its own
                self.chat.append(channel, "\n\n")
        return self.request(TurnStart(self.chat.streaming_id, self.tools.continued()))

    def show_tool_calls(self) -> None:
        """The answer being written shows its calls so far (kept with it when it is finished)."""
        if self.busy:
            self.chat.tree.by_id[self.chat.streaming_id].stats = {"tool_calls": [dict(c) for c in self.tools.calls]}

    def started(self, gen_id: int) -> None:
        self.turn.gen_id = gen_id

    # ------------------------------------------------------------ the worker's events

    def on_citations(self, gen_id: int, citations: list[Citation]) -> None:
        if self.busy and gen_id == self.turn.gen_id:
            self.turn.citations = list(citations)

    def on_text(self, channel: str, text: str) -> bool:
        """More answer ("response") or thinking text; False when no answer is being written."""
        if not self.busy:
            return False
        self.chat.append(channel, text)
        return True

    def on_token_probs(self, entries: list) -> None:
        if self.busy:
            self.turn.token_probs = entries

    def on_turn_done(self, done: TurnDone) -> None:
        if self.busy:
            self.turn.done = done

    def on_error(self, message: str) -> None:
        self.turn.error = message

    def reading_line(self, done: int, total: int) -> str:
        """The line under the composer while the prompt is read."""
        return reading_label(len(self.turn.citations), done, total, self.clock() - self.turn.started)

    def finish(self, reason: str, text: str | None = None, thinking: str | None = None) -> MessageRecord | None:
        """The answer is over: it is saved with its record (figures, token probabilities, tool calls,
        citations). None when no answer was being written."""
        if not self.busy:
            return None
        t = self.turn
        if self.tools.rounds:   # the answer is every round's text, as it streamed (the worker's is the last round's)
            text = thinking = None
        record: dict = TurnFigures.of(t.done).record() if t.done is not None else {}
        if t.writer:
            record[WRITER] = t.writer
        if t.token_probs:   # kept with the answer (the encrypted history), shown under it
            record[token_probs.STATS_KEY] = t.token_probs
        if self.tools.calls:   # the calls MCP servers ran (or the user declined), with their results
            self.tools.cancel_round()
            record["tool_calls"] = [dict(c) for c in self.tools.calls]
        elif t.done is not None and t.done.tool_calls:    # shown under the answer, not run (no tools connected)
            record["tool_calls"] = [{"name": c.name, "arguments": c.arguments} for c in t.done.tool_calls]
        if t.citations:   # kept with the answer, so the links survive a restart
            record["citations"] = [c.as_dict() for c in t.citations]
        if t.done is not None and t.done.dropped_messages:   # the chat view marks where the model's memory begins
            record[CONTEXT_DROPPED] = t.done.dropped_messages
        if reason == "length" and t.done is not None and t.done.context_full:
            reason = CONTEXT_FULL
        message = self.chat.finish(reason, text, thinking, stats=record)
        if t.citations:
            self.citations[message.id] = t.citations
        return message

    def status_line(self, reason: str, message: MessageRecord | None) -> str:
        """What the status bar says once an answer is over."""
        turn = (message.stats if message is not None else None) or {}
        if reason == "error":  # the engine's message stays, not the turn's figures
            return f"Error: {self.turn.error or 'the answer stopped'}"
        if turn.get("turn_tokens") and turn.get("turn_seconds"):
            first = f"first token after {turn['ttft_s']:.1f} s · " if turn.get("ttft_s") is not None else ""
            msg = (f"{turn['turn_tokens']} tokens in {turn['turn_seconds']:.1f} s · {first}"
                   f"{turn.get('turn_prompt_tokens', 0)} prompt tokens read, "
                   f"{turn.get('turn_reused_tokens', 0)} reused")
            return ("Stopped · " if reason == "cancelled" else "") + msg
        return "Stopped" if reason == "cancelled" else ""

    # ------------------------------------------------------------ citations

    def load_citations(self) -> None:
        """The citation links of the conversation's answers, as saved with them (they survive a restart)."""
        for m in self.chat.tree.by_id.values():
            saved = (m.stats or {}).get("citations")
            if saved and m.id not in self.citations:
                try:
                    self.citations[m.id] = [Citation(**c) for c in saved]
                except TypeError:   # saved by another version: the links are left out, the text stays
                    continue

    def linked(self, message: MessageRecord, text: str) -> str:
        """An answer's text with its ``[n]`` markers as ``cite:n`` links."""
        citations = self.citations.get(message.id)
        return link_markers(text, citations)[0] if citations else text

    def citation(self, message_id: int, n: int) -> Citation | None:
        return next((c for c in self.citations.get(message_id, []) if c.n == n), None)

    # ------------------------------------------------------------ documents

    def documents(self) -> DocumentStore:
        """The encrypted document store beside the history, opened on first use."""
        if self._documents is None:
            from app.documents.indexer import FolderWatcher

            self._documents = DocumentStore.beside(self.store)     # the history's key: no second scrypt
            # files attached to chats deleted by a version that kept them (a new chat could get that id)
            drop_orphans(self._documents, self.store.conversation_ids())
            # watched folders: changes since the last run, then every few seconds (its own thread and connection)
            self._watcher = FolderWatcher(self._documents).start()
            # what searches read, into the OS page cache before the first question (background, bounded)
            self._documents.warm()
        return self._documents

    def start_documents(self) -> None:
        """Open the documents at start-up (the window calls it once it shows): watched folders are
        brought up to date and the search index is read ahead, both in background threads, so the
        first question after a reboot does not wait for the disk. A failure here is shown when the
        documents are used."""
        try:
            self.documents()
        except Exception:       # noqa: BLE001 - reported by the first real use, not at start-up
            pass

    def collection(self) -> str:
        return conversation_collection(self.chat.id)

    def has_documents(self) -> bool:
        try:
            return bool(self.documents().files(self.collection()))
        except DocumentError:
            return False

    # ------------------------------------------------------------ export

    def export(self, path: str | Path, fmt: str | None = None) -> Path:
        """The branch on screen as Markdown or JSON (messages, thinking, citations, model, sampling,
        token counts); raises OSError/ValueError."""
        if not self.chat.visible():
            raise ValueError("Nothing to export yet")
        eff = self.settings()
        sampling = {"temperature": eff.temperature, "top_p": eff.top_p, "top_k": eff.top_k, "min_p": eff.min_p,
                    "seed": eff.seed, "stop": list(eff.stop), "frequency_penalty": eff.frequency_penalty,
                    "presence_penalty": eff.presence_penalty,
                    "max_tokens": eff.max_tokens, "thinking": eff.thinking, "system_prompt": eff.system_prompt}
        return export.write(self.chat, path, fmt, model=self.chat.model_name, sampling=sampling,
                            citations=self.citations, shown=self.shown())

    def shown(self) -> dict[int, tuple[str, list[Citation]]]:
        """The branch's answers as the window shows them: message id -> (text with its ``[n]`` markers,
        the citations it uses), for answers that had passages."""
        return {m.id: mark_citations(m.content, self.citations[m.id]) for m in self.chat.visible()
                if self.citations.get(m.id)}

    # ------------------------------------------------------------ shutdown

    def close(self) -> None:
        """The documents' watcher and store (its warm-up too)."""
        if self._watcher is not None:
            self._watcher.stop()
            self._watcher = None
        if self._documents is not None:
            self._documents.close()
            self._documents = None

    def _idle(self) -> None:
        if self.busy:
            raise ChatError("an answer is still being written")
