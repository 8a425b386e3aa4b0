"""THE kill test (seeds/003's checklist): run the agent on the multi-step demo task, SIGKILL the
worker mid-run, let another worker resume it from the step log, and check that every side effect
happened exactly once downstream and the transcript equals an uninterrupted run's.

The demo task (fake model scenario `demo`, tools from pyworker/demo/tools.py): list_files,
read_file x2, send_email (non-idempotent), write_file, read_file, then a summary: 12 steps.
The tools record every execution keyed by the idempotency key, as a downstream service that
dedups by key would: `effects` rows are what happened downstream (must equal the
uninterrupted run's), `executions` how often a tool body ran (a kill mid-tool may run it twice,
with the same key).
"""

from __future__ import annotations

import os
import random
import shutil
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg
from agent_support import (
    QUICK_TAKEOVER,
    ForkedWorker,
    agent_env,
    agent_worker,
    effect_keys,
    enqueue_agent,
    steps,
    transcript,
)
from worker_support import (
    WorkerProcess,
    db,
    events,
    run_row,
    wait_status,
    wait_streaming,
    wait_until,
    worker_db,
)

from pyworker.demo import tools as demo_tools
from pyworker.fake.server import FakeModel

__all__ = ["db", "worker_db"]

DEMO_TOOL_CALLS = {"list_files": 1, "read_file": 3, "send_email": 1, "write_file": 1}
DEMO_STEPS = 12


def downstream(demo_dir: Path, conn: psycopg.Connection, run_id: uuid.UUID) -> dict[str, dict[str, int]]:
    """Per tool, for this run's calls: effects (distinct keys downstream) and executions."""
    keys = effect_keys(conn, run_id)
    out: dict[str, dict[str, int]] = {}
    for e in demo_tools.records(demo_dir):
        if e.idempotency_key in keys:
            counts = out.setdefault(e.tool, {"effects": 0, "executions": 0})
            counts["effects"] += 1
            counts["executions"] += e.executions
    return out


def effects_of(counts: dict[str, dict[str, int]]) -> dict[str, int]:
    return {tool: c["effects"] for tool, c in counts.items()}


def reset_workspace(demo_dir: Path) -> None:
    """Back to the seeded files (the downstream record stays: rows are per key, so per run)."""
    workspace = demo_tools.workspace(demo_dir)
    shutil.rmtree(workspace / "report.md", ignore_errors=True)
    (workspace / "report.md").unlink(missing_ok=True)


def executing_effects(db: psycopg.Connection, run: str) -> list[tuple[str, str, int]]:
    return db.execute(
        "SELECT tool, state, started_attempt FROM runrow.tool_effect WHERE run_id = %s AND state <> 'done'",
        (run,),
    ).fetchall()


def model_requests_of(fake: FakeModel, start: int) -> int:
    return len(fake.requests) - start


def test_a_response_cut_by_sigkill_is_charged_to_the_budget(db: psycopg.Connection, worker_db: str) -> None:
    """The worker dies mid-stream: the API billed the response, and nobody settled it (the
    worker never got to append_step or record_usage, the reaper charged nothing). The resumed
    attempt asked again, so a run or tenant under a budget overspent by one response per kill.
    The reaper now charges the call's reservation (the input estimate and max_tokens of output:
    acquire_model_call), once: here it crosses the run's token_budget, so the next attempt
    ends budget_exhausted without another request, and the tenant's hour holds the one call."""
    tenant = f"kill-{uuid.uuid4().hex[:8]}"
    max_tokens = 1000
    with FakeModel("text", delta_delay=0.3) as fake:
        env = agent_env(fake.base_url, Path("unused"))
        a = ForkedWorker(worker_db, "stream-a", env, **QUICK_TAKEOVER)
        b: ForkedWorker | None = None
        try:
            run = db.execute(
                "SELECT run_id FROM runrow.enqueue_run(conversation_id => gen_random_uuid(), content => %s, "
                "model => 'claude-fake-1', user_id => %s, metadata => %s, token_budget => 500, "
                "max_attempts => 3)",
                ('"' + "a long question " * 8 + '"', tenant, f'{{"max_tokens": {max_tokens}}}'),
            ).fetchone()[0]
            wait_streaming(db, run, 30)  # a slow stream (0.3 s an event): the kill lands inside it
            a.kill()
            assert run_row(db, run)["status"] == "running"
            assert spent(db, run) == 0, "nothing is charged before the response is settled"
            b = ForkedWorker(worker_db, "stream-b", env, **QUICK_TAKEOVER)
            wait_status(db, run, {"completed", "failed", "dead"}, 60)
        finally:
            a.kill()
            if b is not None:
                b.kill()
        requests = len(fake.requests)
    row = run_row(db, run)
    # Before: the second attempt asked again (2 requests, both billed) and completed with
    # 85 tokens counted (the second call alone), under its budget of 500.
    assert requests == 1, (requests, row)
    assert (row["status"], row["attempt"]) == ("failed", 2), row
    assert row["error"].startswith("budget_exhausted: the run used "), row["error"]
    charged = spent(db, run)
    assert max_tokens < charged < max_tokens + 200, charged  # max_tokens out, the estimate in
    hour = db.execute(
        "SELECT model_calls, tokens, output_tokens FROM runrow.spend_hour WHERE fairness_key = %s", (tenant,)
    ).fetchall()
    assert hour == [(1, charged, max_tokens)], hour


