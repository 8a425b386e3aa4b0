"""runrow.audit() and the DBA views over a whole database, and what they cost.

pgtap/audit.sql breaks each invariant inside one rolled-back transaction and filters the
audit to its own runs. Here a private database holds only this module's runs, so the
whole-database answer is checked: zero rows after a healthy workload driven through the
functions in separate committed transactions on the real clock, and sql/dba.sql runs as
the auditor. The cost test loads a history of finished runs and counts the sequential
scans the audit and the views make: none, so polling them costs the same with 1 k or
1 M finished runs.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import uuid
from collections.abc import Iterator
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest
from stats_support import flushed
from steps_support import tool_defs

from pyworker.db.devdb import temporary_database
from pyworker.db.paths import SQL_DIR

TABLES = ("agent_run", "message", "run_event", "agent_step", "tool_effect")
VIEWS = ("queue_health", "run_stats", "run_attempts", "open_tool_effects")
HISTORY = 20_000


@pytest.fixture(scope="module")
def audit_db(database_url: str) -> Iterator[str]:
    """A migrated database holding only this module's runs (dropped once the tests'
    sessions, superuser ones included, have gone: drop_database waits for them)."""
    with temporary_database(database_url, "runrow_audit") as url:
        yield url


def as_superuser(superuser_url: str, database: str) -> str:
    return urlunsplit(urlsplit(superuser_url)._replace(path=urlsplit(database).path))


def enqueue(
    conn: psycopg.Connection, max_attempts: int = 1, conversation: uuid.UUID | None = None
) -> uuid.UUID:
    # Every run is offered the one tool this file calls (begin_tool_call runs only offered tools).
    return conn.execute(
        "SELECT run_id FROM runrow.enqueue_run(%s, '\"hi\"', 'test-model', max_attempts => %s,"
        " tools => %s::jsonb)",
        (conversation or uuid.uuid4(), max_attempts, tool_defs("send_email")),
    ).fetchone()[0]


def claim(conn: psycopg.Connection, run_id: uuid.UUID) -> uuid.UUID:
    row = conn.execute("SELECT run_id, claim_token FROM runrow.claim_run('audit-test', 30)").fetchone()
    assert row is not None and row[0] == run_id, f"expected to claim {run_id}, got {row}"
    return row[1]


def tool_turn(conn: psycopg.Connection, run_id: uuid.UUID, token: uuid.UUID, tool_use: str) -> str:
    """A model turn with one tool_use; returns the call's idempotency key."""
    args = {"to": "a@example.com"}
    block = [{"type": "tool_use", "id": tool_use, "name": "send_email", "input": args}]
    step = conn.execute(
        "SELECT runrow.append_step(%s, %s, 'model_turn', %s::json)", (run_id, token, json.dumps(block))
    ).fetchone()[0]
    return conn.execute(
        "SELECT runrow.tool_call_key(%s, %s, %s, 'send_email', %s::jsonb)",
        (run_id, step, tool_use, json.dumps(args)),
    ).fetchone()[0]


def begin(conn: psycopg.Connection, run_id: uuid.UUID, token: uuid.UUID, key: str, effect: str) -> str:
    return conn.execute(
        "SELECT state FROM runrow.begin_tool_call(%s, %s, %s, 'send_email',"
        ' \'{"to": "a@example.com"}\', %s)',
        (run_id, token, key, effect),
    ).fetchone()[0]


def finish(conn: psycopg.Connection, run_id: uuid.UUID, token: uuid.UUID, status: str = "completed") -> None:
    assert conn.execute("SELECT runrow.finish_run(%s, %s, %s)", (run_id, token, status)).fetchone()[0]


