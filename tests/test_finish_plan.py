"""finish_runs finds its runs by primary key, whatever the runs ended since the last vacuum.

A run that ends leaves a dead entry in agent_run_one_active_per_conversation (the partial
unique index of running and waiting turns) until VACUUM removes it. finish_runs' UPDATE used
to test `status = 'running'` beside its claim tokens; its generic plan then ANDed that small
partial index with the primary key in a bitmap scan, and a bitmap index scan reads every
entry, dead or alive: after a 15,000-run drain each ten-run finish read 8,283 entries and 425
buffers instead of 314. The claim token alone fences (a token is set exactly while the run
is running, agent_run_claim_iff_running), so the status test went.

Counted, not timed: pg_stat_user_indexes.idx_tup_read of that index, the entries its scans
returned, with autovacuum off for agent_run so no vacuum clears them mid-test.
"""

from __future__ import annotations

import psycopg
from lifecycle_support import ENQUEUE, completed
from stats_support import agent_run_updates, flushed, index_entries_read
from worker_support import worker_db, worker_db_superuser

__all__ = ["worker_db", "worker_db_superuser"]

RUNS = 1500
BATCH = 10
CLAIM = "SELECT run_id, claim_token FROM runrow.claim_runs(worker_id => 'plan', max_runs => %s)"
FINISH = "SELECT finished FROM runrow.finish_runs(%s::jsonb)"


ACTIVE = "runrow.agent_run_one_active_per_conversation"


def test_finish_runs_reads_no_dead_entries_of_the_active_turn_index(
    worker_db: str, worker_db_superuser: str
) -> None:
    with (
        psycopg.connect(worker_db_superuser, autocommit=True) as admin,
        psycopg.connect(worker_db, autocommit=True) as conn,
    ):
        admin.execute("ALTER TABLE runrow.agent_run SET (autovacuum_enabled = false)")
        assert conn.execute(ENQUEUE, (RUNS,)).fetchone() == (RUNS,)
        admin.execute("ANALYZE runrow.agent_run")  # the statistics of a queue, as a worker would see
        finishes = 0
        read_by_finishes = 0
        updates = agent_run_updates(admin)
        while runs := conn.execute(CLAIM, (BATCH,)).fetchall():
            # The claim's own probes of the index (by conversation) are not what is counted.
            flushed(conn)
            before = index_entries_read(admin, ACTIVE)
            assert all(f for (f,) in conn.execute(FINISH, (completed(runs),)).fetchall())
            flushed(conn)
            read_by_finishes += index_entries_read(admin, ACTIVE) - before
            finishes += 1
        assert finishes == RUNS // BATCH
        # The counts do reach the reader: every run was updated twice (claimed, finished).
        assert agent_run_updates(admin) - updates >= 2 * RUNS
        # Before the fix: 4,159 entries over the 150 finishes.
        assert read_by_finishes == 0