def spent(db: psycopg.Connection, run: uuid.UUID) -> int:
    return int(db.execute("SELECT spent_tokens FROM runrow.agent_run WHERE id = %s", (run,)).fetchone()[0])


def test_sigkill_between_steps_3_and_4_then_a_new_worker_finishes_without_repeating(
    db: psycopg.Connection, worker_db: str, tmp_path: Path
) -> None:
    started = time.monotonic()
    with FakeModel("demo") as fake:
        # The uninterrupted run, for comparison.
        ref_ws = tmp_path / "reference"
        ref = ForkedWorker(worker_db, "reference", agent_env(fake.base_url, ref_ws, "0.5"), lease_seconds=2)
        try:
            ref_run = enqueue_agent(db)
            assert wait_status(db, ref_run, {"completed", "failed", "dead"}, 60) == "completed"
        finally:
            ref.stop()
        reference = transcript(db, ref_run)
        assert len(reference) == DEMO_STEPS
        assert effects_of(downstream(ref_ws, db, ref_run)) == DEMO_TOOL_CALLS

        ws = tmp_path / "killed"
        flags = (
            "--lease",
            "1",
            "--grace",
            "1",
            "--reap-interval",
            "0.3",
            "--poll",
            "0.3",
            "--concurrency",
            "1",
        )
        a = agent_worker(worker_db, "agent-a", fake.base_url, ws, *flags, tool_delay="0.5")
        b: WorkerProcess | None = None
        try:
            a.wait_started(20)
            first_request = len(fake.requests)
            run = enqueue_agent(db)
            # Step 3 commits before its tool call is marked executing: wait for both, so the
            # kill lands inside the 0.5 s tool, not in the gap between the two commits.
            wait_until(
                lambda: len(steps(db, run)) >= 3 and executing_effects(db, run),
                60,
                "step 3 to be committed and its first tool call to be executing",
            )
            a.kill()  # SIGKILL: no drain, no release, no last write
            assert len(steps(db, run)) == 3, "the kill must land between steps 3 and 4"
            assert run_row(db, run)["status"] == "running"  # nobody knows yet
            executing = executing_effects(db, run)
            assert executing == [("read_file", "executing", 1)]  # step 3's first call was under way

            b = agent_worker(worker_db, "agent-b", fake.base_url, ws, *flags, tool_delay="0.5")
            b.wait_started(20)
            assert wait_status(db, run, {"completed", "failed", "dead"}, 60) == "completed", b.log()
        finally:
            a.close()
            if b is not None:
                b.close()

        row = run_row(db, run)
        assert row["attempt"] == 2 and row["worker_id"] == "agent-b"
        assert transcript(db, run) == reference
        counts = downstream(ws, db, run)
        assert effects_of(counts) == DEMO_TOOL_CALLS  # every side effect exactly once downstream
        assert counts["send_email"]["executions"] == 1  # sent after the resume, once
        assert counts["write_file"]["executions"] == 1
        # Nothing committed was redone: 6 model turns, 6 requests (the kill hit no request).
        assert model_requests_of(fake, first_request) == 6
        claims = [e["worker_id"] for e in events(db, run) if e["type"] == "run_claimed"]
        assert claims == ["agent-a", "agent-b"]
    print(f"kill between steps 3 and 4 with real processes: {time.monotonic() - started:.1f}s")


# -- 20 random kill points ---------------------------------------------------------------------


def choose_point(rng: random.Random) -> tuple[str, int]:
    """Where to kill: once step n is committed, once model request k has started (mid-stream),
    or once tool call j has begun (mid-tool). The first poll that sees it kills, so a point is
    never missed; `describe` records where the kill actually landed."""
    kind = rng.choice(["step", "stream", "tool"])
    if kind == "step":
        return kind, rng.randint(1, DEMO_STEPS - 1)
    return kind, rng.randint(1, 6)


