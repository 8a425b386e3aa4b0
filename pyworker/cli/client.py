"""The client half of the `runrow` CLI: enqueue, tail, stop, cancel, retry, status, audit.

Each command is one function plus one parser block; `add_commands` registers them on the
main parser. Every database error a person can cause (bad argument, unknown id, wrong
state) becomes one line on stderr and exit code 2, as does an unreachable database.

Exit codes of `tail` and `enqueue --follow` say how the run ended.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import re
import sys
import textwrap
import uuid
from collections.abc import Awaitable, Callable
from contextlib import aclosing
from dataclasses import dataclass
from datetime import timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any, LiteralString, TextIO, TypeVar

import psycopg
from psycopg_pool import AsyncConnectionPool

from pyworker.cli import json_output
from pyworker.cli.messages import first_line, unparsable_url_reason
from pyworker.cli.output import stdout_lost
from pyworker.cli.tail_render import Renderer
from pyworker.cli.types import env_default, int64, number, usd
from pyworker.db import api, nul
from pyworker.db.cancel_safe_pool import CancelSafePool
from pyworker.db.config import database_url, where
from pyworker.db.hub import Hub
from pyworker.db.ids import uuid7
from pyworker.db.pooling import POOLER_SAFE
from pyworker.db.storable import Fault, find_unstorable
from pyworker.db.tail import CursorPastEnd, Keepalive, RunNotFound, check_cursor, run_status, tail
from pyworker.db.terminal_text import cell_for_stream, for_stream

DEFAULT_MODEL = "claude-sonnet-4-5"
T = TypeVar("T")

# How a run ended, as the exit code of `tail` and `enqueue --follow`. 2 is every usage error.
EXIT_CODES = {"completed": 0, "failed": 1, "cancelled": 3, "dead": 4}
EXIT_USAGE = 2
# EX_TEMPFAIL: nothing changed, the same command will go through later (a stop or cancel hit
# its lock_timeout behind an unresponsive holder), so a script can tell it from a bad argument.
EXIT_RETRY = 75

# SQLSTATEs the runrow functions raise for a caller's mistake: the message names the argument.
CALLER_ERRORS = {
    "22023": "invalid argument",
    "22004": "missing argument",
    "55000": "wrong state",
    "55P03": "busy",
    "P0002": "not found",
    "23505": "already used",  # an idempotency key reused by a different request
}

EXIT_CODE_HELP = """\
exit codes: 0 completed, 1 failed, 3 cancelled, 4 dead (attempts exhausted),
            2 bad input, unknown id or database unreachable."""


class CliError(Exception):
    """A one-line message for the person at the shell; exit code 2."""


# enqueue_run's (and create_schedule's) arguments and the options that pass them.
ENQUEUE_OPTIONS = {
    "conversation_id": "--conversation",
    "model": "--model",
    "user_id": "--user",
    "system_prompt": "--system",
    "tools": "--tools-json",
    "metadata": "--metadata",
    "max_attempts": "--max-attempts",
    "idempotency_key": "--idempotency-key",
    "if_active": "--if-active",
    "priority": "--priority",
    "start_in": "--start-in",
    "fairness_key": "--fairness-key",
    "concurrency_key": "--concurrency-key",
    "token_budget": "--token-budget",
    "cost_budget": "--cost-budget",
}


def options_of_arguments(p: argparse.ArgumentParser, options: dict[str, str]) -> None:
    """Which option of command `p` passes which argument of the SQL function it calls: a runrow.*
    function's error names the argument first (`requests_per_minute must be ...`), a name the
    user never typed, and _db_message says the option instead (`--rpm must be ...`)."""
    p.set_defaults(sql_options=options)


def add_commands(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = _command(
        sub,
        "enqueue",
        cmd_enqueue,
        help="enqueue a turn of a conversation; prints the run id",
        description="Record a user message and a queued run in one transaction and wake the "
        "workers. Prints the run id on stdout and the conversation id on stderr; a worker "
        "(`runrow worker`) claims and runs it.",
        epilog=f"""examples:
  runrow enqueue "What is a lease?"                       # new conversation
  runrow enqueue -c 0b9f...e1 "And a fence?" --follow     # next turn, stream the answer
  echo "long prompt" | runrow enqueue - --system "Be brief." --max-attempts 3
  runrow enqueue -c $CONV "again" --if-active interrupt   # stop the running turn first

