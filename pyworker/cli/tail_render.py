"""How `runrow tail` (and `enqueue --follow`) show a run's journal: the answer on stdout, every
other event as a one-line note on stderr.

On a terminal, text is printed as it streams. When a later attempt journals `superseded`
(pyworker/worker/supersede.py), text already on the screen came from an attempt that was cut off:
a note says how much of it is not part of the answer, and the answer follows on a new line.

Piped, stdout must be the answer and nothing else, so text is held until it is confirmed:
- a `model_turn` that ends the assistant message (end_turn, max_tokens, refusal, ...) writes
  the message's held text to stdout; `pause_turn` keeps holding (the next turn continues the
  same message); `tool_use` makes it narration before a tool call: a note on stderr;
- the run's `complete` writes what is still held (a handler without model turns, or the
  partial text a cancelled run keeps) when the run completed or its result kept a text; text
  no result kept (an attempt cut off with none left, reaped) is a note on stderr instead;
- `superseded` drops the held deltas with after_seq < seq <= through_seq.
- a read from the start that saw no text at all writes result.text at the `complete`: the
  journal was trimmed (its deltas deleted; read_events ends it with a complete built from the
  run row), or the handler kept a result without streaming it.
No newline is added, so for a run that ends normally stdout is exactly result.text.

On a terminal, control characters of journaled text (ESC, BEL, CR, ...) are shown as `\\xNN`, not
obeyed: model output must not retitle the terminal, write its clipboard or erase what is shown
(pyworker/db/terminal_text.py). Piped, the text is written as it is.
"""

from __future__ import annotations

import json
import os
from typing import Any, TextIO

from pyworker.db.terminal_text import for_stream

# model_turn stop reasons after which the assistant message goes on.
MESSAGE_CONTINUES = ("pause_turn",)
NARRATION = ("tool_use",)


class Renderer:
    def __init__(self, out: TextIO, err: TextIO, live: bool | None = None, *, whole: bool = True) -> None:
        self.out = out
        self.err = err
        # The read started at the journal's beginning (--from 0): what it shows is all there is.
        self.whole = whole
        self.text_seen = False
        self.live = out.isatty() if live is None else live
        self.mid_line = False
        self.dim = err.isatty() and os.environ.get("NO_COLOR") is None
        # (seq, text) of the text deltas of the current message: held (piped) or shown (live).
        self.message: list[tuple[int, str]] = []

    def event(self, seq: int, payload: dict[str, Any]) -> None:
        kind = payload.get("type")
        if kind == "text_delta":
            self.text_seen = True
            text = str(payload.get("text", ""))
            self.message.append((seq, text))
            if self.live:
                self._write(text)
            return
        if kind == "superseded":
            self._supersede(seq, payload)
            return
        if kind == "model_turn":
            stop = payload.get("stop_reason")
            if stop not in MESSAGE_CONTINUES:
                self._end_message(narration=stop in NARRATION)
        elif kind == "complete":
            result = payload.get("result")
            kept = isinstance(result, dict) and isinstance(result.get("text"), str)
            if kept and self.whole and not self.text_seen:
                # No delta of the answer was read: a trimmed journal, or a handler that kept a
                # result without streaming it. The run's result is the answer.
                assert isinstance(result, dict)
                self.message = [(seq, result["text"])]
                if self.live:
                    self._write(result["text"])
            if kept or payload.get("status") == "completed":
                self._end_message(narration=False)
            elif self.message and not self.live:
                # e.g. reaped mid-stream with no attempt left: that text is no answer.
                self.note(f"unfinished text, not kept by the run's result: {self._held()}")
                self.message = []
        self.note(f"{seq} {kind}{_summary(payload)}")

    def note(self, text: str) -> None:
        self.end_line()
        line = f"· {for_stream(text, self.err)}"
        self.err.write(f"\x1b[2m{line}\x1b[0m\n" if self.dim else line + "\n")
        self.err.flush()

    def end_line(self) -> None:
        # Keep notes on their own line when stdout and stderr share a terminal.
        if self.mid_line:
            self.out.write("\n")
            self.out.flush()
            self.mid_line = False

    def _held(self) -> str:
        return "".join(text for _, text in self.message)

    def _write(self, text: str) -> None:
        self.out.write(for_stream(text, self.out))
        self.out.flush()
        if text and self.live:
            self.mid_line = not text.endswith("\n")

    def _end_message(self, narration: bool) -> None:
        text, self.message = self._held(), []
        if self.live or not text:
            return
        if narration:
            self.note(f"said before its tool calls: {text}")
        else:
            self._write(text)

    def _supersede(self, seq: int, payload: dict[str, Any]) -> None:
        after, through = payload.get("after_seq"), payload.get("through_seq")
        if not isinstance(after, int) or not isinstance(through, int):
            self.note(f"{seq} superseded (malformed: no after_seq/through_seq){_summary(payload)}")
            return
        gone = "".join(text for s, text in self.message if after < s <= through)
        self.message = [(s, text) for s, text in self.message if not after < s <= through]
        what = f"{seq} superseded seqs {after + 1}..{through} attempt={payload.get('attempt')}"
        if self.live and gone:
            self.note(f"{what}: the last {len(gone)} characters above were cut off with an earlier attempt")
        else:
            self.note(what)


def _summary(payload: dict[str, Any]) -> str:
    parts = []
    for key in ("status", "name", "attempt", "worker_id", "error", "outcome", "stop_reason"):
        value = payload.get(key)
        if value is not None:
            parts.append(f"{key}={_short(value)}")
    return (" " + " ".join(parts)) if parts else ""


def _short(value: Any, limit: int = 80) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"
