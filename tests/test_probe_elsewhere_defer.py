"""probe_elsewhere hands the run back whatever rate_limit_max_wait says.

After a key error's block, a run refused with a 403 since the key's last answer leaves the key's
probe to another run of the key waiting for it (acquire_model_call: probe_elsewhere, 15 s,
migration 0101). Waiting in place, its worker kept the slot the other run may need (a
concurrency limit of one, a one-slot worker) and was refused again without end; so the worker
always defers it, as for budget_reserved.
"""

from __future__ import annotations

import uuid

import psycopg
from agent_support import module_conn, module_db, one_slot_agent_worker
from worker_support import enqueue_run, run_row, wait_until

__all__ = ["module_conn", "module_db"]

KEY = "claude-probe-elsewhere"


def enqueue(db: psycopg.Connection, text: str) -> uuid.UUID:
    return enqueue_run(db, text, KEY, rate_limit_key=KEY)


def test_probe_elsewhere_defers_the_run_past_a_long_max_wait(
    module_conn: psycopg.Connection, module_db: str
) -> None:
    db = module_conn
    refused, other = enqueue(db, "refused"), enqueue(db, "other")
    claims = dict(db.execute("SELECT run_id, claim_token FROM runrow.claim_runs('test', 2, 300)").fetchall())
    assert set(claims) == {refused, other}
    # refused's request drew a 403 (it may be its own request's): the key is blocked; other, held
    # by this test's claim, waits for the key.
    wait = db.execute(
        "SELECT runrow.report_key_error(%s, %s, "
        "'HTTP 403: permission_error: no access to the beta', 5, 300, true)",
        (refused, claims[refused]),
    ).fetchone()
    assert wait == (5,)
    db.execute(
        "SELECT runrow.defer_run(%s, %s, interval '0.001 seconds', 'key_error')", (refused, claims[refused])
    )
    db.execute(  # the block's time is up (instead of waiting 5 s)
        "UPDATE runrow.rate_limit SET blocked_until = now(), key_error_until = now() "
        "WHERE rate_limit_key = %s",
        (KEY,),
    )
    db.execute("UPDATE runrow.agent_run SET not_before = now() WHERE id = %s", (refused,))
    # The longest wait in place, 30 s, is longer than probe_elsewhere's 15 s.
    with one_slot_agent_worker(module_db, "probe", rate_limit_max_wait=30.0) as fake:
        # Before the fix the run stayed running here for 15 s and more (waiting in place).
        wait_until(
            lambda: run_row(db, refused)["error"].startswith("probe_elsewhere"), 10, "refused deferred"
        )
        row = run_row(db, refused)
        assert row["status"] == "queued" and row["error"].startswith("probe_elsewhere: waiting 15.0s"), row
        assert row["attempt"] == 0, row
        assert not fake.requests, "the run sent nothing: the probe is the other run's"
    probe = db.execute(
        "SELECT key_probe_by FROM runrow.rate_limit WHERE rate_limit_key = %s", (KEY,)
    ).fetchone()
    assert probe == (None,)
