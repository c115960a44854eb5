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
from app.documents.store import CONVERSATION_PREFIX, DocumentError, DocumentStore, conversation_collection
from app.memory.stats import TurnFigures
from app.store.history import HistoryStore, MessageRecord
from app.store.settings import Settings
from app.vision.image import DEFAULT_PATCH_BUDGET, Grid, data_url, describe_cost, plan_grid, preview


#: An answer's status when the context, not the longest-answer setting, stopped it.
CONTEXT_FULL = "context_full"
#: Its record's count of the oldest messages the context policy left out of its prompt.
CONTEXT_DROPPED = "context_dropped"
#: Its record's summary of the oldest turns ({"text", "covered": messages of the branch it stands for}).
SUMMARY = "context_summary"
#: Its record's count of the times Continue wrote on after it had stopped.
CONTINUED = "continued"
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


def setup_note(effective: Settings, preset: str | None) -> tuple[str, str]:
    """The marker above the message box when a preset or a system prompt shapes the answers: a short line
    ("Preset “Pirate” · System prompt: Talk like a pirate…") and its tooltip (the whole prompt); ("", "")
    when neither is in effect."""
    prompt = " ".join(effective.system_prompt.split())
    parts = [f"Preset “{preset}”"] if preset else []
    if prompt:
        parts.append("System prompt: " + (prompt if len(prompt) <= 60 else prompt[:59].rstrip() + "…"))
    tip = f"Every answer here starts from this system prompt:\n\n{effective.system_prompt.strip()}" if prompt else ""
    return " · ".join(parts), tip


def latest_summary(records: list[MessageRecord]) -> dict | None:
    """The newest summary of the oldest turns on a branch (root first), as an answer's record keeps it."""
    for m in reversed(records):
        kept = (m.stats or {}).get(SUMMARY) if m.role == "assistant" else None
        if isinstance(kept, dict) and kept.get("text") and int(kept.get("covered") or 0) > 0:
            return kept
    return None


def memory_start(records: list[MessageRecord]) -> int | None:
    """Where the model's memory begins on the branch ``records`` (root first): the index of the first message
    the newest answer's prompt still held, when the context policy left older ones out; else None."""
    for i in range(len(records) - 1, -1, -1):
        dropped = (records[i].stats or {}).get(CONTEXT_DROPPED) if records[i].role == "assistant" else None
        if dropped:
            return min(int(dropped), i)
    return None


#: Who the window is to the engine (``TurnRequest.client``): its prefix reuse is its own, and its gauges count
#: every other client's requests (``EngineService.clients``) but its own.
WINDOW_CLIENT = "window"


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
    continued: dict | None = None    #: a continued answer's record from before (None: a new answer)
    skipped: int = 0                 #: messages of the branch an earlier summary stood for in its request
    note: dict | None = None         #: that summary (``SUMMARY`` in the record)
    summary: object = None           #: the app.chat.summary.ContextSummary written before this answer, if any