def reached(conn: psycopg.Connection, run_id: uuid.UUID, point: tuple[str, int]) -> bool:
    kind, n = point
    if kind == "step":
        return len(steps(conn, run_id)) >= n
    if kind == "stream":
        return [e["type"] for e in events(conn, run_id)].count("model_request") >= n
    row = conn.execute("SELECT count(*) FROM runrow.tool_effect WHERE run_id = %s", (run_id,)).fetchone()
    return row is not None and row[0] >= n


def describe(conn: psycopg.Connection, run_id: uuid.UUID) -> dict[str, Any]:
    open_calls = conn.execute(
        "SELECT tool FROM runrow.tool_effect WHERE run_id = %s AND state = 'executing'", (run_id,)
    ).fetchall()
    types = [e["type"] for e in events(conn, run_id)]
    return {
        "steps": len(steps(conn, run_id)),
        "open_tool_calls": [t for (t,) in open_calls],
        "streaming": types.count("model_request") > types.count("model_turn"),
    }


def test_twenty_random_kill_points(db: psycopg.Connection, worker_db: str, tmp_path: Path) -> None:
    seed = int(os.environ.get("RUNROW_KILL_SEED") or random.randrange(2**31))
    print(f"random kill points: seed {seed} (rerun with RUNROW_KILL_SEED={seed})")
    rng = random.Random(seed)
    points = [choose_point(rng) for _ in range(20)]
    started = time.monotonic()
    ws = tmp_path / "ws"
    with FakeModel("demo", delta_delay=0.005) as fake:
        env = agent_env(fake.base_url, ws, tool_delay="0.05")
        options = {**QUICK_TAKEOVER, "drain_seconds": 2}
        serial = iter(range(1000))
        workers = {
            w.name: w for w in (ForkedWorker(worker_db, f"w{next(serial)}", env, **options) for _ in range(2))
        }
        try:
            ref_run = enqueue_agent(db)
            assert wait_status(db, ref_run, {"completed", "failed", "dead"}, 60) == "completed"
            reference = transcript(db, ref_run)
            assert effects_of(downstream(ws, db, ref_run)) == DEMO_TOOL_CALLS
            landed: list[tuple[tuple[str, int], dict[str, Any]]] = []
            for i, point in enumerate(points):
                reset_workspace(ws)
                t0 = time.monotonic()
                run = enqueue_agent(db, max_attempts=10)
                wait_until(
                    lambda run=run, point=point: (
                        reached(db, run, point) or run_row(db, run)["status"] not in ("running", "queued")
                    ),
                    60,
                    f"kill point {point}",
                    interval=0.01,
                )
                holder = run_row(db, run)["worker_id"]
                assert run_row(db, run)["status"] == "running", f"round {i}: the run ended before {point}"
                t1 = time.monotonic()
                workers.pop(holder).kill()
                state = describe(db, run)
                landed.append((point, state))
                replacement = ForkedWorker(worker_db, f"w{next(serial)}", env, **options)
                workers[replacement.name] = replacement
                status = wait_status(db, run, {"completed", "failed", "dead"}, 60)
                assert status == "completed", f"round {i} {point}: {run_row(db, run)}"
                assert run_row(db, run)["attempt"] >= 2
                print(f"round {i}: to kill {t1 - t0:.2f}s, kill to completed {time.monotonic() - t1:.2f}s")
                assert transcript(db, run) == reference, f"round {i} {point}"
                counts = downstream(ws, db, run)
                assert effects_of(counts) == DEMO_TOOL_CALLS, f"round {i} {point}: {counts}"
                if state["open_tool_calls"] != ["send_email"]:
                    assert counts["send_email"]["executions"] == 1, f"round {i} {point}: {counts}"
        finally:
            for w in workers.values():
                w.kill()
    print("\n".join(f"{point}: {state}" for point, state in landed))
    mid_stream = sum(1 for _, state in landed if state["streaming"])
    mid_tool = sum(1 for _, state in landed if state["open_tool_calls"])
    print(
        f"kills mid-stream: {mid_stream}, mid-tool: {mid_tool}, between steps: {20 - mid_stream - mid_tool}"
    )
    assert mid_stream >= 2 and mid_tool >= 2, (
        "the kill points did not cover streams and tools; try another seed"
    )
    print(f"20 random kill points: {time.monotonic() - started:.1f}s")