def healthy_workload(conn: psycopg.Connection) -> dict[str, uuid.UUID]:
    """Every path a run takes, each step its own committed transaction."""
    runs: dict[str, uuid.UUID] = {}
    # claim, heartbeat, append events and a step, finish
    runs["plain"] = run = enqueue(conn)
    token = claim(conn, run)
    conn.execute("SELECT runrow.heartbeat(%s, %s, 30)", (run, token))
    conn.execute(
        'SELECT runrow.append_events(%s, %s, \'[{"type": "text_delta", "text": "hi"}]\')', (run, token)
    )
    conn.execute(
        'SELECT runrow.append_step(%s, %s, \'model_turn\', \'[{"type": "text", "text": "hi"}]\')',
        (run, token),
    )
    finish(conn, run, token)
    # a non_idempotent tool call recorded
    runs["tool"] = run = enqueue(conn)
    token = claim(conn, run)
    key = tool_turn(conn, run, token, "toolu_1")
    assert begin(conn, run, token, key, "non_idempotent") == "execute"
    conn.execute("SELECT runrow.complete_tool_call(%s, %s, %s, '\"sent\"')", (run, token, key))
    finish(conn, run, token)
    # an approval, then the approved call runs
    runs["approved"] = run = enqueue(conn, max_attempts=2)
    token = claim(conn, run)
    key = tool_turn(conn, run, token, "toolu_2")
    assert begin(conn, run, token, key, "irreversible") == "needs_approval"
    conn.execute("SELECT runrow.resolve_approval(%s, true, 'ops@example.com')", (key,))
    token = claim(conn, run)
    assert begin(conn, run, token, key, "irreversible") == "approved"
    conn.execute("SELECT runrow.complete_tool_call(%s, %s, %s, '\"sent\"')", (run, token, key))
    finish(conn, run, token)
    # released with attempts left, claimed again, failed; a person retries, then cancels
    runs["released"] = run = enqueue(conn, max_attempts=2)
    token = claim(conn, run)
    assert (
        conn.execute("SELECT runrow.release_run(%s, %s, 'draining')", (run, token)).fetchone()[0]
        == "requeued"
    )
    token = claim(conn, run)
    finish(conn, run, token, "failed")
    runs["retry"] = retry = conn.execute("SELECT runrow.retry_run(%s)", (run,)).fetchone()[0]
    conn.execute("SELECT runrow.cancel_run(%s)", (retry,))
    # journals of everything ended so far trimmed whole
    assert conn.execute("SELECT runrow.trim_journal('0 seconds')").fetchone()[0] > 0
    # live: parked on an approval; running with the next turn queued behind it
    runs["waiting"] = run = enqueue(conn, max_attempts=2)
    token = claim(conn, run)
    assert begin(conn, run, token, tool_turn(conn, run, token, "toolu_3"), "irreversible") == "needs_approval"
    conversation = uuid.uuid4()
    runs["running"] = run = enqueue(conn, conversation=conversation)
    claim(conn, run)
    runs["queued"] = enqueue(conn, conversation=conversation)
    return runs


def test_whole_database_audit_is_empty_after_a_healthy_workload(audit_db: str, superuser_url: str) -> None:
    with psycopg.connect(audit_db, autocommit=True) as conn:
        runs = healthy_workload(conn)
        statuses = dict(
            conn.execute("SELECT id, status FROM runrow.agent_run WHERE id = ANY(%s)", (list(runs.values()),))
        )
        assert sorted(statuses.values()) == sorted(
            ["completed", "completed", "completed", "failed", "cancelled", "waiting", "running", "queued"]
        )
        assert conn.execute("SELECT * FROM runrow.audit()").fetchall() == []
        assert conn.execute("SELECT * FROM runrow.audit(history_window => '100 years')").fetchall() == []

    # Not vacuous: the same whole-database query sees a break (rolled back).
    with psycopg.connect(as_superuser(superuser_url, audit_db)) as su:
        su.execute("SET LOCAL session_replication_role = replica")
        su.execute("DELETE FROM runrow.agent_step WHERE run_id = %s AND seq = 1", (runs["tool"],))
        su.execute("SET LOCAL session_replication_role = origin")
        assert su.execute("SELECT invariant, run_id FROM runrow.audit()").fetchall() == [
            ("step_seq_gap", runs["tool"])
        ]
        su.rollback()


