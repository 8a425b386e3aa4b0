"""Schedules across real sessions and processes: two reapers firing one due tick enqueue one
run (SKIP LOCKED: neither waits for the other), a drop waits for the pass that is firing its
schedule, a real worker's reaper fires a due tick by itself, and `runrow schedules`
list/add/remove with its errors as exit 2.

The cron evaluation, catch-up policies and template checks are pgTAP's
(pgtap/cron.sql, create_schedule.sql, fire_schedules.sql)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid

import psycopg
import pytest
from race_support import Background, Connect, database_url, owner
from worker_support import WorkerProcess, wait_until

__all__ = ["database_url", "owner"]  # the fixtures, re-exported for pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(autouse=True)
def no_schedules(owner: psycopg.Connection) -> None:
    """Only the test's own schedules are due (set-up as the owner)."""
    owner.execute("DELETE FROM runrow.schedule")


def due_schedule(conn: psycopg.Connection, name: str, **template: object) -> uuid.UUID:
    """A yearly schedule whose tick of this 1 January is due and not fired, as after an outage.
    Yearly, so no other tick falls due while the test runs."""
    metadata = template.pop("metadata", {})
    model = template.pop("model", "test-model")
    schedule_id = conn.execute(
        "SELECT runrow.create_schedule(name => %s, cron => '0 0 1 1 *', content => '\"tick\"', "
        "model => %s, metadata => %s)",
        (name, model, json.dumps(metadata)),
    ).fetchone()[0]
    conn.execute(
        "UPDATE runrow.schedule"
        " SET next_fire_at = date_trunc('year', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC' WHERE id = %s",
        (schedule_id,),
    )
    return schedule_id


def fire(conn: psycopg.Connection) -> int:
    return conn.execute("SELECT runrow.fire_schedules()").fetchone()[0]


def runs_of(conn: psycopg.Connection, schedule_id: uuid.UUID) -> list[tuple[uuid.UUID, str]]:
    return conn.execute(
        "SELECT id, status FROM runrow.agent_run WHERE idempotency_key LIKE %s ORDER BY enqueue_seq",
        (f"runrow-schedule:{schedule_id}:%",),
    ).fetchall()


def test_two_reapers_firing_one_due_tick_enqueue_one_run(connect: Connect, owner: psycopg.Connection) -> None:
    schedule_id = due_schedule(owner, "race-fire")
    first = connect(autocommit=False)
    assert fire(first) == 1, "the first reaper fires the tick (and holds the schedule row, uncommitted)"

    # The second reaper's pass skips the locked row and returns at once: it never waits for the
    # first (result() has a deadline; a pass blocked on the row lock would still be busy).
    second = Background(connect(), fire)
    assert second.result() == 0

    first.commit()
    assert fire(connect()) == 0, "after the commit, next_fire_at has moved past the tick"
    assert len(runs_of(owner, schedule_id)) == 1, "one run for the tick"
    next_fire_at, last_run_id = owner.execute(
        "SELECT next_fire_at > now(), last_run_id FROM runrow.schedule WHERE id = %s", (schedule_id,)
    ).fetchone()
    assert next_fire_at and last_run_id == runs_of(owner, schedule_id)[0][0]


def test_a_pass_rolled_back_leaves_the_tick_to_the_next(connect: Connect, owner: psycopg.Connection) -> None:
    schedule_id = due_schedule(owner, "race-rollback")
    first = connect(autocommit=False)
    assert fire(first) == 1
    second = Background(connect(), fire)
    assert second.result() == 0, "skipped while the first holds it"
    first.rollback()  # the first reaper's connection died mid-pass
    assert runs_of(owner, schedule_id) == [], "nothing of the rolled-back pass stays"
    assert fire(connect()) == 1, "the next pass fires the tick"
    assert len(runs_of(owner, schedule_id)) == 1


def test_a_drop_waits_for_the_pass_firing_its_schedule(connect: Connect, owner: psycopg.Connection) -> None:
    schedule_id = due_schedule(owner, "race-drop")
    firing = connect(autocommit=False)
    assert fire(firing) == 1
    drop = Background(connect(), lambda c: c.execute("SELECT runrow.drop_schedule('race-drop')"))
    drop.wait_blocked_by(owner, firing)
    firing.commit()
    drop.result()
    assert owner.execute("SELECT count(*) FROM runrow.schedules WHERE name = 'race-drop'").fetchone()[0] == 0
    assert [status for _, status in runs_of(owner, schedule_id)] == ["queued"], "the fired run stays"