@dataclass
class PendingImage:
    """An image that goes with the next message (the composer shows its thumbnail and cost)."""

    name: str
    url: str                 #: a data: URL: how the message carries it (and the history keeps it)
    grid: Grid               #: where it goes under the patch budget: its cost
    thumbnail_png: bytes = field(default=b"", repr=False)

    @property
    def cost(self) -> str:
        return describe_cost(self.grid)


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
        self.chat = Chat(store)    #: the conversation on screen
        self.writing: Chat | None = None   #: the conversation the answer streams into (on screen or not)
        self.citations: dict[int, list[Citation]] = {}   #: answer message id -> the passages it may cite
        self.turn = TurnState()
        self.tools = ToolSession()   #: MCP tools: the servers the window connected, trust, this answer's rounds
        self._continued: dict = {}
        self.pending_images: list[PendingImage] = []   #: the images the next message carries
        self._documents: DocumentStore | None = None
        self._watcher = None

    # ------------------------------------------------------------ conversations

    @property
    def busy(self) -> bool:
        """Whether an answer is being written, in whichever conversation (the engine writes one at a time)."""
        return self.writing is not None and self.writing.busy

    @property
    def on_screen(self) -> bool:
        """Whether the answer being written is in the conversation on screen."""
        return self.busy and self.writing is self.chat

    def set_model(self, name: str, model=None) -> None:
        """The model that writes the next answers (``model``: its ``ModelLoaded``)."""
        self.model_name = self.chat.model_name = name
        self.model = model

    def new_chat(self) -> None:
        """A new conversation on screen; an answer being written goes on in its own."""
        self.chat = Chat(self.store, model_name=self.model_name)

    def open(self, conversation_id: int) -> None:
        """Show a conversation; the one an answer streams into is shown live (the same ``Chat``)."""
        if self.busy and self.writing.id == conversation_id:
            self.chat = self.writing
        else:
            self.chat = Chat(self.store, conversation_id, model_name=self.model_name)
        self.load_citations()

    def rename(self, conversation_id: int | None, title: str) -> None:
        cid = conversation_id if conversation_id is not None else self.chat.id
        if cid == self.chat.id:
            self.chat.rename(title)
        elif self.writing is not None and cid == self.writing.id:
            self.writing.rename(title)
        elif cid is not None:
            self.store.rename(cid, title.strip() or "Untitled")

    def delete(self, conversation_id: int) -> str:
        """Delete a conversation and its attached files; returns a warning to show ("" if none)."""
        if self.busy and conversation_id == self.writing.id:
            return "Stop the answer first (Esc)"
        warning = ""
        try:        # its attached files go with it (unless a fork searches them); shared collections stay
            forget_conversation(self.documents(), conversation_id)
        except Exception as exc:  # noqa: BLE001 - said; they are removed at the next open (drop_orphans)
            warning = f"The chat's documents could not be removed now: {exc}"
        self.store.delete_conversation(conversation_id)
        if not warning:     # and the files of chats deleted before, that only this one's fork still searched
            try:
                drop_orphans(self.documents(), self.store.conversation_ids())
            except Exception as exc:  # noqa: BLE001 - as above
                warning = f"The chat's documents could not be removed now: {exc}"
        if conversation_id == self.chat.id:
            self.chat = Chat(self.store, model_name=self.model_name)
        return warning

    def fork(self, message_id: int) -> int:
        """Fork at ``message_id``: a new chat with a copy of the turns up to it, now on screen (its
        documents are the same collections). An answer being written goes on in its own chat."""
        source = self.chat
        fid = source.fork(message_id)
        try:     # the fork searches what its chat searched: the same collections, not copies
            store = self.documents()
            for name in self.collections():
                if name in self._collection_names():
                    store.attach(fid, name)
        except DocumentError:
            pass
        self.open(fid)
        return fid

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
        """The question ``text`` with the pending images (``attach_image``), which it then keeps."""
        self._idle()
        if self.pending_images and self.image_support():
            raise ChatError(self.image_support())
        untitled = self.chat.id is not None and not self.chat.visible()   # saved by Attach… before any question
        images = [{"name": p.name, "url": p.url} for p in self.pending_images]
        start = self._writes(self.chat.send(text, self.settings().system_prompt, images))
        self.pending_images = []
        if untitled and text.strip():
            self.chat.rename(_title_from(text))
        return start

    # ------------------------------------------------------------ images (a model with a vision tower)

    def image_support(self) -> str:
        """Why the open model cannot take an image ("" when it can: a local K3 with its vision tower)."""
        m = self.model
        if m is None:
            return "Open a model first"
        if getattr(m, "vision", None) is None:
            if getattr(m, "remote", False):
                return f"{m.name} is a remote model: images go to a local model with a vision tower (Kimi K3)"
            return f"{m.name} cannot see images (it has no vision tower; Kimi K3 has one)"
        return ""

    def attach_image(self, data: bytes, name: str) -> PendingImage:
        """An image for the next message, checked as the pipeline will (``ImageError``: one line naming it;
        ``ChatError`` when the model cannot see images); nothing is kept when it is refused."""
        why = self.image_support()
        if why:
            raise ChatError(why)
        v = self.model.vision
        grid, thumb = preview(data, name, patch_budget=self.image_budget(), patch=int(v.get("patch_size", 14)),
                              merge=int(v.get("merge_h", 2)))
        pending = PendingImage(name, data_url(data, name), grid, thumb)
        self.pending_images.append(pending)
        return pending

    def image_budget(self) -> int:
        """The patch budget of the window's images: the setting, or the default every front end uses."""
        return int(self.settings().image_patch_budget or DEFAULT_PATCH_BUDGET)

    def rebudget_images(self) -> None:
        """The pending images' cost under the patch budget now set (their grids planned again)."""
        if self.model is None or getattr(self.model, "vision", None) is None:
            return
        v = self.model.vision
        for p in self.pending_images:
            p.grid = plan_grid(p.grid.width, p.grid.height, self.image_budget(), int(v.get("patch_size", 14)),
                               int(v.get("merge_h", 2)))

    def remove_image(self, index: int) -> None:
        if 0 <= index < len(self.pending_images):
            del self.pending_images[index]

    def regenerate(self, assistant_id: int) -> TurnStart:
        self._idle()
        return self._writes(self.chat.regenerate(assistant_id, self.settings().system_prompt))

    def edit(self, user_id: int, text: str) -> TurnStart:
        self._idle()
        return self._writes(self.chat.edit(user_id, text, self.settings().system_prompt))

    def continue_answer(self, assistant_id: int) -> TurnStart:
        """Continue: the stopped or cut-off answer ``assistant_id`` is written on from where it stopped."""
        self._idle()
        before = dict(self.chat.tree.by_id[assistant_id].stats or {})
        start = self._writes(self.chat.continue_answer(assistant_id, self.settings().system_prompt))
        self._continued = before
        return start

    def _writes(self, start: TurnStart) -> TurnStart:
        """The conversation on screen is the one this answer streams into, wherever the user goes."""
        self.writing = self.chat
        return start

    def request(self, start: TurnStart) -> TurnRequest:
        """The turn's request. When an earlier answer on the branch summarised the oldest turns (the
        "summarise" policy), the summary is sent in their place (``context_note``)."""
        s = self.settings()
        messages, note = list(start.messages), ""
        path = self.writing.tree.path(start.assistant_id) if self.writing is not None else []
        summary = latest_summary(path if start.continued else path[:-1])
        if summary is not None:
            first = 1 if messages and messages[0]["role"] == "system" else 0
            note, skipped = summary["text"], int(summary["covered"])
            messages = messages[:first] + messages[first + skipped:]
            self.turn.skipped, self.turn.note = skipped, summary
        return TurnRequest(messages=messages, max_tokens=int(s.max_tokens), thinking=bool(s.thinking),
                           sampling=SamplingParams(temperature=s.temperature, top_p=s.top_p, top_k=s.top_k,
                                                   min_p=s.min_p, seed=s.seed, frequency_penalty=s.frequency_penalty,
                                                   presence_penalty=s.presence_penalty),
                           top_logprobs=int(s.token_alternatives) if s.token_probabilities else None,
                           stop=list(s.stop), image_patch_budget=self.image_budget(),
                           # issue 17's opt-in routing modes (None / 0: exact, the default)
                           experts_per_token=s.experts_per_token,
                           cache_aware_margin=float(s.cache_aware_margin or 0.0), client=WINDOW_CLIENT,
                           # a full context leaves the oldest turns out or summarises them: never a dead end
                           context=s.context_policy, context_note=note, continue_final=start.continued,
                           tools=self.tools.tools() if getattr(self.model, "takes_tools", False) else None)

    def turn_request(self, start: TurnStart) -> tuple[TurnRequest, PassageSearch | None]:
        """The request for ``start`` and, when the chat has documents, the search the engine's thread
        runs before it (its best passages go into the prompt; ``on_citations`` says which)."""
        self.turn = TurnState(started=self.clock(), writer=writer(self.model, self.settings()),
                              continued=self._continued if start.continued else None)
        self.tools.start_answer(start.messages)
        search = None
        if self.chat.id is not None and self.has_documents():
            search = PassageSearch(self.documents(), self.collections(), self._query(start))
        return self.request(start), search

    def tool_request(self) -> TurnRequest:
        """The request that continues the answer after a tool round (the calls and their results added)."""
        m = self.writing.tree.by_id[self.writing.streaming_id]
        for channel, text in (("response", m.content), ("thinking", m.thinking)):
            if text and not text.endswith("\n"):   # the next round's text starts a paragraph of its own
                self.writing.append(channel, "\n\n")
        return self.request(TurnStart(self.writing.streaming_id, self.tools.continued()))

    def show_tool_calls(self) -> None:
        """The answer being written shows its calls so far (kept with it when it is finished)."""
        if self.busy:
            self.writing.tree.by_id[self.writing.streaming_id].stats = {"tool_calls": [dict(c) for c in self.tools.calls]}

    @staticmethod
    def _query(start: TurnStart) -> str:
        """What the documents are searched for: the turn's last question (its text, not its images)."""
        content = next((m["content"] for m in reversed(start.messages) if m["role"] == "user"), "")
        if isinstance(content, list):
            return " ".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
        return content

    def started(self, gen_id: int) -> None:
        self.turn.gen_id = gen_id

    # ------------------------------------------------------------ the worker's events

    def on_citations(self, gen_id: int, citations: list[Citation]) -> None:
        if self.busy and gen_id == self.turn.gen_id:
            self.turn.citations = list(citations)

    def on_summary(self, gen_id: int, summary) -> None:
        """The oldest turns were summarised before this answer (the "summarise" context policy)."""
        if self.busy and gen_id == self.turn.gen_id:
            self.turn.summary = summary

    def on_text(self, channel: str, text: str) -> bool:
        """More answer ("response") or thinking text; False when no answer is being written."""
        if not self.busy:
            return False
        self.writing.append(channel, text)
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
        covered = t.skipped + (t.summary.covered if t.summary is not None else 0)
        if t.summary is not None:     # the note the next turns send instead of the turns it covers
            record[SUMMARY] = {"text": t.summary.text, "covered": covered}
        elif t.note is not None:
            record[SUMMARY] = t.note
        dropped = covered + (t.done.dropped_messages if t.done is not None else 0)
        if dropped:    # the chat view marks where the model's memory begins
            record[CONTEXT_DROPPED] = dropped
        if reason == "length" and t.done is not None and t.done.context_full:
            reason = CONTEXT_FULL
        if t.continued is not None:   # its citations and writer stay; the figures are the last part's
            before = {k: v for k, v in t.continued.items() if k != token_probs.STATS_KEY}
            record = {**before, **record, CONTINUED: int(before.get(CONTINUED, 0)) + 1}
            t.citations = t.citations or self.citations.get(self.writing.streaming_id, [])
        message = self.writing.finish(reason, text, thinking, stats=record)
        self.writing = None
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
        """The chat's own collection: the files attached to it alone (Attach…)."""
        return conversation_collection(self.chat.id)

    def collections(self) -> tuple[str, ...]:
        """What the chat's questions search: its own files and the collections attached to it."""
        if self.chat.id is None:
            return ()
        return (self.collection(), *self.documents().attached(self.chat.id))

    def has_documents(self) -> bool:
        try:
            store = self.documents()
            return any(store.files(name) for name in self.collections() if name in self._collection_names())
        except DocumentError:
            return False

    def _collection_names(self) -> set[str]:
        return {c.name for c in self.documents().collections()}

    def shared_collections(self) -> list[tuple[str, bool]]:
        """Every collection a chat can attach (the named ones, not another chat's own files), and whether
        this chat has it attached."""
        attached = set(self.documents().attached(self.chat.id)) if self.chat.id is not None else set()
        return [(c.name, c.name in attached) for c in sorted(self.documents().collections(), key=lambda c: c.name)
                if not c.name.startswith(CONVERSATION_PREFIX)]

    def attach_collection(self, name: str, on: bool = True) -> None:
        """Attach a collection to the chat on screen (a new chat is saved first), or detach it (``on``
        False); the collection itself stays, for the other chats."""
        self.ensure_saved()
        if on:
            self.documents().attach(self.chat.id, name)
        else:
            self.documents().detach(self.chat.id, name)

    def share_files(self, name: str) -> None:
        """The chat's own files become the collection ``name``, attached to this chat and attachable to
        others (it outlives the chat)."""
        store = self.documents()
        store.rename_collection(self.collection(), name)
        store.attach(self.chat.id, name)

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
            where = "" if self.writing is self.chat else f" in “{self.writing.title}”"
            raise ChatError(f"an answer is still being written{where}")
