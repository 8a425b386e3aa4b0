"""A step or a journal row costs the same whatever the length of its run and whatever the
planner's statistics say about runs.

The guard triggers of agent_step and run_event look up the run's last seq on every insert
(invariant 4). Written as `max(seq)`, that lookup has two plans: the backward index probe that
reads one entry, and an aggregate over every entry of the run. The planner picks the aggregate
whenever it expects about one row per run, which is what a fleet of one-step chat turns teaches
ANALYZE; from then on every step of a long agent run read all the run's earlier steps (and their
heap tuples, while the visibility map lags): quadratic in the run's length. Found by
bench.api_calls: one more column on agent_step changed the width-based estimate of the
never-analyzed table, flipped the plan, and cost +315,000 instructions per append_step at 300
steps.

Counted, not timed: entries the table's indexes returned inside one call
(pg_stat_get_xact_tuples_returned, this backend's exact counter within its transaction). The
statistics are pinned with `n_distinct = -1` (every run_id its own), which a DBA can also set,
so the test does not depend on what ANALYZE's sample happens to see.
"""

from __future__ import annotations

import json
import uuid

import psycopg
import pytest
from lookup_cost_support import one_step_history, rows_read
from race_support import Connect, claim_one, database_url, enqueue, owner

__all__ = ["database_url", "owner"]  # fixtures: this module's own database, the observer

TURN = json.dumps([{"type": "text", "text": "a step"}])
EVENT = json.dumps([{"type": "text_delta", "text": "a word"}])
SHORT, LONG = 10, 300


@pytest.mark.parametrize(
    ("table", "append"),
    [
        (
            "agent_step",
            f"SELECT runrow.append_step(%s, %s, 'model_turn', '{TURN}'::json)",
        ),
        ("run_event", f"SELECT runrow.append_events(%s, %s, '{EVENT}'::jsonb)"),
    ],
)
def test_the_last_seq_lookup_reads_one_entry_however_long_the_run(
    owner: psycopg.Connection, connect: Connect, table: str, append: str
) -> None:
    # The statistics of a fleet of one-step turns, gathered before this run began (as
    # autovacuum's last ANALYZE would have): about one row per run.
    owner.execute(f"ALTER TABLE runrow.{table} ALTER COLUMN run_id SET (n_distinct = -1)")
    one_step_history(owner)
    enqueue(owner, uuid.uuid4())
    run = claim_one(owner, lease_seconds=600)
    params = (run["run_id"], run["claim_token"])
    cost = {}
    written = 0
    for length in (SHORT, LONG):
        for _ in range(length - written):
            owner.execute(append, params)
        written = length
        # A new session each time: plans made afresh, as a restarted worker's would be.
        with connect() as session:
            cost[length] = rows_read(session, table, append, params)
    print(
        f"{table}: (index entries, rows seq-scanned) per append:"
        f" {cost[SHORT]} at {SHORT} rows, {cost[LONG]} at {LONG}"
    )
    # Before the fix, agent_step's guard: the aggregate read every entry of the run, (13, 0) at
    # 10 steps and (303, 0) at 300.
    # After: a handful of point lookups (the guard's, append_step's look at the run's last
    # model turn).
    assert cost[LONG] == cost[SHORT]
    entries, scanned = cost[LONG]
    assert entries <= 5 and scanned == 0


def test_a_fork_at_an_early_step_reads_what_it_copies_however_long_the_source(
    owner: psycopg.Connection, connect: Connect
) -> None:
    """fork_run checks at_seq against the source's last seq: max(seq) read every step of the
    source under the same statistics, to copy one."""
    owner.execute("ALTER TABLE runrow.agent_step ALTER COLUMN run_id SET (n_distinct = -1)")
    one_step_history(owner)
    enqueue(owner, uuid.uuid4())
    run = claim_one(owner, lease_seconds=600)
    append = f"SELECT runrow.append_step(%s, %s, 'model_turn', '{TURN}'::json)"
    fork = "SELECT steps_copied FROM runrow.fork_run(%s, 1)"
    cost = {}
    written = 0
    for length in (SHORT, LONG):
        for _ in range(length - written):
            owner.execute(append, (run["run_id"], run["claim_token"]))
        written = length
        with connect() as session:
            cost[length] = rows_read(session, "agent_step", fork, (run["run_id"],))
    print(f"agent_step: (index entries, rows seq-scanned) per fork at step 1: {cost}")
    # Before the fix: (11, 0) at 10 steps and (301, 0) at 300.
    assert cost[LONG] == cost[SHORT]
    entries, scanned = cost[LONG]
    assert entries <= 5 and scanned == 0
