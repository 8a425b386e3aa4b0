"""A model request reads its own tenant's rolling day of spend, however many tenants spend.

acquire_model_call checks a budgeted tenant's spend twice per request (_budget_verdict,
_tenant_reserve), each a sum over the tenant's last 25 hours of spend_hour. Written as
`hour > now() - 25 h`, the planner read spend_hour_by_hour (hour's correlation is 1.0, so it
priced thousands of entries in heap order below a few hundred by the key) and filtered out every
other tenant: the request's cost grew with the number of tenants spending. Found by a plan audit
of the per-request paths (stop 62); the bound is now a row comparison on the key, which by_hour
cannot serve.

Counted, not timed: entries of spend_hour's indexes and rows seq-scanned inside one rolled-back
acquire_model_call (lookup_cost_support.rows_read), with 10 and 60 tenants spending on 10 models
every hour of the last 30 days, in a fresh session after ANALYZE. The rows are written
directly: spend is settled at the database's now(), and a day of history cannot wait a day.
"""

from __future__ import annotations

import uuid

import psycopg
from lookup_cost_support import rows_read
from race_support import Connect, claim_one, database_url, owner

__all__ = ["database_url", "owner"]  # fixtures: this module's own database, the observer

FEW, MANY = 10, 60
MODELS = 10
BUDGETS = 5
ACQUIRE = "SELECT granted FROM runrow.acquire_model_call(%s, %s, 100)"


def spend(conn: psycopg.Connection, tenants: int) -> None:
    """Every model of `tenants` tenants spent something in each hour of the last 30 days, the rows
    laid down hour by hour as settling writes them (hour's correlation 1.0, which is what made
    the hour index look cheap). But the hour 24 hours before this one: the rolling day then holds
    the same 24 hours if the clock's hour turns during the test."""
    conn.execute("TRUNCATE runrow.spend_hour")
    conn.execute(
        "INSERT INTO runrow.spend_hour (fairness_key, hour, model, model_calls, tokens, cost)"
        " SELECT 'tenant-' || t, date_trunc('hour', now()) - h * interval '1 hour', 'model-' || m, 1, 10, 0"
        " FROM generate_series(719, 0, -1) AS h, generate_series(0, %s::int - 1) AS t,"
        " generate_series(1, %s::int) AS m WHERE h <> 24 ORDER BY h DESC, t, m",
        (tenants, MODELS),
    )
    conn.execute("ANALYZE runrow.spend_hour")


def test_a_budgeted_request_reads_its_tenants_day_however_many_tenants_spend(
    owner: psycopg.Connection, connect: Connect
) -> None:
    owner.execute("SELECT runrow.set_tenant_budget('tenant-0', 1000000000, NULL)")
    owner.execute(
        "SELECT runrow.enqueue_run(%s, '\"hi\"', 'test-model', fairness_key => 'tenant-0')", (uuid.uuid4(),)
    )
    run = claim_one(owner, lease_seconds=600)
    cost = {}
    for tenants in (FEW, MANY):
        spend(owner, tenants)
        with connect() as session:
            cost[tenants] = rows_read(session, "spend_hour", ACQUIRE, (run["run_id"], run["claim_token"]))
    print(f"(entries of spend_hour's indexes, rows seq-scanned) per acquire_model_call: {cost}")
    # Before the fix: (4800, 0) with 10 tenants and (28800, 0) with 60: every tenant's 24 hours,
    # twice. After: the tenant's own 24 hours x 10 models, twice (480).
    assert cost[MANY] == cost[FEW]
    entries, scanned = cost[MANY]
    assert entries <= 2 * 25 * MODELS and scanned == 0


def test_the_tenant_budgets_view_reads_each_budgets_day_however_many_tenants_spend(
    owner: psycopg.Connection, connect: Connect
) -> None:
    """tenant_budgets (and queue_metrics, which counts the tenants over budget through it, on
    every metrics scrape) summed each budget's day the same way: budgets x every tenant's day."""
    for n in range(BUDGETS):
        owner.execute("SELECT runrow.set_tenant_budget(%s, 1000000000, NULL)", (f"tenant-{n}",))
    cost = {}
    for tenants in (FEW, MANY):
        spend(owner, tenants)
        with connect() as session:
            cost[tenants] = rows_read(session, "spend_hour", "SELECT * FROM runrow.queue_metrics", ())
    print(f"(entries of spend_hour's indexes, rows seq-scanned) per read of queue_metrics: {cost}")
    # Before the fix: (12000, 0) with 10 tenants and (72000, 0) with 60. After: each budget's
    # own 24 hours x 10 models (1,200).
    assert cost[MANY] == cost[FEW]
    entries, scanned = cost[MANY]
    assert entries <= BUDGETS * 25 * MODELS and scanned == 0
