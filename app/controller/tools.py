"""The window's MCP tools, without Qt: the connected servers (``ToolHub``, which
the window connects in the background), the tools the user trusts, and the
tool rounds of the answer being written.

One answer may take several rounds: the model calls tools, each call is
approved (or is trusted, or declined), run, and its result goes back; the
model is asked again with the calls and results, in the same answer bubble,
until it answers without a call (or ``MAX_ROUNDS`` rounds). Every call is kept
with the answer (``calls``: name, arguments, what became of it, its result),
so the chat shows it and it survives a restart::

    session.start_answer(start.messages)
    ... the answer ends with tool calls (TurnDone.reason == "tool_calls") ...
    session.begin_round(done)
    while (i := session.next_to_ask()) is not None:  session.decide(i, allow, always)
    while (i := session.next_to_run()) is not None:  session.ran(i, hub.call(...))
    messages = session.continued()     # the next request's messages
"""
from __future__ import annotations

from typing import Any

from app.tools.mcp import DECLINED, MAX_ROUNDS, CallRecord, ToolHub, ToolResult, call_id, round_messages

#: What became of a call: asked about, approved (about to run), running, done (ran: its result may be an
#: error the tool reported) or declined by the user.
WAITING, APPROVED, RUNNING, DONE, DECLINED_STATUS = "waiting", "approved", "running", "done", "declined"


class ToolSession:
    def __init__(self):
        self.hub: ToolHub | None = None
        self.problems: list[str] = []
        self.trusted: set[str] = set()        #: trust keys (``trust_key``) of tools that run without asking
        self.calls: list[dict[str, Any]] = []  #: this answer's calls, every round (kept with the answer)
        self.base: list[dict[str, Any]] = []   #: the conversation the answer began from
        self.messages: list[dict[str, Any]] = []   #: the rounds so far: assistant tool_calls and tool results
        self.rounds = 0
        self._round: list[int] = []            #: the current round's indexes into ``calls``
        self._content = self._reasoning = ""

    # ------------------------------------------------------------ tools offered

    def tools(self) -> list[dict[str, Any]] | None:
        """The tools for the next request (OpenAI's shape), None without any."""
        return self.hub.openai_tools() if self.hub is not None and self.hub.tools else None

    def trust_key(self, name: str) -> str:
        """What "always allow" remembers for a tool: its server's name for it and the server."""
        tool = self.hub.tool(name) if self.hub is not None else None
        return f"{tool.remote} ({tool.server})" if tool is not None else name

    # ------------------------------------------------------------ rounds

    def start_answer(self, messages: list[dict[str, Any]]) -> None:
        self.base = list(messages)
        self.calls, self.messages, self.rounds, self._round = [], [], 0, []

    def can_continue(self, done) -> bool:
        """Whether the answer ``done`` (a TurnDone) made calls this session will run."""
        return (self.hub is not None and done is not None and done.reason == "tool_calls" and bool(done.tool_calls)
                and self.rounds < MAX_ROUNDS)

    def begin_round(self, done) -> None:
        """The calls of ``done`` join the answer: trusted ones are approved, the others wait for the user."""
        self.rounds += 1
        self._content, self._reasoning = done.content, done.reasoning
        self._round = []
        for i, call in enumerate(done.tool_calls, 1):
            trusted = self.trust_key(call.name) in self.trusted
            self._round.append(len(self.calls))
            self.calls.append({"id": call_id(f"r{self.rounds}", i), "name": call.name, "arguments": call.arguments,
                               "status": APPROVED if trusted else WAITING, "result": "", "is_error": False,
                               "trusted": trusted})

    def next_to_ask(self) -> int | None:
        return next((i for i in self._round if self.calls[i]["status"] == WAITING), None)

    def next_to_run(self) -> int | None:
        return next((i for i in self._round if self.calls[i]["status"] == APPROVED), None)

    def decide(self, index: int, allow: bool, always: bool = False) -> str | None:
        """The user's answer for a waiting call; the trust key to remember when ``always``."""
        call = self.calls[index]
        if not allow:
            call.update(status=DECLINED_STATUS, result=DECLINED, is_error=True)
            return None
        call["status"] = APPROVED
        if always:
            key = self.trust_key(call["name"])
            self.trusted.add(key)
            for j in self._round:   # the same tool's other calls in this round run too
                if self.calls[j]["status"] == WAITING and self.trust_key(self.calls[j]["name"]) == key:
                    self.calls[j]["status"] = APPROVED
            return key
        return None

    def running(self, index: int) -> dict[str, Any]:
        self.calls[index]["status"] = RUNNING
        return self.calls[index]

    def ran(self, index: int, result: ToolResult) -> None:
        self.calls[index].update(status=DONE, result=result.text, is_error=result.is_error,
                                 seconds=round(result.seconds, 3))

    def round_over(self) -> bool:
        return all(self.calls[i]["status"] in (DONE, DECLINED_STATUS) for i in self._round)

    def continued(self) -> list[dict[str, Any]]:
        """The messages of the next request: the conversation, and every round's calls and results."""
        records = [CallRecord(c["id"], c["name"], c["arguments"], ToolResult(c["result"], c["is_error"]))
                   for c in (self.calls[i] for i in self._round)]
        self.messages += round_messages(self._content, self._reasoning, records)
        self._round = []
        return self.base + self.messages

    def cancel_round(self) -> None:
        """The user stopped the answer while a call waited: the calls not run are declined."""
        for i in self._round:
            if self.calls[i]["status"] in (WAITING, APPROVED, RUNNING):
                self.calls[i].update(status=DECLINED_STATUS, result=DECLINED, is_error=True)
        self._round = []

    @property
    def in_round(self) -> bool:
        return bool(self._round)
