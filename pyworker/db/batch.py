"""Typed async wrappers of runrow.finish_runs, finish_and_claim_runs and append_runs_events:
acknowledge many runs in one statement, claim their successors in the same one, and append the
events of many running runs in one.

Kept apart from api.py so the batch lifecycle can move with the database layer as one piece.
Like every wrapper it only calls the function, with its named argument.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

from psycopg import AsyncClientCursor, AsyncConnection
from psycopg.rows import class_row
from psycopg.types.json import Jsonb

from pyworker.db.api import ClaimedRun
from pyworker.db.claimed_json import read_claims_with


@dataclass(frozen=True)
class Ack:
    """One run's terminal write: status completed, failed or cancelled; `events` are appended
    before its complete event, as append_events would."""

    run_id: UUID
    claim_token: UUID
    status: str
    result: Any = None
    error: str | None = None
    events: Sequence[dict[str, Any]] = field(default_factory=tuple)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"run_id": str(self.run_id), "claim_token": str(self.claim_token)}
        out["status"] = self.status
        if self.result is not None:
            out["result"] = self.result
        if self.error is not None:
            out["error"] = self.error
        if self.events:
            out["events"] = list(self.events)
        return out


@dataclass(frozen=True)
class Finished:
    run_id: UUID
    finished: bool  # False: fenced out (someone else ended it, or a newer claim holds it)
    last_seq: int | None


_FINISH_RUNS_SQL = "SELECT run_id, finished, last_seq FROM runrow.finish_runs(runs => %s)"


async def finish_runs(conn: AsyncConnection, acks: Sequence[Ack]) -> list[Finished]:
    """One row per ack, in order. Each run is fenced on its own: the ones fenced out wrote
    nothing, the others are ended."""
    if not acks:
        return []
    async with conn.cursor(row_factory=class_row(Finished)) as cur:
        await cur.execute(_FINISH_RUNS_SQL, (Jsonb([a.to_json() for a in acks]),))
        return await cur.fetchall()


@dataclass(frozen=True)
class Appends:
    """One run's events for append_runs_events, already nul-encoded as the jsonb will hold them
    (nul.encode_sized): 1 to 1000 objects with a string "type", at most 4 MiB."""

    run_id: UUID
    claim_token: UUID
    events: Sequence[dict[str, Any]]

    def to_json(self) -> dict[str, Any]:
        return {"run_id": str(self.run_id), "claim_token": str(self.claim_token), "events": list(self.events)}


_APPEND_RUNS_SQL = "SELECT last_seq FROM runrow.append_runs_events(runs => %s)"


async def append_runs_events(conn: AsyncConnection, appends: Sequence[Appends]) -> list[int | None]:
    """The last seq written for each element, in order; None where the run was fenced out (it
    wrote nothing). One statement for every run, each fenced on its own as append_events."""
    if not appends:
        return []
    cur = await conn.execute(_APPEND_RUNS_SQL, (Jsonb([a.to_json() for a in appends]),))
    return [row[0] for row in await cur.fetchall()]


# finish_and_claim_runs' columns: finish_runs' three, then claim_runs' (run_id shared).
_FINISH_AND_CLAIM_SQL = (
    "SELECT run_id, finished, last_seq, claim_token, conversation_id, attempt, max_attempts, model,"
    " prompt_id, system_prompt, tools, user_id, user_message_id, metadata, claim_expires_at, queued_seconds"
    " FROM runrow.finish_and_claim_runs(runs => %s, worker_id => %s, max_runs => %s, lease_seconds => %s)"
)


async def begin_finish_runs_and_claim(
    conn: AsyncConnection,
    acks: Sequence[Ack],
    worker_id: str | None,
    max_runs: int,
    lease_seconds: int,
) -> tuple[list[Finished], list[ClaimedRun]]:
    """finish_and_claim_runs: the endings and the claim of up to `max_runs` successors in one
    statement (one UPDATE, one journal INSERT: cheaper for the server than finish_runs then
    claim_runs), in a transaction left open. BEGIN and the call go in one simple query, one round
    trip (parameters bound client-side); the caller commits (`conn.commit()`) once the claimed
    rows are in hand, so an unanswered COMMIT can be settled by the fence, or rolls back. `conn`
    must be idle in autocommit mode."""
    async with AsyncClientCursor(conn) as cur:
        read_claims_with(cur)
        await cur.execute(
            "BEGIN; " + _FINISH_AND_CLAIM_SQL,
            (Jsonb([a.to_json() for a in acks]), worker_id, max_runs, lease_seconds),
        )
        cur.nextset()  # past BEGIN's result
        rows = await cur.fetchall()
    # A row per ack first (finished set), then a row per claimed run (finished NULL).
    finished = [Finished(row[0], row[1], row[2]) for row in rows if row[1] is not None]
    claimed = [ClaimedRun(row[0], *row[3:]) for row in rows if row[1] is None]
    return finished, claimed