--follow streams the answer like `runrow tail` and exits with its code.
{EXIT_CODE_HELP}""",
    )
    p.add_argument("message", help="the user message text, or - to read it from stdin")
    p.add_argument(
        "-c",
        "--conversation",
        type=uuid.UUID,
        help="conversation id (default: a new conversation); one that has a user takes --user with that user",
    )
    p.add_argument(
        "--model",
        default=env_default("RUNROW_MODEL", DEFAULT_MODEL),
        help="model pinned on the run (default: $RUNROW_MODEL or %(default)s)",
    )
    p.add_argument("--system", help="system prompt pinned on the run")
    p.add_argument(
        "--tools-json", type=Path, metavar="FILE", help="JSON file with an array of tool definitions"
    )
    p.add_argument(
        "--max-attempts",
        type=number(int, 1, 100),
        default=1,
        help="attempts before the run is dead, 1 to 100 (default 1)",
    )
    p.add_argument(
        "--idempotency-key",
        help="the same key with the same request returns the first run instead of a second one; "
        "with a different request it is an error. Without -c the key names the conversation too, so "
        "a retried command is the same request",
    )
    p.add_argument(
        "--if-active",
        choices=["enqueue", "reject", "interrupt"],
        default="enqueue",
        help="when the conversation has an active turn: wait behind it (default), refuse, or stop it",
    )
    p.add_argument("--metadata", type=_json_object, default=None, help="JSON object stored on the run")
    p.add_argument("--user", help="user id stored on the run")
    p.add_argument(
        "--priority",
        type=number(int, -1000, 1000),
        default=0,
        help="-1000 to 1000; higher is claimed first (default 0)",
    )
    p.add_argument(
        "--start-in",
        # 1 ms at least: enqueue_run takes more than 0, and an interval counts microseconds.
        type=number(float, 0.001, 366 * 86400, "seconds"),
        metavar="SECONDS",
        help="not claimable before SECONDS from now (database clock), 0.001 to 31622400 (366 days)",
    )
    p.add_argument("--fairness-key", help="the tenant claims are fair across (default: the user id)")
    p.add_argument(
        "--concurrency-key",
        help="key of a concurrency limit (runrow concurrency set KEY N) the run counts against",
    )
    p.add_argument(
        "--token-budget",
        type=int64,
        help="most tokens the run may use, over all its model turns (input, output, cache); once "
        "spent, its next model request is refused and it ends failed budget_exhausted",
    )
    p.add_argument(
        "--cost-budget",
        type=usd,
        metavar="USD",
        help="most USD the run may cost at the model's price (runrow budget price); as --token-budget",
    )
    p.add_argument("-f", "--follow", action="store_true", help="stream the run until it ends")
    options_of_arguments(p, ENQUEUE_OPTIONS)

    p = _command(
        sub,
        "tail",
        cmd_tail,
        help="stream a run's journal until it ends; exit code = how it ended",
        description="Follow the run's journal from a cursor: answer text goes to stdout, every "
        "other event is a one-line note on stderr (with its seq). On a terminal the text streams "
        "live; piped, each message's text is written once it is confirmed and text an earlier, "
        "cut-off attempt streamed is left out, so stdout is exactly the answer. On a terminal, "
        "control characters in the run's text (ESC, BEL, CR, ...) are shown as \\xNN, not obeyed "
        "(model output must not retitle the terminal or write its clipboard); piped, the text is "
        "written as it is. Safe to "
        "interrupt and rerun: `--from N` resumes after event N without repeats.",
        epilog=f"""examples:
  runrow tail 5f0c...a2                 # everything from the start
  runrow tail 5f0c...a2 --from 41       # only what came after seq 41
  runrow tail 5f0c...a2 2>/dev/null     # just the text
  runrow tail 5f0c...a2 > answer.txt    # exactly the answer (result.text), no newline added

