"""A remote engine: any OpenAI-compatible server (vLLM, SGLang, llama.cpp,
another Ferry...) behind the same turn events as the local engine
(``app.events``), so the app's worker drives either one.

Events: ``ImageProgress`` (a Ferry server's image in its vision tower, from its
progress comments), ``PromptProgress`` (from a Ferry server's progress comments; else one
when the first text arrives), ``Reasoning`` (the ``reasoning_content`` or
``reasoning`` delta field, or ``<think>`` tags in the content of a server that
does not split them), ``Text`` (answer text), ``ToolCallMade`` (a tool call,
once its streamed pieces are complete), ``Logprob`` (when the request asked
for logprobs: one per generated token, from each chunk's OpenAI
``logprobs.content``, before that chunk's text, as the local pipeline orders
them), ``LiveStats`` (engine counters, as ``Session.stats()`` names them),
and a final ``TurnDone`` (with every logprob in ``logprobs``).

Token ids: OpenAI's format names a token by its text only. A Ferry server
(and llama.cpp's) adds each token's ``id``, and vLLM writes ``token_id:N`` as
the token when asked to; with neither the id is -1 (as ``TurnDone.token_ids``
is for a remote engine), the log-probabilities themselves are still given.

What a remote engine reports: a Ferry server sends its engine's own counters
(speeds, disk reads, cache hits) in its ``ferry`` extension field; any other
server gives only text and usage, so the answer and prompt speeds are measured
here from the stream and the disk and cache figures are unknown
(``provided`` says which is which).

``cancel()`` may be called from any thread: it shuts the connection, so the
server sees the client leave and stops generating.

``RemoteEngine`` is the remote engine behind the one door (``app.engine.door``):
``submit(request)`` gives a ``RemoteStream`` to iterate and cancel.
"""
from __future__ import annotations

import json
import queue
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterator
from urllib.parse import urlsplit, urlunsplit

from app.chat.stream_parser import StreamParser, ToolCall
from app.chat.turn import TurnRequest, with_note
from app.events import (ImageProgress, LiveStats, Logprob, PromptProgress, Reasoning, Text, TokenLogprob, ToolCallMade, TurnDone,
                        TurnEvent)
from app.vision.image import image_parts

if TYPE_CHECKING:   # httpx is imported where it is used: `ferry run` on a local model never loads it
    import httpx

#: Figures a Ferry server sends / that can be measured from any server's stream.
FERRY_FIGURES = frozenset({"decode_tps", "prompt_tps", "read_mbps", "hit_decode", "hit_prefill"})
MEASURED_FIGURES = frozenset({"decode_tps", "prompt_tps"})
POLL = 0.1


class RemoteError(RuntimeError):
    """The server cannot be used (unreachable, wrong key, unknown model...)."""


@dataclass(frozen=True)
class RemoteStats:
    """The counters of one remote answer, with ``Stats``'s ``as_dict``."""

    counters: dict[str, float] = field(default_factory=dict)

    def as_dict(self) -> dict[str, float]:
        return dict(self.counters)

    def __getattr__(self, name: str) -> float:
        try:
            return self.__dict__["counters"].get(name, 0)
        except KeyError:
            raise AttributeError(name) from None


def normalise_url(url: str) -> str:
    """``host:port``, ``http://host:port`` or ``.../v1`` -> the API base ending in /v1."""
    url = url.strip()
    if not url:
        raise RemoteError("no server URL is set")
    if "://" not in url:
        url = "http://" + url
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise RemoteError(f"'{url}' is not an http(s) URL")
    path = parts.path.rstrip("/")
    if not path:
        path = "/v1"
    return urlunsplit((parts.scheme, parts.netloc, path, "", ""))


