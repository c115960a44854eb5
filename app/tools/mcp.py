"""MCP tools for the window and ``ferry chat``: no Qt here.

``ToolHub`` connects to MCP servers with the official ``mcp`` SDK — a stdio
command (``npx -y @modelcontextprotocol/server-filesystem ~/notes``) or a
streamable-HTTP URL — lists their tools in the OpenAI shape the turn pipeline
takes (``TurnRequest.tools``: the chat format puts them in the prompt), and
calls them. The SDK is asynchronous; the hub runs its own event loop on one
thread and its methods block, with timeouts, so a front end calls them from
whatever thread runs its turns. A server that cannot start, a call that fails
or does not answer in time, arguments that are not a JSON object: each
becomes a one-line problem or a tool result (``is_error``) the model reads,
never an exception out of ``call``.

``tool_round`` runs the calls of one answer (asking ``approve`` first for each
call, unless its tool is trusted) and returns the messages that continue the
conversation: the assistant's message with its ``tool_calls`` and one
``tool`` message per call. The front end then asks the model again with them,
until an answer makes no call (at most ``MAX_ROUNDS`` rounds).
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import json
import os
import shlex
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable
from urllib.parse import urlsplit

from app.untrusted import is_loopback   # the server's own rule for a loopback host

CONNECT_TIMEOUT = 30.0   #: seconds a server has to start and list its tools
CALL_TIMEOUT = 60.0      #: seconds a tool call may take
MAX_RESULT_CHARS = 32_000   #: a longer result is cut (the model's context is the limit that matters)
MAX_ROUNDS = 8           #: tool rounds in one user turn before the front end stops asking the model again
_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-")


class McpError(ValueError):
    """A server that cannot be used (a one-line reason)."""


@dataclass(frozen=True)
class ServerSpec:
    """One MCP server as the user gave it: a command line (stdio), or an
    http(s) URL (streamable HTTP)."""

    target: str

    @property
    def kind(self) -> str:
        return "url" if self.target.lower().startswith(("http://", "https://")) else "stdio"

    @property
    def label(self) -> str:
        """A short name for messages: the URL, or the command's program and first arguments."""
        return self.target if len(self.target) <= 60 else self.target[:57] + "..."


def parse_server(text: str) -> ServerSpec:
    """The server ``text`` names; McpError if it cannot be one. A plain-http URL
    must be on this computer (a loopback host): tool calls and their results
    carry the user's data."""
    text = (text or "").strip()
    if not text:
        raise McpError("an MCP server is a command (stdio) or an http(s) URL; this one is empty")
    spec = ServerSpec(text)
    if spec.kind == "url":
        parts = urlsplit(text)
        host = (parts.hostname or "").strip("[]")
        if not host:
            raise McpError(f"{text!r} has no host")
        if parts.scheme.lower() == "http" and not is_loopback(host):
            raise McpError(f"{text!r} is plain http to another computer; use https, or a server on this one")
    else:
        try:
            argv = shlex.split(text)
        except ValueError as exc:
            raise McpError(f"cannot read the command {text!r}: {exc}") from None
        if not argv:
            raise McpError("the MCP server's command is empty")
    return spec


@dataclass(frozen=True)
class McpTool:
    """A tool a server offers; ``name`` is what the model calls it (the
    server's own name, made unique across servers), ``remote`` the server's."""

    name: str
    remote: str
    server: str           #: the server's label
    description: str
    schema: dict[str, Any]

    def openai(self) -> dict[str, Any]:
        """The tool as ``TurnRequest.tools`` (OpenAI's shape) takes it."""
        schema = self.schema if isinstance(self.schema, dict) and self.schema else {"type": "object",
                                                                                     "properties": {}}
        return {"type": "function", "function": {"name": self.name, "description": self.description,
                                                 "parameters": schema}}


@dataclass(frozen=True)
class ToolResult:
    text: str
    is_error: bool = False
    seconds: float = 0.0


@dataclass
class _Server:
    spec: ServerSpec
    client: Any = None
    stop: asyncio.Event | None = None
    task: concurrent.futures.Future | None = None
    tools: list[McpTool] = field(default_factory=list)


def one_line(exc: BaseException) -> str:
    """An exception as one line, the innermost of a task group's groups."""
    while getattr(exc, "exceptions", None):   # an exception group (a builtin from Python 3.11)
        exc = exc.exceptions[0]
    text = " ".join(str(exc).split())
    return text or type(exc).__name__


