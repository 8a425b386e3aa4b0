"""Upgrading a database with runs in it across migration 0061 (the request snapshot moves from
agent_run's column to run_request).

A fresh database is migrated up to 0060, and runs are made there as 0060's functions made them:
the snapshot in agent_run.request_snapshot, one run trimmed as 0060's trim_journal trimmed it
(snapshot nulled, journal deleted), one ended and untrimmed, one running, one queued. Then the
rest of the migrations and the functions. Every snapshot still there moves to run_request
unchanged, the trimmed run gets none, no copy is left in agent_run, and the runs go on: the
running one ends, the queued one is claimed and ends, audit() finds nothing, and trim_journal
trims the three that had snapshots.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import psycopg
from lifecycle_support import completed

from pyworker.db.devdb import database_url_for
from pyworker.db.migrate import migrate
from pyworker.db.paths import MIGRATIONS_DIR

BEFORE = "0061"


def _enqueue_as_0060_did(conn: psycopg.Connection, content: str) -> uuid.UUID:
    """enqueue_run's writes at 0060, as the owner: conversation, message, and the run with its
    request snapshot in agent_run (no journal: nothing here reads it before the claim)."""
    conversation = uuid.uuid4()
    with conn.transaction():
        conn.execute("INSERT INTO runrow.conversation (id) VALUES (%s)", (conversation,))
        prompt = conn.execute("SELECT runrow._pin_prompt(NULL, '[]'::jsonb)").fetchone()[0]
        message = conn.execute(
            "INSERT INTO runrow.message (conversation_id, content) VALUES (%s, %s::jsonb) RETURNING id",
            (conversation, json.dumps(content)),
        ).fetchone()[0]
        return conn.execute(
            "INSERT INTO runrow.agent_run (conversation_id, user_message_id, model, prompt_id, metadata,"
            " request_snapshot) VALUES (%s, %s, 'upgrade-model', %s, '{\"k\": 1}',"
            " jsonb_build_object('content', %s::jsonb, 'metadata', '{\"k\": 1}'::jsonb)) RETURNING id",
            (conversation, message, prompt, json.dumps(content)),
        ).fetchone()[0]


def test_an_upgrade_moves_every_kept_snapshot_and_the_runs_go_on(
    scratch_database: str, superuser_url: str, tmp_path: Path
) -> None:
    up_to_0060 = tmp_path / "migrations"
    up_to_0060.mkdir()
    for path in sorted(MIGRATIONS_DIR.glob("*.sql")):
        if path.name < BEFORE:
            (up_to_0060 / path.name).symlink_to(path)
    migrate(scratch_database, migrations_dir=up_to_0060)

    with psycopg.connect(scratch_database, autocommit=True) as conn:
        trimmed, ended, running, queued = (
            _enqueue_as_0060_did(conn, name) for name in ("trimmed", "ended", "running", "queued")
        )
        claimed = conn.execute(
            "SELECT run_id, claim_token FROM runrow.claim_runs('upgrade', 3, 30) ORDER BY run_id"
        ).fetchall()
        assert {r for r, _ in claimed} == {trimmed, ended, running}
        conn.execute(
            "SELECT runrow.finish_runs(%s::jsonb)",
            (completed([c for c in claimed if c[0] in (trimmed, ended)]),),
        )
        # 0060's trim_journal: the journal deleted, the snapshot nulled (the one change a terminal
        # run allowed until 0061).
        with conn.transaction():
            conn.execute("DELETE FROM runrow.run_event WHERE run_id = %s", (trimmed,))
            conn.execute("UPDATE runrow.agent_run SET request_snapshot = NULL WHERE id = %s", (trimmed,))

    with psycopg.connect(scratch_database) as conn:
        versions = dict(conn.execute("SELECT id, ctid::text FROM runrow.agent_run").fetchall())
    migrate(scratch_database)

    superuser = database_url_for(superuser_url, psycopg.conninfo.conninfo_to_dict(scratch_database)["dbname"])
    with psycopg.connect(superuser, autocommit=True) as su:
        moved = dict(su.execute("SELECT run_id, snapshot FROM runrow.run_request").fetchall())
        assert moved == {
            run: {"content": name, "metadata": {"k": 1}}
            for run, name in ((ended, "ended"), (running, "running"), (queued, "queued"))
        }
        column = su.execute(
            "SELECT count(*) FROM pg_attribute WHERE attrelid = 'runrow.agent_run'::regclass"
            " AND attname = 'request_snapshot' AND NOT attisdropped"
        ).fetchone()[0]
        assert column == 0, "agent_run still has its request_snapshot column"
        # The runs that had a copy have a new row version, written without it before the column
        # went (a dropped column's bytes stay in a row until it is rewritten).
        after = dict(su.execute("SELECT id, ctid::text FROM runrow.agent_run").fetchall())
        assert [run for run in (ended, running, queued) if after[run] == versions[run]] == []
        assert after[trimmed] == versions[trimmed], "the trimmed run's row was written again"
        indexes = {
            name
            for (name,) in su.execute(
                "SELECT indexname FROM pg_indexes WHERE tablename = 'agent_run'"
                " AND (indexname LIKE '%%trimmed' OR indexname = 'agent_run_finished')"
            ).fetchall()
        }
        assert indexes == {"agent_run_finished"}

    with psycopg.connect(scratch_database, autocommit=True) as conn:
        token = dict(claimed)[running]
        conn.execute("SELECT runrow.finish_runs(%s::jsonb)", (completed([(running, token)]),))
        again = conn.execute(
            "SELECT run_id, claim_token FROM runrow.claim_runs('upgrade', 10, 30)"
        ).fetchall()
        assert [r for r, _ in again] == [queued]
        conn.execute("SELECT runrow.finish_runs(%s::jsonb)", (completed(again),))
        assert conn.execute("SELECT * FROM runrow.audit()").fetchall() == []
        assert conn.execute("SELECT runrow.trim_journal('0 seconds')").fetchone()[0] > 0
        assert conn.execute("SELECT count(*) FROM runrow.run_request").fetchone()[0] == 0
        statuses = dict(conn.execute("SELECT id, status FROM runrow.agent_run").fetchall())
        assert statuses == dict.fromkeys((trimmed, ended, running, queued), "completed")
