"""Through a real transaction pooler: Debian's pgbouncer 1.18, pool_mode = transaction, in front
of the test cluster (pyworker.db.pgbouncer), with fewer server connections than clients.

Real worker processes whose DATABASE_URL goes through it complete every run exactly once (no
`prepared statement "_pg3_N" does not exist`, no double claim: attempt 1 each); with a direct
--listen-url the enqueue wakes them by NOTIFY, with a 30 s poll tick that would otherwise be
the only way to learn of a run. Without --listen-url the hub's self-test warns that the LISTEN
URL looks pooled, for `runrow worker` and `runrow serve` alike. `runrow migrate` through the
pooler is refused before it writes anything, and the README's pgbouncer.ini block loads as
pasted, every value taking effect.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import psycopg
import pytest
from http_support import ALICE, serve
from tail_support import append, claim, enqueue, tail_process
from worker_support import (
    WorkerProcess,
    db,
    enqueue_echo,
    events,
    run_row,
    status,
    wait_until,
    worker_db,
)

from pyworker.db import migrate as migrate_module
from pyworker.db import pgbouncer
from pyworker.db.devdb import OWNER, DevDbError, temporary_database
from pyworker.db.hub import POOLED_WARNING
from pyworker.db.pooling import REFUSED_OPTIONS

__all__ = ["db", "worker_db"]

PREPARED = ("prepared statement", "bind message supplies")


@pytest.fixture(scope="module")
def bouncer(database_url: str) -> Iterator[pgbouncer.Bouncer]:
    try:
        pgbouncer.check_binary()
    except DevDbError as exc:
        pytest.skip(str(exc))
    # 4 server connections for each database, shared by every client of the test: each
    # transaction of a worker can land on another one, which is what breaks session state.
    with pgbouncer.running(database_url, pool_size=4) as b:
        yield b


@pytest.fixture
def spawn(worker_db: str, bouncer: pgbouncer.Bouncer) -> Iterator[Callable[..., WorkerProcess]]:
    """A worker process whose DATABASE_URL goes through pgbouncer."""
    started: list[WorkerProcess] = []

    def _spawn(name: str, *args: str) -> WorkerProcess:
        w = WorkerProcess(bouncer.url_for(worker_db), name, list(args))
        started.append(w)
        return w.wait_started()

    yield _spawn
    for w in started:
        w.close()


def claims(conn: psycopg.Connection, run_id: uuid.UUID) -> int:
    return sum(1 for e in events(conn, run_id) if e["type"] == "run_claimed")


def test_workers_through_pgbouncer_complete_every_run_once_and_wake_by_notify(
    db: psycopg.Connection, worker_db: str, spawn: Callable[..., WorkerProcess], bouncer: pgbouncer.Bouncer
) -> None:
    # A 30 s poll: after the boot claim, only a NOTIFY on the direct LISTEN URL can wake them
    # within the test's deadlines. Short leases make heartbeats frequent; the grace leaves a
    # beat queued behind busy server connections on a loaded box room before a reaper acts.
    args = ("--listen-url", worker_db, "--poll", "30", "--lease", "3", "--grace", "5", "--reap-interval", "1")
    workers = [spawn(name, *args, "--concurrency", "4") for name in ("pool-a", "pool-b")]
    for w in workers:
        w.wait_log("hub self-test: NOTIFY through the pool reached the hub")

    runs = [enqueue_echo(db, f"answer {i} " * 8, duration=0.6) for i in range(40)]
    wait_until(
        lambda: all(status(db, r) == "completed" for r in runs),
        60,
        "40 runs through pgbouncer to complete\n" + "\n".join(w.log() for w in workers),
    )
    for r in runs:
        row = run_row(db, r)
        assert (row["status"], row["attempt"]) == ("completed", 1), row
        assert claims(db, r) == 1
        kinds = [e["type"] for e in events(db, r)]
        assert kinds.count("complete") == 1 and kinds[-1] == "complete"
    assert db.execute("SELECT * FROM runrow.audit()").fetchall() == []

    # The workers are idle now, parked on the 30 s tick: a run enqueued now is claimed within
    # seconds only because the enqueue's NOTIFY reached a hub through the direct URL.
    late = enqueue_echo(db, "woken", duration=0.1)
    wait_until(lambda: status(db, late) != "queued", 5, "the NOTIFY to wake a worker (the poll is 30 s)")
    wait_until(lambda: status(db, late) == "completed", 15, "the woken run to complete")

    for w in workers:
        log = w.log()
        assert not [line for line in log.splitlines() if any(p in line for p in PREPARED)], log
        assert "Traceback" not in log and "claim failed" not in log, log
        assert POOLED_WARNING not in log
        # pgbouncer refuses the options startup parameter: the pool goes on without the
        # server-side limits and says so; the direct hub keeps them.
        assert "worker pool: the server refuses the options startup parameter" in log
        assert "worker hub (LISTEN): the server refuses" not in log
    assert REFUSED_OPTIONS in bouncer.log()  # the refusal really came from pgbouncer
    assert "prepared statement" not in bouncer.log()


def test_a_worker_whose_hub_goes_through_pgbouncer_warns_and_still_works_by_polling(
    db: psycopg.Connection, spawn: Callable[..., WorkerProcess]
) -> None:
    w = spawn("pooled-hub", "--poll", "0.5", "--lease", "3")
    w.wait_log(POOLED_WARNING)
    run = enqueue_echo(db, "polled", duration=0.1)
    wait_until(lambda: status(db, run) == "completed", 20, f"the run to complete by polling\n{w.log()}")
    assert run_row(db, run)["attempt"] == 1


def test_serve_warns_when_its_hub_goes_through_pgbouncer_and_not_with_a_listen_url(
    worker_db: str, bouncer: pgbouncer.Bouncer, caplog: pytest.LogCaptureFixture
) -> None:
    pooled = bouncer.url_for(worker_db)
    caplog.set_level(logging.INFO, logger="runrow.hub")
    for server in serve(pooled, listen_url=worker_db):
        wait_until(lambda: "reached the hub" in caplog.text, 10, "the self-test to pass")
        with httpx.Client(base_url=server.url, timeout=10) as client:
            answer = client.post(f"/conversations/{uuid.uuid4()}/runs", json={"content": "hi"}, headers=ALICE)
            assert answer.status_code == 202, answer.text
    assert POOLED_WARNING not in caplog.text

    caplog.clear()
    for _server in serve(pooled):
        wait_until(lambda: POOLED_WARNING in caplog.text, 10, "the self-test to warn")


@pytest.mark.parametrize("ignored", [False, True], ids=["refused", "ignored"])
def test_migrate_through_a_transaction_pooler_is_refused_before_it_writes(
    database_url: str, ignored: bool
) -> None:
    """yoyo's search_path and migrate's lock_timeout are session settings: through a pooler they
    stayed on the server connections yoyo used, for the pooler's other clients (the pooler
    audit: a later client of the pool saw lock_timeout = 5s, search_path = runrow), and with a
    pool of one server connection migrate waited forever. It is refused, naming the way out,
    whether pgbouncer refuses the `options` startup parameter or drops it."""
    settings = {"ignore_startup_parameters": "extra_float_digits,options"} if ignored else {}
    with (
        temporary_database(database_url, "runrow_pooled_migrate", migrated=False) as direct,
        pgbouncer.running(database_url, pool_size=1, port=6433, settings=settings) as b,
    ):
        with pytest.raises(migrate_module.MigrateError, match="goes through a connection pooler") as refused:
            migrate_module.migrate(b.url_for(direct))
        assert "direct URL" in str(refused.value) and "sql/install.sql" in str(refused.value)
        with psycopg.connect(direct) as conn:
            assert conn.execute("SELECT to_regnamespace('runrow')").fetchone() == (None,)
        assert migrate_module.migrate(direct).version is not None  # the direct URL goes through


def test_the_readmes_pgbouncer_settings_load_and_apply(database_url: str) -> None:
    """The README's pgbouncer.ini block, pasted as it is: pgbouncer 1.18 takes no `;` comment
    after a value, and refused to start ("invalid value ... for parameter
    idle_transaction_timeout"), or on RELOAD kept its old values with only a log warning (the
    pooler audit), so the protections the Deployment section relies on were silently off."""
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    block = readme.split("```ini\n", 1)[1].split("```", 1)[0]
    with pgbouncer.running(database_url, port=6434, raw_settings=block) as b:
        admin = b.url_for(f"postgresql://{pgbouncer.SUPERUSER}@/pgbouncer")
        with psycopg.connect(admin, autocommit=True, prepare_threshold=None) as conn:
            shown = {row[0]: row[1] for row in conn.execute("SHOW CONFIG").fetchall()}
    settings = dict(
        (part.strip() for part in line.split("=", 1))
        for line in block.splitlines()
        if line.strip() and not line.lstrip().startswith(";")
    )
    assert settings["idle_transaction_timeout"] == "30", block
    for key, value in settings.items():
        assert shown[key] == value, (key, shown[key], value)


def test_a_tail_whose_listen_is_pooled_polls_instead_of_waiting_for_its_keepalive(
    database_url: str, bouncer: pgbouncer.Bouncer
) -> None:
    """`runrow tail` through the pooler without RUNROW_LISTEN_URL: its LISTEN hears nothing, and
    it trusted its waits, so the run's events came in bursts a keepalive (15 s) apart (the pooler
    audit: 15.5 s for a 4 s run). Its hub's self-test now finds the pooled LISTEN and stands the
    hub down, and the tail polls (every second)."""
    with temporary_database(database_url, "runrow_pooled_tail") as direct:
        with psycopg.connect(direct, autocommit=True) as conn:
            run_id = enqueue(conn)
            token = claim(conn, run_id)
            append(conn, run_id, token, [{"type": "text_delta", "text": "Hel"}])
        following = tail_process(bouncer.url_for(direct), run_id)
        try:
            time.sleep(5.5)  # it has shown what the journal holds, and its self-test (two probes) is done
            with psycopg.connect(direct, autocommit=True) as conn:
                append(conn, run_id, token, [{"type": "text_delta", "text": "lo"}])
                conn.execute(
                    "SELECT runrow.finish_run(run_id => %s, claim_token => %s, status => 'completed', "
                    'result => \'{"text": "Hello"}\')',
                    (run_id, token),
                )
            finished = time.monotonic()
            out, err = following.communicate(timeout=30)
            took = time.monotonic() - finished
        finally:
            if following.poll() is None:
                following.kill()
                following.communicate()
    assert following.returncode == 0 and out == "Hello", err
    # One of the tail's notes, not the hub's warning (it named the worker's --listen-url).
    assert "· the LISTEN URL looks pooled" in err and "set RUNROW_LISTEN_URL" in err, err
    # A poll tick (1 s) and a process exit, not the rest of a 15 s keepalive.
    assert took < 6.0, f"the tail took {took:.1f}s to show the ending: it waited for a wake\n{err}"


def test_a_worker_started_before_its_pgbouncer_drops_options_once_it_answers(
    db: psycopg.Connection, worker_db: str, database_url: str
) -> None:
    """Services started in the wrong order: the worker's first probe found no pgbouncer (a
    refused connection, not the refusal of `options`), so it kept `options`, every pool connect
    was then refused with "unsupported startup parameter: options", and after 30 s it exited 2
    saying the server was down (the pooler audit). It now waits for an answer to decide."""
    port = 6435
    url = f"postgresql://{OWNER}@127.0.0.1:{port}/{worker_db.rsplit('/', 1)[1].split('?', 1)[0]}"
    worker = WorkerProcess(url, "before-its-pooler", ["--poll", "0.5", "--lease", "3"])
    try:
        time.sleep(3.0)  # it has found nothing listening, and keeps asking
        assert worker.proc.poll() is None, worker.log()
        with pgbouncer.running(database_url, listen_addr="127.0.0.1", port=port):
            worker.wait_started(20)
            assert "worker pool: the server refuses the options startup parameter" in worker.log()
            run = enqueue_echo(db, "late pooler", duration=0.1)
            wait_until(lambda: status(db, run) == "completed", 20, f"the run to complete\n{worker.log()}")
    finally:
        worker.close()
