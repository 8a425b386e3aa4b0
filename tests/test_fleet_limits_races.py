"""The fleet limits under real concurrent sessions, one forced interleaving at a time
(tests/race_support.py): the bucket row is the lock, so many acquirers never overdraw it; a
block reported by one session stops the grant another session is waiting for; a tenant budget
crossed by two parallel steps of two runs is seen by the second; two grants racing for the last
of a tenant's budget do not both pass; a key error's probe answered while a run is being
deferred for its block makes that run due; a run refused with a 403 asking first leaves the
probe to the run asking after it."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

import psycopg
from race_support import POLL_TIMEOUT, Background, Connect, claim, database_url, drain, owner, run_row

__all__ = ["database_url", "owner"]


def fleet_runs(conn: psycopg.Connection, n: int, **fleet: Any) -> list[dict]:
    drain(conn)
    for _ in range(n):
        conn.execute(
            "SELECT runrow.enqueue_run(conversation_id => %s, content => '\"hi\"', model => 'race-model', "
            "user_id => %s, rate_limit_key => %s)",
            (uuid.uuid4(), fleet.get("user_id"), fleet.get("rate_limit_key")),
        )
    runs = claim(conn, n)
    assert len(runs) == n
    return runs


def acquire(conn: psycopg.Connection, run: dict, estimate: int = 10) -> tuple:
    return conn.execute(
        "SELECT granted, wait_seconds, reason FROM runrow.acquire_model_call(%s, %s, %s)",
        (run["run_id"], run["claim_token"], estimate),
    ).fetchone()


def step(conn: psycopg.Connection, run: dict, usage: dict) -> int:
    return conn.execute(
        "SELECT runrow.append_step(%s, %s, 'model_turn', %s::json, NULL, %s::jsonb, 'tool_use')",
        (run["run_id"], run["claim_token"], json.dumps([{"type": "text", "text": "t"}]), json.dumps(usage)),
    ).fetchone()[0]


def wait_all_blocked(observer: psycopg.Connection, calls: list[Background]) -> None:
    """Every call waits on a lock (the holder's, or the tuple lock of the one ahead of it)."""
    pids = [c.pid for c in calls]
    deadline = time.monotonic() + POLL_TIMEOUT
    while observer.execute(
        "SELECT count(*) FROM unnest(%s::int[]) AS p WHERE cardinality(pg_blocking_pids(p)) > 0", (pids,)
    ).fetchone()[0] < len(pids):
        assert not any(c.done for c in calls), "a call finished before the holder let go"
        assert time.monotonic() < deadline, "the calls did not all block in time"
        time.sleep(0.005)


def lock_row(conn: psycopg.Connection, sql: str, *args: Any) -> None:
    conn.execute("BEGIN")
    conn.execute(sql, args)


def test_many_acquirers_never_overdraw_the_bucket(owner: psycopg.Connection, connect: Connect) -> None:
    key = f"race-{uuid.uuid4()}"
    owner.execute("SELECT runrow.set_rate_limit(%s, 5, NULL, NULL)", (key,))
    runs = fleet_runs(owner, 12, rate_limit_key=key)
    holder = connect()
    lock_row(holder, "SELECT 1 FROM runrow.rate_limit WHERE rate_limit_key = %s FOR UPDATE", key)
    callers = [Background(connect(), lambda c, r=r: acquire(c, r)) for r in runs]
    wait_all_blocked(owner, callers)  # all twelve queue on the bucket row at once
    holder.execute("COMMIT")
    answers = [call.result() for call in callers]
    granted = [a for a in answers if a[0]]
    # The test runs in well under 12 s, so less than one request refills meanwhile.
    assert len(granted) == 5, answers
    assert {a[2] for a in answers if not a[0]} == {"rate_limited"}
    left = owner.execute(
        "SELECT requests_left FROM runrow.rate_limit WHERE rate_limit_key = %s", (key,)
    ).fetchone()
    assert 0 <= left[0] < 1


def test_a_reported_block_stops_a_waiting_grant(owner: psycopg.Connection, connect: Connect) -> None:
    key = f"race-{uuid.uuid4()}"
    owner.execute("SELECT runrow.set_rate_limit(%s, 100, NULL, NULL)", (key,))
    reporter, waiter = fleet_runs(owner, 2, rate_limit_key=key)
    holder = connect()
    holder.execute("BEGIN")
    holder.execute(
        "SELECT runrow.report_rate_limited(%s, %s, 30)", (reporter["run_id"], reporter["claim_token"])
    )
    call = Background(connect(), lambda c: acquire(c, waiter))
    call.wait_blocked_by(owner, holder)  # the bucket has room: only the uncommitted block stands in the way
    holder.execute("COMMIT")
    granted, wait, reason = call.result()
    assert (granted, reason) == (False, "blocked")
    assert 29 < float(wait) <= 30


def test_a_tenant_budget_crossed_by_two_parallel_steps(owner: psycopg.Connection, connect: Connect) -> None:
    tenant = f"tenant-{uuid.uuid4()}"
    owner.execute("SELECT runrow.set_tenant_budget(%s, 1000, NULL)", (tenant,))
    first, second = fleet_runs(owner, 2, user_id=tenant)
    holder = connect()
    holder.execute("BEGIN")
    step(holder, first, {"input_tokens": 600})  # alone, under the budget
    call = Background(connect(), lambda c: step(c, second, {"input_tokens": 600}))
    call.wait_blocked_by(owner, holder)  # the second waits on the tenant's budget row
    holder.execute("COMMIT")
    call.result()
    assert run_row(owner, first["run_id"])["budget_exhausted"] is None
    crossed = run_row(owner, second["run_id"])["budget_exhausted"]
    assert crossed == f'budget_exhausted: tenant "{tenant}" used 1200 tokens of its 1000 per day'
    # Neither run gets another model request: the second is marked, the first sees the tenant's day.
    for run in (first, second):
        assert acquire(owner, run)[2] == "budget_exhausted"
        ended = run_row(owner, run["run_id"])
        assert (ended["status"], ended["error"].split(":")[0]) == ("failed", "budget_exhausted")


def test_two_grants_racing_for_a_tenant_budget(owner: psycopg.Connection, connect: Connect) -> None:
    """The grant reads the tenant's calls in flight under its budget row's lock: the second waits
    for the first's commit and counts its reservation. Before migration 0088 neither locked nor
    counted anything: both were granted, 8,212 tokens reserved against a budget of 5,000."""
    tenant = f"tenant-{uuid.uuid4()}"
    owner.execute("SELECT runrow.set_tenant_budget(%s, 5000, NULL)", (tenant,))
    # No rate_limit_key: no bucket row serializes the two grants, only the tenant's.
    first, second = fleet_runs(owner, 2, user_id=tenant)
    holder = connect()
    holder.execute("BEGIN")
    assert acquire(holder, first)[0] is True  # 10 + 4096 (the default max_tokens) reserved, uncommitted
    call = Background(connect(), lambda c: acquire(c, second))
    deadline = time.monotonic() + POLL_TIMEOUT
    while (
        not call.done
        and not owner.execute(
            "SELECT %s = ANY (pg_blocking_pids(%s))", (holder.info.backend_pid, call.pid)
        ).fetchone()[0]
    ):
        assert time.monotonic() < deadline, "the second grant neither blocked nor answered in time"
        time.sleep(0.005)
    holder.execute("COMMIT")
    granted, wait, reason = call.result()
    assert (granted, wait, reason) == (False, 15, "budget_reserved"), "both grants passed"
    reserved = owner.execute(
        "SELECT reserved_tokens FROM runrow.tenant_budget WHERE fairness_key = %s", (tenant,)
    ).fetchone()
    assert reserved == (4106,)
    # The first call settles lower than reserved: the second fits now.
    step(owner, first, {"input_tokens": 500})
    assert acquire(owner, second)[0] is True


def test_a_probe_answered_during_a_deferral_lifts_the_deferred_run(
    owner: psycopg.Connection, connect: Connect
) -> None:
    """defer_run reads the key's block under a share lock: the probe's answer (its usage settled,
    under the key row's lock) waits for the deferral, then finds the run queued to the block's
    end and makes it due. Without the lock the answer went first, saw the run still running,
    and the deferral then queued it for the whole block with the key working."""
    key = f"race-{uuid.uuid4()}"
    probe, deferred = fleet_runs(owner, 2, rate_limit_key=key)
    owner.execute(
        "SELECT runrow.report_key_error(%s, %s, 'authentication_error: invalid x-api-key', 30, 30)",
        (probe["run_id"], probe["claim_token"]),
    )
    owner.execute(  # the block's time is up (set-up as the owner, instead of waiting 30 s)
        "UPDATE runrow.rate_limit SET blocked_until = now(), key_error_until = now() "
        "WHERE rate_limit_key = %s",
        (key,),
    )
    assert acquire(owner, probe)[0] is True  # the probe; the key is held for one more block
    granted, wait, reason = acquire(owner, deferred)
    assert (granted, reason) == (False, "blocked")
    holder = connect()
    holder.execute("BEGIN")
    holder.execute(
        "SELECT runrow.defer_run(%s, %s, make_interval(secs => %s + 0.2), 'blocked: waiting')",
        (deferred["run_id"], deferred["claim_token"], float(wait)),
    )
    call = Background(connect(), lambda c: step(c, probe, {"input_tokens": 5, "output_tokens": 2}))
    call.wait_blocked_by(owner, holder)  # the answer waits for the deferral's share lock
    holder.execute("COMMIT")
    call.result()
    streak, due = owner.execute(
        "SELECT l.key_errors, a.not_before <= now() FROM runrow.rate_limit AS l "
        "JOIN runrow.agent_run AS a ON a.rate_limit_key = l.rate_limit_key "
        "WHERE l.rate_limit_key = %s AND a.id = %s",
        (key, deferred["run_id"]),
    ).fetchone()
    assert (streak, due) == (0, True)


def test_a_run_refused_with_a_403_leaves_the_probe_to_a_run_asking_after_it(
    owner: psycopg.Connection, connect: Connect
) -> None:
    """Two runs of a key ask at once as its key error's block ends, the one refused with a 403
    first in line (the claim order favoured it): the other is the probe (migration 0101). Before,
    the first to ask was the probe, so a run whose own request draws the 403 was the probe every
    time, and the key's other runs waited with it for ever."""
    key = f"race-{uuid.uuid4()}"
    refused, other = fleet_runs(owner, 2, rate_limit_key=key)
    owner.execute(
        "SELECT runrow.report_key_error(%s, %s, 'permission_error: no access to the beta', 30, 300, true)",
        (refused["run_id"], refused["claim_token"]),
    )
    assert acquire(owner, other)[2] == "blocked"
    owner.execute(  # the block's time is up (set-up as the owner, instead of waiting 30 s)
        "UPDATE runrow.rate_limit SET blocked_until = now(), key_error_until = now() "
        "WHERE rate_limit_key = %s",
        (key,),
    )
    holder = connect()
    lock_row(holder, "SELECT 1 FROM runrow.rate_limit WHERE rate_limit_key = %s FOR UPDATE", key)
    first = Background(connect(), lambda c: acquire(c, refused))
    first.wait_blocked_by(owner, holder)
    second = Background(connect(), lambda c: acquire(c, other))
    wait_all_blocked(owner, [first, second])
    holder.execute("COMMIT")
    assert first.result() == (False, 15, "probe_elsewhere")
    assert second.result() == (True, 0, None)
    probe = owner.execute(
        "SELECT key_probe_by FROM runrow.rate_limit WHERE rate_limit_key = %s", (key,)
    ).fetchone()
    assert probe == (other["run_id"],)


def test_a_block_lifted_while_a_claim_holds_a_run_to_it(owner: psycopg.Connection, connect: Connect) -> None:
    """A claim that meets a due run of a blocked key holds it to the block's end (not_before).
    It read the block's end without a lock, so a lift not yet committed (a limit removed, a key
    error's probe answered) went unseen, and the lift's own statement, its snapshot taken
    before the claim committed, did not see the hold either: the run waited out the whole
    block (up to key_error_max_block, 300 s) with the key working. The claim now reads the
    block's end again under a share lock, SKIP LOCKED: a key row the lift holds leaves the run
    due and unheld."""
    key = f"race-{uuid.uuid4()}"
    (blocker,) = fleet_runs(owner, 1, rate_limit_key=key)
    owner.execute(
        "SELECT runrow.report_rate_limited(%s, %s, 60)", (blocker["run_id"], blocker["claim_token"])
    )
    held = owner.execute(
        "SELECT run_id FROM runrow.enqueue_run(conversation_id => %s, content => '\"hi\"', "
        "model => 'race-model', rate_limit_key => %s)",
        (uuid.uuid4(), key),
    ).fetchone()[0]
    lifter = connect()
    lifter.execute("BEGIN")
    lifter.execute("SELECT runrow.set_rate_limit(%s, NULL, NULL, NULL)", (key,))  # lifted, not committed
    call = Background(connect(), lambda c: claim(c, 5))
    deadline = time.monotonic() + POLL_TIMEOUT
    # The claim does not wait (SKIP LOCKED): it leaves the run. Before the fix it held the run to
    # the block it still saw. (Had it waited, in between: blocked on the lifter.)
    while (
        not call.done
        and not owner.execute(
            "SELECT %s = ANY (pg_blocking_pids(%s))", (lifter.info.backend_pid, call.pid)
        ).fetchone()[0]
    ):
        assert time.monotonic() < deadline, "the claim neither finished nor waited for the lift"
        time.sleep(0.005)
    lifter.execute("COMMIT")
    assert call.result() == []  # the run was due to a blocked key at the claim's start: not claimed
    due = owner.execute(
        "SELECT status, coalesce(not_before, '-infinity') <= now() FROM runrow.agent_run WHERE id = %s",
        (held,),
    ).fetchone()
    assert due == ("queued", True), "held to a block that was lifted"


def test_lifting_a_block_never_waits_on_a_held_run(owner: psycopg.Connection, connect: Connect) -> None:
    """Removing a limit (or a key error's probe answered) lifts the runs held to the block's end
    under the key row's lock. The lift waited on each held run's row, and a run a claim took
    meanwhile (its hold ending as the lift began), whose worker was in acquire_model_call
    holding the run and waiting for the key, deadlocked the two (the review of stop 57: 3 to 7
    40P01 in a 25 s stress). The lift skips a run another transaction holds: that one is being
    claimed or stopped, and a claim reads the block under a share lock, after the lift."""
    key = f"race-{uuid.uuid4()}"
    owner.execute("SELECT runrow.set_rate_limit(%s, 100, NULL, NULL)", (key,))
    blocker, held = fleet_runs(owner, 2, rate_limit_key=key)
    owner.execute(
        "SELECT runrow.report_rate_limited(%s, %s, 60)", (blocker["run_id"], blocker["claim_token"])
    )
    owner.execute(
        "SELECT runrow.defer_run(%s, %s, interval '60 seconds', 'rate limited')",
        (held["run_id"], held["claim_token"]),
    )
    holder = connect()
    # _hold_claim's lock strength: what acquire_model_call holds while it waits for the key.
    lock_row(holder, "SELECT 1 FROM runrow.agent_run WHERE id = %s FOR NO KEY UPDATE", held["run_id"])
    lifter = connect()
    lifter.execute("SET lock_timeout = '200ms'")  # a wait is an error here (55P03), not a timing
    lifter.execute("SELECT runrow.set_rate_limit(%s, NULL, NULL, NULL)", (key,))
    holder.execute("ROLLBACK")
    row = run_row(owner, held["run_id"])
    assert row["status"] == "queued" and row["not_before"] is not None


def test_a_claim_never_waits_on_a_blocked_keys_row(owner: psycopg.Connection, connect: Connect) -> None:
    """A claim that meets a due run of a blocked key reads the block again under a share lock.
    Waited for, that lock stalled every claim of the fleet behind any writer of the key row (an
    operator's set_rate_limit in an open transaction, a worker's commit): the claim held its
    runs meanwhile, and the other tenants' runs waited too (the review: 55P03 after 2 s under a
    lock_timeout, none without one). It is taken SKIP LOCKED: the claim goes on at once."""
    key = f"race-{uuid.uuid4()}"
    (blocker,) = fleet_runs(owner, 1, rate_limit_key=key)
    owner.execute(
        "SELECT runrow.report_rate_limited(%s, %s, 600)", (blocker["run_id"], blocker["claim_token"])
    )
    held, other = (
        owner.execute(
            "SELECT run_id FROM runrow.enqueue_run(conversation_id => %s, content => '\"hi\"', "
            "model => 'race-model', user_id => %s, rate_limit_key => %s)",
            (uuid.uuid4(), user, rate_key),
        ).fetchone()[0]
        for user, rate_key in (("tenant-a", key), ("tenant-b", f"other-{uuid.uuid4()}"))
    )
    operator = connect()
    operator.execute("BEGIN")
    operator.execute("SELECT runrow.set_rate_limit(%s, 100, NULL, NULL)", (key,))  # the block stays
    claimer = connect()
    claimer.execute("SET lock_timeout = '200ms'")  # a wait is an error here (55P03), not a timing
    claimed = {r["run_id"] for r in claim(claimer, 5)}
    operator.execute("ROLLBACK")
    assert other in claimed and held not in claimed
    assert run_row(owner, held)["status"] == "queued"


def test_two_reapers_charging_crosswise_tenants_do_not_deadlock(
    owner: psycopg.Connection, connect: Connect
) -> None:
    """A reap charges each reaped call's reservation under its tenant's budget row: two passes
    taking those rows in lease-expiry order took them crosswise (T1 then T2, T2 then T1) and one
    died on 40P01, its whole pass rolled back (the review of session 59). The batch is charged in
    key order now: the second pass waits for the first."""
    prefix = f"t-{uuid.uuid4()}"
    owner.execute("SELECT runrow.set_model_price('race-model', 3, 15, 3.75, 0.3)")
    tenants = {n: f"{prefix}-{n}" for n in (1, 2, 3)}
    for tenant in tenants.values():
        owner.execute("SELECT runrow.set_tenant_budget(%s, 10000000, NULL)", (tenant,))
    drain(owner)
    plan = [1, 3, 2, 2, 1]  # by lease expiry: reaper A takes the first three, reaper B the last two
    for n in plan:
        owner.execute(
            "SELECT runrow.enqueue_run(conversation_id => %s, content => '\"hi\"', model => 'race-model',"
            " user_id => %s)",
            (uuid.uuid4(), tenants[n]),
        )
    runs = claim(owner, len(plan))
    by_tenant: dict[str, list[dict]] = {}
    for run in runs:
        assert acquire(owner, run)[0] is True
        by_tenant.setdefault(run_row(owner, run["run_id"])["fairness_key"], []).append(run)
    for i, n in enumerate(plan):
        run = by_tenant[tenants[n]].pop()
        owner.execute(
            "UPDATE runrow.agent_run SET claim_expires_at = now() - interval '1 hour'"
            " + %s * interval '1 second' WHERE id = %s",
            (i, run["run_id"]),
        )
    holder = connect()  # a grant or settle of tenant 3 in flight
    lock_row(holder, "SELECT 1 FROM runrow.tenant_budget WHERE fairness_key = %s FOR UPDATE", tenants[3])

    def reap(n: int) -> Any:
        return lambda c: c.execute("SELECT outcome FROM runrow.reap_expired_runs(0, %s)", (n,)).fetchall()

    reaper_a = Background(connect(), reap(3))
    reaper_a.wait_blocked_by(owner, holder)
    reaper_b = Background(connect(), reap(2))
    reaper_b.wait_blocked_by(owner, reaper_a.conn)
    holder.execute("COMMIT")
    assert reaper_a.result() == [("failed",)] * 3  # max_attempts 1: at-most-once
    assert reaper_b.result() == [("failed",)] * 2
    reserved = owner.execute(
        "SELECT sum(reserved_tokens) FROM runrow.tenant_budget WHERE fairness_key LIKE %s", (prefix + "%",)
    ).fetchone()
    assert reserved == (0,)


def test_two_first_updates_of_a_new_key_both_stand(owner: psycopg.Connection, connect: Connect) -> None:
    """update_rate_limit on a key with no row yet: the first makes the row (uncommitted), the
    second waits for it, then keeps its limit. A read of no row followed by set_rate_limit with
    NULL for "keep" would have lifted the first's limit: (NULL, 500, NULL), not (10, 500, NULL)."""
    key = f"new-key-{uuid.uuid4()}"
    holder = connect()
    holder.execute("BEGIN")
    holder.execute("SELECT runrow.update_rate_limit(%s, requests_per_minute => 10)", (key,))
    second = "SELECT runrow.update_rate_limit(%s, input_tokens_per_minute => 500)"
    call = Background(connect(), lambda c: c.execute(second, (key,)))
    call.wait_blocked_by(owner, holder)
    holder.execute("COMMIT")
    call.result()
    row = owner.execute(
        "SELECT requests_per_minute, input_tokens_per_minute, output_tokens_per_minute, requests_left, "
        "input_tokens_left FROM runrow.rate_limit WHERE rate_limit_key = %s",
        (key,),
    ).fetchone()
    assert row == (10, 500, None, 10, 500)


def test_batch_endings_across_the_same_tenants_take_their_budgets_in_one_order(
    owner: psycopg.Connection, connect: Connect
) -> None:
    """Two finish_runs, each ending runs of the same two budgeted tenants (listed in opposite
    orders) whose calls were granted and never settled: each takes its runs' reservations out
    under the tenants' budget rows, as finish_run does, locking them in key order, so neither
    waits on the other crosswise (a deadlock, one batch ending nothing). Forced: a third session
    holds the first tenant's row until both batches wait. Before session 60 the batches locked
    nothing and left the four reservations counted."""
    tag = uuid.uuid4().hex[:8]
    first, second = f"a-{tag}", f"b-{tag}"
    for tenant in (first, second):
        owner.execute("SELECT runrow.set_tenant_budget(%s, 100000000, NULL)", (tenant,))
    drain(owner)
    for tenant in (first, second, first, second):
        owner.execute(
            "SELECT runrow.enqueue_run(conversation_id => %s, content => '\"hi\"', model => 'race-model', "
            "user_id => %s)",
            (uuid.uuid4(), tenant),
        )
    runs = claim(owner, 4)
    assert len(runs) == 4
    assert all(acquire(owner, run)[0] for run in runs)
    of = {t: [r for r in runs if r["user_id"] == t] for t in (first, second)}

    def finish(conn: psycopg.Connection, batch: list[dict]) -> list[bool]:
        acks = [
            {"run_id": str(r["run_id"]), "claim_token": str(r["claim_token"]), "status": "failed"}
            for r in batch
        ]
        sql = "SELECT finished FROM runrow.finish_runs(%s::jsonb)"
        return [f for (f,) in conn.execute(sql, (json.dumps(acks),))]

    holder = connect()
    lock_row(holder, "SELECT 1 FROM runrow.tenant_budget WHERE fairness_key = %s FOR UPDATE", first)
    one = Background(connect(), lambda c: finish(c, [of[first][0], of[second][0]]))
    one.wait_blocked_by(owner, holder)
    other = Background(connect(), lambda c: finish(c, [of[second][1], of[first][1]]))
    wait_all_blocked(owner, [one, other])
    holder.execute("COMMIT")
    assert one.result() == [True, True]
    assert other.result() == [True, True]
    left = owner.execute(
        "SELECT coalesce(sum(reserved_tokens), 0), (SELECT count(*) FROM runrow.tenant_reservation AS s"
        " WHERE s.fairness_key IN (%s, %s)) FROM runrow.tenant_budget WHERE fairness_key IN (%s, %s)",
        (first, second, first, second),
    ).fetchone()
    assert left == (0, 0)


def tenant_turns(conn: psycopg.Connection, tenant: str, conversation: uuid.UUID, turns: int = 1) -> None:
    for _ in range(turns):
        conn.execute(
            "SELECT runrow.enqueue_run(conversation_id => %s, content => '\"hi\"', model => 'race-model', "
            "user_id => %s)",
            (conversation, tenant),
        )


def finish_and_claim(conn: psycopg.Connection, run: dict) -> list[tuple]:
    acks = [{"run_id": str(run["run_id"]), "claim_token": str(run["claim_token"]), "status": "failed"}]
    return conn.execute(
        "SELECT run_id, finished FROM runrow.finish_and_claim_runs(%s::jsonb, 'race-test', 1, 30)",
        (json.dumps(acks),),
    ).fetchall()


def test_a_batch_ending_never_waits_for_a_budget_holding_a_walked_turn(
    owner: psycopg.Connection, connect: Connect
) -> None:
    """finish_and_claim_runs ends run R of tenant A, whose call was granted: its reservation goes
    under A's budget row. Its claim's walk had locked (and marked) N, queued behind X in X's
    conversation. The reaper, reaping X (A's, its call unsettled), charges it under A's budget row,
    and X's ending then wants N's lock to clear its mark. Waited for after the walk, A's row closed
    the cycle: 40P01, the worker's whole flush lost (the review of session 60). Forced: a third
    session holds A's row until both wait. The flush now never waits for a budget row while it
    holds the walk's rows: it ends its runs alone, then claims, and takes N once X has ended."""
    tenant = f"tenant-{uuid.uuid4()}"
    owner.execute("SELECT runrow.set_tenant_budget(%s, 100000000, NULL)", (tenant,))
    drain(owner)
    conversation = uuid.uuid4()
    tenant_turns(owner, tenant, conversation)  # X
    tenant_turns(owner, tenant, uuid.uuid4())  # R
    runs = claim(owner, 2)
    assert len(runs) == 2
    assert all(acquire(owner, run)[0] for run in runs)
    x, r = sorted(runs, key=lambda run: run["conversation_id"] != conversation)
    tenant_turns(owner, tenant, conversation)  # N, behind X
    (n,) = owner.execute(
        "SELECT id FROM runrow.agent_run WHERE conversation_id = %s AND status = 'queued'", (conversation,)
    ).fetchone()
    owner.execute(
        "UPDATE runrow.agent_run SET claim_expires_at = now() - interval '1 hour' WHERE id = %s",
        (x["run_id"],),
    )
    holder = connect()  # a grant or settle of tenant A in flight
    lock_row(holder, "SELECT 1 FROM runrow.tenant_budget WHERE fairness_key = %s FOR UPDATE", tenant)
    reaper = Background(
        connect(), lambda c: c.execute("SELECT outcome FROM runrow.reap_expired_runs(0, 10)").fetchall()
    )
    reaper.wait_blocked_by(owner, holder)
    flush = Background(connect(), lambda c: finish_and_claim(c, r))
    flush.wait_blocked_by(owner, reaper.conn)  # queued on A's row behind the reaper
    holder.execute("COMMIT")
    assert reaper.result() == [("failed",)]  # max_attempts 1: at-most-once
    assert flush.result() == [(r["run_id"], True), (n, None)]  # N claimed once X ended
    left = owner.execute(
        "SELECT reserved_tokens, (SELECT count(*) FROM runrow.tenant_reservation AS s"
        " WHERE s.fairness_key = %s) FROM runrow.tenant_budget WHERE fairness_key = %s",
        (tenant, tenant),
    ).fetchone()
    assert left == (0, 0)


def test_a_batch_ending_never_waits_for_a_budget_a_spent_grant_holds(
    owner: psycopg.Connection, connect: Connect
) -> None:
    """As above, the other side being acquire_model_call for X: it finds A's budget spent under
    A's row (a settle committed meanwhile) and ends X, whose ending wants N's lock, which the
    flush's walk held while it waited for A's row."""
    tenant = f"tenant-{uuid.uuid4()}"
    owner.execute("SELECT runrow.set_tenant_budget(%s, 1000, NULL)", (tenant,))
    drain(owner)
    conversation = uuid.uuid4()
    tenant_turns(owner, tenant, conversation)  # X
    tenant_turns(owner, tenant, uuid.uuid4())  # R
    tenant_turns(owner, tenant, uuid.uuid4())  # Z, whose settle spends the budget
    runs = claim(owner, 3)
    assert len(runs) == 3
    x = next(run for run in runs if run["conversation_id"] == conversation)
    r, z = (run for run in runs if run is not x)
    assert acquire(owner, r)[0] is True
    tenant_turns(owner, tenant, conversation)  # N, behind X
    holder = connect()
    holder.execute("BEGIN")
    step(holder, z, {"input_tokens": 2000})  # under A's row: the budget spent, not yet committed
    grant = Background(connect(), lambda c: acquire(c, x))
    grant.wait_blocked_by(owner, holder)
    flush = Background(connect(), lambda c: finish_and_claim(c, r))
    flush.wait_blocked_by(owner, grant.conn)  # queued on A's row behind the grant
    holder.execute("COMMIT")
    assert grant.result()[2] == "budget_exhausted"
    assert flush.result()[0] == (r["run_id"], True)
    assert run_row(owner, x["run_id"])["status"] == "failed"
