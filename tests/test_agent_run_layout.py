"""What a claim, a heartbeat and a finish write to the WAL for agent_run's row (migrations
0029, 0030 and 0031).

Neither the claim nor the finish can be a HOT update (status is in most of agent_run's index
predicates), but when the new row version lands on the page of the old one PostgreSQL logs
only the bytes between their common prefix and common suffix. With the changing columns
together at the end of the row, that is those columns, not the whole row: before 0029 each
such update logged 270-300 bytes, the size of the row. And no row is locked ahead of its
update: before 0030 a BEFORE UPDATE row trigger made PostgreSQL lock (and log a 54-byte lock
record for) every row a finish or a heartbeat updated, and before 0031 the journal's foreign
key locked the finished row again for its complete event.

Counted, not timed: the WAL records themselves, read back with pg_walinspect (a contrib
extension of PostgreSQL 15) between two WAL positions of one session.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import psycopg
import pytest
from lifecycle_support import completed
from race_support import database_url, drain, enqueue, owner, superuser_on

RUNS = 10
# Runs whose three versions (queued, claimed, ended) all fit on one fresh page: what is measured
# is what an update logs when its new version lands next to the old one, and that must not
# depend on whether a page prune (held back by any snapshot open in the database, an
# autoanalyze's say) made room in between.
ON_ONE_PAGE = 5
# The columns the claim, the heartbeat and the finish change, in the order 0029 gives them.
HOT = [
    "attempt",
    "started_at",
    "worker_id",
    "status",
    "claim_token",
    "claim_expires_at",
    "last_heartbeat_at",
    "updated_at",
    "finished_at",
    "result",
    "error",
]
# Columns added after 0029 that no claim, heartbeat or finish writes: behind HOT they are in the
# common suffix of those updates (and take no bytes while NULL), so they log nothing there.
# model_call_reserved, model_call_attempt: 0080, written by acquire_model_call and the settle;
# block_told_until: 0084, written by acquire_model_call's refusals, report_key_error, defer_run;
# key_error_answers: 0095, written by report_key_error and the settle; key_error_refused: 0099,
# written by report_key_error; cap_429_deferrals: 0103, written by defer_run; reported_429s,
# reported_429s_claim: 0106, and unanswered_429s: 0109, written by report_rate_limited (the last
# by the settle too).
AFTER_HOT = [
    "model_call_reserved",
    "model_call_attempt",
    "block_told_until",
    "key_error_answers",
    "key_error_refused",
    "cap_429_deferrals",
    "reported_429s",
    "reported_429s_claim",
    "unanswered_429s",
    "key_error_first_refused_at",
]

__all__ = ["database_url", "owner"]  # fixtures: this module's own database, the observer


@pytest.fixture
def superuser(database_url: str, cluster_urls: tuple[str, str]) -> Iterator[psycopg.Connection]:
    """A superuser session on this module's database: pg_walinspect and CHECKPOINT need one.
    It holds a temporary physical replication slot that reserves the WAL from before the first
    measured position: each measure ends in a CHECKPOINT, and with another test's checkpoint in
    between (a suite runs beside this one), the segments it reads back would otherwise already
    be recycled ("requested WAL segment ... has already been removed")."""
    url = superuser_on(database_url, cluster_urls)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
        conn.execute(
            "SELECT pg_create_physical_replication_slot('runrow_layout_' || pg_backend_pid(), true, true)"
        )
        yield conn


def agent_run_records(su: psycopg.Connection, start: str) -> list[tuple[str, int]]:
    """(record type, length) of every Heap record on agent_run's heap since `start`. The
    CHECKPOINT flushes the WAL, which pg_walinspect reads only up to the flushed position."""
    su.execute("CHECKPOINT")
    node = su.execute("SELECT pg_relation_filenode('runrow.agent_run')").fetchone()[0]
    return su.execute(
        "SELECT record_type, record_length FROM pg_get_wal_records_info(%s, pg_current_wal_flush_lsn())"
        " WHERE resource_manager = 'Heap' AND block_ref ~ ('rel [0-9]+/' || %s || '/' || %s || ' ')"
        " ORDER BY start_lsn",
        (start, str(database_oid(su)), str(node)),
    ).fetchall()


def database_oid(su: psycopg.Connection) -> int:
    """This database's oid: a block reference names database and file node, and every database
    copied from one template (devdb.migrated_template) has the same file nodes, so the other
    test process's writes to its copy are in the same WAL under the same node."""
    return su.execute("SELECT oid FROM pg_database WHERE datname = current_database()").fetchone()[0]


def lsn(conn: psycopg.Connection) -> str:
    return str(conn.execute("SELECT pg_current_wal_insert_lsn()").fetchone()[0])


def test_the_columns_a_lifecycle_changes_are_the_last_of_the_row(owner: psycopg.Connection):
    columns = [
        name
        for (name,) in owner.execute(
            "SELECT attname FROM pg_attribute WHERE attrelid = 'runrow.agent_run'::regclass"
            " AND attnum > 0 AND NOT attisdropped ORDER BY attnum"
        ).fetchall()
    ]
    assert columns[-len(HOT) - len(AFTER_HOT) :] == HOT + AFTER_HOT, columns


