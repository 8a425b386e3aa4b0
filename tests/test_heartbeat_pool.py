"""A handler that holds its pool connection keeps its run: heartbeats draw from a small pool of
their own, so they are never stuck behind the handlers' own queries.

With one pool for everything, every connection held by a handler's long query (here
pg_sleep for well over a lease) left the heartbeats waiting for a connection until the retry
budget (a lease) ran out: the run was given up and reaped while worker and database were
healthy (the audit: 40 runs, 114 reaps, 34 runs dead)."""

from __future__ import annotations

from agent_support import in_process_worker
from worker_support import db, enqueue_run, run_row, wait_until, worker_db

from pyworker.worker.handler import Outcome, RunContext

__all__ = ["db", "worker_db"]

LEASE = 3
HOLD = 8  # seconds a handler keeps its connection: past the heartbeat's budget of one lease
RUNS = 2


async def hold_a_connection(ctx: RunContext) -> Outcome:
    await ctx.db(lambda conn: conn.execute(f"SELECT pg_sleep({HOLD})"), "app query")
    return Outcome("completed", {"held": HOLD})


def test_handlers_holding_every_pool_connection_keep_their_runs(db, worker_db) -> None:  # type: ignore[no-untyped-def]
    runs = [enqueue_run(db, "hold", "slowdb", max_attempts=3) for _ in range(RUNS)]

    def settled() -> list[dict[str, object]] | None:
        rows = [run_row(db, run) for run in runs]
        done = all(row["status"] == "completed" for row in rows)
        retried = any(int(row["attempt"]) > 1 for row in rows)  # type: ignore[call-overload]
        return rows if done or retried else None

    with in_process_worker(
        worker_db,
        "hb-pool",
        handler=hold_a_connection,
        concurrency=RUNS,
        pool_size=RUNS,  # every work connection held by a handler
        lease_seconds=LEASE,
        grace_seconds=1,
        reap_interval=0.5,
    ):
        rows = wait_until(settled, HOLD + 15, "every run completed, or one retried")
    assert [(row["status"], row["attempt"]) for row in rows] == [("completed", 1)] * RUNS, rows
    requeued = db.execute(
        "SELECT count(*) FROM runrow.run_event WHERE run_id = ANY(%s) AND type = 'run_requeued'",
        (list(runs),),
    ).fetchone()
    assert requeued == (0,)