{EXIT_CODE_HELP}""",
    )
    p.add_argument("run", type=uuid.UUID, help="run id")
    p.add_argument("--from", dest="from_seq", type=int64, default=0, metavar="N", help="start after seq N")

    p = _command(
        sub,
        "stop",
        cmd_stop,
        help="stop a conversation: cancel its queued turns, ask its running turn to stop",
        description="One transaction: queued and waiting runs are cancelled outright (their "
        "message becomes a draft); a running run is flagged and its worker finalizes it "
        "`cancelled`, keeping the text already streamed. Prints one line per run touched. "
        "If a run stays locked by an unresponsive worker for 5 s, nothing is stopped and the "
        f"exit code is {EXIT_RETRY}: retry in a few seconds.",
        epilog="examples:\n  runrow stop 0b9f...e1\n"
        "  runrow stop $CONV && runrow tail $RUN   # watch it end\n"
        f"  until runrow stop $CONV; do [ $? = {EXIT_RETRY} ] || break; sleep 5; done   # retry while busy",
    )
    p.add_argument("conversation", type=uuid.UUID, help="conversation id")

    p = _command(
        sub,
        "cancel",
        cmd_cancel,
        help="stop one run",
        description="As `stop`, for one run. Prints the action: cancelled, cancel_requested "
        f"(its worker will finalize it), or already_<status>. Exit {EXIT_RETRY}: the run is "
        "locked by an unresponsive worker, nothing changed; retry in a few seconds.",
        epilog="example:\n  runrow cancel 5f0c...a2",
    )
    p.add_argument("run", type=uuid.UUID, help="run id")

    p = _command(
        sub,
        "retry",
        cmd_retry,
        help="run a failed or dead run again (a new run); prints its id",
        description="A person's decision: a new queued run with the same conversation, message, "
        "model and prompt, linked to the old one. Retrying twice returns the same new run.",
        epilog="example:\n  runrow retry 5f0c...a2 | xargs runrow tail",
    )
    p.add_argument("run", type=uuid.UUID, help="run id of a failed or dead run")

    p = _command(
        sub,
        "status",
        cmd_status,
        help="queue health, fleet limits and webhooks; or one run's tokens",
        description="Without RUN: prints the view runrow.queue_health as a two-column table with the "
        "fleet limits in force (rate-limit keys blocked, runs not due yet: start_in or a retry_in "
        "backoff, tenants over budget; at most 10 names, then how many more; details: "
        "`runrow limits show`, `runrow budget show`), then runrow.webhook_health (pending, "
        "retrying, in flight, dead-lettered, delivered in 24 h) with its names prefixed webhooks_. "
        "With RUN: the run's status and its token totals over every attempt (runrow.run_usage): "
        "model turns, input tokens billed at the full price, output, cache read and cache write.",
        epilog="examples:\n  watch -n 2 runrow status\n  runrow status 5f0c...a2\n"
        "  runrow status --json | jq .queue_health.queued      # one JSON document (keys: queue_health, "
        "fleet, webhook_health)\n"
        "  runrow status 5f0c...a2 --json | jq .input_tokens",
    )
    p.add_argument("run", type=uuid.UUID, nargs="?", help="run id: show this run's status and token totals")
    json_output.add_json_flag(p)
    p = _command(
        sub,
        "audit",
        cmd_audit,
        help="check every invariant; exit 1 when any is violated",
        description="Runs runrow.audit(): one row per violated invariant. Prints them as a "
        "table and exits 1 when there are any, 0 when the database is healthy.",
        epilog="examples:\n  runrow audit || page-the-dba\n"
        "  runrow audit --json | jq '.violations | length'   # {violations: [{invariant, run_id, detail}]}",
    )
    json_output.add_json_flag(p)


def _action(
    actions: argparse._SubParsersAction,  # type: ignore[type-arg]
    name: str,
    *,
    help: str,
    example: str,
) -> argparse.ArgumentParser:
    """One action of a command group (`limits set`, …): its help, and an example in its --help."""
    return actions.add_parser(
        name,
        help=help,
        description=help[0].upper() + help[1:] + ".",
        epilog="example:\n  " + example,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )


def _command(
    sub: argparse._SubParsersAction,  # type: ignore[type-arg]
    name: str,
    func: Callable[[argparse.Namespace], Awaitable[int]],
    *,
    help: str,
    description: str,
    epilog: str | None = None,
) -> argparse.ArgumentParser:
    """One subcommand: its help texts, and `func` run by _sync."""
    p = sub.add_parser(
        name,
        help=help,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=_wrap(description),
        epilog=epilog,
    )
    p.set_defaults(func=_sync(func))
    return p


# --- commands -----------------------------------------------------------------------------


def read_message(arg: str) -> str:
    """The message argument, or stdin for `-`: text PostgreSQL can store, not only white space."""
    if arg == "-":
        if sys.stdin is None:
            raise CliError("no stdin to read the message from (`-`): give the text as an argument")
        try:
            text = sys.stdin.read()
        except UnicodeDecodeError as exc:
            raise CliError(f"the message on stdin is not UTF-8 text (byte {exc.start})") from None
    else:
        text = arg
    if "\x00" in text:
        raise CliError("the message holds a NUL character, which PostgreSQL text cannot store")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # stdin read with surrogateescape (a C locale) keeps bad bytes so
        raise CliError("the message is not UTF-8 text") from None
    if not text.strip():
        raise CliError("the message is empty: give the text as an argument or on stdin with `-`")
    return text


# Conversations of keyed enqueues without -c: a fixed namespace, so a key names one conversation.
KEYED_CONVERSATIONS = uuid.UUID("5d0f6c1e-2b7a-4c39-9a51-7f2e8d4b6a10")


def _conversation_of(idempotency_key: str | None) -> uuid.UUID:
    """A new conversation; with an idempotency key, the one that key names. A new one per call made
    a retried `enqueue --idempotency-key K` a request for another conversation, which enqueue_run
    refuses (the key then names the first run), so the retry a key is for failed."""
    if idempotency_key is None:
        return uuid7()
    return uuid.uuid5(KEYED_CONVERSATIONS, idempotency_key)


async def cmd_enqueue(args: argparse.Namespace) -> int:
    text = read_message(args.message)
    tools = _read_tools(args.tools_json) if args.tools_json else None
    conversation_id = args.conversation or _conversation_of(args.idempotency_key)
    url = database_url(args.database_url)
    async with await _connect(url) as conn:
        enq = await api.enqueue_run(
            conn,
            conversation_id=conversation_id,
            content=text,
            model=args.model,
            user_id=args.user,
            system_prompt=args.system,
            tools=tools,
            max_attempts=args.max_attempts,
            idempotency_key=args.idempotency_key,
            if_active=args.if_active,
            metadata=args.metadata,
            fleet=api.FleetOptions(
                start_in=None if args.start_in is None else timedelta(seconds=args.start_in),
                priority=args.priority,
                fairness_key=args.fairness_key,
                concurrency_key=args.concurrency_key,
                token_budget=args.token_budget,
                cost_budget=args.cost_budget,
            ),
        )
    note = "" if enq.created else " (existing run for this idempotency key)"
    try:
        print(enq.run_id, flush=True)
    except OSError as exc:
        # The run is enqueued, and its id, the one thing the caller cannot learn again, went
        # nowhere (`> /dev/full`): say it where it can be read, even to a reader gone away.
        done = f"run {enq.run_id} is enqueued, conversation {conversation_id}{note}"
        return stdout_lost(exc, "enqueue", done, quiet_if_reader_gone=False)
    print(f"conversation {conversation_id}{note}", file=sys.stderr)
    if not args.follow:
        return 0
    cursor = Cursor(0)
    try:
        return await _follow(url, enq.run_id, cursor)
    except asyncio.CancelledError:  # Ctrl-C: asyncio.run cancels this task, then exits 130
        # It exited 130 without a word, as if the run had stopped with the tail: it goes on.
        print(
            f"runrow enqueue: stopped following; run {enq.run_id} goes on: "
            f"`runrow tail {enq.run_id} --from {cursor.seq}` follows it again, "
            f"`runrow cancel {enq.run_id}` stops it",
            file=sys.stderr,
        )
        raise


async def cmd_tail(args: argparse.Namespace) -> int:
    if args.from_seq < 0:
        raise CliError("--from must be 0 or a seq seen earlier")
    return await _follow(database_url(args.database_url), args.run, Cursor(args.from_seq))


async def cmd_stop(args: argparse.Namespace) -> int:
    async with await _connect(database_url(args.database_url)) as conn:
        try:
            touched = await api.stop_conversation(conn, args.conversation)
        except psycopg.errors.NoDataFound as exc:
            # stop_conversation hints only when the id is a run's: say which command takes it.
            if exc.diag.message_hint:
                raise CliError(
                    f"{args.conversation} is a run, not a conversation: "
                    f"`runrow cancel {args.conversation}` stops one run"
                ) from None
            raise CliError(f"conversation {args.conversation} does not exist") from None
    if not touched:
        print(
            f"conversation {args.conversation} has no queued, running or waiting run: nothing to stop",
            file=sys.stderr,
        )
    for run_id, action in touched:
        print(f"{run_id}\t{action}")
    return 0


async def cmd_cancel(args: argparse.Namespace) -> int:
    print(await _on_run(args, api.cancel_run))
    return 0


async def cmd_retry(args: argparse.Namespace) -> int:
    print(await _on_run(args, api.retry_run))
    return 0


async def _on_run(
    args: argparse.Namespace, call: Callable[[psycopg.AsyncConnection, uuid.UUID], Awaitable[T]]
) -> T:
    """`call` on the run `args.run`; an unknown run id is a one-line error."""
    async with await _connect(database_url(args.database_url)) as conn:
        try:
            return await call(conn, args.run)
        except psycopg.errors.NoDataFound as exc:
            raise await _no_such_run(conn, args.run) from exc


async def _no_such_run(conn: psycopg.AsyncConnection, run_id: uuid.UUID) -> CliError:
    """The error for an id no run has; for a conversation's id, which command takes it (as `stop`
    says of a run's id the other way round)."""
    try:
        conversation = await api.get_conversation(conn, run_id)
    except psycopg.Error:  # no such conversation either (or a login that may not look)
        return CliError(f"run {run_id} does not exist")
    active = f"; its active run is {conversation.active_run_id}" if conversation.active_run_id else ""
    return CliError(
        f"run {run_id} does not exist: {run_id} is a conversation, not a run "
        f"(`runrow stop {run_id}` stops its runs{active})"
    )


