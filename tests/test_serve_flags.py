"""`runrow serve`'s operator flags, from a real process: --max-attempts, --metrics-port, and the
workers' webhook receiver flags (--allow-private-webhooks, --webhook-allow-network)."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from http_support import ALICE, private_database
from serve_process import bound_port, serve_process
from worker_support import REPO


@pytest.fixture(scope="module")
def db(database_url: str) -> Iterator[str]:
    yield from private_database(database_url, "runrow_serve_flags")


def _enqueue(base: str, body: dict[str, object]) -> httpx.Response:
    return httpx.post(
        f"{base}/conversations/{uuid.uuid4()}/runs", json={"content": "hi", **body}, headers=ALICE, timeout=20
    )


def test_max_attempts_is_the_operators_default_for_http_runs(db: str, tmp_path: Path) -> None:
    """Every run enqueued over HTTP got max_attempts 1 (a run whose worker died failed) unless
    users were let set it; the operator now chooses, and a user's own value still wins."""
    args = ["--max-attempts", "3", "--user-may-set", "max_attempts"]
    with serve_process(db, tmp_path, args) as serve:
        default = _enqueue(serve.url, {})
        own = _enqueue(serve.url, {"max_attempts": 2})
        for made in (default, own):
            assert made.status_code == 202, made.text
        read = [
            httpx.get(f"{serve.url}/runs/{made.json()['run_id']}", headers=ALICE, timeout=20).json()
            for made in (default, own)
        ]
    assert [run["max_attempts"] for run in read] == [3, 2]


