"""The claim's order and filters with real sessions and processes (SPEC.md "Fleet scheduling"):
a concurrency limit holds with several claimers claiming at once, a claim skips a key whose
limit another claim holds instead of waiting on it, a high-priority run overtakes a deep
queue, a small tenant is not starved behind a big one, and none of the rules makes a claim's
cost grow with the queue behind it (buffers, never time).
"""

from __future__ import annotations

import multiprocessing
import time

import psycopg
from race_support import Background, Connect, claim, database_url, owner, vacuum

__all__ = ["database_url", "owner"]  # fixtures: this module's own database, the observer

PROCESSES = 4
CAPPED_RUNS = 120
CAP = 3
DEEP = 3_000


def enqueue_many(conn: psycopg.Connection, n: int, **fleet: object) -> None:
    """`n` runs of new conversations, with enqueue_run's fleet arguments as given."""
    args = "".join(f", {name} => %({name})s" for name in fleet)
    conn.execute(
        f"SELECT runrow.enqueue_run(gen_random_uuid(), '\"x\"', 'test-model'{args})"
        f" FROM generate_series(1, %(n)s)",
        {"n": n, **fleet},
    )


def claim_buffers(conn: psycopg.Connection, max_runs: int = 1) -> tuple[int, int]:
    """(steady shared buffers, rows) of one claim_runs, rolled back: the lowest of the last
    four of ten (PL/pgSQL plans each statement anew for its first five runs)."""
    counts = []
    for _ in range(10):
        with conn.transaction(force_rollback=True):
            plan = conn.execute(
                "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON)"
                " SELECT * FROM runrow.claim_runs('cost-probe', %s, 30)",
                (max_runs,),
            ).fetchone()[0][0]["Plan"]
        counts.append((plan["Shared Hit Blocks"] + plan["Shared Read Blocks"], plan["Actual Rows"]))
    return min(counts[6:])


def capped_worker(url: str, worker_id: str) -> list[tuple]:
    """Claim batches of 5 until the capped key has nothing queued or running; hold each run a
    moment so claims overlap, and record (run, started, ended) on the database clock: started
    after the claim committed, ended before the finish began, so an interval lies inside the
    time the run really held a slot and overlapping intervals really ran at once."""
    records = []
    with psycopg.connect(url, autocommit=True) as conn:
        while True:
            rows = conn.execute(
                "SELECT run_id, claim_token FROM runrow.claim_runs(%s, 5, 30)", (worker_id,)
            ).fetchall()
            if not rows:
                left = conn.execute(
                    "SELECT count(*) FROM runrow.agent_run WHERE concurrency_key = 'capped'"
                    " AND status IN ('queued', 'running')"
                ).fetchone()[0]
                if left == 0:
                    return records
                continue
            started = conn.execute("SELECT clock_timestamp()").fetchone()[0]
            time.sleep(0.005)
            for run_id, token in rows:
                ended = conn.execute("SELECT clock_timestamp()").fetchone()[0]
                assert conn.execute(
                    "SELECT runrow.finish_run(%s, %s, 'completed')", (run_id, token)
                ).fetchone()[0]
                records.append((str(run_id), started, ended))


def test_a_concurrency_limit_holds_with_several_claimers_at_once(
    owner: psycopg.Connection, database_url: str
):
    owner.execute("SELECT runrow.set_concurrency_limit('capped', %s)", (CAP,))
    enqueue_many(owner, CAPPED_RUNS, concurrency_key="capped")
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(PROCESSES) as pool:
        per_process = pool.starmap(capped_worker, [(database_url, f"capper-{n}") for n in range(PROCESSES)])
    records = [r for rs in per_process for r in rs]
    assert len({run for run, _, _ in records}) == CAPPED_RUNS
    # The most intervals open at any instant: never more than the cap.
    events = sorted(
        [(s, 1) for _, s, _ in records] + [(e, -1) for _, _, e in records], key=lambda x: (x[0], x[1])
    )
    most = running = 0
    for _, step in events:
        running += step
        most = max(most, running)
    assert most <= CAP, f"{most} runs of a key capped at {CAP} ran at once"
    # Claimers did run several at once, so the limit was what held them back.
    assert most >= 2


