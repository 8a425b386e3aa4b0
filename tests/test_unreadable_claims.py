"""A queued run whose metadata Python cannot read (enqueued before enqueue_run refused such JSON)
ends failed once, and the runs claimed with it and behind it go on (pyworker/db/claimed_json.py).

Before, psycopg's loader raised inside the claim after the database had granted it: the claim
rolled back, the run stayed at the head of the queue, and no worker claimed anything again."""

from __future__ import annotations

import psycopg
from worker_support import (
    db,
    enqueue_echo,
    run_row,
    start_worker,
    wait_status,
    worker_db,
    worker_db_superuser,
)

__all__ = ["db", "start_worker", "worker_db", "worker_db_superuser"]

DEEP = "[" * 1500 + "]" * 1500


def test_a_run_nobody_can_read_fails_once_and_the_queue_goes_on(
    db, worker_db_superuser, start_worker
) -> None:
    big, deep = enqueue_echo(db, "big number", duration=0), enqueue_echo(db, "deep", duration=0)
    behind = [enqueue_echo(db, f"fine {i}", duration=0) for i in range(3)]
    with psycopg.connect(worker_db_superuser, autocommit=True) as su:
        # What enqueue_run took before it refused such values (the table still holds them).
        su.execute(
            "UPDATE runrow.agent_run SET metadata = metadata || '{\"n\": 1e5000}' WHERE id = %s", (big,)
        )
        su.execute(
            "UPDATE runrow.agent_run SET metadata = metadata || jsonb_build_object('d', %s::jsonb)"
            " WHERE id = %s",
            (DEEP, deep),
        )

    start_worker("reader", "--concurrency", "4", "--poll", "0.2")
    for run in behind:
        assert wait_status(db, run, {"completed", "failed", "dead"}, timeout=20) == "completed"
    for run, why in ((big, "ValueError"), (deep, "RecursionError")):
        row = run_row(db, run)
        assert row["status"] == "failed" and row["attempt"] == 1, row
        assert row["error"].startswith("the run's metadata cannot be read as JSON (" + why), row["error"]
