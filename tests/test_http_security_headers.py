"""Every response carries the security headers (pyworker/http/headers.py): the page, its
files, JSON answers, an event stream, 4xx errors and a 500. The audit found none, and a page
framing the service had a click approve a pending tool call (clickjacking)."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator

import httpx
import pytest
from http_support import ALICE, Server, private_database, read_stream, serve
from starlette.requests import Request

from pyworker.http.headers import CONTENT_SECURITY_POLICY


@pytest.fixture(scope="module")
def headers_db(database_url: str) -> Iterator[str]:
    yield from private_database(database_url, "runrow_http_headers")


@pytest.fixture(scope="module")
def server(headers_db: str) -> Iterator[Server]:
    yield from serve(headers_db)


def assert_secured(response: httpx.Response | httpx.Headers, cache_control: str = "no-store") -> None:
    headers = response if isinstance(response, httpx.Headers) else response.headers
    assert headers.get_list("content-security-policy") == [CONTENT_SECURITY_POLICY]
    assert "frame-ancestors 'none'" in CONTENT_SECURITY_POLICY
    assert headers.get_list("x-frame-options") == ["DENY"]
    assert headers.get_list("x-content-type-options") == ["nosniff"]
    assert headers.get_list("referrer-policy") == ["no-referrer"]
    assert headers.get_list("cache-control") == [cache_control]


def test_the_page_and_its_files_are_secured_and_revalidated(server: Server) -> None:
    with httpx.Client(base_url=server.url, timeout=20) as client:
        for path in ("/", "/static/app.js", "/static/style.css"):
            response = client.get(path)
            assert response.status_code == 200, path
            assert_secured(response, cache_control="no-cache")
        # A revalidation answered 304 carries them too.
        etag = client.get("/static/app.js").headers["etag"]
        again = client.get("/static/app.js", headers={"If-None-Match": etag})
        assert again.status_code == 304
        assert_secured(again, cache_control="no-cache")


def test_the_page_has_nothing_inline_the_policy_would_block(server: Server) -> None:
    """script-src/style-src 'self' without 'unsafe-inline': an inline script, style or data:
    image would be refused by the browser (the browser test runs the page under the policy)."""
    with httpx.Client(base_url=server.url, timeout=20) as client:
        html = client.get("/").text
        css = client.get("/static/style.css").text
    assert html.count("<script") == 1 and '<script src="/static/app.js"' in html
    assert "<style" not in html and not re.search(r"\s(style|on[a-z]+)\s*=", html)
    assert "data:" not in html and "url(" not in css


def test_json_answers_and_errors_are_secured_and_not_stored(server: Server) -> None:
    with httpx.Client(base_url=server.url, timeout=20) as client:
        conversation = uuid.uuid4()
        enqueued = client.post(f"/conversations/{conversation}/runs", json={"content": "hi"}, headers=ALICE)
        assert enqueued.status_code == 202
        run_id = enqueued.json()["run_id"]
        responses = {
            "enqueue": enqueued,
            "run": client.get(f"/runs/{run_id}", headers=ALICE),
            "conversation": client.get(f"/conversations/{conversation}", headers=ALICE),
            "approvals": client.get("/approvals", headers=ALICE),
            "config": client.get("/config"),
            "healthz": client.get("/healthz"),
            "metrics": client.get("/metrics"),
            "401": client.get("/approvals"),
            "404": client.get("/no/such/endpoint"),
            "404 static": client.get("/static/nothing.js"),
            "405": client.delete("/approvals", headers=ALICE),
            "400": client.post(f"/conversations/{conversation}/runs", json={}, headers=ALICE),
        }
    for name, response in responses.items():
        assert response.status_code < 500, (name, response.text)
        assert_secured(response)


def test_an_event_stream_is_secured_and_not_stored(server: Server) -> None:
    with httpx.Client(base_url=server.url, timeout=20) as client:
        enqueued = client.post(f"/conversations/{uuid.uuid4()}/runs", json={"content": "hi"}, headers=ALICE)
        run_id = uuid.UUID(enqueued.json()["run_id"])
        stream = read_stream(client, run_id, ALICE, max_events=2)  # user_message_created, run_queued
        assert stream.status == 200 and stream.events[-1].event == "run_queued"
        assert_secured(stream.headers)
        assert stream.headers["x-accel-buffering"] == "no"
        head = client.head(f"/runs/{run_id}/events", headers=ALICE)
        assert head.status_code == 200
        assert_secured(head)


def test_a_500_is_secured(headers_db: str) -> None:
    """A 500 is sent by Starlette's outermost middleware, past any middleware given to
    Starlette(middleware=...): the headers are added outside it."""

    def broken(request: Request) -> str:
        raise RuntimeError("a bug in a custom authenticate")

    for server in serve(headers_db, authenticate=broken):
        with httpx.Client(base_url=server.url, timeout=20) as client:
            response = client.get("/approvals")
        assert response.status_code == 500
        assert_secured(response)
