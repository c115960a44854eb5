"""The window's tool rounds without Qt (app/controller/tools.py): which calls
wait for the user, what "always allow" trusts, the messages the model is
asked again with, and what a stop leaves."""
from __future__ import annotations

import json

from app.api import ToolCall, TurnDone
from app.controller.tools import APPROVED, DECLINED_STATUS, DONE, WAITING, ToolSession
from app.tools.mcp import DECLINED, MAX_ROUNDS, ToolHub, ToolResult


def _done(*calls, content="Looking.", reasoning="Think."):
    return TurnDone("tool_calls", content=content, reasoning=reasoning,
                    tool_calls=[ToolCall(n, i, json.dumps(a)) for i, (n, a) in enumerate(calls, 1)])


def test_a_round_asks_runs_and_continues_the_conversation():
    s = ToolSession()
    assert s.tools() is None and not s.can_continue(_done(("read", {})))   # no servers: nothing to run
    s.hub = ToolHub([])   # not connected: its calls would be error results; the rounds are what is tested
    s.trusted = {"list"}
    base = [{"role": "user", "content": "Where is the key?"}]
    s.start_answer(base)
    s.begin_round(_done(("read", {"path": "a"}), ("list", {}), ("read", {"path": "b"})))
    assert [c["status"] for c in s.calls] == [WAITING, APPROVED, WAITING] and s.calls[1]["trusted"]
    assert s.next_to_ask() == 0
    assert s.decide(0, True, always=True) == "read"          # remembered, and the round's other read runs too
    assert s.next_to_ask() is None and "read" in s.trusted and s.calls[2]["status"] == APPROVED
    for i, text in ((0, "A"), (1, "a\nb"), (2, "Error: no b")):
        assert s.next_to_run() == i
        s.running(i)
        s.ran(i, ToolResult(text, text.startswith("Error")))
    assert s.round_over() and s.calls[2]["status"] == DONE and s.calls[2]["is_error"]
    messages = s.continued()
    assert messages[0] == base[0] and messages[1]["role"] == "assistant"
    assert messages[1]["content"] == "Looking." and messages[1]["reasoning_content"] == "Think."
    assert [c["id"] for c in messages[1]["tool_calls"]] == [m["tool_call_id"] for m in messages[2:]]
    assert [m["content"] for m in messages[2:]] == ["A", "a\nb", "Error: no b"]
    assert not s.in_round

    s.begin_round(_done(("write", {"path": "c"}), content=""))   # the next round: declined
    assert s.decide(s.next_to_ask(), False) is None
    again = s.continued()
    assert again[:len(messages)] == messages and "content" not in again[len(messages)]
    assert again[-1]["content"] == DECLINED and s.calls[-1]["status"] == DECLINED_STATUS


def test_a_stop_declines_what_did_not_run_and_rounds_are_bounded():
    s = ToolSession()
    s.hub = ToolHub([])
    s.start_answer([])
    s.begin_round(_done(("read", {}), ("read", {})))
    s.decide(0, True)
    s.cancel_round()
    assert [c["status"] for c in s.calls] == [DECLINED_STATUS] * 2 and not s.in_round
    s.rounds = MAX_ROUNDS
    assert not s.can_continue(_done(("read", {})))
    s.start_answer([])   # a new answer starts over
    assert s.calls == [] and s.rounds == 0 and s.can_continue(_done(("read", {})))
