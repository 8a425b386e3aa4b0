"""`--json` of the read commands, as real processes: one JSON document on stdout with the views'
column names as keys, numbers as numbers, money as exact decimal strings, timestamps ISO 8601,
intervals as seconds. Scripts and monitoring parse these; the tables are for people."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import psycopg
from tail_support import claim, enqueue, private_database_url
from test_cli import runrow

from pyworker.db.devdb import temporary_database

__all__ = ["private_database_url"]


def _document(url: str | None, *args: str, code: int = 0) -> Any:
    done = runrow(url, *args, "--json")
    assert done.returncode == code, done.stderr
    return json.loads(done.stdout)  # one document: json.loads refuses anything after it


def test_limits_and_budget_show_json(private_database_url: str) -> None:
    url = private_database_url
    assert runrow(url, "limits", "set", "json-key", "--rpm", "50", "--output-tpm", "8000").returncode == 0
    assert (
        runrow(
            url, "budget", "tenant", "json-t", "--tokens-per-day", "1000", "--cost-per-day", "25.5"
        ).returncode
        == 0
    )
    price = ["--input", "3", "--output", "15", "--cache-write", "3.75", "--cache-read", "0.0000001"]
    assert runrow(url, "budget", "price", "json-model", *price).returncode == 0
    with psycopg.connect(url, autocommit=True) as conn:
        run_id = enqueue(conn)  # its rate-limit key is its model's, test-model
        token = claim(conn, run_id)
        conn.execute("SELECT runrow.report_rate_limited(%s, %s, 30)", (run_id, token))

    limits = _document(url, "limits", "show")
    assert set(limits) == {"rate_limits", "rate_limit_blocks", "runs_in_backoff"}
    row = next(r for r in limits["rate_limits"] if r["rate_limit_key"] == "json-key")
    assert row["requests_per_minute"] == 50 and row["output_tokens_per_minute"] == 8000
    assert row["input_tokens_per_minute"] is None
    block = next(b for b in limits["rate_limit_blocks"] if b["rate_limit_key"] == "test-model")
    assert isinstance(block["time_left"], float) and 0 < block["time_left"] <= 30
    assert datetime.fromisoformat(block["blocked_until"]).tzinfo is not None

    budget = _document(url, "budget", "show")
    assert set(budget) == {
        "tenant_budgets",
        "spend_by_tenant",
        "spend_by_model",
        "model_prices",
        "spend_by_run",
    }
    tenant = next(t for t in budget["tenant_budgets"] if t["fairness_key"] == "json-t")
    assert tenant["tokens_per_day"] == 1000 and tenant["cost_per_day"] == "25.5"
    assert tenant["over_budget"] is False
    model = next(m for m in budget["model_prices"] if m["model"] == "json-model")
    assert model["input_per_mtok"] == "3" and model["cache_write_per_mtok"] == "3.75"
    assert model["cache_read_per_mtok"] == "0.0000001"  # exact, and never 1E-7
    assert datetime.fromisoformat(model["updated_at"]).tzinfo is not None

    for command in ("concurrency", "fairness"):
        assert isinstance(_document(url, command, "show"), dict)


def test_status_json(private_database_url: str) -> None:
    url = private_database_url
    with psycopg.connect(url, autocommit=True) as conn:
        run_id = enqueue(conn)
    status = _document(url, "status")
    assert set(status) == {"queue_health", "fleet", "webhook_health"}
    health = status["queue_health"]
    assert isinstance(health["queued"], int) and health["queued"] >= 1
    assert isinstance(health["oldest_queued_age"], float)
    assert datetime.fromisoformat(health["measured_at"]).tzinfo is not None
    assert set(status["fleet"]) >= {"rate_limit_keys_blocked", "runs_in_backoff", "tenants_over_budget"}
    assert isinstance(status["webhook_health"]["pending"], int)

    one = _document(url, "status", str(run_id))
    assert one["run"] == str(run_id) and one["status"] == "queued"
    assert one["input_tokens"] == 0 and one["model_turns"] == 0


def test_audit_json(database_url: str) -> None:
    with (
        temporary_database(database_url, "runrow_audit_json") as url,
        psycopg.connect(url, autocommit=True) as conn,
    ):
        assert _document(url, "audit") == {"violations": []}
        conn.execute("ALTER TABLE runrow.prompt DISABLE TRIGGER prompt_immutable")
        try:
            found = _document(url, "audit", code=1)  # the exit code still says there are some
        finally:
            conn.execute("ALTER TABLE runrow.prompt ENABLE TRIGGER prompt_immutable")
        assert any(v["invariant"] == "schema_guard_missing" for v in found["violations"])
        assert set(found["violations"][0]) == {"invariant", "run_id", "detail"}


def test_help_teaches_json() -> None:
    for command in (["status"], ["audit"], ["limits", "show"], ["budget", "show"]):
        helped = runrow(None, *command, "--help")
        assert "--json" in helped.stdout and "money is an exact decimal string" in " ".join(
            helped.stdout.split()
        )
