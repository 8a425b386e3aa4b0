"""How `runrow demo` writes to the terminal: headings, one line per structural journal event, and the
model's text and thinking inline as their (coalesced) deltas arrive.

Plain ASCII, so it reads the same in any terminal, log file or CI output; colour only on a terminal
that wants it (a tty, NO_COLOR unset). On a terminal the control characters of journaled text are
shown as `\\xNN`, never obeyed (pyworker/db/terminal_text.py): model output must not retitle the
terminal or write its clipboard.
"""

from __future__ import annotations

import json
import os
import sys
import textwrap
import time
from typing import Any, TextIO

from pyworker.db.api import Event
from pyworker.db.terminal_text import is_terminal, shown

STYLES = {"bold": "1", "dim": "2", "red": "31", "green": "32", "yellow": "33", "blue": "34", "cyan": "36"}
INDENT = " " * 10


class Screen:
    def __init__(self, out: TextIO | None = None, color: bool | None = None) -> None:
        self.out = out or sys.stdout
        if color is None:
            color = self.out.isatty() and not os.environ.get("NO_COLOR") and os.environ.get("TERM") != "dumb"
        self.color = color
        # Escape what the run wrote before our own colour codes go around it.
        self.shown = shown if is_terminal(self.out) else _as_is
        self.started = time.monotonic()
        self._inline: str | None = None  # the open inline stream: text / thinking / input, per block

    def paint(self, text: str, *styles: str) -> str:
        if not self.color or not styles:
            return text
        codes = ";".join(STYLES[s] for s in styles)
        return f"\x1b[{codes}m{text}\x1b[0m"

    def _write(self, text: str) -> None:
        self.out.write(text)
        self.out.flush()

    def _close_inline(self) -> None:
        if self._inline is not None:
            self._write("\n")
            self._inline = None

    def heading(self, title: str) -> None:
        self._close_inline()
        title = self.shown(title)
        bar = "=" * max(8, 72 - len(title) - 4)
        self._write("\n" + self.paint(f"== {title} {bar}", "bold") + "\n")

    def line(self, text: str = "", *styles: str, stamp: bool = True) -> None:
        """One line, prefixed with the seconds since the demo started."""
        self._close_inline()
        prefix = f"[{time.monotonic() - self.started:6.1f}s] " if stamp else ""
        self._write(self.paint(prefix, "dim") + self.paint(self.shown(text), *styles) + "\n")

    def note(self, text: str) -> None:
        """An explanatory line under the previous one."""
        self._close_inline()
        for part in textwrap.wrap(self.shown(text), 100 - len(INDENT)) or [""]:
            self._write(INDENT + self.paint(part, "dim") + "\n")

    def inline(self, stream: str, label: str, text: str, *styles: str) -> None:
        """Append streamed text; a new stream (kind or block) starts on its own labelled line."""
        if self._inline != stream:
            self._close_inline()
            self._write(INDENT + self.paint(f"{label}: ", "dim"))
            self._inline = stream
        text = self.shown(text).replace("\n", "\n" + INDENT + "  ")
        self._write(self.paint(text, *styles))


def _as_is(text: str) -> str:
    return text


def short(value: Any, width: int = 12) -> str:
    text = str(value or "")
    return text if len(text) <= width else text[:width] + "..."


class EventPrinter:
    """Renders the journal of the demo's run. `pids` maps worker id -> pid for the claim lines.

    The tail prints each event as it reads it, which can be after the worker that journaled it was
    killed: right after "KILL ... SIGKILL worker-b" came "tool call read_file ... execute" of the
    killed attempt, which read as work done after the kill. So every line of an attempt's own
    events says whose it is (`worker-b #1: ...`): the events between a run_claimed and the next
    run_requeued, run_claimed or complete are that claim's."""

    def __init__(self, screen: Screen, pids: dict[str, int]) -> None:
        self.screen = screen
        self.pids = pids
        self.tool_of_use: dict[str, str] = {}
        self.attempt: str | None = None  # "worker-b #1" while a claim's events are being shown

    def _mine(self, text: str) -> str:
        return text if self.attempt is None else f"{self.attempt}: {text}"

    def show(self, event: Event) -> None:
        p = event.payload
        s = self.screen
        kind = event.type
        mine = self._mine
        if kind == "text_delta":
            s.inline(f"{self.attempt}text{p.get('index')}", mine("text"), str(p.get("text", "")))
        elif kind == "thinking_delta":
            s.inline(
                f"{self.attempt}thinking{p.get('index')}", mine("thinking"), str(p.get("thinking", "")), "dim"
            )
        elif kind == "input_json_delta":
            s.inline(
                f"{self.attempt}input{p.get('index')}",
                mine("tool input"),
                str(p.get("partial_json", "")),
                "cyan",
            )
        elif kind == "user_message_created":
            s.line(f"user message stored (journal seq {event.seq})")
        elif kind == "run_queued":
            s.line("run queued: waiting for a worker to claim it")
        elif kind == "run_claimed":
            who = str(p.get("worker_id"))
            pid = self.pids.get(who)
            s.line(
                f"CLAIMED by {who}" + (f" (pid {pid})" if pid else "") + f", attempt {p.get('attempt')}",
                "bold",
                "blue",
            )
            self.attempt = f"{who} #{p.get('attempt')}"
        elif kind == "model_request":
            s.line(mine(f"-> model call for step {p.get('step')} ({p.get('model')})"))
        elif kind == "model_turn":
            s.line(
                mine(
                    f"step {p.get('step_seq')} committed: model_turn, stop_reason {p.get('stop_reason')}, "
                    f"request_id {p.get('request_id')}"
                ),
                "green",
            )
        elif kind == "tool_call":
            self.tool_of_use[str(p.get("tool_use_id"))] = str(p.get("tool"))
            s.line(
                mine(
                    f"tool call {p.get('tool')} [{p.get('effect')}] key {short(p.get('idempotency_key'))}: "
                    f"{p.get('state')}"
                ),
                "cyan",
            )
        elif kind == "tool_result":
            error = " (is_error)" if p.get("is_error") else ""
            s.line(
                mine(f"step {p.get('step_seq')} committed: tool_result of {p.get('tool')}{error}"), "green"
            )
        elif kind == "run_requeued":
            self.attempt = None  # a reaper's or a release's line: the attempt is over
            s.line(
                f"REQUEUED after attempt {p.get('attempt')} of {p.get('max_attempts')}: "
                f"{p.get('error') or p.get('reason') or ''}",
                "bold",
                "yellow",
            )
        elif kind == "superseded":
            s.line(
                mine(
                    f"SUPERSEDED: seqs {p.get('after_seq', 0) + 1}..{p.get('through_seq')} were streamed "
                    f"by a cut-off attempt; attempt {p.get('attempt')} redoes that work, so they are not "
                    "the answer"
                ),
                "bold",
                "yellow",
            )
        elif kind == "complete":
            status = p.get("status")
            s.line(
                f"COMPLETE: {status}" + (f" ({p.get('error')})" if p.get("error") else ""), "bold", "green"
            )
            self.attempt = None
        else:
            s.line(mine(f"{kind} {json.dumps({k: v for k, v in p.items() if k != 'type'})[:100]}"))


def table(screen: Screen, header: tuple[str, ...], rows: list[tuple[Any, ...]]) -> None:
    cells = [tuple(str(c) for c in header)] + [tuple("" if c is None else str(c) for c in r) for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    for n, row in enumerate(cells):
        text = "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
        screen.line("  " + text, *(("bold",) if n == 0 else ()), stamp=False)
