"""Typed async wrappers of the fleet-limit functions (SPEC "Fleet scheduling") and the views
the `runrow limits` / `runrow budget` commands show. Same rules as pyworker/db/api.py: only
`runrow.*` functions with named arguments, and documented views."""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from typing import Any
from uuid import UUID

from psycopg import AsyncConnection
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from pyworker.db import nul


@dataclass(frozen=True)
class Slot:
    """acquire_model_call's answer. granted, or wait `wait_seconds` because of `reason`
    (rate_limited, blocked) — or budget_exhausted: the run has been ended in SQL."""

    granted: bool
    wait_seconds: float | None
    reason: str | None


async def acquire_model_call(
    conn: AsyncConnection, run_id: UUID, claim_token: UUID, input_tokens_estimate: int
) -> Slot | None:
    """None when fenced out (the run is no longer this claim's): nothing was granted."""
    cur = await conn.execute(
        "SELECT granted, wait_seconds, reason FROM runrow.acquire_model_call("
        "run_id => %s, claim_token => %s, input_tokens_estimate => %s)",
        (run_id, claim_token, input_tokens_estimate),
    )
    row = await cur.fetchone()
    if row is None:
        return None
    return Slot(bool(row[0]), None if row[1] is None else float(row[1]), row[2])


async def report_rate_limited(
    conn: AsyncConnection, run_id: UUID, claim_token: UUID, retry_after_seconds: float
) -> None:
    await conn.execute(
        "SELECT runrow.report_rate_limited(run_id => %s, claim_token => %s, retry_after_seconds => %s)",
        (run_id, claim_token, Decimal(str(round(retry_after_seconds, 3)))),
    )


async def report_rate_limit_exhausted(
    conn: AsyncConnection,
    run_id: UUID,
    claim_token: UUID,
    reset_in_seconds: float,
    requests_limit: int | None = None,
) -> None:
    """`requests_limit`: the header's, when stated (a key without a limit of its own is paced
    after the block); at most an integer column's range (the pace lasts a minute at most)."""
    await conn.execute(
        "SELECT runrow.report_rate_limit_exhausted(run_id => %s, claim_token => %s, reset_in_seconds => %s, "
        "requests_limit => %s)",
        (
            run_id,
            claim_token,
            Decimal(str(round(min(60.0, max(0.001, reset_in_seconds)), 3))),
            None if not requests_limit or requests_limit < 1 else min(requests_limit, 2_147_483_647),
        ),
    )


async def report_key_error(
    conn: AsyncConnection,
    run_id: UUID,
    claim_token: UUID,
    error: str,
    first_block_seconds: float,
    max_block_seconds: float,
    own_request_possible: bool = False,
    give_up_after_seconds: float = 3600.0,
) -> float | None:
    """Seconds until the key may be asked again; None when fenced out (nothing written) or when
    the database ended the run failed: with own_request_possible, refused again after the key
    answered a request sent since the run's last key error (the error is the request's own)."""
    cur = await conn.execute(
        "SELECT runrow.report_key_error(run_id => %s, claim_token => %s, error => %s, "
        "first_block_seconds => %s, max_block_seconds => %s, own_request_possible => %s, "
        "give_up_after_seconds => %s)",
        (
            run_id,
            claim_token,
            (nul.printable(error) or "key error")[:1000],
            Decimal(str(round(first_block_seconds, 3))),
            Decimal(str(round(max_block_seconds, 3))),
            own_request_possible,
            Decimal(str(round(give_up_after_seconds, 3))),
        ),
    )
    row = await cur.fetchone()
    return None if row is None or row[0] is None else float(row[0])


async def record_usage(conn: AsyncConnection, run_id: UUID, claim_token: UUID, usage: dict[str, Any]) -> bool:
    """False when fenced out (nothing written)."""
    cur = await conn.execute(
        "SELECT runrow.record_usage(run_id => %s, claim_token => %s, usage => %s)",
        (run_id, claim_token, Jsonb(usage)),
    )
    row = await cur.fetchone()
    return bool(row and row[0])


_RATE_LIMIT_SETTERS = {
    "set": "SELECT runrow.set_rate_limit(rate_limit_key => %s, requests_per_minute => %s, "
    "input_tokens_per_minute => %s, output_tokens_per_minute => %s)",
    "update": "SELECT runrow.update_rate_limit(rate_limit_key => %s, requests_per_minute => %s, "
    "input_tokens_per_minute => %s, output_tokens_per_minute => %s)",
}


