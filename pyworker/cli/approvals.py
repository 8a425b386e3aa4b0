"""`runrow approvals`, `runrow approve KEY`, `runrow reject KEY`: the person in the loop.

An irreversible tool call parks its run as `waiting` until a person decides; a call that began
and has no result (an irreversible one a crash hit mid-effect, or a non_idempotent or irreversible
one a stop cut short) comes back `uncertain` and waits for a person too. Both are listed by the
`runrow.pending_approvals` view; a decision goes through `runrow.resolve_approval`, which records
who decided and requeues the run.
"""

from __future__ import annotations

import argparse
import getpass
import json
import os
import sys

import psycopg

from pyworker.cli.client import CliError, _command, _connect
from pyworker.db import steps as steps_api
from pyworker.db.config import database_url
from pyworker.db.terminal_text import cell_for_stream, unhidden

REASONS = {
    "needs_approval": "not run yet",
    # An irreversible call begun again, or a non_idempotent or irreversible one cut short.
    "uncertain": "began and has no result: it may have happened",
}


async def cmd_approvals(args: argparse.Namespace) -> int:
    async with await _connect(database_url(args.database_url)) as conn:
        pending = await steps_api.pending_approvals(conn)
    if args.json:
        for p in pending:
            print(
                json.dumps(
                    {
                        "idempotency_key": p.idempotency_key,
                        "reason": p.reason,
                        "run_id": str(p.run_id),
                        "conversation_id": str(p.conversation_id),
                        "tool": p.tool,
                        "args": p.args,
                        "effect": p.effect,
                        "waiting_since": p.waiting_since.isoformat(),
                    }
                )
            )
        return 0
    if not pending:
        print("nothing waits for a decision")
        return 0
    for p in pending:
        print("\n".join(describe(p)))
    print(f"{len(pending)} waiting. Decide with: runrow approve KEY | runrow reject KEY [--note TEXT]")
    return 0


def describe(p: steps_api.PendingApproval) -> list[str]:
    """The lines `runrow approvals` prints for one pending call. The arguments are what the
    person decides on, and the model wrote them: `{"cmd": "echo safe \\u202e; fr- mr"}` drew as
    `echo safe -rf ; rm`, so such characters are shown as \\uXXXX escapes (as the chat page's
    approval card does; json.dumps escapes C0 already). The key and the tool's name are shown as
    a table's cells are, on a terminal."""
    args = unhidden(json.dumps(p.args, ensure_ascii=False))
    key, tool = (cell_for_stream(text, sys.stdout) for text in (p.idempotency_key, p.tool))
    return [
        f"{key}  {p.reason}: {p.effect}, {REASONS.get(p.reason, p.reason)}",
        f"    run {p.run_id}  tool {tool}  args {args}",
        f"    waiting since {p.waiting_since:%Y-%m-%d %H:%M:%S %Z}",
    ]


async def _decide(args: argparse.Namespace, approved: bool) -> int:
    # An explicit --by "" used to fall back to the login name: a decision recorded for someone
    # who did not make it.
    by = args.by if args.by is not None else _default_person()
    if not by.strip():
        raise CliError("--by must name the person deciding, not be empty")
    async with await _connect(database_url(args.database_url)) as conn:
        try:
            run_id = await steps_api.resolve_approval(conn, args.key, approved, by, args.note)
        except psycopg.errors.NoDataFound as exc:
            raise CliError(f"no tool call has idempotency key {args.key}") from exc
    print(f"{'approved' if approved else 'rejected'} by {by}; run {run_id} requeued")
    return 0


async def cmd_approve(args: argparse.Namespace) -> int:
    return await _decide(args, True)


async def cmd_reject(args: argparse.Namespace) -> int:
    return await _decide(args, False)


def _default_person() -> str:
    """Asked only when a decision is made without --by: a process whose uid has no login name (a
    container run as an arbitrary uid) made getuser() raise while every command built its parser."""
    person = os.environ.get("RUNROW_PERSON")
    if person:
        return person
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        raise CliError(
            "no login name to record as who decided: pass --by NAME or set RUNROW_PERSON"
        ) from None


def add_commands(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = _command(
        sub,
        "approvals",
        cmd_approvals,
        help="list tool calls waiting for a person (approvals and uncertain intents)",
        description="Every tool call that waits for a decision: needs_approval (an irreversible "
        "call, not run yet) or uncertain (it began and has no result: an irreversible call a crash "
        "hit mid-effect, or a non_idempotent or irreversible call a stop cut short; it may have "
        "happened). Decide with `runrow approve KEY` or `runrow reject KEY`.",
        epilog="examples:\n  runrow approvals\n  runrow approvals --json | jq -r .idempotency_key",
    )
    p.add_argument("--json", action="store_true", help="one JSON object per line")

    for name, command, meaning in (
        ("approve", cmd_approve, "run it (for an uncertain call: it did not happen, run it)"),
        ("reject", cmd_reject, "do not run it; the model is told the call was rejected"),
    ):
        p = _command(
            sub,
            name,
            command,
            help=f"{name} a waiting tool call: {meaning}",
            description=f"{name.capitalize()} the tool call with this idempotency key: {meaning}. "
            "Records who decided and requeues the run.",
            epilog=f"example:\n  runrow {name} 3f9a...c2 --by alice --note "
            + ('"checked the amount"' if name == "approve" else '"not today"'),
        )
        p.add_argument("key", help="the idempotency key `runrow approvals` shows")
        p.add_argument("--by", help="who decides (default: $RUNROW_PERSON or the login name)")
        p.add_argument("--note", help="why; reaches the worker (and the model, for a rejection)")
