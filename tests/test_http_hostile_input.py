"""Hostile input over real sockets: every route and field, whatever the value, answers a 4xx with a
JSON error that names the field at fault, and writes nothing. Never a 500.

Table-driven over bodies (huge, negative, fractional and string numbers where an integer goes,
U+0000 in every string field and nested in JSON, lone surrogates, non-finite numbers, deep
nesting), path ids and query parameters; then a hypothesis pass over random bodies.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import psycopg
import pytest
from http_support import ALICE, Server, error_of, private_database, serve
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from steps_support import begin, tool_defs, tool_turn
from tail_support import claim

DEEP = "[" * 200 + "]" * 200


@pytest.fixture(scope="module")
def hostile_db(database_url: str) -> Iterator[str]:
    yield from private_database(database_url, "runrow_http_hostile")


@pytest.fixture(scope="module")
def server(hostile_db: str) -> Iterator[Server]:
    yield from serve(hostile_db, max_body_bytes=64 * 1024)


@pytest.fixture(scope="module")
def client(server: Server) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=20) as c:
        yield c


@pytest.fixture(scope="module")
def db(hostile_db: str) -> Iterator[psycopg.Connection]:
    with psycopg.connect(hostile_db, autocommit=True) as conn:
        yield conn


@pytest.fixture(autouse=True)
def no_queued_runs_left(db: psycopg.Connection) -> Iterator[None]:
    yield
    # The approval fixture claims the oldest queued run: leave none behind.
    for (conversation_id,) in db.execute(
        "SELECT DISTINCT conversation_id FROM runrow.agent_run WHERE status IN ('queued', 'waiting')"
    ).fetchall():
        db.execute("SELECT runrow.stop_conversation(conversation_id => %s)", (conversation_id,))


def written(db: psycopg.Connection) -> str:
    """Every row version of every runrow table a request could write: any INSERT, UPDATE or
    DELETE changes it."""
    tables = ["conversation", "message", "agent_run", "run_event", "agent_step", "tool_effect", "prompt"]
    parts = [f"(SELECT string_agg(ctid::text, ',' ORDER BY ctid) FROM runrow.{t})" for t in tables]
    row = db.execute(f"SELECT md5(concat_ws('|', {', '.join(parts)}))").fetchone()  # type: ignore[arg-type]
    assert row is not None
    return str(row[0])


def assert_refused(response: httpx.Response, names: str | None, status: int | None = None) -> None:
    assert 400 <= response.status_code < 500, (response.status_code, response.text)
    if status is not None:
        assert response.status_code == status, response.text
    err = error_of(response)
    if names is not None:
        assert names in err["message"], err


def raw(value: Any) -> bytes:
    return json.dumps(value).encode()


ENQUEUE: list[tuple[str, bytes]] = [
    # max_attempts: an integer in the function's range 1..100, nothing else.
    *[
        ("max_attempts", raw({"content": "x", "max_attempts": v}))
        for v in [10**12, 2**31, -(2**31) - 1, -1, 0, 101, 1.5, 2.0, "3", [], {}, True]
    ],
    ("max_attempts", b'{"content": "x", "max_attempts": 1e99}'),
    ("max_attempts", b'{"content": "x", "max_attempts": -0.0}'),
    # content
    ("content", raw({"content": "a\x00b"})),
    ("content", raw({"content": [{"type": "text", "text": "a\x00b"}]})),
    ("content", raw({"content": [{"type": "text", "t\x00": "x"}]})),
    ("content", b'{"content": "\\ud800"}'),
    ("content", b'{"content": [{"type": "text", "text": "\\udc00x"}]}'),
    ("content", b'{"content": [{"type": "text", "n": 1e400}]}'),
    ("content", b'{"content": ' + DEEP.encode() + b"}"),
    ("content", raw({"content": ""})),
    ("content", raw({"content": []})),
    ("content", raw({"content": 5})),
    ("content", raw({"content": {"type": "text"}})),
    ("content", raw({})),
    # model, system, if_active: strings without U+0000
    ("model", raw({"content": "x", "model": "m\x00"})),
    ("model", raw({"content": "x", "model": 5})),
    ("model", raw({"content": "x", "model": ""})),
    ("model", raw({"content": "x", "model": "m" * 201})),
    ("model", b'{"content": "x", "model": "\\ud83d"}'),
    ("system", raw({"content": "x", "system": "be\x00kind"})),
    ("system", raw({"content": "x", "system": ["x"]})),
    ("if_active", raw({"content": "x", "if_active": "reject\x00"})),
    ("if_active", raw({"content": "x", "if_active": 1})),
    # tools, metadata: JSON without U+0000, finite numbers, sane depth
    ("tools", raw({"content": "x", "tools": [{"name": "a\x00"}]})),
    ("tools", raw({"content": "x", "tools": [{"name": "t", "input_schema": {"d": ["\x00"]}}]})),
    ("tools", raw({"content": "x", "tools": "search"})),
    ("tools", raw({"content": "x", "tools": [{"nom": 1}]})),
    ("tools", b'{"content": "x", "tools": [{"name": "t", "x": ' + DEEP.encode() + b"}]}"),
    ("metadata", raw({"content": "x", "metadata": {"a": "\x00"}})),
    ("metadata", raw({"content": "x", "metadata": {"a": {"b": [1, {"c": "x\x00y"}]}}})),
    ("metadata", raw({"content": "x", "metadata": {"\x00": 1}})),
    ("metadata", raw({"content": "x", "metadata": []})),
    ("metadata", raw({"content": "x", "metadata": "x"})),
    ("metadata", b'{"content": "x", "metadata": {"n": 1e400}}'),
    ("metadata", b'{"content": "x", "metadata": {"n": -1e999}}'),
    ("metadata", b'{"content": "x", "metadata": {"s": "\\udfff"}}'),
    ("metadata", b'{"content": "x", "metadata": {"d": ' + DEEP.encode() + b"}}"),
    ("colour", raw({"content": "x", "colour": 1})),
]


@pytest.mark.parametrize(("field", "body"), ENQUEUE, ids=[f"{f}-{i}" for i, (f, _) in enumerate(ENQUEUE)])
def test_enqueue_refuses_every_bad_field_naming_it_and_writes_nothing(
    client: httpx.Client, db: psycopg.Connection, field: str, body: bytes
) -> None:
    before = written(db)
    response = client.post(
        f"/conversations/{uuid.uuid4()}/runs",
        content=body,
        headers={**ALICE, "Content-Type": "application/json", "Idempotency-Key": str(uuid.uuid4())},
    )
    assert_refused(response, field)
    assert written(db) == before


def test_the_same_bodies_with_the_field_fixed_are_accepted(client: httpx.Client) -> None:
    ok = {"content": "x", "max_attempts": 100, "metadata": {"n": 10**300, "s": "\u00e9\U0001f600"}}
    response = client.post(f"/conversations/{uuid.uuid4()}/runs", json=ok, headers=ALICE)
    assert response.status_code == 202, response.text


@pytest.mark.parametrize(
    ("params", "headers", "names"),
    [
        ({"from": "-1"}, {}, "from"),
        ({"from": "abc"}, {}, "from"),
        ({"from": "1e99"}, {}, "from"),
        ({"from": "1.5"}, {}, "from"),
        ({"from": "\u00b2"}, {}, "from"),  # a superscript two: str.isdigit() says yes, int() says no
        ({"from": "\u0661"}, {}, "from"),  # an Arabic-Indic one
        ({"from": "9" * 19}, {}, "from"),
        ({"from": "1\x00"}, {}, "from"),
        ({}, {"Last-Event-ID": "x"}, "Last-Event-ID"),
        ({}, {"Last-Event-ID": "-5"}, "Last-Event-ID"),
        ({}, {"Last-Event-ID": "9" * 40}, "Last-Event-ID"),
    ],
)
def test_bad_cursors_are_400_naming_the_parameter(
    client: httpx.Client, db: psycopg.Connection, params: dict[str, str], headers: dict[str, str], names: str
) -> None:
    created = client.post(f"/conversations/{uuid.uuid4()}/runs", json={"content": "x"}, headers=ALICE)
    run_id = created.json()["run_id"]
    before = written(db)
    # A stream, so that a cursor wrongly accepted fails the test instead of streaming forever.
    with client.stream(
        "GET", f"/runs/{run_id}/events", params=params, headers={**ALICE, **headers}
    ) as response:
        assert response.status_code == 400, (params, headers, response.status_code)
        response.read()
    assert_refused(response, names, 400)
    assert written(db) == before


BAD_IDS = ["not-a-uuid", "%00", "1" * 1000, "%C2%B2", "00000000-0000-0000-0000-00000000000G", "%F0%9F%98%80"]


@pytest.mark.parametrize("bad", BAD_IDS)
@pytest.mark.parametrize(
    ("method", "template"),
    [
        ("GET", "/runs/{}"),
        ("GET", "/runs/{}/events"),
        ("POST", "/runs/{}/cancel"),
        ("POST", "/conversations/{}/stop"),
        ("GET", "/conversations/{}"),
        ("POST", "/conversations/{}/runs"),
        ("POST", "/approvals/{}"),
    ],
)
def test_bad_ids_in_paths_are_404_and_write_nothing(
    client: httpx.Client, db: psycopg.Connection, method: str, template: str, bad: str
) -> None:
    before = written(db)
    body = {"approved": True} if "approvals" in template else {"content": "x"}
    response = client.request(method, template.format(bad), headers=ALICE, json=body)
    assert_refused(response, None, 404)
    assert written(db) == before


@pytest.fixture
def pending_key(client: httpx.Client, db: psycopg.Connection) -> Iterator[str]:
    # Offered the tool it calls: begin_tool_call runs only a tool its run was enqueued with.
    body = {"content": "x", "tools": json.loads(tool_defs("send_wire"))}
    created = client.post(f"/conversations/{uuid.uuid4()}/runs", json=body, headers=ALICE)
    run_id = uuid.UUID(created.json()["run_id"])
    token = claim(db, run_id)
    key = tool_turn(db, run_id, token, "toolu_1", "send_wire", {"amount": 100})
    assert begin(db, run_id, token, key, "send_wire", {"amount": 100}, "irreversible")[0] == "needs_approval"
    yield key
    db.execute("SELECT runrow.cancel_run(run_id => %s)", (run_id,))


@pytest.mark.parametrize(
    ("field", "body"),
    [
        ("note", raw({"approved": True, "note": "ok\x00"})),
        ("note", raw({"approved": True, "note": "n" * 10001})),
        ("note", raw({"approved": True, "note": 5})),
        ("note", b'{"approved": true, "note": "\\ud800"}'),
        ("approved", raw({"approved": 1})),
        ("approved", raw({"approved": "true"})),
        ("approved", raw({"note": "no decision"})),
        ("approved", raw({"approved": None})),
        ("colour", raw({"approved": True, "colour": "red"})),
    ],
)
def test_a_bad_decision_is_refused_naming_the_field_and_decides_nothing(
    client: httpx.Client, db: psycopg.Connection, pending_key: str, field: str, body: bytes
) -> None:
    before = written(db)
    response = client.post(
        f"/approvals/{pending_key}", content=body, headers={**ALICE, "Content-Type": "application/json"}
    )
    assert_refused(response, field, 400)
    assert written(db) == before


# Values that break naive handlers: huge and negative numbers, floats, U+0000 and lone
# surrogates, odd types, nesting.
hostile_scalars = (
    st.integers(min_value=-(10**20), max_value=10**20)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.booleans()
    | st.none()
    | st.text(alphabet=st.sampled_from(["a", "\x00", "\ud800", "\u00e9", "%", "\\", '"']), max_size=8)
)
hostile = st.recursive(
    hostile_scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=8,
)
fields = st.sampled_from(
    ["content", "model", "system", "tools", "max_attempts", "metadata", "if_active", "x\x00"]
)
bodies = st.dictionaries(fields, hostile, max_size=4)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=bodies)
def test_random_hostile_bodies_never_get_a_500(
    client: httpx.Client, db: psycopg.Connection, body: dict
) -> None:
    before = written(db)
    encoded = json.dumps(body, ensure_ascii=True).encode()  # lone surrogates travel as \\ud800 escapes
    response = client.post(
        f"/conversations/{uuid.uuid4()}/runs",
        content=encoded,
        headers={**ALICE, "Content-Type": "application/json"},
    )
    assert response.status_code in (202, 400, 404, 409, 413, 422), (body, response.text)
    if response.status_code != 202:
        error_of(response)
        assert written(db) == before, body
