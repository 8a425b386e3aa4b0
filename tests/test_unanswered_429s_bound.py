"""A 429 that never clears, with a retry-after longer than the worker waits in place, ends the
run (migration 0109), with the real agent and SDK against the fake Messages API.

The agent reports each 429, acquire_model_call answers `blocked` for the retry-after, and since
that is over `rate_limit_max_wait` the run is deferred as "blocked: waiting ...", its attempt
given back. One 429 a claim never passed the per-claim allowance (MAX_429_IN_ATTEMPT) that the
cap on deferrals for 429s counts by, so the run was deferred for ever, each 429 blocking the
key for the whole fleet (the review of session 61). defer_run now releases it once it has
reported 24 429s without an answer, (MAX_429_IN_ATTEMPT + 1) x (MAX_429_DEFERRALS + 1): the
retry-after and the longest wait are scaled down here (0.4 s over 0.05 s, as 11 s over 10 s).
"""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest
from agent_support import InProcessWorker, enqueue_agent, fake, fake_api_worker, module_conn, module_db
from worker_support import events, run_row, wait_status

from pyworker.agent.limits import MAX_429_DEFERRALS, MAX_429_IN_ATTEMPT
from pyworker.fake.faults import rate_limited
from pyworker.fake.server import FakeModel

__all__ = ["fake", "module_conn", "module_db"]

BOUND = (MAX_429_IN_ATTEMPT + 1) * (MAX_429_DEFERRALS + 1)
KEY = "claude-429-blocked-forever"


@pytest.fixture(scope="module")
def worker(module_db: str, fake: FakeModel) -> Iterator[InProcessWorker]:
    # Each 429's retry-after (0.4 s) is longer than the longest wait: deferred as blocked.
    config = {"rate_limit_max_wait": 0.05}
    with fake_api_worker(module_db, fake, "unanswered429", config, poll_seconds=0.1) as w:
        yield w


def test_a_429_that_never_clears_past_the_longest_wait_ends_the_run_after_24(
    module_conn: psycopg.Connection, fake: FakeModel, worker: InProcessWorker
) -> None:
    db = module_conn
    fake.inject(*[rate_limited(0.4)] * (BOUND + 10))
    run = enqueue_agent(db, "Hi", model=KEY, tools=[], metadata={}, max_attempts=1)
    wait_status(db, run, {"completed", "failed", "cancelled", "dead"}, 120)
    row = run_row(db, run)
    assert (row["status"], row["attempt"]) == ("failed", 1), row
    assert row["error"].startswith("blocked: waiting "), row["error"]
    assert f"(after {BOUND} 429s without an answer, the most a run is deferred for" in row["error"], row[
        "error"
    ]
    requeued = [e for e in events(db, run) if e["type"] == "run_requeued"]
    # Each claim met one 429 and was deferred as blocked, none counted by the cap.
    assert [(e["deferred"], e["error"].startswith("blocked: ")) for e in requeued] == [(True, True)] * (
        BOUND - 1
    )
    assert [r.status for r in fake.requests] == [429] * BOUND
    blocks, capped = db.execute(
        "SELECT l.blocks_reported, a.cap_429_deferrals FROM runrow.rate_limit AS l, runrow.agent_run AS a"
        " WHERE l.rate_limit_key = %s AND a.id = %s",
        (KEY, run),
    ).fetchone()
    assert (blocks, capped) == (BOUND, 0)