class ToolHub:
    """The MCP servers of a chat, connected; see the module's docstring."""

    def __init__(self, specs: Iterable[ServerSpec], *, connect_timeout: float = CONNECT_TIMEOUT,
                 call_timeout: float = CALL_TIMEOUT, errlog=None):
        self.specs = list(specs)
        self.connect_timeout = connect_timeout
        self.call_timeout = call_timeout
        self._errlog = errlog
        self._own_errlog = None
        self._servers: list[_Server] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self.tools: list[McpTool] = []
        self.problems: list[str] = []

    # ------------------------------------------------------------ life

    def start(self) -> list[str]:
        """Connect to every server (at once) and list their tools; the problems,
        one line per server that could not be used (the others are usable)."""
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
            self._thread = threading.Thread(target=self._loop.run_forever, name="ferry-mcp", daemon=True)
            self._thread.start()
        if self._errlog is None:
            self._own_errlog = self._errlog = open(os.devnull, "w")
        pending = []
        for spec in self.specs:
            server = _Server(spec)
            ready: concurrent.futures.Future = concurrent.futures.Future()
            server.task = asyncio.run_coroutine_threadsafe(self._serve(server, ready), self._loop)
            pending.append((server, ready))
        deadline = time.monotonic() + self.connect_timeout
        for server, ready in pending:
            try:
                ready.result(timeout=max(0.0, deadline - time.monotonic()))
                self._servers.append(server)
            except concurrent.futures.TimeoutError:
                server.task.cancel()
                self.problems.append(f"{server.spec.label}: did not start within {self.connect_timeout:g} s")
            except Exception as exc:
                self.problems.append(f"{server.spec.label}: {one_line(exc)}")
        self.tools = self._name_tools()
        return list(self.problems)

    async def _serve(self, server: _Server, ready: concurrent.futures.Future) -> None:
        from mcp import Client
        from mcp.types import Implementation

        try:
            async with Client(self._transport(server.spec), client_info=Implementation(name="ferry", version="1"),
                              read_timeout_seconds=self.connect_timeout) as client:
                listed, cursor = [], None
                for _ in range(100):   # pages
                    page = await client.list_tools(cursor=cursor)
                    listed += page.tools
                    cursor = page.next_cursor
                    if not cursor:
                        break
                server.client, server.stop = client, asyncio.Event()
                server.tools = [McpTool(t.name, t.name, server.spec.label, t.description or "",
                                        dict(t.input_schema or {})) for t in listed]
                ready.set_result(True)
                await server.stop.wait()
        except BaseException as exc:   # noqa: BLE001 - the reason goes back to start(); a cancel ends quietly
            if not ready.done():
                ready.set_exception(exc if isinstance(exc, Exception) else McpError(one_line(exc)))
            if not isinstance(exc, Exception):
                raise

    def _transport(self, spec: ServerSpec):
        if spec.kind == "url":
            return spec.target
        from mcp import StdioServerParameters
        from mcp.client.stdio import stdio_client

        argv = shlex.split(spec.target)
        return stdio_client(StdioServerParameters(command=argv[0], args=argv[1:]), errlog=self._errlog)

    def _name_tools(self) -> list[McpTool]:
        """Every server's tools under names the model can call (OpenAI's function names:
        letters, digits, _ and -, at most 64): a clash or an odd character is renamed."""
        out, taken = [], set()
        for server in self._servers:
            named = []
            for tool in server.tools:
                base = "".join(c if c in _NAME_CHARS else "_" for c in tool.remote)[:60] or "tool"
                name, n = base, 2
                while name in taken:
                    name, n = f"{base}_{n}", n + 1
                taken.add(name)
                named.append(McpTool(name, tool.remote, tool.server, tool.description, tool.schema))
            server.tools = named
            out += named
        return out

    def close(self) -> None:
        """Disconnect (a stdio server's process ends) and stop the hub's thread."""
        loop = self._loop
        if loop is None:
            return
        for server in self._servers:
            if server.stop is not None:
                loop.call_soon_threadsafe(server.stop.set)
        for server in self._servers:
            try:
                server.task.result(timeout=5)
            except Exception:   # noqa: BLE001 - closing: nothing left to report to
                pass
        loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(timeout=5)
        if not loop.is_running():
            loop.close()
        self._loop, self._servers = None, []
        if self._own_errlog is not None:
            self._own_errlog.close()
            self._own_errlog = None

    def __enter__(self) -> "ToolHub":
        self.start()
        return self

    def __exit__(self, *_exc) -> None:
        self.close()

    # ------------------------------------------------------------ tools

    def openai_tools(self) -> list[dict[str, Any]]:
        return [t.openai() for t in self.tools]

    def tool(self, name: str) -> McpTool | None:
        return next((t for t in self.tools if t.name == name), None)

    def call(self, name: str, arguments: str | dict | None) -> ToolResult:
        """Call the tool the model named; every failure is a result the model reads."""
        start = time.monotonic()

        def error(text: str) -> ToolResult:
            return ToolResult("Error: " + text, True, time.monotonic() - start)

        tool = self.tool(name)
        server = next((s for s in self._servers if tool is not None and tool in s.tools), None)
        if tool is None or server is None or self._loop is None:
            known = ", ".join(t.name for t in self.tools) or "none"
            return error(f"there is no tool named {name!r} (the tools: {known})")
        try:
            args = json.loads(arguments or "{}") if not isinstance(arguments, dict) else arguments
        except ValueError as exc:
            return error(f"the arguments are not JSON ({exc})")
        if not isinstance(args, dict):
            return error("the arguments must be a JSON object")
        future = asyncio.run_coroutine_threadsafe(
            asyncio.wait_for(server.client.call_tool(tool.remote, args, read_timeout_seconds=self.call_timeout),
                             self.call_timeout), self._loop)
        try:
            result = future.result(timeout=self.call_timeout + 5)
        except (TimeoutError, asyncio.TimeoutError, concurrent.futures.TimeoutError):
            future.cancel()
            return error(f"the tool {name} did not answer within {self.call_timeout:g} s")
        except Exception as exc:   # noqa: BLE001 - a broken server, a closed pipe: the model is told
            return error(f"the tool {name} failed: {one_line(exc)}")
        text = result_text(result)
        return ToolResult(("Error: " + text) if result.is_error and not text.startswith("Error") else text,
                          bool(result.is_error), time.monotonic() - start)


