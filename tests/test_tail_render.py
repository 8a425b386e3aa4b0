"""How `runrow tail` renders a journal, piped and on a terminal (pyworker/cli/tail_render.py), on
journals written the way the agent writes them. The real resume: tests/test_superseded.py."""

from __future__ import annotations

import io
from typing import Any

from pyworker.cli.tail_render import Renderer


def render(journal: list[dict[str, Any]], live: bool, whole: bool = True) -> tuple[str, str]:
    out, err = io.StringIO(), io.StringIO()
    renderer = Renderer(out, err, live=live, whole=whole)
    for seq, payload in enumerate(journal, start=1):
        renderer.event(seq, payload)
    renderer.end_line()
    return out.getvalue(), err.getvalue()


def delta(text: str) -> dict[str, Any]:
    return {"type": "text_delta", "index": 0, "text": text}


def turn(stop_reason: str) -> dict[str, Any]:
    return {"type": "model_turn", "stop_reason": stop_reason, "step_seq": 1}


def complete(status: str, text: str | None) -> dict[str, Any]:
    result = None if text is None else {"text": text}
    return {"type": "complete", "status": status, "result": result, "error": None}


CLAIM = {"type": "run_claimed", "attempt": 1, "worker_id": "w"}
# seqs: 1 claim, 2-3 narration, 4 model_turn tool_use, 5 tool_result, 6-7 cut-off text,
# 8 requeued, 9 claim, 10 superseded (5, 8], 11-12 paused text, 13 pause_turn, 14 text,
# 15 end_turn, 16 complete
RESUMED = [
    CLAIM,
    delta("Let me "),
    delta("look."),
    turn("tool_use"),
    {"type": "tool_result", "tool": "ls", "step_seq": 2},
    delta("The ans"),
    delta("wer is"),
    {"type": "run_requeued", "attempt": 1},
    {**CLAIM, "attempt": 2},
    {"type": "superseded", "after_seq": 5, "through_seq": 8, "attempt": 2},
    delta("The answer "),
    delta("is "),
    turn("pause_turn"),
    delta("42."),
    turn("end_turn"),
    complete("completed", "The answer is 42."),
]


def test_piped_stdout_is_the_answer_without_narration_or_superseded_text() -> None:
    out, err = render(RESUMED, live=False)
    assert out == "The answer is 42."
    assert "said before its tool calls: Let me look." in err
    assert "10 superseded seqs 6..8 attempt=2" in err


def test_on_a_terminal_text_streams_live_and_a_superseded_cut_is_called_out() -> None:
    out, err = render(RESUMED, live=True)
    # Every note starts on a line of its own (stdout and stderr share the terminal).
    assert out == "Let me look.\nThe answer is\nThe answer is \n42.\n"
    assert "the last 13 characters above were cut off with an earlier attempt" in err


def test_piped_unconfirmed_text_is_written_when_the_result_keeps_it() -> None:
    # The echo handler has no model turns: its text is confirmed by the complete.
    assert (
        render([CLAIM, delta("hel"), delta("lo"), complete("completed", "hello")], live=False)[0] == "hello"
    )
    # A stop mid-stream: the cancelled run's result keeps the partial text.
    assert render([CLAIM, delta("hel"), complete("cancelled", "hel")], live=False)[0] == "hel"
    # Reaped mid-stream with no attempt left: no result, no answer; the text is a note.
    out, err = render([CLAIM, delta("hel"), complete("failed", None)], live=False)
    assert out == "" and "not kept by the run's result: hel" in err


def test_a_read_from_the_start_that_saw_no_text_prints_the_results_text() -> None:
    """A trimmed journal is one complete built from the run row (read_events); a handler may keep
    a result it never streamed. Either way the answer is result.text (the history audit: the
    tail of a trimmed run printed nothing)."""
    trimmed = [{**complete("completed", "The answer."), "synthesized": True}]
    for live in (False, True):
        end = "\n" if live else ""  # on a terminal the line is ended for the notes after it
        assert render(trimmed, live=live)[0] == "The answer." + end
        assert render([CLAIM, complete("completed", "Kept.")], live=live)[0] == "Kept." + end
    # Not from the start (--from N): what came before is the reader's, so nothing is made up.
    assert render(trimmed, live=False, whole=False)[0] == ""
    # Text that was streamed is not printed twice.
    assert (
        render([CLAIM, delta("The answer."), complete("completed", "The answer.")], live=False)[0]
        == "The answer."
    )


class Terminal(io.StringIO):
    """A stream that says it is a terminal."""

    def isatty(self) -> bool:
        return True


# What prompt injection can make a model write: retitle the terminal, write its clipboard (OSC 52),
# erase the line before it and carriage-return over it, and a one-byte C1 CSI.
HOSTILE = "safe\x1b]0;pwned\x07 \x1b]52;c;cm0gLXJmIH4=\x07\x1b[2K\rdone\x9b2J\ttab\nnext"


def test_hostile_text_on_a_terminal_is_shown_not_obeyed() -> None:
    out, err = Terminal(), Terminal()
    renderer = Renderer(out, err)
    assert renderer.live
    journal = [CLAIM, delta(HOSTILE), turn("tool_use"), delta("x\x1b[31m"), complete("completed", "y")]
    for seq, payload in enumerate(journal, start=1):
        renderer.event(seq, payload)
    renderer.end_line()
    for written in (out.getvalue(), err.getvalue().replace("\x1b[2m", "").replace("\x1b[0m", "")):
        assert not any(c in written for c in "\x1b\x07\r\x9b"), repr(written)
    assert (
        "safe\\x1b]0;pwned\\x07 \\x1b]52;c;cm0gLXJmIH4=\\x07\\x1b[2K\\x0ddone\\x9b2J\ttab\nnext"
        in out.getvalue()
    )


def test_hostile_text_piped_is_the_runs_text_unchanged() -> None:
    out, _ = render([CLAIM, delta(HOSTILE), turn("end_turn"), complete("completed", HOSTILE)], live=False)
    assert out == HOSTILE


def test_a_notes_hostile_text_on_a_terminal_is_shown_not_obeyed() -> None:
    """Narration before a tool call, piped to a file, goes to stderr as a note: on a terminal."""
    out, err = io.StringIO(), Terminal()
    renderer = Renderer(out, err)
    for seq, payload in enumerate([CLAIM, delta("look\x1b]0;pwned\x07"), turn("tool_use")], start=1):
        renderer.event(seq, payload)
    note = err.getvalue().replace("\x1b[2m", "").replace("\x1b[0m", "")
    assert "said before its tool calls: look\\x1b]0;pwned\\x07" in note
    assert "\x1b" not in note and "\x07" not in note
