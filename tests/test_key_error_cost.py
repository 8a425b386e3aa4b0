"""What a key error's reads of the key's other runs cost: the open runs, not the history.

While a key has an API key or account error, acquire_model_call asks whether another run of the
key waits for its probe (probe_elsewhere, migration 0101) and report_key_error whether its run is
the key's only open one (the lone-run rule): every ~15 s per suspect run. agent_run has no index
on rate_limit_key, so each must be read through the partial indexes of open runs; a whole-table
read costs ~100k buffers a call at a million finished runs (issue 11). Counted in sequential
scans of agent_run (pg_stat_xact_user_tables, the calling session's own transaction) and in
shared buffers (EXPLAIN ANALYZE BUFFERS), never in time.
"""

from __future__ import annotations

import psycopg
from race_support import Connect, database_url, fill_finished, owner, vacuum

__all__ = ["database_url", "owner"]  # fixtures: this module's own database, the observer

KEY = "claude-key-error-cost"
FINISHED_BASELINE = 100
# A whole-table read of agent_run touches about 100 buffers per 1000 finished runs; the open
# runs' partial indexes hold a page or two whatever the history.
FINISHED_MANY = 3_000
REFUSAL = "HTTP 403: permission_error: no access to the beta"


def seq_scans_and_buffers(conn: psycopg.Connection, call: str, params: tuple[object, ...]) -> tuple[int, int]:
    """Sequential scans of agent_run and shared buffers the function call `call` makes, in a
    transaction rolled back so nothing changes (run twice: the first plans its statements). The
    session's counts not yet flushed are in pg_stat_xact_user_tables too (none is flushed inside
    a transaction block): the difference across the call is its own."""
    scans = "SELECT seq_scan FROM pg_stat_xact_user_tables WHERE relid = 'runrow.agent_run'::regclass"
    result = (0, 0)
    for _ in range(2):
        with conn.transaction(force_rollback=True):
            (before,) = conn.execute(scans).fetchone() or (0,)
            plan = conn.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + call, params).fetchone()[0][0][
                "Plan"
            ]
            (after,) = conn.execute(scans).fetchone() or (0,)
        result = (int(after) - int(before), plan["Shared Hit Blocks"] + plan["Shared Read Blocks"])
    return result


def key_error_calls(owner: psycopg.Connection, worker: psycopg.Connection) -> dict[str, tuple[int, int]]:
    """One run of KEY refused with a 403 that may be its own request's, its key's block over:
    its acquire_model_call asks whether another run of the key waits for the probe (none: it is
    granted the probe), and, its key refusing since long ago, the probe's report_key_error asks
    whether it is the key's only open run (it is: it fails). Each measured rolled back; the grant
    is then made for real so the report reaches its rule. Runs of other keys are open beside it."""
    for _ in range(3):
        owner.execute(
            "SELECT runrow.enqueue_run(gen_random_uuid(), '\"other key\"', 'test-model',"
            " rate_limit_key => 'another-key')"
        )
    run_id = owner.execute(
        "SELECT run_id FROM runrow.enqueue_run(gen_random_uuid(), '\"suspect\"', 'test-model',"
        " rate_limit_key => %s, priority => 100)",
        (KEY,),
    ).fetchone()[0]
    (token,) = worker.execute("SELECT claim_token FROM runrow.claim_run('cost-probe', 300)").fetchone()
    assert worker.execute(
        "SELECT runrow.report_key_error(%s, %s, %s, 5, 300, true)", (run_id, token, REFUSAL)
    ).fetchone() == (5,)
    owner.execute(  # the block's time is up, and the key has refused for an hour
        "UPDATE runrow.rate_limit SET blocked_until = now(), key_error_until = now(),"
        " key_error_since = now() - interval '1 hour' WHERE rate_limit_key = %s",
        (KEY,),
    )
    owner.execute(  # and the run since then: the 403 rules measure the run's own age (0110)
        "UPDATE runrow.agent_run SET key_error_first_refused_at = now() - interval '1 hour' WHERE id = %s",
        (run_id,),
    )
    acquire = "SELECT * FROM runrow.acquire_model_call(%s, %s, 100)"
    costs = {"acquire_model_call": seq_scans_and_buffers(worker, acquire, (run_id, token))}
    assert worker.execute(acquire, (run_id, token)).fetchone() == (True, 0, None)
    report = "SELECT runrow.report_key_error(%s, %s, %s, 5, 300, true)"
    costs["report_key_error"] = seq_scans_and_buffers(worker, report, (run_id, token, REFUSAL))
    # The report reached the lone-run rule (what was measured, rolled back, was that rule's read).
    assert worker.execute(report, (run_id, token, REFUSAL)).fetchone() == (None,)
    assert owner.execute("SELECT status FROM runrow.agent_run WHERE id = %s", (run_id,)).fetchone() == (
        "failed",
    )
    owner.execute(
        "SELECT runrow.stop_conversation(conversation_id) FROM runrow.agent_run WHERE status = 'queued'"
    )
    # The key's hold after the probe would keep the next round's run from its claim.
    owner.execute("DELETE FROM runrow.rate_limit WHERE rate_limit_key = %s", (KEY,))
    return costs


def test_key_error_reads_of_the_keys_runs_do_not_grow_with_history(
    owner: psycopg.Connection, connect: Connect
) -> None:
    fill_finished(owner, FINISHED_BASELINE, rate_limit_key=KEY)
    vacuum(owner, "runrow.agent_run")
    few = key_error_calls(owner, connect())
    fill_finished(owner, FINISHED_MANY - FINISHED_BASELINE, rate_limit_key=KEY)
    vacuum(owner, "runrow.agent_run")
    many = key_error_calls(owner, connect())
    print(
        f"(seq scans, buffers) with {FINISHED_BASELINE} finished runs of the key: {few}; "
        f"with {FINISHED_MANY}: {many}"
    )
    for call, (scans, buffers) in many.items():
        # Before the fix report_key_error read the whole table: one seq scan, 73 -> 411 buffers.
        assert scans == 0, f"{call} read agent_run whole {scans} times"
        assert buffers <= few[call][1] + 25, (
            f"{call} touched {few[call][1]} buffers with {FINISHED_BASELINE} finished runs of its key, "
            f"{buffers} with {FINISHED_MANY}"
        )
