"""The README's reference tables name what the code has: the SQL API table every public function
of functions/, the events table every journal event type the SQL functions write, the metrics
table every metric a worker exports. A rename or a new function, event or metric that the README
does not follow fails here, not in a reader's hands."""

from __future__ import annotations

import re
from pathlib import Path

import psycopg
from prometheus_client import REGISTRY

from pyworker.cli.main import build_parser
from pyworker.http import metrics as http_metrics
from pyworker.http.app import PROBE_CONNECTIONS
from pyworker.worker import metrics
from pyworker.worker.echo import handle as echo
from pyworker.worker.process import (
    HEARTBEAT_POOL_SIZE,
    HEARTBEATS_PER_CONNECTION,
    METRICS_CONNECTIONS,
    Worker,
    heartbeat_pool_size,
)
from pyworker.worker.supervisor import FINISH_STATUSES

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
FUNCTIONS = sorted((ROOT / "functions").glob("*.sql"))


def section(title: str) -> str:
    """The README's text under the heading `title`, down to the next heading of its level."""
    match = re.search(rf"^(#+) {re.escape(title)}\n", README, re.M)
    assert match, f"README has no heading {title!r}"
    level = len(match.group(1))
    rest = README[match.end() :]
    end = re.search(rf"^#{{1,{level}}} ", rest, re.M)
    return rest[: end.start()] if end else rest


def first_cells(text: str) -> list[str]:
    """The first cell of each row of the Markdown tables in `text` (header and rule excluded)."""
    rows = [line for line in text.splitlines() if line.startswith("| ")]
    return [row.split(" | ")[0][2:] for row in rows if not row.startswith("| ---") and "|---" not in row]


def test_the_sql_api_table_lists_every_public_function_and_no_other() -> None:
    public = {
        name
        for path in FUNCTIONS
        for name in re.findall(r"^CREATE OR REPLACE FUNCTION runrow\.(\w+)\(", path.read_text(), re.M)
        if not name.startswith("_")
    }
    listed = {name for cell in first_cells(section("The SQL API")) for name in re.findall(r"`(\w+)\(", cell)}
    assert public - listed == set(), "public functions missing from the README's SQL API table"
    assert listed - public == set(), "the README's SQL API table lists functions that do not exist"


def test_the_events_table_names_every_type_the_sql_functions_journal() -> None:
    written = set()
    for path in FUNCTIONS:
        sql = path.read_text()
        written |= set(re.findall(r"'type', '(\w+)'", sql))  # jsonb_build_object('type', 'x', ...)
        written |= set(re.findall(r"_journal\([^;]*?\"type\": \"(\w+)\"", sql))  # a JSON literal
    assert {"complete", "run_claimed", "cancel_requested", "tool_interrupted"} <= written  # the scan works
    cells = first_cells(section("The journal's events"))
    listed = {name for cell in cells for name in re.findall(r"`(\w+)`", cell)}
    assert written - listed == set(), "journal event types the README's events table does not name"


def test_the_metrics_table_names_every_metric_a_worker_exports(database_url: str) -> None:
    # A worker's series and the HTTP service's: each process registers its own.
    metrics.register_worker()
    http_metrics.register(lambda: 0)
    # The database gauges are the columns of runrow.queue_metrics, read as a scrape reads them.
    with psycopg.connect(database_url, autocommit=True) as conn:
        cur = conn.execute(metrics.SCRAPE_QUERY)
        row = cur.fetchone()
        metrics._database.row = dict(zip([d.name for d in cur.description or ()], row or (), strict=True))
    try:
        families = list(REGISTRY.collect())
    finally:
        metrics._database.row = None
    # A counter's family is named without the `_total` its samples carry.
    ours = [f for f in families if f.name.startswith("runrow_")]
    exported = {f"{f.name}_total" if f.type == "counter" else f.name for f in ours}
    assert "runrow_queue_depth" in exported and "runrow_claims_total" in exported  # the scan works
    cells = first_cells(section("Metrics (Prometheus)"))
    listed = {name for cell in cells for name in re.findall(r"`(runrow_\w+)`", cell)}
    assert exported - listed == set(), "metrics the README's metrics table does not name"
    assert listed - exported == set(), "the README's metrics table names metrics nothing exports"


