"""How a command says in one line what went wrong."""

from __future__ import annotations


def first_line(exc: BaseException, default: str | None = None) -> str:
    """The first line of an error's text (libpq's messages run to several, with hints), or
    `default` (the error's class name) when it has none."""
    lines = str(exc).strip().splitlines()
    return lines[0].strip() if lines else (default or type(exc).__name__)
