"""A claim finds the rate-limit keys blocked now without reading every key's row.

Every claim that finds a run asks which keys are blocked (`blocked_until > now()`): the fast
path's NOT EXISTS and the walk's array of blocked keys (functions/_claim_walk.sql). rate_limit
keeps a row for every key ever given limits or ever blocked by a 429, so with nothing indexing
blocked_until each claim read them all: 10 rows at 10 keys, 3,010 at 3,010. Found by a plan
audit of the hot paths (stop 62); migration 0114 indexes blocked_until.

Counted, not timed: entries of rate_limit's indexes and rate_limit rows seq-scanned inside one
rolled-back claim (lookup_cost_support.rows_read), at 10 and 3,010 keys (half limited with
set_rate_limit, half blocked once by a 429 of a millisecond, long over), each in a fresh
session, before and after ANALYZE: on the one-tenant fast path, on the walk (two tenants), and
with one key blocked now (the walk reads its entry). And the index's price stays with the
block's own writes: the bucket writes of every model request remain HOT updates; and the
lookups of one key's block (defer_run, _lift_held_runs) stay on the key's entry, not a range of
the new index filtered by key.
"""

from __future__ import annotations

import json
import uuid

import psycopg
from lookup_cost_support import rows_read
from race_support import Connect, database_url, owner

__all__ = ["database_url", "owner"]  # fixtures: this module's own database, the observer

SMALL, LARGE = 10, 3010
CLAIM = "SELECT * FROM runrow.claim_runs('lookup-test', 1, 30)"
# The metric that asks the same question (queue_metrics' other columns read rate_limit apart).
METRIC = "SELECT rate_limit_keys_blocked FROM runrow.queue_metrics"
# The keys in a key-error streak (migration 0115), read on every scrape too.
KEY_ERROR_METRIC = "SELECT rate_limit_keys_key_error FROM runrow.queue_metrics"
TURN = json.dumps([{"type": "text", "text": "an answer"}])
USAGE = json.dumps({"input_tokens": 10, "output_tokens": 5})


def blocked_once(conn: psycopg.Connection, keys: list[str], seconds: float = 0.001) -> None:
    """Each key blocked once by a 429 reported for a run of it, with a retry-after of `seconds`
    (1 ms: over by the next transaction). The runs are finished."""
    for start in range(0, len(keys), 1000):
        part = keys[start : start + 1000]
        conn.execute(
            "SELECT runrow.enqueue_run(gen_random_uuid(), '\"history\"', 'test-model', rate_limit_key => k)"
            " FROM unnest(%s::text[]) AS k",
            (part,),
        )
        claimed = conn.execute(
            "SELECT run_id, claim_token FROM runrow.claim_runs('history', %s, 600)", (len(part),)
        ).fetchall()
        assert len(claimed) == len(part)
        for run_id, token in claimed:
            conn.execute("SELECT runrow.report_rate_limited(%s, %s, %s::numeric)", (run_id, token, seconds))
            conn.execute("SELECT runrow.finish_run(%s, %s, 'completed')", (run_id, token))


def limited(conn: psycopg.Connection, keys: list[str]) -> None:
    conn.execute("SELECT runrow.set_rate_limit(k, 1000, NULL, NULL) FROM unnest(%s::text[]) AS k", (keys,))


def block_now(conn: psycopg.Connection, key: str) -> None:
    """`key` blocked for ten minutes by a 429 of a run of it, which is then finished."""
    conn.execute(
        "SELECT runrow.enqueue_run(gen_random_uuid(), '\"held\"', 'test-model', rate_limit_key => %s)", (key,)
    )
    ((run_id, token),) = conn.execute(
        "SELECT run_id, claim_token FROM runrow.claim_runs('held', 1, 600)"
    ).fetchall()
    conn.execute("SELECT runrow.report_rate_limited(%s, %s, 600)", (run_id, token))
    conn.execute("SELECT runrow.finish_run(%s, %s, 'completed')", (run_id, token))


