"""How many statements one lifecycle call runs: each is an executor start-up, the unit of a
call's cost (issue 11: about 40% of a call's backend instructions start executors, and a call of
finish_and_claim_runs runs about fifteen statements besides its per-row ones).

Counted, never timed, with auto_explain's nested statements (every executor run, the trigger's
and helpers' included) sent to this session as NOTICEs, in a superuser session (LOAD is
superuser-only; the functions are SECURITY DEFINER, so the statements are the same for any
role). An expression PL/pgSQL evaluates itself (an assignment or IF that reads no table) starts
no executor and is not listed; a PERFORM or SELECT ... INTO is.

test_lifecycle_calls.py counts the functions the same calls run; this file counts what those
functions execute.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import psycopg
import pytest
from explain_support import nested_plans
from lifecycle_support import completed
from race_support import database_url, drain, enqueue, owner, superuser_on

RUNS = 10

__all__ = ["database_url", "owner"]  # fixtures: this module's own database, the observer


@pytest.fixture
def explained(database_url: str, cluster_urls: tuple[str, str]) -> Iterator[psycopg.Connection]:
    url = superuser_on(database_url, cluster_urls)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("LOAD 'auto_explain'")
        yield conn


def statements(conn: psycopg.Connection, sql: str, params: tuple[object, ...] = ()) -> list[str]:
    """The query text of every statement one call of `sql` executes inside the call (the call
    itself not counted), in the order they end; rolled back."""
    *inside, call = (p["Query Text"] for p in nested_plans(conn, sql, params))
    assert "runrow." in call, f"the last plan is not the call's: {call}"
    return inside


def helper_scans(texts: list[str]) -> list[str]:
    """Statements that only read a runrow helper's result row (SELECT ... FROM runrow._x(...)),
    which an assignment does without an executor."""
    return [t for t in texts if "FROM runrow._" in " ".join(t.split()) and not t.lstrip().startswith("WITH")]


def test_a_batch_call_reads_its_helpers_without_statements(
    owner: psycopg.Connection, explained: psycopg.Connection
) -> None:
    for _ in range(RUNS):
        enqueue(owner, uuid.uuid4())
    runs = explained.execute(
        "SELECT run_id, claim_token FROM runrow.claim_runs('statements-probe', %s, 30)", (RUNS,)
    ).fetchall()
    assert len(runs) == RUNS
    for _ in range(RUNS):
        enqueue(owner, uuid.uuid4())
    acks = completed(runs)
    both = statements(
        explained,
        "SELECT * FROM runrow.finish_and_claim_runs(%s::jsonb, 'statements-probe', %s, 30)",
        (acks, RUNS),
    )
    finish = statements(explained, "SELECT * FROM runrow.finish_runs(%s::jsonb)", (acks,))
    claim = statements(explained, "SELECT * FROM runrow.claim_runs('statements-probe', %s, 30)", (RUNS,))
    drain(owner)
    print(f"finish_and_claim_runs {len(both)}, finish_runs {len(finish)}, claim_runs {len(claim)}")

    # The walk, its batch step and the input check are called in assignments (the functions'
    # own statements are still listed; the scan of each one's result row is not).
    assert helper_scans(both) == []
    assert helper_scans(finish) == []
    assert helper_scans(claim) == [
        "SELECT * FROM runrow._claim(claim_runs.worker_id, claim_runs.max_runs, claim_runs.lease_seconds)"
    ]
    # The journal guard's lookup, once per journal row: a run_claimed and a complete per run.
    guard = [t for t in both if "FROM runrow.run_event AS e WHERE e.run_id = NEW.run_id" in t]
    assert len(guard) == 2 * RUNS
    # The call's own statements, whatever its batch size: the input check's two (its fast pass
    # and the duplicate test), the walk's look at the queue and its batch step, the UPDATE and
    # agent_run's statement trigger's two, the wake's test and the two RETURN QUERYs.
    assert len(both) - len(guard) == 10, both


# A statement that only returns a row of values (RETURN QUERY SELECT x, y) or calls a helper that
# returns one (PERFORM helper(...)): OUT values with RETURN NEXT, or an assignment, need none.
VALUE_ONLY = (
    "SELECT true, flag",
    "SELECT new_run_id, 'queued'::text, true",
    "SELECT true, 0::numeric, NULL::text",
)
VALUE_HELPERS = ("SELECT runrow._journal(", "SELECT runrow._journal_complete(")


def test_per_run_calls_run_no_statement_for_a_value(
    owner: psycopg.Connection, explained: psycopg.Connection
) -> None:
    drain(owner)
    enqueue(owner, uuid.uuid4())  # the prompt every enqueue here pins exists from now on
    made = {
        "enqueue_run": statements(
            explained,
            "SELECT * FROM runrow.enqueue_run(%s, '\"hello\"'::jsonb, 'test-model')",
            (uuid.uuid4(),),
        )
    }
    enqueue(owner, uuid.uuid4())
    run = explained.execute(
        "SELECT run_id, claim_token FROM runrow.claim_runs('statements-probe', 1, 30)"
    ).fetchone()
    made["heartbeat"] = statements(explained, "SELECT * FROM runrow.heartbeat(%s, %s, 30)", run)
    made["acquire_model_call"] = statements(
        explained, "SELECT * FROM runrow.acquire_model_call(%s, %s, 100)", run
    )
    made["append_step"] = statements(
        explained,
        "SELECT runrow.append_step(%s, %s, 'model_turn', %s::json)",
        (*run, '[{"type": "text", "text": "hi"}]'),
    )
    made["finish_run"] = statements(explained, "SELECT runrow.finish_run(%s, %s, 'completed')", run)
    drain(owner)
    for name, texts in made.items():
        flat = [" ".join(t.split()) for t in texts]
        assert not [t for t in flat if t in VALUE_ONLY or t.startswith(VALUE_HELPERS)], (name, flat)
    enqueued = [" ".join(t.split()) for t in made["enqueue_run"]]
    # A prompt that exists is looked up, not inserted again: the INSERT evaluated prompt's CHECKs
    # (a regular expression) before finding the conflict.
    assert not [t for t in enqueued if t.startswith("INSERT INTO runrow.prompt")], enqueued
    # _lock_conversation and _wake_dispatchers are inlined into their callers' statements.
    assert not [t for t in enqueued if t.startswith(("SELECT pg_advisory_xact_lock", "SELECT pg_notify"))], (
        enqueued
    )
    # A step reads its run's last seq once: the guard numbers it (0051; the writer read it too),
    # from the key's last entry (0112; max(seq) let the planner aggregate the whole run).
    last_seq = [
        t
        for t in made["append_step"]
        if "WHERE s.run_id = NEW.run_id ORDER BY s.seq DESC" in " ".join(t.split())
    ]
    assert len(last_seq) == 1, made["append_step"]
    # A heartbeat is its UPDATE and agent_run's statement trigger's one look at the rows.
    assert len(made["heartbeat"]) == 2, made["heartbeat"]