class RemoteEngine:
    """A server's model behind the one door (``app.engine.door.TurnEngine``)."""

    kind = "remote"
    tokenizer = None        #: the server's tokenizer is not here (passages are estimated, logprobs carry bytes)

    def __init__(self, url: str, model: str = "", api_key: str | None = None, *, timeout: float = 30.0):
        self.url = normalise_url(url)
        self.model = model.strip()
        self.api_key = api_key or None
        self.timeout = timeout
        self.is_ferry = False
        self.n_ctx = 0
        self.takes_tools = False   #: the server's card lists "tool_use" (a Ferry server whose format takes tools)
        self._cancel = threading.Event()
        self._lock = threading.Lock()
        self._socket: socket.socket | None = None
        self._client: httpx.Client | None = None

    @property
    def name(self) -> str:
        return self.model

    @property
    def provided(self) -> frozenset[str]:
        """The gauges this engine can fill."""
        return FERRY_FIGURES if self.is_ferry else MEASURED_FIGURES

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    # ---- set-up

    def check(self) -> dict[str, Any]:
        """Reach the server, check the key and pick the model (the first one if none is set)."""
        import httpx

        try:
            r = httpx.get(self.url + "/models", headers=self._headers(), timeout=self.timeout)
        except httpx.HTTPError as exc:
            raise RemoteError(f"cannot reach {self.url}: {exc}") from None
        if r.status_code != 200:
            raise RemoteError(f"{self.url} answered {r.status_code}: {_error_message(r)}")
        try:
            cards = [c for c in r.json().get("data", []) if isinstance(c, dict) and isinstance(c.get("id"), str)]
        except (ValueError, AttributeError):
            raise RemoteError(f"{self.url}/models did not answer with a model list") from None
        if not cards:
            raise RemoteError(f"{self.url} serves no models")
        if not self.model:
            self.model = cards[0]["id"]
        card = next((c for c in cards if c["id"] == self.model), None)
        if card is None:
            names = ", ".join(c["id"] for c in cards[:10])
            raise RemoteError(f"{self.url} does not serve '{self.model}' (it serves: {names})")
        self.is_ferry = card.get("owned_by") == "ferry"
        self.n_ctx = int(card.get("max_model_len") or 0)
        caps = card.get("capabilities")
        self.takes_tools = isinstance(caps, list) and "tool_use" in caps
        return card

    # ---- generation

    def cancel(self) -> None:
        """Stop the running (or the next) answer. Any thread."""
        self._cancel.set()
        with self._lock:
            sock = self._socket
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def clear_cancel(self) -> None:
        self._cancel.clear()

    def _http(self) -> httpx.Client:
        """One client, so turns travel on one kept-alive connection: a server
        without API keys keeps prefix reuse per connection."""
        import httpx

        with self._lock:
            if self._client is None:
                self._client = httpx.Client(timeout=httpx.Timeout(self.timeout, read=None))
            return self._client

    def close(self) -> None:
        self.cancel()
        with self._lock:
            client, self._client = self._client, None
        if client is not None:
            client.close()

    def request_body(self, request: TurnRequest) -> dict[str, Any]:
        """The chat completion request for ``request`` (OpenAI's fields, Ferry's extras when set)."""
        p = request.sampling
        if request.context_note:    # a summary of earlier turns: in the system message, as the local pipeline puts it
            request = with_note(request)
        body: dict[str, Any] = {
            "model": self.model, "messages": [_wire(m) for m in request.messages], "stream": True,
            "stream_options": {"include_usage": True}, "max_tokens": int(request.max_tokens or 512),
            "temperature": float(p.temperature), "top_p": float(p.top_p)}
        optional = {"top_k": int(p.top_k), "min_p": float(p.min_p), "seed": p.seed,
                    "frequency_penalty": float(p.frequency_penalty), "presence_penalty": float(p.presence_penalty),
                    "logit_bias": {str(k): v for k, v in p.logit_bias}, "stop": list(request.stop),
                    "tools": request.tools, "tool_choice": request.tool_choice,
                    "response_format": request.response_format, "reasoning_effort": request.reasoning_effort,
                    "experts_per_token": request.experts_per_token,
                    "cache_aware_margin": float(request.cache_aware_margin or 0.0)}
        body.update({k: v for k, v in optional.items() if v})   # defaults are left out: other servers may not know them
        if request.image_patch_budget and self.is_ferry and image_parts(request.messages):
            body["image_patch_budget"] = int(request.image_patch_budget)   # the window's budget, on a Ferry server
        if not request.parallel_tool_calls and request.tools:
            body["parallel_tool_calls"] = False
        if request.top_logprobs is not None:
            body.update(logprobs=True, top_logprobs=int(request.top_logprobs))
        kwargs = dict(request.chat_template_kwargs or {})
        if not request.thinking:
            kwargs.setdefault("enable_thinking", False)
        if kwargs:
            body["chat_template_kwargs"] = kwargs
        if request.continue_final:     # vLLM's pair (Ferry's server takes it too)
            body.update(continue_final_message=True, add_generation_prompt=False)
        return body

    def submit(self, request: TurnRequest) -> "RemoteStream":
        """The door (``app.engine.door``): the turn, sent when its stream is read. A cancel from now on
        stops it (one turn at a time: a cancel asked earlier is forgotten here)."""
        self.clear_cancel()
        return RemoteStream(self, request)

    def generate(self, request: TurnRequest) -> Iterator[TurnEvent]:
        """One turn on the server: the same events as the local pipeline."""
        body = self.request_body(request)
        items: queue.Queue = queue.Queue()
        reader = threading.Thread(target=self._read, args=(body, items), name="ferry-remote", daemon=True)
        t0 = time.monotonic()
        reader.start()
        acc = _Answer(t0, self.is_ferry)
        acc.prefix_state = "remote" if request.keep_prefix else ""   # the server keeps prefixes its own way
        while True:
            try:
                kind, value = items.get(timeout=POLL)
            except queue.Empty:
                if self._cancel.is_set():
                    self.cancel()
                    yield acc.done("cancelled")
                    return
                continue
            if self._cancel.is_set():
                self.cancel()
                yield acc.done("cancelled")
                return
            if kind == "comment":
                progress = value.get("prompt_progress")
                if isinstance(progress, list) and len(progress) == 2:
                    acc.progress_seen = True
                    yield PromptProgress(int(progress[0]), int(progress[1]))
                tower = value.get("image_progress")   # a Ferry server's image in its vision tower
                if isinstance(tower, list) and len(tower) == 4 and all(isinstance(x, int) for x in tower):
                    yield ImageProgress(*tower)
            elif kind == "chunk":
                yield from acc.chunk(value)
            elif kind == "end":
                yield from acc.flush()
                yield acc.done(acc.reason or "stop")
                return
            elif kind == "error":
                yield from acc.flush()
                yield acc.done("cancelled" if self._cancel.is_set() else "error", value)
                return

    def _read(self, body: dict[str, Any], items: queue.Queue) -> None:
        """The HTTP stream, on its own thread: lines in, (kind, value) items out."""
        import httpx

        try:
            client = self._http()
            with client.stream("POST", self.url + "/chat/completions", json=body,
                               headers=self._headers()) as r:
                stream = r.extensions.get("network_stream")
                with self._lock:
                    self._socket = stream.get_extra_info("socket") if stream is not None else None
                if self._cancel.is_set():
                    return items.put(("error", "cancelled"))
                if r.status_code != 200:
                    r.read()
                    return items.put(("error", f"the server answered {r.status_code}: {_error_message(r)}"))
                ended = False
                for line in r.iter_lines():   # read to the body's end, so the connection is kept alive
                    if ended:
                        continue
                    if line.startswith(":"):
                        text = line[1:].strip()
                        if text.startswith("ferry "):
                            try:
                                items.put(("comment", json.loads(text[6:])))
                            except ValueError:
                                pass
                        continue
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        ended = True
                        continue
                    try:
                        doc = json.loads(data)
                    except ValueError:
                        return items.put(("error", "the server sent an event that is not JSON"))
                    if isinstance(doc, dict) and isinstance(doc.get("error"), dict):
                        return items.put(("error", str(doc["error"].get("message") or "the server failed")))
                    if isinstance(doc, dict):
                        items.put(("chunk", doc))
            # the end only once the response is closed and its connection is back in the pool: a
            # next turn sent at once goes on the same connection, which a server without API keys
            # takes for the same client (its prefix reuse); a server that closes without [DONE] ends too
            items.put(("end", None))
        except (httpx.HTTPError, OSError) as exc:
            items.put(("error", f"the connection to {self.url} failed: {exc}"))
        finally:
            with self._lock:
                self._socket = None