def test_dba_sql_runs_as_the_auditor(audit_db: str, superuser_url: str) -> None:
    env = {**os.environ, "PGOPTIONS": "-c role=runrow_auditor"}
    done = subprocess.run(
        [
            "psql",
            as_superuser(superuser_url, audit_db),
            "-X",
            "-q",
            "-v",
            "ON_ERROR_STOP=1",
            "-f",
            str(SQL_DIR / "dba.sql"),
        ],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "queue_health" not in done.stderr
    assert "leases_expiring_soon" in done.stdout


def load_history(superuser: psycopg.Connection, runs: int) -> None:
    """`runs` finished runs (30 days old: outside every window) with a journal, a tool call
    and its result, written in bulk as the superuser with triggers skipped: the shape of
    real history, minus the minutes it takes to make it through the functions."""
    superuser.execute("SET session_replication_role = replica")
    prompt = superuser.execute("SELECT runrow._pin_prompt(NULL, '[]')").fetchone()[0]
    superuser.execute(
        "CREATE TEMP TABLE h AS SELECT gen_random_uuid() AS run, gen_random_uuid() AS msg,"
        " gen_random_uuid() AS conv, now() - interval '30 days' - g * interval '1 second' AS t"
        " FROM generate_series(1, %s) AS g",
        (runs,),
    )
    superuser.execute("INSERT INTO runrow.conversation (id, created_at) SELECT conv, t FROM h")
    superuser.execute(
        "INSERT INTO runrow.message (id, conversation_id, content, created_at)"
        " SELECT msg, conv, '\"old\"', t FROM h"
    )
    superuser.execute(
        """
        INSERT INTO runrow.agent_run (
            id, conversation_id, user_message_id, status, attempt, model, prompt_id, worker_id,
            created_at, started_at, finished_at, updated_at)
        SELECT run, conv, msg, 'completed', 1, 'test-model', %s, 'old',
               t, t, t + interval '1 minute', t + interval '1 minute'
        FROM h
        """,
        (prompt,),
    )
    superuser.execute(
        """
        INSERT INTO runrow.run_event (run_id, seq, type, payload, created_at)
        SELECT run, e.s, e.ty, jsonb_build_object('type', e.ty), t
        FROM h CROSS JOIN LATERAL (
            VALUES (1, 'run_queued'), (2, 'run_claimed'), (3, 'text_delta'), (4, 'complete')) AS e (s, ty)
        """
    )
    superuser.execute(
        """
        INSERT INTO runrow.agent_step (run_id, seq, kind, payload, tool_use_id, attempt, created_at)
        SELECT run, 1, 'model_turn',
               '[{"type": "tool_use", "id": "toolu_1", "name": "send_email", "input": {}}]'::json, NULL, 1, t
        FROM h
        UNION ALL
        -- tool_use_id is derived by the insert trigger, which this bulk load skips.
        SELECT run, 2, 'tool_result',
               '{"type": "tool_result", "tool_use_id": "toolu_1", "content": "ok"}'::json, 'toolu_1', 1, t
        FROM h
        """
    )
    superuser.execute(
        """
        INSERT INTO runrow.tool_effect (
            idempotency_key, run_id, step_seq, tool_use_id, tool, args, effect, state, result, is_error,
            result_step_seq, attempt, started_attempt, started_at, created_at, updated_at, completed_at)
        SELECT encode(sha256(convert_to(run::text, 'UTF8')), 'hex'), run, 1, 'toolu_1', 'send_email', '{}',
               'non_idempotent', 'done', '"ok"', false, 2, 1, 1, t, t, t, t
        FROM h
        """
    )
    superuser.execute("RESET session_replication_role")
    superuser.execute(
        "ANALYZE runrow.agent_run, runrow.message, runrow.run_event, runrow.agent_step, runrow.tool_effect"
    )


def seq_scans(conn: psycopg.Connection) -> dict[str, int]:
    conn.execute("SELECT pg_stat_clear_snapshot()")  # read afresh, as stats_support.counter does
    return dict(
        conn.execute(
            "SELECT relname, seq_scan FROM pg_stat_user_tables"
            " WHERE schemaname = 'runrow' AND relname = ANY(%s)",
            (list(TABLES),),
        ).fetchall()
    )


def scans_made_by(
    conn: psycopg.Connection, observer: psycopg.Connection, sql: str
) -> tuple[dict[str, int], float]:
    """Sequential scans of the runrow tables that `sql` made, from the statistics the
    backend flushes (forced) before it reports ready, and the seconds `sql` took."""
    before = seq_scans(observer)
    started = time.perf_counter()
    conn.execute(sql).fetchall()
    took = time.perf_counter() - started
    flushed(conn)
    after = seq_scans(observer)
    return {t: after[t] - before[t] for t in TABLES if after[t] != before[t]}, took


def test_audit_and_views_read_no_table_by_sequential_scan(audit_db: str, superuser_url: str) -> None:
    su_url = as_superuser(superuser_url, audit_db)
    with psycopg.connect(su_url, autocommit=True) as su:
        if su.execute("SELECT count(*) FROM runrow.agent_run").fetchone()[0] < HISTORY:
            load_history(su, HISTORY)
    with (
        psycopg.connect(su_url, autocommit=True) as conn,
        psycopg.connect(su_url, autocommit=True) as observer,
    ):
        conn.execute("SET ROLE runrow_auditor")
        # The measure works: a query no index serves is seen.
        assert scans_made_by(conn, observer, "SELECT 1 FROM runrow.agent_run WHERE error = 'none such'")[
            0
        ] == {"agent_run": 1}
        timings = {}
        for sql in ["SELECT * FROM runrow.audit()"] + [f"SELECT * FROM runrow.{v}" for v in VIEWS]:
            scans, timings[sql] = scans_made_by(conn, observer, sql)
            assert scans == {}, sql
        # The full-history audit is the documented exception: it reads every run's journal
        # and steps (through their primary keys, run by run).
        full, took = scans_made_by(
            conn, observer, "SELECT * FROM runrow.audit(history_window => '100 years')"
        )
        timings["full-history audit"] = took
        print({k: f"{v * 1000:.1f} ms" for k, v in timings.items()}, "full-history audit seq scans:", full)
