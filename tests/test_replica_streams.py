"""`runrow serve --replica-url`: event streams read journals from a real streaming hot standby.

One throwaway primary and a `pg_basebackup -R` standby of it for the module, a real `runrow
worker` (echo handler) on the primary. Replay on the standby is paused and resumed to put it
exactly as far behind as each test needs: a client always gets exactly the primary's journal,
never an ending the primary has not written, and a stream whose standby was behind when the run
ended still ends once the standby has replayed it.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import psycopg
import pytest
from http_support import ALICE, TOKENS, Frame, Server, parse_frames
from replica_support import Replicated, replicated_cluster
from worker_support import REPO, WorkerProcess, wait_until

from pyworker.http.config import OPT_IN_FIELDS, ServeConfig


@pytest.fixture(scope="module")
def pair() -> Iterator[Replicated]:
    with replicated_cluster() as replicated:
        yield replicated


@pytest.fixture(scope="module")
def worker(pair: Replicated) -> Iterator[WorkerProcess]:
    w = WorkerProcess(pair.primary.url, "replica-w1", ["--lease", "5", "--poll", "0.2", "--concurrency", "4"])
    try:
        yield w.wait_started()
    finally:
        w.close()


@pytest.fixture
def replay(pair: Replicated) -> Iterator[Replicated]:
    """The pair, with replay running again after the test whatever it did."""
    try:
        yield pair
    finally:
        pair.resume_replay()


def in_process_server(pair: Replicated, **overrides: Any) -> Server:
    options: dict[str, Any] = {
        "model": "echo",
        "tokens": TOKENS,
        "keepalive_seconds": 0.3,
        "poll_seconds": 0.1,
        "user_may_set": frozenset(OPT_IN_FIELDS),
    }
    options.update(overrides)
    config = ServeConfig(database_url=pair.primary.url, replica_url=pair.standby.url, **options)
    return Server(config).start()


class LiveStream:
    """GET /runs/{id}/events, read frame by frame as the test decides."""

    def __init__(self, client: httpx.Client, run_id: str, params: dict[str, Any] | None = None) -> None:
        self._cm = client.stream("GET", f"/runs/{run_id}/events", headers=ALICE, params=params)
        self.response = self._cm.__enter__()
        self.frames: list[Frame] = []
        self._frames = parse_frames(self.response.iter_lines())
        self.ended = False
        self.broken = False

    @property
    def events(self) -> list[Frame]:
        return [f for f in self.frames if f.id is not None]

    def read_until(self, done: Any) -> LiveStream:
        while not done(self):
            try:
                frame = next(self._frames, None)
            except httpx.RemoteProtocolError:  # the server ended the response mid-way
                self.broken = True
                frame = None
            if frame is None:
                self.ended = True
                return self
            self.frames.append(frame)
        return self

    def keepalives_since(self, index: int) -> int:
        return sum(1 for f in self.frames[index:] if f.comment == "keepalive")

    def close(self) -> None:
        self._cm.__exit__(None, None, None)


def enqueue(client: httpx.Client, text: str, duration: float) -> tuple[str, str]:
    conversation = str(uuid.uuid4())
    response = client.post(
        f"/conversations/{conversation}/runs",
        headers=ALICE,
        json={"content": text, "metadata": {"echo": text, "duration": duration}},
    )
    assert response.status_code == 202, response.text
    return conversation, response.json()["run_id"]


def primary_status(client: httpx.Client, run_id: str) -> str:
    return str(client.get(f"/runs/{run_id}", headers=ALICE).json()["status"])


def journal(url: str, run_id: str) -> list[tuple[int, str, Any]]:
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT seq, type, payload FROM runrow.read_events(run_id => %s, max_events => 10000)", (run_id,)
        ).fetchall()
    return [(int(seq), str(kind), payload) for seq, kind, payload in rows]


def as_journal(frames: list[Frame]) -> list[tuple[int, str, Any]]:
    return [(int(f.id), str(f.event), f.data) for f in frames if f.id is not None]


def test_serve_with_replica_url_streams_exactly_the_journal(pair: Replicated, worker: WorkerProcess) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    tokens = tempfile.NamedTemporaryFile("w", suffix=".json", delete=False)
    json.dump(TOKENS, tokens)
    tokens.close()
    log = tempfile.TemporaryFile()
    env = {**os.environ, "DATABASE_URL": pair.primary.url}
    serve = subprocess.Popen(
        [
            *(sys.executable, "-m", "pyworker", "serve", "--port", str(port), "--tokens-file", tokens.name),
            *("--model", "echo", "--keepalive", "0.5", "--replica-url", pair.standby.url),
            *("--user-may-set", "metadata"),
        ],
        cwd=REPO,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        base = f"http://127.0.0.1:{port}"

        def up() -> bool:
            assert serve.poll() is None, "runrow serve exited"
            try:
                return httpx.get(f"{base}/runs/{uuid.uuid4()}", headers=ALICE).status_code == 404
            except httpx.TransportError:
                return False

        wait_until(up, 30, "runrow serve to answer")
        with psycopg.connect(pair.standby.superuser_url, autocommit=True) as conn:
            row = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'runrow-serve-replica'"
            ).fetchone()
        assert row is not None and row[0] >= 1, "serve holds no connection to the standby"

        with httpx.Client(base_url=base, timeout=20) as client:
            _, run_id = enqueue(client, "streamed from a hot standby, " * 4, duration=1.0)
            stream = LiveStream(client, run_id).read_until(lambda s: False)
            assert stream.response.status_code == 200
            assert stream.ended and stream.events[-1].event == "complete"
            assert as_journal(stream.frames) == journal(pair.primary.url, run_id)
            assert stream.events[-1].data["status"] == "completed"
            assert "synthesized" not in stream.events[-1].data

            # A client resuming mid-journal gets the rest, exactly once.
            middle = len(stream.events) // 2
            rest = LiveStream(client, run_id, {"from": middle}).read_until(lambda s: False)
            assert as_journal(rest.frames) == journal(pair.primary.url, run_id)[middle:]
    finally:
        serve.terminate()
        serve.wait(15)
        os.unlink(tokens.name)
        log.seek(0)
        print(log.read().decode(errors="replace"))


def test_replica_url_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from pyworker.cli.main import build_parser
    from pyworker.cli.serve import build_config

    monkeypatch.setenv("RUNROW_REPLICA_URL", "postgresql://app@standby/app")
    args = build_parser().parse_args(
        ["--database-url", "postgresql://app@primary/app", "serve", "--insecure-dev"]
    )
    assert build_config(args).replica_url == "postgresql://app@standby/app"
    monkeypatch.delenv("RUNROW_REPLICA_URL")
    args = build_parser().parse_args(
        ["--database-url", "postgresql://app@primary/app", "serve", "--insecure-dev"]
    )
    assert build_config(args).replica_url is None


def test_run_not_yet_on_the_standby_is_waited_for_not_an_error(
    replay: Replicated, worker: WorkerProcess
) -> None:
    """Enqueued and finished on the primary while the standby replays nothing: the stream shows
    nothing (the standby has no such run, and no ending is invented), then exactly the journal."""
    server = in_process_server(replay)
    try:
        with httpx.Client(base_url=server.url, timeout=20) as client:
            replay.pause_replay()
            _, run_id = enqueue(client, "lagging replica", duration=0.2)
            wait_until(lambda: primary_status(client, run_id) == "completed", 20, "the run to complete")
            stream = LiveStream(client, run_id)
            # Each keepalive follows a read of the standby made after the run had ended.
            stream.read_until(lambda s: s.keepalives_since(0) >= 3)
            assert stream.response.status_code == 200
            assert not stream.ended and stream.events == []
            replay.resume_replay()
            stream.read_until(lambda s: False)
            assert as_journal(stream.frames) == journal(replay.primary.url, run_id)
            assert stream.events[-1].data["status"] == "completed"
            stream.close()
    finally:
        server.stop()


def test_stream_whose_standby_is_behind_the_ending_ends_when_it_replays(
    replay: Replicated, worker: WorkerProcess
) -> None:
    """A run still running on the standby has ended on the primary. The stream waits (no complete
    from a stale row), and once the standby replays the ending the stream ends at once, without
    another notification (the primary's last one came while the standby was behind): the
    keepalive is a minute, so only the tail's catch-up re-reads can end it within the timeout."""
    server = in_process_server(replay, keepalive_seconds=60)
    try:
        with httpx.Client(base_url=server.url, timeout=20) as client:
            conversation, run_id = enqueue(client, "a long answer " * 40, duration=30)

            def on_standby() -> int:
                try:
                    return sum(1 for e in journal(replay.standby.url, run_id) if e[1] == "text_delta")
                except psycopg.errors.NoDataFound:
                    return 0

            wait_until(lambda: on_standby() >= 2, 20, "the standby to have some of the answer")
            replay.pause_replay()
            seen = len(journal(replay.standby.url, run_id))
            stream = LiveStream(client, run_id).read_until(lambda s: len(s.events) >= seen)
            assert [f.event for f in stream.events].count("complete") == 0
            assert client.post(f"/conversations/{conversation}/stop", headers=ALICE).status_code == 200
            wait_until(lambda: primary_status(client, run_id) == "cancelled", 20, "the stop to end the run")
            time.sleep(0.5)  # the tail spends the primary's last wake on a read of the paused standby
            assert not stream.ended
            assert [f.event for f in stream.events].count("complete") == 0
            replay.resume_replay()
            stream.read_until(lambda s: False)
            assert as_journal(stream.frames) == journal(replay.primary.url, run_id)
            assert stream.events[-1].event == "complete"
            assert stream.events[-1].data["status"] == "cancelled"
            stream.close()
    finally:
        server.stop()


def test_cursor_ahead_of_the_standby_is_resumed_not_refused(
    replay: Replicated, worker: WorkerProcess
) -> None:
    """A client that read further elsewhere (the primary, a standby ahead) resumes here: its
    cursor names an event this standby has not replayed, which is lag, not a stale cursor."""
    server = in_process_server(replay)
    try:
        with httpx.Client(base_url=server.url, timeout=20) as client:
            conversation, run_id = enqueue(client, "ahead of the replica " * 30, duration=30)
            replay.wait_replayed()
            replay.pause_replay()
            behind = len(journal(replay.standby.url, run_id))
            wait_until(
                lambda: len(journal(replay.primary.url, run_id)) >= behind + 3,
                20,
                "the primary to journal past the standby",
            )
            cursor = journal(replay.primary.url, run_id)[-1][0]
            stream = LiveStream(client, run_id, {"from": cursor})
            assert stream.response.status_code == 200, stream.response.read()
            # A cursor the primary's journal has no event for is still refused.
            stale = client.get(f"/runs/{run_id}/events", headers=ALICE, params={"from": 100_000})
            assert stale.status_code == 400 and "from 100000" in stale.json()["error"]["message"]
            assert client.post(f"/conversations/{conversation}/stop", headers=ALICE).status_code == 200
            wait_until(lambda: primary_status(client, run_id) == "cancelled", 20, "the stop to end the run")
            replay.resume_replay()
            stream.read_until(lambda s: False)
            assert as_journal(stream.frames) == [
                e for e in journal(replay.primary.url, run_id) if e[0] > cursor
            ]
            stream.close()
    finally:
        server.stop()


def test_streams_read_the_primary_while_the_standby_is_down(
    replay: Replicated, worker: WorkerProcess
) -> None:
    """The standby dies under an open stream: that stream ends, and its client's reconnect with
    Last-Event-ID reads the primary (the primary is never behind), as does every new stream,
    instead of a 503 for as long as the standby is down."""
    server = in_process_server(replay)
    try:
        with httpx.Client(base_url=server.url, timeout=20) as client:
            conversation, run_id = enqueue(client, "the standby dies " * 40, duration=30)
            first = LiveStream(client, run_id).read_until(lambda s: len(s.events) >= 3)
            replay.stop_standby()
            first.read_until(lambda s: False)
            assert first.ended and [f.event for f in first.events].count("complete") == 0
            last = first.events[-1].id
            assert client.post(f"/conversations/{conversation}/stop", headers=ALICE).status_code == 200
            wait_until(lambda: primary_status(client, run_id) == "cancelled", 20, "the stop to end the run")
            rest = LiveStream(client, run_id, {"from": last})
            assert rest.response.status_code == 200
            rest.read_until(lambda s: False)
            assert as_journal(first.events) + as_journal(rest.frames) == journal(replay.primary.url, run_id)

            _, other = enqueue(client, "no standby at all", duration=0.2)
            fresh = LiveStream(client, other).read_until(lambda s: False)
            assert fresh.response.status_code == 200
            assert as_journal(fresh.frames) == journal(replay.primary.url, other)
    finally:
        server.stop()
        replay.restart_standby()
