"""`runrow serve`'s log lines, from a real process.

The audit: with RUNROW_LOG_FORMAT=json, serve's own lines were plain text (only the worker called
logs.setup), uvicorn's in uvicorn's format, and every request an INFO access line with its query
string verbatim (`?secret=abc` in the logs, every Prometheus scrape a line). Now serve takes the
worker's --log-format / RUNROW_LOG_FORMAT, uvicorn logs through runrow's handler, and the access
log is runrow's, off unless --access-log, the path without its query string.
"""

from __future__ import annotations

import json
import re
import signal
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from http_support import ALICE, private_database
from serve_process import serve_process

SECRET = "secret=abc"


@pytest.fixture(scope="module")
def db(database_url: str) -> Iterator[str]:
    yield from private_database(database_url, "runrow_serve_logs")


def serve_and_request(db: str, tmp_path: Path, args: list[str], env: dict[str, str]) -> list[str]:
    """Run `runrow serve --port 0 ARGS`, make the audit's requests (three scrapes, then run and
    health reads with a secret in the query string), stop it with SIGTERM; its stderr lines."""
    with serve_process(db, tmp_path, args, env) as serve:
        base = serve.url
        for _ in range(3):
            assert httpx.get(f"{base}/metrics", timeout=10).status_code == 200
        run = httpx.get(f"{base}/runs/{uuid.uuid4()}?{SECRET}", headers=ALICE, timeout=10)
        assert run.status_code in (400, 404), run.text
        httpx.get(f"{base}/healthz?{SECRET}", timeout=10)
        serve.proc.send_signal(signal.SIGTERM)
        serve.proc.wait(20)
    return serve.log().splitlines()


def parsed(lines: list[str]) -> list[dict[str, Any]]:
    """Every line as a JSON object: a line that is not one fails here, naming it."""
    records = []
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            pytest.fail(f"not a JSON line: {line!r}")
        assert isinstance(record, dict) and {"ts", "level", "logger", "msg"} <= record.keys(), line
        records.append(record)
    return records


def test_json_from_the_environment_is_every_line_uvicorns_included_and_no_access_lines(
    db: str, tmp_path: Path
) -> None:
    lines = serve_and_request(db, tmp_path, [], {"RUNROW_LOG_FORMAT": "json"})
    records = parsed(lines)
    said = {(r["logger"], r["msg"].split(" (")[0]) for r in records}
    assert ("runrow.http", "runrow serve ready") in said
    assert ("uvicorn.error", "Application startup complete.") in said
    assert any(r["logger"] == "uvicorn.error" and r["msg"].startswith("Uvicorn running on") for r in records)
    # No access line at the default level: a scrape every few seconds is no line at all.
    assert not [line for line in lines if "/metrics" in line or "/runs/" in line or "/healthz" in line]
    assert not [line for line in lines if SECRET in line]


def test_the_access_log_is_opt_in_path_only_and_json_with_fields(db: str, tmp_path: Path) -> None:
    # The flag this time (no variable), and the text default of the environment overridden.
    args = ["--log-format", "json", "--access-log"]
    lines = serve_and_request(db, tmp_path, args, {"RUNROW_LOG_FORMAT": "text"})
    access = [r for r in parsed(lines) if r["logger"] == "runrow.http.access"]
    assert [a["http"]["path"] for a in access] == ["/metrics"] * 3 + [access[3]["http"]["path"], "/healthz"]
    assert re.fullmatch(r"/runs/[0-9a-f-]{36}", access[3]["http"]["path"])
    for line in access:
        assert line["level"] == "INFO" and line["http"]["method"] == "GET"
        assert isinstance(line["http"]["status"], int) and line["http"]["duration_ms"] >= 0
        assert line["msg"].startswith(f'{line["http"]["client"]} "GET {line["http"]["path"]}" ')
    assert [a["http"]["status"] for a in access[:3]] == [200, 200, 200]
    assert not [line for line in lines if SECRET in line or "secret" in line]


def test_the_access_path_drops_the_query_string_and_encodes_what_would_forge_a_line() -> None:
    from pyworker.http.access_log import request_path

    scope: dict[str, Any] = {"type": "http", "path": "/runs/x", "raw_path": b"/runs/x?token=t0k"}
    assert request_path(scope) == "/runs/x"
    assert request_path({"type": "http", "path": "/a\nb c", "root_path": ""}) == "/a%0Ab%20c"
    escape = {"type": "http", "path": "/x", "raw_path": b"/r%C3%A9/\x1b[31m"}
    assert request_path(escape) == "/r%C3%A9/%1B%5B31m"
