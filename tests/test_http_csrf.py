"""A page of another site cannot act through a user's browser (pyworker/http/request_guard.py,
bodies.read_json_object). The web audit, against `runrow serve --insecure-dev`: a page on
another origin POSTed a prompt with fetch(..., {mode: "no-cors"}) and got a run as user `dev`;
`Host: attacker.example:PORT` read the approvals (DNS rebinding)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import httpx
import psycopg
import pytest
from http_support import ALICE, Server, error_of, private_database, serve

PROMPT = b'{"content": "the attacker\'s prompt"}'


@pytest.fixture(scope="module")
def csrf_db(database_url: str) -> Iterator[str]:
    yield from private_database(database_url, "runrow_http_csrf")


@pytest.fixture(scope="module")
def server(csrf_db: str) -> Iterator[Server]:
    yield from serve(csrf_db)


@pytest.fixture(scope="module")
def dev(csrf_db: str) -> Iterator[Server]:
    yield from serve(csrf_db, tokens={}, insecure_dev=True)


def runs_in(db_url: str, conversation_id: uuid.UUID) -> int:
    with psycopg.connect(db_url, autocommit=True) as db:
        row = db.execute(
            "SELECT count(*) FROM runrow.agent_run WHERE conversation_id = %s", (conversation_id,)
        ).fetchone()
    assert row is not None
    return int(row[0])


def port_of(server: Server) -> str:
    return server.url.rsplit(":", 1)[1]


@pytest.mark.parametrize("mode", ["bearer", "insecure-dev"])
def test_a_body_without_content_type_is_a_415_and_enqueues_nothing(
    mode: str, server: Server, dev: Server, csrf_db: str
) -> None:
    """What fetch(url, {method: "POST", mode: "no-cors", body: bytes}) sends: no Content-Type
    (and no Origin here: the 415 does not depend on the origin rules)."""
    target, headers = (server, ALICE) if mode == "bearer" else (dev, {})
    conversation = uuid.uuid4()
    with httpx.Client(base_url=target.url, timeout=20) as client:
        response = client.post(f"/conversations/{conversation}/runs", content=PROMPT, headers=headers)
        assert "content-type" not in response.request.headers
        assert response.status_code == 415, response.text
        assert "Content-Type" in error_of(response)["message"]
        assert runs_in(csrf_db, conversation) == 0
        # With its type, the same body is a run.
        typed = {**headers, "Content-Type": "application/json"}
        enqueued = client.post(f"/conversations/{conversation}/runs", content=PROMPT, headers=typed)
        assert enqueued.status_code == 202, enqueued.text
        # A body on a route that takes no fields is refused the same way, before it stops.
        stop = client.post(f"/conversations/{conversation}/stop", content=b"{}", headers=headers)
        assert stop.status_code == 415, stop.text
        run = client.get(f"/runs/{enqueued.json()['run_id']}", headers=headers).json()
        assert run["status"] == "queued" and not run["cancel_requested"]
        # An empty body needs no type.
        assert client.post(f"/conversations/{conversation}/stop", headers=headers).status_code == 200
    assert runs_in(csrf_db, conversation) == 1


@pytest.mark.parametrize(
    ("header", "value", "error"),
    [
        ("Sec-Fetch-Site", "cross-site", "cross_site_request"),
        ("Sec-Fetch-Site", "same-site", "cross_site_request"),  # another port of localhost
        ("Origin", "http://attacker.example", "cross_origin_request"),
        ("Origin", "http://127.0.0.1:1", "cross_origin_request"),
        ("Origin", "http://localhost:{port}", "cross_origin_request"),  # another origin, same port
        ("Origin", "null", "cross_origin_request"),  # a sandboxed or opaque page
    ],
)
@pytest.mark.parametrize("mode", ["bearer", "insecure-dev"])
def test_a_state_change_from_another_site_or_origin_is_a_403(
    mode: str, header: str, value: str, error: str, server: Server, dev: Server, csrf_db: str
) -> None:
    target, auth = (server, ALICE) if mode == "bearer" else (dev, {})
    forged = {**auth, header: value.format(port=port_of(target))}
    conversation = uuid.uuid4()
    with httpx.Client(base_url=target.url, timeout=20) as client:
        for path, body in [
            (f"/conversations/{conversation}/runs", {"content": "forged"}),
            (f"/conversations/{conversation}/stop", None),
            (f"/runs/{uuid.uuid4()}/cancel", None),
            ("/approvals/" + "0" * 64, {"approved": True}),
        ]:
            response = client.post(path, json=body, headers=forged)
            assert response.status_code == 403, (path, response.text)
            assert (
                error_of(response)["type"] == error and value.split(":")[0] in error_of(response)["message"]
            )
        # Reading is not refused: another site's page cannot read the answer (no CORS).
        assert client.get(f"/conversations/{conversation}", headers=forged).status_code == 404
    assert runs_in(csrf_db, conversation) == 0


@pytest.mark.parametrize("mode", ["bearer", "insecure-dev"])
def test_the_pages_own_same_origin_requests_and_non_browsers_go_through(
    mode: str, server: Server, dev: Server
) -> None:
    target, auth = (server, ALICE) if mode == "bearer" else (dev, {})
    port = port_of(target)
    with httpx.Client(base_url=target.url, timeout=20) as client:
        for extra in [
            {},  # curl, SDKs: no Origin, no Sec-Fetch-Site
            {"Origin": f"http://127.0.0.1:{port}", "Sec-Fetch-Site": "same-origin"},
            {"Origin": f"HTTP://127.0.0.1:{port}"},
            {"Sec-Fetch-Site": "none"},  # typed into the address bar
        ]:
            response = client.post(
                f"/conversations/{uuid.uuid4()}/runs", json={"content": "hi"}, headers={**auth, **extra}
            )
            assert response.status_code == 202, (extra, response.text)
        # The default port of the origin's scheme may be left out of either.
        same = client.post(
            f"/conversations/{uuid.uuid4()}/runs",
            json={"content": "hi"},
            headers={**auth, "Host": "example.com", "Origin": "http://example.com:80"},
        )
        assert same.status_code == (202 if mode == "bearer" else 400), same.text


def test_insecure_dev_answers_only_loopback_host_names(dev: Server, server: Server) -> None:
    port = port_of(dev)
    with httpx.Client(base_url=dev.url, timeout=20) as client:
        for host in [
            f"attacker.example:{port}",
            "attacker.example",
            f"127.0.0.2:{port}",
            f"localhost.:{port}",
        ]:
            for method, path in [
                ("GET", "/approvals"),
                ("GET", "/"),
                ("POST", f"/runs/{uuid.uuid4()}/cancel"),
            ]:
                response = client.request(method, path, headers={"Host": host})
                assert response.status_code == 400, (host, path, response.text)
                err = error_of(response)
                assert (
                    err["type"] == "invalid_host"
                    and host in err["message"]
                    and "--insecure-dev" in err["message"]
                )
        for host in [
            f"127.0.0.1:{port}",
            f"localhost:{port}",
            f"LOCALHOST:{port}",
            f"[::1]:{port}",
            "localhost",
        ]:
            assert client.get("/approvals", headers={"Host": host}).status_code == 200, host
    # With tokens the service may be reached by any name (behind a proxy, on a LAN).
    with httpx.Client(base_url=server.url, timeout=20) as client:
        assert client.get("/approvals", headers={**ALICE, "Host": "runrow.internal"}).status_code == 200