async def set_rate_limit(
    conn: AsyncConnection,
    rate_limit_key: str,
    requests_per_minute: int | None,
    input_tokens_per_minute: int | None,
    output_tokens_per_minute: int | None,
    *,
    keep_unset: bool = False,
) -> None:
    """The key's limits, None being "not limited" (all None removes the key). keep_unset
    (update_rate_limit): one left None keeps its current value instead, atomically."""
    await conn.execute(
        _RATE_LIMIT_SETTERS["update" if keep_unset else "set"],
        (rate_limit_key, requests_per_minute, input_tokens_per_minute, output_tokens_per_minute),
    )


async def set_tenant_budget(
    conn: AsyncConnection, fairness_key: str, tokens_per_day: int | None, cost_per_day: Decimal | None
) -> None:
    await conn.execute(
        "SELECT runrow.set_tenant_budget(fairness_key => %s, tokens_per_day => %s, cost_per_day => %s)",
        (fairness_key, tokens_per_day, cost_per_day),
    )


async def update_tenant_budget(
    conn: AsyncConnection, fairness_key: str, tokens_per_day: int | None, cost_per_day: Decimal | None
) -> None:
    """The budgets given replace the tenant's; one left None keeps its current value, atomically."""
    await conn.execute(
        "SELECT runrow.update_tenant_budget(fairness_key => %s, tokens_per_day => %s, cost_per_day => %s)",
        (fairness_key, tokens_per_day, cost_per_day),
    )


async def set_model_price(
    conn: AsyncConnection,
    model: str,
    input_per_mtok: Decimal | None,
    output_per_mtok: Decimal | None,
    cache_write_per_mtok: Decimal | None,
    cache_read_per_mtok: Decimal | None,
    cache_write_1h_per_mtok: Decimal | None = None,
    *,
    web_search_per_request: Decimal | None = None,
    web_fetch_per_request: Decimal | None = None,
) -> None:
    """cache_write_1h_per_mtok None: twice the input price (the API's rule); web_search_per_request
    None: 0.01 USD (the documented 10 USD per 1,000 searches); web_fetch_per_request None: 0. Each
    optional one is named only when given, so the call works on a schema from before it (0071,
    0076) too."""
    names = ["model", "input_per_mtok", "output_per_mtok", "cache_write_per_mtok", "cache_read_per_mtok"]
    values: list[Any] = [model, input_per_mtok, output_per_mtok, cache_write_per_mtok, cache_read_per_mtok]
    optional = {
        "cache_write_1h_per_mtok": cache_write_1h_per_mtok,
        "web_search_per_request": web_search_per_request,
        "web_fetch_per_request": web_fetch_per_request,
    }
    for name, value in optional.items():
        if value is not None:
            names.append(name)
            values.append(value)
    # Only the names above reach the SQL text.
    arguments = ", ".join(f"{name} => %s" for name in names)
    await conn.execute(f"SELECT runrow.set_model_price({arguments})", values)


async def set_concurrency_limit(conn: AsyncConnection, concurrency_key: str, max_running: int | None) -> None:
    await conn.execute(
        "SELECT runrow.set_concurrency_limit(concurrency_key => %s, max_running => %s)",
        (concurrency_key, max_running),
    )


async def set_fairness_weight(conn: AsyncConnection, fairness_key: str | None, weight: float | None) -> None:
    await conn.execute(
        "SELECT runrow.set_fairness_weight(fairness_key => %s, weight => %s)", (fairness_key, weight)
    )


# The documented views the CLI shows, and the order of their rows.
VIEWS = {
    "concurrency_limits": "concurrency_key",
    "queue_by_tenant": "priority DESC, fairness_key NULLS FIRST",
    "delayed_runs": "not_before",
    "rate_limits": "rate_limit_key",
    "rate_limit_blocks": "blocked_until",
    "runs_in_backoff": "not_before",
    "tenant_budgets": "fairness_key",
    "tenants_over_budget": "fairness_key",
    "model_prices": "model",
    "spend_by_tenant": "cost DESC, tokens DESC",
    "spend_by_model": "cost DESC",
    "spend_by_run": "spent_cost DESC, spent_tokens DESC",
}


# The documented views with one row per key, and their key column.
KEYED_VIEWS = {
    "rate_limits": "rate_limit_key",
    "tenant_budgets": "fairness_key",
    "concurrency_limits": "concurrency_key",
}


async def view_row(conn: AsyncConnection, view: str, key: str) -> dict[str, Any] | None:
    """The row of `key` in a keyed view (KEYED_VIEWS), or None when the key has none."""
    column = KEYED_VIEWS[view]  # only the names above reach the SQL text
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(f"SELECT * FROM runrow.{view} WHERE {column} = %s", (key,))
        return await cur.fetchone()


async def view_rows(conn: AsyncConnection, view: str, limit: int = 100) -> list[dict[str, Any]]:
    order = VIEWS[view]  # only the names above reach the SQL text
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(f"SELECT * FROM runrow.{view} ORDER BY {order} LIMIT %s", (limit,))
        return await cur.fetchall()
