"""`runrow demo`: the command line of the live demo (pyworker/demo/run.py runs it)."""

from __future__ import annotations

import argparse
from typing import Any

from pyworker.cli.types import number
from pyworker.demo.run import FAKE_MODEL, REAL_MODEL, Options, run

HELP = """\
Run the durable-agent demo end to end on this machine and show, live, what runrow promises.

It starts a throwaway PostgreSQL 15 cluster (or uses --database-url / DATABASE_URL), migrates it,
starts the fake Anthropic Messages API (the real API when ANTHROPIC_API_KEY is set, unless --fake),
and two worker processes, then enqueues one agent run: list the workspace, read two notes, send an
email (a non-idempotent tool), write a report, read it back, summarise.

What you see:
  - the run's journal as it is written: thinking and text streaming, and one line per structural
    event (claimed by which worker, step N committed with its request id, tool call with its
    idempotency key and effect class, tool result);
  - KILL: once step --kill-after-step is committed, the worker holding the run gets SIGKILL;
  - REQUEUED / CLAIMED ... attempt 2 / RESUME: its lease lapses, a reaper requeues the run, the other
    worker claims it and continues from the step log without redoing a committed step;
  - how many times each tool body ran (send_email: exactly 1), the step log (kind, seq, attempt,
    request id) and the journal by event type, read back through runrow.* functions.

Everything it started is shut down at the end, also on Ctrl-C. Exit status 0 only when the run
completed and send_email ran exactly once. To watch it slowly: --delta-delay 0.1 --tool-delay 1.
"""


def add_command(sub: Any) -> None:
    p = sub.add_parser(
        "demo",
        help="the live demo: kill a worker mid-run, watch another resume it, count the side effects",
        description=HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n  runrow demo\n"
        "  runrow demo --delta-delay 0.1 --tool-delay 1 --keep   # slowly, and keep its logs",
    )
    p.add_argument(
        "--delta-delay",
        type=number(float, 0, 60, "seconds"),
        default=Options.delta_delay,
        help="fake model: seconds before each streamed event (default %(default)s; 0.1 to watch slowly)",
    )
    p.add_argument(
        "--tool-delay",
        type=number(float, 0, 3600, "seconds"),
        default=Options.tool_delay,
        help="seconds each tool call takes (default %(default)s)",
    )
    p.add_argument(
        "--kill-after-step",
        type=number(int, 0, 1000),
        default=Options.kill_after_step,
        metavar="N",
        help="SIGKILL the worker holding the run once step N is committed (default %(default)s; 0: no kill)",
    )
    p.add_argument(
        "--model", help=f"model name (default {REAL_MODEL} on the real API, {FAKE_MODEL} on the fake)"
    )
    p.add_argument(
        "--fake", action="store_true", help="use the fake model even when ANTHROPIC_API_KEY is set"
    )
    p.add_argument(
        "--timeout",
        type=number(float, 1, 86400, "seconds"),
        default=Options.timeout,
        help="give up after this many seconds (default %(default)s)",
    )
    p.add_argument(
        "--keep", action="store_true", help="keep the temp folder (worker logs, workspace, effects.json)"
    )
    p.set_defaults(func=cmd_demo)


def cmd_demo(args: Any) -> int:
    return run(
        Options(
            database_url=args.database_url,
            fake=args.fake,
            model=args.model,
            delta_delay=args.delta_delay,
            tool_delay=args.tool_delay,
            kill_after_step=args.kill_after_step,
            timeout=args.timeout,
            keep=args.keep,
        )
    )