async def cmd_status(args: argparse.Namespace) -> int:
    if args.run is not None:
        return await _run_status(args)
    from pyworker.cli.limits import fleet_facts, fleet_json, fleet_summary

    names, rows = await _select_all(args, "runrow.queue_health", psycopg.errors.UndefinedTable)
    async with await _connect(database_url(args.database_url)) as conn:
        facts = await fleet_facts(conn)
    try:
        hook_names, hook_rows = await _select_all(
            args, "runrow.webhook_health", psycopg.errors.UndefinedTable
        )
    except CliError:  # a database from before the webhook outbox: nothing to show
        hook_names, hook_rows = [], []
    if args.json:
        json_output.emit(
            {
                "queue_health": json_output.row(dict(zip(names, rows[0], strict=True))) if rows else None,
                "fleet": fleet_json(facts),
                "webhook_health": (
                    json_output.row(dict(zip(hook_names, hook_rows[0], strict=True))) if hook_rows else None
                ),
            }
        )
        return 0
    fleet = [[n, _cell(v)] for n, v in fleet_summary(facts)]
    for i, row in enumerate(rows):
        if i:
            print()
        _print_table(["", ""], [[n, _cell(v)] for n, v in zip(names, row, strict=True)] + fleet, header=False)
    for row in hook_rows:
        print()
        cells = [
            [f"webhooks_{n}", _cell(v)] for n, v in zip(hook_names, row, strict=True) if n != "measured_at"
        ]
        _print_table(["", ""], cells, header=False)
    return 0


