"""`runrow concurrency` and `runrow fairness`: the claim's caps and shares (SPEC "Fleet
scheduling"). They call runrow.set_concurrency_limit / set_fairness_weight and read the
documented views; a bad value is refused by the database with a message naming the argument
(exit 2), and nothing is changed."""

from __future__ import annotations

import argparse
from typing import Any

from pyworker.cli import json_output
from pyworker.cli.client import _action, _command, _connect, echo, options_of_arguments
from pyworker.cli.limits import _show
from pyworker.cli.types import number
from pyworker.db import limits as limits_api
from pyworker.db.config import database_url

CONCURRENCY_EPILOG = """how it works:
  A run enqueued with a concurrency_key (enqueue_run(concurrency_key => ...), never over HTTP)
  is claimed only while fewer than the key's limit of its runs are running or waiting. The
  database enforces it for every worker at once (a trigger on the claim); a key with no limit
  is not capped. Runs already running are never stopped: lowering a limit holds new claims
  until enough of them end. 0 pauses the key.

examples:
  runrow concurrency set crm-api 5        # at most 5 runs of crm-api at once, fleet-wide
  runrow concurrency set crm-api 0        # pause it
  runrow concurrency remove crm-api       # no cap
  runrow concurrency show                 # limits, running or waiting, queued"""

FAIRNESS_EPILOG = """how it works:
  Within a priority level the claim serves tenants (fairness_key; by default the run's user id)
  by weighted fair share: a tenant of weight 2 is claimed twice as often as one of weight 1
  while both have claimable runs, so a tenant with a deep backlog cannot starve the others.

examples:
  runrow fairness weight acme 3           # acme gets three shares
  runrow fairness weight acme --reset     # back to 1, every tenant's default
  runrow fairness show                    # queued and delayed runs per priority and tenant"""


def add_commands(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = _command(
        sub,
        "concurrency",
        cmd_concurrency,
        help="fleet-wide caps on runs running at once per concurrency key: set, remove, show",
        description="How many runs of a concurrency key may run (or wait for approval) at once, "
        "across every worker of the fleet.",
        epilog=CONCURRENCY_EPILOG,
    )
    actions = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    s = _action(actions, "set", help="cap a key (0 pauses it)", example="runrow concurrency set crm-api 5")
    s.add_argument("key", help="the concurrency key runs were enqueued with")
    s.add_argument(
        "max_running", type=number(int, 0, 100000), help="runs running or waiting at once (0 to 100000)"
    )
    r = _action(actions, "remove", help="remove a key's cap", example="runrow concurrency remove crm-api")
    r.add_argument("key")
    json_output.add_json_flag(
        _action(
            actions,
            "show",
            help="limits with their running-or-waiting and queued runs",
            example="runrow concurrency show --json | jq .concurrency_limits",
        )
    )

    p = _command(
        sub,
        "fairness",
        cmd_fairness,
        help="tenants' shares of the claim: weight, show",
        description="Weights of the claim's weighted fair share between tenants (fairness keys) "
        "within a priority level, and the queue per tenant.",
        epilog=FAIRNESS_EPILOG,
    )
    actions = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    w = _action(
        actions,
        "weight",
        help="set a tenant's weight (0.001 to 1000)",
        example="runrow fairness weight acme 3",
    )
    w.add_argument("tenant", metavar="TENANT", help="the fairness key (by default the run's user id)")
    group = w.add_mutually_exclusive_group(required=True)
    group.add_argument("weight", metavar="WEIGHT", nargs="?", type=float, help="shares, e.g. 2 or 0.5")
    group.add_argument("--reset", action="store_true", help="back to 1, the default")
    options_of_arguments(w, {"fairness_key": "TENANT", "weight": "WEIGHT"})
    json_output.add_json_flag(
        _action(
            actions,
            "show",
            help="queued and delayed runs per priority level and tenant",
            example="runrow fairness show --json | jq .queue_by_tenant",
        )
    )


async def cmd_concurrency(args: argparse.Namespace) -> int:
    async with await _connect(database_url(args.database_url)) as conn:
        if args.action == "set":
            await limits_api.set_concurrency_limit(conn, args.key, args.max_running)
            echo(f"concurrency limit of {args.key} set to {args.max_running}")
        elif args.action == "remove":
            await limits_api.set_concurrency_limit(conn, args.key, None)
            echo(f"concurrency limit of {args.key} removed")
        else:
            doc: dict[str, Any] | None = {} if args.json else None
            await _show(conn, "concurrency limits", "concurrency_limits", into=doc)
            if doc is not None:
                json_output.emit(doc)
    return 0


async def cmd_fairness(args: argparse.Namespace) -> int:
    async with await _connect(database_url(args.database_url)) as conn:
        if args.action == "weight":
            weight = None if args.reset else args.weight
            await limits_api.set_fairness_weight(conn, args.tenant, weight)
            done = "reset to 1" if weight is None else f"set to {weight:g}"
            echo(f"weight of tenant {args.tenant} {done}")
        else:
            doc: dict[str, Any] | None = {} if args.json else None
            await _show(conn, "queue per priority and tenant", "queue_by_tenant", into=doc)
            await _show(conn, "delayed runs", "delayed_runs", into=doc)
            if doc is not None:
                json_output.emit(doc)
    return 0
