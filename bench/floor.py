"""runrow's floor: the writes SPEC.md asks of a run's lifecycle, and nothing else, drained as
bench.drain drains the real thing. It prices runrow's rules against the writes they guard.

A run's lifecycle has to write four things: the claim (the run becomes running with a fresh
token, a lease, a worker and attempt + 1), its `run_claimed` journal row, the fenced ending
(completed, the claim cleared, finished_at), and its `complete` row, each journal row numbered
its run's last seq + 1. Each floor row does exactly that, a batch's endings and the next batch's
claim in one SQL statement per call (as finish_and_claim_runs does in one call), prepared and
planned once as runrow's functions plan their statements, with no rule of runrow's checked
beyond the fence and the index that keeps one running run per conversation: no turn order, no
fleet scheduling (priority, fairness, limits, delays), no input validation, no guard triggers,
no wakes. Three rungs, each adding one part of runrow back:

- narrow table: a table of the lifecycle's columns only, with its primary key, the queue's
  partial index and the one-running-run-per-conversation index; the journal keyed (run_id, seq).
- its tables, no triggers: the same statement on runrow's own agent_run and run_event (every
  column, index and CHECK), their triggers disabled in that throwaway database.
- its tables and triggers: the same, triggers on: the journal's row guard numbers each row and
  agent_run's statement trigger checks the moves, as for runrow's functions.

runrow's own row (finish_and_claim_runs) then adds the functions' logic. The steps between the
rungs say what the table, the triggers and the functions each cost per job; the narrow rung
against PgQueuer says what any layout of runrow's writes could reach on this server.

A fourth row runs the other way round: runrow's functions with the two triggers that carry the
lifecycle's rules (the journal's row guard, agent_run's statement trigger) disabled, the writers
numbering their journal rows themselves (their SQL rewritten for that database). It is the
upper bound of rules that cost nothing, as if written in C: what the functions alone cost on
runrow's tables. These rows are measurements only: nothing but runrow's functions ever writes
runrow's tables in use, and never with those triggers off.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from typing import Any

import psycopg

from pyworker.db.paths import FUNCTIONS_DIR

NARROW = "runrow floor (narrow table)"
TABLES = "runrow floor (its tables, no triggers)"
TRIGGERS = "runrow floor (its tables and triggers)"
FUNCTIONS = "runrow floor (its functions, no rule triggers)"

# The triggers that carry the lifecycle's rules, off in the FUNCTIONS rung's database.
RULE_TRIGGERS = (("runrow.run_event", "run_event_guard"), ("runrow.agent_run", "agent_run_after_update"))


def _next_seq(alias: str) -> str:
    """The next seq of the journal of run `alias`.id, looked up as a writer must without the guard."""
    return f"(SELECT max(e.seq) + 1 FROM runrow.run_event AS e WHERE e.run_id = {alias}.id)"


# The journal INSERTs of the claim and of finish_and_claim_runs leave seq NULL for the row guard
# to number. With the guard off, each takes its run's next seq plus the row's place after the
# first (every run has journal rows from its enqueue): (file, pattern, replacement), each pattern
# found exactly once.
_SELF_NUMBERED = (
    (
        "_claim.sql",
        r"SELECT cl\.id,\s+NULL,\s+'run_claimed',",
        f"SELECT cl.id, {_next_seq('cl')}, 'run_claimed',",
    ),
    (
        "finish_and_claim_runs.sql",
        r"SELECT u\.id, NULL::bigint, e\.type, e\.ev",
        f"SELECT u.id, {_next_seq('u')} + e.ord - 1, e.type, e.ev",
    ),
    # The writer's own row (run_claimed or complete) comes after the ending's events.
    ("finish_and_claim_runs.sql", r"9223372036854775807", "coalesce(jsonb_array_length(u.events), 0) + 1"),
)

_NARROW_SCHEMA = (
    "CREATE TABLE run (id bigint PRIMARY KEY, conversation_id uuid NOT NULL, status text NOT NULL,"
    " attempt int NOT NULL DEFAULT 0, claim_token uuid, claim_expires_at timestamptz, worker_id text,"
    " finished_at timestamptz, result jsonb) WITH (fillfactor = 80)",
    "CREATE INDEX run_queued ON run (id) WHERE status = 'queued'",
    "CREATE UNIQUE INDEX run_one_running_per_conversation ON run (conversation_id) WHERE status = 'running'",
    "CREATE TABLE run_event (run_id bigint NOT NULL, seq bigint NOT NULL, type text NOT NULL,"
    " payload jsonb NOT NULL, created_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (run_id, seq))",
)
_NARROW_ENQUEUE = (
    "INSERT INTO run (id, conversation_id, status) SELECT i, gen_random_uuid(), 'queued'"
    " FROM generate_series(1, %s) AS i"
)
_NARROW_QUEUED_ROWS = (
    "INSERT INTO run_event (run_id, seq, type, payload) SELECT id, 1, 'run_queued', '{}' FROM run"
)

# A batch's endings (the input's (run_id, claim_token) pairs, fenced by token and status) and
# their complete rows, then the next batch's claim and its run_claimed rows: one statement.
_NARROW_CALL = """
WITH acks AS (
    SELECT * FROM jsonb_to_recordset(%(acks)s::jsonb) AS a (run_id bigint, claim_token uuid)
),
ended AS (
    UPDATE run SET status = 'completed', claim_token = NULL, claim_expires_at = NULL,
        finished_at = now(), result = 'null'
    FROM acks
    WHERE run.id = acks.run_id AND run.claim_token = acks.claim_token AND run.status = 'running'
    RETURNING run.id
),
ended_rows AS (
    INSERT INTO run_event (run_id, seq, type, payload)
    SELECT ended.id, (SELECT max(e.seq) + 1 FROM run_event AS e WHERE e.run_id = ended.id),
           'complete', '{"type": "complete", "status": "completed"}'
    FROM ended
),
next AS (
    SELECT id FROM run WHERE status = 'queued' ORDER BY id LIMIT %(batch)s FOR UPDATE SKIP LOCKED
),
claimed AS (
    UPDATE run SET status = 'running', claim_token = gen_random_uuid(),
        claim_expires_at = now() + interval '30 seconds', worker_id = 'bench', attempt = run.attempt + 1
    FROM next WHERE run.id = next.id
    RETURNING run.id, run.claim_token, run.attempt
),
claimed_rows AS (
    INSERT INTO run_event (run_id, seq, type, payload)
    SELECT claimed.id, (SELECT max(e.seq) + 1 FROM run_event AS e WHERE e.run_id = claimed.id),
           'run_claimed',
           jsonb_build_object('type', 'run_claimed', 'worker_id', 'bench', 'attempt', claimed.attempt)
    FROM claimed
)
SELECT id, claim_token FROM claimed
"""

# The same on runrow's tables. SEQ is the journal row's seq: looked up here with the triggers
# off, left NULL for the row guard to assign with them on.
_TABLES_CALL = """
WITH acks AS (
    SELECT * FROM jsonb_to_recordset(%(acks)s::jsonb) AS a (run_id uuid, claim_token uuid)
),
ended AS (
    UPDATE runrow.agent_run AS r SET status = 'completed', claim_token = NULL, claim_expires_at = NULL,
        finished_at = now(), result = 'null', updated_at = now()
    FROM acks
    WHERE r.id = acks.run_id AND r.claim_token = acks.claim_token AND r.status = 'running'
    RETURNING r.id
),
ended_rows AS (
    INSERT INTO runrow.run_event (run_id, seq, type, payload)
    SELECT ended.id, {ended_seq}, 'complete',
           jsonb_build_object(
               'type', 'complete', 'status', 'completed', 'result', 'null'::jsonb, 'error', NULL
           )
    FROM ended
),
next AS (
    SELECT q.id FROM runrow.agent_run AS q
    WHERE q.status = 'queued' AND NOT q.claim_blocked AND q.not_before IS NULL
    ORDER BY q.priority DESC, coalesce(q.fairness_key, ''), coalesce(q.concurrency_key, ''), q.enqueue_seq
    LIMIT %(batch)s FOR UPDATE SKIP LOCKED
),
claimed AS (
    UPDATE runrow.agent_run AS r SET status = 'running', claim_token = gen_random_uuid(),
        claim_expires_at = now() + interval '30 seconds', last_heartbeat_at = now(), worker_id = 'bench',
        attempt = r.attempt + 1, started_at = coalesce(r.started_at, now()), updated_at = now()
    FROM next WHERE r.id = next.id
    RETURNING r.id, r.claim_token, r.attempt
),
claimed_rows AS (
    INSERT INTO runrow.run_event (run_id, seq, type, payload)
    SELECT claimed.id, {claimed_seq}, 'run_claimed',
           jsonb_build_object('type', 'run_claimed', 'worker_id', 'bench', 'attempt', claimed.attempt)
    FROM claimed
)
SELECT id, claim_token FROM claimed
"""


_CALLS = {
    NARROW: _NARROW_CALL,
    TABLES: _TABLES_CALL.format(ended_seq=_next_seq("ended"), claimed_seq=_next_seq("claimed")),
    TRIGGERS: _TABLES_CALL.format(ended_seq="NULL::bigint", claimed_seq="NULL::bigint"),
}


_PLANNED_ONCE = (
    "plan_cache_mode = force_generic_plan",
    "enable_seqscan = off",
    "enable_sort = off",
    "enable_hashjoin = off",
    "enable_mergejoin = off",
    "jit = off",
)


def planned_once(conn: psycopg.Connection[Any]) -> None:
    """Set the session up to plan a rung's prepared statement once, as runrow's functions plan
    their statements: a statement planned per call would price the planner's look at every
    partial index of agent_run, which runrow does not pay per call. The generic plan, sized for
    the LIMIT's default 200 rows, would hash-join the claim to a whole scan of the table; index
    lookups joined by nested loops are what a plan for ten rows does (runrow's functions pin
    enable_seqscan and enable_sort off for the same reason)."""
    for setting in _PLANNED_ONCE:
        conn.execute(f"SET {setting}")


def call(system: str) -> str:
    """The rung's statement: %(acks)s the endings as bench.drain.acks() writes them for
    finish_runs (the fields other than run_id and claim_token are not read), %(batch)s the runs
    to claim."""
    return _CALLS[system]


def tables(system: str) -> tuple[str, str]:
    """The rung's run table and journal."""
    return ("run", "run_event") if system == NARROW else ("runrow.agent_run", "runrow.run_event")


