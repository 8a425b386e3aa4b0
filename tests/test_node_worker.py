"""A second language on the same queue (issue 15): examples/node/worker.js (npm's `pg`, the runrow.*
SQL API only) next to a Python worker, and the README's psql walkthrough run exactly as written.

- Both workers drain one queue: every run completed exactly once (one claim, one complete, attempt
  1), each worker claimed some, every journal complete and its text the echo, audit() clean. A run
  of another model the Node worker claims is handed back (defer_run, attempt given back, 1 s then
  2 s) and the Python worker runs it as its first attempt.
- The Node worker honours a stop: the cancel NOTIFY (confirmed by the row; a forged one stops
  nothing) ends its run `cancelled` with the partial text,
  and so does the heartbeat's cancel_requested alone; fenced out (reaped), it stands down.
- A Node-only fleet does what every worker must (examples/node/README.md): it reaps a SIGKILLed
  worker's run and fires due schedules; a retried attempt journals `superseded`, so the README's
  display rule shows the answer once; a failure the database would raise on every attempt ends the
  run `failed` at once, any other is released with a backoff; emoji are streamed whole; it rides
  out the loss of every connection (pool and LISTEN) without ending or releasing a run; and a drain
  releases what it holds: a claim that lands while stopping, runs past DRAIN_SECONDS, and on a
  second signal at once.
- The README's fenced psql block runs through psql against the test database.
"""

from __future__ import annotations

import itertools
import os
import re
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from worker_support import (
    REPO,
    WorkerProcess,
    db,
    enqueue_run,
    events,
    run_row,
    streamed_text,
    wait_status,
    wait_streaming,
    wait_until,
    worker_db,
)

__all__ = ["db", "worker_db"]

NODE_DIR = REPO / "examples" / "node"
TERMINAL = {"completed", "failed", "cancelled", "dead"}


def node_or_skip() -> str:
    node = shutil.which("node")
    if node is None:
        pytest.skip("skipped: node not found")
    if not (NODE_DIR / "node_modules" / "pg").is_dir():
        npm = shutil.which("npm")
        if npm is None:
            pytest.skip("skipped: npm not found (examples/node needs `npm install`)")
        subprocess.run([npm, "ci", "--no-audit", "--no-fund"], cwd=NODE_DIR, check=True, capture_output=True)
    return node


