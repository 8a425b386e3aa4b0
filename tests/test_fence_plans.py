"""The single-run fenced writes find their run by primary key, however many runs are running.

heartbeat, finish_run, release_run (and the reaper and stops, through _end_claim), the journal
and step writers (through _hold_claim) and begin_tool_call fenced on `id = run_id AND
claim_token = token AND status = 'running'`. With statistics taken while the runs were queued,
as autovacuum's are after a quiet spell, the planner found the status test satisfied by the
partial index of active turns (agent_run_one_active_per_conversation, every running and waiting
run) and scanned all of it with `id` as a filter: each heartbeat of a worker read every running
run's entry and row, 589 buffers a beat with 600 runs running, and a fleet's beats grew with
the square of its runs. A token is set exactly while the run is running (agent_run_state), so
the token alone fences and the status test went, as it went from finish_runs before
(tests/test_finish_plan.py).

Counted, not timed: pg_stat_user_indexes.idx_tup_read of that index, the entries its scans
returned, around each kind of call; the claim's own probes of the index are outside the counts.
"""

from __future__ import annotations

import psycopg
import pytest
from stats_support import agent_run_updates, counter, flushed, index_entries_read, index_scans
from steps_support import tool_defs
from worker_support import worker_db, worker_db_superuser

__all__ = ["worker_db", "worker_db_superuser"]

RUNS = 200
# RUNS fresh conversations' first turns in one statement, each offered the tool `t` that
# begin_tool_call is called with (it runs only a tool its run was enqueued with).
ENQUEUE_OFFERING_T = (
    "SELECT count(*) FROM (SELECT runrow.enqueue_run(conversation_id => gen_random_uuid(),"
    " content => '\"job\"', model => 'echo', tools => %s::jsonb) FROM generate_series(1, %s)) AS e"
)
MODEL_TURN = (
    "SELECT runrow.tool_call_key(%s, runrow.append_step(%s, %s, 'model_turn',"
    """ '[{"type": "tool_use", "id": "tu_1", "name": "t", "input": {}}]'), 'tu_1', 't', '{}')"""
)
PER_CALL = 10  # runs each kind of call is made for
CALLS = {
    "heartbeat": "SELECT owned FROM runrow.heartbeat(%s, %s, 60)",
    "append_events": """SELECT runrow.append_events(%s, %s, '[{"type": "text_delta", "text": "x"}]')""",
    # Its key names the tool_use of the run's model turn, journaled before the count.
    "begin_tool_call": "SELECT state FROM runrow.begin_tool_call(%s, %s, %s, 't', '{}', 'pure')",
    "finish_run": "SELECT runrow.finish_run(%s, %s, 'completed')",
    "release_run": "SELECT runrow.release_run(%s, %s, 'test')",
}


ACTIVE = "runrow.agent_run_one_active_per_conversation"
PKEY = "runrow.agent_run_pkey"


@pytest.fixture
def running(worker_db: str, worker_db_superuser: str):  # type: ignore[no-untyped-def]
    """RUNS runs claimed, with the statistics of a queue (taken before the claim), autovacuum
    off so they stay; yields (worker connection, observer, the claimed (run_id, token) rows)."""
    with (
        psycopg.connect(worker_db_superuser, autocommit=True) as admin,
        psycopg.connect(worker_db, autocommit=True) as conn,
    ):
        admin.execute("ALTER TABLE runrow.agent_run SET (autovacuum_enabled = false)")
        assert conn.execute(ENQUEUE_OFFERING_T, (tool_defs("t"), RUNS)).fetchone() == (RUNS,)
        admin.execute("ANALYZE runrow.agent_run")
        runs = conn.execute(
            "SELECT run_id, claim_token FROM runrow.claim_runs(worker_id => 'plan', max_runs => %s)", (RUNS,)
        ).fetchall()
        assert len(runs) == RUNS
        yield conn, admin, runs


