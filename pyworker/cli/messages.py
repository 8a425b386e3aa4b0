"""How a command says in one line what went wrong."""

from __future__ import annotations

from pathlib import Path


def first_line(exc: BaseException, default: str | None = None) -> str:
    """The first line of an error's text (libpq's messages run to several, with hints), or
    `default` (the error's class name) when it has none."""
    lines = str(exc).strip().splitlines()
    return lines[0].strip() if lines else (default or type(exc).__name__)


def read_text_option(path: Path, option: str) -> str:
    """The UTF-8 text of a file an option names; ValueError naming the option and the file when it
    cannot be read (missing, a folder, not UTF-8)."""
    try:
        return path.read_text()
    except OSError as exc:
        raise ValueError(f"cannot read {option} {path}: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise ValueError(f"{option} {path} is not UTF-8 text (byte {exc.start})") from None