def self_numbered_functions() -> list[str]:
    """The SQL of _claim and finish_and_claim_runs as in functions/, but numbering their journal
    rows themselves, for the FUNCTIONS rung. Raises if functions/ no longer has a statement this
    rewrites, so the rung cannot quietly measure something else."""
    sources: dict[str, str] = {}
    for name, pattern, replacement in _SELF_NUMBERED:
        text = sources.get(name) or (FUNCTIONS_DIR / name).read_text()
        text, found = re.subn(pattern, lambda _match, new=replacement: new, text)
        if found != 1:
            raise RuntimeError(
                f"bench.floor: functions/{name} has {found} matches of {pattern!r}, not 1; the "
                f"'{FUNCTIONS}' rung rewrites its journal INSERT: update _SELF_NUMBERED"
            )
        sources[name] = text
    return list(sources.values())


def setup(system: str, url: str, jobs: int) -> None:
    """`jobs` runs queued, each its own conversation: in the narrow table, or by runrow's
    enqueue_run as the SQL API rows enqueue them."""
    if system == NARROW:
        with psycopg.connect(url, autocommit=True) as conn:
            for statement in _NARROW_SCHEMA:
                conn.execute(statement)
            conn.execute(_NARROW_ENQUEUE, (jobs,))
            conn.execute(_NARROW_QUEUED_ROWS)
            conn.execute("VACUUM ANALYZE")
        return
    from bench.drain import runrow_setup  # bench.drain imports this module

    runrow_setup(url, jobs)
    if system == TABLES:
        with psycopg.connect(url, autocommit=True) as conn:
            # The owner's right on its tables; USER leaves the internal (foreign-key) triggers on.
            conn.execute("ALTER TABLE runrow.agent_run DISABLE TRIGGER USER")
            conn.execute("ALTER TABLE runrow.run_event DISABLE TRIGGER USER")
    if system == FUNCTIONS:
        with psycopg.connect(url, autocommit=True) as conn:
            for sql in self_numbered_functions():
                conn.execute(sql)
            for table, trigger in RULE_TRIGGERS:
                conn.execute(f"ALTER TABLE {table} DISABLE TRIGGER {trigger}")


