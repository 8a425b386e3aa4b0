"""How `runrow worker` leaves once its stop is over (README: Drain)."""

from __future__ import annotations

import atexit
import logging
import os
import sys
import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyworker.worker.process import Worker

log = logging.getLogger("runrow.worker")

# How long the exit handlers get when the worker leaves runs behind (below): enough for the
# tracer provider to send its batched spans to a collector that answers, and small beside the
# stop's own bound (README: Drain; --drain + 10 s, with a Kubernetes grace of --drain + 15).
EXIT_HANDLERS_SECONDS = 3.0
# The status of a stop that left runs to the reaper (a handler that ignored every cancellation),
# as for a second signal: the supervisor sees that this stop did not end cleanly.
LEFT_RUNS_STATUS = 1


async def run_to_exit(worker: Worker) -> int:
    """worker.run(), then out: a run that ignored even the drain's cancellation is still a task,
    and asyncio.run cancels and awaits every task left before it returns, for ever here (the
    worker was stopped and the run released or left to the reaper: nothing is lost by not
    waiting). So the process leaves with os._exit, which skips the atexit handlers: they are run
    first, bounded (the tracer provider's flush of its batched spans among them), and the log is
    flushed; the status is LEFT_RUNS_STATUS."""
    code = await worker.run()
    if worker.unstoppable:
        log.warning(
            "%d run(s) left to the reaper (their handlers ignored the cancellation); exiting with status %d",
            worker.unstoppable,
            LEFT_RUNS_STATUS,
        )
        _run_exit_handlers(EXIT_HANDLERS_SECONDS)
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code or LEFT_RUNS_STATUS)
    return code


def _run_exit_handlers(seconds: float) -> None:
    """The atexit handlers, in a thread given `seconds`: one that hangs (an exporter whose
    collector does not answer) must not hold the exit past the stop's bound."""
    runner = threading.Thread(target=atexit._run_exitfuncs, name="runrow-exit-handlers", daemon=True)
    runner.start()
    runner.join(seconds)
    if runner.is_alive():
        print(
            f"runrow worker: exit handlers still running after {seconds:g} s; exiting without them",
            file=sys.stderr,
        )
