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
