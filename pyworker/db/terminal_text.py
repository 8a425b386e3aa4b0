"""Journaled text made safe to write to a terminal: its control characters shown, not obeyed.

A run's text comes from the model, and the model's output follows whatever its input told it
(prompt injection): text holding `\\x1b]0;…\\x07` retitles the terminal, `\\x1b]52;c;…\\x07`
writes the clipboard, `\\x1b[2K\\r` erases the line before it. `runrow tail` and `runrow demo`
write such text to a person's terminal, so there every C0 and C1 control character but newline
and tab (ESC, BEL, CR and DEL among them) is written as a visible `\\xNN`. Piped output is left as
it is: a file or another program gets exactly the run's text.

A table cell (`runrow status`, `audit`, `schedules`, the `show` actions, `approvals`) is shown
more strictly than prose: a newline or a tab in a value would end its row or shift its columns,
and a bidi control or an invisible format character would reorder or hide what a person reads
(a RIGHT-TO-LEFT OVERRIDE draws `echo safe \u202e; fr- mr` as `echo safe -rf ; rm`), so
cell() shows those too.
"""

from __future__ import annotations

import re
from typing import TextIO

# C0 but \t and \n, DEL, and C1 (0x9b is a one-byte CSI to terminals that read 8-bit controls).
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def shown(text: str) -> str:
    """`text` with its control characters written out as `\\xNN`; a CRLF line end stays a line end."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text.replace("\r\n", "\n"))


# What a person must see as written, not as drawn: C1 controls, bidi embeddings, overrides,
# isolates and marks, zero-width and other format characters, line and paragraph separators.
HIDDEN = re.compile(r"[\x80-\x9f\u00ad\u061c\u200b-\u200f\u2028-\u202e\u2060-\u2069\ufeff]")
_CELL_BREAKS = {"\n": "\\n", "\t": "\\t"}


def unhidden(text: str) -> str:
    """`text` with each HIDDEN character written as its `\\uXXXX` escape."""
    return HIDDEN.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def cell(text: str) -> str:
    """`text` as one table cell shows it: shown(), then newline and tab as `\\n` and `\\t`, and the
    HIDDEN characters as `\\uXXXX`: one line, drawn as it is written."""
    text = shown(text)
    for char, escaped in _CELL_BREAKS.items():
        text = text.replace(char, escaped)
    return unhidden(text)


def cell_for_stream(text: str, stream: TextIO) -> str:
    """A table cell as it may be written to `stream`: cell() on a terminal, unchanged otherwise."""
    return cell(text) if is_terminal(stream) else text


def for_stream(text: str, stream: TextIO) -> str:
    """`text` as it may be written to `stream`: shown() on a terminal, unchanged otherwise."""
    return shown(text) if is_terminal(stream) else text


def is_terminal(stream: TextIO) -> bool:
    """Whether `stream` is a terminal; a closed or file-less stream is not."""
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False
