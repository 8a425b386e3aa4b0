"""One user never sees or touches another's: bob gets 404 — the same 404 as for an id that
does not exist — for alice's conversation, run, stream, stop, cancel and approval, and
alice's data is unchanged afterwards. No token, a wrong token: 401."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import psycopg
import pytest
from http_support import ALICE, BOB, Server, error_of, private_database, serve
from steps_support import begin, tool_defs, tool_turn
from tail_support import append, claim, finish


@pytest.fixture(scope="module")
def iso_db(database_url: str) -> Iterator[str]:
    yield from private_database(database_url, "runrow_http_iso")


@pytest.fixture(scope="module")
def server(iso_db: str) -> Iterator[Server]:
    yield from serve(iso_db)


@pytest.fixture(scope="module")
def alices(server: Server, iso_db: str) -> dict[str, Any]:
    """Alice's world: a finished run, a running run, and a run waiting on her approval."""
    with (
        httpx.Client(base_url=server.url, timeout=20) as client,
        psycopg.connect(iso_db, autocommit=True) as db,
    ):

        def run(conversation_id: uuid.UUID) -> uuid.UUID:
            # Offered the tool the waiting run calls (begin_tool_call runs only offered tools).
            body = {"content": "secret plans", "tools": json.loads(tool_defs("send_wire"))}
            response = client.post(f"/conversations/{conversation_id}/runs", json=body, headers=ALICE)
            assert response.status_code == 202, response.text
            return uuid.UUID(response.json()["run_id"])

        finished_conv, running_conv, waiting_conv = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
        finished = run(finished_conv)
        token = claim(db, finished)
        append(db, finished, token, [{"type": "text_delta", "text": "alice's secret answer"}])
        finish(db, finished, token)
        running = run(running_conv)
        token = claim(db, running)
        append(db, running, token, [{"type": "text_delta", "text": "half an answer"}])
        waiting = run(waiting_conv)
        wtoken = claim(db, waiting)
        key = tool_turn(db, waiting, wtoken, "toolu_1", "send_wire", {"to": "alice's bank"})
        assert begin(db, waiting, wtoken, key, "send_wire", {"to": "alice's bank"}, "irreversible")[0] == (
            "needs_approval"
        )
        return {
            "conversations": [finished_conv, running_conv, waiting_conv],
            "runs": [finished, running, waiting],
            "key": key,
        }


