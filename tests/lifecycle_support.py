"""The SQL a test of the lifecycle's cost writes again and again: enqueue n runs in one
statement, and finish_runs' argument for a claimed batch, every run completed."""

from __future__ import annotations

import json
from collections.abc import Sequence
from uuid import UUID

from pyworker.db.batch import Ack

# One statement, one transaction: count(*) of n fresh conversations' first turns.
ENQUEUE = (
    "SELECT count(*) FROM (SELECT runrow.enqueue_run(conversation_id => gen_random_uuid(),"
    " content => '\"job\"', model => 'echo') FROM generate_series(1, %s)) AS e"
)


def completed(runs: Sequence[Sequence[object]]) -> str:
    """finish_runs' `runs` (JSON text) for claimed (run_id, claim_token) rows, each completed,
    as the worker writes its acks (pyworker.db.batch.Ack)."""
    return json.dumps([Ack(UUID(str(r)), UUID(str(t)), "completed").to_json() for r, t in runs])
