"""Enqueues of one prompt share nothing they lock: the prompt row every run of an application
refers to is read, not locked (migration 0050).

Until then a foreign key checked each new run's prompt_id with a key-share lock on the prompt's
row: a WAL record and a dirtied page per enqueue, and, whenever two enqueues of one prompt were
in flight at once, a MultiXact holding both lockers (a new one for every enqueue that joined
them). A fleet enqueueing thousands of runs a second spent MultiXact ids at that rate. Real
sessions, two transactions open at once, each after its enqueue; the row's lockers read from a
third session.
"""

from __future__ import annotations

import uuid

import psycopg
from race_support import Connect, database_url, owner

__all__ = ["database_url", "owner"]  # fixtures: this module's own database, the observer

ENQUEUE = "SELECT run_id FROM runrow.enqueue_run(%s, '\"hi\"', 'test-model', system_prompt => 'You help.')"


def prompt_lockers(conn: psycopg.Connection, prompt_id: str) -> set[int]:
    """The transactions named in the prompt row's xmax: the MultiXact's members when it is one,
    else the xmax itself (0: none). A committed one's lock is gone; the caller compares with the
    transactions it holds open."""
    (xmax,) = conn.execute(
        "SELECT xmax::text::bigint FROM runrow.prompt WHERE id = %s", (prompt_id,)
    ).fetchone()
    if not xmax:
        return set()
    try:
        members = conn.execute(
            "SELECT xid::text::bigint FROM pg_get_multixact_members(%s::text::xid)", (str(xmax),)
        ).fetchall()
    except psycopg.Error:  # a plain transaction id, not a MultiXact
        return {int(xmax)}
    return {int(xid) for (xid,) in members}


def test_two_enqueues_of_one_prompt_in_flight_leave_its_row_unlocked(
    owner: psycopg.Connection, connect: Connect
):
    (first,) = owner.execute(ENQUEUE, (uuid.uuid4(),)).fetchone()
    (prompt_id,) = owner.execute("SELECT prompt_id FROM runrow.agent_run WHERE id = %s", (first,)).fetchone()

    a, b = connect(autocommit=False), connect(autocommit=False)
    try:
        run_a = a.execute(ENQUEUE, (uuid.uuid4(),)).fetchone()[0]
        run_b = b.execute(ENQUEUE, (uuid.uuid4(),)).fetchone()[0]
        in_flight = {
            int(conn.execute("SELECT txid_current_if_assigned()::text::bigint % 4294967296").fetchone()[0])
            for conn in (a, b)
        }
        # Both transactions are open, each holding what its enqueue locked. Before 0050 the
        # prompt's xmax was a MultiXact whose members were both of them, in key-share mode.
        assert prompt_lockers(owner, prompt_id) & in_flight == set()
        a.commit()
        b.commit()
    finally:
        a.rollback()
        b.rollback()
    both = owner.execute(
        "SELECT count(*) FROM runrow.agent_run WHERE id IN (%s, %s) AND prompt_id = %s AND status = 'queued'",
        (run_a, run_b, prompt_id),
    ).fetchone()[0]
    assert both == 2, "both runs are queued, pinned to the shared prompt"


def test_an_enqueue_locks_none_of_the_rows_its_run_refers_to(owner: psycopg.Connection):
    """Its conversation's and its message's rows carry no lock of the enqueue's (0052; foreign keys
    key-share locked both until then: a WAL record each per enqueue)."""
    conversation = uuid.uuid4()
    (run,) = owner.execute(ENQUEUE, (conversation,)).fetchone()
    enqueuer, conv_xmax, msg_xmax = owner.execute(
        "SELECT r.xmin::text::bigint, c.xmax::text::bigint, m.xmax::text::bigint FROM runrow.agent_run AS r"
        " JOIN runrow.conversation AS c ON c.id = r.conversation_id"
        " JOIN runrow.message AS m ON m.id = r.user_message_id WHERE r.id = %s",
        (run,),
    ).fetchone()
    # A lock leaves its transaction's id in the row's xmax (the enqueue's, here: it wrote both rows).
    assert (conv_xmax, msg_xmax) == (0, 0), (
        f"enqueue {enqueuer} locked conversation {conv_xmax}, message {msg_xmax}"
    )
