"""Support for the race tests: sessions that block on each other, and the stress worker.

A race is forced into one interleaving at a time: one session holds a row lock (an open
transaction), another session makes its call in a thread, the test waits until the server
reports that call blocked on the holder (pg_blocking_pids), then releases the holder. No
sleeps: every wait is a poll of the server's own lock table with a deadline.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.rows import dict_row
from steps_support import tool_defs

from pyworker.db.devdb import temporary_database

POLL_TIMEOUT = 15.0
Connect = Callable[..., psycopg.Connection]  # the conftest `connect` fixture


@pytest.fixture(scope="module")
def database_url(database_url: str) -> Iterator[str]:
    """Imported into a test module: a migrated database of that module's own (the conftest
    `connect` fixture then opens sessions on it), so claims and the reaper see only its runs
    and the thousands of finished runs the cost tests create bloat nobody else's tables."""
    with temporary_database(database_url, "runrow_races") as url:
        yield url


def superuser_on(database_url: str, cluster_urls: tuple[str, str]) -> str:
    """The cluster's superuser URL on this module's own database, for what only a superuser may
    do there (track_functions, session_replication_role, pg_walinspect)."""
    return make_conninfo(cluster_urls[1], dbname=conninfo_to_dict(database_url)["dbname"])


@pytest.fixture
def owner(connect: Connect) -> psycopg.Connection:
    """The observer and set-up session; every test starts with no active run at all, so a
    claim can only return what the test itself enqueued."""
    conn = connect()
    drain(conn)
    return conn


class Background:
    """One call on its own connection in a thread, observed from outside."""

    def __init__(self, conn: psycopg.Connection, call: Callable[[psycopg.Connection], Any]) -> None:
        self.conn = conn
        self.pid = conn.info.backend_pid
        self._call = call
        self._result: Any = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._result = self._call(self.conn)
        except BaseException as exc:  # handed to the test thread by result()
            self._error = exc

    @property
    def done(self) -> bool:
        return not self._thread.is_alive()

    def wait_blocked_by(self, observer: psycopg.Connection, holder: psycopg.Connection) -> None:
        """Return once the server says this call waits on a lock the holder has."""
        holder_pid = holder.info.backend_pid
        deadline = time.monotonic() + POLL_TIMEOUT
        while True:
            blocked = observer.execute(
                "SELECT %s = ANY (pg_blocking_pids(%s))", (holder_pid, self.pid)
            ).fetchone()[0]
            if blocked:
                return
            if self.done:
                self.result()  # re-raises the call's error, if any
                raise AssertionError("the call finished without ever blocking on the holder")
            if time.monotonic() > deadline:
                raise AssertionError(f"backend {self.pid} did not block on {holder_pid} in time")
            time.sleep(0.005)

    def result(self, timeout: float = POLL_TIMEOUT) -> Any:
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise AssertionError(f"backend {self.pid} is still busy after {timeout} s")
        if self._error is not None:
            raise self._error
        return self._result


def enqueue(
    conn: psycopg.Connection,
    conversation_id: uuid.UUID,
    turns: int = 1,
    max_attempts: int = 1,
    tools: Sequence[str] = (),
) -> list:
    """`turns` turns of the conversation, each offered `tools` (steps_support.tool_defs)."""
    return [
        conn.execute(
            "SELECT run_id FROM runrow.enqueue_run(%s, %s::jsonb, 'test-model', max_attempts => %s,"
            " tools => %s::jsonb)",
            (conversation_id, json.dumps(f"turn {n}"), max_attempts, tool_defs(*tools)),
        ).fetchone()[0]
        for n in range(turns)
    ]


def fill_finished(
    conn: psycopg.Connection, runs: int, batch: int = 2000, rate_limit_key: str | None = None
) -> None:
    """Enqueue, claim and finish `runs` runs through the functions themselves, so the table
    and its indexes carry a real history. Batches commit and re-analyze between them, so the
    history is measured with current statistics, as autovacuum keeps them. (The claim itself
    no longer seq-scans on stale ones: tests/test_claim_cost.py's
    test_a_session_that_claimed_on_a_new_table_...) The runs are of `rate_limit_key` if given."""
    key = "NULL" if rate_limit_key is None else "'" + rate_limit_key.replace("'", "''") + "'"
    conn.execute(
        f"""
        DO $fill$
        BEGIN
            FOR b IN 1..{-(-runs // batch)} LOOP
                PERFORM runrow.enqueue_run(gen_random_uuid(), '"history"', 'test-model',
                    rate_limit_key => {key})
                FROM generate_series(1, least({batch}, {runs} - (b - 1) * {batch}));
                LOOP
                    PERFORM 1 FROM runrow.claim_runs('filler', 1000, 30);
                    EXIT WHEN NOT FOUND;
                END LOOP;
                PERFORM runrow.finish_run(a.id, a.claim_token, 'completed')
                FROM runrow.agent_run AS a WHERE a.status = 'running';
                COMMIT;
                ANALYZE runrow.agent_run, runrow.run_event, runrow.message;
            END LOOP;
        END
        $fill$
        """
    )


