"""A database restart must not cost a run an attempt (issue 17).

Real worker processes under load on a private cluster of their own (the test restarts the server,
so never the session's shared one), runs with max_attempts = 1, and two `pg_ctl restart -m
immediate` (a crash: every session dies mid-statement, the server recovers from its WAL) while
runs stream. Every run must end completed on attempt 1: its claim outlived the outage, so nothing
may release it, fail it or redo it. Journals gap-free with one `complete`, last; audit() clean.
The cluster runs with fsync and synchronous_commit on: a crash may then lose only what was never
acknowledged, as on a real server (the test default turns both off, which loses acknowledged
commits in a crash).
"""

from __future__ import annotations

import re
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from agent_support import TOOLS, agent_env, enqueue_agent, steps
from worker_support import ECHO, WorkerProcess, enqueue_echo, wait_until

from pyworker.db import devdb
from pyworker.db.migrate import migrate
from pyworker.demo import tools as demo_tools
from pyworker.fake.server import FakeModel

LEASE = 6
FLAGS = ["--lease", str(LEASE), "--grace", "2", "--poll", "0.5", "--reap-interval", "1", "--drain", "5"]
DEMO_TOOL_CALLS = {"list_files": 1, "read_file": 3, "send_email": 1, "write_file": 1}
DEMO_STEPS = 12


@pytest.fixture
def private_cluster() -> Iterator[devdb.Cluster]:
    with devdb.throwaway(fsync=True) as cluster:
        migrate(cluster.url)
        yield cluster


def _count(db: psycopg.Connection, sql: str, *args: Any) -> int:
    row = db.execute(sql, args).fetchone()
    assert row is not None
    return int(row[0])


def _streaming(db: psycopg.Connection, runs: list[uuid.UUID]) -> int:
    """Runs running with a delta journaled: genuinely mid-flight."""
    return _count(
        db,
        "SELECT count(*) FROM runrow.agent_run AS r WHERE r.id = ANY(%s) AND r.status = 'running' "
        "AND EXISTS (SELECT 1 FROM runrow.run_event AS e WHERE e.run_id = r.id AND e.type = 'text_delta')",
        runs,
    )


def _reconnect(url: str) -> psycopg.Connection:
    deadline = time.monotonic() + 30
    while True:
        try:
            return psycopg.connect(url, autocommit=True)
        except psycopg.OperationalError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def _restart_twice_under_load(
    cluster: devdb.Cluster, runs: list[uuid.UUID], workers: list[WorkerProcess], at_least: int
) -> list[int]:
    """Two immediate restarts, each once `at_least` runs stream; how many streamed at each."""
    hit = []
    for n in range(2):
        with psycopg.connect(cluster.url, autocommit=True) as db:
            wait_until(lambda db=db: _streaming(db, runs) >= at_least, 60, f"{at_least} runs streaming")
            hit.append(_streaming(db, runs))
        devdb.restart(cluster, "immediate")
        for w in workers:
            assert w.proc.poll() is None, f"{w.name} exited on restart {n + 1}\n{w.log()}"
        time.sleep(1.0)  # let the workers feel it before the next one
    return hit


def _wait_all_ended(url: str, runs: list[uuid.UUID], timeout: float) -> None:
    with _reconnect(url) as db:
        wait_until(
            lambda: (
                _count(
                    db,
                    "SELECT count(*) FROM runrow.agent_run WHERE id = ANY(%s) "
                    "AND status IN ('completed', 'failed', 'cancelled', 'dead')",
                    runs,
                )
                == len(runs)
            ),
            timeout,
            "every run to end",
            interval=0.25,
        )


def _violations(
    db: psycopg.Connection, runs: list[uuid.UUID], per_run: Callable[[uuid.UUID, dict[str, Any]], list[str]]
) -> list[str]:
    found: list[str] = []
    statuses = Counter(
        f"{status} on attempt {attempt}"
        for status, attempt in db.execute(
            "SELECT status, attempt FROM runrow.agent_run WHERE id = ANY(%s)", (runs,)
        ).fetchall()
    )
    print("runs:", ", ".join(f"{n} {what}" for what, n in sorted(statuses.items())))
    for run in runs:
        row = db.execute(
            "SELECT status, attempt, error, result FROM runrow.agent_run WHERE id = %s", (run,)
        ).fetchone()
        assert row is not None
        status, attempt, error, result = row
        if (status, attempt) != ("completed", 1):
            found.append(f"run {run}: {status} on attempt {attempt}: {error}")
        journal = db.execute(
            "SELECT seq, type, payload FROM runrow.run_event WHERE run_id = %s ORDER BY seq", (run,)
        ).fetchall()
        seqs = [seq for seq, _, _ in journal]
        if seqs != list(range(1, len(seqs) + 1)):
            found.append(f"run {run}: journal seqs are not 1..{len(seqs)}")
        kinds = [kind for _, kind, _ in journal]
        if kinds.count("complete") != 1 or kinds[-1] != "complete":
            found.append(f"run {run}: {kinds.count('complete')} complete events, last {kinds[-1:]}")
        if kinds.count("run_claimed") != 1:
            found.append(f"run {run}: claimed {kinds.count('run_claimed')} times")
        found += per_run(run, {"journal": journal, "result": result})
    found += [
        f"audit: {invariant} {run or ''} {detail}"
        for invariant, run, detail in db.execute("SELECT invariant, run_id, detail FROM runrow.audit()")
    ]
    return found


