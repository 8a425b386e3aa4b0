"""`runrow serve` over real sockets: every endpoint, bad input, idempotent replays, and SSE
streams resumed by `?from=N` and by `Last-Event-ID` at seeded random points.

Runs are driven from the test with the worker's own SQL calls (claim, append, finish, tool
calls) for exact control; the last tests drive them with a real `runrow worker` process.
The RNG seed is printed; replay a failure with RUNROW_HTTP_SEED.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import psycopg
import pytest
from http_support import ALICE, BOB, Server, error_of, private_database, read_stream, serve
from psycopg.conninfo import conninfo_to_dict
from steps_support import begin, tool_defs, tool_turn
from tail_support import append, claim, finish, journal
from worker_support import REPO, WorkerProcess, streamed_text, wait_until

from pyworker.db.devdb import temporary_database

SYSTEM = "Answer in one sentence."
TOOLS = [{"name": "lookup", "description": "Look a word up.", "input_schema": {"type": "object"}}]


@pytest.fixture(scope="module")
def api_db(database_url: str) -> Iterator[str]:
    yield from private_database(database_url, "runrow_http_api")


@pytest.fixture(scope="module")
def server(api_db: str) -> Iterator[Server]:
    yield from serve(api_db, system_prompt=SYSTEM, tools=TOOLS, max_body_bytes=64 * 1024)


@pytest.fixture
def client(server: Server) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=20) as c:
        yield c


@pytest.fixture
def db(api_db: str) -> Iterator[psycopg.Connection]:
    with psycopg.connect(api_db, autocommit=True) as conn:
        yield conn


@pytest.fixture(autouse=True)
def no_queued_runs_left(api_db: str) -> Iterator[None]:
    yield
    # Claiming takes the oldest queued run: leave none behind for the next test.
    with psycopg.connect(api_db, autocommit=True) as conn:
        for (conversation_id,) in conn.execute(
            "SELECT DISTINCT conversation_id FROM runrow.agent_run WHERE status IN ('queued', 'waiting')"
        ).fetchall():
            conn.execute("SELECT runrow.stop_conversation(conversation_id => %s)", (conversation_id,))


def post_run(
    client: httpx.Client,
    conversation_id: uuid.UUID | str | None = None,
    body: dict[str, Any] | None = None,
    headers: dict[str, str] | list[tuple[str, str | bytes]] | None = None,
) -> httpx.Response:
    conversation_id = conversation_id or uuid.uuid4()
    return client.post(
        f"/conversations/{conversation_id}/runs", json=body or {"content": "hello"}, headers=headers or ALICE
    )


def new_run(client: httpx.Client, **body: Any) -> tuple[uuid.UUID, uuid.UUID]:
    conversation_id = uuid.uuid4()
    response = post_run(client, conversation_id, {"content": "hello", **body})
    assert response.status_code == 202, response.text
    return uuid.UUID(response.json()["run_id"]), conversation_id


def seed() -> int:
    value = int(os.environ.get("RUNROW_HTTP_SEED", random.randrange(1 << 30)))
    print(f"RUNROW_HTTP_SEED={value}")
    return value


# --- enqueue -------------------------------------------------------------------------------


def test_enqueue_answers_202_with_location_and_pins_the_servers_defaults(
    client: httpx.Client, db: psycopg.Connection
) -> None:
    conversation_id = uuid.uuid4()
    response = post_run(client, conversation_id, {"content": "What is a lease?"})
    assert response.status_code == 202, response.text
    body = response.json()
    assert body == {
        "run_id": body["run_id"],
        "status": "queued",
        "conversation_id": str(conversation_id),
        "created": True,
    }
    assert response.headers["location"] == f"/runs/{body['run_id']}"
    # What a worker claims is what the server pinned at enqueue: model, system prompt, tools.
    row = db.execute(
        "SELECT run_id, model, system_prompt, tools, user_id FROM runrow.claim_run(worker_id => 't')"
    ).fetchone()
    assert row is not None
    assert (str(row[0]), row[1], row[2], row[3], row[4]) == (body["run_id"], "echo", SYSTEM, TOOLS, "alice")


def test_enqueue_takes_model_system_tools_attempts_and_metadata_from_the_body(
    client: httpx.Client, db: psycopg.Connection
) -> None:
    blocks = [{"type": "text", "text": "hi"}]
    tools = [{"name": "other", "input_schema": {"type": "object"}}]
    run_id, _ = new_run(
        client, content=blocks, model="m2", system=None, tools=tools, max_attempts=3, metadata={"k": 1}
    )
    row = db.execute(
        "SELECT run_id, model, system_prompt, tools, max_attempts, metadata "
        "FROM runrow.claim_run(worker_id => 't')"
    ).fetchone()
    assert row == (run_id, "m2", None, tools, 3, {"k": 1})
    state = client.get(f"/runs/{run_id}", headers=ALICE).json()
    assert (state["status"], state["attempt"], state["max_attempts"], state["model"]) == (
        "running",
        1,
        3,
        "m2",
    )


def test_idempotency_key_replays_the_first_run_per_user(client: httpx.Client, db: psycopg.Connection) -> None:
    conversation_id = uuid.uuid4()
    key = {"Idempotency-Key": "send-1"}
    body = {"content": "hello", "metadata": {"a": 1, "b": [1, 2]}}
    first = post_run(client, conversation_id, body, headers={**ALICE, **key})
    # The same request (JSON key order does not count) replays the first run.
    same = {"metadata": {"b": [1, 2], "a": 1}, "content": "hello"}
    again = post_run(client, conversation_id, same, headers={**ALICE, **key})
    assert first.status_code == 202 and again.status_code == 200, (first.text, again.text)
    assert again.json()["run_id"] == first.json()["run_id"] and again.json()["created"] is False
    assert again.headers["location"] == first.headers["location"]
    # Keys are namespaced by user: bob's "send-1" is his own run.
    bobs = post_run(client, uuid.uuid4(), headers={**BOB, **key})
    assert bobs.status_code == 202 and bobs.json()["run_id"] != first.json()["run_id"]
    # The same key with a different request, or for another conversation, is a 422 saying so.
    for conversation, different in [
        (conversation_id, {**body, "content": "different text"}),
        (conversation_id, {**body, "metadata": {"a": 2, "b": [1, 2]}}),
        (conversation_id, {**body, "max_attempts": 2}),
        (conversation_id, {**body, "if_active": "interrupt"}),
        (conversation_id, {**body, "system": "Be long."}),
        (uuid.uuid4(), body),
    ]:
        reused = post_run(client, conversation, different, headers={**ALICE, **key})
        assert reused.status_code == 422, (different, reused.text)
        err = error_of(reused)
        assert err["type"] == "idempotency_key_reused" and "Idempotency-Key 'send-1'" in err["message"]
    runs = db.execute("SELECT count(*) FROM runrow.agent_run WHERE conversation_id = %s", (conversation_id,))
    assert runs.fetchone() == (1,), "a refused reuse writes nothing"
    long_key = post_run(client, uuid.uuid4(), headers={**ALICE, "Idempotency-Key": "k" * 201})
    assert long_key.status_code == 400 and "Idempotency-Key" in error_of(long_key)["message"]


def test_if_active_reject_is_a_409_and_interrupt_stops_the_active_run(
    client: httpx.Client, db: psycopg.Connection
) -> None:
    first, conversation_id = new_run(client)
    rejected = post_run(client, conversation_id, {"content": "again", "if_active": "reject"})
    assert rejected.status_code == 409, rejected.text
    err = error_of(rejected)
    assert err["type"] == "conversation_busy" and "active run" in err["message"]
    count = db.execute("SELECT count(*) FROM runrow.agent_run WHERE conversation_id = %s", (conversation_id,))
    assert count.fetchone() == (1,), "a rejected enqueue writes nothing"
    interrupted = post_run(client, conversation_id, {"content": "instead", "if_active": "interrupt"})
    assert interrupted.status_code == 202
    assert client.get(f"/runs/{first}", headers=ALICE).json()["status"] == "cancelled"
    queued_behind = post_run(client, conversation_id, {"content": "later"})  # if_active enqueue: waits
    assert queued_behind.status_code == 202 and queued_behind.json()["status"] == "queued"


def test_enqueue_takes_start_in_and_refuses_the_operators_claim_order_fields(
    client: httpx.Client, db: psycopg.Connection
) -> None:
    run_id, _ = new_run(client, start_in=120)
    row = db.execute(
        "SELECT priority, fairness_key, not_before - now() FROM runrow.agent_run WHERE id = %s",
        (run_id,),
    ).fetchone()
    assert row is not None
    # The tenant is the authenticated user, at the default priority.
    assert row[:2] == (0, "alice") and 110 < row[2].total_seconds() <= 120
    for body, says in [
        ({"start_in": 0}, "start_in must be a number of seconds"),
        ({"start_in": True}, "start_in must be a number of seconds"),
    ]:
        response = post_run(client, body={"content": "hello", **body})
        assert response.status_code == 400, (body, response.text)
        assert says in error_of(response)["message"], (body, response.text)
    # A user who could set these would claim ahead of every tenant, spend another tenant's
    # share or fill another workload's cap.
    before = db.execute("SELECT count(*) FROM runrow.agent_run").fetchone()
    for name, value in [("priority", 1000), ("fairness_key", "bob"), ("concurrency_key", "tools")]:
        response = post_run(client, body={"content": "hello", name: value})
        assert response.status_code == 403, (name, response.text)
        assert error_of(response)["type"] == "forbidden_field"
        assert error_of(response)["message"].startswith(f"{name} is set by the operator"), response.text
    assert db.execute("SELECT count(*) FROM runrow.agent_run").fetchone() == before


@pytest.mark.parametrize(
    ("body", "status", "type_", "says"),
    [
        (b"{not json", 400, "malformed_json", "not valid JSON"),
        (b"[1, 2]", 400, "invalid_request", "JSON object"),
        (b"", 400, "invalid_request", "JSON object"),
        (b'{"content": NaN}', 400, "malformed_json", "NaN"),
        (b"{}", 400, "invalid_request", "content is required"),
        (b'{"content": 5}', 400, "invalid_request", "content must be"),
        (b'{"content": ""}', 400, "invalid_request", "content must be a non-empty"),
        (b'{"content": "x", "colour": 1}', 400, "invalid_request", "unknown field 'colour'"),
        (b'{"content": "x", "max_attempts": 0}', 400, "invalid_request", "max_attempts"),
        (
            b'{"content": "x", "max_attempts": true}',
            400,
            "invalid_request",
            "max_attempts must be an integer",
        ),
        (b'{"content": "x", "if_active": "later"}', 400, "invalid_request", "if_active must be one of"),
        (b'{"content": "x", "metadata": []}', 400, "invalid_request", "metadata must be an object"),
        (
            b'{"content": "x", "tools": [{"nom": 1}]}',
            400,
            "invalid_request",
            "tools[0] must be an object with",
        ),
        # What the Messages API would refuse on every attempt is refused here, before a worker
        # claims it and pays for a request (functions/_request_checks.sql).
        (b'{"content": [{"type": "text", "text": ""}]}', 400, "invalid_request", "content[0].text must be"),
        (b'{"content": [{"type": "text", "text": "a"}, 3]}', 400, "invalid_request", "content[1] must be a"),
        (
            b'{"content": [{"type": "tool_use", "id": "t", "name": "n", "input": {}}]}',
            400,
            "invalid_request",
            'content[0] is a "tool_use" block',
        ),
        (
            b'{"content": "x", "tools": [{"name": "get weather", "input_schema": {"type": "object"}}]}',
            400,
            "invalid_request",
            'tools[0].name must be 1 to 128 letters, digits, "_" or "-"',
        ),
        (
            b'{"content": "x", "tools": [{"name": "t"}]}',
            400,
            "invalid_request",
            "tools[0].input_schema must be",
        ),
    ],
)
def test_bad_enqueue_input_says_what_was_wrong(
    client: httpx.Client, body: bytes, status: int, type_: str, says: str
) -> None:
    response = client.post(
        f"/conversations/{uuid.uuid4()}/runs",
        content=body,
        headers={**ALICE, "Content-Type": "application/json"},
    )
    assert response.status_code == status, response.text
    err = error_of(response)
    assert err["type"] == type_ and says in err["message"], err


def test_body_limits_and_media_type(client: httpx.Client) -> None:
    big = json.dumps({"content": "x" * (64 * 1024)}).encode()
    url = f"/conversations/{uuid.uuid4()}/runs"
    declared = client.post(url, content=big, headers={**ALICE, "Content-Type": "application/json"})
    assert declared.status_code == 413 and error_of(declared)["type"] == "body_too_large"

    def chunks() -> Iterator[bytes]:  # no Content-Length: the limit is enforced while reading
        for i in range(0, len(big), 4096):
            yield big[i : i + 4096]

    chunked = client.post(url, content=chunks(), headers={**ALICE, "Content-Type": "application/json"})
    assert chunked.status_code == 413 and "larger than 65536 bytes" in error_of(chunked)["message"]
    form = client.post(url, content=b"content=hi", headers={**ALICE, "Content-Type": "text/plain"})
    assert form.status_code == 415 and "application/json" in error_of(form)["message"]


def test_a_client_that_hangs_up_mid_body_is_no_server_error(
    server: Server, db: psycopg.Connection, caplog: pytest.LogCaptureFixture
) -> None:
    """Found by fuzzing: a body cut short (Content-Length 50, 15 bytes sent, then close) was a
    500 with two tracebacks in the log (starlette's ClientDisconnect)."""
    conversation = uuid.uuid4()
    host, port = server.url.removeprefix("http://").split(":")
    with caplog.at_level(logging.INFO):
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            sock.sendall(
                f"POST /conversations/{conversation}/runs HTTP/1.1\r\nHost: x\r\n"
                f"Authorization: {ALICE['Authorization']}\r\nContent-Type: application/json\r\n"
                'Content-Length: 50\r\n\r\n{"content":"x"}'.encode()
            )
            sock.shutdown(socket.SHUT_WR)
            # Until the server closes: the app has run its exception handler (and logged) by then.
            while sock.recv(4096):
                pass
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
    count = "SELECT count(*) FROM runrow.agent_run WHERE conversation_id = %s"
    runs = db.execute(count, (conversation,)).fetchone()
    assert runs == (0,)


def test_unknown_and_malformed_ids_are_404(client: httpx.Client) -> None:
    unknown = uuid.uuid4()
    for method, path in [
        ("GET", f"/runs/{unknown}"),
        ("GET", f"/runs/{unknown}/events"),
        ("POST", f"/runs/{unknown}/cancel"),
        ("POST", f"/conversations/{unknown}/stop"),
        ("GET", f"/conversations/{unknown}"),
        ("GET", "/runs/not-a-uuid"),
        ("GET", "/runs/not-a-uuid/events"),
        ("POST", "/conversations/12345/runs"),
        ("GET", "/nowhere"),
    ]:
        response = client.request(
            method, path, headers=ALICE, json={"content": "x"} if "runs" in path else None
        )
        assert response.status_code == 404, (method, path, response.text)
        assert error_of(response)["type"] == "not_found"
    decided = client.post("/approvals/" + "0" * 64, json={"approved": True}, headers=ALICE)
    assert decided.status_code == 404 and error_of(decided)["type"] == "not_found"
    wrong_method = client.delete(f"/runs/{unknown}", headers=ALICE)
    assert wrong_method.status_code == 405 and error_of(wrong_method)["type"] == "method_not_allowed"


def test_unauthenticated_requests_get_401_with_a_bearer_challenge(client: httpx.Client) -> None:
    for headers in [
        {},
        {"Authorization": "Bearer wrong-token-0123456789"},
        {"Authorization": "Basic YWxpY2U6"},
    ]:
        response = client.get("/approvals", headers=headers)
        assert response.status_code == 401
        assert response.headers["www-authenticate"].startswith("Bearer")
        assert error_of(response)["type"] == "unauthorized"


# --- reading runs and streams -------------------------------------------------------------


def test_get_run_reports_status_attempts_result_and_timestamps(
    client: httpx.Client, db: psycopg.Connection
) -> None:
    run_id, conversation_id = new_run(client)
    token = claim(db, run_id)
    finish(db, run_id, token, "failed", error="model unavailable")
    state = client.get(f"/runs/{run_id}", headers=ALICE).json()
    assert state["run_id"] == str(run_id) and state["conversation_id"] == str(conversation_id)
    assert (state["status"], state["attempt"], state["max_attempts"]) == ("failed", 1, 1)
    assert (state["result"], state["error"]) == (None, "model unavailable")
    assert state["created_at"] <= state["started_at"] <= state["finished_at"]
    conversation = client.get(f"/conversations/{conversation_id}", headers=ALICE).json()
    assert (conversation["runs"], conversation["active_run_id"]) == (1, None)


def test_stream_of_a_finished_run_is_the_journal_and_ends_with_complete(
    client: httpx.Client, db: psycopg.Connection
) -> None:
    run_id, _ = new_run(client)
    token = claim(db, run_id)
    append(db, run_id, token, [{"type": "text_delta", "text": t} for t in ["Hel", "lo\n", '"you"']])
    finish(db, run_id, token)
    stream = read_stream(client, run_id, ALICE)
    assert stream.status == 200
    assert stream.headers["content-type"].startswith("text/event-stream")
    assert stream.headers["cache-control"] == "no-store" and stream.headers["x-accel-buffering"] == "no"
    expected = journal(db, run_id)
    assert [(f.id, f.event, f.data) for f in stream.events] == [(s, p["type"], p) for s, p in expected]
    assert stream.events[-1].event == "complete" and stream.events[-1].data["status"] == "completed"
    # Rejoining at the complete: nothing left to send, and 204 tells an EventSource to stop.
    last = stream.events[-1].id
    assert read_stream(client, run_id, ALICE, params={"from": last}).status == 204
    assert read_stream(client, run_id, {**ALICE, "Last-Event-ID": str(last)}).status == 204


def test_bad_cursors_are_400(client: httpx.Client) -> None:
    run_id, _ = new_run(client)
    for params, headers in [
        ({"from": "-1"}, {}),
        ({"from": "abc"}, {}),
        ({}, {"Last-Event-ID": "x"}),
        ({"from": str(2**63)}, {}),  # past a bigint
    ]:
        response = client.get(f"/runs/{run_id}/events", params=params, headers={**ALICE, **headers})
        assert response.status_code == 400, response.text
        assert "non-negative integer" in error_of(response)["message"]


def test_a_cursor_of_nineteen_digits_is_a_cursor(client: httpx.Client, db: psycopg.Connection) -> None:
    """A seq up to 2**63 - 1 is a bigint read_events takes; 19 digits were refused as not an
    integer (the HTTP audit). Past a queued run's journal it is the 400 of a cursor past the end."""
    run_id, _ = new_run(client)
    for cursor in ("1000000000000000000", str(2**63 - 1)):
        response = client.get(f"/runs/{run_id}/events", params={"from": cursor}, headers=ALICE)
        assert response.status_code == 400, response.text
        assert "non-negative integer" not in error_of(response)["message"], error_of(response)


def test_keepalive_comments_while_a_run_is_quiet(client: httpx.Client, db: psycopg.Connection) -> None:
    run_id, _ = new_run(client)
    claim(db, run_id)
    started = time.monotonic()
    with client.stream("GET", f"/runs/{run_id}/events", headers=ALICE) as response:
        keepalives = 0
        for line in response.iter_lines():
            keepalives += line == ": keepalive"
            if keepalives == 2:
                break
    # keepalive_seconds is 0.5 in these tests: two comments in about a second, not the 15 s default.
    assert time.monotonic() - started < 5


def test_disconnect_ends_the_tail_and_nothing_else(
    server: Server, client: httpx.Client, db: psycopg.Connection
) -> None:
    run_id, _ = new_run(client)
    token = claim(db, run_id)
    append(db, run_id, token, [{"type": "text_delta", "text": "partial"}])
    stream = read_stream(client, run_id, ALICE, max_events=3)  # reads 3 events, then hangs up
    assert [f.event for f in stream.events] == ["user_message_created", "run_queued", "run_claimed"]
    wait_until(lambda: server.services.streams.open == 0, 10, "the server to end the dropped stream")
    assert not server.services.hub._subscribers, "the tail's subscription is released"
    state = client.get(f"/runs/{run_id}", headers=ALICE).json()
    assert (state["status"], state["cancel_requested"]) == ("running", False), "disconnect is not stop"
    append(db, run_id, token, [{"type": "text_delta", "text": " and more"}])
    finish(db, run_id, token)
    rest = read_stream(client, run_id, {**ALICE, "Last-Event-ID": "3"})
    assert [f.data.get("text") for f in rest.events if f.event == "text_delta"] == ["partial", " and more"]


class ScriptedWriter(threading.Thread):
    """Appends `n` deltas one by one at irregular intervals, then finishes the run."""

    def __init__(self, url: str, run_id: uuid.UUID, token: uuid.UUID, n: int, rng: random.Random) -> None:
        super().__init__(daemon=True)
        self.url, self.run_id, self.token, self.n = url, run_id, token, n
        self.delays = [rng.choice([0, 0, 0.005, 0.02, 0.05]) for _ in range(n)]
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with psycopg.connect(self.url, autocommit=True) as conn:
                for i, delay in enumerate(self.delays):
                    time.sleep(delay)
                    append(conn, self.run_id, self.token, [{"type": "text_delta", "text": f"<{i}>"}])
                finish(conn, self.run_id, self.token)
        except BaseException as exc:
            self.error = exc


@pytest.mark.parametrize("cursor_by", ["from", "last-event-id", "both"])
def test_resumed_streams_deliver_every_event_exactly_once_in_order(
    api_db: str, client: httpx.Client, db: psycopg.Connection, cursor_by: str
) -> None:
    rng = random.Random(seed())
    run_id, _ = new_run(client)
    token = claim(db, run_id)
    writer = ScriptedWriter(api_db, run_id, token, 60, rng)
    writer.start()
    seen: list[tuple[int, str, dict[str, Any]]] = []
    reconnects = 0
    while not seen or seen[-1][1] != "complete":
        cursor = seen[-1][0] if seen else 0
        headers, params = dict(ALICE), {}
        if cursor_by == "from" or (cursor_by == "both" and rng.random() < 0.5):
            params["from"] = cursor
            if cursor_by == "both":  # a stale header loses: the larger cursor wins
                headers["Last-Event-ID"] = str(rng.randint(0, cursor))
        else:
            headers["Last-Event-ID"] = str(cursor)
            if cursor_by == "both":
                params["from"] = rng.randint(0, cursor)
        stream = read_stream(client, run_id, headers, params=params, max_events=rng.randint(1, 12))
        assert stream.status == 200, stream.status
        assert stream.events and stream.events[0].id == cursor + 1, (
            f"resumed after {cursor}: {stream.events[:1]}"
        )
        seen += [(f.id, f.event, f.data) for f in stream.events]
        reconnects += 1
        assert reconnects < 1000
    writer.join(30)
    assert writer.error is None, writer.error
    expected = [(s, p["type"], p) for s, p in journal(db, run_id)]
    assert seen == expected, "every event exactly once, in order"
    assert reconnects > 5


# --- stop, cancel, approvals --------------------------------------------------------------


def test_stop_cancels_queued_turns_and_flags_the_running_one(
    client: httpx.Client, db: psycopg.Connection
) -> None:
    running, conversation_id = new_run(client)
    claim(db, running)
    queued = uuid.UUID(post_run(client, conversation_id, {"content": "next"}).json()["run_id"])
    response = client.post(f"/conversations/{conversation_id}/stop", headers=ALICE)
    assert response.status_code == 200, response.text
    assert sorted((r["run_id"], r["action"]) for r in response.json()["runs"]) == sorted(
        [(str(running), "cancel_requested"), (str(queued), "cancelled")]
    )
    assert client.get(f"/runs/{queued}", headers=ALICE).json()["status"] == "cancelled"
    assert client.get(f"/runs/{running}", headers=ALICE).json()["cancel_requested"] is True


def test_cancel_run_says_what_it_did(client: httpx.Client, db: psycopg.Connection) -> None:
    run_id, _ = new_run(client)
    first = client.post(f"/runs/{run_id}/cancel", headers=ALICE)
    assert first.status_code == 200 and first.json() == {"run_id": str(run_id), "action": "cancelled"}
    again = client.post(f"/runs/{run_id}/cancel", headers=ALICE)
    assert again.json()["action"] == "already_cancelled"


def test_stop_and_cancel_refuse_a_body_they_cannot_read(client: httpx.Client, db: psycopg.Connection) -> None:
    """They take no fields; a malformed body used to be ignored, and the run stopped anyway."""
    run_id, conversation_id = new_run(client)
    json_type = {**ALICE, "Content-Type": "application/json"}
    for url in (f"/runs/{run_id}/cancel", f"/conversations/{conversation_id}/stop"):
        malformed = client.post(url, content=b'{"oops', headers=json_type)
        assert malformed.status_code == 400, malformed.text
        assert error_of(malformed)["type"] == "malformed_json"
        field = client.post(url, json={"reason": "x"}, headers=ALICE)
        assert field.status_code == 400 and "unknown field 'reason'" in error_of(field)["message"]
        text = client.post(url, content=b"stop it", headers={**ALICE, "Content-Type": "text/plain"})
        assert text.status_code == 415, text.text
        big = client.post(url, content=b" " * (64 * 1024 + 1), headers=json_type)
        assert big.status_code == 413, big.text
    assert client.get(f"/runs/{run_id}", headers=ALICE).json()["status"] == "queued", "nothing was stopped"
    empty_object = client.post(f"/runs/{run_id}/cancel", json={}, headers=ALICE)
    assert empty_object.status_code == 200 and empty_object.json()["action"] == "cancelled"


def test_unknown_query_parameters_are_400(client: httpx.Client) -> None:
    run_id, conversation_id = new_run(client)
    for url, name in [
        (f"/runs/{run_id}/events?after=3", "after"),  # ?from=3 misspelt streamed from the start
        (f"/runs/{run_id}?verbose=1", "verbose"),
        (f"/conversations/{conversation_id}?x=", "x"),
        ("/approvals?offset=10", "offset"),
    ]:
        # Streamed: the code before streamed ?after=3 as a live run's stream, which never ends.
        with client.stream("GET", url, headers=ALICE) as response:
            assert response.status_code == 400, url
            response.read()
        assert f"unknown query parameter '{name}'" in error_of(response)["message"]
    assert client.get(f"/runs/{run_id}?from=0", headers=ALICE).status_code == 400, "from is the stream's only"
    with client.stream("GET", f"/runs/{run_id}/events?from=5&from=6", headers=ALICE) as twice:
        assert twice.status_code == 400  # the last one was taken without a word
        twice.read()
    assert error_of(twice)["message"] == "query parameter 'from' is given more than once"
    with client.stream("GET", f"/runs/{run_id}/events?x=1") as unauthenticated:
        assert unauthenticated.status_code == 401, "401 before 400"


def test_head_of_a_live_stream_answers_at_once(client: httpx.Client, server: Server) -> None:
    """Starlette answers HEAD on GET routes; the stream's HEAD used to stream until the run ended."""
    run_id, _ = new_run(client)
    head = client.head(f"/runs/{run_id}/events", headers=ALICE, timeout=5)
    assert head.status_code == 200 and head.headers["content-type"].startswith("text/event-stream")
    assert head.content == b""
    assert server.services.streams.open == 0
    assert client.head(f"/runs/{uuid.uuid4()}/events", headers=ALICE, timeout=5).status_code == 404


def waiting_for_approval(client: httpx.Client, db: psycopg.Connection) -> tuple[uuid.UUID, str]:
    # Offered the tool it calls: begin_tool_call runs only a tool its run was enqueued with.
    run_id, _ = new_run(client, tools=json.loads(tool_defs("send_wire")))
    token = claim(db, run_id)
    key = tool_turn(db, run_id, token, "toolu_1", "send_wire", {"amount": 100})
    assert begin(db, run_id, token, key, "send_wire", {"amount": 100}, "irreversible")[0] == "needs_approval"
    return run_id, key


def test_approvals_list_and_decide(client: httpx.Client, db: psycopg.Connection) -> None:
    run_id, key = waiting_for_approval(client, db)
    listed = client.get("/approvals", headers=ALICE).json()["approvals"]
    mine = [a for a in listed if a["idempotency_key"] == key]
    assert len(mine) == 1
    assert (mine[0]["run_id"], mine[0]["tool"], mine[0]["args"], mine[0]["reason"]) == (
        str(run_id),
        "send_wire",
        {"amount": 100},
        "needs_approval",
    )
    bad = client.post(f"/approvals/{key}", json={"approved": "yes"}, headers=ALICE)
    assert bad.status_code == 400 and "approved must be true or false" in error_of(bad)["message"]
    missing = client.post(f"/approvals/{key}", json={"note": "hm"}, headers=ALICE)
    assert missing.status_code == 400 and "approved is required" in error_of(missing)["message"]
    decided = client.post(f"/approvals/{key}", json={"approved": True, "note": "ok once"}, headers=ALICE)
    assert decided.status_code == 200, decided.text
    assert decided.json() == {
        "idempotency_key": key,
        "run_id": str(run_id),
        "approved": True,
        "decided_by": "alice",
        "note": "ok once",
    }
    row = db.execute(
        "SELECT state, decided_by, decision_note FROM runrow.tool_effect WHERE idempotency_key = %s", (key,)
    ).fetchone()
    assert row == ("approved", "alice", "ok once")
    assert client.get(f"/runs/{run_id}", headers=ALICE).json()["status"] == "queued"
    twice = client.post(f"/approvals/{key}", json={"approved": False}, headers=ALICE)
    assert twice.status_code == 404, "no longer pending"
    assert key not in {
        a["idempotency_key"] for a in client.get("/approvals", headers=ALICE).json()["approvals"]
    }


def test_approvals_come_in_pages_each_seen_once(client: httpx.Client, db: psycopg.Connection) -> None:
    """GET /approvals answered every pending approval at once; now ?limit= (default 100, at
    most 1000) and ?after=, the `next` of the page before, keyset on (waiting_since, key)."""
    calls = []
    for _ in range(7):
        run_id, _ = new_run(client, tools=json.loads(tool_defs("send_wire")))
        token = claim(db, run_id)
        calls.append((run_id, token, tool_turn(db, run_id, token, "toolu_1", "send_wire", {"amount": 1})))
    keys = [key for _, _, key in calls]
    # Three in one transaction wait since the same instant (now()): the key breaks the tie.
    for group in (calls[:2], calls[2:5], calls[5:]):
        with db.transaction():
            for run_id, token, key in group:
                assert begin(db, run_id, token, key, "send_wire", {"amount": 1}, "irreversible")[0] == (
                    "needs_approval"
                )
    tied = "SELECT count(DISTINCT updated_at) FROM runrow.tool_effect WHERE idempotency_key = ANY(%s)"
    assert db.execute(tied, (keys[2:5],)).fetchone() == (1,)
    expected = [
        key
        for (key,) in db.execute(
            "SELECT idempotency_key FROM runrow.pending_approvals WHERE user_id = 'alice' "
            "ORDER BY waiting_since, idempotency_key"
        )
    ]
    assert set(keys) <= set(expected)
    seen: list[str] = []
    # Pages of 2: a boundary falls inside the three tied ones, wherever they are in the list.
    url: str | None = "/approvals?limit=2"
    while url is not None:
        page = client.get(url, headers=ALICE)
        assert page.status_code == 200, page.text
        listed = [a["idempotency_key"] for a in page.json()["approvals"]]
        assert 1 <= len(listed) <= 2
        seen += listed
        following = page.json()["next"]
        url = None if following is None else f"/approvals?limit=2&after={following}"
    assert seen == expected  # each once, in order
    everything = client.get("/approvals", headers=ALICE).json()
    assert [a["idempotency_key"] for a in everything["approvals"]] == expected and everything["next"] is None
    assert client.get("/approvals", headers=BOB).json() == {"approvals": [], "next": None}
    for query, name in [
        ("limit=0", "limit"),
        ("limit=1001", "limit"),
        ("limit=-1", "limit"),
        ("limit=ten", "limit"),
        ("limit=%D9%A1", "limit"),  # an Arabic-Indic 1, which int() reads
        ("after=nope", "after"),
        ("after=" + "A" * 300, "after"),
        ("after=MjAyNi0wMS0wMVQwMDowMDowMHxrZXk", "after"),  # base64 of a time and a bad key
    ]:
        refused = client.get(f"/approvals?{query}", headers=ALICE)
        assert refused.status_code == 400, (query, refused.text)
        assert error_of(refused)["message"].startswith(f"{name} must be"), refused.text


def test_page_config_and_health_need_no_token(client: httpx.Client) -> None:
    page = client.get("/")
    assert page.status_code == 200 and "<title>runrow" in page.text
    assert client.get("/static/app.js").status_code == 200
    assert client.get("/config").json() == {"auth": "bearer", "model": "echo"}
    health = client.get("/healthz").json()
    assert health["ok"] is True and health["hub_connected"] is True


def test_health_answers_503_at_once_when_the_database_refuses_connections(database_url: str) -> None:
    """A probe waits seconds, not the pool's 30 s: each /healthz answers 503 within its own timeout
    once the pool's connections are gone and new ones are refused."""
    with (
        temporary_database(database_url, "runrow_http_down") as url,
        contextlib.contextmanager(serve)(url, pool_max_size=2) as server,
        httpx.Client(base_url=server.url, timeout=10) as c,
        psycopg.connect(database_url, autocommit=True) as admin,
    ):
        assert c.get("/healthz").status_code == 200
        name = conninfo_to_dict(url)["dbname"]
        admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false')
        try:
            admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", [name])
            for _ in range(4):  # past the dead connections the pool still held
                started = time.monotonic()
                down = c.get("/healthz")
                assert down.status_code == 503, down.text
                assert time.monotonic() - started < 8
        finally:
            admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')


# --- a real worker, a real serve process --------------------------------------------------


@pytest.fixture(scope="module")
def live_db(database_url: str) -> Iterator[str]:
    yield from private_database(database_url, "runrow_http_live")


@pytest.fixture(scope="module")
def live(live_db: str) -> Iterator[tuple[Server, str]]:
    worker = WorkerProcess(live_db, "http-echo", ["--concurrency", "4", "--lease", "5", "--poll", "1"])
    try:
        worker.wait_log("worker http-echo started")
        for server in serve(live_db):
            yield server, live_db
    finally:
        worker.close()


def test_a_worker_driven_run_streams_through_random_reconnects(live: tuple[Server, str]) -> None:
    server, url = live
    rng = random.Random(seed())
    text = " ".join(f"word{i}" for i in range(80))
    with httpx.Client(base_url=server.url, timeout=20) as client:
        response = post_run(client, body={"content": "echo", "metadata": {"echo": text, "duration": 2.0}})
        assert response.status_code == 202, response.text
        run_id = response.json()["run_id"]
        seen: list[tuple[int, str, dict[str, Any]]] = []
        while not seen or seen[-1][1] != "complete":
            cursor = seen[-1][0] if seen else 0
            how = rng.choice(["from", "header"])
            stream = read_stream(
                client,
                run_id,
                {**ALICE, "Last-Event-ID": str(cursor)} if how == "header" else ALICE,
                params={"from": cursor} if how == "from" else None,
                max_events=rng.randint(1, 5),
            )
            assert stream.events and stream.events[0].id == cursor + 1, f"resumed after {cursor}"
            assert len(seen) < 10_000
            seen += [(f.id, f.event, f.data) for f in stream.events]
        state = client.get(f"/runs/{run_id}", headers=ALICE).json()
    with psycopg.connect(url, autocommit=True) as db:
        assert seen == [(s, p["type"], p) for s, p in journal(db, uuid.UUID(run_id))]
        assert "".join(d.get("text", "") for _, t, d in seen if t == "text_delta") == text
        assert streamed_text(db, uuid.UUID(run_id)) == text
    assert (state["status"], state["result"]) == ("completed", {"text": text})


def test_stop_over_http_ends_a_worker_run_cancelled_with_its_partial_text(live: tuple[Server, str]) -> None:
    server, url = live
    text = "x" * 400
    with httpx.Client(base_url=server.url, timeout=20) as client:
        response = post_run(client, body={"content": "echo", "metadata": {"echo": text, "duration": 4.0}})
        run_id, conversation_id = response.json()["run_id"], response.json()["conversation_id"]
        with psycopg.connect(url, autocommit=True) as db:
            wait_until(lambda: streamed_text(db, uuid.UUID(run_id)), 15, "the run to stream")
            stopped = client.post(f"/conversations/{conversation_id}/stop", headers=ALICE)
            assert stopped.json()["runs"] == [{"run_id": run_id, "action": "cancel_requested"}]
            stream = read_stream(client, run_id, ALICE)
            assert stream.events[-1].event == "complete" and stream.events[-1].data["status"] == "cancelled"
            partial = streamed_text(db, uuid.UUID(run_id))
        state = client.get(f"/runs/{run_id}", headers=ALICE).json()
    assert 0 < len(partial) < len(text)
    assert (state["status"], state["result"]) == ("cancelled", {"text": partial})


def test_serve_command_in_insecure_dev_mode(live_db: str) -> None:
    refused = subprocess.run(
        [sys.executable, "-m", "pyworker", "serve", "--insecure-dev", "--host", "0.0.0.0"],
        cwd=REPO,
        env=dict(os.environ, DATABASE_URL=live_db),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert refused.returncode == 2 and "--insecure-dev" in refused.stderr
    no_users = subprocess.run(
        [sys.executable, "-m", "pyworker", "serve"],
        cwd=REPO,
        env={k: v for k, v in os.environ.items() if k != "RUNROW_TOKENS"} | {"DATABASE_URL": live_db},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert no_users.returncode == 2 and "RUNROW_TOKENS" in no_users.stderr
    with socket_port() as port:
        pass
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pyworker",
            "serve",
            "--insecure-dev",
            "--port",
            str(port),
            "--model",
            "m-dev",
            "--user-may-set",
            "metadata,model",
        ],
        cwd=REPO,
        env=dict(os.environ, DATABASE_URL=live_db),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        base = f"http://127.0.0.1:{port}"

        def up() -> bool:
            try:
                return httpx.get(base + "/healthz", timeout=2).status_code == 200
            except httpx.TransportError:
                return False

        wait_until(up, 30, "runrow serve to answer")
        assert httpx.get(base + "/config").json() == {"auth": "dev", "model": "m-dev"}
        carol = httpx.post(
            f"{base}/conversations/{uuid.uuid4()}/runs",
            json={"content": "hi", "metadata": {"echo": "hi", "duration": 0.1}},
            headers={"X-Runrow-User": "carol"},
        )
        assert carol.status_code == 202, carol.text
        run_id = carol.json()["run_id"]
        assert httpx.get(f"{base}/runs/{run_id}", headers={"X-Runrow-User": "carol"}).status_code == 200
        assert httpx.get(f"{base}/runs/{run_id}").status_code == 404, "user dev is not carol"
        # A name the header cannot carry is a 400, not a run of user dev; UTF-8 is read as UTF-8.
        for bad in ("x" * 201, "bad\x01name", "", "\xff".encode("latin-1")):
            url = f"{base}/conversations/{uuid.uuid4()}/runs"
            refused = httpx.post(url, json={"content": "hi"}, headers={"X-Runrow-User": bad})
            assert refused.status_code == 400 and "X-Runrow-User" in refused.text, (bad, refused.text)
        zoe = httpx.post(
            f"{base}/conversations/{uuid.uuid4()}/runs",
            json={"content": "hi", "model": "nobody-claims-this"},
            headers={"X-Runrow-User": "zoë".encode()},
        )
        assert zoe.status_code == 202, zoe.text
        with psycopg.connect(live_db) as conn:
            owner = conn.execute(
                "SELECT user_id FROM runrow.get_run(%s)", (uuid.UUID(zoe.json()["run_id"]),)
            ).fetchone()
        assert owner == ("zoë",)
        # A stream that never ends (a run nobody answers) does not hold up SIGTERM past the grace.
        quiet = httpx.post(
            f"{base}/conversations/{uuid.uuid4()}/runs",
            json={"content": "hi", "model": "nobody-claims-this"},
            headers={"X-Runrow-User": "carol"},
        ).json()["run_id"]
        with httpx.stream("GET", f"{base}/runs/{quiet}/events", headers={"X-Runrow-User": "carol"}) as stream:
            lines = stream.iter_lines()
            assert next(lines).startswith("retry:")
            started = time.monotonic()
            proc.terminate()
            with contextlib.suppress(httpx.HTTPError):
                for _ in lines:
                    pass
        # uvicorn shuts down gracefully, then re-raises the signal it caught: "terminated by SIGTERM".
        assert proc.wait(15) == -signal.SIGTERM
        assert time.monotonic() - started < 1 + 5, "exits within --shutdown-grace 1 (and some slack)"
    finally:
        proc.kill()
        proc.wait(15)


class socket_port:
    """A free loopback port (closed again before the server binds it)."""

    def __enter__(self) -> int:
        import socket

        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        return int(self._sock.getsockname()[1])

    def __exit__(self, *exc: object) -> None:
        self._sock.close()


def test_any_instance_serves_any_run(api_db: str, server: Server, db: psycopg.Connection) -> None:
    """All state is in PostgreSQL: enqueue on one instance, stream half from a second, the rest
    from a third, and stop from the first."""
    others = [serve(api_db), serve(api_db)]
    second, third = (next(gen) for gen in others)
    try:
        with httpx.Client(base_url=server.url, timeout=20) as one:
            run_id, conversation_id = new_run(one)
        token = claim(db, run_id)
        append(db, run_id, token, [{"type": "text_delta", "text": f"{i} "} for i in range(10)])
        with httpx.Client(base_url=second.url, timeout=20) as two:
            head = read_stream(two, run_id, ALICE, max_events=6)
        with httpx.Client(base_url=server.url, timeout=20) as one:
            stopped = one.post(f"/conversations/{conversation_id}/stop", headers=ALICE).json()
            assert stopped["runs"] == [{"run_id": str(run_id), "action": "cancel_requested"}]
        finish(db, run_id, token, "cancelled")
        with httpx.Client(base_url=third.url, timeout=20) as three:
            tail = read_stream(three, run_id, {**ALICE, "Last-Event-ID": str(head.events[-1].id)})
        seen = [(f.id, f.event, f.data) for f in head.events + tail.events]
        assert seen == [(s, p["type"], p) for s, p in journal(db, run_id)]
        assert seen[-1][2]["status"] == "cancelled"
    finally:
        for gen in others:
            gen.close()


def test_an_idempotency_key_is_utf8_and_refuses_hidden_characters_by_position(
    client: httpx.Client, db: psycopg.Connection
) -> None:
    """The header is read as UTF-8 (Starlette decodes it as latin-1): a key with "é" replays the
    same run and is quoted as sent; a U+202E is named at its place in the header; bytes that are
    not UTF-8 are a 400 saying so."""
    conversation_id = uuid.uuid4()
    key = "café-1".encode()
    first = post_run(client, conversation_id, headers=[*ALICE.items(), ("Idempotency-Key", key)])
    again = post_run(client, conversation_id, headers=[*ALICE.items(), ("Idempotency-Key", key)])
    assert (first.status_code, again.status_code) == (202, 200), (first.text, again.text)
    stored = db.execute(
        "SELECT idempotency_key FROM runrow.agent_run WHERE id = %s", (first.json()["run_id"],)
    ).fetchone()
    assert stored == ("alice:café-1",)
    reused = post_run(
        client, conversation_id, {"content": "other"}, headers=[*ALICE.items(), ("Idempotency-Key", key)]
    )
    assert reused.status_code == 422 and "'café-1'" in error_of(reused)["message"], reused.text
    for header, says in [
        ("ab\u202ecd".encode(), "got U+202E at character 3"),
        ("x\u0085".encode(), "got U+0085 at character 2"),
        (b"\xff\xfe", "must be UTF-8"),
    ]:
        refused = post_run(client, uuid.uuid4(), headers=[*ALICE.items(), ("Idempotency-Key", header)])
        assert refused.status_code == 400, refused.text
        assert says in error_of(refused)["message"], error_of(refused)