def due_on(conn: psycopg.Connection, name: str, conversation: uuid.UUID | None, **extra: str) -> uuid.UUID:
    """A yearly schedule (see due_schedule) whose ticks go to `conversation`, due now."""
    args = "".join(f", {k} => %({k})s" for k in extra)
    schedule_id = conn.execute(
        "SELECT runrow.create_schedule(name => %(name)s, cron => '0 0 1 1 *', content => '\"tick\"', "
        f"model => 'test-model', conversation_id => %(conv)s{args})",
        {"name": name, "conv": conversation, **extra},
    ).fetchone()[0]
    conn.execute(
        "UPDATE runrow.schedule"
        " SET next_fire_at = date_trunc('year', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC'"
        " - make_interval(secs => %s) WHERE id = %s",
        (len(name), schedule_id),  # an order of its own per name: the longest name is the oldest due
    )
    return schedule_id


def still_due(conn: psycopg.Connection) -> list[str]:
    rows = conn.execute(
        "SELECT name FROM runrow.schedules WHERE next_fire_at <= now() ORDER BY name"
    ).fetchall()
    return [name for (name,) in rows]


def test_a_tick_whose_conversation_is_busy_waits_and_holds_no_other_schedule(
    connect: Connect, owner: psycopg.Connection
) -> None:
    """A pass that met a conversation a client was enqueueing into waited for that client, and
    the nine schedules its FOR loop had fetched (and locked) with it waited too: every other pass
    skipped them. Now the busy one is left due and the others fire, in a pass that never waits."""
    conversation = uuid.uuid4()
    busy = due_on(owner, "chat-with-the-longest-name", conversation)
    others = [due_on(owner, f"o{i}", None) for i in range(12)]
    client = connect(autocommit=False)
    client.execute("SELECT runrow.enqueue_run(%s, '\"a user turn\"', 'test-model')", (conversation,))

    assert Background(connect(), fire).result() == 12, "the others fire, without waiting for the client"
    assert still_due(owner) == ["chat-with-the-longest-name"]
    error = owner.execute("SELECT last_error FROM runrow.schedule WHERE id = %s", (busy,)).fetchone()[0]
    assert f"waits for a later pass: conversation {conversation} is busy" in error
    assert all(len(runs_of(owner, o)) == 1 for o in others)

    client.commit()
    assert fire(connect()) == 1, "a later pass fires it"
    assert still_due(owner) == [] and len(runs_of(owner, busy)) == 1


def test_two_passes_sharing_a_conversation_never_wait_for_each_other(
    connect: Connect, owner: psycopg.Connection
) -> None:
    """Two passes that each held a conversation (or a new prompt row) the other needed next
    deadlocked (40P01), and all of one pass's enqueues rolled back."""
    shared = uuid.uuid4()
    due_on(owner, "first-of-two", shared, system_prompt="a prompt no run has pinned yet")
    second = due_on(owner, "second", shared, system_prompt="another new prompt")
    first_pass = connect(autocommit=False)
    assert (
        owner.execute(
            "SELECT count(*) FROM runrow.prompt WHERE system_prompt LIKE '%new prompt%' "
            "OR system_prompt LIKE 'a prompt no run%'"
        ).fetchone()[0]
        == 2
    ), "create_schedule pinned both prompts: firing only reads them"
    first_pass.execute("SELECT runrow._fire_schedules(now(), 1)")  # holds the shared conversation
    assert Background(connect(), fire).result() == 0, "the second pass does not wait on the first"
    assert (
        "is busy"
        in owner.execute("SELECT last_error FROM runrow.schedule WHERE id = %s", (second,)).fetchone()[0]
    )
    first_pass.commit()
    assert fire(connect()) == 1 and still_due(owner) == []


