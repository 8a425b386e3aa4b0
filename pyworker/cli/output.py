"""What a command does when its stdout cannot be written: a reader that went away (`runrow status
| head -1`) is exit 1 without a word; a full disk or an I/O error is exit 1 with one line on
stderr saying what was done all the same. Never a traceback or "Exception ignored" at exit."""

from __future__ import annotations

import contextlib
import errno
import os
import sys

# The errors of a stdout that cannot take what is written; any other OSError is a bug to show.
WRITE_ERRORS = (errno.ENOSPC, errno.EIO, errno.EPIPE)


def stdout_lost(exc: OSError, command: str, done: str, *, quiet_if_reader_gone: bool = True) -> int:
    """Exit code 1 after a failed write to stdout. stdout then points at /dev/null, so what is
    still buffered cannot fail again at exit. `done` says what stands (a new run's id, which
    the caller could not learn otherwise, is said even to a reader that went away)."""
    with contextlib.suppress(OSError):
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    if isinstance(exc, BrokenPipeError) and quiet_if_reader_gone:
        return 1
    with contextlib.suppress(OSError):
        print(f"runrow {command}: cannot write its output ({exc.strerror}); {done}", file=sys.stderr)
    return 1
