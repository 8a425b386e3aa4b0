"""`runrow concurrency` and `runrow fairness`, as real processes against a real database: what
they set is what the claim then does, what they show is the documented views, and a bad value
is a one-line error (exit 2) that changes nothing."""

from __future__ import annotations

import uuid

import psycopg
from tail_support import private_database_url
from test_cli import runrow

__all__ = ["private_database_url"]


def enqueue(conn: psycopg.Connection, n: int, key: str | None = None, tenant: str | None = None) -> None:
    for _ in range(n):
        conn.execute(
            "SELECT runrow.enqueue_run(conversation_id => %s, content => '\"hi\"', model => 'm',"
            " concurrency_key => %s, fairness_key => %s)",
            (uuid.uuid4(), key, tenant),
        )


def claimed(conn: psycopg.Connection) -> int:
    return len(
        conn.execute("SELECT * FROM runrow.claim_runs(worker_id => 'cli-test', max_runs => 100)").fetchall()
    )


def test_a_concurrency_limit_set_from_the_cli_caps_the_claim(private_database_url: str) -> None:
    url = private_database_url
    done = runrow(url, "concurrency", "set", "crm-api", "2")
    assert (done.returncode, done.stdout.strip()) == (0, "concurrency limit of crm-api set to 2"), done.stderr
    with psycopg.connect(url, autocommit=True) as conn:
        enqueue(conn, 5, key="crm-api")
        assert claimed(conn) == 2
    shown = runrow(url, "concurrency", "show")
    assert shown.returncode == 0, shown.stderr
    line = next(ln for ln in shown.stdout.splitlines() if ln.startswith("crm-api"))
    assert line.split()[:4] == ["crm-api", "2", "2", "3"]  # limit, running or waiting, queued
    assert runrow(url, "concurrency", "remove", "crm-api").returncode == 0
    # A second removal (or a mistyped key) says there was nothing to remove, as `limits` does.
    again = runrow(url, "concurrency", "remove", "crm-api")
    assert again.returncode == 2
    assert 'concurrency_key "crm-api" has no concurrency limit to remove' in again.stderr
    assert "Traceback" not in again.stderr
    with psycopg.connect(url, autocommit=True) as conn:
        assert claimed(conn) == 3
    assert "(none)" in runrow(url, "concurrency", "show").stdout


def test_fairness_weight_and_show(private_database_url: str) -> None:
    url = private_database_url
    done = runrow(url, "fairness", "weight", "acme", "3")
    assert (done.returncode, done.stdout.strip()) == (0, "weight of tenant acme set to 3"), done.stderr
    with psycopg.connect(url, autocommit=True) as conn:
        assert conn.execute(
            "SELECT weight FROM runrow.fairness_tenant WHERE fairness_key = 'acme'"
        ).fetchone() == (3.0,)
        enqueue(conn, 2, tenant="acme")
    shown = runrow(url, "fairness", "show")
    assert shown.returncode == 0, shown.stderr
    assert "queue per priority and tenant:" in shown.stdout and "delayed runs:" in shown.stdout
    line = next(ln for ln in shown.stdout.splitlines() if " acme " in f" {ln} ")
    assert line.split()[:3] == ["0", "acme", "2"]  # priority, tenant, queued
    reset = runrow(url, "fairness", "weight", "acme", "--reset")
    assert (reset.returncode, reset.stdout.strip()) == (0, "weight of tenant acme reset to 1")


def test_bad_values_are_one_line_errors_and_change_nothing(private_database_url: str) -> None:
    url = private_database_url
    bad = runrow(url, "concurrency", "set", "cli-bad", "-1")
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    # Refused by the parser (its range is the function's): the usage, then one line naming it.
    assert bad.stderr.splitlines()[-1].endswith(
        "argument max_running: must be an integer from 0 to 100000, got '-1'"
    )
    weight = runrow(url, "fairness", "weight", "cli-bad", "0")
    assert weight.returncode == 2
    # Named by its metavar, as `fairness weight TENANT WEIGHT` shows it (not the SQL argument).
    assert "WEIGHT must be from 0.001 to 1000" in weight.stderr and "Traceback" not in weight.stderr
    with psycopg.connect(url) as conn:
        assert conn.execute(
            "SELECT (SELECT count(*) FROM runrow.concurrency_limit WHERE concurrency_key = 'cli-bad'),"
            " (SELECT count(*) FROM runrow.fairness_tenant WHERE fairness_key = 'cli-bad')"
        ).fetchone() == (0, 0)
    neither = runrow(url, "fairness", "weight", "cli-bad")
    assert neither.returncode == 2 and "WEIGHT --reset is required" in neither.stderr