def _story(violations: list[str], workers: list[WorkerProcess]) -> str:
    """The violations, then every worker's log lines that name a run they name: a run's claim,
    beats, flushes and ending, whichever worker wrote them (a log's tail alone missed them)."""
    runs = set(re.findall(r"[0-9a-f]{8}(?:-[0-9a-f]{4}){3}-[0-9a-f]{12}", "\n".join(violations)))
    told = [*violations]
    for w in workers:
        lines = [line for line in w.log().splitlines() if any(run in line for run in runs)]
        told += [f"--- {w.name}: {len(lines)} lines about those runs", *lines[-200:]]
    return "\n".join(told)


def _stop(workers: list[WorkerProcess]) -> None:
    for w in workers:
        w.close()


def test_echo_runs_survive_two_immediate_restarts(private_cluster: devdb.Cluster) -> None:
    url = private_cluster.url
    texts: dict[uuid.UUID, str] = {}
    with psycopg.connect(url, autocommit=True) as db:
        for i in range(40):
            text = f"[run {i}] " + " ".join(f"word{i}-{k}" for k in range(60))
            texts[enqueue_echo(db, text, duration=4.0, max_attempts=1)] = text
    runs = list(texts)
    workers = [
        WorkerProcess(url, f"echo-{k}", [*FLAGS, "--concurrency", "4"], handler=ECHO) for k in range(4)
    ]
    try:
        for w in workers:
            w.wait_started(30)
        hit = _restart_twice_under_load(private_cluster, runs, workers, at_least=8)
        _wait_all_ended(url, runs, 120)
    finally:
        _stop(workers)

    def echoed(run: uuid.UUID, seen: dict[str, Any]) -> list[str]:
        text = "".join(p.get("text", "") for _, kind, p in seen["journal"] if kind == "text_delta")
        result = (seen["result"] or {}).get("text")
        if not (text == result == texts[run]):
            lengths = f"journal {len(text)}, result {len(result or '')}, echo {len(texts[run])}"
            return [f"run {run}: text lengths differ: {lengths}"]
        return []

    with psycopg.connect(url, autocommit=True) as db:
        violations = _violations(db, runs, echoed)
    retries = sum(w.log().count("retrying") for w in workers)
    print(f"echo: runs streaming at the restarts {hit}; worker log lines on database retries: {retries}")
    assert not violations, _story(violations, workers)


def test_agent_runs_survive_two_immediate_restarts(private_cluster: devdb.Cluster, tmp_path: Path) -> None:
    url = private_cluster.url
    demo_dir = tmp_path / "demo"
    with FakeModel("demo", delta_delay=0.01) as fake:
        with psycopg.connect(url, autocommit=True) as db:
            runs = [enqueue_agent(db, max_attempts=1) for _ in range(24)]
        env = agent_env(fake.base_url, demo_dir, "0.2")
        workers = [
            WorkerProcess(url, f"agent-{k}", ["--tools", TOOLS, *FLAGS, "--concurrency", "4"], env=env,
                          handler="pyworker.agent:handle")
            for k in range(3)
        ]  # fmt: skip
        try:
            for w in workers:
                w.wait_started(30)
            hit = _restart_twice_under_load(private_cluster, runs, workers, at_least=6)
            _wait_all_ended(url, runs, 180)
        finally:
            _stop(workers)
        requests = len(fake.requests)

    with psycopg.connect(url, autocommit=True) as db:
        keys = dict(db.execute("SELECT idempotency_key, run_id FROM runrow.tool_effect").fetchall())

        def one_of_each(run: uuid.UUID, seen: dict[str, Any]) -> list[str]:
            found = []
            if len(steps(db, run)) != DEMO_STEPS:
                found.append(f"run {run}: {len(steps(db, run))} steps, not {DEMO_STEPS}")
            effects: dict[str, int] = {}
            for record in demo_tools.records(demo_dir):
                if keys.get(record.idempotency_key) == run:
                    effects[record.tool] = effects.get(record.tool, 0) + 1
                    if record.tool == "send_email" and record.executions != 1:
                        found.append(f"run {run}: send_email ran {record.executions} times")
            if effects != DEMO_TOOL_CALLS:
                found.append(f"run {run}: tool effects {effects}")
            return found

        violations = _violations(db, runs, one_of_each)
    retries = sum(w.log().count("retrying") for w in workers)
    print(
        f"agent: runs streaming at the restarts {hit}; model requests {requests} for {len(runs)} runs; "
        f"worker log lines on database retries: {retries}"
    )
    assert not violations, _story(violations, workers)
