"""`runrow serve` on SIGTERM with event streams open, from a real process.

The audit: streams on a run that would not end were held idle for the whole graceful-shutdown
window, then every client got a cut transfer (no final chunk) and the log one "Cancel N running
task(s), timeout graceful shutdown exceeded" and an ERROR traceback (CancelledError) per stream.
Now the shutdown ends every stream at once, with a comment saying why and a clean end of the
response, for its client to resume elsewhere with Last-Event-ID.
"""

from __future__ import annotations

import signal
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from http_support import ALICE, parse_frames, private_database
from serve_process import serve_process
from worker_support import wait_until

GRACE = 30  # seconds: the streams must end far sooner than this
STREAMS = 3


@pytest.fixture(scope="module")
def db(database_url: str) -> Iterator[str]:
    yield from private_database(database_url, "runrow_serve_shutdown")


def test_sigterm_ends_open_streams_at_once_and_cleanly(db: str, tmp_path: Path) -> None:
    with serve_process(db, tmp_path, ["--shutdown-grace", str(GRACE)]) as serve:
        with httpx.Client(base_url=serve.url, headers=ALICE, timeout=GRACE + 10) as client:
            # Due in an hour: no worker takes it, the stream has nothing to end it.
            made = client.post(
                f"/conversations/{uuid.uuid4()}/runs", json={"content": "hi", "start_in": 3600}
            )
            assert made.status_code == 202, made.text
            run_id = made.json()["run_id"]
            ends: list[tuple[str, list[str], float]] = []
            opened = threading.Semaphore(0)

            def follow() -> None:
                comments: list[str] = []
                try:
                    with client.stream("GET", f"/runs/{run_id}/events") as response:
                        assert response.status_code == 200
                        opened.release()
                        for frame in parse_frames(response.iter_lines()):
                            if frame.comment is not None:
                                comments.append(frame.comment)
                    ends.append(("clean", comments, time.monotonic()))
                except httpx.HTTPError as exc:  # RemoteProtocolError: incomplete chunked read
                    ends.append((f"{type(exc).__name__}: {exc}", comments, time.monotonic()))

            followers = [threading.Thread(target=follow) for _ in range(STREAMS)]
            for follower in followers:
                follower.start()
            for _ in range(STREAMS):
                assert opened.acquire(timeout=20), "a stream did not open"
            wait_until(
                lambda: client.get("/healthz").json()["open_streams"] == STREAMS, 10, "the streams to count"
            )
            signalled = time.monotonic()
            serve.proc.send_signal(signal.SIGTERM)
            for follower in followers:
                follower.join(GRACE + 10)
        # uvicorn re-raises the signal it shut down on: terminated by SIGTERM, as before.
        assert serve.proc.wait(GRACE) == -signal.SIGTERM
        exited = time.monotonic() - signalled
    log = serve.log()
    assert len(ends) == STREAMS, ends
    for how, comments, at in ends:
        assert how == "clean", (how, log)
        assert comments[-1].startswith("stopping:"), comments
        assert at - signalled < 5, f"a stream ended {at - signalled:.1f} s after SIGTERM"
    assert exited < 10, f"exited {exited:.1f} s after SIGTERM (grace {GRACE} s)"
    assert "Traceback" not in log and "ERROR" not in log and "timeout graceful shutdown" not in log, log
    assert f"ending {STREAMS} event stream(s)" in log, log