def test_the_roles_paragraph_names_every_view_the_worker_and_the_client_read(database_url: str) -> None:
    """It said the worker reads queue_metrics only; migration 0075 had granted it model_prices
    too (the SQL audit)."""
    said = re.search(r"the\s+worker's\s+on\s+(.+?),\s+the\s+client's\s+on\s+(.+?)\);", README, re.S)
    assert said, "README's roles paragraph no longer says which views the worker and the client read"
    with psycopg.connect(database_url, autocommit=True) as conn:
        granted = {
            role: {
                name
                for (name,) in conn.execute(
                    "SELECT c.relname FROM pg_class AS c WHERE c.relnamespace = 'runrow'::regnamespace"
                    " AND c.relkind IN ('r', 'v', 'm') AND has_table_privilege(%s, c.oid, 'SELECT')",
                    (role,),
                )
            }
            for role in ("runrow_worker", "runrow_client")
        }
    assert set(re.findall(r"`(\w+)`", said.group(1))) == granted["runrow_worker"]
    assert set(re.findall(r"`(\w+)`", said.group(2))) == granted["runrow_client"]


def test_for_dbas_says_how_many_connections_each_process_holds() -> None:
    """A DBA could not size max_connections: nothing said what a worker, `runrow serve` or a
    tail holds. The figures the README and `runrow worker --help` give are the code's."""
    text = " ".join(section("For DBAs").split())
    assert "max_connections" in text
    # The worker's pool: its default, and the heartbeats' own pool beside it.
    assert "default `min(concurrency + 4, 32)`" in text
    assert [Worker("postgresql://", concurrency=c, handler=echo).pool_size for c in (8, 40)] == [12, 32]
    assert "P + H + M + 1" in text and "(P + H + M + 1)" in text
    assert f"`{HEARTBEAT_POOL_SIZE} + concurrency // {HEARTBEATS_PER_CONNECTION}`" in text
    assert [heartbeat_pool_size(c) for c in (8, 249, 250, 1000)] == [2, 2, 3, 6]
    # The scrapes' own connection (--metrics-port), counted since a scrape no longer borrows one
    # from the run pool.
    assert f"M = {METRICS_CONNECTIONS} with `--metrics-port`" in text and "`runrow-worker-metrics`" in text
    # serve: its pool, /healthz's and the scrapes' own connection, the LISTEN.
    serve = 10 + PROBE_CONNECTIONS + 1
    assert f"4 x 15 + {serve} = {60 + serve}" in text
    worker = 15 + METRICS_CONNECTIONS
    assert f"4 x {worker} + {serve} = {4 * worker + serve} with `--metrics-port`" in text
    commands = build_parser()._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    assert commands["serve"].get_default("pool_size") == 10
    assert f"(default 10) + {PROBE_CONNECTIONS} for `/healthz` and `/metrics` + 1 LISTEN" in text
    assert f"(pool_size + {PROBE_CONNECTIONS + 1})" in text
    help_text = " ".join(commands["worker"].format_help().split())
    assert (
        f"at most N + {HEARTBEAT_POOL_SIZE + 1} connections" in help_text and "max_connections" in help_text
    )
    assert f"N + {HEARTBEAT_POOL_SIZE + 1 + METRICS_CONNECTIONS} with --metrics-port" in help_text


def test_the_metrics_table_names_every_attempt_ending() -> None:
    """`released:released` (a hand-back whose first COMMIT landed unanswered) and
    `released:deferred` (a fleet limit's wait) were exported and named nowhere. The endings the
    supervisor returns as literals, the handler's finish statuses, and release_run's and
    defer_run's outcomes are the README's list, no more and no less."""
    source = (ROOT / "pyworker" / "worker" / "supervisor.py").read_text()
    literals = set(re.findall(r'return "([a-z:]+)"', source)) | set(
        re.findall(r'self\.ending = "([a-z]+)"', source)
    )
    assert {"lost", "abandoned", "parked", "ended"} <= literals  # the scan works
    released = {f"released:{outcome}" for outcome in ("requeued", "failed", "dead", "cancelled")}
    code = literals | set(FINISH_STATUSES) | released | {"deferred", "none"}
    row = next(line for line in README.splitlines() if line.startswith("| `runrow_attempt_duration_seconds`"))
    cell = row.split(" | ")[2]
    listed = set(re.findall(r"`([a-z:]+)`", cell)) - {"ending", "finish_run", "release_run", "defer_run"}
    assert listed == code


def test_the_webhooks_section_says_how_the_allowed_networks_combine() -> None:
    """The sender refuses a host with no public address unless one is in an allowed network, and
    --webhook-allow-network replaces RUNROW_WEBHOOK_ALLOW_NETWORKS's list (a flag wins over its
    variable): the README said "no public address", and nothing of the flags replacing the list,
    in both the Webhooks section and the fleet upgrade it points to."""
    text = " ".join(README.split())
    assert "Nothing is sent to a host with no public or allowed address" in text
    assert text.count("replace the variable's list rather than add to it") == 2
