"""The parser of `runrow` and of every command under it: the global options (--database-url,
--log-level) are taken before the command or after it, at any depth, and no usage error repeats
a URL's password."""

from __future__ import annotations

import argparse
import re
import sys
from typing import Any, NoReturn

from pyworker.cli.output import WRITE_ERRORS, stdout_lost
from pyworker.cli.types import LOG_LEVELS, database_url_option, env_default, log_level

# user:password@ of a URL, and password=… of a conninfo string or a URL's query, wherever a
# usage error quotes a value: an unknown argument, a value of the wrong type, a bad command.
_URL_PASSWORD = re.compile(r"(?P<keep>\b[A-Za-z][A-Za-z0-9+.-]*://[^:/@\s'\"]*:)[^\s'\"]*@")
_PASSWORD_PARAM = re.compile(r"(?P<keep>\bpassword\s*=\s*)(?:'(?:[^'\\]|\\.)*'|[^\s&'\"]+)", re.IGNORECASE)


def without_passwords(text: str) -> str:
    """`text` with the password of every URL or conninfo string in it replaced by ***."""
    text = _URL_PASSWORD.sub(r"\g<keep>***@", text)
    return _PASSWORD_PARAM.sub(r"\g<keep>***", text)


class RunrowParser(argparse.ArgumentParser):
    """An ArgumentParser whose every command (add_subparsers makes them of this class too) takes
    the global options. Only the top-level parser has their defaults; a command's copies default
    to SUPPRESS, so `runrow --log-level DEBUG worker` is not reset to INFO by the worker's copy.
    Before, they worked only before the command: `runrow status --database-url URL` read the URL
    as a run id, and `runrow enqueue hi --database-url URL` printed the URL, password and all, as
    an unrecognized argument."""

    def __init__(self, *args: Any, top: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        group = self.add_argument_group("global options (before or after the command)") if not top else self
        group.add_argument(
            "--database-url",
            type=database_url_option,
            default=None if top else argparse.SUPPRESS,
            help="PostgreSQL URL (default: $DATABASE_URL, else the `runrow db start` cluster)",
        )
        group.add_argument(
            "--log-level",
            type=log_level,
            default=env_default("RUNROW_LOG_LEVEL", "INFO") if top else argparse.SUPPRESS,
            help=f"one of {', '.join(LOG_LEVELS)} (default: $RUNROW_LOG_LEVEL, else INFO)",
        )

    def error(self, message: str) -> NoReturn:
        super().error(without_passwords(message))

    def _print_message(self, message: str, file: Any = None) -> None:
        """--help and usage on stdout: argparse ignores an OSError writing them, so `runrow --help
        > /dev/full` exited 0 having written nothing. Now exit 1 (a reader gone, quietly)."""
        if file is not sys.stdout or not message:
            super()._print_message(message, file)
            return
        try:
            file.write(message)
            file.flush()
        except OSError as exc:
            if exc.errno not in WRITE_ERRORS:
                raise
            sys.exit(
                stdout_lost(
                    exc, self.prog.removeprefix("runrow").strip() or "--help", "nothing else was done"
                )
            )
