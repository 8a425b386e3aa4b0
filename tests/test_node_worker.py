"""A second language on the same queue (issue 15): examples/node/worker.js (npm's `pg`, the runrow.*
SQL API only) next to a Python worker, and the README's psql walkthrough run exactly as written.

- Both workers drain one queue: every run completed exactly once (one claim, one complete, attempt
  1), each worker claimed some, every journal complete and its text the echo, audit() clean.
- The Node worker honours a stop: the cancel NOTIFY ends its run `cancelled` with the partial text,
  and so does the heartbeat's cancel_requested alone; fenced out (reaped), it stands down.
- The README's fenced psql block runs through psql against the test database.
"""

from __future__ import annotations

import itertools
import os
import re
import shutil
import subprocess
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
    streamed_text,
    wait_status,
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
                enqueue_run(db, f"q{i}", "m", conversation_id=conv, metadata={"echo": text, "duration": 0.2})
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
    run = enqueue_run(db, "long", "m", metadata={"echo": "x" * 600, "duration": 30})
    wait_until(lambda: len(streamed_text(db, run)) >= 20, 20, "the node worker to stream")
    assert db.execute("SELECT runrow.cancel_run(%s)", (run,)).fetchone()[0] == "cancel_requested"
    # The lease is 30 s, so the first heartbeat is 10 s away: only the cancel NOTIFY ends it this soon.
    assert wait_status(db, run, TERMINAL, 8) == "cancelled"
    partial = db.execute("SELECT result ->> 'text' FROM runrow.agent_run WHERE id = %s", (run,)).fetchone()[0]
    assert 20 <= len(partial) < 600 and partial == streamed_text(db, run)


def test_node_worker_sees_a_stop_in_its_heartbeat(
    db: psycopg.Connection, worker_db: str, tmp_path: Path
) -> None:
    worker = NodeWorker(worker_db, "node-hb", tmp_path, LEASE_SECONDS="3")
    try:
        run = enqueue_run(db, "long", "m", metadata={"echo": "y" * 600, "duration": 60})
        wait_until(lambda: len(streamed_text(db, run)) >= 5, 20, "the node worker to stream")
        # The flag without the NOTIFY (as the owner may write): only the heartbeat poll can see it.
        db.execute("UPDATE runrow.agent_run SET cancel_requested = true WHERE id = %s", (run,))
        assert wait_status(db, run, TERMINAL, 30) == "cancelled"
    finally:
        worker.stop()


def test_node_worker_stands_down_when_fenced_out(db: psycopg.Connection, node_worker: NodeWorker) -> None:
    run = enqueue_run(db, "long", "m", metadata={"echo": "z" * 600, "duration": 60})
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
