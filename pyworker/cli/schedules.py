"""`runrow schedules [list | add | remove]`: recurring runs from a cron expression.

A schedule is a row (runrow.create_schedule / drop_schedule, listed by the runrow.schedules
view); every worker's reaper pass fires the due ticks, so nothing else has to run. Errors a
person can cause (a bad cron, a taken or unknown name) are one line on stderr and exit 2.
"""

from __future__ import annotations

import argparse
import json
import sys
import uuid
from datetime import UTC, datetime
from pathlib import Path

from pyworker.cli.client import (
    DEFAULT_MODEL,
    ENQUEUE_OPTIONS,
    CliError,
    _connect,
    _json_object,
    _print_table,
    _read_tools,
    _sync,
    _wrap,
    echo,
    options_of_arguments,
    read_message,
)
from pyworker.cli.types import env_default, int32, number
from pyworker.db import schedules
from pyworker.db.config import database_url

CRON_HELP = """\
cron: five fields in UTC, as in Vixie cron: minute (0-59) hour (0-23) day-of-month (1-31)
month (1-12 or jan-dec) day-of-week (0-7 or sun-sat; 0 and 7 are Sunday). Each field is *,
a number, a range N-M, a list A,B,C, or a step */S or N-M/S. When day-of-month and
day-of-week are both restricted, a day matching either fires ('0 9 1 * mon' = the 1st and
every Monday); a field starting with * restricts nothing on its own. Also @hourly, @daily
(= @midnight), @weekly, @monthly, @yearly (= @annually).

catch-up: ticks missed while no worker ran (an outage) are fired by the first reaper pass
after it. latest (default): only the most recent missed tick; each: every missed tick, at
most --max-catch-up (default 10, up to 1000) of the most recent."""

EXAMPLES = """\
examples:
  runrow schedules                                          # list them
  runrow schedules add digest '0 7 * * mon-fri' "Summarize yesterday's tickets"
  runrow schedules add ping '*/15 * * * *' "Check the status page" --catch-up each
  runrow schedules add standup '30 9 * * 1-5' "Standup notes" -c $CONV --if-active reject
  runrow schedules remove digest"""


def _when(value: datetime | None) -> str:
    """A tick in UTC, the zone cron is read in."""
    return "" if value is None else value.astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC")


async def cmd_list(args: argparse.Namespace) -> int:
    async with await _connect(database_url(args.database_url)) as conn:
        rows = await schedules.list_schedules(conn)
    if args.json:
        for s in rows:
            print(
                json.dumps(
                    {
                        "name": s.name,
                        "cron": s.cron,
                        "catch_up": s.catch_up,
                        "max_catch_up": s.max_catch_up,
                        "next_fire_at": s.next_fire_at.isoformat(),
                        "last_tick_at": s.last_tick_at.isoformat() if s.last_tick_at else None,
                        "last_run_id": str(s.last_run_id) if s.last_run_id else None,
                        "last_run_status": s.last_run_status,
                        "last_error": s.last_error,
                        "conversation_id": str(s.conversation_id) if s.conversation_id else None,
                        "model": s.model,
                        "priority": s.priority,
                        "fairness_key": s.fairness_key,
                        "concurrency_key": s.concurrency_key,
                        "id": str(s.id),
                    }
                )
            )
        return 0
    if not rows:
        print("no schedules; add one with: runrow schedules add NAME CRON MESSAGE", file=sys.stderr)
        return 0
    _print_table(
        ["name", "cron", "catch-up", "next tick", "last tick", "last run", "status", "last error"],
        [
            [
                s.name,
                s.cron,
                s.catch_up if s.catch_up == "latest" else f"each<={s.max_catch_up}",
                _when(s.next_fire_at),
                _when(s.last_tick_at),
                str(s.last_run_id or ""),
                s.last_run_status or "",
                s.last_error or "",
            ]
            for s in rows
        ],
    )
    return 0


async def cmd_add(args: argparse.Namespace) -> int:
    text = read_message(args.message)
    if args.max_catch_up is not None and args.catch_up != "each":
        raise CliError("--max-catch-up goes with --catch-up each (latest fires only the most recent tick)")
    tools = _read_tools(args.tools_json) if args.tools_json else None
    async with await _connect(database_url(args.database_url)) as conn:
        schedule_id = await schedules.create_schedule(
            conn,
            args.name,
            args.cron,
            text,
            args.model,
            conversation_id=args.conversation,
            user_id=args.user,
            system_prompt=args.system,
            tools=tools,
            metadata=args.metadata,
            max_attempts=args.max_attempts,
            if_active=args.if_active,
            catch_up=args.catch_up,
            max_catch_up=args.max_catch_up,
            priority=args.priority,
            fairness_key=args.fairness_key,
            concurrency_key=args.concurrency_key,
        )
        (created,) = await schedules.list_schedules(conn, args.name)
    print(schedule_id)
    where = f"conversation {args.conversation}" if args.conversation else "a new conversation per tick"
    echo(f"schedule {args.name}: next tick {_when(created.next_fire_at)}, into {where}", sys.stderr)
    return 0