@pytest.mark.parametrize("call", sorted(CALLS))
def test_a_fenced_write_reads_no_other_runs_entries(call: str, running) -> None:  # type: ignore[no-untyped-def]
    conn, admin, runs = running
    params = [(run_id, token) for run_id, token in runs[:PER_CALL]]
    if call == "begin_tool_call":
        params = [(r, t, conn.execute(MODEL_TURN, (r, r, t)).fetchone()[0]) for r, t in params]
    flushed(conn)
    before, updates, keyed = (
        index_entries_read(admin, ACTIVE),
        agent_run_updates(admin),
        index_scans(admin, PKEY),
    )
    for args in params:
        row = conn.execute(CALLS[call], args).fetchone()
        assert row is not None and row[0] not in (None, False), f"{call} was fenced out of its own run: {row}"
    flushed(conn)
    read = index_entries_read(admin, ACTIVE) - before
    # The counts reach the reader, and each call found its run by primary key (the lock-only
    # fences of the journal and tool-call writers update nothing, so the key's scans are their
    # control); the writes that update agent_run did.
    assert index_scans(admin, PKEY) - keyed >= PER_CALL
    if call in ("heartbeat", "finish_run", "release_run"):
        assert agent_run_updates(admin) - updates == PER_CALL
    # Before the fix: every call read all RUNS entries (2,000 for the ten calls).
    assert read == 0, f"{PER_CALL} calls of {call} read {read} entries of the active-turn index"


SPEND = (
    "SELECT count(*) FROM (SELECT runrow.enqueue_run(conversation_id => gen_random_uuid(),"
    " content => '\"job\"', model => 'echo', fairness_key => 'spender') FROM generate_series(1, %s)) AS e"
)


def queued_index_entries_read(observer: psycopg.Connection) -> int:
    return counter(
        observer,
        "SELECT sum(idx_tup_read) FROM pg_stat_user_indexes"
        " WHERE relid = 'runrow.agent_run'::regclass AND indexrelname <> 'agent_run_pkey'",
    )


def test_a_claim_fails_a_tenants_runs_over_budget_by_primary_key(
    worker_db: str, worker_db_superuser: str
) -> None:
    """_fail_queued_for_budget updated `WHERE id = run AND status = 'queued'`; with statistics of
    an empty queue the planner scanned the partial index of queued turns for it, every queued
    run's entry per run failed (1,047 buffers for one, 1,000 runs queued)."""
    with (
        psycopg.connect(worker_db_superuser, autocommit=True) as admin,
        psycopg.connect(worker_db, autocommit=True) as conn,
    ):
        admin.execute("ALTER TABLE runrow.agent_run SET (autovacuum_enabled = false)")
        admin.execute("SELECT runrow.set_tenant_budget('spender', 100, NULL)")
        assert conn.execute(SPEND, (1,)).fetchone() == (1,)
        (run_id, token) = conn.execute(
            "SELECT run_id, claim_token FROM runrow.claim_runs(worker_id => 'plan', max_runs => 1)"
        ).fetchone()
        conn.execute(
            'SELECT runrow.append_step(%s, %s, \'model_turn\', \'[{"type": "text", "text": "x"}]\','
            " NULL, '{\"input_tokens\": 150}', 'end_turn')",
            (run_id, token),
        )
        assert conn.execute("SELECT runrow.finish_run(%s, %s, 'completed')", (run_id, token)).fetchone() == (
            True,
        )
        admin.execute("ANALYZE runrow.agent_run")  # no run queued
        assert conn.execute(SPEND, (RUNS,)).fetchone() == (RUNS,)
        flushed(conn)
        before = queued_index_entries_read(admin)
        assert (
            conn.execute("SELECT * FROM runrow.claim_runs(worker_id => 'plan', max_runs => 10)").fetchall()
            == []
        )
        flushed(conn)
        read = queued_index_entries_read(admin) - before
        failed = conn.execute(
            "SELECT count(*) FROM runrow.agent_run WHERE status = 'failed' AND budget_exhausted IS NOT NULL"
        ).fetchone()[0]
        assert failed >= 1, "the claim failed none of the tenant's runs: nothing was measured"
        # The walk's own probes read a few entries per run it visits; before the fix each run
        # failed read every queued run's entry as well (RUNS per run).
        assert read < 10 * failed, f"{failed} runs failed for budget read {read} index entries"