def test_a_claim_skips_a_capped_key_another_claim_holds_and_takes_the_rest(
    owner: psycopg.Connection, connect: Connect
):
    owner.execute("SELECT runrow.set_concurrency_limit('one-at-a-time', 1)")
    enqueue_many(owner, 3, concurrency_key="one-at-a-time")
    enqueue_many(owner, 1)
    first = connect()
    first.autocommit = False
    took = claim(first, 1)  # the oldest run: one of the capped key, limit row locked until commit
    assert len(took) == 1
    second = Background(connect(), lambda c: claim(c, 10))
    rows = second.result()  # returns without waiting on the first claim's locks
    assert len(rows) == 1
    assert (
        owner.execute(
            "SELECT concurrency_key FROM runrow.agent_run WHERE id = %s", (rows[0]["run_id"],)
        ).fetchone()[0]
        is None
    ), "the second claim took a run of the key whose limit the first held"
    first.commit()
    assert claim(connect(), 10) == [], "the key is at its limit of 1 once the first claim committed"
    running = owner.execute(
        "SELECT count(*) FROM runrow.agent_run WHERE concurrency_key = 'one-at-a-time' AND status = 'running'"
    ).fetchone()[0]
    assert running == 1


def test_a_high_priority_run_behind_1000_queued_runs_is_claimed_next(
    owner: psycopg.Connection, connect: Connect
):
    enqueue_many(owner, 1_000)
    urgent = owner.execute(
        "SELECT run_id FROM runrow.enqueue_run(gen_random_uuid(), '\"urgent\"', 'test-model', priority => 10)"
    ).fetchone()[0]
    rows = claim(connect(), 1)
    assert [r["run_id"] for r in rows] == [urgent]


def test_a_small_tenant_is_served_alongside_a_big_one(owner: psycopg.Connection, connect: Connect):
    enqueue_many(owner, 500, fairness_key="big")
    enqueue_many(owner, 10, fairness_key="small")
    worker = connect()
    tenants = []
    for _ in range(20):
        (row,) = claim(worker, 1)
        tenants.append(
            owner.execute(
                "SELECT fairness_key FROM runrow.agent_run WHERE id = %s", (row["run_id"],)
            ).fetchone()[0]
        )
    assert tenants.count("small") == 10, tenants


