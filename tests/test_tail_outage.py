"""`runrow tail` across a database outage (a restart, a failover), on a private cluster of its own
(the test stops the server): the tail waits for the database and goes on after the last event
it showed, as an SSE client resumes with Last-Event-ID. It exited 2, and the user had to find
the seq to give `--from` (the HTTP audit's outage, seen from the CLI)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg.types.json import Jsonb
from tail_support import append, claim, enqueue, tail_process

from pyworker.db import devdb
from pyworker.db.migrate import migrate

OUTAGE = 8.0
REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def outage_cluster() -> Iterator[devdb.Cluster]:
    # fsync on: the restart is a crash, which would otherwise lose the last commits.
    with devdb.throwaway(fsync=True) as cluster:
        migrate(cluster.url)
        yield cluster


def test_a_tail_waits_out_an_outage_and_goes_on_after_what_it_showed(outage_cluster: devdb.Cluster) -> None:
    with psycopg.connect(outage_cluster.url, autocommit=True) as db:
        run_id = enqueue(db)
        token = claim(db, run_id)
        append(db, run_id, token, [{"type": "text_delta", "text": "Hel"}])
    following = tail_process(outage_cluster.url, run_id)
    try:
        time.sleep(2.0)  # it has shown what the journal holds and waits
        devdb.restart_after(outage_cluster, OUTAGE)
        assert following.poll() is None, following.communicate()
        with psycopg.connect(outage_cluster.url, autocommit=True) as db:
            append(db, run_id, token, [{"type": "text_delta", "text": "lo"}])
            db.execute(
                "SELECT runrow.finish_run(run_id => %s, claim_token => %s, status => 'completed', "
                "result => %s)",
                (run_id, token, Jsonb({"text": "Hello"})),
            )
        out, err = following.communicate(timeout=90)
    finally:
        if following.poll() is None:
            following.kill()
            following.communicate()
    assert following.returncode == 0, err
    assert out == "Hello", err  # no gap, no repeat across the outage
    assert "the database is unavailable" in err and "resuming after seq 4" in err, err
    # Only the tail's own notes: the pool's "WARNING psycopg.pool discarding closed connection:
    # <psycopg.AsyncConnection [BAD] at 0x...>" and the hub's reconnect warnings mixed in.
    assert all(line.startswith("· ") for line in err.splitlines()), err