async def _run_status(args: argparse.Namespace) -> int:
    async with await _connect(database_url(args.database_url)) as conn:
        try:
            run = await conn.execute(
                "SELECT id AS run, status, model, attempt, error FROM runrow.get_run(run_id => %s)",
                (args.run,),
            )
            run_names, run_row = [c.name for c in run.description or ()], await run.fetchone()
            usage = await conn.execute("SELECT * FROM runrow.run_usage(run_id => %s)", (args.run,))
            usage_names, usage_row = [c.name for c in usage.description or ()], await usage.fetchone()
        except psycopg.errors.NoDataFound as exc:
            raise await _no_such_run(conn, args.run) from exc
        except psycopg.errors.UndefinedFunction as exc:
            raise CliError(
                "this database has no runrow.run_usage: run `runrow migrate` with a runrow that has it"
            ) from exc
    assert run_row is not None and usage_row is not None
    pairs = [*zip(run_names, run_row, strict=True), *zip(usage_names, usage_row, strict=True)]
    if args.json:
        json_output.emit(json_output.row(dict(pairs)))
        return 0
    _print_table(["", ""], [[n, _cell(v)] for n, v in pairs], header=False)
    return 0


async def cmd_audit(args: argparse.Namespace) -> int:
    names, rows = await _select_all(args, "runrow.audit()", psycopg.errors.UndefinedFunction)
    if args.json:
        json_output.emit({"violations": [json_output.row(dict(zip(names, r, strict=True))) for r in rows]})
    if not rows:
        print("audit: every invariant holds", file=sys.stderr)
        return 0
    if not args.json:
        _print_table(names, [[_cell(v) for v in row] for row in rows])
    print(f"audit: {len(rows)} violation(s)", file=sys.stderr)
    return 1