class NodeWorker:
    def __init__(self, url: str, name: str, log_dir: Path, **env: str) -> None:
        self.log_path = log_dir / f"{name}.log"
        self._log = self.log_path.open("wb")
        environment = {**os.environ, "DATABASE_URL": url, "WORKER_ID": name, "POLL_SECONDS": "0.5", **env}
        self.proc = subprocess.Popen(
            [node_or_skip(), "worker.js"],
            cwd=NODE_DIR,
            env=environment,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        wait_until(lambda: "listening" in self.log() or self.proc.poll() is not None, 20, f"{name} to listen")
        assert self.proc.poll() is None, self.log()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def signal(self, sig: int = signal.SIGTERM) -> None:
        self.proc.send_signal(sig)

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.terminate()
        code = self.proc.wait(timeout=20)
        self._log.close()
        return code


@pytest.fixture
def node_worker(worker_db: str, tmp_path: Path) -> Iterator[NodeWorker]:
    worker = NodeWorker(worker_db, "node-1", tmp_path)
    try:
        yield worker
    finally:
        worker.stop()


def test_node_and_python_workers_share_the_queue(
    db: psycopg.Connection, worker_db: str, node_worker: NodeWorker
) -> None:
    python = WorkerProcess(worker_db, "py-1", ["--concurrency", "2", "--poll", "0.5"]).wait_started()
    try:
        texts = {}
        conversation = uuid.uuid4()  # one conversation's turns run in order, whoever claims them
        for i in range(24):
            text = f"answer number {i}, from whichever worker"
            conv = conversation if i % 6 == 0 else None
            texts[
                enqueue_run(
                    db, f"q{i}", "echo", conversation_id=conv, metadata={"echo": text, "duration": 0.2}
                )
            ] = text
        for run in texts:
            assert wait_status(db, run, TERMINAL, 60) == "completed", (python.log(), node_worker.log())
    finally:
        python.close()
    assert node_worker.stop() == 0  # SIGTERM drains and exits 0

    rows = db.execute(
        "SELECT id, attempt, worker_id, result ->> 'text' FROM runrow.agent_run WHERE id = ANY(%s)",
        (list(texts),),
    ).fetchall()
    claimed_by = {worker for _, _, worker, _ in rows}
    assert claimed_by == {"node-1", "py-1"}  # both workers claimed some
    for run, attempt, _, result in rows:
        assert attempt == 1 and result == texts[run]
        kinds = [e["type"] for e in events(db, run)]
        assert kinds.count("run_claimed") == 1 and kinds.count("complete") == 1 and kinds[-1] == "complete"
        assert kinds[:3] == ["user_message_created", "run_queued", "run_claimed"]
        assert "message_stop" in kinds and streamed_text(db, run) == texts[run]
    turns = db.execute(
        "SELECT started_at, finished_at FROM runrow.agent_run WHERE conversation_id = %s "
        "ORDER BY enqueue_seq",
        (conversation,),
    ).fetchall()
    # Turns started and ended in their order. Not "each started after the last one ended": both
    # stamps are now(), their transactions' start, and a claim whose statement began while the
    # previous turn's ending was being written can see it ended (a later statement's snapshot)
    # and carry the earlier stamp (seen once in CI). One running turn per conversation is the
    # partial unique index's rule, proved in pgtap/invariants.sql and the race tests.
    assert all(prev[0] < nxt[0] and prev[1] < nxt[1] for prev, nxt in itertools.pairwise(turns))
    assert db.execute("SELECT * FROM runrow.audit()").fetchall() == []


def test_node_worker_honours_a_stop(db: psycopg.Connection, node_worker: NodeWorker) -> None:
    run = enqueue_run(db, "long", "echo", metadata={"echo": "x" * 600, "duration": 30})
    wait_until(lambda: len(streamed_text(db, run)) >= 20, 20, "the node worker to stream")
    assert db.execute("SELECT runrow.cancel_run(%s)", (run,)).fetchone()[0] == "cancel_requested"
    # The lease is 30 s, so the first heartbeat is 10 s away: only the cancel NOTIFY ends it this soon.
    assert wait_status(db, run, TERMINAL, 8) == "cancelled"
    partial = db.execute("SELECT result ->> 'text' FROM runrow.agent_run WHERE id = %s", (run,)).fetchone()[0]
    assert 20 <= len(partial) < 600 and partial == streamed_text(db, run)


def test_a_forged_cancel_notify_stops_nothing(db: psycopg.Connection, node_worker: NodeWorker) -> None:
    # Any login may NOTIFY runrow_cancel: the hint makes the worker beat at once (the lease is
    # 30 s, the next beat 10 s away), and only the row's cancel_requested may stop the run.
    run = enqueue_run(db, "long", "echo", metadata={"echo": "y" * 300, "duration": 2})
    wait_until(lambda: len(streamed_text(db, run)) >= 20, 20, "the node worker to stream")
    before = run_row(db, run)["claim_expires_at"]
    db.execute("SELECT pg_notify('runrow_cancel', %s)", (str(run),))
    wait_until(lambda: run_row(db, run)["claim_expires_at"] > before, 5, "the hint's beat")
    assert wait_status(db, run, TERMINAL, 10) == "completed"
    assert streamed_text(db, run) == "y" * 300


def test_node_worker_sees_a_stop_in_its_heartbeat(
    db: psycopg.Connection, worker_db: str, tmp_path: Path
) -> None:
    worker = NodeWorker(worker_db, "node-hb", tmp_path, LEASE_SECONDS="3")
    try:
        run = enqueue_run(db, "long", "echo", metadata={"echo": "y" * 600, "duration": 60})
        wait_until(lambda: len(streamed_text(db, run)) >= 5, 20, "the node worker to stream")
        # The flag without the NOTIFY (as the owner may write): only the heartbeat poll can see it.
        db.execute("UPDATE runrow.agent_run SET cancel_requested = true WHERE id = %s", (run,))
        assert wait_status(db, run, TERMINAL, 30) == "cancelled"
    finally:
        worker.stop()


def test_node_worker_stands_down_when_fenced_out(db: psycopg.Connection, node_worker: NodeWorker) -> None:
    run = enqueue_run(db, "long", "echo", metadata={"echo": "z" * 600, "duration": 60})
    wait_until(lambda: len(streamed_text(db, run)) >= 5, 20, "the node worker to stream")
    db.execute(
        "UPDATE runrow.agent_run SET claim_expires_at = now() - interval '1 hour' WHERE id = %s", (run,)
    )
    assert db.execute(
        "SELECT outcome FROM runrow.reap_expired_runs(0) WHERE run_id = %s", (run,)
    ).fetchone() == ("failed",)
    wait_until(
        lambda: f"run {run}: lost its claim, standing down" in node_worker.log(),
        20,
        "the node worker to stand down",
    )
    kinds = [e["type"] for e in events(db, run)]
    assert (
        kinds.count("complete") == 1 and kinds[-1] == "complete"
    )  # the reaper's; the zombie wrote nothing after
    assert db.execute("SELECT status FROM runrow.agent_run WHERE id = %s", (run,)).fetchone() == ("failed",)


def walkthrough() -> str:
    readme = (REPO / "README.md").read_text()
    match = re.search(r"<!-- walkthrough: .*? -->\n```sql\n(.*?)```", readme, re.S)
    assert match, "README.md has no psql walkthrough block"
    return match.group(1)


def test_the_readme_psql_walkthrough_runs_as_written(worker_db: str) -> None:
    psql = shutil.which("psql")
    if psql is None:
        pytest.skip("skipped: psql not found")
    done = subprocess.run(
        [psql, worker_db, "-X", "-v", "ON_ERROR_STOP=1"],
        input=walkthrough(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "run_claimed" in out and "text_delta" in out and "complete" in out
    with psycopg.connect(worker_db, autocommit=True) as conn:
        assert conn.execute(
            "SELECT count(*) FROM runrow.agent_run WHERE status = 'completed'"
        ).fetchone() == (1,)
        assert conn.execute("SELECT * FROM runrow.audit()").fetchall() == []


def displayed_text(db: psycopg.Connection, run: uuid.UUID) -> str:
    """The README's display rule: the text_deltas in seq order, less those a `superseded` takes back."""
    journal = events(db, run)
    dropped = {
        seq
        for e in journal
        if e["type"] == "superseded"
        for seq in range(e["after_seq"] + 1, e["through_seq"] + 1)
    }
    return "".join(e["text"] for e in journal if e["type"] == "text_delta" and e["seq"] not in dropped)


def claim_seqs(db: psycopg.Connection, run: uuid.UUID) -> list[int]:
    return [e["seq"] for e in events(db, run) if e["type"] == "run_claimed"]


# The other sessions of the test's own database: the worker's (and a test's second connection).
OTHER_SESSIONS = "FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"


def node_sessions(db: psycopg.Connection, where: str) -> int:
    return db.execute(f"SELECT count(*) {OTHER_SESSIONS} AND {where}").fetchone()[0]


def test_a_node_only_fleet_reaps_a_killed_worker_and_fires_schedules(
    db: psycopg.Connection, worker_db: str, tmp_path: Path
) -> None:
    fast = {"LEASE_SECONDS": "2", "GRACE_SECONDS": "0"}
    doomed = NodeWorker(worker_db, "node-doomed", tmp_path, **fast)
    conversation = uuid.uuid4()
    answer = "the first turn's answer, streamed twice"
    first = enqueue_run(
        db,
        "one",
        "echo",
        conversation_id=conversation,
        max_attempts=2,
        metadata={"echo": answer, "duration": 1},
    )
    wait_until(lambda: len(streamed_text(db, first)) >= 3, 20, "the doomed worker to stream")
    doomed.signal(signal.SIGKILL)
    doomed.stop()
    second = enqueue_run(
        db, "two", "echo", conversation_id=conversation, metadata={"echo": "turn two", "duration": 0}
    )
    # A schedule whose tick is due now (yearly, so no other tick falls due meanwhile).
    schedule = db.execute(
        "SELECT runrow.create_schedule(name => 'node-tick', cron => '0 0 1 1 *', content => '\"tick\"', "
        'model => \'echo\', metadata => \'{"echo": "tick", "duration": 0}\')'
    ).fetchone()[0]
    db.execute(
        "UPDATE runrow.schedule SET next_fire_at = date_trunc('year', now() AT TIME ZONE 'UTC') "
        "AT TIME ZONE 'UTC' WHERE id = %s",
        (schedule,),
    )
    survivor = NodeWorker(worker_db, "node-survivor", tmp_path, **fast)
    try:
        # Only a reaper takes the dead worker's run; until then the conversation's next turn waits.
        assert wait_status(db, second, TERMINAL, 20) == "completed", survivor.log()
        ticked = wait_until(
            lambda: db.execute(
                "SELECT id FROM runrow.agent_run WHERE idempotency_key LIKE %s AND status = 'completed'",
                (f"runrow-schedule:{schedule}:%",),
            ).fetchone(),
            10,
            "the schedule's run to complete",
        )
    finally:
        assert survivor.stop() == 0
    assert ticked and f"reaped run {first}: requeued" in survivor.log()
    row = run_row(db, first)
    assert (row["status"], row["attempt"], row["result"]["text"]) == ("completed", 2, answer)
    # Attempt 2 took back what attempt 1 streamed: the answer shows once.
    first_claim, second_claim = claim_seqs(db, first)
    superseded = [e for e in events(db, first) if e["type"] == "superseded"]
    assert [(e["after_seq"], e["through_seq"], e["attempt"]) for e in superseded] == [
        (first_claim, second_claim - 1, 2)
    ]
    assert superseded[0]["seq"] == second_claim + 1  # first thing the attempt journals
    assert displayed_text(db, first) == answer and streamed_text(db, first) != answer


def test_node_worker_ends_each_failure_by_its_kind(db: psycopg.Connection, node_worker: NodeWorker) -> None:
    # The database refuses this run's text on every attempt, as a CHECK would (this test's own database).
    db.execute(
        "CREATE FUNCTION runrow.test_refuse_poison() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
        "IF NEW.payload ->> 'text' LIKE '%poison%' THEN "
        "RAISE EXCEPTION 'no poison in the journal' USING ERRCODE = 'check_violation'; END IF; "
        "RETURN NEW; END $$"
    )
    db.execute(
        "CREATE TRIGGER test_refuse_poison BEFORE INSERT ON runrow.run_event "
        "FOR EACH ROW EXECUTE FUNCTION runrow.test_refuse_poison()"
    )
    poison = enqueue_run(db, "p", "echo", max_attempts=3, metadata={"echo": "a poison pill", "duration": 0})
    flaky = enqueue_run(
        db, "f", "echo", max_attempts=2, metadata={"echo": "flaky answer", "duration": 0.1, "fail": True}
    )
    # 51 UTF-16 units in 7 steps: a slice by units ends inside a surrogate pair (at unit 7), and
    # jsonb refuses the lone half (22P02): emoji must be sliced whole, by code points.
    emoji = "😀" * 25 + "!"
    smiles = enqueue_run(db, "e", "echo", metadata={"echo": emoji, "duration": 0.35})

    assert wait_status(db, poison, TERMINAL, 15) == "failed", node_worker.log()
    row = run_row(db, poison)
    assert row["attempt"] == 1 and len(claim_seqs(db, poison)) == 1  # never handed back for another try
    assert "SQLSTATE 23514" in row["error"] and "not retried" in row["error"]

    assert wait_status(db, flaky, TERMINAL, 15) == "dead", node_worker.log()
    journal = events(db, flaky)
    [requeued] = [e for e in journal if e["type"] == "run_requeued"]
    assert requeued.get("not_before"), requeued  # released with a backoff (retry_in)
    first_claim, second_claim = claim_seqs(db, flaky)
    [superseded] = [e for e in journal if e["type"] == "superseded"]
    assert (superseded["after_seq"], superseded["through_seq"]) == (first_claim, second_claim - 1)
    assert displayed_text(db, flaky) == "flaky answer" and streamed_text(db, flaky) == "flaky answer" * 2

    assert wait_status(db, smiles, TERMINAL, 15) == "completed", node_worker.log()
    assert run_row(db, smiles)["result"]["text"] == emoji and streamed_text(db, smiles) == emoji


def test_node_worker_rides_out_losing_its_connections(
    db: psycopg.Connection, worker_db: str, tmp_path: Path
) -> None:
    # Polling once a minute: after the cut, only a LISTEN made again can wake it this soon.
    worker = NodeWorker(worker_db, "node-cut", tmp_path, LEASE_SECONDS="3", POLL_SECONDS="60")
    try:
        text = "".join(f"{i:03d}," for i in range(150))  # a gap or a repeat shows
        run = enqueue_run(db, "q", "echo", metadata={"echo": text, "duration": 2.5})
        wait_streaming(db, run)
        for _ in range(3):  # every session of the worker, idle or mid-call, its LISTEN included
            assert worker.proc.poll() is None, worker.log()
            # Its own sessions only: an autovacuum worker in this database is no role's to signal
            # (CI's run failed here with "must be a superuser to terminate superuser process").
            terminated = db.execute(
                f"SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) {OTHER_SESSIONS}"
                " AND application_name = 'node-cut'"
            ).fetchone()[0]
            assert terminated >= 1
            time.sleep(0.4)
        # And one session cut mid-call: an append waiting on the run's row (held here) is ended by the
        # server, then made again on a fresh connection, once (no repeat in the journal).
        with psycopg.connect(worker_db) as holder:
            holder.execute("SELECT 1 FROM runrow.agent_run WHERE id = %s FOR UPDATE", (run,))
            appending = "wait_event_type = 'Lock' AND position('append_events' in query) > 0"
            wait_until(lambda: node_sessions(db, appending), 5, "an append to wait on the run's row")
            db.execute(
                f"SELECT pg_terminate_backend(pid) {OTHER_SESSIONS} AND {appending}"
                " AND application_name = 'node-cut'"
            )
        assert wait_status(db, run, TERMINAL, 15) == "completed", worker.log()
        assert worker.proc.poll() is None, worker.log()
        assert "database call failed, trying again" in worker.log()
        row = run_row(db, run)
        assert row["attempt"] == 1 and row["result"]["text"] == text and streamed_text(db, run) == text
        listening = "query = 'LISTEN runrow_cancel'"
        wait_until(lambda: node_sessions(db, listening), 10, "it to LISTEN again")
        again = enqueue_run(db, "q2", "echo", metadata={"echo": "after the cut", "duration": 0})
        assert wait_status(db, again, TERMINAL, 8) == "completed", worker.log()
    finally:
        assert worker.stop() == 0
    assert "LISTEN connection lost" in worker.log()
    assert db.execute("SELECT * FROM runrow.audit()").fetchall() == []


def test_node_worker_drain_releases_what_it_holds(
    db: psycopg.Connection, worker_db: str, tmp_path: Path
) -> None:
    def released(run: uuid.UUID, worker: NodeWorker) -> None:
        row = run_row(db, run)
        assert (row["status"], row["attempt"]) == ("queued", 1), worker.log()
        assert row["error"].startswith("drained"), row["error"]
        kinds = [e["type"] for e in events(db, run)]
        assert kinds.count("run_requeued") == 1 and "complete" not in kinds
        db.execute("SELECT runrow.cancel_run(%s)", (run,))  # not the next worker's to claim

    # 1. A claim in flight when SIGTERM lands: its run is released as it arrives, never started.
    run = enqueue_run(db, "q", "echo", max_attempts=2, metadata={"echo": "never started", "duration": 0})
    with psycopg.connect(worker_db) as locker:
        locker.execute("LOCK TABLE runrow.agent_run IN EXCLUSIVE MODE")  # holds the first claim
        worker = NodeWorker(worker_db, "node-claiming", tmp_path)
        try:
            blocked = "wait_event_type = 'Lock' AND position('claim_runs' in query) > 0"
            wait_until(lambda: node_sessions(db, blocked), 10, "the claim to wait on the lock")
            worker.signal()
            wait_until(lambda: "draining" in worker.log(), 5, "the drain to begin")
            locker.commit()
            assert worker.proc.wait(timeout=10) == 0, worker.log()
        finally:
            locker.rollback()
            worker.stop()
    released(run, worker)
    assert "message_start" not in [e["type"] for e in events(db, run)]

    # 2. DRAIN_SECONDS spent: the run still held is stopped and released, exit 0. 3. A second
    # SIGTERM: released at once rather than abandoned, exit 1.
    for how, budget, code in [("budget", "1", 0), ("signal", "60", 1)]:
        worker = NodeWorker(worker_db, f"node-{how}", tmp_path, DRAIN_SECONDS=budget)
        try:
            run = enqueue_run(
                db, "long", "echo", max_attempts=2, metadata={"echo": "z" * 600, "duration": 60}
            )
            wait_streaming(db, run)
            worker.signal()
            if how == "signal":
                wait_until(lambda w=worker: "draining" in w.log(), 5, "the drain to begin")
                worker.signal()
            assert worker.proc.wait(timeout=8) == code, worker.log()
        finally:
            worker.stop()
        released(run, worker)


def hand_backs(db: psycopg.Connection, run: uuid.UUID) -> list[float]:
    """The seconds each deferral of `run` kept it from every claimer (not_before - its now())."""
    rows = db.execute(
        "SELECT extract(epoch FROM (payload ->> 'not_before')::timestamptz - created_at) "
        "FROM runrow.run_event WHERE run_id = %s AND type = 'run_requeued' "
        "AND (payload ->> 'deferred')::boolean ORDER BY seq",
        (run,),
    ).fetchall()
    return [float(r[0]) for r in rows]


def test_node_worker_hands_a_run_of_another_model_back_for_the_fleet(
    db: psycopg.Connection, worker_db: str, tmp_path: Path
) -> None:
    """claim_runs has no model filter, so a Node echo worker next to Python workers claims their
    runs. It ended them `failed` (the audit): a run the fleet could run, lost. Now it hands such
    a run back with defer_run, its attempt given back (at max_attempts = 1, where release_run
    would fail it), journaling nothing of its own, not claimable for 1 s, then 2 s, ... (at most
    60 s) per hand-back of the same run; a Python worker then runs it as its first attempt.
    Echo runs go on meanwhile. The Node worker polls every 2 s and the Python one every 0.2 s:
    both race for a run as it comes due, and each race Node wins doubles the wait (bounded)."""
    node = NodeWorker(worker_db, "node-1", tmp_path, POLL_SECONDS="2")
    try:
        hand_back_then_python_runs_them(db, worker_db, node)
    finally:
        node.stop()


def hand_back_then_python_runs_them(db: psycopg.Connection, worker_db: str, node: NodeWorker) -> None:
    others = [
        enqueue_run(db, f"other {i}", "not-echo", metadata={"echo": f"from python {i}"}) for i in range(2)
    ]
    echo = enqueue_run(db, "e", "echo", metadata={"echo": "still echoing", "duration": 0})
    # Alone on the queue, the Node worker hands each back twice, the second time for longer.
    for run in others:
        wait_until(lambda r=run: len(hand_backs(db, r)) >= 2, 20, f"two hand-backs\n{node.log()}", 0.1)
        assert hand_backs(db, run)[:2] == [1.0, 2.0], node.log()
        row = run_row(db, run)
        assert row["status"] in ("queued", "running") and row["attempt"] <= 1, row  # running: held now
        reason = 'worker.js runs model "echo" only, not "not-echo": handed back with its attempt'
        assert row["status"] == "running" or row["error"].startswith(reason), row
    assert wait_status(db, echo, TERMINAL, 15) == "completed", node.log()
    assert run_row(db, echo)["result"]["text"] == "still echoing"

    python = WorkerProcess(worker_db, "py-1", ["--poll", "0.2"]).wait_started()
    try:
        for i, run in enumerate(others):
            assert wait_status(db, run, TERMINAL, 90) == "completed", (python.log(), node.log())
            row = run_row(db, run)
            assert (row["worker_id"], row["attempt"], row["error"]) == ("py-1", 1, None), row
            assert row["result"]["text"] == f"from python {i}"
            kinds = [e["type"] for e in events(db, run)]
            # Node's claims journaled run_claimed and run_requeued only: no message, no text.
            assert kinds.count("message_start") == 1 and streamed_text(db, run) == f"from python {i}", kinds
            assert kinds.count("run_claimed") == kinds.count("run_requeued") + 1, kinds
    finally:
        python.close()
    assert node.stop() == 0
    assert db.execute("SELECT * FROM runrow.audit()").fetchall() == []


@pytest.mark.parametrize(
    ("name", "value", "wanted"),
    [
        ("LEASE_SECONDS", "abc", "a whole number from 1 to 3600"),
        ("LEASE_SECONDS", "0", "a whole number from 1 to 3600"),
        ("CONCURRENCY", "0", "a whole number from 1 to 1000"),
        ("CONCURRENCY", "2.5", "a whole number from 1 to 1000"),
        ("POLL_SECONDS", "", "a number from 0.01 to 3600"),
        ("POLL_SECONDS", "NaN", "a number from 0.01 to 3600"),
        ("GRACE_SECONDS", "-1", "a whole number from 0 to 86400"),
        ("DRAIN_SECONDS", "1e3", "a number from 0 to 86400"),
        ("WORKER_ID", "a\nb", "1 to 200 printable characters"),
        ("ECHO_MODEL", "", "1 to 200 printable characters"),
    ],
)
def test_node_worker_refuses_a_bad_setting_naming_it(
    worker_db: str, name: str, value: str, wanted: str
) -> None:
    """LEASE_SECONDS=abc logged "invalid input syntax for type integer: NaN" on every poll and ran
    the reaper every millisecond (setTimeout(reap, NaN)); CONCURRENCY=0 idled without a word."""
    environment = {**os.environ, "DATABASE_URL": worker_db, name: value}
    done = subprocess.run(
        [node_or_skip(), "worker.js"],
        cwd=NODE_DIR,
        env=environment,
        capture_output=True,
        text=True,
        timeout=20,
    )
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert done.stderr.startswith(f"worker.js: {name} must be {wanted}, got "), done.stderr
    assert done.stdout == ""  # nothing started: no connection, no "listening"