def test_a_stop_that_times_out_leaves_the_tick_for_a_later_pass(
    connect: Connect, owner: psycopg.Connection
) -> None:
    """if_active = interrupt stops the conversation's active run first. Its 5 s lock_timeout
    (55P03, "the caller retries") was caught as a template that fails for good: next_fire_at moved
    on and the tick never ran."""
    conversation = uuid.uuid4()
    (queued,) = owner.execute(
        "SELECT run_id FROM runrow.enqueue_run(%s, '\"first\"', 'test-model')", (conversation,)
    ).fetchone()
    schedule_id = due_on(owner, "interrupts", conversation, if_active="interrupt")
    holder = connect(autocommit=False)
    holder.execute("SELECT 1 FROM runrow.agent_run WHERE id = %s FOR UPDATE", (queued,))

    assert Background(connect(), fire).result(timeout=30) == 0
    assert still_due(owner) == ["interrupts"], "left due"
    assert (
        "waits for a later pass"
        in owner.execute("SELECT last_error FROM runrow.schedule WHERE id = %s", (schedule_id,)).fetchone()[0]
    )

    holder.rollback()
    assert fire(connect()) == 1, "the next pass stops the run and enqueues the tick"
    statuses = owner.execute(
        "SELECT status FROM runrow.agent_run WHERE conversation_id = %s ORDER BY enqueue_seq", (conversation,)
    ).fetchall()
    assert statuses == [("cancelled",), ("queued",)]


def busy_schedules(owner: psycopg.Connection, client: psycopg.Connection, n: int) -> list[uuid.UUID]:
    """n schedules due before any other of the test (their names are longer), each into a
    conversation of its own that `client` holds: it enqueued a turn into each, uncommitted."""
    schedules = []
    for i in range(n):
        conversation = uuid.uuid4()
        schedules.append(due_on(owner, f"busy-{i:04}", conversation))
        client.execute("SELECT runrow.enqueue_run(%s, '\"a user turn\"', 'test-model')", (conversation,))
    return schedules


def passed_over(conn: psycopg.Connection) -> int:
    return conn.execute(
        "SELECT count(*) FROM runrow.schedule WHERE last_error LIKE '%waits for a later pass%'"
    ).fetchone()[0]


def test_busy_schedules_take_no_turn_of_the_others(connect: Connect, owner: psycopg.Connection) -> None:
    """A schedule left due because it was busy counted toward max_schedules, and every pass took
    the oldest due first: 100 busy ones (the default max_schedules) took every pass whole and no
    other schedule ever fired. Now only the schedules a pass moves on count."""
    client = connect(autocommit=False)
    busy_schedules(owner, client, 100)
    other = due_on(owner, "o", None)
    fired = [fire(connect()) for _ in range(3)]
    assert fired[0] == 1, f"the one free schedule fires at the first pass (passes fired {fired})"
    assert len(runs_of(owner, other)) == 1 and len(still_due(owner)) == 100
    assert passed_over(owner) == 100, "each busy one was looked at, and left due"
    client.rollback()
    assert [fire(connect()) for _ in range(2)] == [64, 36], "freed, they fire (at most 64 ticks a call)"
    assert still_due(owner) == [] and passed_over(owner) == 0


def test_a_pass_looks_at_a_bounded_number_of_busy_schedules_and_puts_them_behind(
    connect: Connect, owner: psycopg.Connection
) -> None:
    """A pass reads at most 10 x max_schedules due schedules, and the busy ones it leaves due go
    behind every schedule that was due then (passed_over_at), so the next pass starts past them."""
    client = connect(autocommit=False)
    busy_schedules(owner, client, 30)
    other = due_on(owner, "o", None)
    firing = connect()
    assert firing.execute("SELECT runrow.fire_schedules(2)").fetchone()[0] == 0
    assert passed_over(owner) == 20, "10 x max_schedules looked at, not every due schedule"
    assert firing.execute("SELECT runrow.fire_schedules(2)").fetchone()[0] == 1, (
        "the next pass starts with the 10 not looked at yet, and reaches the free one"
    )
    assert len(runs_of(owner, other)) == 1 and passed_over(owner) == 30
    client.rollback()
    assert fire(connect()) == 30
    marked = owner.execute("SELECT count(*) FROM runrow.schedule WHERE passed_over_at IS NOT NULL").fetchone()
    assert marked == (0,), "moved on, none is marked passed over"


async def test_a_reaper_pass_fires_more_due_schedules_than_one_call_takes(
    database_url: str, owner: psycopg.Connection
) -> None:
    """fire_schedules takes 100 schedules a call; the reaper called it once per interval, so the
    rest waited an interval (and with catch_up latest, a minute's tick was skipped)."""
    from psycopg_pool import AsyncConnectionPool

    from pyworker.worker.reaper import FIRE_BATCH, fire_once

    for i in range(FIRE_BATCH + 30):
        due_on(owner, f"many-{i}", None)
    async with AsyncConnectionPool(database_url, min_size=1, max_size=1, kwargs={"autocommit": True}) as pool:
        assert await fire_once(pool) == FIRE_BATCH + 30
    assert still_due(owner) == []