async def _select_all(
    args: argparse.Namespace, source: LiteralString, missing: type[psycopg.Error]
) -> tuple[list[str], list[tuple[Any, ...]]]:
    """Column names and rows of `SELECT * FROM source` (a runrow view or set-returning function);
    a database migrated by an older runrow, without it, is a one-line error."""
    async with await _connect(database_url(args.database_url)) as conn:
        try:
            cur = await conn.execute(f"SELECT * FROM {source}")
        except missing as exc:
            raise CliError(
                f"this database has no {source}: run `runrow migrate` with a runrow version that has it"
            ) from exc
        return [c.name for c in cur.description or ()], await cur.fetchall()


# --- the tail, rendered -------------------------------------------------------------------


@dataclass
class Cursor:
    """The last seq a tail has shown (from_seq until it shows one): where to rejoin it."""

    seq: int


async def _follow(url: str, run_id: uuid.UUID, cursor: Cursor) -> int:
    from_seq = cursor.seq
    # Check the URL and the schema with one plain connection first: a pool would only say "timed
    # out", and a hub started on a database without runrow wrote its own multi-line warning
    # before the one line that says to run `runrow migrate`.
    async with await _connect(url) as conn:
        await conn.execute("SELECT runrow.schema_version()")
    render = Renderer(sys.stdout, sys.stderr, whole=from_seq == 0)
    # The tail's one-line notes say what matters (an outage, how the run ended). The hub's
    # warnings and the pool's ("discarding closed connection: <psycopg.AsyncConnection [BAD] at
    # 0x...>", at every restart) mixed raw library lines into them.
    for name in ("runrow.hub", "psycopg.pool"):
        logging.getLogger(name).setLevel(logging.ERROR)
    # Behind a transaction pooler the LISTEN must go direct, as for `runrow worker --listen-url`.
    hub = Hub(os.environ.get("RUNROW_LISTEN_URL") or url, application_name="runrow-tail")
    await hub.start()
    pool = CancelSafePool(url, min_size=1, max_size=1, kwargs={"autocommit": True, **POOLER_SAFE}, open=False)
    await pool.open()
    # A LISTEN through a pooler hears nothing: found out, the hub stands down and the tail polls
    # (it trusted its waits, and showed the run in bursts a keepalive, 15 s, apart).
    testing = asyncio.create_task(hub.self_test(pool), name="runrow-tail-hub-self-test")
    testing.add_done_callback(lambda done: _pooled_note(render, done))
    try:
        try:
            ended = await check_cursor(pool, run_id, from_seq)
        except CursorPastEnd as exc:
            raise CliError(
                f"--from {from_seq} is past the end of run {run_id}'s journal, which has no event "
                f"{from_seq} yet: give a seq this run has shown, or 0"
            ) from exc
        if ended:
            return await _ended_earlier(render, pool, run_id)
        seen = from_seq
        while True:
            try:
                async with aclosing(tail(pool, hub, run_id, from_seq=seen)) as items:
                    async for item in items:
                        if isinstance(item, Keepalive):
                            continue
                        payload = nul.decode(item.payload)  # a NUL in the text is stored encoded
                        render.event(item.seq, payload)
                        seen = cursor.seq = item.seq
                        if item.type == "complete":
                            status = str(payload.get("status"))
                            return EXIT_CODES.get(status, 1)
                return await _ended_earlier(render, pool, run_id)  # the tail saw the end past the cursor
            except psycopg.OperationalError as exc:
                # The database went away (a restart, a failover): wait for it and go on after the
                # last event shown, as an SSE client resumes with Last-Event-ID. The tail exited
                # 2 on it, and a user had to find the seq to give --from.
                why = first_line(exc)[:200]
                render.note(f"the database is unavailable ({why}); resuming after seq {seen}")
                await asyncio.sleep(1.0)
    except RunNotFound as exc:
        async with pool.connection() as conn:
            raise await _no_such_run(conn, run_id) from exc
    finally:
        render.end_line()
        testing.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await testing
        await pool.close()
        await hub.stop()


def _pooled_note(render: Renderer, self_test: asyncio.Task[bool | None]) -> None:
    """The hub's verdict on a pooled LISTEN, as one of the tail's notes (the hub's own warnings
    are kept out of them, and named the worker's --listen-url)."""
    if not self_test.cancelled() and self_test.exception() is None and self_test.result() is False:
        render.note(
            "the LISTEN URL looks pooled (a NOTIFY through it did not arrive): the tail polls every "
            "second; set RUNROW_LISTEN_URL to a direct URL for live wakes"
        )


