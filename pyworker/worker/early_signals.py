"""SIGTERM and SIGINT that reach `runrow worker` before its event loop handles them.

Worker.run installs the loop's handlers only once the process has loaded its handler and tools
(2-3 s of imports: the Anthropic SDK, the tools module). A SIGTERM in that window took Python's
default action and the worker died by the signal (status -15) instead of draining and exiting
0: `runrow demo` stopped at its start reported exactly that for both workers. install() is the
first thing `runrow worker` does; Worker.run replays what arrived (take()) through its own
handler, so an early first signal stops the worker cleanly and a second one exits at once, as
later.

install() also unblocks the two signals: a parent that must not lose a stop between fork and
install() (the demo) starts the worker with them blocked, and they wait here, pending.
"""

from __future__ import annotations

import logging
import os
import signal
from typing import Any

SIGNALS = (signal.SIGTERM, signal.SIGINT)
_pending: list[int] = []


def install() -> None:
    for sig in SIGNALS:
        signal.signal(sig, _record)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, SIGNALS)


def take() -> list[int]:
    """The signals recorded since install(), in order; cleared."""
    taken = list(_pending)
    _pending.clear()
    return taken


def _record(signum: int, frame: Any) -> None:
    if _pending:
        logging.getLogger("runrow.worker").warning("second signal while starting: exiting now")
        logging.shutdown()
        os._exit(1)
    _pending.append(signum)