def test_a_claim_a_heartbeat_and_a_finish_log_what_they_change_not_the_row(
    owner: psycopg.Connection, superuser: psycopg.Connection
):
    for _ in range(ON_ONE_PAGE):
        enqueue(owner, uuid.uuid4())
    owner.execute("VACUUM runrow.agent_run")  # a steady table: the enqueue's pages, pruned

    start = lsn(superuser)
    runs = owner.execute(
        "SELECT run_id, claim_token FROM runrow.claim_runs('layout-probe', %s, 30)", (ON_ONE_PAGE,)
    ).fetchall()
    assert len(runs) == ON_ONE_PAGE
    claimed = agent_run_records(superuser, start)

    start = lsn(superuser)
    assert owner.execute("SELECT owned FROM runrow.heartbeat(%s, %s, 30)", runs[0]).fetchone()[0]
    beat = agent_run_records(superuser, start)

    start = lsn(superuser)
    acks = completed(runs)
    assert all(f for (f,) in owner.execute("SELECT finished FROM runrow.finish_runs(%s::jsonb)", (acks,)))
    finished = agent_run_records(superuser, start)
    print(f"claim {claimed}\nheartbeat {beat}\nfinish {finished}")

    def updates(records: list[tuple[str, int]]) -> list[int]:
        # UPDATE+INIT: the version went to a fresh page, which logs it whole (no old page to
        # diff against); the rest landed next to their old version.
        return [n for kind, n in records if kind in ("UPDATE", "HOT_UPDATE")]

    claim_updates, finish_updates, beat_updates = updates(claimed), updates(finished), updates(beat)
    assert len(claim_updates) == ON_ONE_PAGE and len(finish_updates) == ON_ONE_PAGE
    # The changed columns of a claim (attempt .. updated_at) are about 80 bytes, of a finish
    # (status .. error) about 50, of a heartbeat (claim_expires_at .. updated_at) 24; each
    # record adds about 50 bytes of headers. Before 0029: 270-300 bytes each.
    assert max(claim_updates) <= 150, claimed
    assert max(finish_updates) <= 150, finished
    assert beat_updates and max(beat_updates) <= 110, beat
    # No row is locked ahead of its update (migration 0030: agent_run has no BEFORE UPDATE row
    # trigger, whose tuple fetch locks the row first). The claim's locks are its own FOR
    # UPDATE SKIP LOCKED, one per claimed run.
    # Nor after it (migration 0031: the journal's run is checked by its seq trigger, not by a
    # foreign key whose check key-share locked the freshly updated row).
    assert [kind for kind, _ in beat + finished if kind == "LOCK"] == [], (beat, finished)
    assert sum(kind == "LOCK" for kind, _ in claimed) == ON_ONE_PAGE, claimed
    drain(owner)


def index_inserts(su: psycopg.Connection, start: str) -> dict[str, int]:
    """B-tree leaf inserts since `start`, by index of agent_run."""
    su.execute("CHECKPOINT")
    names = dict(
        su.execute(
            "SELECT pg_relation_filenode(i.indexrelid)::text, c.relname FROM pg_index AS i"
            " JOIN pg_class AS c ON c.oid = i.indexrelid WHERE i.indrelid = 'runrow.agent_run'::regclass"
        ).fetchall()
    )
    counts: dict[str, int] = {}
    here = str(database_oid(su))
    for (ref,) in su.execute(
        "SELECT block_ref FROM pg_get_wal_records_info(%s, pg_current_wal_flush_lsn())"
        " WHERE resource_manager = 'Btree' AND record_type = 'INSERT_LEAF'",
        (start,),
    ).fetchall():
        _, db, node = ref.split("rel ")[1].split()[0].rstrip(",").split("/")
        if db == here and node in names:
            counts[names[node]] = counts.get(names[node], 0) + 1
    return counts


def test_a_claim_and_a_finish_enter_only_the_indexes_they_must(
    owner: psycopg.Connection, superuser: psycopg.Connection
):
    """The index budget of a lifecycle: neither update can be HOT, so the new version of a
    run enters every index whose predicate it meets. A claimed run: the primary key and the
    index of active runs per conversation; an ended one: the primary key, the index of ended
    turns per conversation and agent_run_finished (the history window). Trimming its journal
    writes none: since migration 0061 the request snapshot is run_request's, and nothing
    writes a finished run again.
    Migration 0032 dropped one the claim paid for, 0035 one that both paid for, 0036 another
    the claim paid for, 0040 one the finish paid for, 0061 three the trim paid for; a new
    index on agent_run shows up here."""
    for _ in range(RUNS):
        enqueue(owner, uuid.uuid4())
    start = lsn(superuser)
    runs = owner.execute(
        "SELECT run_id, claim_token FROM runrow.claim_runs('layout-probe', %s, 30)", (RUNS,)
    ).fetchall()
    claimed = index_inserts(superuser, start)
    start = lsn(superuser)
    acks = completed(runs)
    owner.execute("SELECT finished FROM runrow.finish_runs(%s::jsonb)", (acks,)).fetchall()
    finished = index_inserts(superuser, start)
    print(f"claim {claimed}\nfinish {finished}")
    assert claimed == {
        "agent_run_pkey": RUNS,
        "agent_run_one_active_per_conversation": RUNS,
    }
    assert finished == {
        "agent_run_pkey": RUNS,
        "agent_run_ended_by_conversation": RUNS,
        "agent_run_finished": RUNS,
    }
    untrimmed = "SELECT count(*) FROM runrow.run_request"
    due = superuser.execute(untrimmed).fetchone()[0]
    start = lsn(superuser)
    owner.execute("SELECT runrow.trim_journal(older_than => '0')").fetchone()
    trimmed = index_inserts(superuser, start)
    print(f"trim {trimmed}")
    assert due >= RUNS and superuser.execute(untrimmed).fetchone()[0] == 0
    assert trimmed == {}, "the trim wrote agent_run"
    drain(owner)