async def _ended_earlier(render: Renderer, pool: AsyncConnectionPool, run_id: uuid.UUID) -> int:
    # The cursor was already past the complete: the run had ended; say how.
    status = await run_status(pool, run_id)
    render.note(f"run ended earlier: status={status}")
    return EXIT_CODES.get(status, 1)


# --- plumbing -----------------------------------------------------------------------------


def _sync(command: Callable[[argparse.Namespace], Awaitable[int]]) -> Callable[[argparse.Namespace], int]:
    """Run an async command; turn the errors a person can fix into one line and exit 2."""

    def run(args: argparse.Namespace) -> int:
        try:
            return asyncio.run(command(args))  # type: ignore[arg-type]
        except KeyboardInterrupt:
            return 130
        except CliError as exc:
            echo(f"runrow: {exc}", sys.stderr)
            return EXIT_USAGE
        except psycopg.errors.LockNotAvailable as exc:
            hint = exc.diag.message_hint
            echo(f"runrow: {_db_message(exc)}" + (f" ({hint})" if hint else ""), sys.stderr)
            return EXIT_RETRY
        except psycopg.Error as exc:
            echo(f"runrow: {_db_message(exc, getattr(args, 'sql_options', None))}", sys.stderr)
            return EXIT_USAGE

    run.__name__ = command.__name__
    return run


NOT_INSTALLED = ("3F000", "42883", "42P01")  # invalid_schema_name, undefined_function, undefined_table


def _db_message(exc: psycopg.Error, options: dict[str, str] | None = None) -> str:
    primary = (exc.diag.message_primary or str(exc)).strip().splitlines()[0]
    kind = CALLER_ERRORS.get(exc.sqlstate or "")
    if kind is not None:
        return f"{kind}: {_as_option(primary, options or {})}"
    if exc.sqlstate in NOT_INSTALLED and "runrow" in primary:
        # The schema is missing, or older than this runrow (a function it does not have yet).
        return f"{primary}: is runrow installed here? run `runrow migrate` on this database"
    if exc.sqlstate == "42501":
        hint = _privilege_hint(primary)
        if hint is not None:
            return f"{primary}: {hint}"
    return f"database error {exc.sqlstate or ''}: {primary}".replace("  ", " ")


# The argument a runrow.* function's message starts with: `cost_budget must be ...`,
# `tools[0].name must be ...`.
_LEADING_ARGUMENT = re.compile(r"[a-z_][a-z0-9_]*(?=[ \[.])")


def _as_option(primary: str, options: dict[str, str]) -> str:
    """`primary` naming the option that passed the argument it starts with (options_of_arguments):
    `--rpm must be ...`; an element of it keeps its path, after the option (`--tools-json:
    tools[0].name must be ...`). Other messages are left as they are."""
    found = _LEADING_ARGUMENT.match(primary)
    option = options.get(found.group()) if found else None
    if found is None or option is None:
        return primary
    # NULL is SQL's word for an option left out, which a command line cannot type: "--rpm must
    # be NULL or a finite number more than 0" read as if NULL were a value to pass.
    rest = primary[found.end() :].replace(" must be NULL or ", " must be ", 1)
    return option + rest if rest.startswith(" ") else f"{option}: {primary}"


def _privilege_hint(primary: str) -> str | None:
    """What to do about a 42501 (insufficient_privilege) a client command met, or None."""
    if primary == "permission denied for schema runrow":
        # As `runrow worker` and `runrow serve` say of their logins.
        return (
            "this login has no runrow role: GRANT runrow_client TO it (and runrow_auditor for "
            "`status`, `audit` and the `show` actions)"
        )
    if primary.startswith(("permission denied for view ", "permission denied for table ")):
        return "the runrow views are runrow_auditor's to read: GRANT runrow_auditor TO this login"
    if primary.endswith("belongs to another user"):
        # A conversation keeps the user it was started for; a turn or a schedule names it again.
        return "pass --user OWNER, the user the conversation was started for"
    return None


async def _connect(url: str) -> psycopg.AsyncConnection:
    try:
        return await psycopg.AsyncConnection.connect(url, autocommit=True, connect_timeout=10, **POOLER_SAFE)
    except psycopg.OperationalError as exc:
        reason = first_line(exc, "unreachable").rstrip(".")
        raise CliError(
            f"cannot connect to {where(url)}: {reason}. Set DATABASE_URL (or --database-url) "
            "to a running PostgreSQL, or run `runrow db start`"
        ) from exc
    except psycopg.ProgrammingError as exc:  # libpq could not parse it; its message quotes it
        raise CliError(
            f"the database URL does not parse: {unparsable_url_reason(exc)}. Set DATABASE_URL (or "
            "--database-url) to a PostgreSQL URL (postgresql://user@host/db; percent-encode a % "
            "in a password as %25) or a conninfo string"
        ) from exc


