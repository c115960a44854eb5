"""`ferry chat` on the one turn pipeline: a conversation over several turns
on one engine service, the second turn reusing the first's prefix."""
from __future__ import annotations

import io
import re

import pytest

from app.cli import main as ferry


def test_chat_keeps_the_conversation_and_reuses_its_prefix(demo_container, monkeypatch, capsys):
    monkeypatch.setattr("sys.stdin", io.StringIO("What is the capital of France?\nAnd of Italy?\n\n"))
    assert ferry(["chat", str(demo_container), "-n", "8", "--ctx", "1024", "--threads", "2"]) == 0
    out, err = capsys.readouterr()
    figures = [tuple(map(int, m)) for m in re.findall(r"\[(\d+) tokens, (\d+) prompt tokens evaluated, (\d+) reused",
                                                      err)]
    assert len(figures) == 2 and out.count("> ") == 3
    (n1, evaluated1, reused1), (n2, evaluated2, reused2) = figures
    assert n1 >= 1 and reused1 == 0
    assert reused2 >= evaluated1                   # the whole first prompt was kept
    assert evaluated2 < evaluated1 + 20


def test_slash_quit_ends_the_chat_without_sending_it(demo_container, monkeypatch, capsys):
    monkeypatch.setattr("sys.stdin", io.StringIO("/quit\nWhat is the capital of France?\n"))
    assert ferry(["chat", str(demo_container), "-n", "4", "--ctx", "256", "--threads", "2"]) == 0
    out, err = capsys.readouterr()
    assert "prompt tokens evaluated" not in err and out.count("> ") == 1


def test_a_full_context_leaves_the_oldest_turns_out_and_the_chat_goes_on(demo_container, monkeypatch, capsys):
    """Issue 34 in `ferry chat`: at a 512-token context, turns go on after the context filled (the oldest
    turns are left out and it says so) instead of failing every question from then on."""
    questions = [f"Tell me one fact about the number {i}, and one about cats." for i in range(8)]
    monkeypatch.setattr("sys.stdin", io.StringIO("\n".join(questions) + "\n\n"))
    assert ferry(["chat", str(demo_container), "-n", "64", "--ctx", "512", "--threads", "2"]) == 0
    out, err = capsys.readouterr()
    assert "context holds" not in err and out.count("> ") == len(questions) + 1
    assert len(re.findall(r"\[\d+ tokens, \d+ prompt tokens evaluated", err)) == len(questions)
    assert "earlier turns are outside the model's memory" in err


@pytest.mark.slow     # about a minute: eight turns and the summaries on the demo model
def test_summarise_keeps_a_note_of_the_oldest_turns(demo_container, monkeypatch, capsys):
    """`ferry chat --context summarise` at a 512-token context: the oldest turns become a note the model
    writes, said on stderr, and every question gets an answer."""
    questions = [f"Tell me one fact about the number {i}, and one about cats." for i in range(8)]
    monkeypatch.setattr("sys.stdin", io.StringIO("\n".join(questions) + "\n\n"))
    assert ferry(["chat", str(demo_container), "-n", "64", "--ctx", "512", "--threads", "2",
                  "--context", "summarise"]) == 0
    out, err = capsys.readouterr()
    assert "context holds" not in err and out.count("> ") == len(questions) + 1
    assert len(re.findall(r"\[\d+ tokens, \d+ prompt tokens evaluated", err)) == len(questions)
    notes = re.findall(r"\[the oldest (\d+) messages were summarised: (.+)\]", err)
    assert notes and all(int(n) % 2 == 0 and text.strip() for n, text in notes)
