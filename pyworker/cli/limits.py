"""`runrow limits` and `runrow budget`: set and show the fleet's rate limits, budgets and prices
(SPEC "Fleet scheduling"). They call runrow.update_rate_limit / set_rate_limit /
update_tenant_budget / set_tenant_budget / set_model_price and read the documented views; a bad
value is refused by the database with a message naming the argument (exit 2), and nothing is
changed."""

from __future__ import annotations

import argparse
from typing import Any

from psycopg import AsyncConnection

from pyworker.cli import json_output
from pyworker.cli.client import (
    CliError,
    _action,
    _cell,
    _command,
    _connect,
    _print_table,
    echo,
    options_of_arguments,
)
from pyworker.cli.types import int32, int64, usd
from pyworker.db import limits as limits_api
from pyworker.db.config import database_url

LIMITS_EPILOG = """how it works:
  Each run draws from the rate-limit key it was enqueued with (default: its model). Before
  every model request a worker asks the database (acquire_model_call); the buckets below
  refill with the database clock, at most a minute's worth. A 429 from the API blocks the key
  for every worker until its retry-after has passed (shown under "blocks").

examples:
  runrow limits set claude-sonnet-4-5 --rpm 50 --input-tpm 30000 --output-tpm 8000
  runrow limits set claude-sonnet-4-5 --rpm 80   # the key's token limits stay as they were
  runrow limits set org-key-2 --rpm 1000         # a key runs name with enqueue_run(rate_limit_key)
  runrow limits remove org-key-2                 # no limit (and no block) for the key
  runrow limits show                             # limits, bucket levels, blocks, runs in backoff
  runrow limits show --json | jq '.rate_limit_blocks[].rate_limit_key'   # one JSON document"""

BUDGET_EPILOG = """how it works:
  A run's token_budget / cost_budget (enqueue_run) and its tenant's daily budget (the
  fairness_key, by default the user id, over the last 24 hours) are settled with each step's
  real usage, and with the usage of responses that were billed but not stored (cut or stopped
  mid-stream). Once spent, the run's next model request is refused and the run ends failed
  with "budget_exhausted: ...", keeping its text so far. Costs need a price per model.

examples:
  runrow budget price claude-sonnet-4-5 --input 3 --output 15 --cache-write 3.75 --cache-read 0.3
  runrow budget price claude-x --input 3 --output 15 --cache-write 3.75 --cache-read 0.3 --web-search 0.01
  runrow budget tenant acme --tokens-per-day 2000000 --cost-per-day 25
  runrow budget tenant acme --cost-per-day 30    # acme's tokens per day stay 2000000
  runrow budget remove-tenant acme
  runrow budget show                             # budgets, spend per tenant and model, prices
  runrow budget show --json | jq -r '.spend_by_tenant[].cost'   # money as exact decimal strings"""