def claim(conn: psycopg.Connection, max_runs: int = 1, lease_seconds: int = 30) -> list[dict]:
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(
            "SELECT * FROM runrow.claim_runs('race-test', %s, %s)", (max_runs, lease_seconds)
        ).fetchall()


def claim_one(conn: psycopg.Connection, lease_seconds: int = 30) -> dict:
    rows = claim(conn, 1, lease_seconds)
    assert len(rows) == 1, rows
    return rows[0]


def expire_lease(conn: psycopg.Connection, run_id: uuid.UUID) -> None:
    """Put a running run's lease in the past (set-up as the owner, instead of waiting)."""
    conn.execute(
        "UPDATE runrow.agent_run SET claim_expires_at = now() - interval '1 second' WHERE id = %s",
        (run_id,),
    )


def run_row(conn: psycopg.Connection, run_id: uuid.UUID) -> dict:
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute("SELECT * FROM runrow.agent_run WHERE id = %s", (run_id,)).fetchone()


def journal(conn: psycopg.Connection, run_id: uuid.UUID) -> list[tuple[int, str]]:
    return conn.execute(
        "SELECT seq, type FROM runrow.run_event WHERE run_id = %s ORDER BY seq", (run_id,)
    ).fetchall()


def drain(conn: psycopg.Connection) -> None:
    """End every active run, so the next claim sees only what the test enqueues."""
    for (conversation_id,) in conn.execute(
        "SELECT DISTINCT conversation_id FROM runrow.agent_run"
        " WHERE status IN ('queued', 'running', 'waiting')"
    ).fetchall():
        conn.execute("SELECT runrow.stop_conversation(%s)", (conversation_id,))
    for run_id, token in conn.execute(
        "SELECT id, claim_token FROM runrow.agent_run WHERE status = 'running'"
    ).fetchall():
        conn.execute("SELECT runrow.finish_run(%s, %s, 'cancelled')", (run_id, token))


def clock(conn: psycopg.Connection) -> Any:
    return conn.execute("SELECT clock_timestamp()").fetchone()[0]


def settle(conn: psycopg.Connection, timeout: float = 120) -> None:
    """Wait until no row version that is dead now can still look alive to anyone: no
    transaction anywhere in the cluster holds an xid older than now, and no session in this
    database a snapshot older than now. Tests that count buffers need it: VACUUM keeps, and an
    index scan cannot flag dead (kill_prior_tuple), a version some older snapshot may still
    see. Other databases count through xids: every snapshot's xmin is the oldest xid running
    in the whole cluster, so a transaction the other xdist worker holds open (a race test's
    blocked holder) keeps even this session's own claims from flagging anything. On a busy
    CI box that once made an empty claim read 158 buffers instead of 15."""
    (now,) = conn.execute("SELECT pg_current_xact_id()::text::bigint").fetchone()
    deadline = time.monotonic() + timeout
    while True:
        (older,) = conn.execute(
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE pid <> pg_backend_pid() AND (backend_xid::text::bigint <= %(now)s"
            " OR (datname = current_database() AND backend_xmin::text::bigint <= %(now)s))",
            {"now": now % 2**32},
        ).fetchone()
        if older == 0:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"a transaction kept an xid or snapshot older than {now} for {timeout} s")
        time.sleep(0.05)


def vacuum(conn: psycopg.Connection, *tables: str) -> None:
    """VACUUM ANALYZE `tables` once nothing older can still see their dead rows."""
    settle(conn)
    conn.execute(f"VACUUM ANALYZE {', '.join(tables)}")


def _active(conn: psycopg.Connection, conversations: list[str]) -> int:
    """How many runs of these conversations are still queued or running."""
    return conn.execute(
        "SELECT count(*) FROM runrow.agent_run"
        " WHERE conversation_id = ANY (%s::uuid[]) AND status IN ('queued', 'running')",
        (conversations,),
    ).fetchone()[0]


