"""The statements that read the journal by its key are never JIT-compiled, whatever the planner
estimates (migration 0063).

After a trim empties the journal and VACUUM runs, run_event's key keeps its pages over a handful
of rows, and the planner prices one run's lookup by that key at a share of those pages: 174,190
at 1,000,000 runs trimmed, above jit_above_cost (100,000 by default). The plan then carries JIT,
which PostgreSQL compiles on every execution, and the journal guard runs its lookup for every
journal row: bench.trim's second fill of 1,000,000 runs, which the first had written at about
1.2 s per thousand runs, wrote none of its first thousand in two minutes (gdb: LLVM emitting
code under the guard's statement).

The test makes every plan of the session qualify for JIT (jit_above_cost = 0, the estimate of
any statement being above it) and reads each statement a call executes inside it with
auto_explain's nested statements, as tests/test_lifecycle_statements.py does: the call's own
statement is compiled (JIT is on and works here), the lookups by the journal's key inside it are
not. Skipped where the server has no JIT provider (pg_jit_available()).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator

import psycopg
import pytest
from explain_support import nested_plans
from race_support import database_url, drain, enqueue, owner, superuser_on

__all__ = ["database_url", "owner"]  # fixtures: this module's own database, the observer


@pytest.fixture
def explained(database_url: str, cluster_urls: tuple[str, str]) -> Iterator[psycopg.Connection]:
    url = superuser_on(database_url, cluster_urls)
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT pg_jit_available()").fetchone()
        if not (row and row[0]):
            pytest.skip("this server has no JIT provider (llvmjit): nothing could be compiled")
        conn.execute("LOAD 'auto_explain'")
        yield conn


def plans(conn: psycopg.Connection, sql: str, params: tuple[object, ...] = ()) -> list[dict]:
    """The plan of every statement one call of `sql` executes, the call's own last, with every
    plan qualifying for JIT; the call is committed (its writes are the next call's input)."""
    return nested_plans(conn, sql, params, settings=(("jit", "on"), ("jit_above_cost", "0")), commit=True)


def journal_lookups(found: list[dict]) -> list[dict]:
    """The statements that read run_event (its key: the guard's last seq, read_events' pages,
    the wake probe's last seq), not those that only write it."""
    return [p for p in found if "FROM runrow.run_event AS e" in " ".join(p["Query Text"].split())]


def test_the_journal_is_read_by_its_key_without_jit_whatever_the_estimate(
    owner: psycopg.Connection, explained: psycopg.Connection
) -> None:
    drain(owner)
    conversations = [uuid.uuid4() for _ in range(3)]
    enqueue_sql = "SELECT * FROM runrow.enqueue_run(%s, '\"hello\"'::jsonb, 'test-model')"
    enqueued = plans(explained, enqueue_sql, (conversations[0],))
    for conversation in conversations[1:]:
        enqueue(owner, conversation)
    claimed = plans(explained, "SELECT run_id, claim_token FROM runrow.claim_runs('jit-probe', 3, 30)")
    runs = owner.execute(
        "SELECT id, claim_token FROM runrow.agent_run WHERE worker_id = 'jit-probe' ORDER BY id"
    ).fetchall()
    assert len(runs) == 3
    owner.execute("SELECT * FROM runrow.watch_runs(%s, 60)", ([r for r, _ in runs],))
    events = [{"type": "text_delta", "index": 0, "text": "hi"}]
    appended = plans(
        explained, "SELECT * FROM runrow.append_events(%s, %s, %s::jsonb)", (*runs[0], json.dumps(events))
    )
    batch = json.dumps([{"run_id": str(r), "claim_token": str(t), "events": events} for r, t in runs])
    batched = plans(explained, "SELECT * FROM runrow.append_runs_events(%s::jsonb)", (batch,))
    read = plans(explained, "SELECT * FROM runrow.read_events(%s, 0, 100)", (runs[0][0],))
    finish = json.dumps([{"run_id": str(r), "claim_token": str(t), "status": "completed"} for r, t in runs])
    finished = plans(explained, "SELECT * FROM runrow.finish_runs(%s::jsonb)", (finish,))
    trimmed = plans(explained, "SELECT runrow.trim_journal('0 seconds')")
    drain(owner)

    calls = {
        "enqueue_run": enqueued,
        "claim_runs": claimed,
        "append_events": appended,
        "append_runs_events": batched,
        "read_events": read,
        "finish_runs": finished,
        "trim_journal": trimmed,
    }
    for name, found in calls.items():
        *inside, call = found
        # JIT is on and the session's statements qualify: the call itself was compiled.
        assert "JIT" in call, f"{name}: the call's own plan was not JIT-compiled: {call}"
        lookups = journal_lookups(inside)
        compiled = [" ".join(p["Query Text"].split()) for p in lookups if "JIT" in p]
        assert compiled == [], f"{name}: journal lookups JIT-compiled: {compiled}"
    # The guard's lookup, once per journal row written: user_message_created and run_queued for
    # the enqueue, run_claimed per run, one delta, three deltas, a complete per run; the wake
    # probe of the watched runs; read_events' page.
    assert len(journal_lookups(enqueued[:-1])) == 2
    assert len(journal_lookups(claimed[:-1])) == 3
    assert len(journal_lookups(appended[:-1])) >= 1
    assert len(journal_lookups(batched[:-1])) >= 3 + 1
    assert len(journal_lookups(read[:-1])) >= 1
    assert len(journal_lookups(finished[:-1])) >= 3
    # The trim's deletes go by the key too ("DELETE FROM runrow.run_event AS e").
    deletes = [p for p in trimmed[:-1] if "DELETE FROM runrow.run_event" in p["Query Text"]]
    assert deletes and not [p for p in deletes if "JIT" in p], deletes
