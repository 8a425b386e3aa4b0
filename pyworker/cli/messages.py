"""How a command says in one line what went wrong."""

from __future__ import annotations

import re
from pathlib import Path


def first_line(exc: BaseException, default: str | None = None) -> str:
    """The first line of an error's text (libpq's messages run to several, with hints), or
    `default` (the error's class name) when it has none."""
    lines = str(exc).strip().splitlines()
    return lines[0].strip() if lines else (default or type(exc).__name__)


# A quoted part of a libpq parse error: the token it could not read, or the whole URL.
_QUOTED = re.compile(r'"([^"]*)"')
# libpq's messages that quote a parameter's name (`?nope=1`), which says what to fix.
_NAMES_A_KEY = ("invalid URI query parameter:", "invalid connection option ")


def unparsable_url_reason(exc: BaseException) -> str:
    """Why libpq could not parse a URL or conninfo string, in one line without the parts it
    quotes: those are pieces of the string, a password among them (`invalid percent-encoded
    token: "SEC%zzRET"`, or the whole URL). A quoted single punctuation mark (`missing "="`)
    stays, since it says what was expected."""

    line = first_line(exc)
    if line.startswith(_NAMES_A_KEY):
        return line  # it quotes an option's name, never a value

    def hidden(match: re.Match[str]) -> str:
        quoted = match.group(1)
        return match.group(0) if len(quoted) == 1 and not quoted.isalnum() else '"…"'

    return _QUOTED.sub(hidden, line)


def read_text_option(path: Path, option: str) -> str:
    """The UTF-8 text of a file an option names; ValueError naming the option and the file when it
    cannot be read (missing, a folder, not UTF-8)."""
    try:
        return path.read_text()
    except OSError as exc:
        raise ValueError(f"cannot read {option} {path}: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise ValueError(f"{option} {path} is not UTF-8 text (byte {exc.start})") from None
