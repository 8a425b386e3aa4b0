"""budget_reserved hands the run back whatever rate_limit_max_wait says, and the run keeps its
place as its tenant's waiter while it is deferred and re-claimed.

A tenant's call that would carry its settled spend plus its calls in flight past its budget is
told to wait (acquire_model_call: budget_reserved, 15 s). The worker deferred it only because
15 s is over the default rate_limit_max_wait (10 s): with 30, it kept its lease and its slot,
polling the budget row every 15 s for as long as the other calls took to settle.
"""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
from agent_support import module_conn, module_db, one_slot_agent_worker
from worker_support import enqueue_run, run_row, wait_until

__all__ = ["module_conn", "module_db"]

TENANT = "reserved-tenant"


def enqueue(db: psycopg.Connection, text: str, max_tokens: int) -> uuid.UUID:
    return enqueue_run(db, text, "claude-reserved", user_id=TENANT, metadata={"max_tokens": max_tokens})


def deferrals(db: psycopg.Connection, run: uuid.UUID) -> list[dict[str, Any]]:
    return [
        p
        for (p,) in db.execute(
            "SELECT payload FROM runrow.run_event WHERE run_id = %s AND type = 'run_requeued' ORDER BY seq",
            (run,),
        )
    ]


def waiter(db: psycopg.Connection) -> uuid.UUID | None:
    query = "SELECT waiter_run FROM runrow.tenant_budget WHERE fairness_key = %s"
    row = db.execute(query, (TENANT,)).fetchone()
    assert row is not None
    return row[0]


def test_budget_reserved_defers_the_run_past_a_long_max_wait_and_keeps_its_place(
    module_conn: psycopg.Connection, module_db: str
) -> None:
    db = module_conn
    db.execute("SELECT runrow.set_tenant_budget(%s, 3000, NULL)", (TENANT,))
    # A call of the tenant in flight, held here: 300 estimated + 1000 max_tokens = 1300 reserved.
    held = enqueue(db, "held", 1000)
    claimed = db.execute("SELECT run_id, claim_token FROM runrow.claim_runs('test', 1, 300)").fetchone()
    assert claimed is not None and claimed[0] == held
    token = claimed[1]
    acquire = "SELECT granted FROM runrow.acquire_model_call(%s, %s, 300)"
    assert db.execute(acquire, (held, token)).fetchone() == (True,)
    # big reserves about 1800 + its estimate: 1300 + that > 3000, so it waits (the tenant's
    # waiter). small (about 1000 + its estimate) fits beside the held call, not beside the waiter.
    big = enqueue(db, "big", 1800)
    # The longest wait in place, 30 s, is longer than budget_reserved's 15 s.
    with one_slot_agent_worker(module_db, "reserved", rate_limit_max_wait=30.0) as fake:
        # Before the fix the run stayed running here for 15 s and more (waiting in place).
        wait_until(lambda: deferrals(db, big), 10, "big deferred")
        [event] = deferrals(db, big)
        assert event["deferred"] is True and event["attempt"] == 0, event
        assert run_row(db, big)["error"].startswith("budget_reserved: waiting 15.0s"), run_row(db, big)
        assert waiter(db) == big
        # The one slot is free: the worker claims the next run while big is deferred.
        small = enqueue(db, "small", 1000)
        wait_until(lambda: deferrals(db, small), 10, "small claimed and deferred")
        assert run_row(db, big)["status"] == "queued"
        assert waiter(db) == big, "a deferred waiter keeps its place: small waits behind it"
        assert not fake.requests
        # The held call settles: big, re-claimed when its wait is over, goes first.
        usage = '{"input_tokens": 100, "output_tokens": 50}'
        db.execute(
            "SELECT runrow.append_step(%s, %s, 'model_turn', %s, NULL, %s, 'end_turn')",
            (held, token, '[{"type": "text", "text": "ok"}]', usage),
        )
        wait_until(lambda: run_row(db, big)["status"] == "completed", 30, "big completed")
        wait_until(lambda: fake.requests, 5, "a request recorded")
        first = fake.requests[0].body["messages"][0]["content"]
        assert "big" in str(first), first