def test_max_attempts_out_of_range_is_refused_and_documented() -> None:
    for bad in ("0", "101", "x"):
        refused = subprocess.run(
            [sys.executable, "-m", "pyworker", "serve", "--max-attempts", bad],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert refused.returncode == 2 and "--max-attempts" in refused.stderr, refused.stderr
        assert "Traceback" not in refused.stderr
    shown = subprocess.run(
        [sys.executable, "-m", "pyworker", "serve", "--help"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "--max-attempts" in shown.stdout and "requeued" in shown.stdout


def test_metrics_port_moves_metrics_to_a_listener_of_its_own(db: str, tmp_path: Path) -> None:
    """serve had no --metrics-host/--metrics-port like the worker: /metrics was on the API's
    port only, beside the API a scraper's network policy had to open."""
    with serve_process(db, tmp_path, ["--metrics-port", "0"]) as serve:
        metrics_port = bound_port(serve.proc, serve.err, name="metrics on")
        assert httpx.get(f"{serve.url}/runs/{uuid.uuid4()}", headers=ALICE, timeout=20).status_code == 404
        scraped = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=20)
        on_api = httpx.get(f"{serve.url}/metrics", timeout=20)
        elsewhere = httpx.get(f"http://127.0.0.1:{metrics_port}/runs", timeout=20)
    assert scraped.status_code == 200, scraped.text
    assert "runrow_db_up 1.0" in scraped.text.splitlines()
    assert 'runrow_http_requests_total{route="/runs/{run_id}",status="404"} 1.0' in scraped.text
    assert on_api.status_code == 404 and on_api.json()["error"]["type"] == "not_found", on_api.text
    assert elsewhere.status_code == 404


def test_metrics_host_needs_metrics_port() -> None:
    refused = subprocess.run(
        [sys.executable, "-m", "pyworker", "serve", "--insecure-dev", "--metrics-host", "0.0.0.0"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert refused.returncode == 2 and "--metrics-host needs --metrics-port" in refused.stderr, refused.stderr


def test_a_metrics_port_that_cannot_be_listened_on_is_one_line_at_start() -> None:
    """The review of stop 59: --metrics-port equal to --port was not refused (uvicorn then said
    "address already in use" of the API's port), and a port in use was a traceback from the
    app's start. Both are one line, exit 2, before anything opens."""
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        cases = [
            (["--port", "18123", "--metrics-port", "18123"], "--metrics-port 18123 is --port's"),
            (
                ["--port", "0", "--metrics-port", str(busy)],
                f"--metrics-port {busy} on 127.0.0.1: Address already in use",
            ),
        ]
        for args, says in cases:
            refused = subprocess.run(
                [sys.executable, "-m", "pyworker", "serve", "--insecure-dev", *args],
                cwd=REPO,
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert refused.returncode == 2, refused.stderr
            assert says in refused.stderr and "Traceback" not in refused.stderr, refused.stderr


# The variables the tests below set: left out of the environment the commands inherit otherwise.
WEBHOOK_VARIABLES = ("RUNROW_ALLOW_PRIVATE_WEBHOOKS", "RUNROW_WEBHOOK_ALLOW_NETWORKS")


def _runrow(command: str, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k not in WEBHOOK_VARIABLES}
    return subprocess.run(
        [sys.executable, "-m", "pyworker", command, *args],
        cwd=REPO,
        env={**base, "DATABASE_URL": "postgresql://127.0.0.1:1/runrow?connect_timeout=1", **(env or {})},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_serve_reads_the_workers_networks_but_not_their_allow_everything(db: str, tmp_path: Path) -> None:
    """A fleet configured by environment gave its workers RUNROW_WEBHOOK_ALLOW_NETWORKS, which
    serve did not read: the workers delivered into 10.1.0.0/16, and serve refused every enqueue
    there (422). RUNROW_ALLOW_PRIVATE_WEBHOOKS stays the workers' alone: a service started in
    their environment must not let every user aim at loopback (a review of stop 62 found the
    first version of this change did)."""
    networks = {"RUNROW_WEBHOOK_ALLOW_NETWORKS": "10.1.0.0/16"}
    with serve_process(db, tmp_path, ["--user-may-set", "webhook_url"], env=networks) as serve:
        inside = _enqueue(serve.url, {"webhook_url": "http://10.1.2.3:8080/hook"})
        outside = _enqueue(serve.url, {"webhook_url": "http://10.2.0.1:8080/hook"})
    assert inside.status_code == 202, inside.text
    assert outside.status_code == 422 and outside.json()["error"]["type"] == "webhook_url_not_public", (
        outside.text
    )
    every = {"RUNROW_ALLOW_PRIVATE_WEBHOOKS": "1"}
    with serve_process(db, tmp_path, ["--user-may-set", "webhook_url"], env=every) as serve:
        loopback = _enqueue(serve.url, {"webhook_url": "http://127.0.0.1:9/hook"})
    assert loopback.status_code == 422 and loopback.json()["error"]["type"] == "webhook_url_not_public", (
        loopback.text
    )
    args = ["--user-may-set", "webhook_url", "--allow-private-webhooks"]
    with serve_process(db, tmp_path, args) as serve:
        loopback = _enqueue(serve.url, {"webhook_url": "http://127.0.0.1:9/hook"})
    assert loopback.status_code == 202, loopback.text


@pytest.mark.parametrize(
    ("args", "env", "says"),
    [
        (
            ["--webhook-allow-network", "0.0.0.0/0"],
            {},
            "argument --webhook-allow-network: 0.0.0.0/0 is wider than a /8: to let deliveries reach "
            "every address, use --allow-private-webhooks "
            "(a worker also reads RUNROW_ALLOW_PRIVATE_WEBHOOKS=1; serve, the flag only)",
        ),
        (
            [],
            {"RUNROW_WEBHOOK_ALLOW_NETWORKS": "10.1.0.0/16,fc00::/7"},
            "argument --webhook-allow-network: fc00::/7 is wider than a /16: to let deliveries reach "
            "every address, use --allow-private-webhooks "
            "(a worker also reads RUNROW_ALLOW_PRIVATE_WEBHOOKS=1; serve, the flag only) "
            "(from $RUNROW_WEBHOOK_ALLOW_NETWORKS)",
        ),
        (
            ["--webhook-allow-network", "10.1.2.3/8"],
            {},
            "argument --webhook-allow-network: 10.1.2.3/8 has host bits set: the network is 10.0.0.0/8",
        ),
    ],
)
def test_a_webhook_receiver_setting_serve_cannot_take_stops_it_as_it_stops_the_worker(
    args: list[str], env: dict[str, str], says: str
) -> None:
    """One definition for both commands: serve refuses at start, exit 2 and one line, what the
    worker refuses, in the worker's words (the networks that are too wide included)."""
    for command in ("serve", "worker"):
        refused = _runrow(command, *args, env=env)
        assert refused.returncode == 2 and "Traceback" not in refused.stderr, (command, refused.stderr)
        assert refused.stderr.rstrip().endswith(f"runrow {command}: error: {says}"), (command, refused.stderr)


def test_serve_help_teaches_the_workers_webhook_receiver_flags() -> None:
    shown = " ".join(_runrow("serve", "--help").stdout.split())
    for says in (
        "--webhook-allow-network CIDR",
        "env RUNROW_WEBHOOK_ALLOW_NETWORKS",
        "the flags replace its list rather than add to it",
        "No wider than a /8 (IPv4) or /16 (IPv6)",
        "serve reads no variable for this one",
        "Give the workers the same networks",
    ):
        assert says in shown, (says, shown)