def _not_json_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


_UNSTORABLE = {
    Fault.NUL: "a NUL character (\\u0000), which PostgreSQL cannot store",
    Fault.SURROGATE: "a lone surrogate (\\ud800-\\udfff), which is not text",
    Fault.NOT_FINITE: "a number too large for JSON (it read as infinity)",
}


def _unstorable(value: Any) -> str | None:
    """Why jsonb cannot store value (Python's json reads NaN, 1e999 and lone surrogates), or None."""
    found = find_unstorable(value, "$")
    if found is None:
        return None
    return f"{_UNSTORABLE[found.fault]}, {'in a key of' if found.in_key else 'at'} {found.path}"


def _unreadable_json(exc: ValueError | RecursionError) -> str:
    """What json.loads could not read, in this command's terms: Python's own words for a long
    number told the user to "use sys.set_int_max_str_digits()"."""
    if isinstance(exc, RecursionError):
        return "nested too deeply"
    if "integer string conversion" in str(exc):
        return f"a number of more than {sys.get_int_max_str_digits()} digits"
    return str(exc)


def _clipped(text: str, limit: int = 80) -> str:
    """A value repeated in an error, cut to its start: a bad 50 KB --metadata was one 50 KB line."""
    return repr(text if len(text) <= limit else text[:limit] + "…")


def _json_object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text, parse_constant=_not_json_constant)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(
            f"not JSON ({exc.msg} at character {exc.pos}): {_clipped(text)}"
        ) from exc
    except (ValueError, RecursionError) as exc:
        raise argparse.ArgumentTypeError(
            f"not JSON this command can read ({_unreadable_json(exc)})"
        ) from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError('must be a JSON object, like \'{"k": "v"}\'')
    problem = _unstorable(value)
    if problem is not None:
        raise argparse.ArgumentTypeError(f"holds {problem}")
    return value


def _read_tools(path: Path) -> Any:
    try:
        value = json.loads(path.read_text(), parse_constant=_not_json_constant)
    except OSError as exc:
        raise CliError(f"cannot read --tools-json {path}: {exc.strerror}") from exc
    except json.JSONDecodeError as exc:
        raise CliError(f"--tools-json {path} is not JSON: {exc.msg} at line {exc.lineno}") from exc
    except UnicodeDecodeError as exc:
        raise CliError(f"--tools-json {path} is not UTF-8 text (byte {exc.start})") from None
    except (ValueError, RecursionError) as exc:
        raise CliError(
            f"--tools-json {path} is not JSON this command can read ({_unreadable_json(exc)})"
        ) from None
    if not isinstance(value, list):
        raise CliError(f"--tools-json {path} must hold a JSON array of tool definitions")
    problem = _unstorable(value)
    if problem is not None:
        raise CliError(f"--tools-json {path} holds {problem}")
    return value


def _wrap(text: str) -> str:
    return textwrap.fill(text, width=88)


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, Decimal):
        return format(value, "f")  # an amount as people write it: 0.0000001, not 1E-7
    if isinstance(value, dict | list):
        return json.dumps(value, default=str)
    return str(value)


def echo(line: str, stream: TextIO | None = None) -> None:
    """print() of a line holding text a model, an API or a person wrote (an error, a key, a
    name): on a terminal its control characters are shown as \\xNN, not obeyed; piped, written
    as it is (pyworker/db/terminal_text.py)."""
    stream = sys.stdout if stream is None else stream
    print(for_stream(line, stream), file=stream)


def _print_table(names: list[str], rows: list[list[str]], header: bool = True) -> None:
    """Columns padded to their widest cell. Every cell as cell_for_stream writes it: on a terminal
    an escape sequence in a cell (a run's error, an API's key error) retitled the terminal or
    cleared it, and its bytes, drawn as nothing, widened its column; a newline in a schedule's
    last error started a line of its own, outside every column; a bidi override redrew the row."""
    names = [cell_for_stream(n, sys.stdout) for n in names]
    rows = [[cell_for_stream(c, sys.stdout) for c in r] for r in rows]
    widths = [max([len(n)] + [len(r[i]) for r in rows]) for i, n in enumerate(names)]
    lines = ([names, ["-" * w for w in widths]] if header else []) + rows
    for line in lines:
        print("  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip())
