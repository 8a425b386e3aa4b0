"""Typed async wrappers, one per runrow.* lifecycle function.

Each takes an `AsyncConnection` so calls compose inside one transaction (`async with
conn.transaction():`); on an autocommit connection each call is its own transaction. Only
`SELECT ... FROM runrow.fn(name => value)`: the named arguments are part of the contract.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any
from uuid import UUID

from psycopg import AsyncClientCursor, AsyncConnection
from psycopg.rows import class_row
from psycopg.types.json import Jsonb

from pyworker.db import nul
from pyworker.db.claimed_json import read_claims_with


@dataclass(frozen=True)
class ClaimedRun:
    run_id: UUID
    claim_token: UUID
    conversation_id: UUID
    attempt: int
    max_attempts: int
    model: str
    prompt_id: str
    system_prompt: str | None
    tools: Any
    user_id: str | None
    user_message_id: UUID
    metadata: dict[str, Any]
    claim_expires_at: datetime
    queued_seconds: float | None = None  # waited since it last became claimable (database clock)


@dataclass(frozen=True)
class Heartbeat:
    owned: bool
    cancel_requested: bool


@dataclass(frozen=True)
class RunEnding:
    """What runrow.get_run says of how a run stands (the parts a worker compares)."""

    status: str
    attempt: int
    result: Any
    error: str | None


@dataclass(frozen=True)
class Event:
    seq: int
    type: str
    payload: dict[str, Any]
    created_at: datetime


@dataclass(frozen=True)
class Enqueued:
    run_id: UUID
    status: str
    created: bool


_CLAIM_COLUMNS = (
    "run_id, claim_token, conversation_id, attempt, max_attempts, model, prompt_id, system_prompt, "
    "tools, user_id, user_message_id, metadata, claim_expires_at, queued_seconds"
)


async def claim_run(conn: AsyncConnection, worker_id: str | None, lease_seconds: int) -> ClaimedRun | None:
    async with conn.cursor(row_factory=class_row(ClaimedRun)) as cur:
        read_claims_with(cur)
        await cur.execute(
            f"SELECT {_CLAIM_COLUMNS} FROM runrow.claim_run(worker_id => %s, lease_seconds => %s)",
            (worker_id, lease_seconds),
        )
        return await cur.fetchone()


# claim_runs' statement, shared by claim_runs and begin_claim_runs.
CLAIM_RUNS_SQL = (
    f"SELECT {_CLAIM_COLUMNS} FROM runrow.claim_runs(worker_id => %s, max_runs => %s, lease_seconds => %s)"
)


async def claim_runs(
    conn: AsyncConnection, worker_id: str | None, max_runs: int, lease_seconds: int
) -> list[ClaimedRun]:
    async with conn.cursor(row_factory=class_row(ClaimedRun)) as cur:
        read_claims_with(cur)
        await cur.execute(
            CLAIM_RUNS_SQL,
            (worker_id, max_runs, lease_seconds),
        )
        return await cur.fetchall()


async def begin_claim_runs(
    conn: AsyncConnection, worker_id: str | None, max_runs: int, lease_seconds: int
) -> list[ClaimedRun]:
    """claim_runs in a transaction left open: the caller commits (`conn.commit()`) once the rows,
    run ids and claim tokens, are in hand, or rolls back. BEGIN rides with the claim in one simple
    query, one round trip (the parameters bound client-side, quoted by psycopg). `conn` must be
    idle in autocommit mode."""
    async with AsyncClientCursor(conn, row_factory=class_row(ClaimedRun)) as cur:
        read_claims_with(cur)
        await cur.execute(
            "BEGIN; " + CLAIM_RUNS_SQL,
            (worker_id, max_runs, lease_seconds),
        )
        cur.nextset()  # past BEGIN's result
        return await cur.fetchall()


async def heartbeat(conn: AsyncConnection, run_id: UUID, claim_token: UUID, lease_seconds: int) -> Heartbeat:
    cur = await conn.execute(
        "SELECT owned, cancel_requested FROM runrow.heartbeat("
        "run_id => %s, claim_token => %s, lease_seconds => %s)",
        (run_id, claim_token, lease_seconds),
    )
    row = await cur.fetchone()
    assert row is not None
    return Heartbeat(owned=bool(row[0]), cancel_requested=bool(row[1]))


async def append_events(
    conn: AsyncConnection,
    run_id: UUID,
    claim_token: UUID,
    events: list[dict[str, Any]],
    *,
    encoded: bool = False,
) -> int | None:
    """The last seq written, or None when fenced out (the run is no longer this claim's).
    An event whose strings hold a NUL is written nul-percent encoded (pyworker/db/nul.py);
    encoded=True: the caller has encoded them already (nul.encode_sized)."""
    cur = await conn.execute(
        "SELECT runrow.append_events(run_id => %s, claim_token => %s, events => %s)",
        (run_id, claim_token, Jsonb(events if encoded else [nul.encode(e) for e in events])),
    )
    row = await cur.fetchone()
    return None if row is None else row[0]


async def finish_run(
    conn: AsyncConnection,
    run_id: UUID,
    claim_token: UUID,
    status: str,
    result: Any = None,
    error: str | None = None,
) -> bool:
    """False: someone else already ended this run (reaper, stop, a newer claim). A result whose
    strings hold a NUL is stored nul-percent encoded (pyworker/db/nul.py)."""
    stored = None if result is None else Jsonb(nul.encode(result))
    cur = await conn.execute(
        "SELECT runrow.finish_run(run_id => %s, claim_token => %s, status => %s, result => %s, error => %s)",
        (run_id, claim_token, status, stored, _error_text(error)),
    )
    row = await cur.fetchone()
    return bool(row and row[0])


async def release_run(
    conn: AsyncConnection,
    run_id: UUID,
    claim_token: UUID,
    error: str | None = None,
    *,
    retry_in: timedelta | None = None,
) -> str | None:
    """'requeued', 'failed', 'dead' or 'cancelled'; None when fenced out. `retry_in` is the
    backoff: a requeued run is not claimable before the database's now() + retry_in."""
    cur = await conn.execute(
        "SELECT runrow.release_run(run_id => %s, claim_token => %s, error => %s, retry_in => %s)",
        (run_id, claim_token, _error_text(error), retry_in),
    )
    row = await cur.fetchone()
    return None if row is None else row[0]


async def defer_run(
    conn: AsyncConnection, run_id: UUID, claim_token: UUID, retry_in: timedelta, reason: str
) -> str | None:
    """'deferred' or 'cancelled'; None when fenced out. A fleet limit's wait: requeued with the
    attempt given back, not claimable before the database's now() + retry_in."""
    cur = await conn.execute(
        "SELECT runrow.defer_run(run_id => %s, claim_token => %s, retry_in => %s, reason => %s)",
        (run_id, claim_token, retry_in, deferral_error(reason)),
    )
    row = await cur.fetchone()
    return None if row is None else row[0]


MAX_ERROR_CHARS = 10000  # finish_run's and release_run's limit


# The suffixes defer_run adds to the reason when it releases a run instead of deferring it.
_RELEASED_FOR_429S = re.compile(
    r" \(after \d+ (?:deferrals for 429s, the most defer_run gives a run"
    r"|429s without an answer, the most a run is deferred for): its attempt spent\)"
)


def released_past_429_cap(reason: str | None, stored: str | None) -> bool:
    """Whether `stored` (a run's error) is what defer_run keeps when it releases a deferral for
    429s instead (its attempt spent): past its cap on deferrals for 429s (a reason beginning
    429_cap after 3 such deferrals of the run, migration 0103), or past its bound on 429s without
    an answer (24 since the run's last answered model call, whatever the reason: a "blocked"
    deferral after a retry-after longer than the worker waits in place, migration 0109). The
    reason sent (as defer_run above sends it), its first 9900 characters, followed by
    " (after N deferrals for 429s, ...)" or " (after N 429s without an answer, ...)"."""
    sent = deferral_error(reason)[:9900]
    if stored is None or not stored.startswith(sent):
        return False
    return _RELEASED_FOR_429S.fullmatch(stored, len(sent)) is not None


def _error_text(error: str | None) -> str | None:
    """An error message as a text column takes it: a NUL reads as U+FFFD, and a message past
    the limit is cut (an ending must not fail on the length of its own explanation)."""
    text = nul.printable(error)
    if text is not None and len(text) > MAX_ERROR_CHARS:
        text = text[: MAX_ERROR_CHARS - 1] + "…"
    return text


def stored_error(error: str | None) -> str | None:
    """`error` as finish_run and release_run store it, so as get_run gives it back."""
    return _error_text(error)


def deferral_error(reason: str | None) -> str:
    """`reason` as defer_run above sends it, so as it stores it (when not past the 429 cap):
    defer_run takes no NULL reason, and an empty one is not a reason."""
    return _error_text(reason) or "deferred"


async def get_run(conn: AsyncConnection, run_id: UUID) -> RunEnding:
    """The run's status, attempt, result and error as stored (see stored_error)."""
    async with conn.cursor(row_factory=class_row(RunEnding)) as cur:
        await cur.execute(
            "SELECT status, attempt, result, error FROM runrow.get_run(run_id => %s)", (run_id,)
        )
        row = await cur.fetchone()
    assert row is not None  # get_run raises P0002 rather than return nothing
    return row


async def reap_expired_runs(
    conn: AsyncConnection, grace_seconds: int, max_runs: int
) -> list[tuple[UUID, str]]:
    cur = await conn.execute(
        "SELECT run_id, outcome FROM runrow.reap_expired_runs(grace_seconds => %s, max_runs => %s)",
        (grace_seconds, max_runs),
    )
    return [(r[0], r[1]) for r in await cur.fetchall()]


async def trim_journal(conn: AsyncConnection, older_than_seconds: float) -> int:
    cur = await conn.execute(
        "SELECT runrow.trim_journal(older_than => make_interval(secs => %s))", (older_than_seconds,)
    )
    row = await cur.fetchone()
    return int(row[0]) if row else 0


async def read_events(
    conn: AsyncConnection, run_id: UUID, after_seq: int = 0, max_events: int = 500
) -> list[Event]:
    async with conn.cursor(row_factory=class_row(Event)) as cur:
        await cur.execute(
            "SELECT seq, type, payload, created_at FROM runrow.read_events("
            "run_id => %s, after_seq => %s, max_events => %s)",
            (run_id, after_seq, max_events),
        )
        return await cur.fetchall()


@dataclass(frozen=True)
class FleetOptions:
    """enqueue_run's fleet-scheduling arguments (SPEC "Fleet scheduling"); None/0 = not given."""

    start_in: timedelta | None = None
    priority: int = 0
    fairness_key: str | None = None
    concurrency_key: str | None = None
    rate_limit_key: str | None = None
    token_budget: int | None = None
    cost_budget: Decimal | None = None
    webhook_url: str | None = None


async def enqueue_run(
    conn: AsyncConnection,
    conversation_id: UUID,
    content: Any,
    model: str,
    *,
    user_id: str | None = None,
    system_prompt: str | None = None,
    tools: Any = None,
    max_attempts: int = 1,
    idempotency_key: str | None = None,
    if_active: str = "enqueue",
    metadata: dict[str, Any] | None = None,
    fleet: FleetOptions | None = None,
) -> Enqueued:
    f = fleet or FleetOptions()
    cur = await conn.execute(
        "SELECT run_id, status, created FROM runrow.enqueue_run("
        "conversation_id => %s, content => %s, model => %s, user_id => %s, system_prompt => %s, "
        "tools => %s, max_attempts => %s, idempotency_key => %s, if_active => %s, metadata => %s, "
        "start_in => %s, priority => %s, fairness_key => %s, concurrency_key => %s, "
        "rate_limit_key => %s, token_budget => %s, cost_budget => %s, webhook_url => %s)",
        (
            conversation_id,
            Jsonb(content),
            model,
            user_id,
            system_prompt,
            Jsonb([] if tools is None else tools),
            max_attempts,
            idempotency_key,
            if_active,
            Jsonb({} if metadata is None else metadata),
            f.start_in,
            f.priority,
            f.fairness_key,
            f.concurrency_key,
            f.rate_limit_key,
            f.token_budget,
            f.cost_budget,
            f.webhook_url,
        ),
    )
    row = await cur.fetchone()
    assert row is not None
    return Enqueued(run_id=row[0], status=row[1], created=bool(row[2]))


async def stop_conversation(conn: AsyncConnection, conversation_id: UUID) -> list[tuple[UUID, str]]:
    cur = await conn.execute(
        "SELECT run_id, action FROM runrow.stop_conversation(conversation_id => %s)", (conversation_id,)
    )
    return [(r[0], r[1]) for r in await cur.fetchall()]


async def cancel_run(conn: AsyncConnection, run_id: UUID) -> str | None:
    cur = await conn.execute("SELECT runrow.cancel_run(run_id => %s)", (run_id,))
    row = await cur.fetchone()
    return None if row is None else row[0]


async def retry_run(conn: AsyncConnection, run_id: UUID) -> UUID:
    cur = await conn.execute("SELECT runrow.retry_run(run_id => %s)", (run_id,))
    row = await cur.fetchone()
    assert row is not None
    return row[0]


async def watch_runs(conn: AsyncConnection, run_ids: Sequence[UUID], seconds: int) -> list[tuple[UUID, str]]:
    """Register or refresh watches on these runs' journals: (run_id, state) per distinct run."""
    cur = await conn.execute(
        "SELECT run_id, state FROM runrow.watch_runs(run_ids => %s::uuid[], seconds => %s)",
        (list(run_ids), seconds),
    )
    return [(UUID(str(r[0])), str(r[1])) for r in await cur.fetchall()]


async def notify_probe(conn: AsyncConnection, channel: str) -> str:
    cur = await conn.execute("SELECT runrow.notify_probe(channel => %s)", (channel,))
    row = await cur.fetchone()
    assert row is not None
    return str(row[0])


@dataclass(frozen=True)
class Conversation:
    id: UUID
    user_id: str | None
    created_at: datetime
    active_run_id: UUID | None
    active_status: str | None
    runs: int


async def get_conversation(conn: AsyncConnection, conversation_id: UUID) -> Conversation:
    """runrow.get_conversation; raises psycopg.errors.NoDataFound (P0002) for an unknown one."""
    async with conn.cursor(row_factory=class_row(Conversation)) as cur:
        await cur.execute("SELECT * FROM runrow.get_conversation(conversation_id => %s)", (conversation_id,))
        row = await cur.fetchone()
    assert row is not None  # get_conversation raises P0002 rather than return nothing
    return row