def snapshot(iso_db: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(iso_db, autocommit=True) as db:
        runs = db.execute(
            "SELECT id, conversation_id, status, cancel_requested, attempt, "
            "(SELECT count(*) FROM runrow.run_event e WHERE e.run_id = a.id) "
            "FROM runrow.agent_run a ORDER BY id"
        ).fetchall()
        effects = db.execute(
            "SELECT idempotency_key, state, decided_by FROM runrow.tool_effect ORDER BY idempotency_key"
        ).fetchall()
    return [*runs, *effects]


def same_404(response: httpx.Response, unknown: httpx.Response) -> None:
    """`response` (bob asking for alice's thing) reads exactly like `unknown` (a made-up id)."""
    assert response.status_code == 404, response.text
    assert unknown.status_code == 404, unknown.text
    mine, theirs = error_of(response), error_of(unknown)
    assert mine["type"] == theirs["type"] == "not_found"
    # Only the id in the message differs: nothing says "exists, but not yours".
    asked, made_up = response.request.url.path, unknown.request.url.path
    ids = [(a, b) for a, b in zip(asked.split("/"), made_up.split("/"), strict=True) if a != b]
    assert len(ids) == 1 and mine["message"] == theirs["message"].replace(ids[0][1], ids[0][0])


def test_bob_gets_404_for_everything_of_alices_and_changes_nothing(
    server: Server, iso_db: str, alices: dict[str, Any]
) -> None:
    before = snapshot(iso_db)
    nobody = uuid.uuid4()
    with httpx.Client(base_url=server.url, timeout=20, headers=BOB) as bob:
        for run_id in alices["runs"]:
            same_404(bob.get(f"/runs/{run_id}"), bob.get(f"/runs/{nobody}"))
            same_404(bob.get(f"/runs/{run_id}/events"), bob.get(f"/runs/{nobody}/events"))
            same_404(
                bob.get(f"/runs/{run_id}/events", headers={"Last-Event-ID": "1"}),
                bob.get(f"/runs/{nobody}/events", headers={"Last-Event-ID": "1"}),
            )
            same_404(bob.post(f"/runs/{run_id}/cancel"), bob.post(f"/runs/{nobody}/cancel"))
        for conversation_id in alices["conversations"]:
            same_404(bob.get(f"/conversations/{conversation_id}"), bob.get(f"/conversations/{nobody}"))
            same_404(
                bob.post(f"/conversations/{conversation_id}/stop"), bob.post(f"/conversations/{nobody}/stop")
            )
            for if_active in ["enqueue", "interrupt"]:
                posted = bob.post(
                    f"/conversations/{conversation_id}/runs",
                    json={"content": "mine now", "if_active": if_active},
                )
                assert posted.status_code == 404 and error_of(posted)["type"] == "not_found", posted.text
        assert bob.get("/approvals").json() == {"approvals": [], "next": None}
        for approved in [True, False]:
            same_404(
                bob.post(f"/approvals/{alices['key']}", json={"approved": approved}),
                bob.post("/approvals/" + "f" * 64, json={"approved": approved}),
            )
    assert snapshot(iso_db) == before, "alice's runs, journals and approvals are untouched"
    with httpx.Client(base_url=server.url, timeout=20, headers=ALICE) as alice:
        # ... and still hers: the same requests from alice succeed.
        assert alice.get(f"/runs/{alices['runs'][0]}").json()["status"] == "completed"
        assert [a["idempotency_key"] for a in alice.get("/approvals").json()["approvals"]] == [alices["key"]]


def test_the_same_conversation_id_cannot_be_shared(server: Server, alices: dict[str, Any]) -> None:
    """A conversation id bob invents first is his; alice cannot add turns to it, and vice versa."""
    with httpx.Client(base_url=server.url, timeout=20) as client:
        conversation_id = uuid.uuid4()
        mine = client.post(f"/conversations/{conversation_id}/runs", json={"content": "b"}, headers=BOB)
        assert mine.status_code == 202
        theirs = client.post(f"/conversations/{conversation_id}/runs", json={"content": "a"}, headers=ALICE)
        assert theirs.status_code == 404
        stop = client.post(f"/conversations/{conversation_id}/stop", headers=ALICE)
        assert stop.status_code == 404
        assert client.post(f"/conversations/{conversation_id}/stop", headers=BOB).status_code == 200


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Authorization": "Bearer"},
        {"Authorization": "Bearer not-a-known-token-at-all"},
        {"Authorization": "bearer alice-token-012345678"},  # a prefix of alice's token
        {"Authorization": "Basic YWxpY2U6c2VjcmV0"},
        {"X-Runrow-User": "alice"},  # only --insecure-dev honours this header
    ],
)
def test_no_valid_token_is_401_everywhere(
    server: Server, alices: dict[str, Any], headers: dict[str, str]
) -> None:
    run_id, conversation_id = alices["runs"][0], alices["conversations"][0]
    with httpx.Client(base_url=server.url, timeout=20, headers=headers) as anon:
        for response in [
            anon.get(f"/runs/{run_id}"),
            anon.get(f"/runs/{run_id}/events"),
            anon.post(f"/runs/{run_id}/cancel"),
            anon.post(f"/conversations/{conversation_id}/stop"),
            anon.post(f"/conversations/{conversation_id}/runs", json={"content": "x"}),
            anon.get("/approvals"),
            anon.post(f"/approvals/{alices['key']}", json={"approved": True}),
        ]:
            assert response.status_code == 401, response.text
            assert response.headers["www-authenticate"] == 'Bearer realm="runrow"'
            assert error_of(response)["type"] == "unauthorized"
            assert "secret" not in response.text