def test_claim_cost_depends_on_what_it_claims_not_on_the_queue_behind_it(
    owner: psycopg.Connection, connect: Connect
):
    probe = connect()
    enqueue_many(owner, 10)
    vacuum(owner, "runrow.agent_run")
    base, rows = claim_buffers(probe)
    assert rows == 1
    owner.execute(
        "SELECT runrow.stop_conversation(conversation_id) FROM runrow.agent_run WHERE status = 'queued'"
    )

    enqueue_many(owner, DEEP, fairness_key="one-tenant")
    vacuum(owner, "runrow.agent_run")
    deep, rows = claim_buffers(probe)
    assert rows == 1
    owner.execute(
        "SELECT runrow.stop_conversation(conversation_id) FROM runrow.agent_run WHERE status = 'queued'"
    )

    enqueue_many(owner, DEEP, start_in="1 hour")
    enqueue_many(owner, 10)
    vacuum(owner, "runrow.agent_run")
    delayed, rows = claim_buffers(probe)
    assert rows == 1
    owner.execute(
        "SELECT runrow.stop_conversation(conversation_id) FROM runrow.agent_run WHERE status = 'queued'"
    )

    # A key at its limit (0: paused) with a short, then a deep queue in front of one claimable
    # run. Compared with itself: a key takes the claim's whole walk, not the fast path of a queue
    # of one group that `deep` takes (about 25 buffers fewer since issue 11's stop 42, which left
    # `capped <= deep + 25` at its edge: 66-69).
    owner.execute("SELECT runrow.set_concurrency_limit('full', 0)")
    enqueue_many(owner, 10, concurrency_key="full")
    enqueue_many(owner, 10)
    vacuum(owner, "runrow.agent_run")
    capped_short, rows = claim_buffers(probe)
    assert rows == 1
    owner.execute(
        "SELECT runrow.stop_conversation(conversation_id) FROM runrow.agent_run WHERE status = 'queued'"
    )
    enqueue_many(owner, DEEP, concurrency_key="full")
    enqueue_many(owner, 10)
    vacuum(owner, "runrow.agent_run")
    capped, rows = claim_buffers(probe)
    assert rows == 1
    owner.execute(
        "SELECT runrow.stop_conversation(conversation_id) FROM runrow.agent_run WHERE status = 'queued'"
    )

    # Many tenants: the claim enumerates the active tenants of the level (one descent each),
    # so this one grows with tenants, not with what each has queued.
    owner.execute(
        "SELECT runrow.enqueue_run(gen_random_uuid(), '\"x\"', 'test-model',"
        " fairness_key => 't' || (n %% 50))"
        " FROM generate_series(1, %s) AS n",
        (DEEP,),
    )
    vacuum(owner, "runrow.agent_run")
    tenants, rows = claim_buffers(probe)
    assert rows == 1
    owner.execute(
        "SELECT runrow.stop_conversation(conversation_id) FROM runrow.agent_run WHERE status = 'queued'"
    )
    print(
        f"claim buffers: {base} with 10 queued, {deep} with {DEEP} of one tenant,"
        f" {delayed} with {DEEP} delayed,"
        f" {capped_short} with 10 and {capped} with {DEEP} behind a capped key,"
        f" {tenants} with {DEEP} over 50 tenants"
    )
    # A deeper queue may add a btree level to each index the claim descends or writes (about
    # 20 of them); walking the queue would cost thousands. The rules' own price is constant:
    # a capped key is found at its limit once per claim (limit row, lock, count), delayed runs
    # are never read.
    assert deep <= base + 25
    assert delayed <= deep + 10
    assert capped <= capped_short + 25
    assert tenants <= deep + 50 * 5


def test_tenant_budgets_cost_a_claim_only_for_the_tenants_it_reaches(
    owner: psycopg.Connection, connect: Connect
):
    """Every claim judged every budgeted tenant (its budget row and a day of spend_hour) before
    walking the queue: 10 budgets cost about 285 buffers per claim, whatever it claimed."""
    probe = connect()
    owner.execute(
        "SELECT runrow.stop_conversation(conversation_id) FROM runrow.agent_run WHERE status = 'queued'"
    )
    enqueue_many(owner, 10)
    vacuum(owner, "runrow.agent_run")
    # One budget already, of a tenant with no queued run: with none at all the claim takes the
    # walk's fast path (functions/_claim_walk.sql), which is cheaper still; with any, the walk.
    owner.execute("SELECT runrow.set_tenant_budget('budgeted-0', 1000000, NULL)")
    vacuum(owner, "runrow.tenant_budget")
    base, rows = claim_buffers(probe)
    assert rows == 1
    # 200 tenants with budgets and a day of spend each, none of them with a queued run.
    owner.execute(
        "SELECT runrow.set_tenant_budget('budgeted-' || n, 1000000, NULL) FROM generate_series(1, 200) AS n"
    )
    owner.execute(
        "INSERT INTO runrow.spend_hour (fairness_key, hour, model, tokens)"
        " SELECT 'budgeted-' || n, date_trunc('hour', now()) - make_interval(hours => h), 'test-model', 10"
        " FROM generate_series(1, 200) AS n, generate_series(0, 23) AS h"
    )
    vacuum(owner, "runrow.spend_hour")
    vacuum(owner, "runrow.tenant_budget")
    budgeted, rows = claim_buffers(probe)
    assert rows == 1
    print(f"claim buffers: {base} without budgets, {budgeted} with 200 budgeted tenants it never reaches")
    owner.execute(
        "SELECT runrow.set_tenant_budget('budgeted-' || n, NULL, NULL) FROM generate_series(0, 200) AS n"
    )
    owner.execute("DELETE FROM runrow.spend_hour WHERE fairness_key LIKE 'budgeted-%'")
    owner.execute(
        "SELECT runrow.stop_conversation(conversation_id) FROM runrow.agent_run WHERE status = 'queued'"
    )
    assert budgeted <= base + 10, (base, budgeted)
