"""The demo's screen shows a run's text, thinking and tool input; on a terminal, control
characters in them are shown as `\\xNN`, not obeyed (model output is attacker-influenced)."""

from __future__ import annotations

import io
from datetime import UTC, datetime

from pyworker.db.api import Event
from pyworker.demo.render import EventPrinter, Screen

HOSTILE = "safe\x1b]0;pwned\x07 \x1b]52;c;cm0gLXJmIH4=\x07\x1b[2K\rdone\x9b2J"
FIELDS = {"text_delta": "text", "thinking_delta": "thinking", "input_json_delta": "partial_json"}


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def show(out: io.StringIO) -> str:
    printer = EventPrinter(Screen(out, color=False), pids={})
    for seq, (kind, field) in enumerate(FIELDS.items(), start=1):
        printer.show(Event(seq, kind, {"index": 0, field: HOSTILE}, datetime.now(UTC)))
    printer.show(
        Event(4, "run_requeued", {"attempt": 1, "max_attempts": 3, "error": HOSTILE}, datetime.now(UTC))
    )
    return out.getvalue()


def test_hostile_text_on_a_terminal_is_shown_not_obeyed() -> None:
    written = show(Terminal())
    assert not any(c in written for c in "\x1b\x07\r\x9b"), repr(written)
    assert written.count("safe\\x1b]0;pwned\\x07 \\x1b]52;c;cm0gLXJmIH4=\\x07\\x1b[2K\\x0ddone\\x9b2J") == 4


def test_hostile_text_piped_is_written_as_it_is() -> None:
    assert show(io.StringIO()).count(HOSTILE) == 4


def test_colour_codes_of_the_demo_itself_still_reach_the_terminal() -> None:
    out = Terminal()
    Screen(out, color=True).line("CLAIMED", "bold")
    assert "\x1b[1mCLAIMED\x1b[0m" in out.getvalue()


def test_an_attempts_lines_say_whose_they_are() -> None:
    """The tail prints events as it reads them, after the kill too: "tool call read_file ...
    execute" of the killed worker right after "KILL ... SIGKILL worker-b" read as work after the
    kill (the audit). Lines of an attempt's events carry its worker and attempt; the reaper's
    requeue and the lines before any claim carry none."""
    out = io.StringIO()
    printer = EventPrinter(Screen(out, color=False), pids={"worker-b": 7})
    journal = [
        ("run_queued", {}),
        ("run_claimed", {"worker_id": "worker-b", "attempt": 1}),
        ("text_delta", {"index": 0, "text": "reading"}),
        ("tool_call", {"tool": "read_file", "effect": "pure", "idempotency_key": "k", "state": "execute"}),
        ("run_requeued", {"attempt": 1, "max_attempts": 3, "error": "lease expired"}),
        ("run_claimed", {"worker_id": "worker-a", "attempt": 2}),
        ("tool_result", {"step_seq": 4, "tool": "read_file"}),
        ("complete", {"status": "completed"}),
    ]
    for seq, (kind, payload) in enumerate(journal, start=1):
        printer.show(Event(seq, kind, payload, datetime.now(UTC)))
    lines = [line.split("] ", 1)[-1].strip() for line in out.getvalue().splitlines()]
    assert lines == [
        "run queued: waiting for a worker to claim it",
        "CLAIMED by worker-b (pid 7), attempt 1",
        "worker-b #1: text: reading",
        "worker-b #1: tool call read_file [pure] key k: execute",
        "REQUEUED after attempt 1 of 3: lease expired",
        "CLAIMED by worker-a, attempt 2",
        "worker-a #2: step 4 committed: tool_result of read_file",
        "COMPLETE: completed",
    ]