def result_text(result) -> str:
    """A ``CallToolResult`` as the text the model reads: its text parts; other
    parts are named (an image, a resource); structured content if that is all."""
    parts = []
    for block in result.content or ():
        kind = getattr(block, "type", "")
        if kind == "text":
            parts.append(block.text)
        elif kind == "resource":
            resource = block.resource
            parts.append(getattr(resource, "text", None) or f"[resource {resource.uri}]")
        elif kind == "resource_link":
            parts.append(f"[resource {block.uri}]")
        else:
            parts.append(f"[{kind} {getattr(block, 'mime_type', '')}]".replace(" ]", "]"))
    text = "\n".join(parts)
    if not text and result.structured_content is not None:
        text = json.dumps(result.structured_content, ensure_ascii=False)
    if len(text) > MAX_RESULT_CHARS:
        text = text[:MAX_RESULT_CHARS] + f"\n[cut: the result had {len(text)} characters]"
    return text


# ---------------------------------------------------------------- the turn loop

DECLINED = "The user declined this tool call."


@dataclass(frozen=True)
class CallRecord:
    """One tool call of an answer and what came of it (for the front end to show)."""

    id: str
    name: str
    arguments: str
    result: ToolResult


def call_id(round_id: str, index: int) -> str:
    return f"call_{round_id}_{index}"


def tool_round(hub: ToolHub, done, round_id: str, approve: Callable[[str, str], bool],
               on_call: Callable[[CallRecord], None] | None = None) -> tuple[list[dict[str, Any]], list[CallRecord]]:
    """Run the tool calls of one answer (``done``: its ``TurnDone``): each needs
    ``approve(name, arguments)``; a declined call's result says so. Returns the
    messages that continue the conversation and the calls' records."""
    calls = []
    for i, call in enumerate(done.tool_calls, 1):
        if approve(call.name, call.arguments):
            result = hub.call(call.name, call.arguments)
        else:
            result = ToolResult(DECLINED, True)
        record = CallRecord(call_id(round_id, i), call.name, call.arguments, result)
        calls.append(record)
        if on_call is not None:
            on_call(record)
    return round_messages(done.content, done.reasoning, calls), calls


def round_messages(content: str, reasoning: str, calls: list[CallRecord]) -> list[dict[str, Any]]:
    """The assistant's message that made ``calls`` and the ``tool`` messages answering them (OpenAI's shapes)."""
    assistant: dict[str, Any] = {"role": "assistant",
                                 "tool_calls": [{"id": c.id, "type": "function",
                                                 "function": {"name": c.name, "arguments": c.arguments}}
                                                for c in calls]}
    if content:
        assistant["content"] = content
    if reasoning:
        assistant["reasoning_content"] = reasoning
    return [assistant, *({"role": "tool", "tool_call_id": c.id, "content": c.result.text} for c in calls)]