def stress_worker(url: str, worker_id: str, conversations: list[str], batch: int) -> list[tuple]:
    """One worker process: claim up to `batch` runs, work on each, finish each, until the
    conversations are done.

    Each record is (conversation, enqueue_seq, run, started, ended) with started read from
    the database clock after the claim committed and ended read before the finish began:
    an interval inside the time the run was really running (claim commit to finish commit),
    so two records of one conversation can overlap only if two runs really did."""
    records = []
    with psycopg.connect(url, autocommit=True) as conn:
        while True:
            rows = conn.execute(
                "SELECT run_id, claim_token, conversation_id FROM runrow.claim_runs(%s, %s, 30)",
                (worker_id, batch),
            ).fetchall()
            if not rows:
                if not _active(conn, conversations):
                    return records
                continue
            started = clock(conn)
            for run_id, token, _ in rows:
                seq = conn.execute(
                    'SELECT runrow.append_events(%s, %s, \'[{"type": "text", "text": "x"}]\')',
                    (run_id, token),
                ).fetchone()[0]
                assert seq is not None, f"{worker_id} lost {run_id} while holding it"
            for run_id, token, conversation_id in rows:
                ended = clock(conn)
                finished = conn.execute(
                    "SELECT runrow.finish_run(%s, %s, 'completed')", (run_id, token)
                ).fetchone()[0]
                assert finished, f"{worker_id} could not finish {run_id}"
                enqueue_seq = conn.execute(
                    "SELECT enqueue_seq FROM runrow.agent_run WHERE id = %s", (run_id,)
                ).fetchone()[0]
                records.append((str(conversation_id), enqueue_seq, str(run_id), started, ended))


def stress_one_call_worker(url: str, worker_id: str, conversations: list[str], batch: int) -> list[tuple]:
    """stress_worker's loop through finish_and_claim_runs: each call ends the runs in hand and
    claims the next ones, in a transaction committed once the rows are in hand. Records as
    stress_worker's: started read after the claiming call committed, ended before the call
    that ends the run began."""
    records = []
    held: list[tuple] = []
    with psycopg.connect(url, autocommit=True) as conn:
        while True:
            acks = json.dumps(
                [{"run_id": str(r), "claim_token": str(t), "status": "completed"} for r, t, _, _ in held]
            )
            ended = clock(conn)
            with conn.transaction():
                rows = conn.execute(
                    "SELECT run_id, finished, claim_token, conversation_id"
                    " FROM runrow.finish_and_claim_runs(%s, %s, %s, 30)",
                    (acks, worker_id, batch),
                ).fetchall()
            finished = {run_id: ok for run_id, ok, _, _ in rows if ok is not None}
            for run_id, _, conversation_id, started in held:
                assert finished.get(run_id), f"{worker_id} could not finish {run_id}"
                enqueue_seq = conn.execute(
                    "SELECT enqueue_seq FROM runrow.agent_run WHERE id = %s", (run_id,)
                ).fetchone()[0]
                records.append((str(conversation_id), enqueue_seq, str(run_id), started, ended))
            started = clock(conn)
            held = [(r, t, c, started) for r, ok, t, c in rows if ok is None]
            for run_id, token, _, _ in held:
                seq = conn.execute(
                    'SELECT runrow.append_events(%s, %s, \'[{"type": "text", "text": "x"}]\')',
                    (run_id, token),
                ).fetchone()[0]
                assert seq is not None, f"{worker_id} lost {run_id} while holding it"
            if not held:
                if not _active(conn, conversations):
                    return records


def tool_turn(
    conn: psycopg.Connection, run: dict, tool: str = "send_wire", args: str = '{"eur": 100}'
) -> str:
    """Journal a model turn asking for one tool call; return the call's idempotency key."""
    payload = f'[{{"type": "tool_use", "id": "tu_1", "name": "{tool}", "input": {args}}}]'
    seq = conn.execute(
        "SELECT runrow.append_step(%s, %s, 'model_turn', %s::json)",
        (run["run_id"], run["claim_token"], payload),
    ).fetchone()[0]
    return conn.execute(
        "SELECT runrow.tool_call_key(%s, %s, 'tu_1', %s, %s::jsonb)", (run["run_id"], seq, tool, args)
    ).fetchone()[0]


def begin_irreversible(conn: psycopg.Connection, run: dict, key: str) -> str | None:
    """begin_tool_call of an irreversible call: parks the run for a person (needs_approval)."""
    row = conn.execute(
        "SELECT state FROM runrow.begin_tool_call(%s, %s, %s, 'send_wire', '{\"eur\": 100}', 'irreversible')",
        (run["run_id"], run["claim_token"], key),
    ).fetchone()
    return None if row is None else row[0]