async def cmd_remove(args: argparse.Namespace) -> int:
    async with await _connect(database_url(args.database_url)) as conn:
        await schedules.drop_schedule(conn, args.name)
    echo(f"schedule {args.name} removed; runs it already enqueued stay", sys.stderr)
    return 0


def add_commands(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "schedules",
        help="recurring runs from a cron expression (UTC): list, add, remove",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=_wrap(
            "Recurring runs: at every tick of a cron expression (UTC) the template (message, "
            "model, prompt, tools, metadata; one conversation, or a new one per tick) is enqueued "
            "as a run. Every worker's reaper pass fires the due ticks (every --reap-interval "
            "seconds), no scheduler process needed; each tick enqueues exactly once however many "
            "workers run. Without an action: list."
        )
        + "\n\n"
        + CRON_HELP,
        epilog=EXAMPLES,
    )
    p.set_defaults(func=_sync(cmd_list), json=False)
    actions = p.add_subparsers(dest="action", metavar="ACTION")

    q = actions.add_parser(
        "list",
        help="every schedule: cron, next tick, last tick and its run (the runrow.schedules view)",
        description="Print runrow.schedules: name, cron, catch-up, next tick, last tick, the last "
        "tick's run and its status, and why the last tick enqueued nothing (last error). Times in UTC.",
        epilog="examples: runrow schedules list ; runrow schedules list --json | jq -r .name",
    )
    q.add_argument("--json", action="store_true", help="one JSON object per line")
    q.set_defaults(func=_sync(cmd_list))

    q = actions.add_parser(
        "add",
        help="add a schedule; prints its id",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=_wrap(
            "Create a schedule named NAME: at every tick of CRON, enqueue MESSAGE as a run with "
            "this model, prompt, tools and metadata. The first tick is the first after now. The "
            "template is checked now (a bad cron or message is refused), not at the first tick."
        )
        + "\n\n"
        + CRON_HELP,
        epilog=EXAMPLES,
    )
    q.add_argument("name", help="the schedule's name, unique (1 to 200 characters)")
    q.add_argument("cron", help="five fields in UTC, quoted: '*/15 * * * *'; or @hourly, @daily, ...")
    q.add_argument("message", help="the user message each tick sends, or - to read it from stdin")
    q.add_argument(
        "-c",
        "--conversation",
        type=uuid.UUID,
        help="every tick is the next turn of this conversation (default: a new conversation per tick); "
        "one that has a user takes --user with that user",
    )
    q.add_argument(
        "--model",
        default=env_default("RUNROW_MODEL", DEFAULT_MODEL),
        help="model pinned on each run (default: $RUNROW_MODEL or %(default)s)",
    )
    q.add_argument("--system", help="system prompt pinned on each run")
    q.add_argument(
        "--tools-json", type=Path, metavar="FILE", help="JSON file with an array of tool definitions"
    )
    q.add_argument("--metadata", type=_json_object, default=None, help="JSON object stored on each run")
    q.add_argument("--user", help="user id stored on each run (and owner of the conversation)")
    q.add_argument(
        "--max-attempts",
        type=number(int, 1, 100),
        default=1,
        help="attempts before a run is dead, 1 to 100 (default 1)",
    )
    q.add_argument(
        "--if-active",
        choices=["enqueue", "reject", "interrupt"],
        default="enqueue",
        help="with -c, when the previous turn is still active: queue behind it (default), skip "
        "this tick (reject), or stop it (interrupt)",
    )
    q.add_argument(
        "--priority",
        type=number(int, -1000, 1000),
        default=0,
        help="claim priority, -1000 to 1000, higher first (default 0)",
    )
    q.add_argument("--fairness-key", help="the tenant the claim is fair across (default: --user)")
    q.add_argument("--concurrency-key", help="key of a concurrency limit the runs count against")
    q.add_argument(
        "--catch-up",
        choices=["latest", "each"],
        default="latest",
        help="after an outage: fire only the most recent missed tick (default) or each of them",
    )
    q.add_argument(
        "--max-catch-up",
        type=int32,
        metavar="N",
        help="with --catch-up each: at most the N most recent missed ticks (default 10, 1 to 1000)",
    )
    options_of_arguments(q, {**ENQUEUE_OPTIONS, "catch_up": "--catch-up", "max_catch_up": "--max-catch-up"})
    q.set_defaults(func=_sync(cmd_add))

    q = actions.add_parser(
        "remove",
        help="remove a schedule (its runs already enqueued stay)",
        description="Drop the schedule NAME: no tick of it fires after this. Runs it already "
        "enqueued stay and run; stop them with `runrow stop`.",
        epilog="example: runrow schedules remove nightly-report",
    )
    q.add_argument("name", help="the schedule's name, as `runrow schedules` lists it")
    q.set_defaults(func=_sync(cmd_remove))