def functions_worker(url: str, batch: int, ready: Callable[[], None]) -> int:
    """The FUNCTIONS rung's worker: the one-call row's, finish_and_claim_runs chained."""
    from bench.drain import runrow_one_call_worker  # bench.drain imports this module

    return runrow_one_call_worker(url, batch, ready)


def worker(system: str, url: str, batch: int, ready: Callable[[], None]) -> int:
    """Chain the floor statement as the one-call row chains finish_and_claim_runs: each call a
    transaction that ends the last batch and claims the next, the statement prepared once."""
    from bench.drain import acks  # bench.drain imports this module

    done = 0
    with psycopg.connect(url, autocommit=True) as conn:
        planned_once(conn)
        ready()
        claimed: list[tuple[Any, Any]] = []
        while True:
            with conn.transaction():
                params = {"acks": acks(claimed), "batch": batch}
                rows = conn.execute(call(system), params, prepare=True).fetchall()
            done += len(claimed)
            if not rows and not claimed:
                return done
            claimed = rows


def check(system: str, url: str, jobs: int) -> None:
    """Every run completed, claimed once, its journal numbered 1..n without a gap, with one
    run_claimed and one complete."""
    run, event = tables(system)
    with psycopg.connect(url) as conn:
        row = conn.execute(
            f"SELECT count(*), count(*) FILTER (WHERE r.status = 'completed' AND r.attempt = 1"
            f" AND j.n = j.last AND j.claims = 1 AND j.completes = 1)"
            f" FROM {run} AS r JOIN LATERAL (SELECT count(*) AS n, max(e.seq) AS last,"
            f" count(*) FILTER (WHERE e.type = 'run_claimed') AS claims,"
            f" count(*) FILTER (WHERE e.type = 'complete') AS completes"
            f" FROM {event} AS e WHERE e.run_id = r.id) AS j ON true"
        ).fetchone()
    assert row == (jobs, jobs), f"{system}: {row[1]} of {row[0]} runs completed once with a whole journal"


def systems() -> dict[str, tuple[Callable[[str, int], None], Any, Callable[[str, int], None]]]:
    """The four rows as bench.drain systems (setup, worker, check); partials of module-level
    functions, so the drain's spawned processes can take them."""
    rows: dict[str, tuple[Callable[[str, int], None], Any, Callable[[str, int], None]]] = {
        name: (
            functools.partial(setup, name),
            functools.partial(worker, name),
            functools.partial(check, name),
        )
        for name in (NARROW, TABLES, TRIGGERS)
    }
    rows[FUNCTIONS] = (
        functools.partial(setup, FUNCTIONS),
        functions_worker,
        functools.partial(check, FUNCTIONS),
    )
    return rows