def add_commands(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = _command(
        sub,
        "limits",
        cmd_limits,
        help="fleet-wide model rate limits: set, remove, show",
        description="Requests, uncached input tokens and output tokens per minute per "
        "rate-limit key, shared by every worker of the fleet through the database.",
        epilog=LIMITS_EPILOG,
    )
    actions = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    s = _action(
        actions,
        "set",
        help="set a key's limits; an option left out keeps the key's current limit (none for a new "
        "key: not limited); to lift one limit, `limits remove` the key and set the others again",
        example="runrow limits set claude-sonnet-4-5 --rpm 50 --input-tpm 30000 --output-tpm 8000",
    )
    s.add_argument(
        "key", metavar="KEY", help="the rate-limit key: a model name, or a key runs name at enqueue"
    )
    s.add_argument("--rpm", type=int32, help="requests per minute (more than 0)")
    s.add_argument("--input-tpm", type=int32, help="uncached input tokens per minute (more than 0)")
    s.add_argument("--output-tpm", type=int32, help="output tokens per minute (more than 0)")
    options_of_arguments(
        s,
        {
            "rate_limit_key": "KEY",
            "requests_per_minute": "--rpm",
            "input_tokens_per_minute": "--input-tpm",
            "output_tokens_per_minute": "--output-tpm",
        },
    )
    r = _action(
        actions,
        "remove",
        help="remove a key's limits and any block on it",
        example="runrow limits remove org-key-2",
    )
    r.add_argument("key")
    json_output.add_json_flag(
        _action(
            actions,
            "show",
            help="limits, bucket levels, blocks and runs not due yet (start_in, or a retry_in backoff)",
            example="watch -n 5 runrow limits show",
        )
    )

    p = _command(
        sub,
        "budget",
        cmd_budget,
        help="token and cost budgets: tenant budgets, model prices, spend",
        description="Per-tenant daily budgets, the price table costs are computed with, and what "
        "was spent per tenant, model and run.",
        epilog=BUDGET_EPILOG,
    )
    actions = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    t = _action(
        actions,
        "tenant",
        help="set a tenant's budget over a rolling day; an option left out keeps the tenant's current "
        "budget for it (none for a new tenant: not limited); to lift one, `budget remove-tenant` "
        "and set the other again",
        example="runrow budget tenant acme --tokens-per-day 2000000 --cost-per-day 25",
    )
    t.add_argument("tenant", metavar="TENANT", help="the fairness key (by default the run's user id)")
    t.add_argument("--tokens-per-day", type=int64, help="input + output + cache tokens (more than 0)")
    t.add_argument("--cost-per-day", type=usd, help="USD (more than 0)")
    options_of_arguments(
        t, {"fairness_key": "TENANT", "tokens_per_day": "--tokens-per-day", "cost_per_day": "--cost-per-day"}
    )
    r = _action(
        actions, "remove-tenant", help="remove a tenant's budget", example="runrow budget remove-tenant acme"
    )
    r.add_argument("tenant", metavar="TENANT")
    options_of_arguments(r, {"fairness_key": "TENANT"})
    pr = _action(
        actions,
        "price",
        help="set a model's price in USD per million tokens",
        example="runrow budget price claude-sonnet-4-5 --input 3 --output 15 "
        "--cache-write 3.75 --cache-read 0.3",
    )
    pr.add_argument("model")
    for flag in ("--input", "--output", "--cache-write", "--cache-read"):
        pr.add_argument(flag, type=usd, required=True, help="USD per million tokens (0 or more)")
    pr.add_argument(
        "--cache-write-1h",
        type=usd,
        help="USD per million cache-write tokens with the 1-hour TTL (default: 2 x --input, the API's rule)",
    )
    pr.add_argument(
        "--web-search",
        type=usd,
        help="USD per web search (usage.server_tool_use.web_search_requests), on top of its tokens "
        "(default: 0.01, the documented 10 USD per 1,000 searches; 0: not priced)",
    )
    pr.add_argument(
        "--web-fetch",
        type=usd,
        help="USD per web fetch (usage.server_tool_use.web_fetch_requests), on top of its tokens "
        "(default: 0, no fee beyond the tokens)",
    )
    options_of_arguments(
        pr,
        {
            "input_per_mtok": "--input",
            "output_per_mtok": "--output",
            "cache_write_per_mtok": "--cache-write",
            "cache_read_per_mtok": "--cache-read",
            "cache_write_1h_per_mtok": "--cache-write-1h",
            "web_search_per_request": "--web-search",
            "web_fetch_per_request": "--web-fetch",
        },
    )
    r = _action(
        actions, "remove-price", help="remove a model's price", example="runrow budget remove-price claude-x"
    )
    r.add_argument("model")
    json_output.add_json_flag(
        _action(
            actions,
            "show",
            help="tenant budgets, spend per tenant and model, prices, top runs",
            example="runrow budget show --json",
        )
    )


async def cmd_limits(args: argparse.Namespace) -> int:
    async with await _connect(database_url(args.database_url)) as conn:
        if args.action == "set":
            if args.rpm is None and args.input_tpm is None and args.output_tpm is None:
                raise CliError(
                    "give at least one of --rpm, --input-tpm, --output-tpm (or use `limits remove`)"
                )
            # In SQL, not read here and set whole: a change of another limit committed between
            # the read and the write was overwritten with the value read.
            await limits_api.set_rate_limit(
                conn, args.key, args.rpm, args.input_tpm, args.output_tpm, keep_unset=True
            )
            echo(f"rate limit of {args.key} set")
            await _show_row(
                conn,
                "rate_limits",
                args.key,
                ["requests_per_minute", "input_tokens_per_minute", "output_tokens_per_minute"],
            )
        elif args.action == "remove":
            await limits_api.set_rate_limit(conn, args.key, None, None, None)
            echo(f"rate limit of {args.key} removed")
        else:
            doc: dict[str, Any] | None = {} if args.json else None
            await _show(conn, "limits", "rate_limits", into=doc)
            await _show(conn, "blocks", "rate_limit_blocks", into=doc)
            await _show(conn, "runs in backoff", "runs_in_backoff", into=doc)
            if doc is not None:
                json_output.emit(doc)
    return 0


async def cmd_budget(args: argparse.Namespace) -> int:
    async with await _connect(database_url(args.database_url)) as conn:
        if args.action == "tenant":
            if args.tokens_per_day is None and args.cost_per_day is None:
                raise CliError("give --tokens-per-day or --cost-per-day (or use `budget remove-tenant`)")
            # In SQL, not read here and set whole: a change of the other budget committed between
            # the read and the write was overwritten with the value read.
            await limits_api.update_tenant_budget(conn, args.tenant, args.tokens_per_day, args.cost_per_day)
            echo(f"budget of tenant {args.tenant} set")
            await _show_row(conn, "tenant_budgets", args.tenant, ["tokens_per_day", "cost_per_day"])
        elif args.action == "remove-tenant":
            await limits_api.set_tenant_budget(conn, args.tenant, None, None)
            echo(f"budget of tenant {args.tenant} removed")
        elif args.action == "price":
            await limits_api.set_model_price(
                conn,
                args.model,
                args.input,
                args.output,
                args.cache_write,
                args.cache_read,
                args.cache_write_1h,
                web_search_per_request=args.web_search,
                web_fetch_per_request=args.web_fetch,
            )
            echo(f"price of {args.model} set")
        elif args.action == "remove-price":
            await limits_api.set_model_price(conn, args.model, None, None, None, None)
            echo(f"price of {args.model} removed")
        else:
            doc: dict[str, Any] | None = {} if args.json else None
            await _show(conn, "tenant budgets", "tenant_budgets", into=doc)
            await _show(conn, "spend per tenant (rolling day)", "spend_by_tenant", into=doc)
            await _show(conn, "spend per model (rolling day)", "spend_by_model", into=doc)
            await _show(
                conn, "prices (USD per million tokens; server tools per request)", "model_prices", into=doc
            )
            await _show(conn, "top runs by spend", "spend_by_run", limit=10, into=doc)
            if doc is not None:
                json_output.emit(doc)
    return 0


async def _show_row(conn: AsyncConnection[Any], view: str, key: str, columns: list[str]) -> None:
    """The key's row of `view` as it now is: its key and `columns`."""
    row = await limits_api.view_row(conn, view, key)
    if row is not None:
        names = [limits_api.KEYED_VIEWS[view], *columns]
        _print_table(names, [[_cell(row[n]) for n in names]])


async def _show(
    conn: AsyncConnection[Any], title: str, view: str, limit: int = 100, into: dict[str, Any] | None = None
) -> None:
    """The rows of `view` as a titled table; with `into` (--json), as into[view], a list of objects."""
    rows = await limits_api.view_rows(conn, view, limit)
    if into is not None:
        into[view] = [json_output.row(r) for r in rows]
        return
    print(f"{title}:")
    if not rows:
        print("  (none)\n")
        return
    names = list(rows[0])
    _print_table(names, [[_cell(r[n]) for n in names] for r in rows])
    print()


# Names listed at most, then "(+K more)": the counts come from queue_metrics, so a long list is
# never fetched (runs_in_backoff read up to 100,000 rows to count them, and the other two lines
# stopped at 100 names without saying so).
SHOWN = 10


async def fleet_facts(conn: AsyncConnection[Any]) -> dict[str, Any]:
    """The fleet limits in force: three counts, and at most SHOWN blocks and tenants over budget."""
    cur = await conn.execute(
        "SELECT rate_limit_keys_blocked, queued_not_due, tenants_over_budget FROM runrow.queue_metrics"
    )
    row = await cur.fetchone()
    blocked, not_due, over_budget = row if row is not None else (0, 0, 0)
    return {
        "rate_limit_keys_blocked": blocked,
        "runs_in_backoff": not_due,
        "tenants_over_budget": over_budget,
        "rate_limit_blocks": await limits_api.view_rows(conn, "rate_limit_blocks", SHOWN) if blocked else [],
        "tenants": await limits_api.view_rows(conn, "tenants_over_budget", SHOWN) if over_budget else [],
    }


def fleet_summary(facts: dict[str, Any]) -> list[tuple[str, Any]]:
    """The fleet-limit lines of `runrow status`."""
    return [
        (
            "rate_limit_keys_blocked",
            _some([_block_line(b) for b in facts["rate_limit_blocks"]], facts["rate_limit_keys_blocked"]),
        ),
        ("runs_in_backoff", facts["runs_in_backoff"]),
        (
            "tenants_over_budget",
            _some([str(t["fairness_key"]) for t in facts["tenants"]], facts["tenants_over_budget"]),
        ),
    ]


def fleet_json(facts: dict[str, Any]) -> dict[str, Any]:
    """The fleet limits as `runrow status --json` gives them: the counts, the blocks listed (at
    most SHOWN, rows of rate_limit_blocks) and the names of the tenants over budget (as many)."""
    return {
        **{k: facts[k] for k in ("rate_limit_keys_blocked", "runs_in_backoff", "tenants_over_budget")},
        "rate_limit_blocks": [json_output.row(b) for b in facts["rate_limit_blocks"]],
        "tenants_over_budget_names": [str(t["fairness_key"]) for t in facts["tenants"]],
    }


def _block_line(block: dict[str, Any]) -> str:
    """A blocked key and the time left; for an API key or account error, the API's message and
    how many blocks in a row it has lasted: the operator's cue to fix the key or the account."""
    line = f"{block['rate_limit_key']} ({block['time_left']}"
    if block.get("key_error"):
        line += f"; KEY ERROR x{block.get('key_errors')}: {block['key_error']}"
    return line + ")"


def _some(names: list[str], count: int) -> str | int:
    """Up to SHOWN names, then how many more; 0 when there are none."""
    if not count:
        return 0
    more = count - len(names)
    return ", ".join(names) + (f" (+{more} more)" if more > 0 else "")
