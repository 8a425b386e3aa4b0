"""The database's allowance of 429s in one attempt is the agent's (migration 0106).

defer_run counts a deferral against its cap on deferrals for 429s when the claim reported more
than 5 429s through report_rate_limited, whatever the deferral's reason: a worker that words its
reason otherwise is capped too (pgtap/defer_run_429s_reported.sql). The agent defers after
MAX_429_IN_ATTEMPT + 1 of them (pyworker/agent/limits.py), so the two numbers must agree: with
the SQL's larger the agent's deferrals would be counted only by their 429_cap reason, with it
smaller a deferral after the agent's own allowance (a bucket's wait) would be taken for one."""

from __future__ import annotations

import uuid

import psycopg
from race_support import claim, database_url, drain, enqueue, owner

from pyworker.agent.limits import MAX_429_IN_ATTEMPT

__all__ = ["database_url", "owner"]  # the fixtures, re-exported for pytest


def defer_after_429s(conn: psycopg.Connection, run: dict, n: int) -> int:
    """n 429s reported for the claim, then a deferral whose reason does not name the cap; the
    run's count of deferrals for 429s after it."""
    for _ in range(n):
        conn.execute("SELECT runrow.report_rate_limited(%s, %s, 0.01)", (run["run_id"], run["claim_token"]))
    outcome = conn.execute(
        "SELECT runrow.defer_run(%s, %s, interval '1 minute', 'rate_limited: waiting 1.0s')",
        (run["run_id"], run["claim_token"]),
    ).fetchone()[0]
    assert outcome == "deferred"
    return conn.execute(
        "SELECT cap_429_deferrals FROM runrow.agent_run WHERE id = %s", (run["run_id"],)
    ).fetchone()[0]


def test_a_deferral_counts_against_the_cap_past_the_agents_429s_in_one_attempt(
    owner: psycopg.Connection,
) -> None:
    drain(owner)
    enqueue(owner, uuid.uuid4())
    enqueue(owner, uuid.uuid4())
    within, past = claim(owner, 2)
    assert defer_after_429s(owner, within, MAX_429_IN_ATTEMPT) == 0, "the agent's allowance: not counted"
    assert defer_after_429s(owner, past, MAX_429_IN_ATTEMPT + 1) == 1, (
        "one more, as the agent defers: counted"
    )