def claim_costs(owner: psycopg.Connection, connect: Connect) -> dict[str, tuple[int, int]]:
    """(entries, rows seq-scanned) of rate_limit for one claim that finds a run: one tenant's
    run (the fast path), then a second tenant's beside it (the walk)."""
    cost = {}
    owner.execute("SELECT runrow.enqueue_run(%s, '\"q\"', 'test-model')", (uuid.uuid4(),))
    with connect() as session:
        cost["one tenant"] = rows_read(session, "rate_limit", CLAIM, ())
    owner.execute(
        "SELECT runrow.enqueue_run(%s, '\"q\"', 'test-model', fairness_key => 'other')", (uuid.uuid4(),)
    )
    with connect() as session:
        cost["two tenants"] = rows_read(session, "rate_limit", CLAIM, ())
        cost["key-error metric"] = rows_read(session, "rate_limit", KEY_ERROR_METRIC, ())
    for (conversation_id,) in owner.execute(
        "SELECT conversation_id FROM runrow.agent_run WHERE status = 'queued'"
    ).fetchall():
        owner.execute("SELECT runrow.stop_conversation(%s)", (conversation_id,))
    return cost


def test_a_model_call_granted_and_settled_leaves_the_key_s_row_hot(
    owner: psycopg.Connection, connect: Connect
) -> None:
    """The index's price is paid by the writes that change blocked_until (a block, a key error's
    probe and its answer), once a block: acquire_model_call's and append_step's bucket writes,
    made for every model request, leave it as it is and stay HOT (no index entry added). HOT also
    needs room on the row's page, index or not: a fillfactor of 50 puts the key's new row on a
    page with room whatever this module's other tests wrote before it."""
    owner.execute("ALTER TABLE runrow.rate_limit SET (fillfactor = 50)")
    owner.execute("SELECT runrow.set_rate_limit('hot-key', 100000, 10000000, 10000000)")
    owner.execute(
        "SELECT runrow.enqueue_run(%s, '\"q\"', 'test-model', rate_limit_key => 'hot-key')", (uuid.uuid4(),)
    )
    ((run_id, token),) = owner.execute(
        "SELECT run_id, claim_token FROM runrow.claim_runs('hot', 1, 600)"
    ).fetchall()
    counts = (
        "SELECT pg_stat_get_xact_tuples_updated('runrow.rate_limit'::regclass),"
        " pg_stat_get_xact_tuples_hot_updated('runrow.rate_limit'::regclass)"
    )
    with connect() as session, session.transaction(force_rollback=True):
        before = session.execute(counts).fetchone()
        granted = session.execute(
            "SELECT granted FROM runrow.acquire_model_call(%s, %s, 1000)", (run_id, token)
        )
        assert granted.fetchone() == (True,)
        session.execute(
            "SELECT runrow.append_step(%s, %s, 'model_turn', %s::json, usage => %s::jsonb)",
            (run_id, token, TURN, USAGE),
        )
        after = session.execute(counts).fetchone()
    updated, hot = after[0] - before[0], after[1] - before[1]
    print(f"updates of the key's row for one grant and its settlement: {updated}, HOT: {hot}")
    assert updated >= 2 and hot == updated
    owner.execute("SELECT runrow.finish_run(%s, %s, 'completed')", (run_id, token))