async def test_a_reaper_pass_goes_on_past_a_full_pass_that_enqueued_nothing(
    database_url: str, owner: psycopg.Connection
) -> None:
    """A pass that moved on FIRE_BATCH schedules whose ticks enqueued nothing (if_active reject on
    a conversation with an active run) returned 0, and the reaper stopped there: the due schedule
    behind them waited an interval (with catch_up latest, a minute's tick was lost)."""
    from psycopg_pool import AsyncConnectionPool

    from pyworker.worker.reaper import FIRE_BATCH, fire_once

    conversation = uuid.uuid4()
    owner.execute("SELECT runrow.enqueue_run(%s, '\"a user turn\"', 'test-model')", (conversation,))
    for i in range(FIRE_BATCH):
        due_on(owner, f"reject-{i:04}", conversation, if_active="reject")
    healthy = due_on(owner, "h", None)  # the shortest name: due last
    async with AsyncConnectionPool(database_url, min_size=1, max_size=1, kwargs={"autocommit": True}) as pool:
        assert await fire_once(pool) == 1
    assert len(runs_of(owner, healthy)) == 1, "the healthy schedule fired in the same fire_once"
    assert still_due(owner) == []
    skipped = owner.execute(
        "SELECT count(*) FROM runrow.schedule"
        " WHERE name LIKE 'reject-%%' AND last_error LIKE '%%enqueued nothing%%'"
    ).fetchone()[0]
    assert skipped == FIRE_BATCH, "each reject tick was skipped for good, its error kept"


def test_a_pass_begun_before_another_commits_takes_nothing_for_a_clock_set_back(
    connect: Connect, owner: psycopg.Connection
) -> None:
    """Pass A's transaction begins (its now()), pass B fires a tick and commits, then A runs its
    pass: B's row has updated_at later than A's now(), and A took it for a row written by a clock
    that ran ahead and was set back, writing it again (moved_on 1; a tick between the two now()s
    was moved back and replayed, with last_error blaming the clock). Migration 0106: the bound is
    the real clock as well, which no committed now() is later than."""
    schedule_id = due_schedule(owner, "race-rewind")
    first = connect(autocommit=False)
    first.execute("SELECT now()")  # A's transaction, and its now(), begin here
    assert fire(connect()) == 1, "B fires the tick and commits"
    written = owner.execute(
        "SELECT next_fire_at, updated_at, last_error FROM runrow.schedule WHERE id = %s", (schedule_id,)
    ).fetchone()
    passed = first.execute("SELECT (p.enqueued, p.moved_on)::text FROM runrow.fire_schedules_pass() AS p")
    assert passed.fetchone()[0] == "(0,0)", (
        "A takes nothing: B's row was not written by a clock that ran ahead"
    )
    first.commit()
    assert (
        owner.execute(
            "SELECT next_fire_at, updated_at, last_error FROM runrow.schedule WHERE id = %s", (schedule_id,)
        ).fetchone()
        == written
    ), "B's row stays as B wrote it"


def test_a_workers_reaper_fires_a_due_tick(database_url: str, owner: psycopg.Connection) -> None:
    schedule_id = due_schedule(
        owner, "reaper-fires", model="echo", metadata={"echo": "scheduled hello", "duration": 0}
    )
    worker = WorkerProcess(database_url, "sched-worker", ["--reap-interval", "0.2", "--poll", "0.2"])
    try:
        worker.wait_started()
        runs = wait_until(
            lambda: [r for r in runs_of(owner, schedule_id) if r[1] == "completed"],
            30,
            f"the scheduled run to complete\n{worker.log()}",
        )
        assert len(runs) == 1
        result = owner.execute("SELECT result FROM runrow.agent_run WHERE id = %s", (runs[0][0],)).fetchone()[
            0
        ]
        assert "scheduled hello" in json.dumps(result)
        worker.wait_log("schedules: enqueued 1 run(s) for due ticks")
    finally:
        worker.close()
    assert len(runs_of(owner, schedule_id)) == 1, "every later pass found nothing due"


# --- runrow schedules ---------------------------------------------------------------------