class RemoteStream:
    """A turn submitted to a remote engine (``app.engine.door.TurnStream``): the request goes out when
    the events are read; ``cancel()`` from any thread shuts the connection."""

    def __init__(self, engine: RemoteEngine, request: TurnRequest):
        self.engine = engine
        self.request = request

    def __iter__(self) -> Iterator[TurnEvent]:
        return self.engine.generate(self.request)

    def cancel(self) -> None:
        self.engine.cancel()


class _Answer:
    """The answer as it streams in, and the counters measured on the way."""

    def __init__(self, t0: float, is_ferry: bool):
        self.t0 = t0
        self.is_ferry = is_ferry
        self.first: float | None = None
        self.pieces = 0
        self.text: list[str] = []
        self.reasoning: list[str] = []
        self.calls: dict[int, dict[str, str]] = {}
        self.tool_calls: list[ToolCall] = []
        self.reason: str | None = None
        self.usage: dict[str, Any] = {}
        self.ferry: dict[str, Any] = {}
        self.server_counters: dict[str, float] | None = None
        self.logprobs: list[tuple[int, TokenLogprob]] = []
        self.progress_seen = False
        self.prefix_state = ""
        self.parser = StreamParser("think_tags", "response")   # for <think> written into content

    def chunk(self, doc: dict[str, Any]) -> Iterator[TurnEvent]:
        if isinstance(doc.get("usage"), dict):
            self.usage = doc["usage"]
        ferry = doc.get("ferry")
        if isinstance(ferry, dict):
            self.ferry.update(ferry)
            if isinstance(ferry.get("counters"), dict):
                self.server_counters = {k: float(v) for k, v in ferry["counters"].items()
                                        if isinstance(v, (int, float))}
        for choice in doc.get("choices") or []:
            if not isinstance(choice, dict):
                continue
            delta = choice.get("delta") or {}
            reasoning = delta.get("reasoning_content") or delta.get("reasoning")
            content = delta.get("content")
            if (reasoning or content or delta.get("tool_calls")) and self.first is None:
                self.first = time.monotonic()
                if not self.progress_seen:
                    yield PromptProgress(1, 1)
            for token, value in _logprobs(choice.get("logprobs")):
                self.logprobs.append((token, value))
                yield Logprob(token, value)
            if isinstance(reasoning, str) and reasoning:
                self.pieces += 1
                self.reasoning.append(reasoning)
                yield Reasoning(reasoning)
            if isinstance(content, str) and content:
                self.pieces += 1
                yield from self._route(self.parser.feed(content))
            for call in delta.get("tool_calls") or []:
                if isinstance(call, dict):
                    slot = self.calls.setdefault(int(call.get("index") or 0), {"name": "", "arguments": ""})
                    fn = call.get("function") or {}
                    slot["name"] += fn.get("name") or ""
                    slot["arguments"] += fn.get("arguments") or ""
            if choice.get("finish_reason"):
                self.reason = choice["finish_reason"] if choice["finish_reason"] in ("length", "tool_calls") \
                    else "stop"
        if isinstance(ferry, dict) and self.server_counters is not None:
            yield LiveStats(self.counters())

    def _route(self, events) -> Iterator[TurnEvent]:
        for kind, text in events:
            if kind == "thinking" and text:
                self.reasoning.append(text)
                yield Reasoning(text)
            elif kind == "response" and text:
                self.text.append(text)
                yield Text(text)

    def flush(self) -> Iterator[TurnEvent]:
        yield from self._route(self.parser.finish())
        for index in sorted(self.calls):
            call = ToolCall(self.calls[index]["name"], len(self.tool_calls) + 1, self.calls[index]["arguments"])
            self.tool_calls.append(call)
            yield ToolCallMade(call)
        self.calls.clear()

    def counters(self) -> dict[str, float]:
        if self.server_counters is not None:
            return dict(self.server_counters)
        now = time.monotonic()
        first = self.first or now
        done = int(self.usage.get("completion_tokens") or self.pieces)
        return {"prompt_tokens": float(self.usage.get("prompt_tokens") or 0), "prompt_seconds": first - self.t0,
                "decode_tokens": float(done), "decode_seconds": max(0.0, now - first)}

    def done(self, reason: str, error: str | None = None) -> TurnDone:
        prompt = int(self.usage.get("prompt_tokens") or 0)
        cached = int((self.usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
        done = int(self.usage.get("completion_tokens") or self.pieces)
        reasoning = int((self.usage.get("completion_tokens_details") or {}).get("reasoning_tokens") or 0)
        now = time.monotonic()
        ttft = self.ferry.get("ttft_s")
        if not isinstance(ttft, (int, float)):
            ttft = (self.first - self.t0) if self.first is not None else None
        ids = [token for token, _ in self.logprobs]
        if len(ids) != done or min(ids, default=0) < 0:
            ids = [-1] * done       # known only from logprobs that name every token
        return TurnDone(reason=reason, content="".join(self.text), reasoning="".join(self.reasoning),
                        tool_calls=list(self.tool_calls), token_ids=ids, prompt_tokens=prompt,
                        reused_tokens=cached, completion_tokens=done, reasoning_tokens=reasoning,
                        counters=self.counters(), seconds=now - self.t0, ttft_s=ttft, started=self.t0, ended=now,
                        logprobs=list(self.logprobs), error=error, prefix_state=self.prefix_state)


def _logprobs(doc: Any) -> Iterator[tuple[int, TokenLogprob]]:
    """(token id, logprob) of each token in a chunk's OpenAI ``logprobs`` object;
    entries that are not well formed are skipped."""
    content = doc.get("content") if isinstance(doc, dict) else None
    for item in content if isinstance(content, list) else ():
        if not isinstance(item, dict) or not _is_number(item.get("logprob")):
            continue
        top = item.get("top_logprobs")
        top = [a for a in (top if isinstance(top, list) else ())
               if isinstance(a, dict) and _is_number(a.get("logprob"))]
        value = TokenLogprob(float(item["logprob"]), tuple((_token_id(a), float(a["logprob"])) for a in top),
                             token_bytes=_token_bytes(item), top_bytes=tuple(map(_token_bytes, top)))
        yield _token_id(item), value


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _token_bytes(item: dict[str, Any]) -> bytes:
    """A logprob entry's token bytes: its ``bytes`` (OpenAI), else its text."""
    raw = item.get("bytes")
    if isinstance(raw, list) and all(isinstance(b, int) and 0 <= b < 256 for b in raw):
        return bytes(raw)
    token = item.get("token")
    return token.encode("utf-8", "replace") if isinstance(token, str) else b""


def _token_id(item: dict[str, Any]) -> int:
    """A logprob entry's token id: its ``id`` (Ferry, llama.cpp), a ``token_id:N``
    token (vLLM's ``return_tokens_as_token_ids``), else -1 (unknown)."""
    value = item.get("id")
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    token = item.get("token")
    if isinstance(token, str) and token.startswith("token_id:") and token[9:].isdigit():
        return int(token[9:])
    return -1


def _error_message(r: httpx.Response) -> str:
    try:
        err = r.json().get("error")
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])
        if isinstance(err, str):
            return err
    except (ValueError, AttributeError):
        pass
    return r.text[:300] or r.reason_phrase


def _wire(message: dict) -> dict:
    """A message as OpenAI's API spells it: an image part's file name (which the front ends keep for
    their own messages) is left out, as a strict server refuses keys it does not know."""
    m = dict(message)
    if isinstance(m.get("content"), list):
        m["content"] = [{k: v for k, v in part.items() if k != "name"}
                        if isinstance(part, dict) and part.get("type") == "image_url" else part
                        for part in m["content"]]
    return m