def test_a_claim_reads_the_keys_blocked_now_however_many_keys_were_ever_blocked(
    owner: psycopg.Connection, connect: Connect
) -> None:
    cost: dict[tuple[int, str], dict[str, tuple[int, int]]] = {}
    for size in (SMALL, LARGE):
        # Keys up to `size` in all (the test before left one), about half of them blocked once.
        keys = owner.execute("SELECT count(*) FROM runrow.rate_limit").fetchone()[0]
        more = [f"key-{n}" for n in range(keys, size)]
        blocked_once(owner, more[::2])
        limited(owner, more[1::2])
        assert owner.execute("SELECT count(*) FROM runrow.rate_limit").fetchone()[0] == size
        cost[size, "stale"] = claim_costs(owner, connect)
        owner.execute("ANALYZE runrow.rate_limit")  # as autovacuum would, after the keys' writes
        cost[size, "analyzed"] = claim_costs(owner, connect)
    print(f"(entries of rate_limit's indexes, rows seq-scanned) per claim: {cost}")
    # Before migration 0114: (0, 10) at 10 keys and (0, 3010) at 3,010, in every shape: every row.
    for (size, stats), shapes in cost.items():
        metric = shapes.pop("key-error metric")
        assert shapes == {"one tenant": (0, 0), "two tenants": (0, 0)}, (size, stats)
        # The key-error metric, before migration 0115: (0, 3010) at 3,010 keys. At 10 keys (one
        # page) the planner reads the page rather than the index, rightly.
        assert metric == (0, 0) or (size == SMALL and metric == (0, SMALL)), (size, stats, metric)

    # One key blocked now: its entry, whatever else is stored. The fast path meets it and leaves
    # to the walk, which reads it again (one tenant: 2); two tenants go to the walk at once.
    block_now(owner, "blocked-now")
    now = claim_costs(owner, connect)
    with connect() as session:
        now["queue_metrics"] = rows_read(session, "rate_limit", METRIC, ())
    print(f"with one key blocked now: {now}")
    assert now == {
        "one tenant": (2, 0),
        "two tenants": (1, 0),
        "key-error metric": (0, 0),
        "queue_metrics": (1, 0),
    }, now


def test_a_lookup_by_key_reads_the_key_s_entry_however_many_keys_are_blocked_now(
    owner: psycopg.Connection, connect: Connect
) -> None:
    """defer_run and _lift_held_runs (set_rate_limit removing a blocked key here) read one key's
    block in force. Written `key = k AND blocked_until > now()`, the planner could take it as a
    range of migration 0114's index and filter by key: each call read every key blocked now (202
    and 204 entries with 202 keys blocked), where the key's entry of rate_limit_pkey is one."""
    blocked_once(owner, [f"storm-{n}" for n in range(200)], 600)
    owner.execute("SELECT runrow.set_rate_limit('storm-key', 1000, NULL, NULL)")
    owner.execute(
        "SELECT runrow.enqueue_run(gen_random_uuid(), '\"q\"', 'test-model', rate_limit_key => 'storm-key')"
        " FROM generate_series(1, 2)"
    )
    (held, told) = owner.execute(
        "SELECT run_id, claim_token FROM runrow.claim_runs('storm', 2, 600)"
    ).fetchall()
    owner.execute("SELECT runrow.report_rate_limited(%s, %s, 600)", held)  # the key blocked, as is told
    cost = {}
    with connect() as session:
        cost["defer_run"] = rows_read(
            session, "rate_limit", "SELECT runrow.defer_run(%s, %s, interval '5 s', 'rate_limited')", told
        )
    with connect() as session:
        cost["set_rate_limit removing it"] = rows_read(
            session, "rate_limit", "SELECT runrow.set_rate_limit('storm-key', NULL, NULL, NULL)", ()
        )
    print(f"with 202 keys blocked now: {cost}")
    # The key's entry, read by each statement that looks for it (set_rate_limit: its DELETE, then
    # the lift): 1 and 2 before migration 0114. Each may also meet the entry of the row version
    # the 429's write left (a write of blocked_until is no longer HOT) until a scan can mark it
    # dead, which depends on the transactions open meanwhile: at most 2 and 4.
    bound = {"defer_run": 2, "set_rate_limit removing it": 4}
    for call, (entries, scanned) in cost.items():
        assert entries <= bound[call] and scanned == 0, (call, cost)
