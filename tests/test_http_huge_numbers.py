"""A number past the float range in a run's journal or a tool call's arguments reaches HTTP
clients as valid JSON (pyworker/db/finite_json.py). The web audit: jsonb keeps `1` followed by
400 zeros exactly, Python read it as inf and wrote `Infinity`, which is not JSON: the event
stream's frame broke the chat page (it reconnected forever) and `GET /approvals` was a 500.
The Python worker cannot store such a number; another language's worker, or SQL, can."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import psycopg
import pytest
from http_support import ALICE, Server, private_database, serve
from steps_support import tool_defs
from tail_support import append, claim, finish

BIG = "1" + "0" * 400 + ".5"


def strict(text: str) -> Any:
    """JSON as a browser's JSON.parse reads it: `Infinity` and `NaN` are errors."""

    def refuse(constant: str) -> Any:
        raise ValueError(f"{constant} is not JSON")

    return json.loads(text, parse_constant=refuse)


@pytest.fixture(scope="module")
def huge_db(database_url: str) -> Iterator[str]:
    yield from private_database(database_url, "runrow_http_huge_numbers")


@pytest.fixture(scope="module")
def server(huge_db: str) -> Iterator[Server]:
    yield from serve(huge_db)


def test_a_huge_number_in_the_journal_streams_as_valid_json(server: Server, huge_db: str) -> None:
    with httpx.Client(base_url=server.url, timeout=20) as client:
        enqueued = client.post(f"/conversations/{uuid.uuid4()}/runs", json={"content": "hi"}, headers=ALICE)
        run_id = uuid.UUID(enqueued.json()["run_id"])
        with psycopg.connect(huge_db, autocommit=True) as db:
            token = claim(db, run_id)
            db.execute(
                "SELECT runrow.append_events(%s, %s, %s::jsonb)",
                (run_id, token, '[{"type": "text_delta", "text": "big", "n": ' + BIG + "}]"),
            )
            append(db, run_id, token, [{"type": "text_delta", "text": "after"}])
            finish(db, run_id, token)
        response = client.get(f"/runs/{run_id}/events", headers=ALICE)
    assert response.status_code == 200
    data = [line[len("data: ") :] for line in response.text.splitlines() if line.startswith("data: ")]
    payloads = [strict(d) for d in data]  # every frame parses
    big = next(p for p in payloads if p.get("text") == "big")
    assert big["n"] == BIG  # exact, as its decimal text
    assert any(p.get("text") == "after" for p in payloads)


def test_a_huge_number_in_a_tool_calls_arguments_lists_as_valid_json(server: Server, huge_db: str) -> None:
    with httpx.Client(base_url=server.url, timeout=20) as client:
        body = {"content": "hi", "tools": json.loads(tool_defs("shell"))}
        enqueued = client.post(f"/conversations/{uuid.uuid4()}/runs", json=body, headers=ALICE)
        run_id = uuid.UUID(enqueued.json()["run_id"])
        args = '{"n": ' + BIG + "}"
        with psycopg.connect(huge_db, autocommit=True) as db:
            token = claim(db, run_id)
            (step,) = db.execute(
                "SELECT runrow.append_step(%s, %s, 'model_turn', %s::json)",
                (
                    run_id,
                    token,
                    '[{"type": "tool_use", "id": "tu_1", "name": "shell", "input": ' + args + "}]",
                ),
            ).fetchone()
            (key,) = db.execute(
                "SELECT runrow.tool_call_key(%s, %s, 'tu_1', 'shell', %s::jsonb)", (run_id, step, args)
            ).fetchone()
            (state,) = db.execute(
                "SELECT state FROM runrow.begin_tool_call(%s, %s, %s, 'shell', %s::jsonb, 'irreversible')",
                (run_id, token, key, args),
            ).fetchone()
            assert state == "needs_approval"
        listed = client.get("/approvals", headers=ALICE)
    assert listed.status_code == 200, listed.text
    approvals = strict(listed.text)["approvals"]
    assert [a["args"]["n"] for a in approvals if a["idempotency_key"] == key] == [BIG]
