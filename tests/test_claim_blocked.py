"""The claim marks a queued turn that waits behind another turn of its conversation
(agent_run.claim_blocked) and reads it no more; the end of the turn ahead clears the mark.

What must hold: an empty claim's cost does not grow with blocked turns, and the mark never
outlives its reason, whatever the interleaving of a claim that marks and a finish that
clears (both orders, forced with real sessions and the server's lock table, as in
test_races.py), and turn order holds with real worker processes claiming at once.
Costs are counted in shared buffers, never in time.
"""

from __future__ import annotations

import itertools
import multiprocessing
import uuid

import psycopg
from psycopg.types.json import Jsonb
from race_support import (
    Background,
    Connect,
    claim,
    claim_one,
    database_url,
    drain,
    enqueue,
    owner,
    run_row,
    settle,
    vacuum,
)

__all__ = ["database_url", "owner"]  # fixtures: this module's own database, the observer

BLOCKED = 3_000
# The most turns one claim marks (walk_cap, functions/_claim_walk.sql): the claims after the
# first mark the rest, 500 at a time.
MARKED_PER_CLAIM = 500


def empty_claim_buffers(conn: psycopg.Connection) -> tuple[int, int]:
    """(buffers of the first empty claim, the steady buffers of the ones after it): each call
    rolled back except the first and the ones that finish its one-time work (marking up to
    BLOCKED blocked turns). Steady: the lowest of the last four of ten, since PL/pgSQL plans a
    statement anew for each of its first five runs and planning reads index metapages too."""
    first = measure_claim(conn)
    for _ in range(-(-BLOCKED // MARKED_PER_CLAIM) - 1):
        measure_claim(conn)
    # The claim stops reading the index entries the marking left behind only once it can
    # flag them dead to everyone.
    settle(conn)
    counts = []
    for _ in range(9):
        with conn.transaction(force_rollback=True):
            counts.append(measure_claim(conn))
    return first, min(counts[5:])


def measure_claim(conn: psycopg.Connection) -> int:
    plan = conn.execute(
        "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) SELECT * FROM runrow.claim_runs('cost-probe', 10, 30)"
    ).fetchone()[0][0]["Plan"]
    assert plan["Actual Rows"] == 0
    return plan["Shared Hit Blocks"] + plan["Shared Read Blocks"]


def block(owner: psycopg.Connection, turns: int) -> list[uuid.UUID]:
    """`turns` conversations, each with a running turn and a second turn queued behind it;
    returns the conversations."""
    conversations = [uuid.uuid4() for _ in range(turns)]
    owner.execute(
        "SELECT runrow.enqueue_run(c, '\"first\"', 'test-model') FROM unnest(%s::uuid[]) AS c",
        (conversations,),
    )
    while claim(owner, 1000, 3600):
        pass
    owner.execute(
        "SELECT runrow.enqueue_run(c, '\"second\"', 'test-model') FROM unnest(%s::uuid[]) AS c",
        (conversations,),
    )
    vacuum(owner, "runrow.agent_run")
    return conversations


def test_an_empty_claim_costs_the_same_with_thousands_of_blocked_turns(owner: psycopg.Connection):
    _, none_blocked = empty_claim_buffers(owner)
    block(owner, BLOCKED)
    first, blocked = empty_claim_buffers(owner)
    print(
        f"empty claim buffers: {none_blocked} with nothing queued, {blocked} with {BLOCKED} blocked turns"
        f" (first claim after they arrived: {first})"
    )
    # Before the mark, every empty claim walked all of them: about 7 buffers per blocked turn.
    # What is left before vacuum is stepping over the index entries the marking left dead in
    # agent_run_claimable (about 5 leaf pages per 1,000 marked turns with migration 0018's
    # wider key, none once vacuum has run).
    assert blocked <= none_blocked + 20, (
        f"an empty claim touched {none_blocked} buffers with no queued turn, {blocked} with {BLOCKED} blocked"
    )


def test_a_blocked_turn_starts_once_the_turn_ahead_ends(owner: psycopg.Connection):
    conversation = uuid.uuid4()
    turn1, turn2 = enqueue(owner, conversation, 2)
    run = claim_one(owner)
    assert claim(owner, 10) == []
    assert run_row(owner, turn2)["claim_blocked"] is True
    assert owner.execute(
        "SELECT runrow.finish_run(%s, %s, 'completed')", (turn1, run["claim_token"])
    ).fetchone()[0]
    assert [r["run_id"] for r in claim(owner, 10)] == [turn2]


def test_finish_waits_for_a_claim_marking_the_next_turn_then_clears_the_mark(
    owner: psycopg.Connection, connect: Connect
):
    conversation = uuid.uuid4()
    turn1, turn2 = enqueue(owner, conversation, 2)
    run = claim_one(owner)
    # The claim sees turn 2 behind the running turn 1 and marks it, uncommitted: it holds
    # turn 2's row lock.
    claimer = connect(autocommit=False)
    assert claim(claimer, 10) == []

    worker = Background(
        connect(),
        lambda conn: conn.execute(
            "SELECT runrow.finish_run(%s, %s, 'completed')", (turn1, run["claim_token"])
        ).fetchone()[0],
    )
    # Ending turn 1 must see the mark, so it waits for the claim to commit it ...
    worker.wait_blocked_by(owner, claimer)
    claimer.commit()
    assert worker.result() is True
    # ... and clears it: turn 2 is claimable.
    assert run_row(owner, turn2)["claim_blocked"] is False
    assert [r["run_id"] for r in claim(owner, 10)] == [turn2]


def test_a_claim_during_an_uncommitted_finish_leaves_the_next_turn_unmarked(
    owner: psycopg.Connection, connect: Connect
):
    conversation = uuid.uuid4()
    turn1, turn2 = enqueue(owner, conversation, 2)
    run = claim_one(owner)
    worker = connect(autocommit=False)
    assert worker.execute(
        "SELECT runrow.finish_run(%s, %s, 'completed')", (turn1, run["claim_token"])
    ).fetchone()[0]

    # Turn 1 still looks running to the claim, so turn 2 looks blocked; but the uncommitted
    # finish holds turn 2's lock, so the claim skips it at once instead of marking it after
    # the finish looked.
    claimer = Background(connect(), lambda conn: claim(conn, 10))
    assert claimer.result() == []
    assert run_row(owner, turn2)["claim_blocked"] is False
    worker.commit()
    assert [r["run_id"] for r in claim(owner, 10)] == [turn2]


def test_a_claim_in_repeatable_read_does_not_mark(owner: psycopg.Connection, connect: Connect):
    # Its snapshot cannot see a turn ahead that ended after the transaction began, so it
    # must not judge a turn blocked for later claims.
    conversation = uuid.uuid4()
    _turn1, turn2 = enqueue(owner, conversation, 2)
    claim_one(owner)
    claimer = connect(autocommit=False)
    claimer.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
    assert claim(claimer, 10) == []
    claimer.commit()
    assert run_row(owner, turn2)["claim_blocked"] is False


def batch_worker(url: str, worker_id: str, conversations: list[str], batch: int) -> list[tuple]:
    """Claim up to `batch` runs, finish them all with one finish_runs, until the conversations
    are done. Records (conversation, enqueue_seq, started, ended) on the database clock: the
    claim committed before started, the finish began after ended."""
    records = []
    with psycopg.connect(url, autocommit=True) as conn:
        while True:
            rows = conn.execute(
                "SELECT run_id, claim_token, conversation_id FROM runrow.claim_runs(%s, %s, 30)",
                (worker_id, batch),
            ).fetchall()
            if not rows:
                left = conn.execute(
                    "SELECT count(*) FROM runrow.agent_run"
                    " WHERE conversation_id = ANY (%s::uuid[]) AND status IN ('queued', 'running')",
                    (conversations,),
                ).fetchone()[0]
                if left == 0:
                    return records
                continue
            started = conn.execute("SELECT clock_timestamp()").fetchone()[0]
            seqs = dict(
                conn.execute(
                    "SELECT id, enqueue_seq FROM runrow.agent_run WHERE id = ANY (%s::uuid[])",
                    ([r[0] for r in rows],),
                ).fetchall()
            )
            ended = conn.execute("SELECT clock_timestamp()").fetchone()[0]
            done = conn.execute(
                "SELECT run_id, finished FROM runrow.finish_runs(%s)",
                (
                    Jsonb(
                        [
                            {"run_id": str(run_id), "claim_token": str(token), "status": "completed"}
                            for run_id, token, _ in rows
                        ]
                    ),
                ),
            ).fetchall()
            assert all(finished for _, finished in done), f"{worker_id} lost a run it held"
            records.extend((str(conv), seqs[run_id], started, ended) for run_id, _, conv in rows)


PROCESSES = 4
CONVERSATIONS = 40
RUNS = 2_000


def test_concurrent_claimers_keep_turn_order_and_leave_no_turn_behind(
    owner: psycopg.Connection, database_url: str
):
    conversations = [str(uuid.uuid4()) for _ in range(CONVERSATIONS)]
    # Round-robin: every conversation has turns queued behind its running one all along, so
    # claims keep marking turns and finishes keep clearing them.
    owner.execute(
        "SELECT runrow.enqueue_run(c.ids[1 + n %% cardinality(c.ids)], to_jsonb('turn ' || n), 'test-model')"
        " FROM (SELECT %s::uuid[] AS ids) AS c, generate_series(0, %s - 1) AS n",
        (conversations, RUNS),
    )
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(PROCESSES) as pool:
        per_process = pool.starmap(
            batch_worker,
            [(database_url, f"claimer-{n}", conversations, 1 + 4 * (n % 2)) for n in range(PROCESSES)],
        )
    records = [record for records in per_process for record in records]
    # Every turn ran exactly once: none was left queued behind a stale mark.
    assert len(records) == RUNS
    statuses = owner.execute(
        "SELECT status, claim_blocked, count(*) FROM runrow.agent_run"
        " WHERE conversation_id = ANY (%s::uuid[]) GROUP BY 1, 2",
        (conversations,),
    ).fetchall()
    assert statuses == [("completed", False, RUNS)], statuses
    by_conversation: dict[str, list[tuple]] = {}
    for conversation, enqueue_seq, started, ended in records:
        by_conversation.setdefault(conversation, []).append((started, ended, enqueue_seq))
    for intervals in by_conversation.values():
        intervals.sort()
        for (_, ended, _), (started, _, _) in itertools.pairwise(intervals):
            assert ended < started, "two turns of one conversation were running at once"
        seqs = [enqueue_seq for _, _, enqueue_seq in intervals]
        assert seqs == sorted(seqs), "turns of a conversation ran out of enqueue order"
    assert (
        owner.execute(
            "SELECT count(*) FROM runrow.audit() AS a JOIN runrow.agent_run AS r ON r.id = a.run_id"
            " WHERE r.conversation_id = ANY (%s::uuid[])",
            (conversations,),
        ).fetchone()[0]
        == 0
    )


# --- the cap: at most MARKED_PER_CLAIM runs set aside per claim ------------------------------


def queue_behind_a_running_turn(owner: psycopg.Connection, turns: int, tenant: str | None) -> uuid.UUID:
    """A conversation of `tenant` whose first turn is running, `turns` more queued behind it."""
    conversation = uuid.uuid4()
    owner.execute(
        "SELECT runrow.enqueue_run(%s, '\"first\"', 'test-model', fairness_key => %s)", (conversation, tenant)
    )
    assert len(claim(owner, 1)) == 1
    owner.execute(
        "SELECT count(*) FROM (SELECT runrow.enqueue_run(%s, '\"next\"', 'test-model', fairness_key => %s)"
        " FROM generate_series(1, %s)) AS e",
        (conversation, tenant, turns),
    )
    return conversation


def marked(owner: psycopg.Connection, conversation: uuid.UUID) -> int:
    return owner.execute(
        "SELECT count(*) FROM runrow.agent_run WHERE conversation_id = %s AND claim_blocked", (conversation,)
    ).fetchone()[0]


def test_the_cap_holds_when_a_batch_step_locks_nothing(owner: psycopg.Connection, connect: Connect):
    """The review of the cap: a batch step that locked nothing (its level's only run held by
    another claimer: SKIP LOCKED) returned NULL ids, the count of runs set aside became NULL,
    and no later test of the cap held: 1,200 turns marked in one claim."""
    drain(owner)
    conversation = queue_behind_a_running_turn(owner, 1_200, "u1")
    free = owner.execute(
        "SELECT run_id FROM runrow.enqueue_run(gen_random_uuid(), '\"free\"', 'test-model',"
        " fairness_key => 'u2')"
    ).fetchone()[0]
    held = owner.execute(
        "SELECT run_id FROM runrow.enqueue_run(gen_random_uuid(), '\"held\"', 'test-model', priority => 10)"
    ).fetchone()[0]
    other = connect(autocommit=False)
    other.execute("SELECT 1 FROM runrow.agent_run WHERE id = %s FOR UPDATE", (held,))
    try:
        assert [r["run_id"] for r in claim(owner, 2)] == [free]
        assert marked(owner, conversation) == MARKED_PER_CLAIM
    finally:
        other.rollback()


def test_a_claim_stopped_by_the_cap_wakes_the_dispatchers(owner: psycopg.Connection, connect: Connect):
    """A claim that stops at the cap returns fewer runs than asked for, and a worker then waits
    for a wake or its poll tick: 1,200 blocked turns ahead of a free run took three ticks (21 s
    at the default 10 s). It now wakes the dispatchers (runrow_enqueued, empty payload) as it
    commits; a claim that is not capped wakes nobody."""
    drain(owner)
    queue_behind_a_running_turn(owner, 1_200, None)
    listener = connect(autocommit=True)
    listener.execute("LISTEN runrow_enqueued")
    assert claim(owner, 1) == []
    assert [n.payload for n in listener.notifies(timeout=2, stop_after=1)] == [""]
    assert claim(owner, 1) == []
    assert [n.payload for n in listener.notifies(timeout=2, stop_after=1)] == [""]
    assert claim(owner, 1) == []  # the last 200: not capped
    assert [n.payload for n in listener.notifies(timeout=0.5)] == []
