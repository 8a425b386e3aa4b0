"""The HTTP service while its database is away, on a private cluster of its own (the test stops
the server, so never the session's shared one): a request answers 503 with Retry-After within
the service's pool wait (5 s), not psycopg_pool's 30 s, an open event stream ends cleanly for
its client to resume, and the service answers again within
seconds of the database's return, not after psycopg_pool's doubled reconnection wait (the HTTP
audit: 30 s waits while down, 18-25 s more of 503s after a 40 s outage)."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator

import httpx
import psycopg
import pytest
from http_support import ALICE, Server, serve

from pyworker.db import devdb
from pyworker.db.migrate import migrate

OUTAGE = 18.0  # seconds: psycopg_pool alone would next try about 12 s after the server is back
BACK_WITHIN = 7.0
REQUEST_POOL_TIMEOUT = 5.0  # pyworker.http.app's


@pytest.fixture
def outage_cluster() -> Iterator[devdb.Cluster]:
    # fsync and synchronous_commit on: the restart is a crash, which would otherwise lose the
    # migration's last commits (the throwaway default turns both off).
    with devdb.throwaway(fsync=True) as cluster:
        migrate(cluster.url)
        yield cluster


@pytest.fixture
def server(outage_cluster: devdb.Cluster) -> Iterator[Server]:
    yield from serve(outage_cluster.url)


def test_while_the_database_is_away_requests_get_a_prompt_503_and_then_service_again(
    outage_cluster: devdb.Cluster, server: Server
) -> None:
    run = f"{server.url}/runs/{uuid.uuid4()}"
    with httpx.Client(headers=ALICE, timeout=REQUEST_POOL_TIMEOUT + 10) as client:
        assert client.get(run).status_code == 404  # up: an unknown run
        # A stream open on a live run (claimed, never ended) when the database goes away.
        created = client.post(f"{server.url}/conversations/{uuid.uuid4()}/runs", json={"content": "hi"})
        live = created.json()["run_id"]
        with psycopg.connect(outage_cluster.url, autocommit=True) as db:
            db.execute("SELECT * FROM runrow.claim_runs('outage', 1, 3600)").fetchall()
        stream_end: list[str] = []

        def follow() -> None:
            try:
                with client.stream("GET", f"{server.url}/runs/{live}/events") as response:
                    ids = [line for line in response.iter_lines() if line.startswith("id:")]
                stream_end.append(f"ended cleanly after {len(ids)} events")
            except httpx.HTTPError as exc:
                stream_end.append(f"{type(exc).__name__}: {exc}")

        following = threading.Thread(target=follow)
        following.start()
        time.sleep(1.0)  # the stream has sent what the journal holds and waits
        restarting = threading.Thread(target=devdb.restart_after, args=(outage_cluster, OUTAGE))
        restarting.start()
        try:
            time.sleep(1.0)
            answers = []
            while restarting.is_alive() and len(answers) < 3:
                # The client's own timeout is the pool's wait plus 10 s: a 30 s wait fails it.
                answer = client.get(run)
                answers.append(
                    (answer.status_code, answer.headers.get("Retry-After"), answer.json()["error"]["type"])
                )
            assert answers and set(answers) == {(503, "2", "unavailable")}, answers
            # The open stream ended as a response ends, for its client to resume with
            # Last-Event-ID; it was cut mid-chunk (httpx: RemoteProtocolError).
            following.join(REQUEST_POOL_TIMEOUT + 10)
            assert stream_end and stream_end[0].startswith("ended cleanly after"), stream_end
        finally:
            restarting.join()
            following.join(5)
        # Back: the first answers come within seconds, whatever the pool's attempts so far.
        deadline = time.monotonic() + BACK_WITHIN
        while (status := client.get(run).status_code) != 404 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert status == 404