def runrow(url: str, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    env["DATABASE_URL"] = url
    return subprocess.run(
        [sys.executable, "-m", "pyworker", *args],
        input=stdin,
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        cwd=REPO,
    )


def test_cli_adds_lists_and_removes(database_url: str) -> None:
    added = runrow(
        database_url,
        "schedules",
        "add",
        "digest",
        "0 7 * * mon-fri",
        "Summarize yesterday",
        "--catch-up",
        "each",
        "--priority",
        "7",
        "--concurrency-key",
        "reports",
    )
    assert added.returncode == 0, added.stderr
    schedule_id = uuid.UUID(added.stdout.strip())
    assert "schedule digest: next tick " in added.stderr and "a new conversation per tick" in added.stderr

    listed = runrow(database_url, "schedules")
    assert listed.returncode == 0, listed.stderr
    assert "digest" in listed.stdout and "0 7 * * mon-fri" in listed.stdout and "each<=10" in listed.stdout
    (row,) = [
        json.loads(line) for line in runrow(database_url, "schedules", "list", "--json").stdout.splitlines()
    ]
    assert row["id"] == str(schedule_id) and row["catch_up"] == "each" and row["last_run_id"] is None
    assert (row["priority"], row["concurrency_key"]) == (7, "reports")

    from_stdin = runrow(database_url, "schedules", "add", "piped", "@hourly", "-", stdin="From stdin")
    assert from_stdin.returncode == 0, from_stdin.stderr

    removed = runrow(database_url, "schedules", "remove", "digest")
    assert removed.returncode == 0, removed.stderr
    assert "digest" not in runrow(database_url, "schedules", "list").stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["add", "bad", "61 * * * *", "hi"],
            'runrow: invalid argument: cron "61 * * * *": minute 61 is out of range 0-59\n',
        ),
        (
            ["add", "bad", "every day", "hi"],
            'runrow: invalid argument: cron "every day" must have five fields (minute hour day-of-month '
            "month day-of-week, UTC), got 2\n",
        ),
        (
            ["add", "taken", "@daily", "hi"],
            'runrow: already used: name "taken" is already taken by another schedule\n',
        ),
        (["remove", "nope"], 'runrow: not found: name "nope" is not the name of a schedule\n'),
        (
            ["add", "bad", "@daily", "hi", "--max-catch-up", "5"],
            "runrow: --max-catch-up goes with --catch-up each (latest fires only the most recent tick)\n",
        ),
        (
            ["add", "bad", "@daily", "hi", "--catch-up", "each", "--max-catch-up", "0"],
            "runrow: invalid argument: --max-catch-up must be between 1 and 1000, got 0\n",
        ),
        (
            ["add", "b", "@daily", "x", "-c", str(uuid.uuid4()), "--if-active=interrupt", "--catch-up=each"],
            "runrow: invalid argument: --catch-up each cannot go with if_active interrupt: after an outage "
            "every missed tick would be enqueued and stop the one before it, so all but the last would be "
            "cancelled; use catch_up latest (only the most recent missed tick)\n",
        ),
        (
            ["add", "bad", "@daily", "  "],
            "runrow: the message is empty: give the text as an argument or on stdin with `-`\n",
        ),
    ],
)
def test_cli_errors_are_one_line_and_exit_2(
    database_url: str, owner: psycopg.Connection, args: list[str], message: str
) -> None:
    owner.execute("SELECT runrow.create_schedule('taken', '@daily', '\"x\"', 'm')")
    before = owner.execute("SELECT count(*) FROM runrow.schedule").fetchone()[0]
    result = runrow(database_url, "schedules", *args)
    assert (result.returncode, result.stderr) == (2, message)
    assert owner.execute("SELECT count(*) FROM runrow.schedule").fetchone()[0] == before, "nothing written"


def test_cli_help_teaches_cron_and_catch_up(database_url: str) -> None:
    for args in (["schedules", "--help"], ["schedules", "add", "--help"]):
        shown = runrow(database_url, *args)
        assert shown.returncode == 0
        for needle in (
            "five fields in UTC",
            "day-of-week",
            "latest (default)",
            "--max-catch-up",
            "examples:",
        ):
            assert needle in shown.stdout, (args, needle)
    usage = runrow(database_url, "schedules", "add", "only-a-name")
    assert usage.returncode == 2 and "the following arguments are required: cron, message" in usage.stderr
